//! Zero-downtime binary upgrade against the real `weir` binary: SIGUSR2 twice under keep-alive
//! load with a WebSocket held open; no request fails, the WebSocket keeps working on the process
//! that accepted it, and each old process exits once what it serves has ended.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::upstream::Upstream;
use common::ws::{runtime, ws_echo};
use common::*;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().and_then(|r| r.split_whitespace().next()) != Some("Z"))
        .unwrap_or(false)
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill").args([sig, &pid.to_string()]).status().is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

/// Kills the processes the upgrades started (not children of the test) when the test ends.
struct Reaper(Mutex<Vec<u32>>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in self.0.lock().map(|v| v.clone()).unwrap_or_default() {
            let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    }
}

/// The pid of the process started by the `n`th SIGUSR2 (1-based), from the log.
fn successor(log: &str, n: usize) -> Option<u32> {
    log.lines()
        .filter_map(|l| l.split("started the new process (").nth(1))
        .nth(n - 1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
}

/// One keep-alive client: requests `GET /load` in a loop until `stop`, reconnecting when an
/// answer says `Connection: close`; every failure is recorded.
fn load(addr: SocketAddr, stop: Arc<AtomicBool>, ok: Arc<AtomicUsize>, failures: Arc<Mutex<Vec<String>>>) {
    let mut conn: Option<BufReader<TcpStream>> = None;
    while !stop.load(Ordering::SeqCst) {
        let result = (|| -> Result<bool, String> {
            if conn.is_none() {
                let s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
                s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
                conn = Some(BufReader::new(s));
            }
            let c = conn.as_mut().ok_or("no connection")?;
            c.get_mut().write_all(b"GET /load HTTP/1.1\r\nHost: load\r\n\r\n").map_err(|e| format!("write: {e}"))?;
            let mut line = String::new();
            c.read_line(&mut line).map_err(|e| format!("read: {e}"))?;
            if !line.starts_with("HTTP/1.1 200") {
                return Err(format!("status line {line:?}"));
            }
            let (mut len, mut close) = (0usize, false);
            loop {
                let mut h = String::new();
                c.read_line(&mut h).map_err(|e| format!("read header: {e}"))?;
                let h = h.trim_end().to_ascii_lowercase();
                if h.is_empty() {
                    break;
                }
                if let Some(v) = h.strip_prefix("content-length:") {
                    len = v.trim().parse().map_err(|_| "bad length")?;
                }
                if h.starts_with("connection:") && h.contains("close") {
                    close = true;
                }
            }
            let mut body = vec![0u8; len];
            c.read_exact(&mut body).map_err(|e| format!("read body: {e}"))?;
            Ok(close)
        })();
        match result {
            Ok(close) => {
                ok.fetch_add(1, Ordering::SeqCst);
                if close {
                    conn = None;
                }
            }
            Err(e) => {
                if let Ok(mut f) = failures.lock() {
                    f.push(e);
                }
                conn = None;
            }
        }
    }
}

#[test]
fn two_upgrades_under_load_fail_no_request_and_keep_a_websocket() {
    let rt = runtime();
    let echo = ws_echo(&rt);
    let up = Upstream::start("u");
    let resources = format!(
        "routes:\n  - id: ws\n    uri: /ws/*\n    enable_websocket: true\n    upstream:\n      nodes:\n        \"{echo}\": 1\n  - id: load\n    uri: /load\n    upstream:\n      nodes:\n        \"{}\": 1\n",
        up.node()
    );
    let p = Prefix::new("  worker_shutdown_timeout: 20\n", "", &resources);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let reaper = Reaper(Mutex::new(Vec::new()));

    let url = format!("ws://{}/ws/echo", p.node());
    let (mut ws, _) = rt.block_on(tokio_tungstenite::connect_async(&url)).expect("WebSocket through weir");
    let echo_once = |ws: &mut Ws, text: &str| {
        rt.block_on(async {
            ws.send(Message::Text(text.into())).await.expect("send on the held WebSocket");
            let answer = tokio::time::timeout(Duration::from_secs(5), ws.next()).await;
            assert_eq!(answer.ok().flatten().and_then(|m| m.ok()), Some(Message::Text(text.into())), "{text}");
        })
    };
    echo_once(&mut ws, "before");

    let (stop, ok, failures) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)), Arc::default());
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, ok, failures) = (stop.clone(), ok.clone(), Arc::clone(&failures));
            let addr = p.node();
            std::thread::spawn(move || load(addr, stop, ok, failures))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));

    // First upgrade: the original process hands over and drains; the WebSocket stays on it.
    let first = w.pid();
    signal(first, "-USR2");
    let deadline = Instant::now() + Duration::from_secs(20);
    let second = loop {
        let log = w.log_text();
        if let Some(pid) = successor(&log, 1).filter(|_| log.contains(&format!("previous process ({first}) drains"))) {
            break pid;
        }
        assert!(Instant::now() < deadline, "the first upgrade did not complete; log:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    };
    reaper.0.lock().expect("reaper").push(second);
    std::thread::sleep(Duration::from_millis(1500));
    echo_once(&mut ws, "after one upgrade");
    assert!(alive(first), "the old process lives while its WebSocket does");

    // Second upgrade, from the new process.
    let served = ok.load(Ordering::SeqCst);
    signal(second, "-USR2");
    let deadline = Instant::now() + Duration::from_secs(20);
    let third = loop {
        let log = w.log_text();
        if let Some(pid) = successor(&log, 2).filter(|_| log.contains(&format!("previous process ({second}) drains"))) {
            break pid;
        }
        assert!(Instant::now() < deadline, "the second upgrade did not complete; log:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    };
    reaper.0.lock().expect("reaper").push(third);
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(second) {
        assert!(Instant::now() < deadline, "the second process did not exit; log:\n{}", w.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1000));
    echo_once(&mut ws, "after two upgrades");

    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.join();
    }
    let failures = failures.lock().map(|f| f.clone()).unwrap_or_default();
    let total = ok.load(Ordering::SeqCst);
    eprintln!("{total} requests during two upgrades, {} failed", failures.len());
    assert!(
        failures.is_empty(),
        "{} of {total} requests failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(total > served && served > 0, "load ran through both upgrades ({served} then {total})");

    // The WebSocket ends: the first process has nothing left and exits.
    let closed = Instant::now();
    rt.block_on(async {
        let _ = ws.close(None).await;
    });
    drop(ws);
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(first) {
        assert!(
            Instant::now() < deadline,
            "the first process did not exit after its WebSocket closed; log:\n{}",
            w.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("first process exited {:.2} s after its last WebSocket closed", closed.elapsed().as_secs_f64());
    // The newest process serves, fresh connections included.
    assert_eq!(get(p.node(), "/load").status, 200);
    signal(third, "-TERM");
    drop(w);
}
