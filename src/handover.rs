//! Zero-downtime binary upgrade, the nginx way: on SIGUSR2 the running Weir starts a new process
//! of its binary (the file now at the path it was started from) that inherits every listening
//! socket instead of binding its own; once the new process serves, it sends SIGQUIT to the old
//! one, which stops accepting, finishes what it serves (`gateway.worker_shutdown_timeout` at
//! most) and exits. No connection is refused in between: the kernel's listening sockets never
//! close, and whichever process calls `accept` next takes the next connection.
//!
//! Every listener of the process (data plane, TLS, stream TCP and UDP, control server, Admin API,
//! plugin listeners) is made here ([`tcp`], [`udp`]), so that each is either taken over or bound,
//! and known for the next upgrade. The sockets pass as inherited descriptors named in
//! `WEIR_LISTEN_FDS` (`tcp/0.0.0.0:9080=3,udp/0.0.0.0:9200=4`), the old process's pid in
//! `WEIR_UPGRADE_FROM`.
#![allow(unsafe_code)] // two calls: adopting an inherited descriptor, signalling the old process

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::OnceLock;

use parking_lot::Mutex;

const ENV_FDS: &str = "WEIR_LISTEN_FDS";
const ENV_FROM: &str = "WEIR_UPGRADE_FROM";

/// Pending connections the kernel queues per listener (nginx uses 511; Linux caps it at
/// `net.core.somaxconn`).
pub const BACKLOG: i32 = 2048;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

struct State {
    /// Sockets inherited from the old process and not yet taken.
    inherited: HashMap<(Proto, SocketAddr), OwnedFd>,
    /// Sockets this process listens on (a descriptor of each, for the next upgrade).
    bound: Vec<(Proto, SocketAddr, OwnedFd)>,
    /// The pid that handed its sockets over, until it is told to go.
    from: Option<i32>,
}

fn state() -> &'static Mutex<State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE.get_or_init(|| Mutex::new(read_environment()))
}

/// The binary and arguments this process was started with (recorded at start: after a package
/// upgrade replaced the file, `/proc/self/exe` names a deleted file).
fn command() -> &'static (PathBuf, Vec<std::ffi::OsString>) {
    static COMMAND: OnceLock<(PathBuf, Vec<std::ffi::OsString>)> = OnceLock::new();
    COMMAND.get_or_init(|| {
        let mut args = std::env::args_os();
        let argv0 = args.next().map(PathBuf::from).unwrap_or_default();
        // A bare name was found on PATH; a relative path is relative to the start directory.
        let exe = if argv0.components().count() > 1 {
            std::env::current_dir().map(|d| d.join(&argv0)).unwrap_or(argv0)
        } else {
            std::env::current_exe().unwrap_or(argv0)
        };
        (exe, args.collect())
    })
}

/// Records how this process was started and what it inherited; call first thing in `main`.
pub fn init() {
    let _ = command();
    let _ = state();
}

fn read_environment() -> State {
    let mut inherited = HashMap::new();
    if let Some(list) = std::env::var_os(ENV_FDS) {
        for item in list.to_string_lossy().split(',').filter(|s| !s.is_empty()) {
            let parsed = item.split_once('=').and_then(|(what, fd)| {
                let (proto, addr) = what.split_once('/')?;
                let proto = match proto {
                    "tcp" => Proto::Tcp,
                    "udp" => Proto::Udp,
                    _ => return None,
                };
                Some((proto, addr.parse::<SocketAddr>().ok()?, fd.parse::<RawFd>().ok()?))
            });
            let Some((proto, addr, fd)) = parsed else {
                log::warn!("{ENV_FDS}: `{item}` is not proto/addr=fd; ignored");
                continue;
            };
            // SAFETY: the old Weir process named this descriptor as a socket it left open for
            // us (it cleared close-on-exec on exactly these); nothing else in this process owns
            // it, and it is adopted once (the environment is read once).
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            inherited.insert((proto, addr), owned);
        }
    }
    // (A successor of this process gets fresh values of both variables.)
    let from = std::env::var(ENV_FROM).ok().and_then(|p| p.parse().ok());
    State { inherited, bound: Vec::new(), from }
}

