//! The binary's plugin set follows the cargo features it was built with: `/v1/schema` lists
//! exactly the compiled-in plugins, HTTP and stream (CI also runs this with a reduced feature set,
//! which has no stream plugin).

mod common;

use common::*;

#[test]
fn schema_lists_exactly_the_compiled_plugins() {
    // From Cargo.toml's features (build.rs): the list a new plugin never has to be added to.
    let compiled: Vec<(&str, bool)> =
        weir::PLUGIN_FEATURES.iter().map(|(name, kind)| (*name, *kind == "http")).collect();
    assert!(!cfg!(feature = "key-auth") || compiled.contains(&("key-auth", true)), "{compiled:?}");
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
    let stream: Vec<(&str, bool)> =
        weir::PLUGIN_FEATURES.iter().map(|(name, kind)| (*name, *kind == "stream")).collect();
    assert!(!cfg!(feature = "limit-conn") || stream.contains(&("limit-conn", true)), "{stream:?}");
    // limit-conn is both, as in APISIX.
    assert!(!cfg!(feature = "limit-conn") || compiled.contains(&("limit-conn", true)), "{compiled:?}");
    let mut expected: Vec<&str> = stream.iter().filter(|(_, on)| *on).map(|(name, _)| *name).collect();
    expected.sort_unstable();
    let mut listed: Vec<String> =
        schema["stream-plugins"].as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
    listed.sort_unstable();
    assert_eq!(listed, expected);
}
