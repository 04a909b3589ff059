//! Follows etcd (`deployment.config_provider: etcd`) and applies every change to the gateway.
//!
//! A watch from the revision after start-up's read feeds every change through the same snapshot
//! builder and validation as the file. A value that fails validation is logged with its key,
//! field and reason and skipped; the rest applies.
//!
//! When etcd is unreachable the last good snapshot keeps serving; the provider retries with
//! backoff, logs once per state change, and reports its state (`GET /v1/config_status`). A
//! cancelled or compacted watch, or a reconnection, is followed by a full resync.

use std::cell::RefCell;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::etcd::{Client, WatchResponse};
use parking_lot::Mutex;

use crate::config::EtcdSection;
use crate::resources::etcd::{
    connect, parse, read_all, route_id, valid_document, with_id, KeysByList, ProviderStatus, Values,
};
use crate::state::{Followed, Gateway};
use crate::tables::snapshot::{Prints, RouteChange};

/// Runs the provider on a thread of its own for as long as `gateway` lives. `initial` is what the
/// start-up read found (values and revision), when it succeeded.
pub fn watch(gateway: &Arc<Gateway>, settings: EtcdSection, prefix: String, initial: Option<(Values, i64)>) {
    let weak = Arc::downgrade(gateway);
    let spawned = std::thread::Builder::new().name("etcd-watch".into()).spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                log::error!("etcd provider cannot start its runtime: {e}");
                return;
            }
        };
        runtime.block_on(sync_forever(weak, settings, prefix, initial));
    });
    if let Err(e) = spawned {
        log::error!("cannot start the etcd provider: {e}");
    }
}

/// Applies `values` at `revision` to the gateway (the valid part) and records the status.
/// `prints` holds the fingerprints of `values` known so far (see [`Prints`]). Returns the
/// [`Gateway::generation`] of the snapshot published when it holds every value (nothing
/// skipped): the next change to routes only can patch it ([`Followed::clean`]).
pub fn apply(gateway: &Gateway, values: &mut Values, prints: &mut Prints, prefix: &str, revision: i64) -> Option<u64> {
    // Built once, published as built (no second build), with plugin reloads held off meanwhile.
    let started = std::time::Instant::now();
    let guard = gateway.hold_reloads();
    let prints = RefCell::new(prints);
    let build = |d: &serde_json::Value, keys: &KeysByList<'_>| {
        let known = prints.borrow_mut().of_document(d, keys);
        gateway.build_snapshot_with(d, Some(&known))
    };
    let (built, skipped) = valid_document(build, values, prefix, false);
    let built_in = started.elapsed();
    for (key, why) in &skipped {
        log::error!("etcd {}: {why}; skipped", if key.is_empty() { "(resources)" } else { key });
    }
    let clean = match built {
        None => {
            log::error!("etcd revision {revision}: not applied, keeping the last good resources");
            None
        }
        Some((_, snapshot)) => {
            // No copy of the document is kept: a plugin reload reads etcd again.
            let summary = gateway.publish(&guard, snapshot, None, false);
            log::info!(
                "etcd revision {revision} applied in {:.1} ms (built in {:.1} ms): {summary}",
                started.elapsed().as_secs_f64() * 1e3,
                built_in.as_secs_f64() * 1e3
            );
            // (Read under the guard: no other publish can come between.)
            skipped.is_empty().then(|| gateway.generation())
        }
    };
    drop(guard);
    let mut status = gateway.provider_status.lock();
    status.revision = Some(revision);
    status.skipped = skipped.iter().map(|(k, _)| k.clone()).filter(|k| !k.is_empty()).collect();
    if let Some((key, why)) = skipped.first() {
        status.last_error = Some(format!("{key}: {why}"));
    }
    clean
}

