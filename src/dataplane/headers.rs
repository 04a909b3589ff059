//! Header handling of the proxy: hop-by-hop removal, `X-Forwarded-*`, conversions between
//! actix's `http` 0.2 types and the `http` 1 types of hyper and the plugin SDK.

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether `name` is hop-by-hop (or `proxy-connection`, a non-standard one clients still send).
pub fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP.contains(&name) || name == "proxy-connection"
}

/// Removes hop-by-hop headers, including those named by `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in HOP_BY_HOP {
        headers.remove(n);
    }
    headers.remove("proxy-connection");
}

/// Client request headers as `http` 1 types (hop-by-hop ones dropped on the way).
pub fn from_actix(src: &actix_web::http::header::HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(src.len() + 5);
    let connection_named: Vec<String> = src
        .get_all(actix_web::http::header::CONNECTION)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .collect();
    for (k, v) in src.iter() {
        let name = k.as_str();
        if is_hop_by_hop(name) || connection_named.iter().any(|c| c == name) {
            continue;
        }
        if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_bytes(v.as_bytes())) {
            out.append(k, v);
        }
    }
    out
}

/// Sets `X-Forwarded-For` (appended), `X-Forwarded-Proto`, `X-Forwarded-Host`, `X-Forwarded-Port`
/// and `X-Real-IP`.
pub fn set_forwarded(headers: &mut HeaderMap, client_ip: &str, scheme: &str, host: Option<&HeaderValue>, port: u16) {
    let xff = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prev) if !prev.is_empty() => format!("{prev}, {client_ip}"),
        _ => client_ip.to_owned(),
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        headers.insert("x-forwarded-for", v);
    }
    if let Ok(v) = HeaderValue::from_str(client_ip) {
        headers.insert("x-real-ip", v);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static(if scheme == "https" { "https" } else { "http" }));
    if let Some(h) = host {
        headers.insert("x-forwarded-host", h.clone());
    }
    headers.insert("x-forwarded-port", HeaderValue::from(port));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_hop_by_hop_and_connection_named() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("keep-alive, x-secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-keep"));
    }

    #[test]
    fn forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
        set_forwarded(&mut h, "2.2.2.2", "http", Some(&HeaderValue::from_static("ex.com")), 9080);
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2");
        assert_eq!(h["x-real-ip"], "2.2.2.2");
        assert_eq!(h["x-forwarded-host"], "ex.com");
        assert_eq!(h["x-forwarded-port"], "9080");
    }
}
