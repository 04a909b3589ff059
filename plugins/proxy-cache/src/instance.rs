//! The request phases of one proxy-cache configuration.
//!
//! - `access`: `PURGE` removes the key's entries (200, or 404 when there was none). A request
//!   the cache may serve looks its key up: a fresh entry whose key and `Vary` values match is
//!   the answer (`HIT`, with `Age`), from memory at once or after reading its file off the
//!   worker; otherwise the request becomes the key's filler (`MISS`, `EXPIRED`, `STALE`), or
//!   waits for the filler already fetching it and answers from what it stored.
//! - `header_filter`: the filler's response is checked ([`crate::policy`]); a storable one has
//!   its head kept and its body tapped.
//! - `body_filter`: each chunk is kept as it streams to the client (never held back); at the
//!   end the entry is stored and the waiters answered. A body over the cap, an upstream that
//!   fails mid-body or a client that leaves ends the fill without storing.

use std::sync::Arc;

use weir_plugin::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use weir_plugin::http::{Method, StatusCode};
use weir_plugin::{BodyFilter, Bytes, Flow, Late, PluginInstance, PluginResponse, RequestCtx, ResponseHead};

use crate::collapse::{Fill, FillGuard, State, LOCK_TIMEOUT};
use crate::entry::{combined, Entry};
use crate::key::{self, any_set, Class, Item, KeySpec};
use crate::lru::Digest;
use crate::policy::{self, Directives};
use crate::zone::{count, Found, Zone};

/// APISIX's response header.
pub const STATUS_HEADER: HeaderName = HeaderName::from_static("apisix-cache-status");

/// Request headers a filler does not send upstream: the stored response must be the whole,
/// unconditional one (nginx does the same for cached requests).
const CONDITIONAL: [HeaderName; 6] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
    header::RANGE,
];

/// `Apisix-Cache-Status` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Miss,
    Hit,
    Expired,
    Stale,
    Bypass,
}

impl Status {
    fn value(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Status::Miss => "MISS",
            Status::Hit => "HIT",
            Status::Expired => "EXPIRED",
            Status::Stale => "STALE",
            Status::Bypass => "BYPASS",
        })
    }
}

/// One configuration (see the module documentation).
pub struct Cache {
    /// `None` in validation builds, which never serve.
    pub zone: Option<Arc<Zone>>,
    pub key: KeySpec,
    pub get: bool,
    pub head: bool,
    pub post: bool,
    pub statuses: Vec<u16>,
    pub bypass: Vec<Item>,
    pub no_cache: Vec<Item>,
    pub hide: bool,
    pub cache_control: bool,
    /// The memory strategy (APISIX's memory handler differs from nginx's disk cache in two
    /// reported statuses and in storing bypassed responses).
    pub memory: bool,
    pub ttl_ms: u64,
    pub max_body: u64,
}

/// The filler's state, from `access` to the end of the body.
struct Filling {
    zone: Arc<Zone>,
    digest: Digest,
    key: Box<[u8]>,
    /// Waiters to answer; none for a bypassed request that refreshes the entry.
    guard: Option<FillGuard>,
    /// The key names the consumer: an authenticated response is the consumer's own.
    isolated: bool,
    capture: Option<Capture>,
}

/// A storable response on its way to the client.
struct Capture {
    status: StatusCode,
    headers: HeaderMap,
    vary: Vec<(HeaderName, Option<HeaderValue>)>,
    stored_at_ms: u64,
    expires_at_ms: u64,
    chunks: Vec<Bytes>,
    size: u64,
}

impl Filling {
    /// The fill ends without an entry; waiters fetch for themselves.
    fn uncacheable(mut self) {
        if let Some(g) = self.guard.take() {
            g.uncacheable();
        }
    }
}

/// What a lookup decided.
enum Decision {
    Hit(PluginResponse),
    Fetch(Status),
}

