//! Running the gateway: start listeners, watch resources, stop gracefully on SIGTERM / SIGINT,
//! hand over to a new process on SIGUSR2 and drain on SIGQUIT (`handover`).

use crate::config::{ConfigProvider, Prefix};
use crate::state::Gateway;
use std::net::SocketAddr;

/// Loads `prefix` and serves until a termination signal. Errors are fit for the user.
pub fn run(prefix: Prefix) -> Result<(), String> {
    let begun = std::time::Instant::now();
    let gateway = Gateway::load(prefix)?;
    crate::state::release_garbage();
    let config = gateway.config.load_full();
    if let Some(log) = config.gateway.access_log.as_ref().filter(|l| l.enable) {
        crate::access_log::start(gateway.prefix.dir.join(&log.path), &log.format, log.buffer)?;
    }
    crate::metrics::register_sources(&gateway);
    let acme = crate::acme::Settings {
        data_dir: gateway.prefix.data_dir(),
        defaults: config.gateway.acme.clone().unwrap_or_default(),
        trusted: config.gateway.ssl.ssl_trusted_certificate.as_ref().map(|f| gateway.prefix.dir.join(f)),
        fleet: match config.deployment.config_provider {
            ConfigProvider::Etcd => Some(crate::acme::fleet::Settings {
                etcd: config.deployment.etcd.clone(),
                prefix: format!("{}_acme", config.deployment.prefix),
            }),
            ConfigProvider::Yaml => None,
        },
    };
    let weak = std::sync::Arc::downgrade(&gateway);
    crate::acme::start(acme, move || {
        if let Some(g) = weak.upgrade() {
            // Off the ACME thread: a rebuild may take a while at 10,000 routes.
            std::thread::spawn(move || g.rebuild("an ACME certificate was stored"));
        }
    })?;
    crate::acme::sync(&gateway.resources.load().ssls);
    // Watch resources before any listener is up: a change made as soon as a port answers is a
    // change from what was loaded, never the watcher's starting point.
    match config.deployment.config_provider {
        ConfigProvider::Yaml => crate::watch::yaml::watch(gateway.prefix.resources_file(), &gateway),
        ConfigProvider::Etcd => {
            let start = gateway.etcd_start.lock().take();
            let d = &config.deployment;
            crate::watch::etcd::watch(&gateway, d.etcd.clone(), d.prefix.clone(), start);
        }
    }
    let system = actix_rt::System::new();
    system.block_on(async move {
        // Handlers first: SIGUSR1 and SIGHUP terminate a process that has none, and logrotate or
        // `systemctl reload` may send them while the listeners are still being bound.
        #[cfg(unix)]
        reopen_on_sigusr1(gateway.clone());
        #[cfg(unix)]
        reload_on_sighup(gateway.clone());
        #[cfg(unix)]
        upgrade_on_sigusr2();
        // SIGTERM and SIGINT too: one arriving as soon as a port answers must stop the gateway
        // gracefully, not kill it.
        let stop_signal = stop_signal();
        let mut servers = Vec::new();
        if config.gateway.enable_control {
            let addr = SocketAddr::new(config.gateway.control.ip, config.gateway.control.port);
            let server = crate::control::server(gateway.clone(), addr)
                .map_err(|e| format!("cannot listen on {addr} (gateway.control): {e}"))?;
            log::info!("control server listening on http://{addr}");
            servers.push(server);
        } else {
            log::info!("control server disabled (gateway.enable_control: false)");
        }
        if config.admin_enabled() {
            let d = &config.deployment;
            let addr = SocketAddr::new(d.admin.admin_listen.ip, d.admin.admin_listen.port);
            let server = crate::admin::server(gateway.clone(), d.admin.clone(), d.etcd.clone(), d.prefix.clone())
                .map_err(|e| format!("cannot listen on {addr} (deployment.admin.admin_listen): {e}"))?;
            log::info!("Admin API listening on http://{addr} (/weir/admin/, /apisix/admin/)");
            servers.push(server);
        }
        for entry in &gateway.enabled.load().listed {
            let Some(listener) = entry.plugin.listener(config.plugin_attr.get(entry.name)) else { continue };
            let (addr, key) = (listener.addr, listener.key.clone());
            let server = crate::control::plugin_listener(entry.name, listener)
                .map_err(|e| format!("cannot listen on {addr} ({key}): {e}"))?;
            log::info!("plugin {} listening on http://{addr}", entry.name);
            servers.push(server);
        }
        let data_plane = crate::dataplane::server::DataPlane::start(gateway.clone(), &config)?;
        let workers = config.gateway.worker_processes.count();
        for l in &config.gateway.node_listen {
            let h2c = if l.http2(false) { ", cleartext HTTP/2" } else { "" };
            log::info!("data plane listening on http://{} ({workers} workers{h2c})", l.addr());
        }
        if config.gateway.ssl.enable {
            for l in &config.gateway.ssl.listen {
                log::info!("data plane listening on https://{} (TLS; certificates from ssls)", l.addr());
            }
            if gateway.resources.load().certs.is_empty() {
                log::warn!("gateway.ssl is enabled but no ssls resource is loaded: TLS handshakes will fail");
            }
        }
        let names: Vec<&str> = gateway.enabled.load().listed.iter().map(|e| e.name).collect();
        log::info!(
            "weir {} started in {} ms; plugins: [{}]; resources: {}",
            env!("CARGO_PKG_VERSION"),
            begun.elapsed().as_millis(),
            names.join(", "),
            gateway.resources.load().summary()
        );
        let handles: Vec<_> = servers.iter().map(|s| s.handle()).collect();
        for server in servers {
            actix_rt::spawn(server);
        }
        // Every listener is bound: tell systemd (Type=notify), when it started us; after a
        // binary upgrade, this process is the service's main process from now on.
        match crate::handover::finish_takeover() {
            Some(old) => {
                log::info!("upgrade: serving; the previous process ({old}) drains and exits");
                let pid = std::process::id();
                notify_systemd(&[sd_notify::NotifyState::MainPid(pid), sd_notify::NotifyState::Ready]);
            }
            None => notify_systemd(&[sd_notify::NotifyState::Ready]),
        }
        match stop_signal.await {
            Stop::Terminate => {
                notify_systemd(&[sd_notify::NotifyState::Stopping]);
                log::info!("shutting down: finishing in-flight requests");
            }
            // The new process is the service now: systemd must not hear that it stops.
            Stop::Drain => log::info!("SIGQUIT: draining (no new connections), then exiting"),
        }
        // New clients are refused from here on (once each worker has dropped its own copy).
        crate::handover::release();
        for h in handles {
            h.stop(true).await;
        }
        // Blocking: the data-plane workers finish their in-flight requests (up to the grace).
        let _ = actix_rt::task::spawn_blocking(move || data_plane.stop()).await;
        // In-flight requests are done (their log phases ran): let plugins flush what they hold.
        for entry in gateway.catalog_entries() {
            entry.plugin.shutdown();
        }
        crate::access_log::flush();
        log::info!("stopped");
        drop(gateway);
        Ok(())
    })
}

