//! The access log (`gateway.access_log`): one line per request, in nginx's `combined` format,
//! as JSON, or from a `$variable` template, written off the request path.
//!
//! The request path formats its line and hands it, without waiting or locking, to the SDK's
//! off-thread [`LineWriter`] (the one the logging plugins use): when its queue is full (the disk
//! is slower than the traffic) the line is dropped and counted (`access_log_dropped_total`),
//! never blocking a request. SIGUSR1 makes the writer reopen the file, for logrotate.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use http::{HeaderMap, HeaderName};
use weir_plugin::logfile::LineWriter;
use weir_plugin::template::{Piece, Template};
use weir_plugin::RequestCtx;

/// How lines are written.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// nginx's `combined`.
    Combined,
    /// One JSON object per line.
    Json,
    /// A template with `$name` or `${name}` variables (the SDK's template engine: every
    /// variable checked at load).
    Template(Template),
}

impl Format {
    /// Parses `combined`, `json` or a template; a template must name at least one variable.
    pub fn parse(text: &str) -> Result<Format, String> {
        match text {
            "combined" => return Ok(Format::Combined),
            "json" => return Ok(Format::Json),
            _ => {}
        }
        let template = Template::compile(text)?;
        if template.is_literal() {
            return Err(format!("`{text}` is neither `combined`, `json` nor a template with `$variables`"));
        }
        Ok(Format::Template(template))
    }

    /// Whether a template names `$plugin_time` (each plugin's time in its phases, in ms).
    pub fn reads_plugin_time(&self) -> bool {
        match self {
            Format::Template(t) => t.pieces().iter().any(|p| matches!(p, Piece::Var(n) if &**n == "plugin_time")),
            _ => false,
        }
    }

    /// The request headers a line of this format reads: `combined` Referer and User-Agent,
    /// `json` those and Host, a template its `$http_*` and `$host`. Only these are kept past
    /// forwarding, instead of a copy of every header.
    pub fn headers_read(&self) -> Vec<HeaderName> {
        let names: Vec<String> = match self {
            Format::Combined => vec!["referer".into(), "user-agent".into()],
            Format::Json => vec!["referer".into(), "user-agent".into(), "host".into()],
            Format::Template(template) => template
                .pieces()
                .iter()
                .filter_map(|p| match p {
                    Piece::Var(name) if &**name == "host" => Some("host".to_owned()),
                    // As `RequestCtx::var` reads them: `_` for `-`, any case.
                    Piece::Var(name) => name.strip_prefix("http_").map(|h| h.replace('_', "-").to_ascii_lowercase()),
                    Piece::Text(_) => None,
                })
                .collect(),
        };
        let mut out: Vec<HeaderName> = Vec::new();
        for name in names.iter().filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok()) {
            if !out.contains(&name) {
                out.push(name);
            }
        }
        out
    }
}

/// Lines written and dropped so far.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Lines the writer wrote.
    pub written: u64,
    /// Lines dropped because the queue was full.
    pub dropped: u64,
}

/// The running access log.
struct AccessLog {
    format: Format,
    /// [`Format::headers_read`].
    headers: Vec<HeaderName>,
    writer: Arc<LineWriter>,
}

static LOG: OnceLock<AccessLog> = OnceLock::new();

/// Opens `path` and starts the writer with room for `buffer` waiting lines (the
/// `gateway.access_log` section). Errors name the key and the file.
pub fn start(path: PathBuf, format: &str, buffer: usize) -> Result<(), String> {
    let format = Format::parse(format).map_err(|e| format!("gateway.access_log.format: {e}"))?;
    let writer =
        LineWriter::start_with("access-log", path, buffer).map_err(|e| format!("gateway.access_log.path: {e}"))?;
    let headers = format.headers_read();
    if format.reads_plugin_time() {
        // `$plugin_time`: every request's plugin phases are timed (off otherwise: no clock read).
        weir_plugin::measure::set_always(weir_plugin::measure::FOR_ACCESS_LOG, true);
    }
    LOG.set(AccessLog { format, headers, writer }).map_err(|_| "gateway.access_log: started twice".to_owned())
}

/// What of `headers` the access log reads after forwarding, when it is on (`None` when off):
/// the request then keeps these instead of a copy of every header.
pub fn headers_kept(headers: &HeaderMap) -> Option<HeaderMap> {
    let log = LOG.get()?;
    let mut kept = HeaderMap::new();
    for name in &log.headers {
        for v in headers.get_all(name) {
            kept.append(name.clone(), v.clone());
        }
    }
    Some(kept)
}

/// Asks the writer to reopen the file (SIGUSR1, after logrotate moved it).
pub fn reopen() {
    if let Some(log) = LOG.get() {
        log.writer.reopen();
    }
}

/// Written and dropped lines, when the access log is on.
pub fn stats() -> Option<Stats> {
    LOG.get().map(|l| Stats { written: l.writer.written(), dropped: l.writer.dropped() })
}

/// Writes out every line queued so far (bounded): the last step of a graceful stop.
pub fn flush() {
    if let Some(log) = LOG.get() {
        log.writer.finish();
    }
}

