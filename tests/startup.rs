//! Start-up: CLI, configuration errors (file, key path, reason), listener rules, `weir -t`.

mod common;

use common::*;

#[test]
fn version_and_help() {
    let (code, out) = run_weir(&["--version"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), format!("weir {}", env!("CARGO_PKG_VERSION")));
    let (code, out) = run_weir(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--prefix"));
    let (code, out) = run_weir(&["--frobnicate"]);
    assert_eq!(code, 2);
    assert!(out.contains("unknown argument `--frobnicate`"), "{out}");
}

#[test]
fn test_mode_accepts_valid_and_rejects_invalid() {
    let p = Prefix::new("", "", "routes:\n  - {id: 1, uri: /a, upstream: {nodes: {\"127.0.0.1:80\": 1}}}\n");
    let dir = path_str(&p.dir);
    let (code, out) = run_weir(&["-t", "-p", &dir]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("are valid"), "{out}");
    p.write_resources("routes:\n  - {id: 1, uri: /a, upstream_id: 7}\n");
    let (code, out) = run_weir(&["-t", "-p", &dir]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("resources.yaml: routes[0] (id 1): upstream_id: upstream `7` does not exist"), "{out}");
}

/// Every file and directory under `dir`, relative, sorted.
fn tree(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = e.path();
            out.push(path.strip_prefix(dir).map(|p| p.display().to_string()).unwrap_or_default());
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn test_mode_has_no_side_effects() {
    // A data plane port held by someone else, a log file in a directory that does not exist yet,
    // the SQLite store, and PostgreSQL on a port where nothing listens: -t must touch none of them.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy_port = busy.local_addr().expect("addr").port();
    let pg_port = free_port();
    let p = Prefix::new("", "", "");
    p.write(
        "conf/config.yaml",
        &format!(
            "gateway:\n  ssl: {{enable: false}}\n  node_listen: [{busy_port}]\n  control:\n    port: {}\n",
            p.control_port
        ),
    );
    p.write_resources(
        "routes:\n  - {id: 1, uri: /a, upstream: {nodes: {\"127.0.0.1:80\": 1}}, plugins: {file-logger: {path: logs/deep/access.log}}}\n  - {id: 2, uri: /s, plugins: {short-url: {action: create}}}\n",
    );
    let before = tree(&p.dir);
    let (code, out) = run_weir(&["-t", "-p", &path_str(&p.dir)]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(tree(&p.dir), before, "weir -t created files: {out}");
    // PostgreSQL storage is not connected to, but a malformed URL is still an error.
    p.write(
        "conf/config.yaml",
        &format!(
            "gateway:\n  ssl: {{enable: false}}\n  node_listen: [{busy_port}]\n  control:\n    port: {}\nplugin_attr:\n  short-url:\n    storage: {{backend: postgres, url: \"postgres://weir@127.0.0.1:{pg_port}/weir\"}}\n",
            p.control_port
        ),
    );
    let (code, out) = run_weir(&["-t", "-p", &path_str(&p.dir)]);
    assert_eq!(code, 0, "{out}");
    p.write(
        "conf/config.yaml",
        &format!(
            "gateway:\n  control:\n    port: {}\nplugin_attr:\n  short-url:\n    storage: {{backend: postgres, url: \"postgres://weir@127.0.0.1:notaport/weir\"}}\n",
            p.control_port
        ),
    );
    let (code, out) = run_weir(&["-t", "-p", &path_str(&p.dir)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("plugin_attr.short-url: storage.url: "), "{out}");
    drop(busy);
}

#[test]
fn shipped_configuration_is_valid() {
    let root = env!("CARGO_MANIFEST_DIR");
    let (code, out) = run_weir(&["-t", "-p", root]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn non_loopback_control_ip_is_refused() {
    for ip in ["0.0.0.0", "10.1.2.3", "::"] {
        let p = Prefix::new("", "", "");
        p.write(
            "conf/config.yaml",
            &format!(
                "gateway:\n  ssl: {{enable: false}}\n  node_listen: [{}]\n  control:\n    ip: \"{ip}\"\n    port: {}\n",
                p.node_port, p.control_port
            ),
        );
        let (code, out) = start_refused(&p);
        assert_ne!(code, 0);
        assert!(out.contains(&format!("config.yaml: gateway.control.ip: {ip} is not a loopback address")), "{out}");
    }
}

#[test]
fn control_port_equal_to_data_port_is_refused() {
    let p = Prefix::new("", "", "");
    p.write(
        "conf/config.yaml",
        &format!("gateway:\n  ssl: {{enable: false}}\n  node_listen: [{0}]\n  control:\n    port: {0}\n", p.node_port),
    );
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(
        out.contains(&format!("gateway.control.port: control port {} conflicts with node_listen", p.node_port)),
        "{out}"
    );
}

#[test]
fn unknown_and_invalid_keys_name_file_key_and_reason() {
    let p = Prefix::new("", "", "");
    let cases = [
        (
            "gateway:\n  control:\n    prot: 1\n",
            "config.yaml: gateway.control.prot: unknown key (did you mean `port`?)",
        ),
        ("gatway: {}\n", "config.yaml: gatway: unknown key (did you mean `gateway`?)"),
        ("gateway:\n  worker_processes: lots\n", "config.yaml: gateway.worker_processes"),
        ("gateway:\n  node_listen: [70000]\n", "config.yaml: gateway.node_listen[0]"),
        ("plugins: [key-auht]\n", "config.yaml: plugins[0]: unknown plugin `key-auht` (did you mean `key-auth`?)"),
        ("deployment:\n  config_provider: zookeeper\n", "config.yaml: deployment.config_provider"),
        ("gateway: [\n", "config.yaml: line "),
    ];
    for (yaml, expected) in cases {
        p.write("conf/config.yaml", yaml);
        let (code, out) = start_refused(&p);
        assert_ne!(code, 0, "{yaml}");
        assert!(out.contains(expected), "config {yaml:?}\nexpected {expected:?}\ngot {out}");
        assert!(out.contains("not started"), "{out}");
    }
}

#[test]
fn invalid_resources_are_fatal_at_start_with_a_precise_message() {
    let p = Prefix::new("", "", "");
    let cases = [
        (
            "routes:\n  - {id: 1, uri: /a, upstrem: {}}\n",
            "resources.yaml: routes[0] (id 1): upstrem: unknown key (did you mean `upstream`?)",
        ),
        ("routes:\n  - {id: 1}\n", "routes[0] (id 1): uri: a route needs `uri` or `uris`"),
        ("routes:\n  - {id: 1, uri: /a, service_id: 9}\n", "routes[0] (id 1): service_id: service `9` does not exist"),
        ("routes:\n  - {id: 1, uri: /a}\n  - {id: 1, uri: /b}\n", "routes[1] (id 1): id: duplicate id `1` in routes"),
        (
            "routes:\n  - {id: 1, uri: /a, plugins: {nope: {}}}\n",
            "routes[0] (id 1): plugins.nope: unknown plugin `nope`",
        ),
        (
            "routes:\n  - {id: 1, uri: /a, plugins: {example-plugin: {}}}\n",
            "routes[0] (id 1): plugins.example-plugin.i: required key is missing",
        ),
        (
            "upstreams:\n  - {id: u, nodes: {\"127.0.0.1:0\": 1}}\n",
            "upstreams[0] (id u): nodes.127.0.0.1:0: invalid port `0`",
        ),
        (
            "upstreams:\n  - {id: u, nodes: {\"bad host:80\": 1}}\n",
            "upstreams[0] (id u): nodes.bad host:80: `bad host` in node `bad host:80` is not a host name or IP address",
        ),
        (
            "upstreams:\n  - {id: u, nodes: [{host: \"a/b\", port: 80, weight: 1}]}\n",
            "upstreams[0] (id u): nodes[0].host: `a/b` is not a host name or IP address",
        ),
        (
            "upstreams:\n  - {id: u, nodes: {\"a:80\": 1}, type: chash}\n",
            "upstreams[0] (id u): key: required when `type` is `chash`",
        ),
        (
            "upstreams:\n  - {id: u, nodes: [{host: a, port: 80, wieght: 1}]}\n",
            "upstreams[0] (id u): nodes[0].wieght: unknown key (did you mean `weight`?)",
        ),
        (
            "upstreams:\n  - {id: u, checks: {active: {healthy: {successes: 300}}}}\n",
            "upstreams[0] (id u): checks.active.healthy.successes: 300 is greater than the maximum of 254",
        ),
        (
            "consumers:\n  - {username: jack, plugins: {key-auth: {}}}\n",
            "consumers[0] (id jack): plugins.key-auth.key: required key is missing",
        ),
        (
            "plugin_metadata:\n  - {id: example-plugin, ikey: 1}\n",
            "plugin_metadata[0] (id example-plugin): skey: required key is missing",
        ),
        ("rotues: []\n", "resources.yaml: rotues: unknown key (did you mean `routes`?)"),
        // Found by schemathesis: a float too large for a Duration used to panic the builder.
        (
            "upstreams:\n  - {id: u, nodes: {\"a:80\": 1}, timeout: {connect: 1.0e300}}\n",
            "upstreams[0] (id u): timeout.connect: 1e+300 is greater than the maximum of 31536000",
        ),
        (
            "upstreams:\n  - {id: u, nodes: {\"a:80\": 1}, checks: {active: {timeout: 1.0e300}}}\n",
            "upstreams[0] (id u): checks.active.timeout: 1e+300 is greater than the maximum of 3600",
        ),
    ];
    for (yaml, expected) in cases {
        p.write_resources(yaml);
        let (code, out) = start_refused(&p);
        assert_ne!(code, 0, "{yaml}");
        assert!(out.contains(expected), "resources {yaml:?}\nexpected {expected:?}\ngot {out}");
    }
}

#[test]
fn disabled_control_server_does_not_listen() {
    let p = Prefix::new("  enable_control: false\n", "", "");
    let w = Weir::spawn(&p);
    assert!(
        eventually(std::time::Duration::from_secs(10), || w.log_text().contains("weir 0.1.0 started")),
        "{}",
        w.log_text()
    );
    assert!(w.log_text().contains("control server disabled"));
    assert!(std::net::TcpStream::connect(p.control()).is_err(), "something listens on the control port");
}

#[test]
fn sigterm_stops_the_process_cleanly() {
    let p = Prefix::new("", "", "");
    let w = Weir::start(&p);
    let status = w.terminate();
    assert!(status.success(), "{status:?}");
}