/// SIGUSR1: plugins reopen their log files (after rotation).
#[cfg(unix)]
fn reopen_on_sigusr1(gateway: std::sync::Arc<Gateway>) {
    use actix_rt::signal::unix::{signal, SignalKind};
    match signal(SignalKind::user_defined1()) {
        Ok(mut usr1) => {
            actix_rt::spawn(async move {
                while usr1.recv().await.is_some() {
                    log::info!("SIGUSR1: reopening log files");
                    crate::error_log::reopen();
                    crate::access_log::reopen();
                    for entry in gateway.catalog_entries() {
                        entry.plugin.reopen_logs();
                    }
                }
            });
        }
        Err(e) => log::warn!("cannot listen for SIGUSR1: {e}"),
    }
}

/// SIGHUP: reload plugins, as `PUT /v1/plugins/reload` does (systemd's `ExecReload`).
#[cfg(unix)]
fn reload_on_sighup(gateway: std::sync::Arc<Gateway>) {
    use actix_rt::signal::unix::{signal, SignalKind};
    match signal(SignalKind::hangup()) {
        Ok(mut hup) => {
            actix_rt::spawn(async move {
                while hup.recv().await.is_some() {
                    notify_systemd(&[sd_notify::NotifyState::Reloading]);
                    let gw = gateway.clone();
                    match actix_rt::task::spawn_blocking(move || gw.reload_plugins()).await {
                        Ok(Ok(names)) => log::info!("SIGHUP: plugins reloaded: {}", names.join(", ")),
                        Ok(Err(e)) => log::error!("SIGHUP: plugin reload refused, the previous plugins stay: {e}"),
                        Err(e) => log::error!("SIGHUP: plugin reload failed: {e}"),
                    }
                    notify_systemd(&[sd_notify::NotifyState::Ready]);
                }
            });
        }
        Err(e) => log::warn!("cannot listen for SIGHUP: {e}"),
    }
}

/// Tells systemd about a state change; nothing when not started by systemd (`NOTIFY_SOCKET`).
fn notify_systemd(state: &[sd_notify::NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        if let Err(e) = sd_notify::notify(false, state) {
            log::warn!("cannot notify systemd: {e}");
        }
    }
}

/// Why the gateway stops.
enum Stop {
    /// SIGTERM or SIGINT.
    Terminate,
    /// SIGQUIT: a binary upgrade's new process took over; finish and exit quietly.
    Drain,
}

/// SIGUSR2: a binary upgrade (`handover`): a new process of the binary takes over the listeners.
#[cfg(unix)]
fn upgrade_on_sigusr2() {
    use actix_rt::signal::unix::{signal, SignalKind};
    match signal(SignalKind::user_defined2()) {
        Ok(mut usr2) => {
            actix_rt::spawn(async move {
                while usr2.recv().await.is_some() {
                    match crate::handover::start_successor() {
                        Ok(pid) => log::info!("SIGUSR2: started the new process ({pid}); it takes over when it serves"),
                        Err(e) => log::error!("SIGUSR2: upgrade not started, this process keeps serving: {e}"),
                    }
                }
            });
        }
        Err(e) => log::warn!("cannot listen for SIGUSR2: {e}"),
    }
}

/// Installs the SIGTERM, SIGINT and SIGQUIT handlers now; the future ends when one arrives.
#[cfg(unix)]
fn stop_signal() -> impl std::future::Future<Output = Stop> {
    use actix_rt::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    let quit = signal(SignalKind::quit());
    async move {
        match (term, int, quit) {
            (Ok(mut term), Ok(mut int), Ok(mut quit)) => {
                tokio::select! {
                    _ = term.recv() => Stop::Terminate,
                    _ = int.recv() => Stop::Terminate,
                    _ = quit.recv() => Stop::Drain,
                }
            }
            _ => {
                let _ = actix_rt::signal::ctrl_c().await;
                Stop::Terminate
            }
        }
    }
}

#[cfg(not(unix))]
fn stop_signal() -> impl std::future::Future<Output = Stop> {
    async {
        let _ = actix_rt::signal::ctrl_c().await;
        Stop::Terminate
    }
}
