//! `short-url`: the batch short-URL service (`POST /short/v1/urls`, up to 100 URLs a call) and
//! its redirect side, as one plugin attached to routes (`action: create` / `action: resolve`).
//!
//! Storage is per instance (`plugin_attr.short-url.storage`): SQLite under the prefix by default,
//! or PostgreSQL shared by a cluster. Behaviour that the metadata controls (`short_base`,
//! `redirect_status`, `max_valid_day`, `default_valid_day`) is shared through `plugin_metadata`.

pub mod cache;
pub mod envelope;
pub mod geoip;
pub mod manage;
pub mod qr;
pub mod store;
pub mod validate;
pub mod visits;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::RwLock;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use weir_plugin::http::{header, HeaderValue, StatusCode};
use weir_plugin::{
    register_plugin, schema_of, BuildContext, ControlEndpoint, ControlResponse, Flow, InitEnv, Late, Plugin,
    PluginInstance, PluginResponse, RequestCtx,
};

use cache::Cache;
use envelope::{item_err, item_fail, item_ok, request_error, respond};
use store::{CodeGen, Connector, RandomCodes, Store, StoreError, Stored};

/// What a route with this plugin does.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    // Serve `POST /short/v1/urls` (batch creation).
    #[default]
    Create,
    // Serve redirects under the short base path, and QR codes at `<code>/qr`.
    Resolve,
    // Serve the management API: `GET /short/v1/urls`, `GET|PATCH|DELETE /short/v1/urls/{code}`,
    // `GET /short/v1/urls/{code}/visits`.
    Manage,
}

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// `create` (default), `resolve` or `manage`.
    #[serde(default)]
    pub action: Action,
    /// `create` and `manage` only: refuse (403) a request for which no authentication plugin
    /// identified a consumer, instead of serving it as one of no owner (which sees every link).
    /// For routes whose authentication may let a request through without a consumer
    /// (`forward-auth`, `openid-connect`, a misplaced plugin). Default false.
    #[serde(default)]
    pub require_consumer: bool,
}

/// Plugin metadata (shared by a cluster).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Base URL short links are built on (default `http://127.0.0.1:9080/s`).
    #[serde(default)]
    #[schemars(regex(pattern = "^https?://"))]
    pub short_base: Option<String>,
    /// Status of redirects: 301, 302 (default), 307 or 308.
    #[serde(default)]
    #[schemars(extend("enum" = [301, 302, 307, 308]))]
    pub redirect_status: Option<u16>,
    /// Largest accepted `valid_day` (default 3650).
    #[serde(default)]
    #[schemars(range(min = 1, max = 36500))]
    pub max_valid_day: Option<u32>,
    /// `valid_day` of entries without one (default: never expires).
    #[serde(default)]
    #[schemars(range(min = 1, max = 36500))]
    pub default_valid_day: Option<u32>,
    /// More bases links can be shown on: an entry's `domain` names the host of one of them (or of
    /// `short_base`).
    #[serde(default)]
    pub short_bases: Vec<String>,
    /// Consumers that see, change and delete every link (also those of no owner).
    #[serde(default)]
    pub admin_consumers: Vec<String>,
    /// Whether visits by bots do not count against `max_visits` (default false).
    #[serde(default)]
    pub max_visits_exclude_bots: bool,
}

/// Storage backends.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(tag = "backend", rename_all = "snake_case", deny_unknown_fields)]
pub enum Storage {
    /// Embedded SQLite file (default `<prefix>/data/short-url.db`).
    Sqlite {
        /// Database file.
        #[serde(default)]
        path: Option<String>,
    },
    /// PostgreSQL shared by several gateway instances.
    Postgres {
        /// Connection URL, e.g. `postgres://weir:secret@db:5432/weir`.
        url: String,
        /// Reader connections (default 4).
        #[serde(default)]
        #[schemars(range(min = 1, max = 64))]
        readers: Option<u32>,
    },
}

impl Default for Storage {
    fn default() -> Self {
        Storage::Sqlite { path: None }
    }
}

/// `plugin_attr.short-url` in config.yaml.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Attr {
    /// Where codes are stored.
    #[serde(default)]
    pub storage: Storage,
    /// Visit recording.
    #[serde(default)]
    pub visits: VisitsAttr,
    /// A MaxMind DB file (GeoLite2 or GeoIP2, Country or City; relative paths are under the
    /// prefix) giving each visit its country. Without it, visits carry no country.
    #[serde(default)]
    #[schemars(length(min = 1, max = 4096))]
    pub geoip_database: Option<String>,
}

