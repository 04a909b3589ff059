//! Weir's etcd v3 client: gRPC over tonic, with the messages declared in [`proto`] (so building
//! Weir needs no `protoc`). It does what the etcd provider, its watcher and the Admin API need:
//! range reads, puts, deletes, transactions, watches, compaction, leases (ACME's fleet lock);
//! over plain HTTP/2 or TLS (a
//! CA, a client certificate, an SNI override), with user/password authentication (the token is
//! fetched again when etcd says it expired), spreading requests over every endpoint.

pub mod proto;

use std::time::Duration;

use tonic::codec::ProstCodec;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

pub use proto::{Compare, KeyValue, RangeResponse, RequestOp, TxnRequest, TxnResponse, WatchResponse};

/// How to reach etcd.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Connect and per-request timeout.
    pub timeout: Option<Duration>,
    /// `(user, password)` for etcd's authentication.
    pub user: Option<(String, String)>,
    /// TLS for `https://` endpoints.
    pub tls: Option<ClientTlsConfig>,
}

/// A connected client (cheap to clone: clones share the connections).
#[derive(Clone)]
pub struct Client {
    grpc: tonic::client::Grpc<Channel>,
    user: Option<(String, String)>,
    token: Option<MetadataValue<Ascii>>,
}

/// Keeps a watch open; the watch ends when it is dropped.
pub struct Watcher {
    _requests: tokio::sync::mpsc::Sender<proto::WatchRequest>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("authenticated", &self.token.is_some()).finish()
    }
}

