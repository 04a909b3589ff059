//! What the host measures of a request, for whoever asks: the time of each plugin phase
//! (per-plugin cost: `plugin_attr.prometheus.plugin_latency`, the access log's `$plugin_time`,
//! the opentelemetry plugin's `plugin_spans`) and each upstream attempt with its node, outcome
//! and times (the opentelemetry plugin's child spans), plus the W3C trace context the host
//! writes into each attempt's `traceparent`.
//!
//! Nothing is measured unless asked: a request carries a [`Measured`] only when a plugin put
//! one in [`RequestCtx::measured`](crate::RequestCtx::measured) (the opentelemetry plugin, for
//! a sampled request) or when a process-wide consumer of phase times is on ([`set_always`]).
//! Without one the host reads no clock for it.
//!
//! ```
//! use weir_plugin::measure::{self, Measured, Phase};
//!
//! let mut ctx = weir_plugin::RequestCtx::new(
//!     weir_plugin::http::Method::GET, "/".into(), String::new(), Default::default(),
//!     "127.0.0.1:1".parse().unwrap(), std::sync::Arc::from("127.0.0.1"), "127.0.0.1:9080".parse().unwrap(),
//! );
//! assert!(measure::phase_clock(&ctx).is_none(), "off: no clock read");
//! ctx.measured = Some(Box::new(Measured { phases: true, ..Measured::default() }));
//! let t0 = measure::phase_clock(&ctx);
//! measure::note_phase(&mut ctx, t0, "key-auth", Phase::Rewrite);
//! assert_eq!(ctx.measured.as_ref().map(|m| m.phase_times.len()), Some(1));
//! assert!(ctx.var("plugin_time").is_some_and(|v| v.starts_with("key-auth:")));
//! ```

use std::cell::Cell;
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use http::HeaderValue;

use crate::RequestCtx;

/// A plugin phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// `rewrite`.
    Rewrite,
    /// `access`.
    Access,
    /// `header_filter`.
    HeaderFilter,
    /// `body_filter` (every chunk of one response, added up).
    BodyFilter,
    /// `log`.
    Log,
}

impl Phase {
    /// Every phase, in the order they run.
    pub const ALL: [Phase; 5] = [Phase::Rewrite, Phase::Access, Phase::HeaderFilter, Phase::BodyFilter, Phase::Log];

    /// Its name as APISIX spells it (`header_filter`).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Rewrite => "rewrite",
            Phase::Access => "access",
            Phase::HeaderFilter => "header_filter",
            Phase::BodyFilter => "body_filter",
            Phase::Log => "log",
        }
    }
}

/// One plugin phase of one request.
#[derive(Debug, Clone)]
pub struct PhaseTime {
    /// The plugin's name.
    pub plugin: &'static str,
    /// The phase.
    pub phase: Phase,
    /// When it began (the first chunk, for `body_filter`).
    pub start: Instant,
    /// When it ended (the last chunk, for `body_filter`).
    pub end: Instant,
    /// Time spent in it: `end - start`, except for `body_filter`, where it is the sum over the
    /// chunks (the time between chunks is the client's and the upstream's).
    pub busy: Duration,
}

/// One upstream attempt: a connection to a node and an exchange on it (retries are attempts
/// of their own).
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The node.
    pub node: SocketAddr,
    /// The span id written into this attempt's `traceparent` (zero when no trace context).
    pub span_id: [u8; 8],
    /// When the node was picked.
    pub start: Instant,
    /// When the answer's head arrived, or the attempt failed; for the answer that was sent to
    /// the client, when its body's last byte arrived.
    pub end: Instant,
    /// The node's status code, when it answered.
    pub status: Option<u16>,
    /// Why the attempt failed, when it did.
    pub error: Option<String>,
}

/// The W3C trace context a request goes upstream with (`traceparent`, `tracestate`).
#[derive(Debug, Clone)]
pub struct TraceContext {
    /// The trace.
    pub trace_id: [u8; 16],
    /// The request's own (server) span.
    pub span_id: [u8; 8],
    /// The span the client sent in its `traceparent`, if it sent one.
    pub parent_id: Option<[u8; 8]>,
    /// Sampled: the `01` flag, and spans are recorded.
    pub sampled: bool,
    /// `tracestate`, passed on as it came.
    pub state: Option<HeaderValue>,
}

/// `traceparent`.
pub const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
/// `tracestate`.
pub const TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");

impl TraceContext {
    /// The `traceparent` value naming `span_id` as the parent (version 00).
    pub fn traceparent(&self, span_id: &[u8; 8]) -> HeaderValue {
        let mut s = [b'-'; 55];
        self.write_traceparent(span_id, &mut s);
        // Only hex digits and dashes: always a valid value.
        HeaderValue::from_bytes(&s)
            .unwrap_or(HeaderValue::from_static("00-00000000000000000000000000000000-0000000000000000-00"))
    }

