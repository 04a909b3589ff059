//! The binary's plugin set follows the cargo features it was built with: `/v1/schema` lists
//! exactly the compiled-in plugins (CI also runs this with a reduced feature set).

mod common;

use common::*;

#[test]
fn schema_lists_exactly_the_compiled_plugins() {
    let mut expected: Vec<&str> = Vec::new();
    if cfg!(feature = "example-plugin") {
        expected.push("example-plugin");
    }
    if cfg!(feature = "key-auth") {
        expected.push("key-auth");
    }
    if cfg!(feature = "short-url") {
        expected.push("short-url");
    }
    if cfg!(feature = "limit-count") {
        expected.push("limit-count");
    }
    if cfg!(feature = "proxy-rewrite") {
        expected.push("proxy-rewrite");
    }
    if cfg!(feature = "response-rewrite") {
        expected.push("response-rewrite");
    }
    if cfg!(feature = "request-id") {
        expected.push("request-id");
    }
    if cfg!(feature = "file-logger") {
        expected.push("file-logger");
    }
    expected.sort_unstable();
    let p = Prefix::new("", "", "");
    let _w = Weir::start(&p);
    let schema = get(p.control(), "/v1/schema").json();
    let mut listed: Vec<String> =
        schema["plugins"].as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
    listed.sort_unstable();
    assert_eq!(listed, expected);
}
