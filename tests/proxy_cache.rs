//! proxy-cache end to end: the real binary, real upstreams counting their requests
//! (`/cache/...` of `common::upstream` answers with the headers the query asks for).

mod common;

use std::time::Duration;

use common::upstream::Upstream;
use common::*;

fn up(u: &Upstream) -> String {
    format!("{{nodes: {{\"{}\": 1}}}}", u.node())
}

fn status(r: &Response) -> &str {
    r.header("apisix-cache-status").unwrap_or("-")
}

fn get_with(p: &Prefix, path: &str, headers: &[(&str, &str)]) -> Response {
    request(p.node(), "GET", path, headers, b"")
}

/// Zones of the tests that declare their own.
const ZONES: &str = "  proxy_cache:\n    cache_ttl: 60s\n    zones:\n      - {name: mem, memory_size: 4m}\n      - {name: small, memory_size: 64k}\n      - {name: disk, memory_size: 1m, disk_size: 16m, disk_path: cache/disk, cache_levels: '1:2'}\n";

fn scrape(p: &Prefix) -> String {
    get(p.metrics(), "/weir/prometheus/metrics").text()
}

/// The value of the sample whose line starts with `prefix` (after the exporter's own prefix).
fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.split_once('_').is_some_and(|(_, rest)| rest.starts_with(prefix)) || l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn a_miss_is_stored_and_served_as_a_hit_from_memory_and_from_disk() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: m, uri: /cache/mem, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache}}}}}}\n  - {{id: d, uri: /cache/disk, upstream: {u}, plugins: {{proxy-cache: {{}}}}}}\n",
        u = up(&u)
    ));
    for (n, path) in ["/cache/mem", "/cache/disk"].iter().enumerate() {
        let first = get(p.node(), path);
        assert_eq!((first.status, status(&first)), (200, "MISS"), "{}", first.text());
        assert!(first.header("content-length").is_some() && first.header("transfer-encoding").is_none());
        let second = get(p.node(), path);
        assert_eq!((second.status, status(&second)), (200, "HIT"));
        assert_eq!(second.body, first.body, "the stored body");
        assert_eq!(second.header("age"), Some("0"));
        assert_eq!(second.header("x-upstream-count"), first.header("x-upstream-count"), "stored headers");
        assert_eq!(u.hits(), n + 1, "one upstream fetch per path");
        let head = request(p.node(), "HEAD", path, &[], b"");
        assert_eq!((head.status, status(&head), head.body.len()), (200, "HIT", 0), "HEAD from what GET stored");
    }
    assert!(p.dir.join("data/proxy_cache/disk_cache_one").is_dir(), "the default disk zone is under data/");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(get(p.node(), "/cache/mem").header("age"), Some("1"));
}