/// Applies a change to routes only (`keys`, already folded into `f.values`) as a patch of the
/// snapshot serving, when that is the one built from exactly the values before the change
/// ([`Followed::clean`]); whether it did. Otherwise, or when the patch gives up (an invalid
/// route, a plugin checked together with others), the caller builds the whole set, which names
/// what is wrong.
fn apply_patch(gateway: &Gateway, f: &mut Followed, keys: &[String], prefix: &str, revision: i64) -> bool {
    let started = std::time::Instant::now();
    let guard = gateway.hold_reloads();
    if f.clean.is_none() || f.clean != Some(gateway.generation()) {
        return false;
    }
    let mut ids = Vec::with_capacity(keys.len());
    for key in keys {
        let Some(id) = route_id(prefix, key) else { return false };
        if let Some(value) = f.values.get_mut(key) {
            if with_id("routes", id, value).is_err() {
                return false;
            }
        }
        ids.push(id);
    }
    let changes: Vec<RouteChange<'_>> =
        keys.iter().zip(&ids).map(|(key, id)| RouteChange { id, value: f.values.get(key) }).collect();
    let Some(snapshot) = gateway.patch_routes(&changes, false) else { return false };
    drop(changes);
    let built_in = started.elapsed();
    let summary = gateway.publish(&guard, snapshot, None, false);
    f.clean = Some(gateway.generation());
    drop(guard);
    log::info!(
        "etcd revision {revision} applied in {:.1} ms (a patch of {} route(s), built in {:.1} ms): {summary}",
        started.elapsed().as_secs_f64() * 1e3,
        keys.len(),
        built_in.as_secs_f64() * 1e3
    );
    gateway.provider_status.lock().revision = Some(revision);
    true
}

fn set_connected(status: &Mutex<ProviderStatus>, connected: bool, error: Option<String>) {
    let mut s = status.lock();
    if s.connected != connected {
        match (&error, connected) {
            (_, true) => log::info!("etcd: connected"),
            (Some(e), false) => log::warn!("etcd: {e}; serving the last good resources, retrying"),
            (None, false) => log::warn!("etcd: disconnected; serving the last good resources, retrying"),
        }
    }
    s.connected = connected;
    if error.is_some() {
        s.last_error = error;
    }
}