/// What a failed call says: the gRPC status and etcd's message.
fn describe(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

/// The end of the range of every key starting with `prefix` (etcd's convention: the prefix
/// with its last byte below 0xff incremented; `\0` for everything).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Client {
    /// Connects to `endpoints` (`http://host:port` or `https://...`), authenticating when
    /// `options.user` is set. Connections are made lazily; a refused one shows on the first call.
    pub async fn connect(endpoints: &[String], options: Options) -> Result<Client, String> {
        let mut list = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            let mut endpoint = Endpoint::from_shared(e.clone()).map_err(|err| format!("endpoint `{e}`: {err}"))?;
            if let Some(t) = options.timeout {
                endpoint = endpoint.timeout(t).connect_timeout(t);
            }
            endpoint = endpoint.keep_alive_while_idle(true).http2_keep_alive_interval(Duration::from_secs(30));
            if e.starts_with("https://") {
                let tls = options.tls.clone().unwrap_or_else(|| ClientTlsConfig::new().with_native_roots());
                endpoint = endpoint.tls_config(tls).map_err(|err| format!("endpoint `{e}`: TLS: {err}"))?;
            }
            list.push(endpoint);
        }
        if list.is_empty() {
            return Err("no etcd endpoint".into());
        }
        let channel = Channel::balance_list(list.into_iter());
        let mut client = Client { grpc: tonic::client::Grpc::new(channel), user: options.user, token: None };
        client.authenticate().await?;
        Ok(client)
    }

    /// Fetches a token for the configured user (nothing without one).
    async fn authenticate(&mut self) -> Result<(), String> {
        let Some((name, password)) = self.user.clone() else { return Ok(()) };
        self.token = None;
        let req = proto::AuthenticateRequest { name, password };
        let resp: proto::AuthenticateResponse =
            self.call("/etcdserverpb.Auth/Authenticate", req).await.map_err(|e| format!("etcd authentication: {e}"))?;
        let token = resp.token.parse().map_err(|_| "etcd authentication: the token is not ASCII".to_owned())?;
        self.token = Some(token);
        Ok(())
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(message);
        if let Some(token) = &self.token {
            req.metadata_mut().insert("token", token.clone());
        }
        req
    }

    async fn call<Req, Resp>(&mut self, path: &'static str, message: Req) -> Result<Resp, tonic::Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        self.grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let codec: ProstCodec<Req, Resp> = ProstCodec::default();
        let path = http::uri::PathAndQuery::from_static(path);
        self.grpc.unary(self.request(message), path, codec).await.map(tonic::Response::into_inner)
    }

    /// A unary call, once more with a fresh token when etcd says the token expired.
    async fn unary<Req, Resp>(&mut self, path: &'static str, message: Req) -> Result<Resp, String>
    where
        Req: prost::Message + Clone + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        match self.call(path, message.clone()).await {
            Ok(r) => Ok(r),
            Err(s) if self.user.is_some() && s.message().contains("invalid auth token") => {
                self.authenticate().await?;
                self.call(path, message).await.map_err(|s| describe(&s))
            }
            Err(s) => Err(describe(&s)),
        }
    }

    /// The key `key`, or with `prefix` every key starting with it.
    pub async fn get(&mut self, key: impl Into<Vec<u8>>, prefix: bool) -> Result<RangeResponse, String> {
        let key = key.into();
        let range_end = if prefix { prefix_end(&key) } else { Vec::new() };
        self.unary("/etcdserverpb.KV/Range", proto::RangeRequest { key, range_end, ..Default::default() }).await
    }

    /// How many keys starting with `prefix` were written after `revision` (by their names only:
    /// a deleted key is not there to count), and how many keys start with `prefix` now (etcd's
    /// `count` is taken before the revision filter).
    pub async fn written_since(&mut self, prefix: impl Into<Vec<u8>>, revision: i64) -> Result<(usize, i64), String> {
        let key = prefix.into();
        let range_end = prefix_end(&key);
        let request = proto::RangeRequest {
            key,
            range_end,
            keys_only: true,
            min_mod_revision: revision + 1,
            ..Default::default()
        };
        let resp: RangeResponse = self.unary("/etcdserverpb.KV/Range", request).await?;
        Ok((resp.kvs.len(), resp.count))
    }

    /// Writes `value` at `key`.
    pub async fn put(&mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Result<(), String> {
        self.put_leased(key, value, 0).await
    }

    /// Writes `value` at `key`, deleted with `lease` (0: no lease).
    pub async fn put_leased(
        &mut self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: i64,
    ) -> Result<(), String> {
        let req = proto::PutRequest { key: key.into(), value: value.into(), lease };
        self.unary::<_, proto::PutResponse>("/etcdserverpb.KV/Put", req).await.map(drop)
    }

    /// A new lease that lives `ttl` seconds unless kept alive: its id.
    pub async fn lease_grant(&mut self, ttl: i64) -> Result<i64, String> {
        let req = proto::LeaseGrantRequest { ttl, id: 0 };
        let resp: proto::LeaseGrantResponse = self.unary("/etcdserverpb.Lease/LeaseGrant", req).await?;
        match resp.error.is_empty() {
            true => Ok(resp.id),
            false => Err(format!("etcd lease grant: {}", resp.error)),
        }
    }

    /// Ends `lease` now, deleting every key written with it.
    pub async fn lease_revoke(&mut self, id: i64) -> Result<(), String> {
        let req = proto::LeaseRevokeRequest { id };
        self.unary::<_, proto::LeaseRevokeResponse>("/etcdserverpb.Lease/LeaseRevoke", req).await.map(drop)
    }

    /// Keeps `lease` alive for as long as this future runs, renewing it every `every`; returns
    /// (with why) only when it can no longer do so.
    pub async fn lease_keep_alive(&mut self, id: i64, every: Duration) -> String {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        if let Err(e) = self.grpc.ready().await {
            return format!("etcd lease keep-alive: {e}");
        }
        let codec: ProstCodec<proto::LeaseKeepAliveRequest, proto::LeaseKeepAliveResponse> = ProstCodec::default();
        let path = http::uri::PathAndQuery::from_static("/etcdserverpb.Lease/LeaseKeepAlive");
        let requests = tokio_stream::wrappers::ReceiverStream::new(rx);
        let mut answers = match self.grpc.streaming(self.request(requests), path, codec).await {
            Ok(resp) => resp.into_inner(),
            Err(s) => return format!("etcd lease keep-alive: {}", describe(&s)),
        };
        loop {
            if tx.send(proto::LeaseKeepAliveRequest { id }).await.is_err() {
                return "etcd lease keep-alive: request channel closed".into();
            }
            match answers.message().await {
                Ok(Some(a)) if a.ttl > 0 => {}
                Ok(Some(_)) => return format!("etcd lease {id:x} expired"),
                Ok(None) => return "etcd closed the lease keep-alive".into(),
                Err(s) => return format!("etcd lease keep-alive: {}", describe(&s)),
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Deletes `key`, or with `prefix` every key starting with it; how many went.
    pub async fn delete(&mut self, key: impl Into<Vec<u8>>, prefix: bool) -> Result<i64, String> {
        let key = key.into();
        let range_end = if prefix { prefix_end(&key) } else { Vec::new() };
        let req = proto::DeleteRangeRequest { key, range_end };
        let resp: proto::DeleteRangeResponse = self.unary("/etcdserverpb.KV/DeleteRange", req).await?;
        Ok(resp.deleted)
    }

    /// A transaction.
    pub async fn txn(&mut self, txn: TxnRequest) -> Result<TxnResponse, String> {
        self.unary("/etcdserverpb.KV/Txn", txn).await
    }

    /// Compacts the history up to `revision` (`physical`: wait until it is gone from disk).
    pub async fn compact(&mut self, revision: i64, physical: bool) -> Result<(), String> {
        let req = proto::CompactionRequest { revision, physical };
        self.unary::<_, proto::CompactionResponse>("/etcdserverpb.KV/Compact", req).await.map(drop)
    }

    /// Watches `key` (with `prefix`, every key under it) from `start_revision`: the watch's
    /// handle and its stream of responses (the first one says it was created).
    pub async fn watch(
        &mut self,
        key: impl Into<Vec<u8>>,
        prefix: bool,
        start_revision: i64,
    ) -> Result<(Watcher, tonic::Streaming<WatchResponse>), String> {
        let key = key.into();
        let range_end = if prefix { prefix_end(&key) } else { Vec::new() };
        let create = proto::WatchCreateRequest { key, range_end, start_revision, progress_notify: false };
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let first = proto::WatchRequest { request_union: Some(proto::WatchRequestUnion::Create(create)) };
        tx.send(first).await.map_err(|_| "etcd watch: request channel closed".to_owned())?;
        self.grpc.ready().await.map_err(|e| format!("etcd watch: {e}"))?;
        let codec: ProstCodec<proto::WatchRequest, WatchResponse> = ProstCodec::default();
        let path = http::uri::PathAndQuery::from_static("/etcdserverpb.Watch/Watch");
        let requests = tokio_stream::wrappers::ReceiverStream::new(rx);
        let resp = self.grpc.streaming(self.request(requests), path, codec).await.map_err(|s| describe(&s))?;
        Ok((Watcher { _requests: tx }, resp.into_inner()))
    }
}

impl Compare {
    /// `key`'s mod revision equals `revision` (0: the key does not exist).
    pub fn mod_revision_is(key: impl Into<Vec<u8>>, revision: i64) -> Compare {
        Compare { result: 0, target: 2, key: key.into(), target_union: Some(proto::TargetUnion::ModRevision(revision)) }
    }
}

impl RequestOp {
    /// Writes `value` at `key`.
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> RequestOp {
        RequestOp::put_leased(key, value, 0)
    }

    /// Writes `value` at `key`, deleted with `lease` (0: no lease).
    pub fn put_leased(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> RequestOp {
        let put = proto::PutRequest { key: key.into(), value: value.into(), lease };
        RequestOp { request: Some(proto::Request::Put(put)) }
    }

    /// Deletes `key`, or with `prefix` every key under it.
    pub fn delete(key: impl Into<Vec<u8>>, prefix: bool) -> RequestOp {
        let key = key.into();
        let range_end = if prefix { prefix_end(&key) } else { Vec::new() };
        RequestOp { request: Some(proto::Request::DeleteRange(proto::DeleteRangeRequest { key, range_end })) }
    }
}

impl proto::Event {
    /// Whether the key was deleted (else it was written).
    pub fn is_delete(&self) -> bool {
        self.kind == proto::EVENT_DELETE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn prefix_ends_follow_etcd() {
        assert_eq!(prefix_end(b"/weir/"), b"/weir0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn a_compare_encodes_as_etcd_reads_it() {
        // etcd's own encoding of Compare{result: EQUAL, target: MOD, key: "k", mod_revision: 5}:
        // field 2 (target) = 2, field 3 (key) = "k", field 6 (mod_revision) = 5; EQUAL is the
        // default and is not written.
        let bytes = Compare::mod_revision_is("k", 5).encode_to_vec();
        assert_eq!(bytes, vec![0x10, 0x02, 0x1a, 0x01, b'k', 0x30, 0x05]);
    }
}
