//! `syslog`: request log entries sent to a syslog server as RFC 5424 messages (APISIX's
//! syslog), over UDP (RFC 5426: one message per datagram) or TCP (RFC 6587 octet counting:
//! `LEN SP MSG`, a connection per batch). Each message is
//! `<PRI>1 TIMESTAMP HOSTNAME weir PROCID - - ENTRY`: PRI from `facility` and `severity`
//! (APISIX's names; it always sends `SYSLOG`/`INFO`, the defaults here), TIMESTAMP the time the
//! entry was made (UTC, milliseconds), HOSTNAME the request's host (as APISIX), ENTRY the JSON
//! entry of `weir_plugin::log_entry`. Batching is `weir_plugin::batch`'s; the request's log
//! phase only enqueues.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::batch::{self, BatchConf, Encode, SendFuture, Sink, SinkPlugin, MAX_DATAGRAM};
use weir_plugin::serde_json::{Map, Value};
use weir_plugin::{register_plugin, BuildContext, RequestCtx};

/// The transport.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SockType {
    /// TCP with octet counting (the default, as in APISIX).
    #[default]
    Tcp,
    /// UDP, one message per datagram.
    Udp,
}

/// RFC 5424 facilities, by APISIX's names.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[allow(clippy::upper_case_acronyms)]
pub enum Facility {
    KERN,
    USER,
    MAIL,
    DAEMON,
    AUTH,
    /// The default (APISIX's only one).
    #[default]
    SYSLOG,
    LPR,
    NEWS,
    UUCP,
    CRON,
    AUTHPRIV,
    FTP,
    LOCAL0,
    LOCAL1,
    LOCAL2,
    LOCAL3,
    LOCAL4,
    LOCAL5,
    LOCAL6,
    LOCAL7,
}

impl Facility {
    fn code(self) -> u8 {
        match self {
            Facility::KERN => 0,
            Facility::USER => 1,
            Facility::MAIL => 2,
            Facility::DAEMON => 3,
            Facility::AUTH => 4,
            Facility::SYSLOG => 5,
            Facility::LPR => 6,
            Facility::NEWS => 7,
            Facility::UUCP => 8,
            Facility::CRON => 9,
            Facility::AUTHPRIV => 10,
            Facility::FTP => 11,
            Facility::LOCAL0 => 16,
            Facility::LOCAL1 => 17,
            Facility::LOCAL2 => 18,
            Facility::LOCAL3 => 19,
            Facility::LOCAL4 => 20,
            Facility::LOCAL5 => 21,
            Facility::LOCAL6 => 22,
            Facility::LOCAL7 => 23,
        }
    }
}

/// RFC 5424 severities, by APISIX's names (`EMERG`; APISIX spells it `EMEGR`, also accepted).
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[allow(clippy::upper_case_acronyms)]
pub enum Severity {
    #[serde(alias = "EMEGR")]
    EMERG,
    ALERT,
    CRIT,
    ERR,
    WARNING,
    NOTICE,
    /// The default (APISIX's only one).
    #[default]
    INFO,
    DEBUG,
}

fn three_thousand() -> u64 {
    3000
}

/// The plugin's own fields (APISIX's names and defaults); with `log_format`, the body fields and
/// the batch processor's, they make its configuration (`weir_plugin::batch::SinkConf`).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Conf {
    /// The syslog server's address or name.
    #[schemars(length(min = 1))]
    pub host: String,
    /// Its port.
    pub port: u16,
    /// `tcp` (default) or `udp`.
    #[serde(default)]
    pub sock_type: SockType,
    /// Milliseconds a batch may take.
    #[serde(default = "three_thousand")]
    #[schemars(range(min = 1))]
    pub timeout: u64,
    /// The messages' facility (default `SYSLOG`).
    #[serde(default)]
    pub facility: Facility,
    /// The messages' severity (default `INFO`).
    #[serde(default)]
    pub severity: Severity,
    /// TLS to the syslog server. Not supported yet: `true` is refused at load.
    #[serde(default)]
    pub tls: bool,
    /// APISIX's logger-socket buffer settings: accepted and ignored (the batch processor's
    /// bounds, `max_pending_entries` and `max_pending_bytes`, do their work).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub flush_limit: Option<u64>,
    /// Accepted and ignored (see `flush_limit`).
    #[serde(default)]
    pub drop_limit: Option<u64>,
    /// Accepted and ignored (see `flush_limit`).
    #[serde(default)]
    #[schemars(range(min = 5))]
    pub pool_size: Option<u64>,
}

