//! The operator's view through the real binary: the Prometheus exporter scraped and parsed by a
//! Prometheus parser that is not ours (`prometheus-parse`), counters checked against the exact
//! number of requests made; the access log in each format, across SIGUSR1 rotation and on a
//! disk too slow to keep up; Weir's own log in a file; SIGHUP reloading plugins.

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::upstream::Upstream;
use common::*;
use prometheus_parse::{Scrape, Value};
use serde_json::json;

fn scrape(p: &Prefix) -> Scrape {
    let r = get(p.metrics(), "/weir/prometheus/metrics");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("content-type").is_some_and(|c| c.starts_with("text/plain; version=0.0.4")), "{:?}", r.headers);
    let text = r.text();
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The value of the sample of `metric` whose labels include `labels` (0 when there is none).
fn value(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = s
        .samples
        .iter()
        .filter(|x| x.metric == metric && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match &x.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(buckets) => buckets.iter().map(|b| b.count).fold(0.0, f64::max),
            Value::Summary(_) => f64::NAN,
        })
        .collect();
    assert!(found.len() <= 1, "{metric} {labels:?} matches {} samples", found.len());
    found.first().copied().unwrap_or(0.0)
}

fn kill(sig: &str, w: &Weir) {
    let ok = std::process::Command::new("kill").arg(sig).arg(w.pid().to_string()).status().is_ok_and(|s| s.success());
    assert!(ok, "kill {sig}");
}

