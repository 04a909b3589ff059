//! A real HTTP/1.1 upstream for proxy tests: keep-alive, Content-Length and chunked request
//! bodies, and behaviours chosen by path:
//! - `/status/<code>`: that status
//! - `/sleep/<ms>`: answer after a delay
//! - `/bytes/<n>`: n bytes of body, streamed in 64 KiB writes
//! - `/upload`: reads the body without keeping it, answers its length
//! - `/cache/...`: a cacheable answer `hit <n> <METHOD> <target>` (n: this upstream's request
//!   count) whose headers the query chooses: `cc` (Cache-Control), `expires`, `vary`, `etag`
//!   (percent-decoded), `cookie=1` (a Set-Cookie), `status`, `sleep` (ms before answering),
//!   `len` (a body of that many bytes instead)
//! - anything else: JSON echo `{node, method, path, query, headers, body_len}`
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A running upstream; stops accepting when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    pub name: String,
    pub hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    pub fn start(name: &str) -> Upstream {
        Self::start_on("127.0.0.1:0", name)
    }

    pub fn start_on(bind: &str, name: &str) -> Upstream {
        let listener = TcpListener::bind(bind).expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, st, n) = (hits.clone(), stop.clone(), name.to_owned());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (h, n) = (h.clone(), n.clone());
                std::thread::spawn(move || serve(conn, &n, &h));
            }
        });
        Upstream { addr, name: name.to_owned(), hits, stop }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub fn node(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

/// Reads one HTTP/1.1 request head: the request line (without CRLF) and the header fields
/// (names lowercased). `None` at the end of the connection.
pub fn read_head(reader: &mut impl BufRead) -> Option<(String, Vec<(String, String)>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return None;
    }
    let mut headers: Vec<(String, String)> = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            return Some((line.trim_end().to_owned(), headers));
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
}

fn serve(conn: TcpStream, name: &str, hits: &AtomicUsize) {
    let _ = conn.set_nodelay(true);
    let mut reader = BufReader::new(conn.try_clone().expect("clone upstream conn"));
    let mut writer = conn;
    loop {
        let Some((line, headers)) = read_head(&mut reader) else { return };
        let mut parts = line.splitn(3, ' ');
        let method = parts.next().unwrap_or("").to_owned();
        let target = parts.next().unwrap_or("/").to_owned();
        hits.fetch_add(1, Ordering::SeqCst);
        let header = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        let mut body_len: u64 = 0;
        let mut body = Vec::new();
        let keep_body = !target.starts_with("/upload");
        if let Some(n) = header("content-length").and_then(|v| v.parse::<u64>().ok()) {
            let mut remaining = n;
            let mut buf = vec![0u8; 64 * 1024];
            while remaining > 0 {
                let want = remaining.min(buf.len() as u64) as usize;
                let got = match reader.read(&mut buf[..want]) {
                    Ok(0) | Err(_) => return,
                    Ok(g) => g,
                };
                if keep_body {
                    body.extend_from_slice(&buf[..got]);
                }
                remaining -= got as u64;
                body_len += got as u64;
            }
        } else if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            loop {
                let mut size_line = String::new();
                if reader.read_line(&mut size_line).unwrap_or(0) == 0 {
                    return;
                }
                let size = usize::from_str_radix(size_line.trim().split(';').next().unwrap_or("0"), 16).unwrap_or(0);
                let mut chunk = vec![0u8; size + 2];
                if reader.read_exact(&mut chunk).is_err() {
                    return;
                }
                if size == 0 {
                    break;
                }
                body_len += size as u64;
                if keep_body {
                    body.extend_from_slice(&chunk[..size]);
                }
            }
        }
        let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        // A response to HEAD has the GET's headers and no body (RFC 9110): bytes after the head
        // would be read as the next response on this connection.
        let head_only = method == "HEAD";
        let (path, query) = target
            .split_once('?')
            .map(|(p, q)| (p.to_owned(), q.to_owned()))
            .unwrap_or((target.clone(), String::new()));
        let ok = if let Some(code) = path.strip_prefix("/status/") {
            let code: u16 = code.parse().unwrap_or(500);
            respond(&mut writer, head_only, code, "text/plain", format!("status {code} from {name}").as_bytes(), close)
        } else if let Some(ms) = path.strip_prefix("/sleep/") {
            std::thread::sleep(Duration::from_millis(ms.parse().unwrap_or(0)));
            respond(&mut writer, head_only, 200, "text/plain", format!("slept on {name}").as_bytes(), close)
        } else if let Some(n) = path.strip_prefix("/bytes/") {
            let n: u64 = n.parse().unwrap_or(0);
            stream_bytes(&mut writer, n, close)
        } else if path.starts_with("/cache/") {
            cacheable(&mut writer, &method, &target, &query, hits.load(Ordering::SeqCst), close)
        } else if path.starts_with("/upload") {
            respond(&mut writer, head_only, 200, "text/plain", body_len.to_string().as_bytes(), close)
        } else {
            let echo = serde_json::json!({
                "node": name,
                "method": method,
                "path": path,
                "query": query,
                "headers": headers.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
                "body_len": body_len,
                "body": String::from_utf8_lossy(&body),
            });
            respond(&mut writer, head_only, 200, "application/json", echo.to_string().as_bytes(), close)
        };
        if !ok || close {
            return;
        }
    }
}

