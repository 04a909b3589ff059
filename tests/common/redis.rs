//! Real Redis servers for tests (`redis-server` and `redis-cli` from Debian's redis-server
//! package): a standalone server or a three-primary Redis Cluster on free loopback ports, in a
//! scratch directory, killed on drop. Without the binaries the tests that need them report
//! themselves skipped (and fail if `WEIR_REQUIRE_REDIS` is set, as in CI).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Redis {
    pub children: Vec<Child>,
    pub dir: PathBuf,
    pub ports: Vec<u16>,
}

pub fn installed() -> bool {
    let ok = Command::new("redis-server").arg("--version").output().is_ok()
        && Command::new("redis-cli").arg("--version").output().is_ok();
    if !ok {
        // CI installs Redis: there these tests must run, never skip.
        assert!(
            std::env::var_os("WEIR_REQUIRE_REDIS").is_none(),
            "WEIR_REQUIRE_REDIS is set but redis-server is not installed"
        );
    }
    ok
}

impl Redis {
    pub fn scratch() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weir-redis-{}-{}", std::process::id(), super::free_port()));
        std::fs::create_dir_all(&dir).expect("redis dir");
        dir
    }

    /// One standalone server, with `extra` arguments (e.g. `--requirepass`).
    pub fn single(extra: &[&str]) -> Option<Redis> {
        if !installed() {
            return None;
        }
        let mut r = Redis { children: Vec::new(), dir: Self::scratch(), ports: vec![super::free_port()] };
        r.spawn(0, extra);
        Some(r)
    }

    /// A three-primary Redis Cluster.
    pub fn cluster() -> Option<Redis> {
        if !installed() {
            return None;
        }
        let ports = vec![super::free_port(), super::free_port(), super::free_port()];
        let mut r = Redis { children: Vec::new(), dir: Self::scratch(), ports };
        for i in 0..3 {
            let conf = r.dir.join(format!("nodes-{i}.conf"));
            let bus = super::free_port().to_string();
            let conf = conf.to_string_lossy().into_owned();
            r.spawn(i, &["--cluster-enabled", "yes", "--cluster-config-file", &conf, "--cluster-port", &bus]);
        }
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(r.ports.iter().map(|p| format!("127.0.0.1:{p}")));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        let out = Command::new("redis-cli").args(&args).output().expect("redis-cli --cluster create");
        assert!(out.status.success(), "cluster create: {}", String::from_utf8_lossy(&out.stdout));
        let ok = super::eventually(Duration::from_secs(20), || {
            r.ports.iter().all(|p| r.cli(*p, &["cluster", "info"]).contains("cluster_state:ok"))
        });
        assert!(ok, "the cluster did not become ready");
        Some(r)
    }

    pub fn spawn(&mut self, i: usize, extra: &[&str]) {
        let port = self.ports[i].to_string();
        let child = Command::new("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        if self.children.len() > i {
            self.children[i] = child;
        } else {
            self.children.push(child);
        }
        let p = self.ports[i];
        let up = super::eventually(Duration::from_secs(10), || {
            let r = self.cli(p, &["ping"]);
            r.contains("PONG") || r.contains("NOAUTH")
        });
        assert!(up, "redis-server on {p} did not come up");
    }

    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli").args(["-p", &port.to_string()]).args(args).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    }

    pub fn stop(&mut self, i: usize) {
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
