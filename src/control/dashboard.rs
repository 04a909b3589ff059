//! The dashboard (`GET /v1/dashboard`, also `GET /` of the control server): one HTML page,
//! rendered here whole (it reads fine with JavaScript off), with its stylesheet and script inlined
//! from `assets/` (nothing is fetched from anywhere else). The script only refreshes the numbers
//! from `GET /v1/dashboard/stats` every two seconds while the page is visible, and shows
//! explanations of the form's requests in place.

use std::fmt::Write;

use actix_web::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use actix_web::http::StatusCode;
use actix_web::HttpResponse;

use super::typed_response;
use crate::health::html::escape;
use crate::openapi::explain::Explanation;
use crate::route_stats::{self, DashboardStats, Rates};
use crate::state::Gateway;
use crate::tables::router::CompiledRoute;

const CSS: &str = include_str!("assets/dashboard.css");
const JS: &str = include_str!("assets/dashboard.js");

/// Routes listed on the page (the busiest first, then in definition order); the rest are
/// counted, and `GET /v1/routes` lists them all.
pub const MAX_ROUTES: usize = 200;
/// Upstreams listed on the page.
pub const MAX_UPSTREAMS: usize = 200;

/// `GET /v1/dashboard/stats`.
pub fn stats(_gw: &Gateway) -> HttpResponse {
    let mut resp = typed_response(StatusCode::OK, &route_stats::stats());
    resp.headers_mut().insert(CACHE_CONTROL, actix_web::http::header::HeaderValue::from_static("no-store"));
    resp
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |x| format!("{:.1} %", x * 100.0))
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |x| format!("{x:.1} ms"))
}

fn p99(r: Option<&Rates>) -> String {
    match r {
        Some(r) if r.requests > 0 => match r.p99_ms {
            Some(b) => format!("≤ {b} ms"),
            None => "> 10 s".to_owned(),
        },
        _ => "–".to_owned(),
    }
}

/// The cells of a route's (or the total's) numbers, named for the script.
fn number_cells(out: &mut String, key: &str, r: Option<&Rates>) {
    let key = escape(key);
    let rps = r.map_or_else(|| "0.00".to_owned(), |r| format!("{:.2}", r.rps));
    let _ = write!(
        out,
        "<td class=\"num\" data-r=\"{key}\" data-k=\"rps\">{rps}</td>\
         <td class=\"num\" data-r=\"{key}\" data-k=\"error_rate\">{}</td>\
         <td class=\"num\" data-r=\"{key}\" data-k=\"mean_ms\">{}</td>\
         <td class=\"num\" data-r=\"{key}\" data-k=\"p99_ms\">{}</td>",
        pct(r.and_then(|r| r.error_rate)),
        ms(r.and_then(|r| r.mean_ms)),
        p99(r),
    );
}

/// An SVG polyline of the requests per second of the series (the script redraws it).
fn sparkline(s: &DashboardStats) -> String {
    let (w, h) = (600.0, 60.0);
    let max = s.series.iter().map(|p| p.rps).fold(0.0_f64, f64::max).max(1.0);
    let n = route_stats::SERIES as f64;
    let start = n - s.series.len() as f64;
    let points: Vec<String> = s
        .series
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{:.1},{:.1}", (start + i as f64) / (n - 1.0) * w, h - p.rps / max * (h - 4.0) - 2.0))
        .collect();
    format!(
        "<svg id=\"spark\" viewBox=\"0 0 600 60\" preserveAspectRatio=\"none\" role=\"img\" aria-label=\"requests per second, last five minutes\"><polyline fill=\"none\" points=\"{}\"/></svg>",
        points.join(" ")
    )
}

fn route_plugins(r: &CompiledRoute, global: &[String]) -> String {
    let mut names: Vec<String> = global.to_vec();
    names.extend(r.plugins.iter().map(|p| format!("{} ({})", p.entry.name, p.priority)));
    if names.is_empty() {
        return "<span class=\"dim\">none</span>".into();
    }
    names.iter().map(|n| escape(n)).collect::<Vec<_>>().join(", ")
}

