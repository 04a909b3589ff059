//! Test harness: runs the real `weir` binary on free loopback ports in a scratch prefix directory,
//! and talks HTTP/1.1 to it over real sockets.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_weir");

/// A port nothing listens on right now (TCP and UDP), handed out once per test process.
///
/// Taken below Linux's ephemeral range (32768-60999): a port the kernel picked for `bind(0)`
/// can be picked again as the source port of any outgoing connection (curl, etcd clients, the
/// gateway's own upstream connections) before the test's server binds it, which made tests fail
/// now and then with "Address already in use". Each test binary starts at a different offset.
pub fn free_port() -> u16 {
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicUsize = AtomicUsize::new(usize::MAX);
    let start = (std::process::id() % 97) * 120;
    let _ = NEXT.compare_exchange(usize::MAX, start as usize, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..SPAN {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::SeqCst) as u32 % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// A scratch prefix directory with `conf/`.
pub struct Prefix {
    pub dir: PathBuf,
    pub node_port: u16,
    pub control_port: u16,
    /// The TLS listener (`gateway.ssl.listen`), unless the test configures `ssl:` itself.
    pub tls_port: u16,
    /// The Prometheus exporter (`plugin_attr.prometheus.export_addr`), unless the test
    /// configures `prometheus:` itself.
    pub metrics_port: u16,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl Prefix {
    /// A prefix whose config.yaml listens on free ports, plus `extra` YAML appended (top-level keys
    /// other than `gateway`), and `gateway_extra` lines appended under `gateway:`.
    pub fn new(gateway_extra: &str, extra: &str, resources: &str) -> Prefix {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("weir-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("conf")).expect("create conf dir");
        let (node_port, control_port, tls_port, metrics_port) = (free_port(), free_port(), free_port(), free_port());
        let p = Prefix { dir, node_port, control_port, tls_port, metrics_port };
        p.write_config(gateway_extra, extra);
        p.write_resources(resources);
        p
    }

    pub fn write_config(&self, gateway_extra: &str, extra: &str) {
        let ssl = if gateway_extra.contains("  ssl:") {
            String::new()
        } else {
            format!("  ssl:\n    listen: [{{ip: 127.0.0.1, port: {}}}]\n", self.tls_port)
        };
        // Every instance its own exporter port (the default, 9091, is one per machine).
        let exporter = format!("  prometheus:\n    export_addr: {{ip: 127.0.0.1, port: {}}}\n", self.metrics_port);
        let extra = if !cfg!(feature = "prometheus") || extra.contains("  prometheus:") {
            extra.to_owned()
        } else if extra.contains("plugin_attr:\n") {
            extra.replacen("plugin_attr:\n", &format!("plugin_attr:\n{exporter}"), 1)
        } else {
            format!("{extra}\nplugin_attr:\n{exporter}")
        };
        let text = format!(
            "gateway:\n  node_listen:\n    - {{ip: 127.0.0.1, port: {}}}\n  worker_processes: 1\n  control:\n    port: {}\n{ssl}{gateway_extra}\n{extra}\n",
            self.node_port, self.control_port
        );
        self.write("conf/config.yaml", &text);
    }

    /// Adds a cleartext HTTP/2 listener (prior knowledge, next to HTTP/1.1) to config.yaml; its
    /// port.
    pub fn add_h2c_listener(&self) -> u16 {
        let port = free_port();
        let config = std::fs::read_to_string(self.dir.join("conf/config.yaml")).expect("read config");
        let config = config.replacen(
            "  node_listen:\n",
            &format!("  node_listen:\n    - {{ip: 127.0.0.1, port: {port}, enable_http2: true}}\n"),
            1,
        );
        self.write("conf/config.yaml", &config);
        port
    }

    pub fn write_resources(&self, text: &str) {
        self.write("conf/resources.yaml", text);
    }

    /// Writes a file atomically (write + rename), as editors and deploy tools do.
    pub fn write(&self, rel: &str, text: &str) {
        let path = self.dir.join(rel);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write file");
        std::fs::rename(&tmp, &path).expect("rename file");
    }

    pub fn control(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.control_port))
    }

    pub fn node(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.node_port))
    }

    pub fn metrics(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.metrics_port))
    }

    pub fn tls(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.tls_port))
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("weir.log")
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A running gateway; killed on drop.
pub struct Weir {
    pub child: Child,
    pub log: PathBuf,
}

