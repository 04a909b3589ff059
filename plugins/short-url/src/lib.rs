//! `short-url`: the batch short-URL service (`POST /short/v1/urls`, up to 100 URLs a call) and
//! its redirect side, as one plugin attached to routes (`action: create` / `action: resolve`).
//!
//! Storage is per instance (`plugin_attr.short-url.storage`): SQLite under the prefix by default,
//! or PostgreSQL shared by a cluster. Behaviour that the metadata controls (`short_base`,
//! `redirect_status`, `max_valid_day`, `default_valid_day`) is shared through `plugin_metadata`.

pub mod cache;
pub mod envelope;
pub mod store;
pub mod validate;

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
use envelope::{item_err, item_ok, request_error, respond};
use store::{CodeGen, Connector, RandomCodes, Store, StoreError, CODE_LEN};

/// What a route with this plugin does.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    // Serve `POST /short/v1/urls` (batch creation).
    #[default]
    Create,
    // Serve redirects under the short base path.
    Resolve,
}

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// `create` (default) or `resolve`.
    #[serde(default)]
    pub action: Action,
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
    cache: Cache,
    codes: Arc<dyn CodeGen>,
    sweeper: OnceLock<()>,
}

impl Shared {
    fn store(&self) -> Option<Arc<Store>> {
        self.store.read().as_ref().map(|(_, _, s)| s.clone())
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
    base_url: Option<url::Url>,
    redirect_status: StatusCode,
    max_valid_day: u32,
    default_valid_day: Option<u32>,
    day_secs: i64,
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
            None => Metadata { short_base: None, redirect_status: None, max_valid_day: None, default_valid_day: None },
        };
        let short_base = m.short_base.unwrap_or_else(|| DEFAULT_SHORT_BASE.to_owned()).trim_end_matches('/').to_owned();
        let base_url = Some(url::Url::parse(&short_base).map_err(|e| format!("short_base: {e}"))?);
        let max_valid_day = m.max_valid_day.unwrap_or(3650);
        if m.default_valid_day.is_some_and(|d| d > max_valid_day) {
            return Err("default_valid_day: larger than max_valid_day".into());
        }
        Ok(Meta {
            short_base,
            base_url,
            redirect_status: StatusCode::from_u16(m.redirect_status.unwrap_or(302)).map_err(|e| e.to_string())?,
            max_valid_day,
            default_valid_day: m.default_valid_day,
            day_secs: day_secs(),
        })
    }
}

struct Instance {
    action: Action,
    meta: Arc<Meta>,
    shared: Arc<Shared>,
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    fn wants_request_body(&self) -> bool {
        self.action == Action::Create
    }

    fn access(&self, ctx: &mut RequestCtx) -> Flow<'_> {
        match self.action {
            Action::Create => self.create(ctx),
            Action::Resolve => self.resolve(ctx),
        }
    }
}