impl Cache {
    fn allows(&self, m: &Method) -> bool {
        match *m {
            Method::GET => self.get,
            Method::HEAD => self.head,
            Method::POST => self.post,
            _ => false,
        }
    }

    /// Goes to the upstream with `status` reported.
    fn pass(&self, zone: &Zone, ctx: &mut RequestCtx, status: Status) {
        count(match status {
            Status::Miss => &zone.stats.miss,
            Status::Expired => &zone.stats.expired,
            Status::Stale => &zone.stats.stale,
            Status::Bypass => &zone.stats.bypass,
            Status::Hit => &zone.stats.hit,
        });
        ctx.response_headers.push((STATUS_HEADER, status.value()));
    }

    /// The answer from `e` (conditional requests may get a 304).
    fn hit(&self, zone: &Zone, e: &Entry, ctx: &RequestCtx, now_ms: u64) -> PluginResponse {
        count(&zone.stats.hit);
        let mut headers = e.headers.clone();
        if self.hide {
            headers.remove(header::CACHE_CONTROL);
            headers.remove(header::EXPIRES);
        }
        headers.insert(header::AGE, HeaderValue::from(e.age_secs(now_ms)));
        headers.insert(STATUS_HEADER, Status::Hit.value());
        if e.status == StatusCode::OK && not_modified(&ctx.headers, &e.headers) {
            headers.remove(header::CONTENT_LENGTH);
            return PluginResponse { status: StatusCode::NOT_MODIFIED, headers, body: Bytes::new() };
        }
        PluginResponse { status: e.status, headers, body: e.body.clone() }
    }

    /// Serve `entry`, or fetch and say why.
    fn decide(
        &self,
        zone: &Zone,
        ctx: &RequestCtx,
        key: &[u8],
        digest: &Digest,
        entry: Option<Arc<Entry>>,
        cc: Option<&Directives>,
    ) -> Decision {
        let now = crate::now_ms();
        match entry {
            Some(e) if *e.key != *key => {
                // Another key with this digest: never served, and replaced by this one's.
                zone.discard(digest);
                Decision::Fetch(Status::Miss)
            }
            Some(e) if !e.vary_matches(&ctx.headers) => Decision::Fetch(Status::Miss),
            Some(e) if !e.is_fresh(now) => Decision::Fetch(Status::Expired),
            Some(e) if cc.is_some_and(|cc| too_old_for(cc, &e, now)) => Decision::Fetch(Status::Stale),
            Some(e) => Decision::Hit(self.hit(zone, &e, ctx, now)),
            None => Decision::Fetch(Status::Miss),
        }
    }

