//! The compiled-in plugin list, from one place: the `[features]` of Cargo.toml whose value is
//! `["dep:weir-plugin-…"]`. For each one enabled, this links the plugin crate (`extern crate`,
//! without which the linker drops the crate and its `inventory` registration) and lists it in
//! `PLUGIN_FEATURES` with its kind (a crate that registers with `register_stream_plugin!` is a
//! stream plugin; one that also registers with `register_plugin!` is listed as both). A new
//! plugin is its crate plus its lines in Cargo.toml; nothing else in the host names it.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let manifest_path = Path::new(&dir).join("Cargo.toml");
    println!("cargo:rerun-if-changed=Cargo.toml");
    let manifest = std::fs::read_to_string(&manifest_path).unwrap_or_else(|e| panic!("Cargo.toml: {e}"));
    let mut externs = String::new();
    let mut list = String::from("/// Plugin features compiled into this binary: `(name, kind)`, kind `http` or `stream`.\npub const PLUGIN_FEATURES: &[(&str, &str)] = &[\n");
    let mut in_features = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_features = line == "[features]";
            continue;
        }
        if !in_features {
            continue;
        }
        let Some((feature, value)) = line.split_once(" = ") else { continue };
        let Some(krate) = value.strip_prefix("[\"dep:").and_then(|v| v.strip_suffix("\"]")) else { continue };
        if !krate.starts_with("weir-plugin-") {
            continue;
        }
        let env = format!("CARGO_FEATURE_{}", feature.to_uppercase().replace('-', "_"));
        if std::env::var_os(env).is_none() {
            continue;
        }
        let path = dependency_path(&manifest, krate).unwrap_or_else(|| panic!("Cargo.toml: no path for {krate}"));
        let lib = Path::new(&dir).join(path).join("src/lib.rs");
        println!("cargo:rerun-if-changed={}", lib.display());
        let source = std::fs::read_to_string(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
        let _ = writeln!(externs, "extern crate {};", krate.replace('-', "_"));
        // A crate may register both kinds under one name (limit-conn, as APISIX has it).
        let stream = source.contains("register_stream_plugin!(");
        let http = source.contains("register_plugin!(") || !stream;
        for (kind, on) in [("http", http), ("stream", stream)] {
            if on {
                let _ = writeln!(list, "    ({feature:?}, {kind:?}),");
            }
        }
    }
    list.push_str("];\n");
    let out = Path::new(&std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into())).join("plugins.rs");
    std::fs::write(&out, externs + &list).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
}

/// The `path` of dependency `krate` in the manifest.
fn dependency_path<'m>(manifest: &'m str, krate: &str) -> Option<&'m str> {
    let line = manifest.lines().find(|l| l.trim_start().starts_with(&format!("{krate} = ")))?;
    let rest = &line[line.find("path = \"")? + 8..];
    Some(&rest[..rest.find('"')?])
}