/// `plugin_attr.short-url.visits`.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VisitsAttr {
    /// Record visits (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Visits buffered at most; more are dropped and counted (default 10000).
    #[serde(default = "default_buffer")]
    #[schemars(range(min = 1, max = 10_000_000))]
    pub buffer_size: u32,
    /// Longest time a visit waits in the buffer, in seconds (default 1).
    #[serde(default = "default_flush")]
    #[schemars(range(min = 0.01, max = 4.0))]
    pub flush_interval: f64,
    /// Distinct counts (code, day, user-agent class, referer host) written in one transaction at
    /// most; visits to one code on one day from one class and referer fold into one (default 1000).
    #[serde(default = "default_batch")]
    #[schemars(range(min = 1, max = 100_000))]
    pub batch_size: u32,
    /// Seconds between two salts of the client IP hash (default 86400).
    #[serde(default = "default_salt")]
    #[schemars(range(min = 60))]
    pub salt_rotate_secs: u32,
    /// Visit rows kept per code: the page of recent visits reaches back this far at least (a
    /// code holds at most about twice as many between prunes); counts and the per-day series
    /// stay exact (default 1000).
    #[serde(default = "default_keep_recent")]
    #[schemars(range(min = 20, max = 1_000_000))]
    pub keep_recent: u32,
}

fn yes() -> bool {
    true
}
fn default_buffer() -> u32 {
    10_000
}
fn default_flush() -> f64 {
    1.0
}
fn default_batch() -> u32 {
    1000
}
fn default_salt() -> u32 {
    86_400
}
fn default_keep_recent() -> u32 {
    store::links::DEFAULT_KEEP_RECENT as u32
}

impl Default for VisitsAttr {
    fn default() -> Self {
        VisitsAttr {
            enabled: true,
            buffer_size: default_buffer(),
            flush_interval: default_flush(),
            batch_size: default_batch(),
            salt_rotate_secs: default_salt(),
            keep_recent: default_keep_recent(),
        }
    }
}

/// Default `short_base`.
pub const DEFAULT_SHORT_BASE: &str = "http://127.0.0.1:9080/s";
/// Largest request body.
pub const MAX_BODY: usize = 1 << 20;
/// Most entries per request.
pub const MAX_ENTRIES: usize = 100;
/// Expired codes are kept (answering 410) this long before the sweep deletes them (then 404).
pub const EXPIRED_GRACE_SECS: i64 = 7 * 86_400;

struct Shared {
    store: RwLock<Option<(Storage, PathBuf, Arc<Store>)>>,
    visits: RwLock<Option<(VisitsAttr, Arc<visits::Sink>)>>,
    geoip: RwLock<Option<Arc<geoip::GeoIp>>>,
    cache: Cache,
    codes: Arc<dyn CodeGen>,
    sweeper: OnceLock<()>,
}

impl Shared {
    fn store(&self) -> Option<Arc<Store>> {
        self.store.read().as_ref().map(|(_, _, s)| s.clone())
    }
    fn visits(&self) -> Option<Arc<visits::Sink>> {
        self.visits.read().as_ref().map(|(_, s)| s.clone())
    }
}

/// The plugin.
pub struct ShortUrl {
    shared: Arc<Shared>,
}

impl Default for ShortUrl {
    fn default() -> Self {
        Self::with_codes(Arc::new(RandomCodes))
    }
}

impl ShortUrl {
    /// A plugin drawing codes from `codes` (tests inject collisions).
    pub fn with_codes(codes: Arc<dyn CodeGen>) -> Self {
        ShortUrl {
            shared: Arc::new(Shared {
                store: RwLock::new(None),
                visits: RwLock::new(None),
                geoip: RwLock::new(None),
                cache: Cache::new(100_000),
                codes,
                sweeper: OnceLock::new(),
            }),
        }
    }
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

struct Meta {
    short_base: String,
    base_urls: Vec<url::Url>,
    redirect_status: StatusCode,
    max_valid_day: u32,
    default_valid_day: Option<u32>,
    day_secs: i64,
    /// `domain` values (host[:port], lower case) and their bases; the first is `short_base`'s.
    bases: Vec<(String, String)>,
    domains: Vec<String>,
    admins: Vec<String>,
    exclude_bots: bool,
}

/// `host[:port]` of a base URL, lower case.
fn authority(u: &url::Url) -> String {
    let host = u.host_str().unwrap_or("").to_ascii_lowercase();
    match u.port() {
        Some(p) => format!("{host}:{p}"),
        None => host,
    }
}

/// Seconds in a `valid_day` day: 86400, unless `WEIR_SHORT_URL_DAY_SECS` is set. That variable
/// exists for tests (to watch codes expire in seconds) and should never be set in production.
fn day_secs() -> i64 {
    std::env::var("WEIR_SHORT_URL_DAY_SECS")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|d| *d > 0)
        .unwrap_or(86_400)
}

