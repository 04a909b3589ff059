//! The module layering ARCHITECTURE.md draws, checked on the source: which top-level modules
//! may name which (`crate::<module>` outside comments and test modules), and no cycle at all.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module -> the top-level modules its code names.
fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&src).expect("under src");
            let first = rel.components().next().expect("a component").as_os_str().to_string_lossy().into_owned();
            let top = first.trim_end_matches(".rs").to_owned();
            if top == "lib" || top == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read source");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for (i, _) in line.match_indices("crate::") {
                    let name: String =
                        line[i + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    if !name.is_empty() && name != top {
                        edges.entry(top.clone()).or_default().insert(name);
                    }
                }
            }
        }
    }
    edges
}

#[test]
fn lower_layers_never_name_higher_ones() {
    let edges = edges();
    let forbidden: &[(&str, &[&str])] = &[
        ("resources", &["tables", "state", "dataplane", "stream", "watch", "control", "admin", "run"]),
        ("health", &["tables", "state", "dataplane", "stream", "watch", "control", "admin", "run"]),
        ("tables", &["state", "dataplane", "stream", "watch", "control", "admin", "run"]),
        ("state", &["dataplane", "stream", "watch", "control", "admin", "run"]),
        ("stream", &["dataplane", "watch", "control", "admin", "run"]),
        ("dataplane", &["watch", "control", "admin", "run"]),
        ("control", &["dataplane", "watch", "run"]),
    ];
    for (module, never) in forbidden {
        let named = edges.get(*module).cloned().unwrap_or_default();
        for n in *never {
            assert!(!named.contains(*n), "`{module}` names `crate::{n}`: see ARCHITECTURE.md, Layering");
        }
    }
}

#[test]
fn no_two_modules_depend_on_each_other() {
    let edges = edges();
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(m) = todo.pop() {
            for n in edges.get(&m).into_iter().flatten() {
                if n == to {
                    return true;
                }
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        false
    };
    assert!(edges.len() > 10, "the scan found the modules: {edges:?}");
    for (a, named) in &edges {
        for b in named {
            assert!(!reaches(b, a), "`{a}` names `{b}`, which leads back to `{a}`");
        }
    }
}
