//! ACME in a fleet: with the etcd provider, the instances of one `deployment.prefix` share their
//! ACME state in etcd under `<prefix>_acme/` (outside the resources' `<prefix>/`, which is all
//! the Admin API reaches, and where etcd's RBAC can keep other clients from private keys), so
//! that one instance orders and every instance serves the result.
//!
//! | key | value | lives |
//! |---|---|---|
//! | `locks/<ssl id>` | the ordering instance (`host:pid`) | the order's lease |
//! | `challenges/http-01/<token>` | the key authorization | the order's lease |
//! | `challenges/tls-alpn-01/<domain>` | the key authorization's digest (base64) | the order's lease |
//! | `certs/<ssl id>` | `{cert, key, by, at}` (PEM) | until replaced |
//! | `failures/<ssl id>` | `{count, at, error}`: the fleet's backoff | until an order succeeds |
//! | `accounts/<hash>` | the ACME account's credentials | for good |
//!
//! An instance whose certificate is due takes the entry's lock (a put if absent, bound to a lease
//! of `LEASE_TTL` kept alive while it orders), checks under it that no other instance renewed
//! meanwhile and that the fleet is not backing off, orders, and writes the result. Every instance
//! follows the key space (`follow`): certificates are mirrored into the local `data/acme/`
//! files the certificate table reads (which also serve when etcd is down at start), and challenge
//! answers join the maps the data plane answers from, so any instance answers the CA. A crashed
//! orderer's lease runs out after `LEASE_TTL` and takes its lock and challenges with it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use base64::Engine;
use instant_acme::AccountCredentials;
use serde::{Deserialize, Serialize};

use super::{alpn_challenge_cert, backoff, files, renew_at, validity_for, write_private, Manager, Resolved, HTTP_OPEN};
use crate::config::EtcdSection;
use crate::etcd::{Client, Compare, RequestOp, TxnRequest};

/// Seconds an orderer's lock and challenges outlive it.
pub(super) const LEASE_TTL: i64 = 30;

/// Longest an order may hold the fleet's lock (each call to the CA has its own timeout too).
const ORDER_TIMEOUT: Duration = Duration::from_secs(600);

/// Where the fleet's state lives.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `deployment.etcd`.
    pub etcd: EtcdSection,
    /// `<deployment.prefix>_acme`.
    pub prefix: String,
}

/// The process's side of the fleet.
pub(super) struct Fleet {
    settings: Settings,
    instance: String,
    client: tokio::sync::Mutex<Option<Client>>,
}

/// A certificate as the fleet stores it.
#[derive(Serialize, Deserialize)]
struct Stored {
    cert: String,
    key: String,
    by: String,
    at: i64,
}

/// The fleet's backoff for one entry.
#[derive(Serialize, Deserialize, Default)]
struct Failure {
    count: u32,
    at: i64,
    error: String,
}

/// What one turn at an entry came to.
pub(super) enum Turn {
    /// This instance ordered and stored a certificate.
    Issued,
    /// Another instance holds the entry's lock (it is ordering).
    Busy,
    /// The fleet's certificate is not due (another instance renewed it): nothing ordered.
    Fresh,
    /// The fleet backs off after failures until this time (Unix seconds).
    Later(i64),
}

/// An order's claim: the lease its lock and challenges are bound to.
pub(super) struct Claim {
    client: Client,
    prefix: String,
    lease: i64,
}

impl Claim {
    /// The key of an answer: HTTP-01's by its token, TLS-ALPN-01's by its domain.
    fn challenge_key(&self, token: Option<&str>, domain: &str) -> String {
        match token {
            Some(t) => format!("{}/challenges/http-01/{t}", self.prefix),
            None => format!("{}/challenges/tls-alpn-01/{domain}", self.prefix),
        }
    }

    /// Publishes an HTTP-01 answer to the fleet.
    pub(super) async fn open_http(&mut self, token: &str, key_auth: &str) -> Result<(), String> {
        let key = self.challenge_key(Some(token), "");
        self.client.put_leased(key, key_auth, self.lease).await
    }