impl Instance {
    fn create(&self, ctx: &mut RequestCtx) -> Flow<'static> {
        let now = now();
        if let Some(ct) = ctx.header("content-type") {
            let media = ct.split(';').next().unwrap_or("").trim();
            if !media.eq_ignore_ascii_case("application/json") {
                return request_error(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    &format!("Content-Type must be application/json, not `{media}`"),
                    now,
                );
            }
        }
        let body = ctx.body.take().unwrap_or_default();
        let limits = validate::Limits {
            short_base: self.meta.base_url.as_ref(),
            max_valid_day: self.meta.max_valid_day,
            default_valid_day: self.meta.default_valid_day,
            day_secs: self.meta.day_secs,
        };
        let checked = match validate::batch(&body, &limits, now) {
            Ok(c) => c,
            Err((status, message)) => return request_error(status, &message, now),
        };
        let valid: Vec<store::NewEntry> = checked.iter().filter_map(|c| c.as_ref().ok().cloned()).collect();
        if valid.is_empty() {
            let items: Vec<_> = checked.iter().map(|c| item_err(c.as_ref().err(), now)).collect();
            return Flow::Respond(respond(&items, now));
        }
        let Some(store) = self.shared.store() else {
            return request_error(StatusCode::SERVICE_UNAVAILABLE, "storage is not configured", now);
        };
        let meta = self.meta.clone();
        let shared = self.shared.clone();
        Flow::wait(async move {
            match store.create(valid.clone(), now).await {
                Err(e) => {
                    log::error!("short-url: batch not stored: {e}");
                    let status = match e {
                        StoreError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                        StoreError::Exhausted => StatusCode::SERVICE_UNAVAILABLE,
                    };
                    request_error(status, &format!("{e}; nothing of this request was stored"), now)
                }
                Ok(codes) => {
                    counters::add(&counters::CREATED, codes.len() as u64);
                    let mut stored = codes.iter().zip(&valid);
                    let items: Vec<_> = checked
                        .iter()
                        .map(|c| match c {
                            Err(r) => item_err(Some(r), now),
                            Ok(_) => match stored.next() {
                                Some((code, entry)) => {
                                    shared.cache.put(code, &entry.origin_url, entry.expires_at);
                                    item_ok(&entry.origin_url, code, &meta.short_base, now)
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
        let code = ctx.path.rsplit('/').next().unwrap_or("").to_owned();
        let now = now();
        if code.len() != CODE_LEN || !code.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Flow::Respond(not_found(&code));
        }
        let status = self.meta.redirect_status;
        if let Some(hit) = self.shared.cache.get(&code) {
            return Flow::Respond(redirect_or_gone(&code, &hit.0, hit.1, now, status));
        }
        let Some(store) = self.shared.store() else {
            return Flow::Respond(PluginResponse::json(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"error_msg": "storage is not configured"}),
            ));
        };
        let shared = self.shared.clone();
        Flow::wait(async move {
            match store.get(&code).await {
                Ok(Some(r)) => {
                    shared.cache.put(&code, &r.origin_url, r.expires_at);
                    Flow::Respond(redirect_or_gone(&code, &r.origin_url, r.expires_at, now, status))
                }
                Ok(None) => Flow::Respond(not_found(&code)),
                Err(e) => Flow::Respond(PluginResponse::json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({"error_msg": format!("short-url {e}")}),
                )),
            }
        })
    }
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

/// A redirect, or 410 once `expires_at` is reached (checked to the second, also on cache hits).
fn redirect_or_gone(code: &str, origin: &str, expires_at: Option<i64>, now: i64, status: StatusCode) -> PluginResponse {
    if expires_at.is_some_and(|t| now >= t) {
        counters::add(&counters::EXPIRED, 1);
        return PluginResponse::json(
            StatusCode::GONE,
            &json!({"error_msg": format!("short code `{code}` has expired")}),
        );
    }
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

fn storage_from(attr: Option<&Value>) -> Result<Storage, String> {
    match attr {
        None => Ok(Storage::default()),
        Some(v) => weir_plugin::parse_conf::<Attr>(v).map(|a| a.storage),
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
        let storage = storage_from(attr)?;
        if let Storage::Postgres { url, .. } = &storage {
            store::postgres::check_url(url)?;
        }
        if env.check_only {
            return Ok(());
        }
        counters::register();
        {
            let current = self.shared.store.read();
            if current.as_ref().is_some_and(|(s, dir, _)| *s == storage && *dir == env.data_dir) {
                return Ok(());
            }
        }
        let (connector, readers) = connector(&storage, &env.data_dir);
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
                        match store.get(&code).await {
                            Ok(Some(r)) => ControlResponse::json(
                                200,
                                &json!({
                                    "code": r.code,
                                    "origin_url": r.origin_url,
                                    "created_at": r.created_at,
                                    "expires_at": r.expires_at,
                                    "expired": r.expires_at.is_some_and(|t| now() >= t),
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
        let meta = Arc::new(Meta::from(ctx.metadata)?);
        Ok(Arc::new(Instance { action: c.action, meta, shared: self.shared.clone() }))
    }
}

register_plugin!(ShortUrl::default());