impl Meta {
    fn from(metadata: Option<&Value>) -> Result<Meta, String> {
        let m: Metadata = match metadata {
            Some(v) => weir_plugin::parse_conf(v)?,
            None => Metadata {
                short_base: None,
                redirect_status: None,
                max_valid_day: None,
                default_valid_day: None,
                short_bases: Vec::new(),
                admin_consumers: Vec::new(),
                max_visits_exclude_bots: false,
            },
        };
        let short_base = m.short_base.unwrap_or_else(|| DEFAULT_SHORT_BASE.to_owned()).trim_end_matches('/').to_owned();
        let parsed = url::Url::parse(&short_base).map_err(|e| format!("short_base: {e}"))?;
        let mut bases = vec![(authority(&parsed), short_base.clone())];
        let mut base_urls = vec![parsed];
        for (i, b) in m.short_bases.iter().enumerate() {
            let b = b.trim_end_matches('/');
            let u = url::Url::parse(b).map_err(|e| format!("short_bases[{i}]: {e}"))?;
            if (u.scheme() != "http" && u.scheme() != "https") || u.host_str().is_none() {
                return Err(format!("short_bases[{i}]: `{b}` is not an http(s) URL with a host"));
            }
            bases.push((authority(&u), b.to_owned()));
            base_urls.push(u);
        }
        let domains = bases.iter().map(|(d, _)| d.clone()).collect();
        let max_valid_day = m.max_valid_day.unwrap_or(3650);
        if m.default_valid_day.is_some_and(|d| d > max_valid_day) {
            return Err("default_valid_day: larger than max_valid_day".into());
        }
        Ok(Meta {
            short_base,
            base_urls,
            redirect_status: StatusCode::from_u16(m.redirect_status.unwrap_or(302)).map_err(|e| e.to_string())?,
            max_valid_day,
            default_valid_day: m.default_valid_day,
            day_secs: day_secs(),
            bases,
            domains,
            admins: m.admin_consumers,
            exclude_bots: m.max_visits_exclude_bots,
        })
    }
}

struct Instance {
    action: Action,
    require_consumer: bool,
    meta: Arc<Meta>,
    shared: Arc<Shared>,
}

impl Meta {
    /// The base a link is shown on.
    fn base_of(&self, domain: Option<&str>) -> &str {
        domain
            .and_then(|d| self.bases.iter().find(|(h, _)| h == d))
            .map_or(self.short_base.as_str(), |(_, b)| b.as_str())
    }
    fn limits(&self) -> validate::Limits<'_> {
        validate::Limits {
            bases: &self.base_urls,
            max_valid_day: self.max_valid_day,
            default_valid_day: self.default_valid_day,
            day_secs: self.day_secs,
            domains: &self.domains,
        }
    }
    /// Who asks: without a consumer (no authentication on the route) or as an admin consumer,
    /// every link; otherwise the consumer's own.
    fn scope(&self, ctx: &RequestCtx) -> store::links::Scope {
        match &ctx.consumer {
            None => store::links::Scope::All,
            Some(c) if self.admins.iter().any(|a| **a == *c.username) => store::links::Scope::All,
            Some(c) => store::links::Scope::Owner(c.username.to_string()),
        }
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    fn wants_request_body(&self) -> bool {
        self.action != Action::Resolve
    }

    fn access(&self, ctx: &mut RequestCtx) -> Flow<'_> {
        if self.require_consumer && ctx.consumer.is_none() {
            return request_error(
                StatusCode::FORBIDDEN,
                "no consumer identified: this route requires one (require_consumer), from an authentication \
                 plugin that names consumers (key-auth, jwt-auth, basic-auth, hmac-auth...)",
                now(),
            );
        }
        match self.action {
            Action::Create => self.create(ctx),
            Action::Resolve => self.resolve(ctx),
            Action::Manage => manage::handle(&self.meta, &self.shared, ctx),
        }
    }
}

