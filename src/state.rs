//! The gateway's shared state: configuration, enabled plugins, the current resource snapshot and
//! the plugin control routes, each behind an `ArcSwap` so that readers (request handlers) never
//! lock and writers (reloads) publish complete new values atomically.

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use serde_json::Value;

use crate::config::{Config, ConfigProvider, Prefix};
use crate::control_routes::PluginRoutes;
use crate::health::HealthRegistry;
use crate::plugins::{Catalog, EnabledSet};
use crate::resources::etcd::{self, ProviderStatus, Values};
use crate::resources::yaml;
use crate::tables::snapshot::{DocPrints, Mode, Prints, RouteChange};
use crate::tables::Snapshot;
use crate::validate::Issue;

/// Everything a running gateway shares between its listeners.
pub struct Gateway {
    /// Installation paths.
    pub prefix: Prefix,
    /// Compiled-in plugins.
    pub catalog: &'static Catalog,
    /// The configuration in force.
    pub config: ArcSwap<Config>,
    /// Enabled plugins.
    pub enabled: ArcSwap<EnabledSet>,
    /// Current resources.
    pub resources: ArcSwap<Snapshot>,
    /// Plugin control endpoints of the enabled plugins.
    pub control_routes: ArcSwap<PluginRoutes>,
    /// Health checkers (issue: health checks).
    pub health: HealthRegistry,
    /// When the process started.
    pub started: Instant,
    /// The resource document in force, as compact JSON text (to rebuild when the plugin set
    /// changes; text is a fraction of the size of a `Value` tree).
    /// The file's resources as JSON text, for a plugin reload to rebuild from (text: a parsed
    /// tree of 10,000 routes is ~20 MB); `None` with etcd, which a reload reads again.
    raw_resources: Mutex<Option<Arc<str>>>,
    /// Serializes reloads (file watcher and plugin reload).
    reload: Mutex<()>,
    /// The resource provider's state (`GET /v1/config_status`).
    pub provider_status: Mutex<ProviderStatus>,
    /// What the start-up read of etcd found, for the watcher to continue from.
    pub etcd_start: Mutex<Option<(Values, i64)>>,
    /// The set the etcd watcher follows, while it is connected (the Admin API validates writes
    /// against it).
    pub followed: Mutex<Option<Followed>>,
    /// The revision of [`Gateway::followed`] (0 while there is none), for a write to wait on.
    pub followed_revision: tokio::sync::watch::Sender<i64>,
    /// The response headers that show who answered (from config.yaml; fixed until restart).
    pub debug: DebugHeaders,
    /// Wakes the etcd watcher to rebuild from the document it holds (DNS answers changed).
    pub rebuild_requested: Arc<tokio::sync::Notify>,
    /// How many snapshots have been published: which one serves, for a provider to know
    /// whether it is the one it built ([`Followed::clean`]).
    generation: std::sync::atomic::AtomicU64,
}

/// The set the etcd watcher follows ([`Gateway::followed`]): every value under the prefix as of
/// `revision`, with the fingerprints known of them.
pub struct Followed {
    /// The values, by key.
    pub values: Values,
    /// Their fingerprints known so far.
    pub prints: Prints,
    /// The etcd revision they are as of.
    pub revision: i64,
    /// The [`Gateway::generation`] of the snapshot built from exactly these values (nothing
    /// skipped), while it serves: a change to routes only is then a patch of it
    /// (`Snapshot::patch_routes`) rather than a build of the whole set.
    pub clean: Option<u64>,
}

/// `gateway.debug_header` and `gateway.show_upstream_status_in_response_header`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DebugHeaders {
    /// Every response carries `X-Weir-Debug`.
    pub header: bool,
    /// Every upstream answer carries `X-Weir-Upstream-Status` (not only 5xx ones).
    pub upstream_status_always: bool,
}

impl Gateway {
    /// Loads configuration and resources of `prefix`; every error names its file and key.
    pub fn load(prefix: Prefix) -> Result<Arc<Gateway>, String> {
        Self::load_mode(prefix, false)
    }