#[test]
fn an_entry_expires_after_its_ttl() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /cache/*, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache, cache_ttl: 1}}}}}}\n",
        u = up(&u)
    ));
    assert_eq!(status(&get(p.node(), "/cache/t")), "MISS");
    assert_eq!(status(&get(p.node(), "/cache/t")), "HIT");
    std::thread::sleep(Duration::from_millis(1150));
    let r = get(p.node(), "/cache/t");
    assert_eq!(status(&r), "EXPIRED");
    assert_eq!(u.hits(), 2);
    assert_eq!(status(&get(p.node(), "/cache/t")), "HIT", "the refetched response is stored again");
}

#[test]
fn cache_bypass_and_no_cache_as_in_apisix_docs() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: b, uri: /cache/b, upstream: {u}, plugins: {{proxy-cache: {{cache_bypass: [\"$arg_bypass\", \"$http_bypass\"]}}}}}}\n  - {{id: n, uri: /cache/n, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache, no_cache: [\"$arg_no_cache\", \"$http_no_cache\"]}}}}}}\n",
        u = up(&u)
    ));
    assert_eq!(status(&get(p.node(), "/cache/b?bypass=1")), "BYPASS");
    assert_eq!(status(&get(p.node(), "/cache/b?bypass=0")), "MISS");
    assert_eq!(status(&get(p.node(), "/cache/b?bypass=0")), "HIT");
    let r = get_with(&p, "/cache/b?bypass=0", &[("bypass", "1")]);
    assert_eq!(status(&r), "BYPASS", "any item counts");
    let before = u.hits();
    for _ in 0..3 {
        let r = get(p.node(), "/cache/n?no_cache=1");
        assert_eq!(status(&r), "MISS");
    }
    assert_eq!(u.hits(), before + 3, "no_cache: never stored");
    // `$http_no_cache` reads the `No-Cache` header (nginx's name mapping; a header spelled with
    // an underscore is another header here).
    let r = get_with(&p, "/cache/n?no_cache=0", &[("no-cache", "1")]);
    assert_eq!(status(&r), "MISS");
    assert_eq!(status(&get(p.node(), "/cache/n?no_cache=0")), "MISS");
    assert_eq!(status(&get(p.node(), "/cache/n?no_cache=0")), "HIT", "0 is not set");
}

#[test]
fn only_the_configured_statuses_and_methods_are_cached() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /cache/s, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache}}}}}}\n  - {{id: 2, uri: /cache/post, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache, cache_method: [POST]}}}}}}\n  - {{id: 3, uri: /cache/d, upstream: {u}, plugins: {{proxy-cache: {{}}}}}}\n",
        u = up(&u)
    ));
    for _ in 0..2 {
        assert_eq!(status(&get(p.node(), "/cache/s?status=500")), "MISS", "500 is not cached");
    }
    assert_eq!(get(p.node(), "/cache/s?status=404").status, 404);
    let r = get(p.node(), "/cache/s?status=404");
    assert_eq!((r.status, status(&r)), (404, "HIT"), "404 is");
    let post = request(p.node(), "POST", "/cache/s", &[], b"x");
    assert_eq!(status(&post), "MISS", "memory strategy: a method not cached says MISS (APISIX)");
    let post = request(p.node(), "POST", "/cache/d", &[], b"x");
    assert_eq!(status(&post), "BYPASS", "disk strategy: BYPASS (nginx)");
    let r = request(p.node(), "POST", "/cache/post", &[], b"x");
    assert_eq!(status(&r), "MISS");
    let r = request(p.node(), "POST", "/cache/post", &[], b"y");
    assert_eq!(status(&r), "HIT", "POST cached when listed");
    let r = get(p.node(), "/cache/post");
    assert_ne!(status(&r), "HIT", "a GET never gets a POST's entry");
}

#[test]
fn cache_control_is_honoured_when_asked() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /cache/on, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache, cache_control: true}}}}}}\n  - {{id: 2, uri: /cache/off, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache, cache_ttl: 60}}}}}}\n",
        u = up(&u)
    ));
    let short = "/cache/on?cc=max-age%3D1";
    assert_eq!(status(&get(p.node(), short)), "MISS");
    assert_eq!(status(&get(p.node(), short)), "HIT");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(status(&get(p.node(), short)), "EXPIRED", "max-age is the ttl");
    let zero = "/cache/on?cc=max-age%3D0";
    get(p.node(), zero);
    assert_eq!(status(&get(p.node(), zero)), "MISS", "already stale: not stored");
    let expired = "/cache/on?expires=Thu%2C%2001%20Jan%201970%2000%3A00%3A00%20GMT";
    get(p.node(), expired);
    assert_eq!(status(&get(p.node(), expired)), "MISS", "an Expires in the past");
    let s = "/cache/on?cc=s-maxage%3D60%2C%20max-age%3D0";
    get(p.node(), s);
    assert_eq!(status(&get(p.node(), s)), "HIT", "s-maxage first");
    assert_eq!(status(&get_with(&p, s, &[("cache-control", "no-cache")])), "BYPASS", "the client's no-cache");
    assert_eq!(status(&get_with(&p, s, &[("cache-control", "max-age=0")])), "STALE", "older than the client accepts");
    let r = get_with(&p, "/cache/on?never", &[("cache-control", "only-if-cached")]);
    assert_eq!(r.status, 504);
    // cache_control false: the upstream's max-age is not the ttl.
    let off = "/cache/off?cc=max-age%3D1";
    get(p.node(), off);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(status(&get(p.node(), off)), "HIT");
    assert_eq!(status(&get_with(&p, off, &[("cache-control", "no-cache")])), "HIT", "client directives ignored");
}

#[test]
fn private_no_store_no_cache_and_set_cookie_are_never_stored() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /cache/*, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache}}}}}}\n  - {{id: 2, uri: /cc/*, upstream: {u}, plugins: {{proxy-rewrite: {{regex_uri: [\"^/cc/(.*)\", \"/cache/$1\"]}}, proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache, cache_control: true}}}}}}\n  - {{id: 3, uri: /disk/*, upstream: {u}, plugins: {{proxy-rewrite: {{regex_uri: [\"^/disk/(.*)\", \"/cache/$1\"]}}, proxy-cache: {{}}}}}}\n",
        u = up(&u)
    ));
    for prefix in ["/cache", "/cc", "/disk"] {
        for query in
            ["cc=private", "cc=no-store", "cc=no-cache", "cc=public%2C%20private%3D%22x%22", "cookie=1", "vary=*"]
        {
            let path = format!("{prefix}/x?{query}");
            let before = u.hits();
            let first = get(p.node(), &path);
            let second = get(p.node(), &path);
            assert_eq!((first.status, second.status), (200, 200));
            assert_ne!(status(&second), "HIT", "{path}");
            assert_eq!(u.hits(), before + 2, "{path} reached the upstream twice");
        }
    }
    let r = get_with(&p, "/cache/auth", &[("authorization", "Bearer a")]);
    assert_eq!(status(&r), "MISS");
    let r = get_with(&p, "/cache/auth", &[("authorization", "Bearer b")]);
    assert_eq!(status(&r), "MISS", "a response to an Authorization no consumer accounts for is not shared");
    let r = get_with(&p, "/cache/auth?cc=public", &[("authorization", "Bearer a")]);
    assert_eq!(status(&r), "MISS");
    let r = get_with(&p, "/cache/auth?cc=public", &[("authorization", "Bearer b")]);
    assert_eq!(status(&r), "HIT", "unless the upstream says public");
}

#[test]
fn purge_removes_the_entry_of_the_key() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: m, uri: /cache/m, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache}}}}}}\n  - {{id: d, uri: /cache/d, upstream: {u}, plugins: {{proxy-cache: {{}}}}}}\n",
        u = up(&u)
    ));
    for path in ["/cache/m?a=1", "/cache/d?a=1"] {
        get(p.node(), path);
        assert_eq!(status(&get(p.node(), path)), "HIT");
        assert_eq!(request(p.node(), "PURGE", path, &[], b"").status, 200, "{path}");
        assert_eq!(request(p.node(), "PURGE", path, &[], b"").status, 404, "already purged");
        assert_eq!(status(&get(p.node(), path)), "MISS");
        assert_eq!(request(p.node(), "PURGE", "/cache/m?a=2", &[], b"").status, 404, "another key");
    }
}

#[test]
fn host_path_case_query_and_vary_keep_entries_apart() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache}}}}}}\n",
        u = up(&u)
    ));
    let a = get_with(&p, "/cache/p", &[("host", "a.test")]);
    assert_eq!(status(&a), "MISS");
    assert_eq!(status(&get_with(&p, "/cache/p", &[("host", "a.test")])), "HIT");
    let b = get_with(&p, "/cache/p", &[("host", "b.test")]);
    assert_eq!(status(&b), "MISS", "another host");
    assert_ne!(a.body, b.body);
    assert_eq!(status(&get_with(&p, "/cache/P", &[("host", "a.test")])), "MISS", "another path case");
    assert_eq!(status(&get_with(&p, "/cache/p?", &[("host", "a.test")])), "HIT", "an empty query is no query");
    assert_eq!(status(&get_with(&p, "/cache/p?x", &[("host", "a.test")])), "MISS", "another query");
    assert_eq!(
        status(&get_with(&p, "/cache/./p", &[("host", "a.test")])),
        "HIT",
        "one resource, as the upstream sees it"
    );
    // Vary: a response for gzip is not served to a client without it.
    let v = "/cache/v?vary=Accept-Encoding";
    assert_eq!(status(&get_with(&p, v, &[("accept-encoding", "gzip")])), "MISS");
    assert_eq!(status(&get_with(&p, v, &[("accept-encoding", "gzip")])), "HIT");
    assert_eq!(status(&get(p.node(), v)), "MISS", "another Accept-Encoding");
}

#[test]
fn a_memory_zone_evicts_at_its_bound_and_counts() {
    let u = Upstream::start("u");
    let p = Prefix::new(
        ZONES,
        "",
        &format!(
            "routes:\n  - {{id: 1, uri: /cache/*, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: small}}}}}}\n",
            u = up(&u)
        ),
    );
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    // 64k zone: each 4 KiB entry fits (an eighth is 8 KiB), 40 of them do not.
    for i in 0..40 {
        assert_eq!(status(&get(p.node(), &format!("/cache/e{i}?len=4096"))), "MISS");
    }
    assert_eq!(status(&get(p.node(), "/cache/e39?len=4096")), "HIT", "the newest stays");
    assert_eq!(status(&get(p.node(), "/cache/e0?len=4096")), "MISS", "the least recently used went");
    let text = scrape(&p);
    let evicted = metric(&text, "proxy_cache_evictions_total{zone=\"small\"}").unwrap_or(0.0);
    assert!(evicted >= 20.0, "evictions {evicted}:\n{text}");
    let bytes = metric(&text, "proxy_cache_bytes{zone=\"small\",tier=\"memory\"}").unwrap_or(f64::MAX);
    assert!(bytes <= 65536.0, "{bytes}");
    let big = get(p.node(), "/cache/big?len=10000");
    assert_eq!((big.body.len(), status(&big)), (10000, "MISS"));
    assert_eq!(status(&get(p.node(), "/cache/big?len=10000")), "MISS", "over an eighth of the zone: passed through");
}

#[test]
fn a_disk_zone_survives_a_restart_and_a_kill() {
    let u = Upstream::start("u");
    let p = Prefix::new(
        ZONES,
        "",
        &format!(
            "routes:\n  - {{id: 1, uri: /cache/*, upstream: {u}, plugins: {{proxy-cache: {{cache_zone: disk}}}}}}\n",
            u = up(&u)
        ),
    );
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let first = get(p.node(), "/cache/keep");
    assert_eq!(status(&first), "MISS");
    assert_eq!(w.terminate().code(), Some(0));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let again = get(p.node(), "/cache/keep");
    assert_eq!((status(&again), &again.body), ("HIT", &first.body), "read back from its file after a restart");
    get(p.node(), "/cache/purged");
    assert_eq!(request(p.node(), "PURGE", "/cache/purged", &[], b"").status, 200);
    // kill -9 once the file is written: still there.
    let second = get(p.node(), "/cache/kill?len=70000");
    assert_eq!(status(&second), "MISS");
    let files = || count_files(&p.dir.join("cache/disk"));
    assert!(eventually(Duration::from_secs(5), || files() == 2), "{} files", files());
    drop(w);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let after = get(p.node(), "/cache/kill?len=70000");
    assert_eq!((status(&after), after.body.len()), ("HIT", 70000));
    assert_eq!(status(&get(p.node(), "/cache/purged")), "MISS", "a purged entry does not come back");
    assert_eq!(u.hits(), 4);
}

fn count_files(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() && e.file_name() != "tmp" => count_files(&e.path()),
            Ok(t) if t.is_file() => 1,
            _ => 0,
        })
        .sum()
}

fn find_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() && e.file_name() != "tmp" => find_files(&e.path(), out),
            Ok(t) if t.is_file() => out.push(e.path()),
            _ => {}
        }
    }
}

#[test]
fn a_torn_or_damaged_entry_file_is_never_served() {
    let u = Upstream::start("u");
    let p = Prefix::new(
        ZONES,
        "",
        &format!(
            "routes:\n  - {{id: 1, uri: /cache/*, upstream: {u}, plugins: {{proxy-cache: {{cache_zone: disk}}}}}}\n",
            u = up(&u)
        ),
    );
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    get(p.node(), "/cache/torn?len=5000");
    get(p.node(), "/cache/flipped?len=5000");
    let victim = get(p.node(), "/cache/victim");
    let planted = get(p.node(), "/cache/planted");
    assert_eq!(w.terminate().code(), Some(0));
    let mut files = Vec::new();
    find_files(&p.dir.join("cache/disk"), &mut files);
    assert_eq!(files.len(), 4, "{files:?}");
    let holding = |word: &[u8]| {
        files.iter().find(|f| std::fs::read(f).is_ok_and(|b| b.windows(word.len()).any(|w| w == word))).cloned()
    };
    // A whole, valid entry file of another key, under the victim's name.
    let (victim_file, planted_file) = (holding(b"victim"), holding(b"planted"));
    let (Some(victim_file), Some(planted_file)) = (victim_file, planted_file) else { panic!("{files:?}") };
    std::fs::copy(&planted_file, &victim_file).unwrap_or_else(|e| panic!("{e}"));
    files.retain(|f| *f != victim_file && *f != planted_file);
    files.sort_by_key(|f| std::fs::read(f).map(|b| b.windows(7).any(|w| w == b"flipped")).unwrap_or(false));
    let torn = std::fs::read(&files[0]).unwrap_or_default();
    std::fs::write(&files[0], &torn[..torn.len() / 2]).unwrap_or_else(|e| panic!("{e}"));
    let mut flipped = std::fs::read(&files[1]).unwrap_or_default();
    let at = flipped.len() - 100;
    flipped[at] ^= 0x20;
    std::fs::write(&files[1], &flipped).unwrap_or_else(|e| panic!("{e}"));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let r = get(p.node(), "/cache/torn?len=5000");
    assert_eq!((status(&r), r.body.len()), ("MISS", 5000), "the cut file was discarded at start");
    let r = get(p.node(), "/cache/flipped?len=5000");
    assert_eq!((status(&r), r.body.len()), ("MISS", 5000), "the damaged file failed its checksum");
    assert!(r.body.iter().all(|b| *b == b'x'));
    assert_eq!(u.hits(), 6);
    let r = get(p.node(), "/cache/victim");
    assert_eq!(status(&r), "MISS", "another key's entry is never served");
    assert_ne!(r.body, planted.body);
    assert_ne!(r.body, victim.body, "fetched again");
    assert_eq!(status(&get(p.node(), "/cache/planted")), "HIT");
    assert_eq!(u.hits(), 7);
    let text = scrape(&p);
    assert_eq!(metric(&text, "proxy_cache_discarded_total{zone=\"disk\",reason=\"torn\"}"), Some(1.0), "{text}");
    assert_eq!(metric(&text, "proxy_cache_discarded_total{zone=\"disk\",reason=\"corrupt\"}"), Some(1.0));
    assert_eq!(status(&get(p.node(), "/cache/torn?len=5000")), "HIT", "stored again");
    drop(w);
}

#[test]
fn twenty_concurrent_misses_make_one_upstream_fetch() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: m, uri: /cache/m, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache}}}}}}\n  - {{id: d, uri: /cache/d, upstream: {u}, plugins: {{proxy-cache: {{}}}}}}\n",
        u = up(&u)
    ));
    for (n, path) in ["/cache/m?sleep=400", "/cache/d?sleep=400"].iter().enumerate() {
        let node = p.node();
        let threads: Vec<_> = (0..20).map(|_| std::thread::spawn(move || get(node, path))).collect();
        let answers: Vec<Response> =
            threads.into_iter().map(|t| t.join().unwrap_or_else(|_| panic!("client"))).collect();
        assert_eq!(u.hits(), n + 1, "{path}: one fetch for 20 concurrent misses");
        assert!(answers.iter().all(|r| r.status == 200 && r.body == answers[0].body));
        let misses = answers.iter().filter(|r| status(r) == "MISS").count();
        let hits = answers.iter().filter(|r| status(r) == "HIT").count();
        assert_eq!((misses, hits), (1, 19), "{path}");
    }
    // Not cacheable: the waiters fetch for themselves, no one waits for ever.
    let node = p.node();
    let threads: Vec<_> =
        (0..5).map(|_| std::thread::spawn(move || get(node, "/cache/m?sleep=200&cookie=1"))).collect();
    for t in threads {
        assert_eq!(t.join().map(|r| r.status).unwrap_or(0), 200);
    }
    assert_eq!(u.hits(), 2 + 5);
    let text = scrape(&p);
    assert_eq!(metric(&text, "proxy_cache_collapsed_total{zone=\"memory_cache\"}"), Some(19.0), "{text}");
}

#[test]
fn a_large_body_streams_and_is_stored_whole() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /cache/*, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache}}}}}}\n  - {{id: 2, uri: /capped/*, upstream: {u}, plugins: {{proxy-rewrite: {{regex_uri: [\"^/capped/(.*)\", \"/cache/$1\"]}}, proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache, max_resp_body_size: 1000}}}}}}\n",
        u = up(&u)
    ));
    let miss = get(p.node(), "/cache/large?len=3000000");
    assert_eq!((status(&miss), miss.body.len()), ("MISS", 3_000_000));
    assert_eq!(miss.header("content-length"), Some("3000000"), "a tapped body keeps its length");
    let again = get(p.node(), "/cache/large?len=3000000");
    assert_eq!((status(&again), again.body.len()), ("HIT", 3_000_000));
    assert_eq!(get(p.node(), "/capped/c?len=2000").body.len(), 2000);
    assert_eq!(status(&get(p.node(), "/capped/c?len=2000")), "MISS", "over max_resp_body_size: passed through");
}

#[test]
fn apisix_examples_load_unchanged_and_bad_zones_are_refused_with_their_path() {
    let u = Upstream::start("u");
    let zones = "  proxy_cache:\n    cache_ttl: 10s\n    zones:\n      - name: disk_cache_one\n        memory_size: 50m\n        disk_size: 1G\n        disk_path: cache/disk_cache_one\n        cache_levels: \"1:2\"\n      - name: memory_cache\n        memory_size: 50m\n";
    let routes = format!(
        "routes:\n  - {{id: proxy-cache-route, uri: /anything, plugins: {{proxy-cache: {{cache_strategy: disk}}}}, upstream: {u}}}\n  - {{id: r2, uri: /anything2, plugins: {{proxy-cache: {{cache_strategy: memory, cache_zone: memory_cache, cache_ttl: 10}}}}, upstream: {u}}}\n  - {{id: r3, uri: /anything3, plugins: {{proxy-cache: {{no_cache: [\"$arg_no_cache\", \"$http_no_cache\"]}}}}, upstream: {u}}}\n  - {{id: r4, uri: /anything4, plugins: {{proxy-cache: {{cache_bypass: [\"$arg_bypass\", \"$http_bypass\"]}}}}, upstream: {u}}}\n  - {{id: r5, uri: /timeout, plugins: {{proxy-cache: {{}}}}, upstream: {u}}}\n  - {{id: r6, uri: /full, plugins: {{proxy-cache: {{cache_zone: disk_cache_one, cache_key: [\"$host\", \"$request_uri\"], cache_http_status: [200], cache_method: [GET], hide_cache_headers: true, cache_control: false, consumer_isolation: true, cache_set_cookie: false, max_resp_body_size: 1024}}}}, upstream: {u}}}\n",
        u = up(&u)
    );
    let p = Prefix::new(zones, "", &routes);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert_eq!(status(&get(p.node(), "/anything")), "MISS");
    assert_eq!(status(&get(p.node(), "/anything")), "HIT");
    assert!(p.dir.join("cache/disk_cache_one").is_dir(), "a relative disk_path is under the prefix");
    drop(w);

    let bad = format!(
        "routes:\n  - {{id: x, uri: /x, upstream: {u}, plugins: {{proxy-cache: {{cache_zone: nope}}}}}}\n  - {{id: y, uri: /y, upstream: {u}, plugins: {{proxy-cache: {{cache_strategy: memory}}}}}}\n",
        u = up(&u)
    );
    let p = Prefix::new("", "", &bad);
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(
        out.contains("plugins.proxy-cache") && out.contains("cache_zone `nope` is not a zone of gateway.proxy_cache"),
        "{out}"
    );
    assert!(out.contains("(id y)") && out.contains("is a disk zone, but cache_strategy is memory"), "{out}");
    let p = Prefix::new("  proxy_cache:\n    zones:\n      - {name: z, memory_size: 10q}\n", "", "routes: []\n");
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("gateway.proxy_cache.zones[0].memory_size"), "{out}");
}