/// The page.
pub fn page(gw: &Gateway) -> HttpResponse {
    let snap = gw.resources.load();
    let stats = route_stats::stats();
    let status = gw.provider_status.lock().clone();
    let mut out = String::with_capacity(32 * 1024);
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Weir dashboard</title>\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><style>{CSS}</style></head><body>\
         <header><h1>Weir</h1><span class=\"dim\">version {} · up {} s · {}</span></header><main>",
        env!("CARGO_PKG_VERSION"),
        gw.started.elapsed().as_secs(),
        escape(&snap.summary())
    );

    // Provider.
    let _ = write!(
        out,
        "<section id=\"provider\"><h2>Configuration</h2><table class=\"kv\">\
         <tr><th>provider</th><td>{}</td></tr><tr><th>connected</th><td class=\"{}\">{}</td></tr>\
         <tr><th>revision</th><td>{}</td></tr><tr><th>last load error</th><td id=\"last-error\" class=\"{}\">{}</td></tr>\
         <tr><th>skipped keys</th><td>{}</td></tr></table></section>",
        escape(status.provider),
        if status.connected { "ok" } else { "bad" },
        status.connected,
        status.revision.map_or_else(|| "–".to_owned(), |r| r.to_string()),
        if status.last_error.is_some() { "bad" } else { "" },
        status.last_error.as_deref().map_or_else(|| "none".to_owned(), escape),
        if status.skipped.is_empty() { "none".to_owned() } else { escape(&status.skipped.join(", ")) },
    );

    // Traffic.
    let _ = write!(
        out,
        "<section id=\"traffic\"><h2>Traffic <span class=\"dim\" id=\"window\">(last {:.0} s)</span></h2>\
         <table><tr><th></th><th>req/s</th><th>5xx</th><th>mean</th><th>p99</th></tr><tr><th>all routes</th>",
        stats.window_seconds
    );
    number_cells(&mut out, "*", Some(&stats.total));
    let _ = write!(
        out,
        "</tr></table>{}<p class=\"dim\">requests per second, last five minutes</p></section>",
        sparkline(&stats)
    );

    // Routes.
    let global: Vec<String> =
        snap.global_chain.iter().map(|p| format!("{} ({}, global)", p.entry.name, p.priority)).collect();
    let by_id: std::collections::HashMap<&str, &Rates> = stats.routes.iter().map(|r| (r.id.as_str(), r)).collect();
    let all = snap.table.routes();
    let mut routes: Vec<&std::sync::Arc<CompiledRoute>> = all.iter().collect();
    // Busiest first; a stable sort keeps definition order among equals.
    routes.sort_by(|a, b| {
        let ra = by_id.get(&*a.id).map_or(0, |r| r.requests);
        let rb = by_id.get(&*b.id).map_or(0, |r| r.requests);
        rb.cmp(&ra)
    });
    let _ = write!(
        out,
        "<section id=\"routes\"><h2>Routes <span class=\"dim\">({} loaded{})</span></h2><table id=\"route-table\">\
         <tr><th>id</th><th>uri</th><th>methods</th><th>hosts</th><th>plugins (priority)</th><th>upstream</th>\
         <th>req/s</th><th>5xx</th><th>mean</th><th>p99</th></tr>",
        all.len(),
        if all.len() > MAX_ROUTES {
            format!(", the {MAX_ROUTES} busiest shown; GET /v1/routes lists all")
        } else {
            String::new()
        }
    );
    for r in routes.iter().take(MAX_ROUTES) {
        let methods: Vec<String> = r.route.methods().unwrap_or(&[]).iter().map(|m| format!("{m:?}")).collect();
        let hosts: Vec<&str> = r.host_names.iter().map(|h| &**h).collect();
        let upstream = match &r.upstream {
            Some(u) => format!("{}/{} ({} nodes)", u.owner.0, u.owner.1, u.nodes.len()),
            None => "none".into(),
        };
        let _ = write!(
            out,
            "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            if r.route.status == 1 { "" } else { "disabled" },
            match r.route.more.as_ref().and_then(|m| m.name.as_deref()) {
                Some(name) => format!("{} <span class=\"dim\">{}</span>", escape(&r.id), escape(name)),
                None => escape(&r.id),
            },
            escape(&r.route.uri_list().join(" ")),
            if methods.is_empty() { "any".to_owned() } else { methods.join(" ") },
            if hosts.is_empty() { "any".to_owned() } else { escape(&hosts.join(" ")) },
            route_plugins(r, &global),
            escape(&upstream),
        );
        number_cells(&mut out, &r.id, by_id.get(&*r.id).copied());
        out.push_str("</tr>");
    }
    if let Some(r) = by_id.get(route_stats::NO_ROUTE) {
        out.push_str("<tr class=\"dim\"><td colspan=\"6\">requests no route took (the 404s)</td>");
        number_cells(&mut out, route_stats::NO_ROUTE, Some(r));
        out.push_str("</tr>");
    }
    out.push_str("</table></section>");

    // Upstreams.
    let _ = write!(
        out,
        "<section id=\"upstreams\"><h2>Upstreams <span class=\"dim\">({})</span></h2><table id=\"upstream-table\">\
         <tr><th>owner</th><th>balancer</th><th>checks</th><th>nodes (weight, health)</th></tr>",
        snap.compiled_upstreams.len()
    );
    for u in snap.compiled_upstreams.iter().take(MAX_UPSTREAMS) {
        let entry = u.checker.get().map(|c| c.entry());
        let nodes: Vec<String> = u
            .nodes
            .iter()
            .map(|n| {
                let health = super::explain::node_health(entry.as_ref(), n.addr);
                format!("<span class=\"node {health}\">{} ({}, {health})</span>", escape(&n.addr.to_string()), n.weight)
            })
            .collect();
        let checks = match (entry.is_some(), u.conf.checks.is_some()) {
            (true, _) => "running",
            (false, true) => "starts with the first request",
            (false, false) => "none",
        };
        let _ = write!(
            out,
            "<tr><td>{}/{}</td><td>{}</td><td>{checks}</td><td>{}</td></tr>",
            escape(u.owner.0),
            escape(&u.owner.1),
            u.balancer_name(),
            nodes.join(" ")
        );
    }
    out.push_str("</table></section>");

    // Stream routes.
    if !snap.stream_routes.is_empty() {
        out.push_str("<section id=\"stream\"><h2>Stream routes</h2><table><tr><th>id</th><th>server</th><th>remote_addr</th><th>sni</th><th>upstream</th></tr>");
        for r in &snap.stream_routes {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}:{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&r.id.0),
                escape(r.server_addr.as_deref().unwrap_or("*")),
                r.server_port.map_or_else(|| "*".to_owned(), |p| p.to_string()),
                escape(r.remote_addr.as_deref().unwrap_or("any")),
                escape(r.sni.as_deref().unwrap_or("any")),
                escape(&r.upstream_id.as_ref().map_or_else(|| "inline".to_owned(), |u| format!("upstreams/{}", u.0))),
            );
        }
        out.push_str("</table></section>");
    }

    // Explain form: a plain form post (answered as a page without JavaScript), or in place.
    out.push_str(
        "<section id=\"explain\"><h2>Explain a request</h2>\
         <form id=\"explain-form\" method=\"post\" action=\"/v1/explain\">\
         <label>method <select name=\"method\"><option>GET</option><option>POST</option><option>PUT</option><option>DELETE</option><option>PATCH</option><option>HEAD</option><option>OPTIONS</option></select></label>\
         <label>uri <input name=\"uri\" value=\"/\" required size=\"40\"></label>\
         <label>host <input name=\"host\" size=\"24\"></label>\
         <label>client_ip <input name=\"client_ip\" value=\"127.0.0.1\" size=\"16\"></label>\
         <label class=\"wide\">headers (one <code>name: value</code> a line)<textarea name=\"headers\" rows=\"3\"></textarea></label>\
         <button type=\"submit\">Explain</button></form><div id=\"explain-out\"></div></section>",
    );
    let _ = write!(out, "</main><script>{JS}</script></body></html>");
    HttpResponse::Ok()
        .insert_header((CONTENT_TYPE, "text/html; charset=utf-8"))
        .insert_header((CACHE_CONTROL, "no-store"))
        .body(out)
}