impl Weir {
    /// Starts `weir -p <prefix>` and waits until the control server answers.
    pub fn start(prefix: &Prefix) -> Weir {
        let weir = Self::spawn(prefix);
        weir.wait_ready(prefix.control());
        weir
    }

    /// Starts without waiting.
    pub fn spawn(prefix: &Prefix) -> Weir {
        Self::spawn_env(prefix, &[])
    }

    /// Starts with extra environment variables, without waiting.
    pub fn spawn_env(prefix: &Prefix, env: &[(&str, &str)]) -> Weir {
        let log = prefix.log_path();
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("open log file");
        let child = Command::new(BIN)
            .arg("-p")
            .arg(&prefix.dir)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(file.try_clone().expect("clone log handle"))
            .stderr(file)
            .spawn()
            .expect("spawn weir");
        Weir { child, log }
    }

    pub fn wait_ready(&self, addr: SocketAddr) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("weir did not listen on {addr}; log:\n{}", self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size of the process, from /proc.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").arg("-TERM").arg(self.pid().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                panic!("weir did not stop on SIGTERM; log:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Weir {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a gateway on `resources` (default config on free ports) and waits for both listeners.
pub fn start(resources: &str) -> (Prefix, Weir) {
    let p = Prefix::new("", "", resources);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    (p, w)
}

/// Runs `weir` with `args` to completion: (exit code, stdout + stderr).
pub fn run_weir(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).args(args).env("RUST_LOG", "info").output().expect("run weir");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// Starts weir expecting it to refuse to start: (exit code, output).
pub fn start_refused(prefix: &Prefix) -> (i32, String) {
    let p = prefix.dir.to_string_lossy().into_owned();
    run_weir(&["-p", &p])
}

/// An HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`).
pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).expect("set timeout");
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH") {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("write request head");
    s.write_all(body).expect("write request body");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap_or_else(|e| panic!("read response from {addr}: {e}"));
    parse_response(&raw)
}

pub fn get(addr: SocketAddr, path: &str) -> Response {
    request(addr, "GET", path, &[], b"")
}

pub fn parse_response(raw: &[u8]) -> Response {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of headers in response: {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))).collect();
    let rest = &raw[end + 4..];
    let chunked =
        headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked { dechunk(rest) } else { rest.to_vec() };
    Response { status, headers, body }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = data.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&data[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        data = &data[eol + 2..];
        if size == 0 || data.len() < size {
            break;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[(size + 2).min(data.len())..];
    }
    out
}

/// Polls `f` until it returns true or `timeout` passes.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

pub fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

pub mod dns;
pub mod pg;
pub mod pki;
pub mod redis;
pub mod upstream;
pub mod venv;
pub mod ws;

/// Uploads `n` bytes (Content-Length) in 64 KiB writes without holding them; returns the response.
pub fn upload(addr: SocketAddr, path: &str, n: u64) -> Response {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
    let head = format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {n}\r\n\r\n");
    s.write_all(head.as_bytes()).expect("write head");
    let chunk = vec![b'u'; 64 * 1024];
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..k]).expect("write body");
        left -= k as u64;
    }
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read response");
    parse_response(&raw)
}

/// Downloads `path`, counting body bytes without keeping them: (status, body length).
pub fn download_count(addr: SocketAddr, path: &str) -> (u16, u64) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).unwrap_or(0) == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let status = String::from_utf8_lossy(&head).split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n as u64,
        }
    }
    (status, total)
}

pub mod chromium;
pub mod etcd;
pub mod tls_client;
pub mod tls_upstream;

/// Reports a skipped test on the terminal (libtest captures `eprintln!` of passing tests; direct
/// writes to stderr are not captured).
pub fn skip(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// Reads one response with a `Content-Length` body (or none) from a keep-alive connection: its
/// status. `Err` when the connection ends or fails first.
pub fn read_one_response(conn: &mut impl std::io::Read) -> Result<u16, String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = conn.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return Ok(head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0));
            }
        }
    }
}