/// A TCP listener on `addr`: the old process's socket when it handed one over, else a new one
/// (SO_REUSEADDR, [`BACKLOG`]). Non-blocking.
pub fn tcp(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let mut st = state().lock();
    let listener = match st.inherited.remove(&(Proto::Tcp, addr)) {
        Some(fd) => {
            let listener = std::net::TcpListener::from(fd);
            log::info!("took over the listener on {addr} from the previous process");
            listener
        }
        None => {
            let domain = if addr.is_ipv4() { socket2::Domain::IPV4 } else { socket2::Domain::IPV6 };
            let socket = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
            socket.set_reuse_address(true)?;
            socket.bind(&addr.into())?;
            socket.listen(BACKLOG)?;
            socket.into()
        }
    };
    listener.set_nonblocking(true)?;
    st.bound.push((Proto::Tcp, addr, listener.as_fd().try_clone_to_owned()?));
    Ok(listener)
}

/// A UDP socket on `addr`: the old process's when it handed one over, else a new one.
pub fn udp(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let mut st = state().lock();
    let socket = match st.inherited.remove(&(Proto::Udp, addr)) {
        Some(fd) => std::net::UdpSocket::from(fd),
        None => std::net::UdpSocket::bind(addr)?,
    };
    socket.set_nonblocking(true)?;
    st.bound.push((Proto::Udp, addr, socket.as_fd().try_clone_to_owned()?));
    Ok(socket)
}

/// After start-up: closes inherited sockets nothing took (a listener the new configuration
/// dropped), and tells the old process to drain and exit. Returns its pid, if there was one.
pub fn finish_takeover() -> Option<i32> {
    let mut st = state().lock();
    for ((proto, addr), _) in st.inherited.drain() {
        log::info!("the previous process listened on {}/{addr}; this configuration does not", proto.name());
    }
    let from = st.from.take()?;
    // SAFETY: kill(2) with a pid and a signal number; no memory is involved.
    let rc = unsafe { libc::kill(from, libc::SIGQUIT) };
    if rc != 0 {
        log::warn!("cannot tell the previous process ({from}) to stop: {}", std::io::Error::last_os_error());
    }
    Some(from)
}

/// A stop has begun: closes this process's copies of its listening sockets, so that once the
/// workers stop accepting the kernel refuses new clients instead of queueing them on a socket
/// nobody will accept from. A successor that took over holds its own copies (inherited at its
/// start), so its listeners stay open. No upgrade can start after this.
pub fn release() {
    state().lock().bound.clear();
}

/// SIGUSR2: starts the new process with every listening socket. Its stdout and stderr are this
/// process's. Returns its pid; a thread reports if it exits before taking over.
pub fn start_successor() -> Result<u32, String> {
    let (exe, args) = command();
    let st = state().lock();
    let mut list = Vec::with_capacity(st.bound.len());
    for (proto, addr, fd) in &st.bound {
        socket2::SockRef::from(fd).set_cloexec(false).map_err(|e| format!("{addr}: {e}"))?;
        list.push(format!("{}/{addr}={}", proto.name(), fd.as_raw_fd()));
    }
    let spawned = std::process::Command::new(exe)
        .args(args)
        .env(ENV_FDS, list.join(","))
        .env(ENV_FROM, std::process::id().to_string())
        .spawn();
    // Later children (a plugin's, the next upgrade's) must not inherit them by accident.
    for (_, _, fd) in &st.bound {
        let _ = socket2::SockRef::from(fd).set_cloexec(true);
    }
    drop(st);
    let mut child = spawned.map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let pid = child.id();
    let _ = std::thread::Builder::new().name("successor".into()).spawn(move || {
        // A successor that takes over lives on after this process; one that fails exits soon.
        if let Ok(status) = child.wait() {
            if !status.success() {
                log::error!("upgrade: the new process ({pid}) exited with {status}; this one keeps serving");
            }
        }
    });
    Ok(pid)
}