impl Instance {
    fn create(&self, ctx: &mut RequestCtx) -> Flow<'static> {
        let now = now();
        if let Some(refused) = refuse_non_json(ctx, now) {
            return refused;
        }
        let body = ctx.body.take().unwrap_or_default();
        let mut checked = match validate::batch(&body, &self.meta.limits(), now) {
            Ok(c) => c,
            Err((status, message)) => return request_error(status, &message, now),
        };
        // The consumer an authentication plugin identified owns what it creates.
        if let Some(c) = &ctx.consumer {
            for e in checked.iter_mut().flatten() {
                e.owner = Some(c.username.to_string());
            }
        }
        let valid: Vec<store::NewEntry> = checked.iter().filter_map(|c| c.as_ref().ok().cloned()).collect();
        if valid.is_empty() {
            let items: Vec<_> = checked.iter().map(|c| item_err(c.as_ref().err(), now)).collect();
            return Flow::Respond(respond(&items, now));
        }
        let Some(store) = self.shared.store() else {
            return request_error(StatusCode::SERVICE_UNAVAILABLE, "storage is not configured", now);
        };
        let meta = self.meta.clone();
        Flow::wait(async move {
            match store.create_entries(valid.clone(), now).await {
                Err(e) => {
                    log::error!("short-url: batch not stored: {e}");
                    let status = match e {
                        StoreError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                        StoreError::Exhausted => StatusCode::SERVICE_UNAVAILABLE,
                    };
                    request_error(status, &format!("{}; nothing of this request was stored", e.public()), now)
                }
                Ok(results) => {
                    let created = results.iter().filter(|r| matches!(r, Stored::New(_))).count();
                    counters::add(&counters::CREATED, created as u64);
                    let mut stored = results.iter().zip(&valid);
                    let items: Vec<_> = checked
                        .iter()
                        .map(|c| match c {
                            Err(r) => item_err(Some(r), now),
                            Ok(_) => match stored.next() {
                                // Not cached here: a bulk creation would push the hot codes
                                // out (and putting each new link cost a fifth of creation's
                                // worker time); a link's first redirect caches it.
                                Some((Stored::New(code) | Stored::Existing(code), entry)) => {
                                    item_ok(&entry.origin_url, code, meta.base_of(entry.domain.as_deref()), now)
                                }
                                Some((Stored::Taken, entry)) => {
                                    item_fail(409, &entry.origin_url, "custom_code: is already taken", now)
                                }
                                None => item_err(None, now),
                            },
                        })
                        .collect();
                    Flow::Respond(respond(&items, now))
                }
            }
        })
    }

    fn resolve(&self, ctx: &mut RequestCtx) -> Flow<'static> {
        let now = now();
        let (code, qr) = code_in_path(&ctx.path, ctx.matched_uri.as_deref());
        if !validate::is_code(code) {
            let msg = if code.is_empty() {
                "no short code in the path".to_owned()
            } else {
                format!("`{code}` is not a short code")
            };
            return Flow::Respond(PluginResponse::json(StatusCode::NOT_FOUND, &json!({"error_msg": msg})));
        }
        let code = code.to_owned();
        let qr_params = if qr {
            match qr::params(&ctx.query) {
                Ok(p) => Some(p),
                Err(m) => return request_error(StatusCode::BAD_REQUEST, &m, now),
            }
        } else {
            None
        };
        // A QR fetch and a HEAD (link checkers, previewers, monitors) look at a link without
        // visiting it: no visit is recorded and `max_visits` is not counted, but its rules apply.
        let peek = qr_params.is_some() || ctx.method == weir_plugin::http::Method::HEAD;
        // What a visit records, taken now (the request is gone once this waits).
        let visit = match (peek, self.shared.visits()) {
            (false, Some(sink)) => {
                let class = visits::classify(ctx.header("user-agent"));
                Some((sink, class))
            }
            _ => None,
        };
        let class = visit.as_ref().map_or_else(|| visits::classify(ctx.header("user-agent")), |(_, c)| *c);
        let visit = visit.map(|(sink, class)| {
            let v = store::links::Visit {
                code: code.clone(),
                at: now,
                referer: ctx.header("referer").and_then(visits::referer_host),
                class,
                country: self.shared.geoip.read().as_ref().and_then(|g| g.country(&ctx.remote_ip)),
                ip_hash: sink.salt.hash(&ctx.remote_ip, now),
            };
            (sink, v)
        });
        let meta = self.meta.clone();
        let counted = !(meta.exclude_bots && class == store::links::UaClass::Bot);
        if let Some(link) = self.shared.cache.get(&code, now) {
            // A capped link's count is in the database: a visit counts there, and a look (no
            // visit) reads whether the cap was reached there too.
            if link.max_visits.is_none() || (!peek && !counted) {
                return Flow::Respond(answer(&meta, &link, now, qr_params, visit, peek));
            }
        }
        let Some(store) = self.shared.store() else {
            return Flow::Respond(PluginResponse::json(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"error_msg": "storage is not configured"}),
            ));
        };
        let shared = self.shared.clone();
        Flow::wait(async move {
            let cached = shared.cache.get(&code, now).filter(|l| !peek || l.max_visits.is_none());
            let link = match cached {
                Some(l) => l,
                // The code comes back with a miss, for the answer to name it.
                None => match store.run(move |c| store::links::get(c, &code).map(|l| l.ok_or(code))).await {
                    Ok(Ok(l)) => {
                        let l = Arc::new(l);
                        shared.cache.put(l.clone(), now);
                        l
                    }
                    Ok(Err(code)) => return Flow::Respond(not_found(&code)),
                    Err(e) => return Flow::Respond(unavailable(&e)),
                },
            };
            if link.max_visits.is_some() && !peek && counted && unusable(&link, now).is_none() {
                // Capped: counted in the database, atomically, before the redirect.
                let code = link.code.clone();
                match store.run(move |c| store::links::hit(c, &code)).await {
                    Ok(true) => {}
                    Ok(false) => {
                        counters::add(&counters::CAPPED, 1);
                        return Flow::Respond(gone(&link.code, "has reached its max_visits"));
                    }
                    Err(e) => return Flow::Respond(unavailable(&e)),
                }
            }
            Flow::Respond(answer(&meta, &link, now, qr_params, visit, peek))
        })
    }
}