    /// Publishes a TLS-ALPN-01 answer to the fleet.
    pub(super) async fn open_alpn(&mut self, domain: &str, digest: &[u8]) -> Result<(), String> {
        let key = self.challenge_key(None, domain);
        let value = base64::engine::general_purpose::STANDARD.encode(digest);
        self.client.put_leased(key, value, self.lease).await
    }

    /// Withdraws an answer (best effort: the lease takes it anyway).
    pub(super) async fn close(&mut self, token: Option<&str>, domain: &str) {
        let key = self.challenge_key(token, domain);
        let _ = self.client.delete(key, false).await;
    }
}

impl Fleet {
    pub(super) fn new(settings: Settings) -> Fleet {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let instance = format!("{}:{}", host.trim(), std::process::id());
        Fleet { settings, instance, client: tokio::sync::Mutex::new(None) }
    }

    async fn client(&self) -> Result<Client, String> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = crate::resources::etcd::connect(&self.settings.etcd).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    fn key(&self, what: &str, id: &str) -> String {
        format!("{}/{what}/{id}", self.settings.prefix)
    }

    /// The fleet's account credentials for `name`, if some instance created them.
    pub(super) async fn account(&self, name: &str) -> Result<Option<AccountCredentials>, String> {
        let resp = self.client().await?.get(self.key("accounts", name), false).await?;
        Ok(resp.kvs.first().and_then(|kv| serde_json::from_slice(&kv.value).ok()))
    }

    /// Stores new account credentials unless another instance stored some first; the ones in
    /// force.
    pub(super) async fn share_account(&self, name: &str, creds: &[u8]) -> Result<Option<AccountCredentials>, String> {
        let key = self.key("accounts", name);
        let txn = TxnRequest {
            compare: vec![Compare::mod_revision_is(key.clone(), 0)],
            success: vec![RequestOp::put(key.clone(), creds.to_vec())],
            failure: vec![],
        };
        let mut client = self.client().await?;
        if client.txn(txn).await?.succeeded {
            return Ok(None);
        }
        self.account(name).await
    }