/// Makes the RFC 5424 message of an entry.
pub struct Rfc5424 {
    pri: u8,
    pid: u32,
}

/// An RFC 5424 header field: printable US-ASCII without spaces, at most `max` characters, `-`
/// when empty.
fn header_field(s: &str, max: usize) -> &str {
    let ok = !s.is_empty() && s.len() <= max && s.bytes().all(|b| (33..=126).contains(&b));
    if ok {
        s
    } else {
        "-"
    }
}

impl Rfc5424 {
    fn message(&self, host: &str, msg: &str) -> String {
        let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ");
        format!("<{}>1 {now} {} weir {} - - {msg}", self.pri, header_field(host, 255), self.pid)
    }
}

impl Encode for Rfc5424 {
    fn encode(&self, ctx: &RequestCtx, entry: Map<String, Value>) -> String {
        let host = ctx.var("host");
        self.message(host.as_deref().unwrap_or("-"), &Value::Object(entry).to_string())
    }
}

/// `LEN SP MSG` frames of `messages` (RFC 6587's octet counting).
pub fn octet_counted(messages: &[String]) -> Vec<u8> {
    let mut out = Vec::with_capacity(messages.iter().map(|m| m.len() + 8).sum());
    for m in messages {
        out.extend_from_slice(m.len().to_string().as_bytes());
        out.push(b' ');
        out.extend_from_slice(m.as_bytes());
    }
    out
}

/// TCP (octet counting) or UDP.
pub struct SyslogSink {
    host: String,
    port: u16,
    sock_type: SockType,
    timeout: Duration,
}

impl Sink for SyslogSink {
    fn send<'a>(&'a self, messages: &'a [String]) -> SendFuture<'a> {
        Box::pin(async move {
            match self.sock_type {
                SockType::Tcp => batch::tcp_send(&self.host, self.port, self.timeout, &octet_counted(messages)).await,
                SockType::Udp => {
                    if let Some(big) = messages.iter().find(|m| m.len() > MAX_DATAGRAM) {
                        return Err(format!("a message of {} bytes does not fit in a datagram", big.len()));
                    }
                    batch::udp_send(&self.host, self.port, self.timeout, messages.iter().map(String::as_bytes)).await
                }
            }
        })
    }
}

/// The plugin.
pub struct Syslog;

impl SinkPlugin for Syslog {
    type Own = Conf;
    type Sink = SyslogSink;
    type Encode = Rfc5424;
    const NAME: &'static str = "syslog";
    const PRIORITY: i32 = 401;
    fn sink(&self, conf: Conf, _batch: &BatchConf, _ctx: &BuildContext<'_>) -> Result<(SyslogSink, Rfc5424), String> {
        if conf.tls {
            return Err("tls: TLS to the syslog server is not supported yet".into());
        }
        let sink = SyslogSink {
            host: conf.host,
            port: conf.port,
            sock_type: conf.sock_type,
            timeout: Duration::from_millis(conf.timeout),
        };
        Ok((sink, Rfc5424 { pri: conf.facility.code() * 8 + conf.severity as u8, pid: std::process::id() }))
    }
}

register_plugin!(Syslog);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_have_the_rfc5424_header_and_frames_count_octets() {
        let r = Rfc5424 { pri: Facility::LOCAL0.code() * 8 + Severity::WARNING as u8, pid: 42 };
        let m = r.message("api.example", "{\"a\":1}");
        let parts: Vec<&str> = m.splitn(8, ' ').collect();
        assert_eq!(parts[0], "<132>1");
        assert!(parts[1].len() == 24 && parts[1].ends_with('Z'), "{m}");
        assert_eq!(&parts[2..], ["api.example", "weir", "42", "-", "-", "{\"a\":1}"]);
        assert!(r.message("bad host", "x").contains(" - weir "));
        assert_eq!(octet_counted(&["ab".into(), "c d".into()]), b"2 ab3 c d");
        assert_eq!(Facility::SYSLOG.code() * 8 + Severity::INFO as u8, 46);
        let s: Severity = serde_json::from_value(serde_json::json!("EMEGR")).expect("APISIX's spelling");
        assert_eq!(s, Severity::EMERG);
    }
}
