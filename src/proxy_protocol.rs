//! The PROXY protocol (HAProxy's, versions 1 and 2): reading the header a load balancer puts in
//! front of a connection on the listeners that enable it (`gateway.proxy_protocol`), and writing
//! a version 1 header to stream upstreams (`enable_tcp_pp_to_upstream`).
//!
//! The header is taken off the socket before anything else reads it: peeked until complete, then
//! consumed exactly, so the bytes after it stay in the socket for the HTTP, TLS or stream code.
//! A connection on such a listener without a valid header is closed: accepting it would let any
//! client that reaches the port directly claim to be anyone. `LOCAL` (v2) and `UNKNOWN` (v1)
//! headers keep the connection's own addresses, as the specification says.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Version 2's signature.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// A version 1 line is at most 107 bytes, CRLF included.
const V1_MAX: usize = 107;
/// Version 2 headers larger than this (addresses plus TLVs) are refused.
const V2_MAX: usize = 16 + 2048;

/// A parsed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Its length in bytes (what to consume).
    pub len: usize,
    /// The client and the address it connected to; `None` for `LOCAL` / `UNKNOWN`.
    pub addrs: Option<(SocketAddr, SocketAddr)>,
}

/// `Ok(None)`: more bytes are needed.
pub fn parse(buf: &[u8]) -> Result<Option<Header>, String> {
    if buf.len() < 6 {
        return if b"PROXY ".starts_with(buf) || V2_SIGNATURE.starts_with(buf) {
            Ok(None)
        } else {
            Err("no PROXY protocol header".into())
        };
    }
    if buf.starts_with(b"PROXY ") {
        return parse_v1(buf);
    }
    let n = buf.len().min(V2_SIGNATURE.len());
    if buf[..n] != V2_SIGNATURE[..n] {
        return Err("no PROXY protocol header".into());
    }
    parse_v2(buf)
}

fn parse_v1(buf: &[u8]) -> Result<Option<Header>, String> {
    let Some(end) = buf.windows(2).take(V1_MAX - 1).position(|w| w == b"\r\n") else {
        return if buf.len() >= V1_MAX { Err("PROXY v1 line longer than 107 bytes".into()) } else { Ok(None) };
    };
    let line = std::str::from_utf8(&buf[6..end]).map_err(|_| "PROXY v1 line is not ASCII".to_owned())?;
    let len = end + 2;
    let mut parts = line.split(' ');
    let family = parts.next().unwrap_or("");
    if family == "UNKNOWN" {
        return Ok(Some(Header { len, addrs: None }));
    }
    let fields: Vec<&str> = parts.collect();
    let [src, dst, sport, dport] = fields[..] else {
        return Err(format!("PROXY v1: expected 4 fields after {family}, got {}", fields.len()));
    };
    let ip = |s: &str| -> Result<IpAddr, String> {
        let ip: IpAddr = s.parse().map_err(|_| format!("PROXY v1: `{s}` is not an IP address"))?;
        match (family, ip) {
            ("TCP4", IpAddr::V4(_)) | ("TCP6", IpAddr::V6(_)) => Ok(ip),
            ("TCP4" | "TCP6", _) => Err(format!("PROXY v1: `{s}` is not a {family} address")),
            _ => Err(format!("PROXY v1: unknown protocol `{family}`")),
        }
    };
    let port = |s: &str| -> Result<u16, String> {
        // Decimal without a sign or leading zeros, as the specification writes it.
        if s.is_empty() || s.len() > 5 || (s.len() > 1 && s.starts_with('0')) || !s.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(format!("PROXY v1: `{s}` is not a port"));
        }
        s.parse().map_err(|_| format!("PROXY v1: `{s}` is not a port"))
    };
    let source = SocketAddr::new(ip(src)?, port(sport)?);
    let dest = SocketAddr::new(ip(dst)?, port(dport)?);
    Ok(Some(Header { len, addrs: Some((source, dest)) }))
}

fn parse_v2(buf: &[u8]) -> Result<Option<Header>, String> {
    if buf.len() < 16 {
        return Ok(None);
    }
    let (ver_cmd, family) = (buf[12], buf[13]);
    if ver_cmd >> 4 != 2 {
        return Err(format!("PROXY v2: version {} is not 2", ver_cmd >> 4));
    }
    let len = 16 + usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if len > V2_MAX {
        return Err(format!("PROXY v2: a {len}-byte header is more than {V2_MAX}"));
    }
    if buf.len() < len {
        return Ok(None);
    }
    let body = &buf[16..len];
    match ver_cmd & 0x0f {
        // LOCAL: a health check of the balancer itself; the connection's own addresses stand.
        0 => return Ok(Some(Header { len, addrs: None })),
        1 => {}
        c => return Err(format!("PROXY v2: unknown command {c}")),
    }
    let port = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
    let addrs = match family >> 4 {
        // AF_INET
        1 => {
            let a = body.get(..12).ok_or("PROXY v2: short IPv4 address block")?;
            let ip = |b: &[u8]| IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]));
            Some((SocketAddr::new(ip(&a[0..4]), port(&a[8..10])), SocketAddr::new(ip(&a[4..8]), port(&a[10..12]))))
        }
        // AF_INET6
        2 => {
            let a = body.get(..36).ok_or("PROXY v2: short IPv6 address block")?;
            let ip = |b: &[u8]| {
                let mut o = [0u8; 16];
                o.copy_from_slice(b);
                IpAddr::V6(Ipv6Addr::from(o))
            };
            Some((SocketAddr::new(ip(&a[0..16]), port(&a[32..34])), SocketAddr::new(ip(&a[16..32]), port(&a[34..36]))))
        }
        // AF_UNSPEC, AF_UNIX: no address Weir can use; the connection's own stands.
        0 | 3 => None,
        f => return Err(format!("PROXY v2: unknown address family {f}")),
    };
    Ok(Some(Header { len, addrs }))
}

