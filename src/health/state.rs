//! The health state machine of one target, exactly as the health-check reference describes it
//! (the behaviour of lua-resty-healthcheck that APISIX operators know).

use super::Counter;

/// Target states. `Healthy` and `MostlyHealthy` take traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Takes traffic.
    Healthy = 0,
    /// Takes traffic; failures seen.
    MostlyHealthy = 1,
    /// No traffic; successes seen.
    MostlyUnhealthy = 2,
    /// No traffic.
    Unhealthy = 3,
}

impl Status {
    /// As reported.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Healthy => "healthy",
            Status::MostlyHealthy => "mostly_healthy",
            Status::MostlyUnhealthy => "mostly_unhealthy",
            Status::Unhealthy => "unhealthy",
        }
    }
    /// From its `repr`.
    pub fn from_u8(v: u8) -> Status {
        match v {
            1 => Status::MostlyHealthy,
            2 => Status::MostlyUnhealthy,
            3 => Status::Unhealthy,
            _ => Status::Healthy,
        }
    }
    /// Whether the balancer may pick the target.
    pub fn takes_traffic(self) -> bool {
        matches!(self, Status::Healthy | Status::MostlyHealthy)
    }
    /// Whether the target is probed at the healthy interval.
    pub fn healthy_side(self) -> bool {
        self.takes_traffic()
    }
}

/// Kinds of report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// A success (status in the healthy list; TCP connect for tcp checks).
    Success,
    /// An HTTP failure (status in the unhealthy list).
    HttpFailure,
    /// A TCP failure (refused, reset, TLS failure, I/O error).
    TcpFailure,
    /// A timeout.
    Timeout,
}

impl Report {
    /// Counter name, for messages.
    pub fn label(self) -> &'static str {
        match self {
            Report::Success => "success",
            Report::HttpFailure => "http failure",
            Report::TcpFailure => "tcp failure",
            Report::Timeout => "timeout",
        }
    }
}

/// What applying a report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The state before.
    pub from: Status,
    /// The state after.
    pub to: Status,
    /// The counter value after the report.
    pub count: u8,
}

/// Applies one report with its threshold; `threshold == 0` disables that kind.
pub fn apply(status: Status, c: &mut Counter, report: Report, threshold: u8) -> Option<Outcome> {
    if threshold == 0 {
        return None;
    }
    let success = report == Report::Success;
    if (success && status == Status::Healthy) || (!success && status == Status::Unhealthy) {
        return None;
    }
    let slot = match report {
        Report::Success => &mut c.success,
        Report::HttpFailure => &mut c.http_failure,
        Report::TcpFailure => &mut c.tcp_failure,
        Report::Timeout => &mut c.timeout_failure,
    };
    *slot = slot.saturating_add(1);
    let count = *slot;
    if success {
        c.http_failure = 0;
        c.tcp_failure = 0;
        c.timeout_failure = 0;
    } else {
        c.success = 0;
    }
    let to = if count >= threshold {
        if success {
            Status::Healthy
        } else {
            Status::Unhealthy
        }
    } else if status == Status::Healthy && (c.http_failure > 0 || c.tcp_failure > 0 || c.timeout_failure > 0) {
        Status::MostlyHealthy
    } else if status == Status::Unhealthy && c.success > 0 {
        Status::MostlyUnhealthy
    } else {
        status
    };
    Some(Outcome { from: status, to, count })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_example() {
        // successes 2, tcp_failures 2:
        // healthy{0} -tcp-> mostly_healthy{tcp 1} -tcp-> unhealthy{tcp 2} -tcp-> unhealthy{tcp 2}
        // -ok-> mostly_unhealthy{success 1} -ok-> healthy{success 2}
        let mut c = Counter::default();
        let mut s = Status::Healthy;
        let step = |s: &mut Status, c: &mut Counter, r: Report, t: u8| {
            if let Some(o) = apply(*s, c, r, t) {
                *s = o.to;
            }
        };
        step(&mut s, &mut c, Report::TcpFailure, 2);
        assert_eq!((s, c.tcp_failure), (Status::MostlyHealthy, 1));
        step(&mut s, &mut c, Report::TcpFailure, 2);
        assert_eq!((s, c.tcp_failure), (Status::Unhealthy, 2));
        step(&mut s, &mut c, Report::TcpFailure, 2);
        assert_eq!((s, c.tcp_failure), (Status::Unhealthy, 2), "a failure while unhealthy changes nothing");
        step(&mut s, &mut c, Report::Success, 2);
        assert_eq!((s, c.success, c.tcp_failure), (Status::MostlyUnhealthy, 1, 0));
        step(&mut s, &mut c, Report::Success, 2);
        assert_eq!((s, c.success), (Status::Healthy, 2));
        step(&mut s, &mut c, Report::Success, 2);
        assert_eq!((s, c.success), (Status::Healthy, 2), "a success while healthy changes nothing");
    }

    #[test]
    fn zero_threshold_disables_and_counters_cap() {
        let mut c = Counter::default();
        assert!(apply(Status::Healthy, &mut c, Report::HttpFailure, 0).is_none());
        assert_eq!(c, Counter::default());
        c.timeout_failure = 255;
        let o = apply(Status::MostlyHealthy, &mut c, Report::Timeout, 255);
        assert_eq!(o.map(|o| (o.to, o.count)), Some((Status::Unhealthy, 255)));
    }

    #[test]
    fn mixed_failures_accumulate_per_kind() {
        let mut c = Counter::default();
        let o = apply(Status::Healthy, &mut c, Report::HttpFailure, 5);
        assert_eq!(o.map(|o| o.to), Some(Status::MostlyHealthy));
        let o = apply(Status::MostlyHealthy, &mut c, Report::Timeout, 3);
        assert_eq!(o.map(|o| o.to), Some(Status::MostlyHealthy));
        assert_eq!((c.http_failure, c.timeout_failure), (1, 1));
        let o = apply(Status::MostlyHealthy, &mut c, Report::Success, 2);
        assert_eq!(o.map(|o| o.to), Some(Status::MostlyHealthy), "one success of two does not heal");
        assert_eq!((c.http_failure, c.timeout_failure, c.success), (0, 0, 1));
    }
}
