//! UDP routes: one session per client address. The first datagram of a client picks the route
//! and the upstream node (`preread` runs then); the session keeps a socket connected to that
//! node, relays datagrams both ways, and ends after the upstream's `timeout.read` without
//! traffic (then `log` runs). Sessions per listener are bounded by [`MAX_SESSIONS`] (each holds
//! one socket: keep the process's file limit above it); past it, datagrams of new clients are
//! dropped. A session queues at most 64 KiB of datagrams while it is being opened, and holds a
//! 64 KiB receive buffer while open (a shared one is a to-do: see the closing note).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio::time::Instant;
use weir_plugin::StreamCtx;

use super::tcp::preread;
use crate::state::Gateway;
use crate::tables::upstream::fnv1a;

/// Sessions one UDP listener keeps at once.
pub const MAX_SESSIONS: usize = 10_000;
/// Largest datagram relayed.
const MAX_DATAGRAM: usize = 65_535;

/// Bytes of datagrams a client may send while its session is being opened (more are dropped).
const QUEUED_WHILE_OPENING: usize = 64 << 10;

struct Session {
    /// Set once the session is open.
    upstream: RefCell<Option<Rc<UdpSocket>>>,
    /// Datagrams that arrived while it was being opened.
    queued: RefCell<Vec<Vec<u8>>>,
    last: Cell<Instant>,
    from_client: Cell<u64>,
}

type Sessions = Rc<RefCell<HashMap<SocketAddr, Rc<Session>>>>;

/// Serves one UDP listener until the process stops.
pub async fn serve(socket: UdpSocket, gateway: Arc<Gateway>) {
    let socket = Rc::new(socket);
    let local = match socket.local_addr() {
        Ok(a) => a,
        Err(e) => {
            log::error!("stream UDP listener: {e}");
            return;
        }
    };
    let sessions: Sessions = Rc::default();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, peer) = match socket.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                // ICMP errors of earlier sends surface here on some systems: not fatal.
                log::debug!("stream UDP {local}: {e}");
                continue;
            }
        };
        let existing = sessions.borrow().get(&peer).cloned();
        if let Some(s) = existing {
            s.last.set(Instant::now());
            s.from_client.set(s.from_client.get() + n as u64);
            let upstream = s.upstream.borrow().clone();
            match upstream {
                Some(up) => {
                    if let Err(e) = up.send(&buf[..n]).await {
                        log::debug!("stream UDP {peer}: to upstream: {e}");
                    }
                }
                None if s.queued.borrow().iter().map(Vec::len).sum::<usize>() + n <= QUEUED_WHILE_OPENING => {
                    s.queued.borrow_mut().push(buf[..n].to_vec());
                }
                None => {}
            }
            continue;
        }
        if sessions.borrow().len() >= MAX_SESSIONS {
            log::debug!("stream UDP {local}: {MAX_SESSIONS} sessions open; dropping a datagram of {peer}");
            continue;
        }
        // The client's slot is taken now: its next datagrams queue for this session.
        let session = Rc::new(Session {
            upstream: RefCell::new(None),
            queued: RefCell::new(vec![buf[..n].to_vec()]),
            last: Cell::new(Instant::now()),
            from_client: Cell::new(n as u64),
        });
        sessions.borrow_mut().insert(peer, session.clone());
        let (socket, sessions, gateway) = (socket.clone(), sessions.clone(), gateway.clone());
        tokio::task::spawn_local(async move {
            open(socket, &session, gateway, peer, local).await;
            sessions.borrow_mut().remove(&peer);
        });
    }
}

/// Routes a new client, opens its session, relays until idle, logs.
async fn open(socket: Rc<UdpSocket>, session: &Session, gateway: Arc<Gateway>, peer: SocketAddr, local: SocketAddr) {
    let _live = super::Live::udp();
    let snap = gateway.resources.load_full();
    let Some(route) = snap.stream_table.find(local, peer.ip(), None).cloned() else {
        log::info!("stream: no stream route for UDP client {peer} on {local}; dropping");
        return;
    };
    drop(snap);
    let mut ctx = StreamCtx::new("udp", peer, local);
    ctx.route_id = Some(route.id.clone());
    let chain = route.plugins.clone();
    let finish = |ctx: &StreamCtx| {
        for p in chain.iter() {
            p.instance.log(ctx);
        }
    };
    if let Err(reason) = preread(&route.plugins, &mut ctx).await {
        ctx.close_reason = reason;
        finish(&ctx);
        return;
    }
    let Some(upstream) = route.upstream.clone() else { return };
    let checker = upstream.checker(&gateway.health);
    // chash: the client's address is the key (as for TCP).
    let hash = upstream.hash_key_source().map(|_| fnv1a(peer.ip().to_string().as_bytes()));
    let Some((idx, _inflight)) = upstream.pick_node(checker.as_deref(), hash, &[]) else {
        ctx.close_reason = "no upstream node".into();
        finish(&ctx);
        return;
    };
    let node = upstream.nodes[idx].addr;
    let bind: SocketAddr = if node.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let up = match UdpSocket::bind(bind).await {
        Ok(s) => s,
        Err(e) => {
            log::warn!("stream UDP route {}: {e}", route.id);
            return;
        }
    };
    if let Err(e) = up.connect(node).await {
        ctx.close_reason = format!("connect to {node} failed: {e}");
        finish(&ctx);
        return;
    }
    let up = Rc::new(up);
    ctx.upstream_addr = Some(node);
    for p in route.plugins.iter() {
        p.instance.connect(&mut ctx);
    }
    // Open from now on (later datagrams go straight up), then what queued meanwhile.
    *session.upstream.borrow_mut() = Some(up.clone());
    let queued = std::mem::take(&mut *session.queued.borrow_mut());
    for datagram in queued {
        if let Err(e) = up.send(&datagram).await {
            log::debug!("stream UDP {peer}: to upstream: {e}");
        }
    }
    let idle = upstream.timeouts.read;
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut to_client = 0u64;
    let reason = loop {
        tokio::select! {
            got = up.recv(&mut buf) => match got {
                Ok(n) => {
                    session.last.set(Instant::now());
                    to_client += n as u64;
                    if let Err(e) = socket.send_to(&buf[..n], peer).await {
                        break format!("to client: {e}");
                    }
                }
                // Connection refused (ICMP) and the like: the upstream is not there.
                Err(e) => break format!("upstream: {e}"),
            },
            _ = tokio::time::sleep_until(session.last.get() + idle) => {
                if session.last.get().elapsed() >= idle {
                    break "idle timeout".to_owned();
                }
            }
        }
    };
    ctx.bytes_from_client = session.from_client.get();
    ctx.bytes_to_client = to_client;
    ctx.close_reason = reason;
    finish(&ctx);
}