/// The code a redirect's path names, and whether it asks for the QR code: what follows the
/// route's prefix (its `uri` up to the final `*`, such as `/s/` or `/t/:tenant/s/`) must be
/// `<code>` or `<code>/qr`, so a code has one URL (`/s/x/<code>` is not it). A route without
/// such a prefix (an exact path, a path parameter last) names the code in its last segment.
fn code_in_path<'a>(path: &'a str, matched_uri: Option<&str>) -> (&'a str, bool) {
    let rest = match matched_uri.and_then(|m| m.strip_suffix('*')).and_then(|prefix| after_route_prefix(path, prefix)) {
        // (`uri: /s*` leaves the slash in front of the code.)
        Some(rest) => rest.strip_prefix('/').unwrap_or(rest),
        None => {
            let (path, qr) = path.strip_suffix("/qr").map_or((path, false), |p| (p, true));
            return (path.rsplit('/').next().unwrap_or(""), qr);
        }
    };
    match rest.split_once('/') {
        None => (rest, false),
        Some((code, "qr")) => (code, true),
        // Not a code: the caller answers 404 naming it.
        Some(_) => (rest, false),
    }
}

/// What follows `prefix` (a route `uri` without its final `*`) in `path`, matching its
/// parameter segments (`:name` or `{name}`) as the router does: one whole, non-empty segment.
fn after_route_prefix<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    let mut rest = path;
    let mut segments = prefix.split('/').peekable();
    while let Some(segment) = segments.next() {
        let parameter = segment.starts_with(':') || (segment.starts_with('{') && segment.ends_with('}'));
        let last = segments.peek().is_none();
        rest = match (parameter, last) {
            // (`uri: /s*` ends in part of a segment; `/s/*` in an empty one.)
            (false, true) => rest.strip_prefix(segment)?,
            (false, false) => rest.strip_prefix(segment)?.strip_prefix('/')?,
            (true, _) => {
                let end = rest.find('/').unwrap_or(rest.len());
                if end == 0 {
                    return None;
                }
                if last {
                    &rest[end..]
                } else {
                    rest.get(end + 1..)?
                }
            }
        };
    }
    Some(rest)
}

/// A 415 unless the body is declared JSON (no `Content-Type` is accepted): `application/json`, and for a
/// `PATCH` also `application/merge-patch+json` (RFC 7396), whose rules a `PATCH` here follows
/// (a field present replaces, `null` clears, an absent one stays).
fn refuse_non_json(ctx: &RequestCtx, now: i64) -> Option<Flow<'static>> {
    let media = ctx.header("content-type")?.split(';').next().unwrap_or("").trim();
    let merge_patch =
        ctx.method == weir_plugin::http::Method::PATCH && media.eq_ignore_ascii_case("application/merge-patch+json");
    (!media.eq_ignore_ascii_case("application/json") && !merge_patch).then(|| {
        let allowed = if ctx.method == weir_plugin::http::Method::PATCH {
            "application/json or application/merge-patch+json"
        } else {
            "application/json"
        };
        request_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &format!("Content-Type must be {allowed}, not `{media}`"),
            now,
        )
    })
}

fn unavailable(e: &StoreError) -> PluginResponse {
    log::debug!("short-url: {e}");
    PluginResponse::json(StatusCode::SERVICE_UNAVAILABLE, &json!({"error_msg": format!("short-url {}", e.public())}))
}