    /// `weir -t`: validates everything [`Gateway::load`] does, with no side effect: no database
    /// opened, no file or directory created, no thread started, no port bound.
    pub fn check(prefix: Prefix) -> Result<(), String> {
        Self::load_mode(prefix, true).map(drop)
    }

    fn load_mode(prefix: Prefix, check_only: bool) -> Result<Arc<Gateway>, String> {
        let catalog = crate::plugins_catalog();
        let config = Config::load(&prefix, catalog).map_err(|e| e.to_string())?;
        // The configured log from here on: what plugins say as they start goes there too.
        if let Some(log) = config.gateway.error_log.as_ref().filter(|_| !check_only) {
            crate::error_log::start(prefix.dir.join(&log.path))?;
        }
        let enabled = enable(&config, catalog, &prefix, check_only)?;
        let routes = PluginRoutes::build(&enabled, config.gateway.control.router)
            .map_err(|e| format!("{}: {e}", prefix.config_file().display()))?;
        let config_prefix = config.deployment.prefix.clone();
        let file = prefix.resources_file();
        let mut status = ProviderStatus::new("yaml");
        let mut etcd_start = None;
        let raw = match config.deployment.config_provider {
            ConfigProvider::Yaml => yaml::load(&file).map_err(|e| e.to_string())?,
            // `weir -t` checks the configuration only: no connection.
            ConfigProvider::Etcd if check_only => Value::Object(Default::default()),
            ConfigProvider::Etcd => {
                status = ProviderStatus::new("etcd");
                match etcd::initial_read(&config.deployment.etcd, &config_prefix) {
                    Ok((values, revision)) => {
                        let check = |d: &Value, _: &etcd::KeysByList<'_>| {
                            Snapshot::build_mode(d, &enabled, &prefix.dir, Mode::Validate(None), None).map(drop)
                        };
                        // (The snapshot is built once more below, with the rest of start-up.)
                        let mut values = values;
                        let (doc, skipped) = etcd::valid_document(check, &mut values, &config_prefix, true);
                        for (key, why) in &skipped {
                            log::error!("etcd {key}: {why}; skipped");
                        }
                        status.connected = true;
                        status.revision = Some(revision);
                        status.skipped = skipped.into_iter().map(|(k, _)| k).filter(|k| !k.is_empty()).collect();
                        etcd_start = Some((values, revision));
                        doc.and_then(|(d, ())| d).unwrap_or_else(|| Value::Object(Default::default()))
                    }
                    Err(e) => {
                        // Serve (nothing yet) and keep trying: an instance never stays down
                        // because the store is.
                        log::warn!("{e}; starting with no resources, retrying in the background");
                        status.last_error = Some(e);
                        Value::Object(Default::default())
                    }
                }
            }
        };
        let source = match config.deployment.config_provider {
            ConfigProvider::Yaml => file.display().to_string(),
            ConfigProvider::Etcd => format!("etcd {config_prefix}"),
        };
        if !check_only {
            let g = &config.gateway;
            crate::dns::start(crate::dns::Settings {
                servers: g.dns_servers(),
                valid: g.dns_resolver_valid.map(|s| std::time::Duration::from_secs(s.into())),
                min_ttl: std::time::Duration::from_secs(g.dns_min_ttl.into()),
                max_ttl: std::time::Duration::from_secs(g.dns_max_ttl.into()),
            })?;
        }
        let snapshot = Snapshot::build_at(&raw, &enabled, &prefix.dir).map_err(|issues| render(&source, &issues))?;
        // With etcd, a plugin reload reads the resources again rather than keeping a copy.
        let raw_for_reload =
            (config.deployment.config_provider == ConfigProvider::Yaml).then(|| Arc::from(raw.to_string()));
        let debug = DebugHeaders {
            header: config.gateway.debug_header,
            upstream_status_always: config.gateway.show_upstream_status_in_response_header,
        };
        let gateway = Arc::new(Gateway {
            rebuild_requested: Arc::new(tokio::sync::Notify::new()),
            generation: std::sync::atomic::AtomicU64::new(0),
            debug,
            prefix,
            catalog,
            config: ArcSwap::from_pointee(config),
            enabled: ArcSwap::from_pointee(enabled),
            resources: ArcSwap::from_pointee(snapshot),
            control_routes: ArcSwap::from_pointee(routes),
            health: HealthRegistry::new(&config_prefix),
            started: Instant::now(),
            raw_resources: Mutex::new(raw_for_reload),
            reload: Mutex::new(()),
            provider_status: Mutex::new(status),
            etcd_start: Mutex::new(etcd_start),
            followed: Mutex::new(None),
            followed_revision: tokio::sync::watch::Sender::new(0),
        });
        if !check_only {
            follow_dns(&gateway)?;
        }
        Ok(gateway)
    }

    /// Rebuilds the resources in force when DNS answers changed under some of their upstreams.
    /// Only the upstreams built from a changed answer are compiled again; everything else is
    /// reused.
    pub fn rebuild_for_dns(&self) {
        if self.resources.load().compiled_upstreams.iter().all(|u| u.dns_current()) {
            return;
        }
        self.rebuild("DNS answers changed");
    }

    /// Rebuilds the resources in force from their document (something they read changed: DNS
    /// answers, a stored ACME certificate): with the file provider from the document in force,
    /// with etcd by waking its watcher, which holds the document.
    pub fn rebuild(&self, why: &str) {
        let Some(text) = self.raw_resources.lock().clone() else {
            self.rebuild_requested.notify_one();
            return;
        };
        let raw: Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(e) => return log::error!("{why}: the resources in force do not parse again ({e})"),
        };
        let guard = self.hold_reloads();
        match self.build_snapshot(&raw) {
            Ok(snapshot) => {
                let summary = self.publish(&guard, snapshot, Some(raw), false);
                log::info!("{why}: resources rebuilt: {summary}");
            }
            Err(issues) => {
                for issue in issues {
                    log::error!("{why}: {issue}");
                }
            }
        }
    }

    /// Every compiled-in plugin (for process-wide hooks: shutdown, log reopening).
    pub fn catalog_entries(&self) -> Vec<std::sync::Arc<crate::plugins::PluginEntry>> {
        self.catalog.names().iter().filter_map(|n| self.catalog.get(n).cloned()).collect()
    }

    /// Runs `f` on the set the etcd watcher follows, locked (waiting at most `wait` for the
    /// lock when given: `None` comes back if it is not had by then). Whoever works on the set
    /// in place (a build takes its values out and puts them back) may panic half way: the set is
    /// then dropped, and the watcher reads everything again, rather than anyone building from
    /// what is left.
    pub fn with_followed<R>(
        &self,
        wait: Option<std::time::Duration>,
        f: impl FnOnce(&mut Option<Followed>) -> R,
    ) -> Option<R> {
        struct DropIfPanicking<'a>(&'a mut Option<Followed>);
        impl Drop for DropIfPanicking<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    *self.0 = None;
                }
            }
        }
        let mut locked = match wait {
            Some(wait) => self.followed.try_lock_for(wait)?,
            None => self.followed.lock(),
        };
        let guard = DropIfPanicking(&mut locked);
        Some(f(guard.0))
    }

    /// Validates a resource document against the enabled plugins without publishing it.
    /// Nothing real is built ([`Mode::Validate`]): no plugin opens a file or starts a thread,
    /// and no cache of the running snapshot is touched. What the snapshot serving compiled the
    /// same way is taken from it; `prints` are the fingerprints the provider knows.
    pub fn check_resources(&self, raw: &Value, prints: Option<&DocPrints>) -> Result<(), Vec<Issue>> {
        let current = self.resources.load();
        let mode = Mode::Validate(Some(&current));
        Snapshot::build_mode(raw, &self.enabled.load(), &self.prefix.dir, mode, prints).map(drop)
    }

    /// Validates a new resource document and, if valid, publishes it. Returns a summary.
    pub fn apply_resources(&self, raw: Value) -> Result<String, Vec<Issue>> {
        let guard = self.hold_reloads();
        let snapshot = self.build_snapshot(&raw)?;
        // A file reload is rare: give the pages of the previous set back to the OS at once.
        Ok(self.publish(&guard, snapshot, Some(raw), true))
    }

    /// Holds off plugin reloads (and other resource reloads) while a snapshot is built and
    /// published, so that it is published against the enabled set it was built with.
    pub fn hold_reloads(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.reload.lock()
    }

    /// Which snapshot serves: a count of those published.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The snapshot serving with `changes` to its routes applied (`Snapshot::patch_routes`), or
    /// `None` when they must be built whole; `validate`: an Admin API write's check.
    pub fn patch_routes(&self, changes: &[RouteChange<'_>], validate: bool) -> Option<Snapshot> {
        let current = self.resources.load();
        current.patch_routes(changes, &self.enabled.load(), &self.prefix.dir, validate)
    }

    /// Validates and builds a snapshot of `raw` against the enabled plugins (publishes nothing).
    /// What is unchanged since the snapshot serving now is reused from it.
    pub fn build_snapshot(&self, raw: &Value) -> Result<Snapshot, Vec<Issue>> {
        self.build_snapshot_with(raw, None)
    }

    /// [`Gateway::build_snapshot`], with the fingerprints of entries the provider already knows.
    pub fn build_snapshot_with(&self, raw: &Value, prints: Option<&DocPrints>) -> Result<Snapshot, Vec<Issue>> {
        let current = self.resources.load();
        Snapshot::build_mode(raw, &self.enabled.load(), &self.prefix.dir, Mode::Apply(Some(&current)), prints)
    }

    /// Publishes a snapshot built from `raw` (the caller holds [`Gateway::hold_reloads`]); `None`
    /// when the provider is etcd, which a plugin reload reads again instead. With
    /// `return_pages`, the allocator returns the freed pages to the OS right away; without, they
    /// stay for the next build (and decay back to the OS within seconds if unused), which is what a
    /// stream of etcd changes wants: a purge per change made each 10k-route build fault in tens of
    /// megabytes again, 40 % of its time.
    pub fn publish(
        &self,
        _held: &parking_lot::MutexGuard<'_, ()>,
        snapshot: Snapshot,
        raw: Option<Value>,
        return_pages: bool,
    ) -> String {
        let summary = snapshot.summary();
        crate::tables::upstream::reconcile_checkers(&self.health, &snapshot.compiled_upstreams);
        if let Some(dns) = crate::dns::service() {
            // Names no upstream in force names any more stop being resolved.
            let named: std::collections::HashSet<&crate::dns::Query> =
                snapshot.compiled_upstreams.iter().flat_map(|u| u.dns.iter().map(|(q, _)| q)).collect();
            dns.retain(|q| named.contains(q));
        }
        crate::acme::sync(&snapshot.ssls);
        let old = self.resources.swap(Arc::new(snapshot));
        self.generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let old_raw = std::mem::replace(&mut *self.raw_resources.lock(), raw.map(|r| Arc::from(r.to_string())));
        // Freeing the previous set (10k routes: tens of milliseconds) and returning its pages
        // happen off the path of the next change.
        let reclaim = move || {
            drop(old);
            drop(old_raw);
            if return_pages {
                release_garbage();
            }
        };
        if let Err(e) = std::thread::Builder::new().name("reclaim".into()).spawn(reclaim) {
            log::debug!("no reclaim thread ({e}); freeing inline");
        }
        summary
    }

    /// The resources in etcd now, built against `enabled` (a plugin reload with the etcd
    /// provider). Read on a thread of its own: callers run on an async runtime, and the read
    /// starts one of its own.
    fn etcd_snapshot(&self, enabled: &EnabledSet) -> Result<Snapshot, String> {
        let config = self.config.load();
        let (settings, prefix) = (config.deployment.etcd.clone(), config.deployment.prefix.clone());
        let read = std::thread::spawn(move || etcd::initial_read(&settings, &prefix));
        let (mut values, _) = read.join().map_err(|_| "reading etcd failed".to_owned())??;
        let check = |d: &Value, _: &etcd::KeysByList<'_>| Snapshot::build_at(d, enabled, &self.prefix.dir);
        let (built, skipped) = etcd::valid_document(check, &mut values, &config.deployment.prefix, false);
        for (key, why) in &skipped {
            log::error!("etcd {key}: {why}; skipped");
        }
        built.map(|(_, s)| s).ok_or_else(|| "the resources in etcd do not build with these plugins".to_owned())
    }

    /// Re-reads `plugins:` and `plugin_attr` from config.yaml and applies them: the enabled set,
    /// the control routes, and the resources rebuilt against the new set. All or nothing.
    pub fn reload_plugins(&self) -> Result<Vec<String>, String> {
        let _guard = self.reload.lock();
        let fresh = Config::load(&self.prefix, self.catalog).map_err(|e| e.to_string())?;
        let enabled = enable(&fresh, self.catalog, &self.prefix, false)?;
        let router_mode = self.config.load().gateway.control.router;
        let routes = PluginRoutes::build(&enabled, router_mode)
            .map_err(|e| format!("{}: {e}", self.prefix.config_file().display()))?;
        let snapshot = {
            let raw = self.raw_resources.lock().clone();
            match raw {
                Some(text) => {
                    let raw: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
                    Snapshot::build_at(&raw, &enabled, &self.prefix.dir)
                        .map_err(|issues| render(&self.prefix.resources_file().display().to_string(), &issues))?
                }
                None => self.etcd_snapshot(&enabled)?,
            }
        };
        let names = enabled.listed.iter().map(|e| e.name.to_owned()).collect();
        // Only the plugin part of the configuration is taken; listeners need a restart.
        let mut config = Config::clone(&self.config.load());
        config.plugins = fresh.plugins;
        config.stream_plugins = fresh.stream_plugins;
        config.plugin_attr = fresh.plugin_attr;
        self.config.store(Arc::new(config));
        self.enabled.store(Arc::new(enabled));
        self.control_routes.store(Arc::new(routes));
        crate::tables::upstream::reconcile_checkers(&self.health, &snapshot.compiled_upstreams);
        self.resources.store(Arc::new(snapshot));
        self.generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(names)
    }
}

