//! conf/resources.yaml is watched: valid edits apply within a second, invalid ones are logged
//! and the last good set stays.

mod common;

use std::time::{Duration, Instant};

use common::*;

#[test]
fn valid_edit_applies_within_a_second() {
    let p = Prefix::new("", "", "routes:\n  - {id: 1, uri: /a}\n");
    let _w = Weir::start(&p);
    assert_eq!(get(p.control(), "/v1/route/1").json()["uri"], "/a");
    let t = Instant::now();
    p.write_resources("routes:\n  - {id: 1, uri: /b}\n  - {id: 2, uri: /c}\n");
    assert!(eventually(Duration::from_secs(1), || get(p.control(), "/v1/route/1").json()["uri"] == "/b"));
    let took = t.elapsed();
    assert_eq!(get(p.control(), "/v1/route/2").json()["uri"], "/c");
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

#[test]
fn invalid_edit_is_logged_and_last_good_set_stays() {
    let p = Prefix::new("", "", "routes:\n  - {id: 1, uri: /a}\n");
    let w = Weir::start(&p);
    p.write_resources(
        "routes:\n  - {id: 1, uri: /a}\n  - {id: 7, uri: /b, upstream: {nodes: {\"h:1\": 1}, scheme: gopher}}\n",
    );
    assert!(
        eventually(Duration::from_secs(3), || w.log_text().contains("keeping the last good")
            || w.log_text().contains("invalid, keeping")),
        "{}",
        w.log_text()
    );
    let log = w.log_text();
    assert!(log.contains("resources.yaml: routes[1] (id 7): upstream.scheme"), "{log}");
    assert_eq!(get(p.control(), "/v1/routes").json().as_array().map(Vec::len), Some(1));
    // A broken YAML file is also survived.
    p.write_resources("routes: [\n");
    assert!(eventually(Duration::from_secs(3), || w.log_text().contains("invalid YAML")), "{}", w.log_text());
    assert_eq!(get(p.control(), "/v1/route/1").status, 200);
    // And the next valid edit applies.
    p.write_resources("routes:\n  - {id: 9, uri: /z}\n");
    assert!(eventually(Duration::from_secs(2), || get(p.control(), "/v1/route/9").status == 200));
    assert_eq!(get(p.control(), "/v1/route/1").status, 404);
}

#[test]
fn deleting_the_file_empties_nothing_until_it_is_valid() {
    // Removing resources.yaml is treated as an empty set (the documented behaviour for a missing
    // file), so it applies; recreating it applies again.
    let p = Prefix::new("", "", "routes:\n  - {id: 1, uri: /a}\n");
    let _w = Weir::start(&p);
    std::fs::remove_file(p.dir.join("conf/resources.yaml")).expect("remove resources");
    assert!(eventually(Duration::from_secs(2), || get(p.control(), "/v1/routes").json().as_array().map(Vec::len)
        == Some(0)));
    p.write_resources("routes:\n  - {id: 2, uri: /b}\n");
    assert!(eventually(Duration::from_secs(2), || get(p.control(), "/v1/route/2").status == 200));
}