    /// Writes the `traceparent` value naming `span_id` into `out`.
    fn write_traceparent(&self, span_id: &[u8; 8], out: &mut [u8; 55]) {
        out[..2].copy_from_slice(b"00");
        out[2] = b'-';
        hex_into(&mut out[3..35], &self.trace_id);
        out[35] = b'-';
        hex_into(&mut out[36..52], span_id);
        out[52] = b'-';
        out[53..].copy_from_slice(if self.sampled { b"01" } else { b"00" });
    }
}

/// Writes `bytes` as lowercase hex into `out` (twice as long).
fn hex_into(out: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 15)];
    }
}

/// Appends `bytes` as lowercase hex.
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    let mut buf = [0u8; 64];
    for chunk in bytes.chunks(32) {
        let n = chunk.len() * 2;
        hex_into(&mut buf[..n], chunk);
        out.push_str(std::str::from_utf8(&buf[..n]).unwrap_or(""));
    }
}

/// What the host measures of one request, and what it measured.
#[derive(Debug, Default)]
pub struct Measured {
    /// Time each plugin phase (into `phase_times`).
    pub phases: bool,
    /// Record each upstream attempt (into `attempts`).
    pub attempts: bool,
    /// Send each attempt upstream with this trace context, under a span id of its own.
    pub trace: Option<TraceContext>,
    /// The phases timed so far, in the order they ran.
    pub phase_times: Vec<PhaseTime>,
    /// The upstream attempts so far.
    pub attempt_list: Vec<Attempt>,
}

impl Measured {
    /// Time spent in plugin phases, per plugin (in the order plugins first ran), as
    /// `name:milliseconds` joined by commas (`$plugin_time`).
    pub fn plugin_time(&self) -> String {
        let mut totals: Vec<(&'static str, Duration)> = Vec::new();
        for t in &self.phase_times {
            match totals.iter_mut().find(|(p, _)| *p == t.plugin) {
                Some((_, d)) => *d += t.busy,
                None => totals.push((t.plugin, t.busy)),
            }
        }
        let mut out = String::with_capacity(totals.len() * 24);
        for (i, (p, d)) in totals.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{p}:{:.3}", d.as_secs_f64() * 1000.0);
        }
        out
    }
}

/// Consumers of every request's phase times, process-wide.
static ALWAYS: AtomicU8 = AtomicU8::new(0);
/// `plugin_attr.prometheus.plugin_latency`.
pub const FOR_LATENCY: u8 = 1;
/// The access log's `$plugin_time`.
pub const FOR_ACCESS_LOG: u8 = 2;

/// Turns a process-wide consumer of phase times (`FOR_LATENCY`, `FOR_ACCESS_LOG`) on or off.
pub fn set_always(which: u8, on: bool) {
    if on {
        ALWAYS.fetch_or(which, Ordering::Relaxed);
    } else {
        ALWAYS.fetch_and(!which, Ordering::Relaxed);
    }
}

/// Whether every request's plugin phases are timed (one relaxed load).
#[inline]
pub fn always() -> bool {
    ALWAYS.load(Ordering::Relaxed) != 0
}

/// What records phase times into the latency histogram (the prometheus plugin's).
static RECORDER: OnceLock<fn(&[PhaseTime])> = OnceLock::new();

/// Sets the latency recorder, once per process (later calls change nothing).
pub fn set_latency_recorder(record: fn(&[PhaseTime])) {
    let _ = RECORDER.set(record);
}

/// Called by the host once a request's log phase ran: hands its phase times to the latency
/// recorder when `plugin_latency` is on.
pub fn finished(ctx: &RequestCtx) {
    if let Some(m) = &ctx.measured {
        if m.phases && ALWAYS.load(Ordering::Relaxed) & FOR_LATENCY != 0 {
            if let Some(record) = RECORDER.get() {
                record(&m.phase_times);
            }
        }
    }
}

/// A phase's start, when this request's phases are timed (no clock read otherwise).
#[inline]
pub fn phase_clock(ctx: &RequestCtx) -> Option<Instant> {
    match &ctx.measured {
        Some(m) if m.phases => Some(Instant::now()),
        _ => None,
    }
}

/// Notes a phase that began at `since` (from [`phase_clock`]) and ends now. `body_filter` is
/// added to the plugin's earlier chunks.
#[inline]
pub fn note_phase(ctx: &mut RequestCtx, since: Option<Instant>, plugin: &'static str, phase: Phase) {
    let (Some(start), Some(m)) = (since, ctx.measured.as_deref_mut()) else { return };
    let end = Instant::now();
    let busy = end.saturating_duration_since(start);
    if phase == Phase::BodyFilter {
        if let Some(t) = m.phase_times.iter_mut().rev().find(|t| t.plugin == plugin && t.phase == phase) {
            t.busy += busy;
            t.end = end;
            return;
        }
    }
    m.phase_times.push(PhaseTime { plugin, phase, start, end, busy });
}

/// Whether this request's upstream attempts are recorded or carry a trace context.
#[inline]
pub fn attempts_watched(ctx: &RequestCtx) -> bool {
    ctx.measured.as_ref().is_some_and(|m| m.attempts || m.trace.is_some())
}

thread_local! {
    static RNG: Cell<u64> = Cell::new({
        let seed = std::collections::hash_map::RandomState::new().build_hasher().finish();
        seed | 1
    });
}