#[test]
fn prometheus_counts_exactly_the_requests_made() {
    let up = Upstream::start("a");
    let p = Prefix::new("", "", "");
    p.write_resources(&format!(
        "global_rules:\n  - {{id: g, plugins: {{prometheus: {{}}}}}}\nroutes:\n  - {{id: r1, uri: /api/*, hosts: [\"*.example.com\"], plugins: {{prometheus: {{}}}}, upstream: {{nodes: {{\"{n}\": 1}}, checks: {{active: {{type: tcp, healthy: {{interval: 1, successes: 1}}}}}}}}}}\n  - {{id: c, uri: /short/v1/urls, methods: [POST], plugins: {{short-url: {{}}}}}}\n  - {{id: s, uri: /s/*, plugins: {{short-url: {{action: resolve}}}}}}\nplugin_metadata:\n  - {{id: short-url, short_base: \"http://{node}/s\"}}\n",
        n = up.node(),
        node = p.node()
    ));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    w.wait_ready(p.metrics());
    // What reaching the ports took (wait_ready's probe: one connection the kernel completed,
    // which the gateway may accept a moment later) is the baseline.
    let probed = eventually(Duration::from_secs(5), || {
        value(&scrape(&p), "weir_nginx_http_current_connections", &[("state", "accepted")]) >= 1.0
    });
    assert!(probed, "the readiness probe was never accepted");
    let base = scrape(&p);
    let (requests0, accepted0) = (
        value(&base, "weir_http_requests_total", &[]),
        value(&base, "weir_nginx_http_current_connections", &[("state", "accepted")]),
    );

    for _ in 0..7 {
        let r = request(p.node(), "GET", "/api/x?secret=1", &[("Host", "shop.example.com")], b"");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for i in 0..3 {
        // Unmatched: labelled with an empty route, never the raw path.
        assert_eq!(get(p.node(), &format!("/no/such/path/{i}")).status, 404);
    }
    let created = request(
        p.node(),
        "POST",
        "/short/v1/urls",
        &[("Content-Type", "application/json")],
        json!([{"origin_url": "https://example.org/1"}, {"origin_url": "https://example.org/2"}])
            .to_string()
            .as_bytes(),
    );
    assert_eq!(created.status, 200, "{}", created.text());
    let code = created.json()["data"][0]["data"]["short_code"].as_str().map(str::to_owned).unwrap_or_default();
    assert_eq!(get(p.node(), &format!("/s/{code}")).status, 302);

    let s = scrape(&p);
    let r1 = [("route", "r1"), ("matched_uri", "/api/*"), ("matched_host", "*.example.com")];
    assert_eq!(value(&s, "weir_http_status", &[&r1[..], &[("code", "200")]].concat()), 7.0);
    let node_ip = up.node().split(':').next().unwrap_or("").to_owned();
    assert_eq!(value(&s, "weir_http_status", &[("code", "200"), ("route", "r1"), ("node", &node_ip)]), 7.0);
    assert_eq!(value(&s, "weir_http_status", &[("code", "404"), ("route", ""), ("matched_uri", "")]), 3.0);
    assert_eq!(value(&s, "weir_http_status", &[("code", "302"), ("route", "s")]), 1.0);
    assert_eq!(value(&s, "weir_http_latency", &[("type", "request"), ("route", "r1")]), 7.0);
    assert_eq!(value(&s, "weir_http_latency", &[("type", "upstream"), ("route", "r1")]), 7.0);
    assert_eq!(value(&s, "weir_http_latency", &[("type", "upstream"), ("route", "")]), 0.0);
    assert!(value(&s, "weir_bandwidth", &[("type", "egress"), ("route", "r1")]) > 7.0 * 100.0);
    assert!(value(&s, "weir_bandwidth", &[("type", "ingress"), ("route", "r1")]) > 7.0 * 40.0);
    // Every request, also those no route's plugins counted: 7 + 3 + 2.
    assert_eq!(value(&s, "weir_http_requests_total", &[]) - requests0, 12.0);
    assert_eq!(value(&s, "weir_nginx_http_current_connections", &[("state", "accepted")]) - accepted0, 12.0);
    assert_eq!(value(&s, "weir_short_url_created_total", &[]), 2.0);
    assert_eq!(value(&s, "weir_short_url_resolved_total", &[]), 1.0);
    assert_eq!(value(&s, "weir_node_info", &[("version", env!("CARGO_PKG_VERSION"))]), 1.0);
    let text = get(p.metrics(), "/weir/prometheus/metrics").text();
    assert!(!text.contains("/no/such/path"), "a raw path became a label:\n{text}");
    let health = eventually(Duration::from_secs(5), || {
        value(&scrape(&p), "weir_upstream_status", &[("name", "/weir/routes/r1"), ("ip", &node_ip)]) == 1.0
    });
    assert!(health, "upstream_status:\n{}", get(p.metrics(), "/weir/prometheus/metrics").text());

    // Counters move by exactly the requests made (the plugin is on the global rule and on r1:
    // each request still counts once).
    for _ in 0..5 {
        request(p.node(), "GET", "/api/y", &[("Host", "a.example.com")], b"");
    }
    let after = scrape(&p);
    assert_eq!(value(&after, "weir_http_status", &[("code", "200"), ("route", "r1")]), 12.0);
    assert_eq!(value(&after, "weir_http_requests_total", &[]) - requests0, 17.0);

    // Ingress counts the body bytes received, not the length a client declares.
    let ingress = |s: &Scrape| value(s, "weir_bandwidth", &[("type", "ingress"), ("route", "r1")]);
    let before = ingress(&after);
    let body = vec![b'x'; 5000];
    assert_eq!(request(p.node(), "POST", "/api/z", &[("Host", "a.example.com")], &body).status, 200);
    let grown = ingress(&scrape(&p)) - before;
    assert!((5000.0..5400.0).contains(&grown), "ingress grew by {grown}");
    {
        use std::io::Write;
        let mut c = std::net::TcpStream::connect(p.node()).expect("connect");
        let head = "POST /api/big HTTP/1.1\r\nHost: a.example.com\r\nContent-Length: 100000000000000\r\n\r\nabc";
        c.write_all(head.as_bytes()).expect("write");
        std::thread::sleep(Duration::from_millis(300));
    }
    // The client hung up mid-body: its fault, 400 as nginx logs it ("client prematurely closed
    // connection while sending request to upstream"), never a 502 against the upstream.
    let counted = eventually(Duration::from_secs(5), || {
        value(&scrape(&p), "weir_http_status", &[("route", "r1"), ("code", "400")])
            + value(&scrape(&p), "weir_http_status", &[("route", "r1"), ("code", "499")])
            >= 1.0
    });
    assert_eq!(value(&scrape(&p), "weir_http_status", &[("route", "r1"), ("code", "502")]), 0.0);
    assert!(counted, "{}", get(p.metrics(), "/weir/prometheus/metrics").text());
    let grown = ingress(&scrape(&p)) - before;
    assert!(grown < 6000.0, "a declared length was counted as received: {grown}");

    // The exporter serves its one path; the data plane does not serve it at all.
    assert_eq!(get(p.metrics(), "/metrics").status, 404);
    assert_eq!(request(p.metrics(), "POST", "/weir/prometheus/metrics", &[], b"").status, 405);
    assert_eq!(get(p.node(), "/weir/prometheus/metrics").status, 404);
}

#[test]
fn metric_prefix_apisix_names_families_as_apisix_does() {
    let up = Upstream::start("a");
    let p = Prefix::new("", "", "");
    p.write_config(
        "",
        &format!("plugin_attr:\n  prometheus:\n    export_addr: {{ip: 127.0.0.1, port: {}}}\n    export_uri: /m\n    metric_prefix: apisix_\n    default_buckets: [5, 50]\n", p.metrics_port),
    );
    p.write_resources(&format!(
        "routes:\n  - {{id: 1, uri: /x, plugins: {{prometheus: {{}}}}, upstream: {{nodes: {{\"{}\": 1}}}}}}\n",
        up.node()
    ));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert_eq!(get(p.node(), "/x").status, 200);
    let r = get(p.metrics(), "/m");
    let text = r.text();
    assert!(text.contains("apisix_http_status{code=\"200\",route=\"1\""), "{text}");
    assert!(text.contains("apisix_nginx_http_current_connections{state=\"active\"}"), "{text}");
    assert!(text.contains("le=\"5\"") && text.contains("le=\"50\"") && text.contains("le=\"+Inf\""), "{text}");
    assert!(!text.contains("weir_"), "{text}");
}

#[test]
fn an_exporter_port_in_use_refuses_the_start_naming_the_key() {
    let busy = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = busy.local_addr().expect("addr").port();
    let p = Prefix::new("", &format!("plugin_attr:\n  prometheus:\n    export_addr: {{port: {port}}}\n"), "");
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains(&format!("cannot listen on 127.0.0.1:{port} (plugin_attr.prometheus.export_addr)")), "{out}");

    let p = Prefix::new("", "plugin_attr:\n  prometheus:\n    default_buckets: [10, 5]\n", "");
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("plugin_attr.prometheus: default_buckets: must be positive and strictly ascending"), "{out}");
}

fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_owned).collect()
}

#[test]
fn the_access_log_has_one_line_per_request_in_each_format() {
    let up = Upstream::start("a");
    let resources = format!("routes:\n  - {{id: r1, uri: /a, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node());
    for format in [
        "combined",
        "json",
        "\"$remote_addr|$request_method|$uri|$status|$route_id|${upstream_addr}|$http_x_missing|$http_x_test\"",
    ] {
        let p = Prefix::new(&format!("  access_log: {{path: logs/access.log, format: {format}}}\n"), "", &resources);
        let w = Weir::start(&p);
        w.wait_ready(p.node());
        for _ in 0..4 {
            // Headers a line reads are kept past forwarding (only those: `access_log::headers_kept`).
            let headers = [("User-Agent", "t\"est"), ("X-Test", "v"), ("X-Other", "o")];
            assert_eq!(request(p.node(), "GET", "/a", &headers, b"").status, 200);
        }
        assert_eq!(get(p.node(), "/missing").status, 404);
        let log = p.dir.join("logs/access.log");
        assert!(eventually(Duration::from_secs(3), || lines(&log).len() == 5), "{format}: {:?}", lines(&log));
        let all = lines(&log);
        match format {
            "combined" => {
                assert!(all[0].starts_with("127.0.0.1 - - ["), "{}", all[0]);
                assert!(all[0].contains("] \"GET /a HTTP/1.1\" 200 "), "{}", all[0]);
                assert!(all[0].ends_with(" \"-\" \"t\\x22est\""), "{}", all[0]);
                assert!(all[4].contains("\"GET /missing HTTP/1.1\" 404 "), "{}", all[4]);
            }
            "json" => {
                let v: serde_json::Value = serde_json::from_str(&all[0]).unwrap_or_else(|e| panic!("{e}: {}", all[0]));
                assert_eq!(v["status"], 200);
                assert_eq!(v["route_id"], "r1");
                assert_eq!(v["uri"], "/a");
                assert_eq!(v["upstream_addr"], up.node());
                assert_eq!(v["http_user_agent"], "t\"est");
                assert_eq!(v["host"], "127.0.0.1");
                assert!(v["upstream_response_time"].as_f64().is_some(), "{v}");
            }
            _ => {
                assert_eq!(all[0], format!("127.0.0.1|GET|/a|200|r1|{}|-|v", up.node()));
                assert_eq!(all[4], "127.0.0.1|GET|/missing|404|-|-|-|-");
            }
        }
        drop(w);
    }
}

#[test]
fn a_bad_access_log_format_refuses_the_start() {
    let p = Prefix::new("  access_log: {format: \"plain text\"}\n", "", "");
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("gateway.access_log.format: `plain text` is neither"), "{out}");
}

