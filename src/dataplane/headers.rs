//! Header handling of the proxy: hop-by-hop removal and `X-Forwarded-*`.

use http::header::{HeaderMap, HeaderName, HeaderValue};

use http::header::{CONNECTION, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE, TRAILER, TRANSFER_ENCODING, UPGRADE};

static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// Whether `name` is hop-by-hop (RFC 9110 §7.6.1), or `proxy-connection`, a non-standard one
/// clients still send.
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    [&CONNECTION, &KEEP_ALIVE, &PROXY_AUTHENTICATE, &PROXY_AUTHORIZATION, &TE, &TRAILER, &TRANSFER_ENCODING, &UPGRADE]
        .contains(&name)
        || *name == PROXY_CONNECTION
}

/// Removes hop-by-hop headers, including those named by `Connection`. One pass over the
/// headers when there is nothing to remove (the common case).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    let hop: Vec<HeaderName> = headers.keys().filter(|k| is_hop_by_hop(k)).cloned().collect();
    for n in hop {
        headers.remove(n);
    }
}

/// Sets `X-Forwarded-For` (appended), `X-Forwarded-Proto`, `X-Forwarded-Host`, `X-Forwarded-Port`
/// and `X-Real-IP`.
pub fn set_forwarded(headers: &mut HeaderMap, client_ip: &str, scheme: &str, host: Option<&HeaderValue>, port: u16) {
    let ip = HeaderValue::from_str(client_ip).ok();
    let xff = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(prev) if !prev.is_empty() => HeaderValue::from_str(&format!("{prev}, {client_ip}")).ok(),
        _ => ip.clone(),
    };
    if let Some(v) = xff {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
    if let Some(v) = ip {
        headers.insert(X_REAL_IP.clone(), v);
    }
    headers
        .insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(if scheme == "https" { "https" } else { "http" }));
    if let Some(h) = host {
        headers.insert(X_FORWARDED_HOST.clone(), h.clone());
    }
    headers.insert(X_FORWARDED_PORT.clone(), HeaderValue::from(port));
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