    /// One turn at `conf`'s certificate: take its lock, and under it order unless the fleet's
    /// certificate is fresh or the fleet backs off (`asked`: a renewal was asked for, order
    /// anyway).
    pub(super) async fn turn(&self, manager: &Manager, conf: &Resolved, asked: bool) -> Result<Turn, String> {
        let mut client = self.client().await.inspect_err(|_| self.forget())?;
        let lease = client.lease_grant(LEASE_TTL).await.inspect_err(|_| self.forget())?;
        let lock = self.key("locks", &conf.id);
        let txn = TxnRequest {
            compare: vec![Compare::mod_revision_is(lock.clone(), 0)],
            success: vec![RequestOp::put_leased(lock, self.instance.clone(), lease)],
            failure: vec![],
        };
        let taken = client.txn(txn).await.map(|r| r.succeeded);
        if !matches!(taken, Ok(true)) {
            let _ = client.lease_revoke(lease).await;
            return taken.map(|_| Turn::Busy);
        }
        let mut keeper = client.clone();
        let id = conf.id.clone();
        let keep = async move {
            // Renewed until the work ends: a keep-alive stream etcd closed is opened again.
            loop {
                let why = keeper.lease_keep_alive(lease, Duration::from_secs(LEASE_TTL as u64 / 3)).await;
                log::warn!("ACME {id}: {why}; keeping the fleet lock alive again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        };
        let claim = Claim { client: client.clone(), prefix: self.settings.prefix.clone(), lease };
        let work = tokio::time::timeout(ORDER_TIMEOUT, self.under_lock(manager, conf, asked, claim));
        let turn = tokio::select! {
            turn = work => turn.unwrap_or_else(|_| Err(format!("the order took longer than {} min", ORDER_TIMEOUT.as_secs() / 60))),
            // `keep` loops for as long as the work runs; this arm is never taken.
            () = keep => Err("the fleet lock's keep-alive ended".into()),
        };
        let _ = client.lease_revoke(lease).await;
        turn
    }

    async fn under_lock(&self, m: &Manager, conf: &Resolved, asked: bool, mut claim: Claim) -> Result<Turn, String> {
        let now = chrono::Utc::now().timestamp();
        let mut client = claim.client.clone();
        // Another instance may have renewed since this one read its files.
        let resp = client.get(self.key("certs", &conf.id), false).await?;
        if let Some(stored) = resp.kvs.first().and_then(|kv| serde_json::from_slice::<Stored>(&kv.value).ok()) {
            if mirror(m, &conf.id, &stored)? {
                (m.on_issued)();
            }
            if let Some((nb, na)) = validity_for(stored.cert.as_bytes(), &conf.domains) {
                if !asked && renew_at(nb, na) > now {
                    return Ok(Turn::Fresh);
                }
            }
        }
        let failures_key = self.key("failures", &conf.id);
        let resp = client.get(failures_key.clone(), false).await?;
        let failure: Failure =
            resp.kvs.first().and_then(|kv| serde_json::from_slice(&kv.value).ok()).unwrap_or_default();
        if failure.count > 0 && !asked {
            // Another instance's clock wrote `at`: never trust it past now.
            let until = failure.at.min(now).saturating_add(backoff(failure.count).as_secs() as i64);
            if until > now {
                return Ok(Turn::Later(until));
            }
        }
        log::info!("ACME {}: ordering for the fleet (lock held by {})", conf.id, self.instance);
        match m.order(conf, Some(&mut claim)).await {
            Ok((cert, key)) => {
                let stored = Stored { cert, key, by: self.instance.clone(), at: now };
                let value = serde_json::to_vec(&stored).map_err(|e| e.to_string())?;
                let txn = TxnRequest {
                    compare: vec![],
                    success: vec![
                        RequestOp::put(self.key("certs", &conf.id), value),
                        RequestOp::delete(failures_key, false),
                    ],
                    failure: vec![],
                };
                client.txn(txn).await.map_err(|e| format!("storing the certificate in etcd: {e}"))?;
                mirror(m, &conf.id, &stored)?;
                Ok(Turn::Issued)
            }
            Err(error) => {
                let next = Failure { count: failure.count.saturating_add(1), at: now, error: error.clone() };
                if let Ok(value) = serde_json::to_vec(&next) {
                    let _ = client.put(failures_key, value).await;
                }
                Err(error)
            }
        }
    }

    fn forget(&self) {
        if let Ok(mut slot) = self.client.try_lock() {
            *slot = None;
        }
    }
}

/// Writes a fleet certificate into the local files when they differ; whether they did.
fn mirror(m: &Manager, id: &str, stored: &Stored) -> Result<bool, String> {
    let (cert_file, key_file) = files(&m.dir, id);
    let same = std::fs::read(&cert_file).is_ok_and(|c| c == stored.cert.as_bytes())
        && std::fs::read(&key_file).is_ok_and(|k| k == stored.key.as_bytes());
    if same {
        return Ok(false);
    }
    write_private(&key_file, stored.key.as_bytes())
        .and_then(|()| write_private(&cert_file, stored.cert.as_bytes()))
        .map_err(|e| format!("cannot store the fleet's certificate: {e}"))?;
    log::info!("ACME {id}: certificate from the fleet (ordered by {}) stored", stored.by);
    Ok(true)
}

/// Follows the fleet's key space for as long as the manager lives: certificates into the local
/// files (then the resources are rebuilt), challenge answers into the data plane's maps,
/// failures into the entries' status. A lost watch is followed by a full read.
pub(super) async fn follow(manager: Weak<Manager>) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let Some(m) = manager.upgrade() else { return };
        let Some(fleet) = m.fleet.as_ref() else { return };
        let prefix = format!("{}/", fleet.settings.prefix);
        let why = match read_then_watch(&m, fleet, &prefix).await {
            Ok(w) => {
                backoff = Duration::from_millis(200);
                w
            }
            Err(e) => e,
        };
        fleet.forget();
        drop(m);
        log::warn!("ACME fleet: {why}; following etcd again in {} ms", backoff.as_millis());
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

async fn read_then_watch(m: &Arc<Manager>, fleet: &Fleet, prefix: &str) -> Result<String, String> {
    let mut client = fleet.client().await?;
    let all = client.get(prefix, true).await?;
    let revision = all.header.as_ref().map_or(0, |h| h.revision);
    // A full read replaces what the watch had built up.
    m.http_tokens.write().clear();
    m.alpn.write().clear();
    let mut stored_any = false;
    for kv in &all.kvs {
        stored_any |= seen(m, prefix, &kv.key, Some(&kv.value));
    }
    if stored_any {
        (m.on_issued)();
    }
    let (_watcher, mut stream) = client.watch(prefix, true, revision + 1).await?;
    loop {
        let resp = match stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return Ok("etcd closed the watch".into()),
            Err(e) => return Ok(format!("etcd watch: {e}")),
        };
        if resp.canceled || resp.compact_revision > 0 {
            return Ok("the watch was cancelled".into());
        }
        let mut stored_any = false;
        for event in &resp.events {
            let Some(kv) = &event.kv else { continue };
            stored_any |= seen(m, prefix, &kv.key, (!event.is_delete()).then_some(&kv.value[..]));
        }
        if stored_any {
            (m.on_issued)();
        }
    }
}

/// Applies one key of the fleet's space (`None`: deleted); whether a certificate was stored.
fn seen(m: &Manager, prefix: &str, key: &[u8], value: Option<&[u8]>) -> bool {
    let key = String::from_utf8_lossy(key);
    let Some(rest) = key.strip_prefix(prefix) else { return false };
    let Some((kind, name)) = rest.split_once('/') else { return false };
    match (kind, value) {
        ("challenges", _) => {
            let Some((challenge, name)) = name.split_once('/') else { return false };
            match (challenge, value) {
                ("http-01", Some(v)) => {
                    m.http_tokens.write().insert(name.to_owned(), String::from_utf8_lossy(v).into_owned());
                }
                ("http-01", None) => {
                    m.http_tokens.write().remove(name);
                }
                ("tls-alpn-01", Some(v)) => {
                    let Ok(digest) = base64::engine::general_purpose::STANDARD.decode(v) else {
                        log::error!("ACME fleet: {key}: not base64; skipped");
                        return false;
                    };
                    match alpn_challenge_cert(name, &digest) {
                        Ok(cert) => {
                            m.alpn.write().insert(name.to_owned(), cert);
                        }
                        Err(e) => log::error!("ACME fleet: TLS-ALPN-01 answer for {name}: {e}"),
                    }
                }
                ("tls-alpn-01", None) => {
                    m.alpn.write().remove(name);
                }
                _ => {}
            }
            HTTP_OPEN.store(!m.http_tokens.read().is_empty(), std::sync::atomic::Ordering::Relaxed);
            false
        }
        ("certs", Some(v)) => match serde_json::from_slice::<Stored>(v) {
            Ok(stored) => {
                let changed = mirror(m, name, &stored).unwrap_or_else(|e| {
                    log::error!("ACME {name}: {e}");
                    false
                });
                if changed {
                    if let Some(e) = m.entries.lock().get(name) {
                        e.stored.notify_one();
                    }
                }
                changed
            }
            Err(e) => {
                log::error!("ACME fleet: {key}: {e}");
                false
            }
        },
        ("failures", v) => {
            let failure: Option<Failure> = v.and_then(|v| serde_json::from_slice(v).ok());
            if let Some(e) = m.entries.lock().get(name) {
                e.status.lock().last_error = failure.map(|f| f.error);
            }
            false
        }
        _ => false,
    }
}
