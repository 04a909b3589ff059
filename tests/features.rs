//! The binary's plugin set follows the cargo features it was built with: `/v1/schema` lists
//! exactly the compiled-in plugins, HTTP and stream (CI also runs this with a reduced feature set,
//! which has no stream plugin).

mod common;

use common::*;

#[test]
fn schema_lists_exactly_the_compiled_plugins() {
    let compiled = [
        ("example-plugin", cfg!(feature = "example-plugin")),
        ("key-auth", cfg!(feature = "key-auth")),
        ("basic-auth", cfg!(feature = "basic-auth")),
        ("forward-auth", cfg!(feature = "forward-auth")),
        ("short-url", cfg!(feature = "short-url")),
        ("limit-count", cfg!(feature = "limit-count")),
        ("proxy-rewrite", cfg!(feature = "proxy-rewrite")),
        ("response-rewrite", cfg!(feature = "response-rewrite")),
        ("request-id", cfg!(feature = "request-id")),
        ("file-logger", cfg!(feature = "file-logger")),
        ("prometheus", cfg!(feature = "prometheus")),
    ];
    let mut expected: Vec<&str> = compiled.iter().filter(|(_, on)| *on).map(|(name, _)| *name).collect();
    expected.sort_unstable();
    let p = Prefix::new("", "", "");
    let _w = Weir::start(&p);
    let schema = get(p.control(), "/v1/schema").json();
    let mut listed: Vec<String> =
        schema["plugins"].as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
    listed.sort_unstable();
    assert_eq!(listed, expected);

    // Stream plugins likewise: a build without their features lists none.
    let stream = [
        ("ip-restriction", cfg!(feature = "ip-restriction")),
        ("limit-conn", cfg!(feature = "limit-conn")),
        ("stream-file-logger", cfg!(feature = "stream-file-logger")),
    ];
    let mut expected: Vec<&str> = stream.iter().filter(|(_, on)| *on).map(|(name, _)| *name).collect();
    expected.sort_unstable();
    let mut listed: Vec<String> =
        schema["stream-plugins"].as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
    listed.sort_unstable();
    assert_eq!(listed, expected);
}