/// Percent-decodes a query value (`+` stays as it is).
pub fn pct_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex =
            b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(c)) => {
                out.push(c);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn cacheable(w: &mut TcpStream, method: &str, target: &str, query: &str, n: usize, close: bool) -> bool {
    let arg = |name: &str| {
        query.split('&').find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == name).map(|(_, v)| pct_decode(v)))
    };
    if let Some(ms) = arg("sleep").and_then(|v| v.parse().ok()) {
        std::thread::sleep(Duration::from_millis(ms));
    }
    let code: u16 = arg("status").and_then(|v| v.parse().ok()).unwrap_or(200);
    let body = match arg("len").and_then(|v| v.parse::<usize>().ok()) {
        Some(len) => vec![b'x'; len],
        None => format!("hit {n} {method} {target}").into_bytes(),
    };
    let mut head = format!("HTTP/1.1 {code} X\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n", body.len());
    for (name, header) in [("cc", "Cache-Control"), ("expires", "Expires"), ("vary", "Vary"), ("etag", "ETag")] {
        if let Some(v) = arg(name) {
            head.push_str(&format!("{header}: {v}\r\n"));
        }
    }
    if arg("cookie").is_some() {
        head.push_str("Set-Cookie: session=secret\r\n");
    }
    head.push_str(&format!(
        "X-Upstream-Count: {n}\r\nConnection: {}\r\n\r\n",
        if close { "close" } else { "keep-alive" }
    ));
    let body = if method == "HEAD" { &[][..] } else { &body[..] };
    w.write_all(head.as_bytes()).is_ok() && w.write_all(body).is_ok()
}

fn respond(w: &mut TcpStream, head_only: bool, code: u16, ctype: &str, body: &[u8], close: bool) -> bool {
    let head = format!(
        "HTTP/1.1 {code} X\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nX-Upstream-Hop: drop-me\r\nConnection: {}\r\n\r\n",
        body.len(),
        if close { "close" } else { "keep-alive, x-upstream-hop" }
    );
    w.write_all(head.as_bytes()).is_ok() && (head_only || w.write_all(body).is_ok())
}

fn stream_bytes(w: &mut TcpStream, n: u64, close: bool) -> bool {
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {n}\r\nConnection: {}\r\n\r\n",
        if close { "close" } else { "keep-alive" }
    );
    if w.write_all(head.as_bytes()).is_err() {
        return false;
    }
    let chunk = vec![b'x'; 64 * 1024];
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len() as u64) as usize;
        if w.write_all(&chunk[..k]).is_err() {
            return false;
        }
        left -= k as u64;
    }
    true
}
