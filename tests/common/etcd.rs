//! A throwaway etcd server and a gateway with the Admin API on it, for tests that write
//! resources the way operators do (`PUT /apisix/admin/...`). Without `etcd`/`etcdctl`
//! installed, [`Etcd::start`] gives `None` and the caller reports the test as skipped (CI sets
//! `WEIR_REQUIRE_ETCD`, which turns that into a failure).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{eventually, free_port, request, Prefix, Response, Weir};

/// The Admin API key of [`gateway_with_admin`].
pub const ADMIN_KEY: &str = "edge-admin-key";

/// A running etcd; stopped and its data removed on drop.
pub struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    client: u16,
    peer: u16,
}

impl Etcd {
    /// Starts etcd on free ports, or `None` when it is not installed.
    pub fn start() -> Option<Etcd> {
        if Command::new("etcd").arg("--version").output().is_err()
            || Command::new("etcdctl").arg("version").output().is_err()
        {
            assert!(
                std::env::var_os("WEIR_REQUIRE_ETCD").is_none(),
                "WEIR_REQUIRE_ETCD is set but etcd is not installed"
            );
            return None;
        }
        let dir = std::env::temp_dir().join(format!("weir-etcd-{}-{}", std::process::id(), free_port()));
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "weir-test", "--data-dir"])
            .arg(&dir)
            .args(["--listen-client-urls", &endpoint, "--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("weir-test={peer_url}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd");
        let etcd = Etcd { child: Some(child), dir, client, peer };
        let up = eventually(Duration::from_secs(20), || {
            Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &etcd.endpoint(), "endpoint", "health"])
                .output()
                .is_ok_and(|o| o.status.success())
        });
        assert!(up, "etcd did not come up");
        Some(etcd)
    }

    /// `http://127.0.0.1:<client port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A gateway on `etcd` with its Admin API (key [`ADMIN_KEY`]); the Admin API's port.
pub fn gateway_with_admin(etcd: &Etcd, extra: &str) -> (Prefix, Weir, u16) {
    gateway_with_admin_and(etcd, "", extra)
}

/// [`gateway_with_admin`] with `gateway_extra` lines under `gateway:`.
pub fn gateway_with_admin_and(etcd: &Etcd, gateway_extra: &str, extra: &str) -> (Prefix, Weir, u16) {
    let admin = free_port();
    let deployment = format!(
        "{extra}\ndeployment:\n  config_provider: etcd\n  etcd:\n    host: [\"{}\"]\n    timeout: 2\n  admin:\n    admin_listen: {{ip: 127.0.0.1, port: {admin}}}\n    admin_key:\n      - {{name: ops, key: {ADMIN_KEY}, role: admin}}\n",
        etcd.endpoint()
    );
    let p = Prefix::new(gateway_extra, &deployment, "");
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    w.wait_ready(SocketAddr::from(([127, 0, 0, 1], admin)));
    (p, w, admin)
}

/// One Admin API call with the admin key.
pub fn admin(port: u16, method: &str, path: &str, body: &str) -> Response {
    let headers = [("Content-Type", "application/json"), ("X-API-KEY", ADMIN_KEY)];
    request(SocketAddr::from(([127, 0, 0, 1], port)), method, path, &headers, body.as_bytes())
}
