//! Running the gateway: start listeners, watch resources, stop gracefully on SIGTERM / SIGINT.

use crate::config::{ConfigProvider, Prefix};
use crate::resources::yaml;
use crate::state::Gateway;
use std::net::SocketAddr;

/// Loads `prefix` and serves until a termination signal. Errors are fit for the user.
pub fn run(prefix: Prefix) -> Result<(), String> {
    let begun = std::time::Instant::now();
    let gateway = Gateway::load(prefix)?;
    crate::state::release_garbage();
    let config = gateway.config.load_full();
    // Watch resources before any listener is up: a change made as soon as a port answers is a
    // change from what was loaded, never the watcher's starting point.
    match config.deployment.config_provider {
        ConfigProvider::Yaml => yaml::watch(gateway.prefix.resources_file(), &gateway),
        ConfigProvider::Etcd => {
            let start = gateway.etcd_start.lock().take();
            let d = &config.deployment;
            crate::resources::etcd::watch(&gateway, d.etcd.clone(), d.prefix.clone(), start);
        }
    }
    let system = actix_rt::System::new();
    system.block_on(async move {
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
        #[cfg(unix)]
        reopen_on_sigusr1(gateway.clone());
        wait_for_signal().await;
        log::info!("shutting down: finishing in-flight requests");
        for h in handles {
            h.stop(true).await;
        }
        // Blocking: the data-plane workers finish their in-flight requests (up to the grace).
        let _ = actix_rt::task::spawn_blocking(move || data_plane.stop()).await;
        // In-flight requests are done (their log phases ran): let plugins flush what they hold.
        for entry in gateway.catalog_entries() {
            entry.plugin.shutdown();
        }
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
                    for entry in gateway.catalog_entries() {
                        entry.plugin.reopen_logs();
                    }
                }
            });
        }
        Err(e) => log::warn!("cannot listen for SIGUSR1: {e}"),
    }
}

#[cfg(unix)]
async fn wait_for_signal() {
    use actix_rt::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = actix_rt::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = actix_rt::signal::ctrl_c().await;
}