/// Reads the header off `stream`: the client and destination addresses it names (`None` for a
/// `LOCAL`/`UNKNOWN` header). Errors say why the connection must be closed.
pub async fn read(stream: &mut TcpStream) -> Result<Option<(SocketAddr, SocketAddr)>, String> {
    let mut buf = vec![0u8; V1_MAX.max(232)];
    let mut wait = Duration::from_millis(1);
    loop {
        let n = stream.peek(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before a PROXY header".into());
        }
        match parse(&buf[..n])? {
            Some(h) => {
                let mut take = vec![0u8; h.len];
                stream.read_exact(&mut take).await.map_err(|e| e.to_string())?;
                return Ok(h.addrs);
            }
            None => {
                // A v2 header with long TLVs: make room for all of it.
                if n == buf.len() && buf.len() < V2_MAX {
                    buf.resize(V2_MAX, 0);
                    continue;
                }
                // Part of the header so far: wait for the rest (bounded by the caller). The
                // socket stays readable while bytes are queued, so waits grow instead of spinning.
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(100));
            }
        }
    }
}

/// The version 1 header announcing `client` connected to `dest` (the stream proxy sends it to
/// upstreams that expect one).
pub fn v1_header(client: SocketAddr, dest: SocketAddr) -> String {
    // Both addresses of one family: an IPv4 client on an IPv6 listener is written mapped.
    let (c, d) = match (client.ip(), dest.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => (client.ip(), dest.ip()),
        (IpAddr::V4(c), IpAddr::V6(_)) => (IpAddr::V6(c.to_ipv6_mapped()), dest.ip()),
        (IpAddr::V6(_), IpAddr::V4(d)) => (client.ip(), IpAddr::V6(d.to_ipv6_mapped())),
    };
    let family = if c.is_ipv4() { "TCP4" } else { "TCP6" };
    format!("PROXY {family} {c} {d} {} {}\r\n", client.port(), dest.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn version_1_lines() {
        let h = parse(b"PROXY TCP4 203.0.113.7 10.0.0.1 56324 443\r\nGET / HTTP/1.1\r\n").expect("valid");
        assert_eq!(h, Some(Header { len: 43, addrs: Some((sa("203.0.113.7:56324"), sa("10.0.0.1:443"))) }));
        let h = parse(b"PROXY TCP6 2001:db8::1 ::1 1 2\r\n").expect("valid").expect("complete");
        assert_eq!(h.addrs, Some((sa("[2001:db8::1]:1"), sa("[::1]:2"))));
        assert_eq!(parse(b"PROXY UNKNOWN\r\n").expect("valid"), Some(Header { len: 15, addrs: None }));
        assert_eq!(parse(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2").expect("incomplete"), None);
        assert_eq!(parse(b"PRO").expect("incomplete"), None);
        for bad in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
            b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n",
            b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let long = [b"PROXY TCP4 ".as_slice(), &[b'1'; 120]].concat();
        assert!(parse(&long).is_err(), "no CRLF within 107 bytes");
    }

    fn v2(cmd: u8, family: u8, body: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | cmd);
        h.push(family);
        h.extend_from_slice(&(body.len() as u16).to_be_bytes());
        h.extend_from_slice(body);
        h
    }

    #[test]
    fn version_2_blocks() {
        let mut body = vec![203, 0, 113, 7, 10, 0, 0, 1];
        body.extend_from_slice(&56324u16.to_be_bytes());
        body.extend_from_slice(&443u16.to_be_bytes());
        body.extend_from_slice(&[0x04, 0, 3, b'a', b'b', b'c']); // a TLV, ignored
        let h = v2(1, 0x11, &body);
        let parsed = parse(&h).expect("valid").expect("complete");
        assert_eq!(parsed.len, h.len());
        assert_eq!(parsed.addrs, Some((sa("203.0.113.7:56324"), sa("10.0.0.1:443"))));
        assert_eq!(parse(&h[..20]).expect("incomplete"), None);
        let mut six = vec![0u8; 36];
        six[15] = 1;
        six[31] = 1;
        six[32..34].copy_from_slice(&7u16.to_be_bytes());
        let parsed = parse(&v2(1, 0x21, &six)).expect("valid").expect("complete");
        assert_eq!(parsed.addrs.map(|a| a.0), Some(sa("[::1]:7")));
        assert_eq!(parse(&v2(0, 0x00, &[])).expect("LOCAL").map(|h| h.addrs), Some(None));
        assert!(parse(&v2(1, 0x11, &[1, 2, 3])).is_err(), "short address block");
        assert!(parse(&v2(2, 0x11, &body)).is_err(), "unknown command");
        let mut wrong_version = v2(1, 0x11, &body);
        wrong_version[12] = 0x11;
        assert!(parse(&wrong_version).is_err());
        let mut huge = v2(1, 0x11, &body);
        huge[14..16].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(parse(&huge).is_err(), "bounded");
    }

    #[test]
    fn version_1_written_for_upstreams() {
        assert_eq!(v1_header(sa("1.2.3.4:5"), sa("6.7.8.9:10")), "PROXY TCP4 1.2.3.4 6.7.8.9 5 10\r\n");
        assert_eq!(v1_header(sa("1.2.3.4:5"), sa("[::1]:10")), "PROXY TCP6 ::ffff:1.2.3.4 ::1 5 10\r\n");
        let line = v1_header(sa("[2001:db8::1]:5"), sa("[::1]:10"));
        assert_eq!(
            parse(line.as_bytes()).expect("valid").and_then(|h| h.addrs).map(|a| a.0),
            Some(sa("[2001:db8::1]:5"))
        );
    }
}