    /// Fetches as the key's filler, or waits for the filler already fetching.
    fn fetch<'a>(
        &'a self,
        zone: &Arc<Zone>,
        ctx: &'a mut RequestCtx,
        key: Box<[u8]>,
        digest: Digest,
        status: Status,
    ) -> Flow<'a> {
        if self.cache_control && status == Status::Miss && policy::directives(&ctx.headers).only_if_cached {
            self.pass(zone, ctx, Status::Miss);
            return Flow::Respond(PluginResponse {
                status: StatusCode::GATEWAY_TIMEOUT,
                headers: HeaderMap::new(),
                body: Bytes::new(),
            });
        }
        if ctx.method == Method::HEAD {
            // A HEAD has no body to store; it is answered from what a GET stores.
            self.pass(zone, ctx, status);
            return Flow::Continue;
        }
        match zone.fills.begin(digest) {
            Ok(guard) => {
                self.become_filler(zone, ctx, key, digest, Some(guard), status);
                Flow::Continue
            }
            Err(fill) => {
                let zone = zone.clone();
                Flow::wait(async move { self.wait_for(zone, ctx, key, digest, fill, status).await })
            }
        }
    }

    fn become_filler(
        &self,
        zone: &Arc<Zone>,
        ctx: &mut RequestCtx,
        key: Box<[u8]>,
        digest: Digest,
        guard: Option<FillGuard>,
        status: Status,
    ) {
        for h in &CONDITIONAL {
            ctx.headers.remove(h);
        }
        let isolated = self.key.isolates(ctx);
        ctx.slots.insert(Filling { zone: zone.clone(), digest, key, guard, isolated, capture: None });
        self.pass(zone, ctx, status);
    }

    /// Waits for another request's fill of the key (bounded by [`LOCK_TIMEOUT`]).
    async fn wait_for(
        &self,
        zone: Arc<Zone>,
        ctx: &mut RequestCtx,
        key: Box<[u8]>,
        digest: Digest,
        mut fill: Arc<Fill>,
        status: Status,
    ) -> Flow<'static> {
        let deadline = tokio::time::Instant::now() + LOCK_TIMEOUT;
        loop {
            match fill.wait(deadline).await {
                State::Stored(e) => {
                    let now = crate::now_ms();
                    if *e.key == *key && e.vary_matches(&ctx.headers) && e.is_fresh(now) {
                        count(&zone.stats.collapsed);
                        return Flow::Respond(self.hit(&zone, &e, ctx, now));
                    }
                    self.pass(&zone, ctx, status);
                    return Flow::Continue;
                }
                // Not cacheable, or the wait ran out: fetch without storing, as nginx does.
                State::Uncacheable | State::Pending => {
                    self.pass(&zone, ctx, status);
                    return Flow::Continue;
                }
                State::Abandoned => match zone.fills.begin(digest) {
                    Ok(guard) => {
                        self.become_filler(&zone, ctx, key, digest, Some(guard), status);
                        return Flow::Continue;
                    }
                    Err(next) => fill = next,
                },
            }
        }
    }

    fn purge(&self, zone: &Zone, ctx: &RequestCtx) -> PluginResponse {
        let mut found = false;
        for class in [Class::Get, Class::Post] {
            found |= zone.purge(&key::digest(&self.key.render(ctx, class)));
        }
        let status = if found { StatusCode::OK } else { StatusCode::NOT_FOUND };
        PluginResponse { status, headers: HeaderMap::new(), body: Bytes::new() }
    }

    /// Removes `Cache-Control` and `Expires` from a response when `hide_cache_headers`.
    fn hide_headers(&self, resp: &mut ResponseHead) {
        if self.hide {
            resp.headers.remove(header::CACHE_CONTROL);
            resp.headers.remove(header::EXPIRES);
        }
    }
}

/// Whether a `cache_control` request wants a fresher entry than `e` (`max-age`, `min-fresh`).
fn too_old_for(cc: &Directives, e: &Entry, now_ms: u64) -> bool {
    let age = now_ms.saturating_sub(e.stored_at_ms);
    let left = e.expires_at_ms.saturating_sub(now_ms);
    cc.max_age.is_some_and(|s| age > s.saturating_mul(1000))
        || cc.min_fresh.is_some_and(|s| left < s.saturating_mul(1000))
}

/// nginx's `not_modified` filter on a cached 200: `If-None-Match` against `ETag` (weak
/// comparison, `*`), else `If-Modified-Since` equal to `Last-Modified` (nginx's `exact`).
fn not_modified(req: &HeaderMap, stored: &HeaderMap) -> bool {
    if let Some(inm) = req.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) {
        let Some(etag) = stored.get(header::ETAG).and_then(|v| v.to_str().ok()) else { return false };
        let bare = |t: &str| t.trim().trim_start_matches("W/").to_owned();
        return inm.trim() == "*" || inm.split(',').any(|t| bare(t) == bare(etag));
    }
    match (req.get(header::IF_MODIFIED_SINCE), stored.get(header::LAST_MODIFIED)) {
        (Some(ims), Some(lm)) => ims == lm,
        _ => false,
    }
}

