//! Plugin control endpoints (matchit, literal vs parameter mode) and `PUT /v1/plugins/reload`.

mod common;

use common::*;
use serde_json::json;

#[test]
fn example_plugin_hello_as_text_and_json() {
    let p = Prefix::new("", "", "");
    let _w = Weir::start(&p);
    let r = get(p.control(), "/v1/plugin/example-plugin/hello");
    assert_eq!((r.status, r.text().as_str()), (200, "world\n"));
    assert!(r.header("content-type").unwrap_or("").starts_with("text/plain"));
    let r = get(p.control(), "/v1/plugin/example-plugin/hello?json");
    assert_eq!(r.json(), json!({"msg": "world"}));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let r = get(p.control(), "/v1/plugin/example-plugin/hello?a=1&json=");
    assert_eq!(r.json(), json!({"msg": "world"}));
}

#[test]
fn without_router_parameters_match_literally() {
    let p = Prefix::new("", "", "");
    let _w = Weir::start(&p);
    let r = get(p.control(), "/v1/plugin/example-plugin/echo/hi");
    assert_eq!(r.status, 404, "{}", r.text());
    let r = get(p.control(), "/v1/plugin/example-plugin/echo/:word");
    assert_eq!((r.status, r.text().as_str()), (200, ":word\n"));
}

#[test]
fn with_radixtree_router_parameters_capture_one_segment() {
    let p = Prefix::new("  control:\n    port: 0\n", "", "");
    // `control:` above is overwritten below; write the whole config explicitly instead.
    p.write(
        "conf/config.yaml",
        &format!(
            "gateway:\n  ssl: {{enable: false}}\n  node_listen: [{}]\n  control:\n    port: {}\n    router: radixtree_uri_with_parameter\nplugin_attr:\n  prometheus:\n    export_addr: {{ip: 127.0.0.1, port: {}}}\n",
            p.node_port, p.control_port, p.metrics_port
        ),
    );
    let _w = Weir::start(&p);
    let r = get(p.control(), "/v1/plugin/example-plugin/echo/hi");
    assert_eq!((r.status, r.text().as_str()), (200, "hi\n"));
    let r = get(p.control(), "/v1/plugin/example-plugin/echo/caf%C3%A9");
    assert_eq!((r.status, r.text().as_str()), (200, "caf%C3%A9\n"), "parameters are not decoded");
    // Exactly one non-empty segment.
    assert_eq!(get(p.control(), "/v1/plugin/example-plugin/echo/").status, 404);
    assert_eq!(get(p.control(), "/v1/plugin/example-plugin/echo/a/b").status, 404);
    // Static endpoints still work.
    assert_eq!(get(p.control(), "/v1/plugin/example-plugin/hello").text(), "world\n");
}

fn plugins_config(p: &Prefix, plugins: &[&str]) -> String {
    let list: Vec<String> = plugins.iter().map(|n| format!("  - {n}\n")).collect();
    format!(
        "gateway:\n  ssl: {{enable: false}}\n  node_listen: [{}]\n  control:\n    port: {}\nplugins:\n{}",
        p.node_port,
        p.control_port,
        list.concat()
    )
}

#[test]
fn reload_removes_and_restores_a_plugin() {
    let p = Prefix::new("", "", "plugin_metadata:\n  - {id: example-plugin, ikey: 1, skey: v}\n");
    p.write("conf/config.yaml", &plugins_config(&p, &["example-plugin", "key-auth"]));
    let _w = Weir::start(&p);
    let c = p.control();
    assert!(get(c, "/v1/schema").json()["plugins"]["example-plugin"].is_object());
    assert_eq!(get(c, "/v1/plugin/example-plugin/hello").status, 200);

    p.write("conf/config.yaml", &plugins_config(&p, &["key-auth"]));
    let r = request(c, "PUT", "/v1/plugins/reload", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["plugins"], json!(["key-auth"]));
    let schema = get(c, "/v1/schema").json();
    assert!(schema["plugins"].get("example-plugin").is_none(), "{}", schema["plugins"]);
    assert!(schema["plugins"]["key-auth"].is_object());
    let r = get(c, "/v1/plugin/example-plugin/hello");
    assert_eq!((r.status, r.json()), (404, json!({"error_msg": "not found"})));
    // Metadata of a disabled plugin is not reported.
    assert_eq!(get(c, "/v1/plugin_metadatas").json(), json!([]));

    p.write("conf/config.yaml", &plugins_config(&p, &["key-auth", "example-plugin"]));
    assert_eq!(request(c, "PUT", "/v1/plugins/reload", &[], b"").status, 200);
    assert_eq!(get(c, "/v1/plugin/example-plugin/hello").text(), "world\n");
    assert_eq!(get(c, "/v1/plugin_metadatas").json()[0]["id"], "example-plugin");
}

#[test]
fn failed_reload_keeps_the_running_plugins() {
    let p = Prefix::new("", "", "routes:\n  - {id: 1, uri: /x, plugins: {example-plugin: {i: 1}}}\n");
    p.write("conf/config.yaml", &plugins_config(&p, &["example-plugin"]));
    let _w = Weir::start(&p);
    let c = p.control();

    // A typo in the plugin list.
    p.write("conf/config.yaml", &plugins_config(&p, &["exmaple-plugin"]));
    let r = request(c, "PUT", "/v1/plugins/reload", &[], b"");
    assert_eq!(r.status, 400);
    let msg = r.json()["error_msg"].as_str().unwrap_or_default().to_owned();
    assert!(
        msg.contains("config.yaml: plugins[0]: unknown plugin `exmaple-plugin` (did you mean `example-plugin`?)"),
        "{msg}"
    );
    assert_eq!(get(c, "/v1/plugin/example-plugin/hello").status, 200);

    // Disabling a plugin a route still uses would silently drop it from that route: refused.
    p.write("conf/config.yaml", &plugins_config(&p, &["key-auth"]));
    let r = request(c, "PUT", "/v1/plugins/reload", &[], b"");
    assert_eq!(r.status, 400);
    let msg = r.json()["error_msg"].as_str().unwrap_or_default().to_owned();
    assert!(
        msg.contains(
            "routes[0] (id 1): plugins.example-plugin: plugin `example-plugin` is compiled in but not enabled"
        ),
        "{msg}"
    );
    assert!(get(c, "/v1/schema").json()["plugins"]["example-plugin"].is_object());
}