/// Logs one finished request (nothing when the access log is off). Never blocks.
pub fn record(ctx: &RequestCtx) {
    if let Some(log) = LOG.get() {
        log.writer.line(format_line(&log.format, ctx));
    }
}

/// One line (without its newline) for `ctx`.
pub fn format_line(format: &Format, ctx: &RequestCtx) -> String {
    let mut out = String::with_capacity(256);
    match format {
        Format::Combined => {
            out.push_str(&ctx.remote_ip);
            out.push_str(" - - [");
            with_time(|t| out.push_str(&t.local));
            out.push_str("] \"");
            // `$request`, written in place.
            escape_into(&mut out, ctx.method.as_str());
            out.push(' ');
            escape_into(&mut out, &ctx.request_uri());
            out.push(' ');
            out.push_str(weir_plugin::version_str(ctx.version));
            out.push_str("\" ");
            push_num(&mut out, u64::from(ctx.status));
            out.push(' ');
            push_num(&mut out, ctx.body_bytes_sent);
            out.push_str(" \"");
            escape_into(&mut out, ctx.header("referer").unwrap_or("-"));
            out.push_str("\" \"");
            escape_into(&mut out, ctx.header("user-agent").unwrap_or("-"));
            out.push('"');
        }
        Format::Json => with_time(|t| {
            let line = JsonLine {
                args: &ctx.query,
                body_bytes_sent: ctx.body_bytes_sent,
                bytes_sent: ctx.head_bytes_sent + ctx.body_bytes_sent,
                consumer: ctx.consumer.as_ref().map(|c| &*c.username),
                host: ctx.var("host"),
                http_referer: ctx.header("referer"),
                http_user_agent: ctx.header("user-agent"),
                remote_addr: &ctx.remote_ip,
                request_length: ctx.request_length,
                request_method: ctx.method.as_str(),
                request_time: ctx.started.elapsed().as_secs_f64(),
                route_id: ctx.route_id.as_deref(),
                server_protocol: weir_plugin::version_str(ctx.version),
                service_id: ctx.service_id.as_deref(),
                status: ctx.status,
                time: &t.iso,
                upstream_addr: ctx.var("upstream_addr"),
                upstream_response_time: ctx.upstream_time.map(|t| t.as_secs_f64()),
                uri: &ctx.path,
            };
            // Serializing plain fields cannot fail; an error would leave the line empty.
            if let Ok(text) = serde_json::to_string(&line) {
                push_without_controls(&mut out, &text);
            }
        }),
        Format::Template(template) => {
            for p in template.pieces() {
                match p {
                    Piece::Text(t) => out.push_str(t),
                    Piece::Var(name) => match &**name {
                        "time_local" => with_time(|t| out.push_str(&t.local)),
                        "time_iso8601" => with_time(|t| out.push_str(&t.iso)),
                        "msec" => {
                            out.push_str(&format!("{:.3}", chrono::Utc::now().timestamp_millis() as f64 / 1000.0))
                        }
                        _ => match ctx.var(name) {
                            Some(v) if !v.is_empty() => escape_into(&mut out, &v),
                            _ => out.push('-'),
                        },
                    },
                }
            }
        }
    }
    out
}