fn gone(code: &str, why: &str) -> PluginResponse {
    PluginResponse::json(StatusCode::GONE, &json!({"error_msg": format!("short code `{code}` {why}")}))
}

/// Why a link does not redirect now: the answer (deleted or expired: 410, not yet valid: 404),
/// or none when it does.
fn unusable(link: &store::links::Link, now: i64) -> Option<PluginResponse> {
    if link.deleted_at.is_some() {
        return Some(gone(&link.code, "has been deleted"));
    }
    if link.valid_since.is_some_and(|t| now < t) {
        return Some(not_found(&link.code));
    }
    if link.expires_at.is_some_and(|t| now >= t) {
        return Some(gone(&link.code, "has expired"));
    }
    None
}

/// The answer for a link found (and, when capped, already counted): the redirect or the QR code,
/// and the visit buffered.
fn answer(
    meta: &Meta,
    link: &store::links::Link,
    now: i64,
    qr_params: Option<qr::Params>,
    visit: Option<(Arc<visits::Sink>, store::links::Visit)>,
    peek: bool,
) -> PluginResponse {
    if let Some(r) = unusable(link, now) {
        if r.status == StatusCode::GONE && link.deleted_at.is_none() {
            counters::add(&counters::EXPIRED, 1);
        }
        return r;
    }
    // A look without a visit (QR code, HEAD; a visit was counted before it got here): the
    // rules of a redirect, past max_visits too.
    if peek && link.max_visits.is_some_and(|m| link.cap_used >= m) {
        return gone(&link.code, "has reached its max_visits");
    }
    if let Some(p) = qr_params {
        let url = format!("{}/{}", meta.base_of(link.domain.as_deref()), link.code);
        return match qr::render(&url, p) {
            Ok((ct, bytes)) => {
                let mut r = PluginResponse { status: StatusCode::OK, headers: Default::default(), body: bytes.into() };
                r.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
                r.headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=86400"));
                r
            }
            Err(e) => PluginResponse::json(StatusCode::BAD_REQUEST, &json!({"error_msg": format!("qr: {e}")})),
        };
    }
    let r = redirect(&link.code, &link.origin_url, meta.redirect_status);
    if r.status == meta.redirect_status {
        if let Some((sink, v)) = visit {
            sink.record(v);
        }
    }
    r
}

/// Counters exported with the metrics (`short_url_*_total`).
mod counters {
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Codes stored.
    pub static CREATED: AtomicU64 = AtomicU64::new(0);
    /// Redirects answered.
    pub static RESOLVED: AtomicU64 = AtomicU64::new(0);
    /// Requests for an expired code (410).
    pub static EXPIRED: AtomicU64 = AtomicU64::new(0);
    /// Redirects refused because the link reached its `max_visits` (410).
    pub static CAPPED: AtomicU64 = AtomicU64::new(0);

    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Registers the source that writes them.
    pub fn register() {
        weir_plugin::metrics::set_source("short_url", |e| {
            for (name, help, c) in [
                ("short_url_created_total", "Short codes created.", &CREATED),
                ("short_url_resolved_total", "Short codes resolved to a redirect.", &RESOLVED),
                ("short_url_expired_total", "Requests for an expired short code (410).", &EXPIRED),
                ("short_url_capped_total", "Redirects refused at max_visits (410).", &CAPPED),
                ("short_url_visits_recorded_total", "Visits written to storage.", &crate::visits::RECORDED),
                (
                    "short_url_visits_dropped_total",
                    "Visits dropped (buffer full or batch not written).",
                    &crate::visits::DROPPED,
                ),
            ] {
                e.family(name, "counter", help);
                e.sample(name, &[], c.load(Ordering::Relaxed));
            }
        });
    }
}

fn not_found(code: &str) -> PluginResponse {
    PluginResponse::json(StatusCode::NOT_FOUND, &json!({"error_msg": format!("short code `{code}` not found")}))
}

/// A redirect to `origin`.
fn redirect(code: &str, origin: &str, status: StatusCode) -> PluginResponse {
    let mut r = PluginResponse { status, headers: Default::default(), body: Default::default() };
    match HeaderValue::from_bytes(origin.as_bytes()) {
        Ok(v) => {
            r.headers.insert(header::LOCATION, v);
        }
        Err(_) => return not_found(code),
    }
    r.headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, max-age=90"));
    counters::add(&counters::RESOLVED, 1);
    r
}

fn attr_from(attr: Option<&Value>) -> Result<Attr, String> {
    match attr {
        None => Ok(Attr::default()),
        Some(v) => weir_plugin::parse_conf::<Attr>(v),
    }
}

