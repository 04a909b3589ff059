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
    expected.sort_unstable();
    let p = Prefix::new("", "", "");
    let _w = Weir::start(&p);
    let schema = get(p.control(), "/v1/schema").json();
    let mut listed: Vec<String> =
        schema["plugins"].as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
    listed.sort_unstable();
    assert_eq!(listed, expected);
}