/// The response headers an entry keeps: not the framing, not what is made per response
/// (`Age`, the cache status, rate-limit counters of the request that stored it). Values are
/// copied: the upstream's are slices of its read buffer.
fn stored_headers(headers: &HeaderMap) -> HeaderMap {
    let mut kept = HeaderMap::with_capacity(headers.len());
    for (k, v) in headers {
        let name = k.as_str();
        let skip = *k == header::CONTENT_LENGTH
            || *k == header::TRANSFER_ENCODING
            || *k == header::AGE
            || *k == header::SET_COOKIE
            || *k == STATUS_HEADER
            || name.contains("ratelimit");
        if skip {
            continue;
        }
        if let Ok(mut copy) = HeaderValue::from_bytes(v.as_bytes()) {
            copy.set_sensitive(v.is_sensitive());
            kept.append(k.clone(), copy);
        }
    }
    kept
}

impl PluginInstance for Cache {
    /// The header filter reads request headers (`Vary` values, `no_cache` variables).
    fn late(&self) -> Late {
        Late { headers: true, header_filter: true, log: false }
    }

    fn access<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        let Some(zone) = &self.zone else { return Flow::Continue };
        if ctx.method.as_str() == "PURGE" {
            return Flow::Respond(self.purge(zone, ctx));
        }
        let Some(class) = Class::of(&ctx.method).filter(|_| self.allows(&ctx.method)) else {
            // Not a cached method: APISIX's memory handler says MISS, nginx's cache BYPASS.
            self.pass(zone, ctx, if self.memory { Status::Miss } else { Status::Bypass });
            return Flow::Continue;
        };
        let cc = self.cache_control.then(|| policy::directives(&ctx.headers));
        let client_bypass = cc.as_ref().is_some_and(|cc| cc.no_cache || cc.no_store);
        if client_bypass || any_set(&self.bypass, ctx) {
            if !client_bypass && !self.memory && ctx.method != Method::HEAD {
                // nginx's proxy_cache_bypass: not served from the cache, but the fresh
                // response replaces the entry.
                let key = self.key.render(ctx, class);
                let digest = key::digest(&key);
                self.become_filler(zone, ctx, key, digest, None, Status::Bypass);
            } else {
                self.pass(zone, ctx, Status::Bypass);
            }
            return Flow::Continue;
        }
        let key = self.key.render(ctx, class);
        let digest = key::digest(&key);
        match zone.lookup(&digest) {
            Found::OnDisk { expires_at_ms } if expires_at_ms > crate::now_ms() => {
                let zone = zone.clone();
                Flow::wait(async move {
                    let entry = zone.read(digest).await;
                    match self.decide(&zone, ctx, &key, &digest, entry, cc.as_ref()) {
                        Decision::Hit(r) => Flow::Respond(r),
                        Decision::Fetch(status) => match self.fetch(&zone, ctx, key, digest, status) {
                            Flow::Wait(f) => f.await,
                            Flow::Continue => Flow::Continue,
                            Flow::Respond(r) => Flow::Respond(r),
                        },
                    }
                })
            }
            Found::OnDisk { .. } => self.fetch(zone, ctx, key, digest, Status::Expired),
            Found::Entry(e) => match self.decide(zone, ctx, &key, &digest, Some(e), cc.as_ref()) {
                Decision::Hit(r) => Flow::Respond(r),
                Decision::Fetch(status) => self.fetch(zone, ctx, key, digest, status),
            },
            Found::Nothing => self.fetch(zone, ctx, key, digest, Status::Miss),
        }
    }

    fn header_filter(&self, ctx: &mut RequestCtx, resp: &mut ResponseHead) -> BodyFilter {
        let Some(mut filling) = ctx.slots.remove::<Filling>() else {
            self.hide_headers(resp);
            return BodyFilter::Skip;
        };
        let now = crate::now_ms();
        let rules = policy::Rules {
            statuses: &self.statuses,
            honour_validity: self.cache_control,
            ttl_ms: self.ttl_ms,
            max_body: self.max_body,
        };
        let response = policy::Response {
            status: resp.status.as_u16(),
            headers: &resp.headers,
            unaccounted_authorization: ctx.headers.contains_key(header::AUTHORIZATION) && !filling.isolated,
            no_cache: any_set(&self.no_cache, ctx),
        };
        match policy::storable(&rules, &response, now) {
            Err(why) => {
                log::debug!("proxy-cache: response of {} not stored: {why:?}", ctx.path);
                filling.uncacheable();
                self.hide_headers(resp);
                BodyFilter::Skip
            }
            Ok((ttl_ms, vary)) => {
                let vary = vary.into_iter().map(|n| (combined(&ctx.headers, &n), n)).map(|(v, n)| (n, v)).collect();
                filling.capture = Some(Capture {
                    status: resp.status,
                    headers: stored_headers(&resp.headers),
                    vary,
                    stored_at_ms: now,
                    expires_at_ms: now.saturating_add(ttl_ms),
                    chunks: Vec::new(),
                    size: 0,
                });
                ctx.slots.insert(filling);
                self.hide_headers(resp);
                BodyFilter::Observe
            }
        }
    }

    fn body_filter(&self, ctx: &mut RequestCtx, chunk: &mut Bytes, eof: bool) {
        let Some(filling) = ctx.slots.get_mut::<Filling>() else { return };
        let Some(capture) = filling.capture.as_mut() else { return };
        if !chunk.is_empty() {
            capture.size += chunk.len() as u64;
            if capture.size > self.max_body {
                if let Some(f) = ctx.slots.remove::<Filling>() {
                    f.uncacheable();
                }
                return;
            }
            capture.chunks.push(chunk.clone());
        }
        if !eof {
            return;
        }
        let Some(mut f) = ctx.slots.remove::<Filling>() else { return };
        let Some(c) = f.capture.take() else { return };
        // One exact-size copy: the chunks are slices of the upstream's read buffers, which a
        // small entry would otherwise keep alive whole (and the zone's bound would not see).
        let mut all = Vec::with_capacity(c.size as usize);
        for part in &c.chunks {
            all.extend_from_slice(part);
        }
        let body = Bytes::from(all);
        let entry = Arc::new(Entry {
            key: std::mem::take(&mut f.key),
            status: c.status,
            headers: c.headers,
            body,
            stored_at_ms: c.stored_at_ms,
            expires_at_ms: c.expires_at_ms,
            vary: c.vary,
        });
        f.zone.store(f.digest, entry.clone());
        if let Some(g) = f.guard.take() {
            g.stored(entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditional_hits_compare_etags_weakly_and_dates_exactly() {
        let mut stored = HeaderMap::new();
        stored.insert(header::ETAG, HeaderValue::from_static("W/\"v1\""));
        stored.insert(header::LAST_MODIFIED, HeaderValue::from_static("Tue, 14 Nov 2023 22:13:20 GMT"));
        let req = |k: HeaderName, v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(k, HeaderValue::from_static(v));
            h
        };
        assert!(not_modified(&req(header::IF_NONE_MATCH, "\"v0\", \"v1\""), &stored));
        assert!(!not_modified(&req(header::IF_NONE_MATCH, "\"v2\""), &stored));
        assert!(not_modified(&req(header::IF_NONE_MATCH, "*"), &stored));
        assert!(not_modified(&req(header::IF_MODIFIED_SINCE, "Tue, 14 Nov 2023 22:13:20 GMT"), &stored));
        assert!(!not_modified(&req(header::IF_MODIFIED_SINCE, "Tue, 14 Nov 2023 22:13:21 GMT"), &stored));
        assert!(!not_modified(&HeaderMap::new(), &stored));
    }

    #[test]
    fn per_response_headers_are_not_stored() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("content-length", "3"),
            ("age", "9"),
            ("apisix-cache-status", "MISS"),
            ("x-ratelimit-remaining", "1"),
            ("etag", "\"a\""),
        ] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let kept = stored_headers(&h);
        assert_eq!(kept.len(), 1);
        assert!(kept.contains_key(header::ETAG));
    }
}
