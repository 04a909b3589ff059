//! The pieces of a `Location` that do not come from the configuration: the host the client
//! asked for (validated, so that a forged `Host` cannot put a path or a user into the target),
//! and nginx's URI escaping for `encode_uri`.

use std::fmt::Write as _;

use weir_plugin::RequestCtx;

/// The request's host as nginx's `$host` has it (lower case, without the port), from the
/// `Host` header (HTTP/2's `:authority` arrives as one); without one, the local address. `None`
/// when the header is not a host name or an IP literal (`evil.com/x`, `a@b`, spaces).
pub fn host(ctx: &RequestCtx) -> Option<String> {
    let Some(raw) = ctx.headers.get(weir_plugin::http::header::HOST) else {
        return Some(match ctx.local_addr.ip() {
            std::net::IpAddr::V6(a) => format!("[{a}]"),
            a => a.to_string(),
        });
    };
    let raw = raw.to_str().ok()?;
    let name = if raw.starts_with('[') {
        let end = raw.find(']')?;
        let (literal, rest) = raw.split_at(end + 1);
        literal[1..literal.len() - 1].parse::<std::net::Ipv6Addr>().ok()?;
        port_ok(rest)?;
        literal
    } else {
        let (name, rest) = raw.split_at(raw.find(':').unwrap_or(raw.len()));
        port_ok(rest)?;
        name
    };
    let valid = !name.is_empty()
        && (name.starts_with('[')
            || name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_'));
    valid.then(|| name.to_ascii_lowercase())
}

/// `""` or `:digits`.
fn port_ok(rest: &str) -> Option<()> {
    match rest.strip_prefix(':') {
        None if rest.is_empty() => Some(()),
        Some(p) if p.bytes().all(|b| b.is_ascii_digit()) => Some(()),
        _ => None,
    }
}

/// Whether nginx's `ngx_escape_uri` (`NGX_ESCAPE_URI`) escapes byte `b`: controls, space, `#`,
/// `%`, `?`, DEL and every non-ASCII byte.
fn escaped(b: u8) -> bool {
    b <= 0x20 || b >= 0x7f || matches!(b, b'#' | b'%' | b'?')
}

/// `uri` with the bytes nginx's URI escaping escapes written `%XX` (upper-case hex), as
/// APISIX's `encode_uri` does: `%` itself is escaped, so an already escaped URI is escaped again.
pub fn escape_uri(uri: &str) -> String {
    let mut out = String::with_capacity(uri.len() + 8);
    for &b in uri.as_bytes() {
        if escaped(b) {
            let _ = write!(out, "%{b:02X}");
        } else {
            out.push(char::from(b));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin::testing::TestRequest;

    fn host_of(h: &str) -> Option<String> {
        host(&TestRequest::get("/").header("host", h).build())
    }

    #[test]
    fn hosts_as_nginx_has_them() {
        assert_eq!(host_of("Example.COM:8080").as_deref(), Some("example.com"));
        assert_eq!(host_of("127.0.0.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(host_of("[::1]:9080").as_deref(), Some("[::1]"));
        assert_eq!(host(&TestRequest::get("/").build()).as_deref(), Some("127.0.0.1"), "no Host: the local address");
        for forged in ["evil.com/x", "a@b", "a b", "x:80:81", "x:8o", "[::1", "[nope]", ":80", ""] {
            assert_eq!(host_of(forged), None, "{forged}");
        }
    }

    #[test]
    fn escaping_is_nginx_s() {
        assert_eq!(escape_uri("/a b/ü?x#%"), "/a%20b/%C3%BC%3Fx%23%25");
        assert_eq!(escape_uri("/plain/path-._~:@!$&'()*+,;="), "/plain/path-._~:@!$&'()*+,;=");
    }
}
