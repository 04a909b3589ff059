//! The data plane: client requests on `gateway.node_listen`, matched to routes, run through
//! plugins, proxied to upstream nodes.

pub mod body;
pub mod client;
pub mod headers;
pub mod normalize;
pub mod proxy;
pub mod router;
pub mod tls;
pub mod upstream;

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::KeepAlive;
use actix_web::{web, App, HttpServer};

use crate::config::{Config, EscapedSlashes};
use crate::state::Gateway;

/// Seconds in-flight requests get to finish on SIGTERM.
pub const SHUTDOWN_GRACE_SECS: u64 = 30;

/// Binds every data-plane listener (the caller runs the server).
pub fn server(gateway: Arc<Gateway>, config: &Config) -> Result<actix_web::dev::Server, String> {
    let data = web::Data::from(gateway);
    let rules = normalize::PathRules {
        merge_slashes: config.gateway.merge_slashes,
        reject_escaped_slashes: config.gateway.escaped_slashes == EscapedSlashes::Reject,
    };
    let mut server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .app_data(web::Data::new(proxy::Worker::new(rules)))
            .default_service(web::to(proxy::handle))
    })
    .workers(config.gateway.worker_processes.count())
    .keep_alive(KeepAlive::Timeout(Duration::from_secs(75)))
    .client_request_timeout(Duration::from_secs(60))
    .shutdown_timeout(SHUTDOWN_GRACE_SECS)
    .disable_signals();
    for listen in &config.gateway.node_listen {
        let addr = listen.addr();
        server = server.bind(addr).map_err(|e| format!("cannot listen on {addr} (gateway.node_listen): {e}"))?;
    }
    Ok(server.run())
}