fn connector(storage: &Storage, data_dir: &std::path::Path) -> (Arc<dyn Connector>, usize) {
    match storage {
        Storage::Sqlite { path } => {
            let path = path.as_ref().map(PathBuf::from).unwrap_or_else(|| data_dir.join("short-url.db"));
            (Arc::new(store::sqlite::Sqlite::new(path)), 2)
        }
        Storage::Postgres { url, readers } => {
            (Arc::new(store::postgres::Postgres::new(url.clone())), readers.unwrap_or(4) as usize)
        }
    }
}

/// Deletes long-expired codes every minute, for as long as the plugin lives.
fn start_sweeper(shared: &Arc<Shared>) {
    let weak: Weak<Shared> = Arc::downgrade(shared);
    let _ = std::thread::Builder::new().name("short-url-sweep".into()).spawn(move || loop {
        std::thread::sleep(Duration::from_secs(60));
        let Some(shared) = weak.upgrade() else { return };
        if let Some(store) = shared.store() {
            match store.purge_blocking(now() - EXPIRED_GRACE_SECS) {
                Ok(0) => {}
                Ok(n) => log::info!("short-url: swept {n} expired codes"),
                Err(e) => log::warn!("short-url: sweep failed: {e}"),
            }
        }
    });
}

impl Plugin for ShortUrl {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "short-url"
    }
    fn priority(&self) -> i32 {
        1000
    }
    fn metadata_schema(&self) -> Option<Value> {
        Some(schema_of::<Metadata>())
    }
    fn attr_schema(&self) -> Option<Value> {
        Some(schema_of::<Attr>())
    }
    fn init(&self, attr: Option<&Value>, env: &InitEnv) -> Result<(), String> {
        let attr = attr_from(attr)?;
        let storage = attr.storage;
        if let Storage::Postgres { url, .. } = &storage {
            store::postgres::check_url(url)?;
        }
        if !attr.visits.flush_interval.is_finite() || !(0.01..=4.0).contains(&attr.visits.flush_interval) {
            return Err("visits.flush_interval: must be 0.01 to 4 seconds (a visit shows within 5 s)".into());
        }
        // The prefix holds conf/ and data/.
        let prefix = env.data_dir.parent().unwrap_or(std::path::Path::new("."));
        let geoip = match &attr.geoip_database {
            Some(path) => Some(Arc::new(geoip::GeoIp::open(path, prefix)?)),
            None => None,
        };
        if env.check_only {
            return Ok(());
        }
        if let Some(g) = &geoip {
            log::info!("short-url: visits get their country from {}", g.path.display());
        }
        *self.shared.geoip.write() = geoip;
        counters::register();
        {
            let current = self.shared.store.read();
            let same_visits = self.shared.visits.read().as_ref().map(|(a, _)| *a);
            if current.as_ref().is_some_and(|(s, dir, _)| *s == storage && *dir == env.data_dir)
                && (same_visits == Some(attr.visits) || (!attr.visits.enabled && same_visits.is_none()))
            {
                return Ok(());
            }
        }
        let (connector, readers) = connector(&storage, &env.data_dir);
        *self.shared.visits.write() = attr.visits.enabled.then(|| {
            let settings = visits::Settings {
                buffer: attr.visits.buffer_size as usize,
                flush_interval: Duration::from_secs_f64(attr.visits.flush_interval),
                batch_size: attr.visits.batch_size as usize,
                salt_rotate_secs: i64::from(attr.visits.salt_rotate_secs),
                keep_recent: i64::from(attr.visits.keep_recent),
            };
            (attr.visits, visits::Sink::start(connector.clone(), settings))
        });
        match connector.connect() {
            Ok(_) => log::info!("short-url: storage {} ready", connector.describe()),
            Err(e) => {
                log::warn!("short-url: storage {} unavailable at start ({e}); retrying on demand", connector.describe())
            }
        }
        let store = Store::start(connector, self.shared.codes.clone(), readers);
        *self.shared.store.write() = Some((storage, env.data_dir.clone(), store));
        self.shared.cache.clear();
        if self.shared.sweeper.set(()).is_ok() {
            start_sweeper(&self.shared);
        }
        Ok(())
    }
    fn control_endpoints(&self) -> Vec<ControlEndpoint> {
        let stats_shared = self.shared.clone();
        let code_shared = self.shared.clone();
        vec![
            ControlEndpoint {
                methods: vec!["GET"],
                uris: vec!["/v1/plugin/short-url/stats".into()],
                handler: Arc::new(move |_req| {
                    let shared = stats_shared.clone();
                    Box::pin(async move {
                        let Some(store) = shared.store() else {
                            return ControlResponse::error(503, "storage is not configured");
                        };
                        match store.counts(now()).await {
                            Ok(c) => ControlResponse::json(
                                200,
                                &json!({
                                    "backend": store.backend(),
                                    "storage": store.describe(),
                                    "codes": c.codes,
                                    "expired": c.expired,
                                    "cached": shared.cache.len(),
                                    "visits_recorded": visits::RECORDED.load(std::sync::atomic::Ordering::Relaxed),
                                    "visits_dropped": visits::DROPPED.load(std::sync::atomic::Ordering::Relaxed),
                                }),
                            ),
                            Err(e) => ControlResponse::error(503, e.to_string()),
                        }
                    })
                }),
            },
            ControlEndpoint {
                methods: vec!["GET"],
                uris: vec!["/v1/plugin/short-url/codes/:code".into()],
                handler: Arc::new(move |req| {
                    let shared = code_shared.clone();
                    Box::pin(async move {
                        let Some(code) = req.param("code").map(str::to_owned) else {
                            return ControlResponse::error(
                                404,
                                "enable control.router: radixtree_uri_with_parameter to look codes up",
                            );
                        };
                        let Some(store) = shared.store() else {
                            return ControlResponse::error(503, "storage is not configured");
                        };
                        let wanted = code.clone();
                        match store.run(move |c| store::links::get(c, &wanted)).await {
                            Ok(Some(l)) => ControlResponse::json(
                                200,
                                &json!({
                                    "code": l.code,
                                    "origin_url": l.origin_url,
                                    "created_at": l.created_at,
                                    "expires_at": l.expires_at,
                                    "expired": l.expires_at.is_some_and(|t| now() >= t),
                                    "deleted_at": l.deleted_at,
                                }),
                            ),
                            Ok(None) => ControlResponse::error(404, format!("code[{code}] not found")),
                            Err(e) => ControlResponse::error(503, e.to_string()),
                        }
                    })
                }),
            },
        ]
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let c = conf;
        if c.require_consumer && c.action == Action::Resolve {
            return Err(
                "require_consumer: applies to `create` and `manage`; redirects never depend on the owner".into()
            );
        }
        let meta = Arc::new(Meta::from(ctx.metadata)?);
        Ok(Arc::new(Instance {
            action: c.action,
            require_consumer: c.require_consumer,
            meta,
            shared: self.shared.clone(),
        }))
    }
}

