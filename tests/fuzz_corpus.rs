//! The fuzz targets run over their seed corpus (`fuzz/corpus/<target>`) and over every input a
//! fuzzer ever crashed on (`fuzz/regressions/<target>`), as ordinary tests: the invariants the
//! fuzzers check hold on every input we know of, on every `cargo test`.

use std::path::Path;

fn each_input(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut count = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else { continue };
        for entry in entries.flatten() {
            let data = std::fs::read(entry.path()).unwrap_or_else(|e| panic!("{}: {e}", entry.path().display()));
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{target} broke an invariant on {}", entry.path().display());
            count += 1;
        }
    }
    assert!(count > 0, "no seed corpus for {target}");
}

#[test]
fn path_route() {
    each_input("path_route", weir::fuzzing::path_route);
}

#[test]
fn config_yaml() {
    each_input("config_yaml", weir::fuzzing::config_yaml);
}

#[test]
fn resources_yaml() {
    each_input("resources_yaml", weir::fuzzing::resources_yaml);
}

#[cfg(feature = "short-url")]
#[test]
fn short_url_body() {
    each_input("short_url_body", weir_plugin_short_url::validate::fuzz_batch);
}

#[cfg(feature = "short-url")]
#[test]
fn short_url_manage() {
    each_input("short_url_manage", weir_plugin_short_url::validate::fuzz_manage);
}

#[cfg(feature = "short-url")]
#[test]
fn short_url_search() {
    each_input("short_url_search", weir_plugin_short_url::store::links::fuzz_search);
}

#[cfg(feature = "openid-connect")]
#[test]
fn oidc_session() {
    each_input("oidc_session", weir_plugin_openid_connect::session::fuzz_cookie);
}

#[test]
fn jwt_token() {
    each_input("jwt_token", weir_plugin::jwt::fuzz_token);
}

#[cfg(feature = "proxy-cache")]
#[test]
fn cache_entry() {
    each_input("cache_entry", weir_plugin_proxy_cache::entry::fuzz_file);
}

#[test]
fn proxy_protocol() {
    each_input("proxy_protocol", weir::fuzzing::proxy_protocol);
}

#[test]
fn expr() {
    each_input("expr", weir_plugin::expr::fuzz_expr);
}

#[cfg(feature = "opentelemetry")]
#[test]
fn traceparent() {
    each_input("traceparent", weir_plugin_opentelemetry::fuzz_traceparent);
}

#[cfg(feature = "hmac-auth")]
#[test]
fn hmac_authorization() {
    each_input("hmac_authorization", weir_plugin_hmac_auth::fuzz_authorization);
}

#[test]
fn request_stream() {
    each_input("request_stream", weir::fuzzing::request_stream);
}

#[test]
fn request_head() {
    each_input("request_head", weir::fuzzing::request_head);
}

#[test]
fn client_hello_sni() {
    each_input("client_hello_sni", weir::fuzzing::client_hello_sni);
}

#[test]
fn access_log_line() {
    each_input("access_log_line", weir::fuzzing::access_log_line);
}

#[test]
fn upstream_response() {
    each_input("upstream_response", weir::fuzzing::upstream_response);
}

#[test]
fn template() {
    each_input("template", weir::fuzzing::template);
}

#[cfg(feature = "limit-count")]
#[test]
fn resp_reply() {
    each_input("resp_reply", weir_plugin::limit::redis::resp::fuzz_reply);
}
