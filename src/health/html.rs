//! The HTML page of `/v1/healthcheck` for browsers: one table row per node, unhealthy rows
//! highlighted, every value escaped.

use std::fmt::Write;

use super::Entry;

/// Escapes text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Renders the page.
pub fn render(entries: &[Entry]) -> String {
    let mut rows = String::new();
    let mut index = 0;
    for e in entries {
        for n in &e.nodes {
            index += 1;
            let bad = matches!(n.status, "unhealthy" | "mostly_unhealthy");
            let _ = writeln!(
                rows,
                "<tr class=\"{cls}\"><td>{index}</td><td>{name}</td><td>{ty}</td><td>{host}</td><td class=\"status\">{status}</td><td>{s}</td><td>{t}</td><td>{h}</td><td>{to}</td><td>{why}</td><td>{since}</td></tr>",
                cls = if bad { "unhealthy" } else { "healthy" },
                name = escape(&e.name),
                ty = escape(e.check_type),
                host = if n.hostname == n.ip {
                    escape(&format!("{}:{}", n.ip, n.port))
                } else {
                    escape(&format!("{}:{} ({})", n.ip, n.port, n.hostname))
                },
                status = escape(n.status),
                s = n.counter.success,
                t = n.counter.tcp_failure,
                h = n.counter.http_failure,
                to = n.counter.timeout_failure,
                why = escape(n.last_failure.as_deref().unwrap_or("")),
                since = escape(n.changed_at.as_deref().unwrap_or("")),
            );
        }
    }
    if rows.is_empty() {
        rows.push_str("<tr><td colspan=\"11\" class=\"empty\">No health checkers yet: an upstream is listed once it has <code>checks</code> and has served a request.</td></tr>\n");
    }
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Weir health checks</title>\n<style>\nbody{{font-family:system-ui,sans-serif;margin:2em;color:#222}}\ntable{{border-collapse:collapse}}\nth,td{{border:1px solid #ccc;padding:.3em .8em;text-align:left}}\nth{{background:#f0f0f0}}\ntr.unhealthy td{{background:#fdd;color:#900;font-weight:bold}}\ntd.empty{{color:#666;font-style:italic}}\n</style></head>\n<body><h1>Health checks</h1>\n<table id=\"healthcheck\"><thead><tr><th>Index</th><th>Upstream</th><th>Check type</th><th>Host</th><th>Status</th><th>Success counts</th><th>TCP Failures</th><th>HTTP Failures</th><th>TIMEOUT Failures</th><th>Last failure</th><th>Status since</th></tr></thead>\n<tbody>\n{rows}</tbody></table></body></html>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::{Counter, NodeReport};

    #[test]
    fn escapes_and_highlights() {
        let e = Entry {
            name: "/weir/routes/<x>".into(),
            check_type: "http",
            nodes: vec![NodeReport {
                ip: "127.0.0.1".into(),
                port: 80,
                hostname: "h".into(),
                status: "unhealthy",
                counter: Counter::default(),
                last_failure: Some("tcp failure: <refused>".into()),
                changed_at: None,
            }],
            owner: ("routes".into(), "x".into()),
        };
        let page = render(&[e]);
        assert!(page.contains("/weir/routes/&lt;x&gt;"));
        assert!(page.contains("<tr class=\"unhealthy\">"));
        assert!(!page.contains("<x>"));
    }
}
