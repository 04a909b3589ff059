//! The limiters' own connection to a plain-TCP Redis (a single server, or the master a
//! Sentinel names): one per worker thread and target, pipelined. A call appends its command to
//! the connection's write buffer and waits for its reply; a writer task sends whatever has
//! gathered in one write, and a reader task parses the replies ([`super::resp`]) and hands them
//! out in order. Requests of one worker that count at the same moment so share one system call
//! each way, and a call costs no channel, no codec and no shared state beyond one uncontended
//! lock. Redis over TLS and Redis Cluster keep the `redis` crate's connections.
//!
//! A connection that fails (an I/O error, bytes that are not RESP, a reply nobody asked for)
//! fails every call waiting on it; the store then drops it and the next call connects again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};

use super::conf::Auth;
use super::resp::{self, Reply};

/// Why a call got no reply (the connection is unusable).
#[derive(Debug)]
pub struct Broken(pub String);

struct Inner {
    /// Commands not yet written.
    out: Vec<u8>,
    /// The calls waiting for a reply, in the order their commands were written.
    waiting: VecDeque<oneshot::Sender<Reply>>,
    /// Set when the connection failed or its last handle went.
    closed: Option<String>,
}

struct Shared {
    inner: Mutex<Inner>,
    /// Wakes the writer: there is something to write, or the connection closed.
    wake: Notify,
}

impl Shared {
    fn close(&self, why: String) {
        let waiting = {
            let mut inner = self.inner.lock();
            if inner.closed.is_none() {
                inner.closed = Some(why);
            }
            std::mem::take(&mut inner.waiting)
        };
        // Dropping a sender fails its call.
        drop(waiting);
        self.wake.notify_one();
    }
}

/// Closes the connection when the last handle goes (its tasks then end).
struct Handle(Arc<Shared>);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.close("connection dropped".into());
    }
}

/// One pipelined connection (cheap to clone: a handle).
#[derive(Clone)]
pub struct Lean(Arc<Handle>);

impl Lean {
    /// Connects to `host:port` within `timeout`, authenticates and selects `db`. The connection's
    /// tasks run on the calling thread's runtime.
    pub async fn connect(host: &str, port: u16, auth: &Auth, db: u32, timeout: Duration) -> Result<Lean, Broken> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect((host, port)))
            .await
            .map_err(|_| Broken(format!("no connection within {} ms", timeout.as_millis())))?
            .map_err(|e| Broken(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let (rd, wr) = stream.into_split();
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner { out: Vec::with_capacity(4096), waiting: VecDeque::new(), closed: None }),
            wake: Notify::new(),
        });
        tokio::spawn(write_loop(shared.clone(), wr));
        tokio::spawn(read_loop(shared.clone(), rd));
        let lean = Lean(Arc::new(Handle(shared)));
        let mut hello = Vec::new();
        if let Some(password) = &auth.password {
            match &auth.username {
                Some(user) => resp::command(&mut hello, &[b"AUTH", user.as_bytes(), password.as_bytes()]),
                None => resp::command(&mut hello, &[b"AUTH", password.as_bytes()]),
            }
            lean.expect_ok(&hello, "AUTH").await?;
            hello.clear();
        }
        if db != 0 {
            resp::command(&mut hello, &[b"SELECT", itoa::Buffer::new().format(db).as_bytes()]);
            lean.expect_ok(&hello, "SELECT").await?;
        }
        Ok(lean)
    }

    async fn expect_ok(&self, command: &[u8], what: &str) -> Result<(), Broken> {
        match self.call(|out| out.extend_from_slice(command)).await? {
            Ok(_) => Ok(()),
            // Never the password: only the server's message.
            Err(e) => Err(Broken(format!("{what} refused: {e}"))),
        }
    }

    /// Sends the command `encode` appends and waits for its reply.
    pub async fn call(&self, encode: impl FnOnce(&mut Vec<u8>)) -> Result<Reply, Broken> {
        let shared = &(self.0).0;
        let (tx, rx) = oneshot::channel();
        let first = {
            let mut inner = shared.inner.lock();
            if let Some(why) = &inner.closed {
                return Err(Broken(why.clone()));
            }
            let first = inner.out.is_empty();
            encode(&mut inner.out);
            inner.waiting.push_back(tx);
            first
        };
        if first {
            shared.wake.notify_one();
        }
        rx.await.map_err(|_| Broken(shared.inner.lock().closed.clone().unwrap_or_else(|| "connection closed".into())))
    }

    /// Runs a script call: by its SHA1, and in full when the server does not know it yet.
    pub async fn eval(&self, call: &resp::ScriptCall<'_>) -> Result<Reply, Broken> {
        match self.call(|out| call.encode(out, false)).await? {
            Err(e) if e.starts_with("NOSCRIPT") => self.call(|out| call.encode(out, true)).await,
            reply => Ok(reply),
        }
    }

    /// Whether the connection has failed.
    pub fn is_closed(&self) -> bool {
        (self.0).0.inner.lock().closed.is_some()
    }
}

async fn write_loop(shared: Arc<Shared>, mut wr: OwnedWriteHalf) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        {
            let mut inner = shared.inner.lock();
            if inner.closed.is_some() {
                break;
            }
            std::mem::swap(&mut inner.out, &mut buf);
        }
        if buf.is_empty() {
            shared.wake.notified().await;
            continue;
        }
        if let Err(e) = wr.write_all(&buf).await {
            shared.close(format!("write failed: {e}"));
            break;
        }
        buf.clear();
    }
    // Dropping the write half shuts the socket's sending side: the server closes, and the
    // reader sees the end.
}

async fn read_loop(shared: Arc<Shared>, mut rd: OwnedReadHalf) {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let why = 'read: loop {
        match rd.read_buf(&mut buf).await {
            Ok(0) => break "closed by the server".to_string(),
            Ok(_) => {}
            Err(e) => break format!("read failed: {e}"),
        }
        let mut used = 0;
        loop {
            match resp::parse(&buf[used..]) {
                Ok(Some((reply, n))) => {
                    used += n;
                    let Some(tx) = shared.inner.lock().waiting.pop_front() else {
                        break 'read "a reply nobody asked for".to_string();
                    };
                    // The caller may have given up (its timeout): the reply is dropped.
                    let _ = tx.send(reply);
                }
                Ok(None) => break,
                Err(resp::Malformed(what)) => break 'read format!("malformed reply: {what}"),
            }
        }
        buf.drain(..used);
        if buf.capacity() > 64 * 1024 && buf.len() < 4096 {
            buf.shrink_to(4096);
        }
    };
    shared.close(why);
}

/// A reply converted to the caller's type.
pub fn convert<T: redis::FromRedisValue>(v: Value) -> Result<T, String> {
    T::from_redis_value(v).map_err(|e| e.to_string())
}