/// Read, apply, watch; on any failure, back off and start again with a full read.
async fn sync_forever(gateway: Weak<Gateway>, settings: EtcdSection, prefix: String, initial: Option<(Values, i64)>) {
    let mut backoff = Duration::from_millis(200);
    let mut known: Option<(Values, i64)> = initial;
    loop {
        let Some(gw) = gateway.upgrade() else { return };
        let outcome = match known.take() {
            // Start-up already read and applied this revision: only connect for the watch.
            Some((values, revision)) => connect(&settings).await.map(|c| (c, values, revision, None)),
            None => read_all(&settings, &prefix).await.map(|(client, mut values, revision)| {
                let clean = apply(&gw, &mut values, &mut Prints::default(), &prefix, revision);
                (client, values, revision, clean)
            }),
        }
        .map(|(client, values, revision, clean)| {
            (client, Followed { values, prints: Prints::default(), revision, clean })
        });
        drop(gw);
        let (client, followed) = match outcome {
            Ok(ok) => ok,
            Err(e) => {
                if let Some(gw) = gateway.upgrade() {
                    set_connected(&gw.provider_status, false, Some(e));
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        if let Some(gw) = gateway.upgrade() {
            set_connected(&gw.provider_status, true, None);
        }
        backoff = Duration::from_millis(200);
        let why = follow(&gateway, client, followed, &prefix).await;
        if let Some(gw) = gateway.upgrade() {
            set_connected(&gw.provider_status, false, Some(why));
        }
        tokio::time::sleep(backoff).await;
    }
}

/// Watches from `revision + 1`, applying each change; returns why the watch ended. The values
/// followed live in [`Gateway::followed`] meanwhile, where the Admin API validates its writes
/// against them (rather than reading the whole set again per write).
async fn follow(gateway: &Weak<Gateway>, mut client: Client, followed: Followed, prefix: &str) -> String {
    let revision = followed.revision;
    let (_watcher, mut stream) = match client.watch(format!("{prefix}/"), true, revision + 1).await {
        Ok(pair) => pair,
        Err(e) => return format!("etcd watch: {e}"),
    };
    let Some(rebuild) = gateway.upgrade().map(|g| g.rebuild_requested.clone()) else { return "shutting down".into() };
    if let Some(gw) = gateway.upgrade() {
        *gw.followed.lock() = Some(followed);
        gw.followed_revision.send_replace(revision);
    }
    let mut at = revision;
    let why = loop {
        let message = tokio::select! {
            m = stream.message() => m,
            // DNS answers changed under the resources in force: build them again.
            () = rebuild.notified() => {
                let Some(gw) = gateway.upgrade() else { break "shutting down".into() };
                gw.with_followed(None, |followed| {
                    if let Some(f) = followed.as_mut() {
                        f.clean = apply(&gw, &mut f.values, &mut f.prints, prefix, at);
                    }
                });
                continue;
            }
        };
        let mut next = match message {
            Ok(Some(r)) => Some(r),
            Ok(None) => break "etcd closed the watch".into(),
            Err(e) => break format!("etcd watch: {e}"),
        };
        // Fold every response already received into one rebuild: a burst of writes costs one
        // snapshot build, not one per write.
        let mut received = Vec::new();
        let ended = loop {
            let Some(resp) = next.take() else { break None };
            if resp.canceled || resp.compact_revision > 0 {
                // Compacted past our revision (or cancelled): read everything again.
                break Some(format!("etcd watch cancelled (compacted at {}); resyncing", resp.compact_revision));
            }
            received.push(resp);
            // A zero timeout polls the stream once: what is buffered, never a wait.
            match tokio::time::timeout(Duration::ZERO, stream.message()).await {
                Ok(Ok(Some(r))) => next = Some(r),
                Ok(Ok(None)) => break Some("etcd closed the watch".into()),
                Ok(Err(e)) => break Some(format!("etcd watch: {e}")),
                Err(_) => {}
            }
        };
        if let Some(why) = ended {
            break why;
        }
        let Some(gw) = gateway.upgrade() else { break "shutting down".into() };
        // The store's revision as the responses say (what `/v1/config_status` shows); the set
        // is as of its last event only: a response can name a revision whose events come later
        // (the watch's first one does), and Admin API writes are judged on what is folded in.
        for resp in &received {
            at = resp.header.as_ref().map_or(at, |h| h.revision);
        }
        let applied = gw.with_followed(None, |followed| {
            let f = followed.as_mut()?;
            let mut changed = Vec::new();
            for resp in &received {
                fold(&mut f.values, &mut f.prints, resp, &mut changed);
                let events = resp.events.iter().filter_map(|e| e.kv.as_ref()).map(|kv| kv.mod_revision);
                f.revision = events.fold(f.revision, i64::max);
            }
            changed.sort_unstable();
            changed.dedup();
            if !changed.is_empty() {
                if !apply_patch(&gw, f, &changed, prefix, at) {
                    f.clean = apply(&gw, &mut f.values, &mut f.prints, prefix, at);
                }
            } else {
                gw.provider_status.lock().revision = Some(at);
            }
            Some(f.revision)
        });
        let Some(Some(revision)) = applied else { break "the followed set is gone".into() };
        gw.followed_revision.send_replace(revision);
    };
    // No longer followed: the Admin API reads the set from etcd until the watch is back.
    if let Some(gw) = gateway.upgrade() {
        *gw.followed.lock() = None;
        gw.followed_revision.send_replace(0);
    }
    why
}

/// Applies the events of one watch response to `values` (forgetting the fingerprints of the
/// values it changes), adding the keys whose value changed (set or removed) to `changed`.
fn fold(values: &mut Values, prints: &mut Prints, resp: &WatchResponse, changed: &mut Vec<String>) {
    for event in &resp.events {
        let Some(kv) = &event.kv else { continue };
        let key = String::from_utf8_lossy(&kv.key).into_owned();
        prints.forget(&key);
        let removed = match event.is_delete() {
            false => match parse(&kv.value) {
                Ok(v) => {
                    values.insert(key.clone(), v);
                    changed.push(key);
                    continue;
                }
                Err(e) => {
                    log::error!("etcd {key}: {e}; skipped");
                    values.remove(&key).is_some()
                }
            },
            true => values.remove(&key).is_some(),
        };
        if removed {
            changed.push(key);
        }
    }
}