/// Runs [`Gateway::rebuild_for_dns`] on a thread of its own whenever the DNS service reports a
/// changed answer; changes that arrive while a rebuild runs fold into the next one.
fn follow_dns(gateway: &Arc<Gateway>) -> Result<(), String> {
    let Some(dns) = crate::dns::service() else { return Ok(()) };
    let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
    dns.set_on_change(move || {
        let _ = tx.try_send(());
    });
    let weak = Arc::downgrade(gateway);
    std::thread::Builder::new()
        .name("dns-apply".into())
        .spawn(move || {
            while rx.recv().is_ok() {
                let Some(gateway) = weak.upgrade() else { return };
                gateway.rebuild_for_dns();
            }
        })
        .map(drop)
        .map_err(|e| format!("cannot start the DNS apply thread: {e}"))
}

/// Returns the memory a (re)load left behind (parse trees, the previous snapshot) to the OS now,
/// instead of after the allocator's decay period.
pub fn release_garbage() {
    if let Err(e) = crate::memory::purge() {
        log::debug!("memory purge after reload: {e}");
    }
}

/// The enabled set of `config`, with every enabled plugin initialised with its `plugin_attr`.
fn enable(config: &Config, catalog: &Catalog, prefix: &Prefix, check_only: bool) -> Result<EnabledSet, String> {
    let mut enabled = catalog.enable(&config.enabled_plugin_names(catalog));
    enabled.stream = catalog.enable_stream(&config.enabled_stream_names(catalog));
    enabled.check_only = check_only;
    let env = weir_plugin::InitEnv {
        data_dir: prefix.data_dir(),
        check_only,
        proxy_cache: config.gateway.proxy_cache.clone(),
    };
    for entry in &enabled.listed {
        entry
            .plugin
            .init(config.plugin_attr.get(entry.name), &env)
            .map_err(|e| format!("plugin_attr.{}: {e}", entry.name))?;
    }
    for entry in &enabled.stream {
        entry.plugin.init(&env).map_err(|e| format!("stream_plugins: {}: {e}", entry.name))?;
    }
    Ok(enabled)
}

/// Issues of one file, one per line.
pub fn render(file: &str, issues: &[Issue]) -> String {
    issues.iter().map(|i| format!("{file}: {i}")).collect::<Vec<_>>().join("\n")
}
