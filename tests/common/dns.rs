//! A small authoritative DNS server on a loopback UDP port, for tests of upstreams whose names
//! resolve: A, AAAA and SRV records with a TTL, answers the test changes while traffic flows,
//! and names made to fail (SERVFAIL) or to vanish (NXDOMAIN).
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One record.
#[derive(Clone, Debug)]
pub enum Record {
    Ip(IpAddr),
    Srv { priority: u16, weight: u16, port: u16, target: String },
}

#[derive(Default)]
struct Zone {
    records: HashMap<String, Vec<Record>>,
    failing: Vec<String>,
    ttl: u32,
}

/// The running server; stops when dropped.
pub struct DnsServer {
    pub addr: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    /// Queries answered so far.
    pub queries: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl DnsServer {
    /// A server on 127.0.0.1 (a free port) whose answers carry `ttl` seconds.
    pub fn start(ttl: u32) -> DnsServer {
        // Port 0: the kernel picks a free UDP port. `free_port` finds a free TCP port, and the UDP
        // port of that number may be taken (another test's socket): a bind failed so once.
        let socket = UdpSocket::bind(("127.0.0.1", 0)).expect("bind the DNS server");
        socket.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
        let addr = socket.local_addr().expect("addr");
        let zone = Arc::new(Mutex::new(Zone { ttl, ..Zone::default() }));
        let (queries, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (z, q, st) = (zone.clone(), queries.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !st.load(Ordering::SeqCst) {
                let Ok((n, peer)) = socket.recv_from(&mut buf) else { continue };
                let answer = {
                    let zone = z.lock().unwrap_or_else(|e| e.into_inner());
                    respond(&buf[..n], &zone)
                };
                if let Some(answer) = answer {
                    q.fetch_add(1, Ordering::SeqCst);
                    let _ = socket.send_to(&answer, peer);
                }
            }
        });
        DnsServer { addr, zone, queries, stop }
    }

    /// Sets the records of `name` (replacing what it had; none: the name does not exist).
    pub fn set(&self, name: &str, records: Vec<Record>) {
        let mut zone = self.zone.lock().unwrap_or_else(|e| e.into_inner());
        zone.failing.retain(|n| n != name);
        if records.is_empty() {
            zone.records.remove(name);
        } else {
            zone.records.insert(name.to_owned(), records);
        }
    }

    /// `name` answers SERVFAIL from now on (until `set` again).
    pub fn fail(&self, name: &str) {
        self.zone.lock().unwrap_or_else(|e| e.into_inner()).failing.push(name.to_owned());
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The A records of `ips`.
pub fn ips(ips: &[&str]) -> Vec<Record> {
    ips.iter().map(|ip| Record::Ip(ip.parse().expect("an IP"))).collect()
}

fn name_at(msg: &[u8], mut at: usize) -> Option<(String, usize)> {
    let mut labels = Vec::new();
    loop {
        let len = *msg.get(at)? as usize;
        at += 1;
        if len == 0 {
            return Some((labels.join(".").to_ascii_lowercase(), at));
        }
        labels.push(String::from_utf8_lossy(msg.get(at..at + len)?).into_owned());
        at += len;
    }
}

fn encode_name(out: &mut Vec<u8>, name: &str) {
    for label in name.trim_end_matches('.').split('.') {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
}

/// The answer to one query message (`None`: not a query we read).
fn respond(query: &[u8], zone: &Zone) -> Option<Vec<u8>> {
    if query.len() < 12 || u16::from_be_bytes([query[4], query[5]]) != 1 {
        return None;
    }
    let (name, end) = name_at(query, 12)?;
    let qtype = u16::from_be_bytes([*query.get(end)?, *query.get(end + 1)?]);
    let question = &query[12..end + 4];
    let (rcode, records): (u8, Vec<&Record>) = if zone.failing.contains(&name) {
        (2, Vec::new())
    } else {
        match zone.records.get(&name) {
            None => (3, Vec::new()),
            Some(all) => (
                0,
                all.iter()
                    .filter(|r| {
                        matches!(
                            (r, qtype),
                            (Record::Ip(IpAddr::V4(_)), 1) | (Record::Ip(IpAddr::V6(_)), 28) | (Record::Srv { .. }, 33)
                        )
                    })
                    .collect(),
            ),
        }
    };
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(&query[0..2]);
    // QR, opcode 0, AA, RD copied; RA; rcode.
    out.push(0x84 | (query[2] & 0x01));
    out.push(0x80 | rcode);
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&(records.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(question);
    for r in records {
        out.extend_from_slice(&[0xC0, 12]);
        let (rtype, rdata) = match r {
            Record::Ip(IpAddr::V4(ip)) => (1u16, ip.octets().to_vec()),
            Record::Ip(IpAddr::V6(ip)) => (28, ip.octets().to_vec()),
            Record::Srv { priority, weight, port, target } => {
                let mut d = Vec::new();
                d.extend_from_slice(&priority.to_be_bytes());
                d.extend_from_slice(&weight.to_be_bytes());
                d.extend_from_slice(&port.to_be_bytes());
                encode_name(&mut d, target);
                (33, d)
            }
        };
        out.extend_from_slice(&rtype.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&zone.ttl.to_be_bytes());
        out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(&rdata);
    }
    Some(out)
}