/// Appends a JSON text with the control characters JSON leaves raw (DEL, and the C1 range
/// U+0080-U+009F) written as `\u` escapes, so that no line carries a control character. A
/// byte scan first: the common line has none of them.
fn push_without_controls(out: &mut String, json: &str) {
    use std::fmt::Write as _;
    if !json.bytes().any(|b| b == 0x7f || b == 0xc2) {
        out.push_str(json);
        return;
    }
    for c in json.chars() {
        if c.is_control() {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
}

fn push_num(out: &mut String, n: u64) {
    use std::fmt::Write as _;
    let _ = write!(out, "{n}");
}

/// As nginx escapes variables in its log: `"`, `\`, control and non-ASCII bytes become `\xHH`,
/// so that a client cannot forge lines or fields.
fn escape_into(out: &mut String, v: &str) {
    use std::fmt::Write as _;
    let plain = |b: u8| b != b'"' && b != b'\\' && (0x20..0x7f).contains(&b);
    if v.bytes().all(plain) {
        // The common case: nothing to escape.
        out.push_str(v);
        return;
    }
    for b in v.bytes() {
        if b == b'"' || b == b'\\' || !(0x20..0x7f).contains(&b) {
            let _ = write!(out, "\\x{b:02X}");
        } else {
            out.push(char::from(b));
        }
    }
}

/// A `json` line: fields in the order they have always had (sorted), borrowed from the request.
#[derive(serde::Serialize)]
struct JsonLine<'a> {
    args: &'a str,
    body_bytes_sent: u64,
    bytes_sent: u64,
    consumer: Option<&'a str>,
    host: Option<std::borrow::Cow<'a, str>>,
    http_referer: Option<&'a str>,
    http_user_agent: Option<&'a str>,
    remote_addr: &'a str,
    request_length: u64,
    request_method: &'a str,
    request_time: f64,
    route_id: Option<&'a str>,
    server_protocol: &'a str,
    service_id: Option<&'a str>,
    status: u16,
    time: &'a str,
    upstream_addr: Option<std::borrow::Cow<'a, str>>,
    upstream_response_time: Option<f64>,
    uri: &'a str,
}

/// The current second, formatted both ways, cached per thread.
struct Clock {
    second: i64,
    local: String,
    iso: String,
}

thread_local! {
    static CLOCK: RefCell<Clock> = const { RefCell::new(Clock { second: i64::MIN, local: String::new(), iso: String::new() }) };
}

fn with_time<R>(f: impl FnOnce(&Clock) -> R) -> R {
    CLOCK.with(|c| {
        let mut c = c.borrow_mut();
        // The system clock says whether the second changed; the local time (time zone lookup)
        // is only asked once a second.
        let second = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        if second != c.second {
            let now = chrono::Local::now();
            c.second = second;
            c.local = now.format("%d/%b/%Y:%H:%M:%S %z").to_string();
            c.iso = now.format("%Y-%m-%dT%H:%M:%S%:z").to_string();
        }
        f(&c)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> RequestCtx {
        let mut headers = http::HeaderMap::new();
        headers.insert("user-agent", http::HeaderValue::from_static("curl/8 \"x\""));
        headers.insert("host", http::HeaderValue::from_static("example.com"));
        let addr: std::net::SocketAddr = "10.0.0.1:5000".parse().unwrap_or_else(|e| panic!("{e}"));
        let mut c =
            RequestCtx::new(http::Method::GET, "/a b".into(), "q=1".into(), headers, addr, Arc::from("10.0.0.1"), addr);
        c.status = 200;
        c.body_bytes_sent = 1024;
        c
    }

    #[test]
    fn combined_escapes_quotes_and_control_bytes() {
        let line = format_line(&Format::Combined, &ctx());
        assert!(line.starts_with("10.0.0.1 - - ["), "{line}");
        assert!(line.ends_with("] \"GET /a b?q=1 HTTP/1.1\" 200 1024 \"-\" \"curl/8 \\x22x\\x22\""), "{line}");
    }

    #[test]
    fn json_is_one_object_per_line() {
        let line = format_line(&Format::Json, &ctx());
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["status"], 200);
        assert_eq!(v["host"], "example.com");
        assert_eq!(v["http_user_agent"], "curl/8 \"x\"");
    }

    #[test]
    fn only_the_headers_a_format_reads_are_kept() {
        let names = |f: &str| -> Vec<String> {
            Format::parse(f).unwrap_or_else(|e| panic!("{e}")).headers_read().iter().map(|h| h.to_string()).collect()
        };
        assert_eq!(names("combined"), ["referer", "user-agent"]);
        assert_eq!(names("json"), ["referer", "user-agent", "host"]);
        assert_eq!(names("$host $http_X_Request_Id ${http_accept} $status $arg_a"), ["host", "x-request-id", "accept"]);
        assert!(names("$status $request").is_empty());
        assert_eq!(names("$http_accept $status $http_Accept"), ["accept"], "each header once");
    }

    #[test]
    fn plugin_time_lists_each_plugins_phases() {
        use weir_plugin::measure::{note_phase, phase_clock, Measured, Phase};
        let f = Format::parse("$status $plugin_time").unwrap_or_else(|e| panic!("{e}"));
        assert!(f.reads_plugin_time());
        assert!(!Format::Combined.reads_plugin_time());
        let mut c = ctx();
        assert_eq!(format_line(&f, &c), "200 -", "not timed: absent");
        c.measured = Some(Box::new(Measured { phases: true, ..Measured::default() }));
        for (plugin, phase) in [("key-auth", Phase::Rewrite), ("limit-req", Phase::Access), ("key-auth", Phase::Log)] {
            let t0 = phase_clock(&c);
            note_phase(&mut c, t0, plugin, phase);
        }
        let line = format_line(&f, &c);
        let times = line.strip_prefix("200 ").unwrap_or_else(|| panic!("{line}"));
        let names: Vec<&str> = times.split(',').map(|t| t.split(':').next().unwrap_or("")).collect();
        assert_eq!(names, ["key-auth", "limit-req"], "{line}");
        for t in times.split(',') {
            let ms: f64 = t.split(':').nth(1).and_then(|v| v.parse().ok()).unwrap_or(-1.0);
            assert!(ms >= 0.0, "{line}");
        }
    }

    #[test]
    fn templates_substitute_and_mark_absent_values() {
        let f =
            Format::parse("$remote_addr ${status}x $upstream_addr $http_user_agent").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(format_line(&f, &ctx()), "10.0.0.1 200x - curl/8 \\x22x\\x22");
        assert!(Format::parse("no variables").is_err());
        assert!(Format::parse("$ alone").is_err());
        assert!(Format::parse("${unclosed").is_err());
        assert!(Format::parse("$remote_adr").is_err(), "a misspelled variable refuses the format");
    }
}