/// The explanation as a page (the form posted without JavaScript).
pub fn explanation_page(e: &Explanation) -> HttpResponse {
    let json = serde_json::to_string_pretty(e).unwrap_or_default();
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Weir: explain</title><style>{CSS}</style></head><body>\
         <header><h1>Weir</h1><a href=\"/v1/dashboard\">back to the dashboard</a></header><main><section>\
         <h2>Explanation</h2><p class=\"verdict\">{}</p><pre>{}</pre></section></main></body></html>",
        escape(&e.verdict.summary),
        escape(&json)
    );
    HttpResponse::Ok().insert_header((CONTENT_TYPE, "text/html; charset=utf-8")).body(body)
}

/// A form post of the dashboard (`application/x-www-form-urlencoded`) as the JSON body
/// `POST /v1/explain` takes: `headers` is one `name: value` a line.
pub fn form_to_json(body: &[u8]) -> Result<Vec<u8>, String> {
    let mut doc = serde_json::Map::new();
    let mut headers = serde_json::Map::new();
    for (k, v) in form_urlencoded::parse(body) {
        let v = v.trim();
        match &*k {
            "method" | "uri" | "host" | "client_ip" if !v.is_empty() => {
                doc.insert(k.into_owned(), serde_json::Value::String(v.to_owned()));
            }
            "method" | "uri" | "host" | "client_ip" => {}
            "headers" => {
                for line in v.lines().map(str::trim).filter(|l| !l.is_empty()) {
                    let Some((name, value)) = line.split_once(':') else {
                        return Err(format!("headers: `{line}` is not `name: value`"));
                    };
                    headers.insert(name.trim().to_owned(), serde_json::Value::String(value.trim().to_owned()));
                }
            }
            other => return Err(format!("unknown form field `{other}`")),
        }
    }
    if !headers.is_empty() {
        doc.insert("headers".into(), serde_json::Value::Object(headers));
    }
    serde_json::to_vec(&doc).map_err(|e| e.to_string())
}