#[test]
fn the_access_log_and_error_log_reopen_on_sigusr1() {
    let up = Upstream::start("a");
    let p = Prefix::new(
        "  access_log: {path: logs/access.log}\n  error_log: {path: logs/error.log}\n",
        "",
        &format!("routes:\n  - {{id: r1, uri: /a, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()),
    );
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let (log, rotated) = (p.dir.join("logs/access.log"), p.dir.join("logs/access.log.1"));
    let errors = p.dir.join("logs/error.log");
    // The listeners answer a moment before the start-up line is logged, and a writer thread
    // appends it.
    assert!(
        eventually(Duration::from_secs(5), || std::fs::read_to_string(&errors)
            .unwrap_or_default()
            .contains("started in")),
        "Weir's own log goes to the file"
    );
    // From the first line on: what plugins say while they start (short-url's storage) too.
    if cfg!(feature = "short-url") {
        let text = std::fs::read_to_string(&errors).unwrap_or_default();
        assert!(text.contains("short-url: storage"), "{text}");
        assert!(!w.log_text().contains("short-url: storage"), "a start-up line went to stderr: {}", w.log_text());
    }
    for _ in 0..3 {
        assert_eq!(get(p.node(), "/a").status, 200);
    }
    assert!(eventually(Duration::from_secs(3), || lines(&log).len() == 3));
    std::fs::rename(&log, &rotated).expect("rotate");
    std::fs::rename(&errors, p.dir.join("logs/error.log.1")).expect("rotate");
    kill("-USR1", &w);
    // The writer reopens before its next line: every later request lands in the new file.
    let mut sent = 0;
    let reopened = eventually(Duration::from_secs(5), || {
        sent += 1;
        get(p.node(), "/a");
        log.exists()
    });
    assert!(reopened, "no new access.log after SIGUSR1");
    assert!(eventually(Duration::from_secs(3), || lines(&rotated).len() + lines(&log).len() == 3 + sent));
    // The signal is handled while requests go on: a request racing it may still land in the
    // old file (as with nginx's USR1), never one sent after the new file appeared.
    let kept = lines(&rotated).len();
    assert!(kept >= 3, "the rotated file keeps the lines written before ({kept})");
    assert!(kept < 3 + sent && !lines(&log).is_empty(), "later lines go to the new file ({kept} of {})", 3 + sent);
    assert!(eventually(Duration::from_secs(3), || errors.exists()), "error log reopened");
    assert!(std::fs::read_to_string(&errors).unwrap_or_default().contains("SIGUSR1") || lines(&errors).is_empty());
}

#[test]
fn a_slow_access_log_drops_and_counts_lines_instead_of_blocking() {
    // The "disk" is a FIFO nobody reads: once its 64 KiB pipe buffer is full the writer blocks,
    // as on a stalled disk. Requests must not wait for it.
    let up = Upstream::start("a");
    let p = Prefix::new(
        "  access_log: {path: logs/access.fifo, buffer: 64}\n",
        "",
        &format!("routes:\n  - {{id: r1, uri: /a, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()),
    );
    std::fs::create_dir_all(p.dir.join("logs")).expect("logs dir");
    let fifo = p.dir.join("logs/access.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success());
    if !made {
        skip("a_slow_access_log_drops_and_counts_lines_instead_of_blocking", "mkfifo failed");
        return;
    }
    // Held open (never read) so that the gateway's open does not wait for a reader.
    use std::os::unix::fs::OpenOptionsExt;
    let _reader = std::fs::OpenOptions::new().read(true).custom_flags(0o4000).open(&fifo).expect("open fifo"); // O_NONBLOCK
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let long = "x".repeat(2000);
    let started = std::time::Instant::now();
    for _ in 0..400 {
        let r = request(p.node(), "GET", &format!("/a?{long}"), &[], b"");
        assert_eq!(r.status, 200);
    }
    let took = started.elapsed();
    let s = scrape(&p);
    let dropped = value(&s, "weir_access_log_dropped_total", &[]);
    let written = value(&s, "weir_access_log_lines_total", &[]);
    assert!(dropped > 0.0, "no line dropped: written {written}");
    assert!(written + dropped <= 400.0 && written + dropped >= 400.0 - 65.0, "written {written} dropped {dropped}");
    // 400 requests with the writer stuck: nothing waited on it (a generous bound for a slow CI).
    assert!(took < Duration::from_secs(20), "{took:?}");
    drop(w);
}

#[test]
fn sighup_reloads_plugins() {
    let p = Prefix::new("", "plugins: [example-plugin]\n", "");
    let w = Weir::start(&p);
    let before = get(p.control(), "/v1/schema").json();
    assert!(before["plugins"].get("key-auth").is_none());
    p.write_config("", "plugins: [example-plugin, key-auth]\n");
    kill("-HUP", &w);
    let reloaded = eventually(Duration::from_secs(5), || {
        get(p.control(), "/v1/schema").json()["plugins"].get("key-auth").is_some()
    });
    assert!(reloaded, "{}", w.log_text());
    // Logged after the reload took effect: awaited, not read once.
    assert!(
        eventually(Duration::from_secs(2), || w.log_text().contains("SIGHUP: plugins reloaded")),
        "{}",
        w.log_text()
    );
}

#[test]
fn the_access_log_shows_the_request_as_sent_and_the_uri_as_forwarded() {
    let up = Upstream::start("a");
    let p = Prefix::new(
        "  access_log: {format: \"$request|$request_uri|$uri|$upstream_addr\"}\n",
        "",
        &format!(
            "routes:\n  - {{id: r1, uri: /old/*, plugins: {{proxy-rewrite: {{regex_uri: [\"^/old/(.*)\", \"/new/$1\"]}}}}, upstream: {{nodes: {{\"{}\": 1}}}}}}\n",
            up.node()
        ),
    );
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert_eq!(get(p.node(), "/old//x/../y?q=1").status, 200);
    let log = p.dir.join("logs/access.log");
    assert!(eventually(Duration::from_secs(3), || lines(&log).len() == 1));
    // nginx's meanings: $request and $request_uri as the client sent them, $uri as forwarded.
    assert_eq!(lines(&log)[0], format!("GET /old//x/../y?q=1 HTTP/1.1|/old//x/../y?q=1|/new/y|{}", up.node()));
}

#[test]
fn systemd_hears_ready_once_the_listeners_are_bound() {
    use std::os::unix::net::UnixDatagram;
    let p = Prefix::new("", "plugins: [example-plugin]\n", "");
    let socket_path = p.dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind notify socket");
    socket.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let w = Weir::spawn_env(&p, &[("NOTIFY_SOCKET", &path_str(&socket_path))]);
    let mut buf = [0u8; 256];
    let recv = |buf: &mut [u8]| -> String {
        let n = socket.recv(buf).unwrap_or_else(|e| panic!("no notification: {e}"));
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert_eq!(recv(&mut buf), "READY=1\n");
    // Ready means served: both listeners answer at once.
    assert_eq!(get(p.control(), "/v1/schema").status, 200);
    assert_eq!(get(p.node(), "/nothing").status, 404);
    kill("-HUP", &w);
    assert_eq!(recv(&mut buf), "RELOADING=1\n");
    assert_eq!(recv(&mut buf), "READY=1\n");
    kill("-TERM", &w);
    assert_eq!(recv(&mut buf), "STOPPING=1\n");
}