register_plugin!(ShortUrl::default());

#[cfg(test)]
mod tests {
    use super::{code_in_path, ShortUrl};
    use serde_json::json;

    #[test]
    fn require_consumer_is_for_create_and_manage_routes() {
        let plugin = ShortUrl::default();
        for action in ["create", "manage"] {
            let built = weir_plugin::testing::instance(&plugin, json!({"action": action, "require_consumer": true}));
            assert!(built.is_ok(), "{action}: {:?}", built.err());
        }
        let refused = weir_plugin::testing::instance(&plugin, json!({"action": "resolve", "require_consumer": true}));
        assert!(refused.err().is_some_and(|e| e.starts_with("require_consumer: ")));
    }

    /// What follows the route's prefix is the code (or the code and `/qr`) and nothing else;
    /// routes without a `*` prefix name it in the last segment.
    #[test]
    fn a_redirect_path_names_its_code_after_the_route_prefix() {
        let cases = [
            ("/s/abc", Some("/s/*"), ("abc", false)),
            ("/s/abc/qr", Some("/s/*"), ("abc", true)),
            ("/s/x/abc", Some("/s/*"), ("x/abc", false)),
            ("/s/abc/", Some("/s/*"), ("abc/", false)),
            ("/s/abc/qr/x", Some("/s/*"), ("abc/qr/x", false)),
            ("/sabc", Some("/s*"), ("abc", false)),
            ("/s/abc", Some("/s*"), ("abc", false)),
            ("/abc", Some("/*"), ("abc", false)),
            ("/go/abc/qr", Some("/go/:code/qr"), ("abc", true)),
            ("/t/1/s/abc", Some("/t/:tenant/s/*"), ("abc", false)),
            ("/t/1/s/abc/qr", Some("/t/{tenant}/s/*"), ("abc", true)),
            ("/t/1/s/x/abc", Some("/t/:tenant/s/*"), ("x/abc", false)),
            ("/t/1/x/s/abc", Some("/t/:tenant/s/*"), ("abc", false)),
            ("/s/abc", None, ("abc", false)),
        ];
        for (path, matched, want) in cases {
            assert_eq!(code_in_path(path, matched), want, "{path} on {matched:?}");
        }
    }
}