/// A random 64-bit number (a per-thread generator seeded from the OS: fast, not for secrets).
pub fn random_u64() -> u64 {
    RNG.with(|s| {
        // wyrand.
        let x = s.get().wrapping_add(0xa076_1d64_78bd_642f);
        s.set(x);
        let t = u128::from(x) * u128::from(x ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    })
}

/// A new span id (never all zeros).
pub fn new_span_id() -> [u8; 8] {
    loop {
        let n = random_u64();
        if n != 0 {
            return n.to_be_bytes();
        }
    }
}

/// A new trace id (never all zeros).
pub fn new_trace_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&random_u64().to_be_bytes());
    id[8..].copy_from_slice(&new_span_id());
    id
}

/// What one upstream attempt carries of the request's trace context: `traceparent` naming the
/// attempt's own span id, and the client's `tracestate` (none: the field is removed).
#[derive(Debug, Clone)]
pub struct AttemptTrace {
    /// The attempt's span id.
    pub span_id: [u8; 8],
    traceparent: [u8; 55],
    state: Option<HeaderValue>,
}

impl AttemptTrace {
    /// The `traceparent` value (version 00, lowercase hex and dashes: always a valid value).
    pub fn traceparent(&self) -> &[u8] {
        &self.traceparent
    }

    /// The `tracestate` value; empty when the field must be removed (the client sent none, or
    /// no `traceparent` with it).
    pub fn tracestate(&self) -> &[u8] {
        self.state.as_ref().map_or(&[], |s| s.as_bytes())
    }

    /// Sets both in a header map (the HTTP/2 and WebSocket exchanges; HTTP/1.1 writes them as
    /// it encodes the head, without touching the map).
    pub fn apply(&self, headers: &mut http::HeaderMap) {
        if let Ok(v) = HeaderValue::from_bytes(&self.traceparent) {
            headers.insert(TRACEPARENT, v);
        }
        match &self.state {
            Some(s) => {
                headers.insert(TRACESTATE, s.clone());
            }
            None => {
                headers.remove(TRACESTATE);
            }
        }
    }
}

/// The trace context of the next upstream attempt, under a new span id, when the request
/// carries one (no allocation: the caller writes it into the head).
pub fn attempt_trace(measured: &Option<Box<Measured>>) -> Option<AttemptTrace> {
    let t = measured.as_deref()?.trace.as_ref()?;
    let span_id = new_span_id();
    let mut traceparent = [0; 55];
    t.write_traceparent(&span_id, &mut traceparent);
    Some(AttemptTrace { span_id, traceparent, state: t.state.clone() })
}

/// Starts recording an upstream attempt (traced as `trace`, from [`attempt_trace`]). Returns
/// the attempt's start and span id, `None` when attempts are not recorded.
pub fn attempt_begins(measured: &Option<Box<Measured>>, trace: Option<&AttemptTrace>) -> Option<(Instant, [u8; 8])> {
    let m = measured.as_deref()?;
    m.attempts.then(|| (Instant::now(), trace.map_or([0; 8], |t| t.span_id)))
}

/// Records an attempt begun with [`attempt_begins`].
pub fn attempt_ends(
    measured: &mut Option<Box<Measured>>,
    begun: Option<(Instant, [u8; 8])>,
    node: SocketAddr,
    status: Option<u16>,
    error: Option<&str>,
) {
    let (Some((start, span_id)), Some(m)) = (begun, measured.as_deref_mut()) else { return };
    m.attempt_list.push(Attempt { node, span_id, start, end: Instant::now(), status, error: error.map(str::to_owned) });
}

/// The answering attempt's body ended: its span ends now.
pub fn answer_done(ctx: &mut RequestCtx) {
    if let Some(a) = ctx.measured.as_deref_mut().filter(|m| m.attempts).and_then(|m| m.attempt_list.last_mut()) {
        if a.status.is_some() {
            a.end = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_w3c() {
        let t = TraceContext { trace_id: [0xab; 16], span_id: [1; 8], parent_id: None, sampled: true, state: None };
        assert_eq!(
            t.traceparent(&[0x0c; 8]).to_str().ok(),
            Some("00-abababababababababababababababab-0c0c0c0c0c0c0c0c-01")
        );
    }

    #[test]
    fn ids_are_random_and_never_zero() {
        let a = new_trace_id();
        let b = new_trace_id();
        assert_ne!(a, b);
        assert_ne!(new_span_id(), [0; 8]);
    }

    #[test]
    fn body_filter_chunks_add_up() {
        let mut ctx = crate::phase::tests_support::ctx();
        ctx.measured = Some(Box::new(Measured { phases: true, ..Measured::default() }));
        for _ in 0..3 {
            let t0 = phase_clock(&ctx);
            note_phase(&mut ctx, t0, "gzip", Phase::BodyFilter);
        }
        let t0 = phase_clock(&ctx);
        note_phase(&mut ctx, t0, "gzip", Phase::Log);
        let m = ctx.measured.as_ref().map(|m| m.phase_times.len());
        assert_eq!(m, Some(2));
    }
}
