//! Traces and per-plugin cost through the real binary: OTLP receivers of our own (an HTTP/1.1
//! server and a tonic gRPC server) decode what Weir exports with the `opentelemetry-proto`
//! types; a real upstream echoes the `traceparent` it was sent; a collector that never answers
//! shows that export costs requests nothing; the Prometheus exporter's `plugin_latency`
//! histogram and the access log's `$plugin_time` show each plugin's phases.

mod common;

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::upstream::Upstream;
use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, Span};
use prost::Message;

/// What a receiver got: every span, the resource attributes, the request headers of exports.
#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    resource: HashMap<String, String>,
    headers: Vec<(String, String)>,
}

type Shared = Arc<Mutex<Received>>;

fn keep(into: &Shared, req: ExportTraceServiceRequest) {
    let mut r = into.lock().unwrap_or_else(|e| e.into_inner());
    for rs in req.resource_spans {
        for kv in rs.resource.map(|r| r.attributes).unwrap_or_default() {
            r.resource.insert(kv.key.clone(), attr_text(kv.value.and_then(|v| v.value)));
        }
        for ss in rs.scope_spans {
            r.spans.extend(ss.spans);
        }
    }
}

fn attr_text(v: Option<Any>) -> String {
    match v {
        Some(Any::StringValue(s)) => s,
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attr(s: &Span, key: &str) -> Option<String> {
    s.attributes.iter().find(|kv| kv.key == key).map(|kv| attr_text(kv.value.clone().and_then(|v| v.value)))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An OTLP/HTTP receiver: keep-alive HTTP/1.1, `POST /v1/traces` with a protobuf body.
fn http_receiver() -> (SocketAddr, Shared) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind receiver");
    let addr = listener.local_addr().expect("addr");
    let got: Shared = Arc::default();
    let g = got.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let g = g.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                let mut writer = conn;
                while let Some((line, headers)) = common::upstream::read_head(&mut reader) {
                    assert_eq!(line, "POST /v1/traces HTTP/1.1");
                    let len: usize = headers
                        .iter()
                        .find(|(k, _)| k == "content-length")
                        .and_then(|(_, v)| v.parse().ok())
                        .expect("a content-length");
                    let mut body = vec![0; len];
                    reader.read_exact(&mut body).expect("body");
                    let req = ExportTraceServiceRequest::decode(&body[..]).expect("an ExportTraceServiceRequest");
                    g.lock().unwrap_or_else(|e| e.into_inner()).headers.extend(headers);
                    keep(&g, req);
                    let answer = ExportTraceServiceResponse::default().encode_to_vec();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
                        answer.len()
                    );
                    if writer.write_all(head.as_bytes()).and_then(|_| writer.write_all(&answer)).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, got)
}

struct Grpc(Shared);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let headers: Vec<(String, String)> = request
            .metadata()
            .iter()
            .filter_map(|kv| match kv {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                    Some((k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                }
                _ => None,
            })
            .collect();
        self.0.lock().unwrap_or_else(|e| e.into_inner()).headers.extend(headers);
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC receiver (tonic) on its own runtime.
fn grpc_receiver() -> (SocketAddr, Shared) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind receiver");
    let addr = listener.local_addr().expect("addr");
    listener.set_nonblocking(true).expect("nonblocking");
    let got: Shared = Arc::default();
    let g = got.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let incoming =
                tonic::transport::server::TcpIncoming::from_listener(listener, true, None).expect("incoming");
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(Grpc(g)))
                .serve_with_incoming(incoming)
                .await
                .expect("serve");
        });
    });
    (addr, got)
}

fn spans_of(got: &Shared, trace: &str) -> Vec<Span> {
    got.lock().unwrap_or_else(|e| e.into_inner()).spans.iter().filter(|s| hex(&s.trace_id) == trace).cloned().collect()
}

/// Waits until the spans of `trace` include a server span and `n` spans in all.
fn wait_spans(got: &Shared, trace: &str, n: usize) -> Vec<Span> {
    let ok = eventually(Duration::from_secs(10), || spans_of(got, trace).len() >= n);
    let spans = spans_of(got, trace);
    assert!(ok, "trace {trace}: {} spans, wanted {n}: {spans:#?}", spans.len());
    spans
}

fn server_span(spans: &[Span]) -> &Span {
    let servers: Vec<&Span> = spans.iter().filter(|s| s.kind == SpanKind::Server as i32).collect();
    assert_eq!(servers.len(), 1, "{spans:#?}");
    servers[0]
}

fn otel_config(protocol: &str, addr: SocketAddr, extra: &str) -> String {
    format!(
        "plugin_attr:\n  opentelemetry:\n    resource: {{service.name: edge, deployment.environment: test}}\n    collector: {{address: \"{addr}\", protocol: {protocol}, request_timeout: 5, request_headers: {{x-collector-token: s3cret}}}}\n    batch_span_processor: {{batch_timeout: 0.05, inactive_timeout: 0.02{extra}}}\n"
    )
}

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_PARENT: &str = "00f067aa0ba902b7";

#[test]
fn spans_go_to_an_otlp_http_collector_with_ids_attributes_and_propagation() {
    let up = Upstream::start("a");
    let dead = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let (collector, got) = http_receiver();
    let p = Prefix::new("", &otel_config("http", collector, ""), "");
    p.write_resources(&format!(
        r#"consumers:
  - {{username: jack, plugins: {{key-auth: {{key: k1}}}}}}
routes:
  - id: traced
    uri: /api/*
    plugins:
      opentelemetry: {{sampler: {{name: always_on}}, plugin_spans: true, additional_attributes: [http_x_tenant], additional_header_prefix_attributes: [x-team-]}}
      key-auth: {{}}
      proxy-rewrite: {{headers: {{set: {{x-rewritten: "1"}}}}}}
    upstream: {{nodes: {{"{up}": 1}}}}
  - id: retried
    uri: /retry/*
    plugins:
      opentelemetry: {{sampler: {{name: always_on}}}}
    upstream: {{nodes: {{"{dead}": 1, "{up}": 1}}, retries: 1}}
  - id: off
    uri: /off/*
    plugins:
      opentelemetry: {{}}
    upstream: {{nodes: {{"{up}": 1}}}}
  - id: parent
    uri: /parent/*
    plugins:
      opentelemetry: {{sampler: {{name: parent_base, options: {{root: {{name: always_on}}}}}}}}
    upstream: {{nodes: {{"{up}": 1}}}}
"#,
        up = up.node()
    ));
    let w = Weir::start(&p);
    w.wait_ready(p.node());

    // A client with a trace context: the same trace goes on, under a new span, with tracestate.
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_PARENT}-01");
    let r = request(
        p.node(),
        "GET",
        "/api/items?x=1",
        &[
            ("Host", "shop.example.com"),
            ("apikey", "k1"),
            ("traceparent", &traceparent),
            ("tracestate", "vendor=abc"),
            ("x-tenant", "acme"),
            ("x-team-name", "blue"),
        ],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let echoed = r.json();
    let sent = echoed["headers"]["traceparent"].as_str().unwrap_or_else(|| panic!("no traceparent: {echoed}"));
    let parts: Vec<&str> = sent.split('-').collect();
    assert_eq!(parts.len(), 4, "{sent}");
    assert_eq!((parts[0], parts[1], parts[3]), ("00", CLIENT_TRACE, "01"), "{sent}");
    assert_ne!(parts[2], CLIENT_PARENT, "the upstream's parent is Weir's attempt span");
    assert_eq!(echoed["headers"]["tracestate"], "vendor=abc");

    // key-auth rewrite, proxy-rewrite rewrite, then opentelemetry's own: server + attempt + phases.
    let spans = wait_spans(&got, CLIENT_TRACE, 4);
    let server = server_span(&spans);
    assert_eq!(hex(&server.parent_span_id), CLIENT_PARENT);
    assert_eq!(server.name, "GET /api/*");
    assert_eq!(server.trace_state, "vendor=abc");
    for (key, want) in [
        ("http.request.method", "GET"),
        ("url.path", "/api/items"),
        ("http.route", "/api/*"),
        ("http.response.status_code", "200"),
        ("server.address", "shop.example.com"),
        ("client.address", "127.0.0.1"),
        ("weir.route.id", "traced"),
        ("weir.consumer", "jack"),
        ("http_x_tenant", "acme"),
        ("x-team-name", "blue"),
    ] {
        assert_eq!(attr(server, key).as_deref(), Some(want), "{key} in {server:#?}");
    }
    assert!(server.start_time_unix_nano > 0 && server.end_time_unix_nano >= server.start_time_unix_nano);
    let attempts: Vec<&Span> = spans.iter().filter(|s| s.kind == SpanKind::Client as i32).collect();
    assert_eq!(attempts.len(), 1, "{spans:#?}");
    assert_eq!(attempts[0].parent_span_id, server.span_id);
    assert_eq!(hex(&attempts[0].span_id), parts[2], "the span id the upstream was sent is the attempt's");
    assert_eq!(attr(attempts[0], "server.port").as_deref(), Some(up.addr.port().to_string().as_str()));
    assert_eq!(attr(attempts[0], "http.response.status_code").as_deref(), Some("200"));
    assert!(attempts[0].start_time_unix_nano >= server.start_time_unix_nano);
    assert!(attempts[0].end_time_unix_nano <= server.end_time_unix_nano);
    let phases: Vec<String> =
        spans.iter().filter(|s| s.kind == SpanKind::Internal as i32).map(|s| s.name.clone()).collect();
    for want in ["key-auth rewrite", "proxy-rewrite rewrite"] {
        assert!(phases.iter().any(|n| n == want), "{want} not in {phases:?}");
    }
    for s in spans.iter().filter(|s| s.kind == SpanKind::Internal as i32) {
        assert_eq!(s.parent_span_id, server.span_id, "{s:#?}");
    }
    let ids: std::collections::HashSet<&Vec<u8>> = spans.iter().map(|s| &s.span_id).collect();
    assert_eq!(ids.len(), spans.len(), "every span its own id");

    // No traceparent: a new trace, a root server span, and the upstream still gets one.
    let r = get(p.node(), "/retry/a");
    assert_eq!(r.status, 200, "{}", r.text());
    let r2 = get(p.node(), "/retry/b");
    assert_eq!(r2.status, 200, "{}", r2.text());
    let mut retried = None;
    for r in [&r, &r2] {
        let sent = r.json()["headers"]["traceparent"].as_str().map(str::to_owned).unwrap_or_default();
        let trace = sent.split('-').nth(1).unwrap_or("").to_owned();
        assert_eq!(trace.len(), 32, "{sent}");
        let spans = wait_spans(&got, &trace, 2);
        let server = server_span(&spans);
        assert!(server.parent_span_id.is_empty(), "a new trace's server span is a root");
        let attempts: Vec<Span> = spans.iter().filter(|s| s.kind == SpanKind::Client as i32).cloned().collect();
        if attempts.len() == 2 {
            retried = Some((server.clone(), attempts));
        }
    }
    // Round robin sends one of the two to the dead node first: that request has two attempts.
    let (server, attempts) = retried.unwrap_or_else(|| panic!("no request was retried"));
    assert!(attempts.iter().all(|a| a.parent_span_id == server.span_id));
    assert_ne!(attempts[0].span_id, attempts[1].span_id);
    let failed: Vec<&Span> =
        attempts.iter().filter(|a| a.status.as_ref().is_some_and(|s| s.code == StatusCode::Error as i32)).collect();
    assert_eq!(failed.len(), 1, "{attempts:#?}");
    assert_eq!(attr(failed[0], "server.port").as_deref(), Some(dead.port().to_string().as_str()));
    assert!(attr(failed[0], "error.type").is_some());
    let ok = attempts.iter().find(|a| a.status.is_none()).unwrap_or_else(|| panic!("{attempts:#?}"));
    assert_eq!(attr(ok, "http.request.resend_count").as_deref(), Some("1"));

    // always_off (APISIX's default): the context is passed on unsampled, nothing is recorded.
    let r = request(
        p.node(),
        "GET",
        "/off/x",
        &[("traceparent", "00-11111111111111111111111111111111-2222222222222222-01")],
        b"",
    );
    let sent = r.json()["headers"]["traceparent"].as_str().map(str::to_owned).unwrap_or_default();
    assert!(sent.starts_with("00-11111111111111111111111111111111-") && sent.ends_with("-00"), "{sent}");
    // A tracestate without a traceparent belongs to no trace: it is not passed on.
    let r = request(p.node(), "GET", "/off/x", &[("tracestate", "vendor=stray")], b"");
    assert!(r.json()["headers"]["tracestate"].is_null(), "{}", r.json());
    assert!(r.json()["headers"]["traceparent"].as_str().is_some_and(|t| t.len() == 55 && t.ends_with("-00")));
    // parent_base: the client's flag decides.
    let unsampled = "00-33333333333333333333333333333333-4444444444444444-00";
    assert_eq!(request(p.node(), "GET", "/parent/x", &[("traceparent", unsampled)], b"").status, 200);
    let sampled = "00-55555555555555555555555555555555-4444444444444444-01";
    assert_eq!(request(p.node(), "GET", "/parent/y", &[("traceparent", sampled)], b"").status, 200);
    wait_spans(&got, "55555555555555555555555555555555", 2);
    assert!(spans_of(&got, "11111111111111111111111111111111").is_empty());
    assert!(spans_of(&got, "33333333333333333333333333333333").is_empty());

    let g = got.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(g.resource.get("service.name").map(String::as_str), Some("edge"));
    assert_eq!(g.resource.get("deployment.environment").map(String::as_str), Some("test"));
    assert!(g.headers.iter().any(|(k, v)| k == "x-collector-token" && v == "s3cret"), "{:?}", g.headers);
    assert!(g.headers.iter().any(|(k, v)| k == "content-type" && v == "application/x-protobuf"));
}

#[test]
fn spans_go_to_an_otlp_grpc_collector() {
    let up = Upstream::start("a");
    let (collector, got) = grpc_receiver();
    let plugins = "{opentelemetry: {sampler: {name: trace_id_ratio, options: {fraction: 1}}}}";
    let (p, _w) = traced(&otel_config("grpc", collector, ""), plugins, &up);
    let r = request(
        p.node(),
        "POST",
        "/g/orders",
        &[("traceparent", &format!("00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"))],
        b"{}",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let spans = wait_spans(&got, CLIENT_TRACE, 2);
    let server = server_span(&spans);
    assert_eq!(hex(&server.parent_span_id), CLIENT_PARENT);
    assert_eq!(attr(server, "http.request.method").as_deref(), Some("POST"));
    assert_eq!(attr(server, "weir.route.id").as_deref(), Some("r"));
    let g = got.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(g.resource.get("service.name").map(String::as_str), Some("edge"));
    assert!(g.headers.iter().any(|(k, v)| k == "x-collector-token" && v == "s3cret"), "{:?}", g.headers);
}

/// A gateway with `config` whose route `r` (every path) carries `plugins`, proxying to `up`.
fn traced(config: &str, plugins: &str, up: &Upstream) -> (Prefix, Weir) {
    let p = Prefix::new("", config, "");
    p.write_resources(&format!(
        "routes:\n  - {{id: r, uri: /*, plugins: {plugins}, upstream: {{nodes: {{\"{}\": 1}}}}}}\n",
        up.node()
    ));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    w.wait_ready(p.metrics());
    (p, w)
}

fn metric(p: &Prefix, name: &str) -> f64 {
    let text = get(p.metrics(), "/weir/prometheus/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(-1.0)
}

#[test]
fn a_collector_that_never_answers_costs_requests_nothing() {
    let up = Upstream::start("a");
    // Accepts connections (the kernel does) and never reads or answers.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let collector = silent.local_addr().expect("addr");
    let extra = ", max_queue_size: 6, max_export_batch_size: 2";
    let config = otel_config("http", collector, extra).replace("request_timeout: 5", "request_timeout: 120");
    let (p, _w) = traced(&config, "{opentelemetry: {sampler: {name: always_on}, plugin_spans: true}}", &up);
    // The export hangs for 120 s; the client waits 30 s at most for each answer (a request that
    // waited for the collector would fail here).
    for i in 0..40 {
        let r = get(p.node(), &format!("/x/{i}"));
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
    }
    assert!(metric(&p, "weir_opentelemetry_spans_dropped_total") > 0.0);
    assert!(metric(&p, "weir_opentelemetry_queue_spans") <= 6.0);
    assert_eq!(metric(&p, "weir_opentelemetry_spans_exported_total"), 0.0);
    drop(silent);
}

#[test]
fn a_collector_that_is_down_is_counted_and_requests_go_on() {
    let up = Upstream::start("a");
    let down = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let (p, w) = traced(&otel_config("grpc", down, ""), "{opentelemetry: {sampler: {name: always_on}}}", &up);
    for i in 0..10 {
        assert_eq!(get(p.node(), &format!("/y/{i}")).status, 200);
    }
    assert!(eventually(Duration::from_secs(10), || metric(&p, "weir_opentelemetry_spans_failed_total") >= 20.0));
    // Logged just after the failed spans are counted: awaited, not read once.
    assert!(
        eventually(Duration::from_secs(2), || w.log_text().contains("opentelemetry: export to")),
        "the outage is logged"
    );
}

#[test]
fn ignored_settings_warn_at_load_and_bad_ones_refuse_the_start() {
    let (collector, _got) = http_receiver();
    let p = Prefix::new("", &otel_config("http", collector, ", drop_on_queue_full: false"), "");
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert!(
        eventually(Duration::from_secs(5), || w.log_text().contains("drop_on_queue_full: false is ignored")),
        "{}",
        w.log_text()
    );
    drop(w);
    let bad = Prefix::new("", "plugin_attr:\n  opentelemetry:\n    collector: {address: \"no-port\"}\n", "");
    let (code, out) = start_refused(&bad);
    assert_ne!(code, 0);
    assert!(out.contains("plugin_attr.opentelemetry.collector.address"), "{out}");
    // A route's bad sampler is refused with its path.
    let bad_route = Prefix::new("", "", "routes:\n  - {id: r, uri: /, plugins: {opentelemetry: {sampler: {name: trace_id_ratio, options: {fraction: 2}}}}, upstream: {nodes: {\"127.0.0.1:1\": 1}}}\n");
    let (code, out) = start_refused(&bad_route);
    assert_ne!(code, 0);
    assert!(out.contains("fraction"), "{out}");
}

#[test]
fn plugin_latency_is_per_plugin_and_phase_and_off_by_default() {
    let up = Upstream::start("a");
    let routes = format!(
        "consumers:\n  - {{username: jack, plugins: {{key-auth: {{key: k1}}}}}}\nroutes:\n  - {{id: r, uri: /*, plugins: {{key-auth: {{}}, prometheus: {{}}, response-rewrite: {{headers: {{set: {{x-a: b}}}}}}}}, upstream: {{nodes: {{\"{}\": 1}}}}}}\n",
        up.node()
    );
    // plugin_latency off (the default): no series, though `$plugin_time` in the access log
    // times the phases for the log line.
    let off = Prefix::new("  access_log: {path: logs/access.log, format: \"$status $plugin_time\"}\n", "", &routes);
    let w = Weir::start(&off);
    w.wait_ready(off.node());
    w.wait_ready(off.metrics());
    assert_eq!(request(off.node(), "GET", "/a", &[("apikey", "k1")], b"").status, 200);
    assert_eq!(request(off.node(), "GET", "/a", &[("apikey", "wrong")], b"").status, 401);
    let text = get(off.metrics(), "/weir/prometheus/metrics").text();
    assert!(text.contains("weir_http_status"), "{text}");
    assert!(!text.contains("plugin_latency"), "{text}");
    let log = off.dir.join("logs/access.log");
    assert!(eventually(Duration::from_secs(5), || std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() >= 2)));
    let lines = std::fs::read_to_string(&log).unwrap_or_default();
    let plugins = |line: &str| -> Vec<String> {
        let mut names: Vec<String> = line
            .split(' ')
            .nth(1)
            .unwrap_or("")
            .split(',')
            .map(|t| {
                let (name, ms) = t.split_once(':').unwrap_or_else(|| panic!("{line}"));
                assert!(ms.parse::<f64>().is_ok_and(|ms| ms >= 0.0), "{line}");
                name.to_owned()
            })
            .collect();
        names.sort();
        names
    };
    let ok = lines.lines().find(|l| l.starts_with("200 ")).unwrap_or_else(|| panic!("{lines}"));
    assert_eq!(plugins(ok), ["key-auth", "prometheus", "response-rewrite"], "{ok}");
    let rejected = lines.lines().find(|l| l.starts_with("401 ")).unwrap_or_else(|| panic!("{lines}"));
    assert!(rejected.starts_with("401 key-auth:"), "the plugin that answered ran first: {rejected}");
    drop(w);

    let on = Prefix::new("", "plugin_attr:\n  prometheus:\n    plugin_latency: true\n", &routes);
    // The harness adds the exporter's port only when the test does not configure `prometheus:`.
    let config = std::fs::read_to_string(on.dir.join("conf/config.yaml")).expect("config");
    on.write(
        "conf/config.yaml",
        &config.replace(
            "    plugin_latency: true\n",
            &format!("    plugin_latency: true\n    export_addr: {{ip: 127.0.0.1, port: {}}}\n", on.metrics_port),
        ),
    );
    let w = Weir::start(&on);
    w.wait_ready(on.node());
    w.wait_ready(on.metrics());
    for _ in 0..5 {
        assert_eq!(request(on.node(), "GET", "/a", &[("apikey", "k1")], b"").status, 200);
    }
    assert_eq!(request(on.node(), "GET", "/a", &[("apikey", "wrong")], b"").status, 401);
    let text = get(on.metrics(), "/weir/prometheus/metrics").text();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let count = |plugin: &str, phase: &str| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|s| {
                s.metric == "weir_plugin_latency"
                    && s.labels.get("plugin") == Some(plugin)
                    && s.labels.get("phase") == Some(phase)
            })
            .map(|s| match &s.value {
                prometheus_parse::Value::Histogram(b) => b.iter().map(|b| b.count).fold(0.0, f64::max),
                _ => -1.0,
            })
            .sum()
    };
    assert_eq!(count("key-auth", "rewrite"), 6.0, "{text}");
    assert_eq!(count("response-rewrite", "header_filter"), 6.0, "{text}");
    assert_eq!(count("prometheus", "log"), 6.0, "{text}");
    assert_eq!(count("key-auth", "access"), 5.0, "the 401 in rewrite ended the phases: {text}");
    assert!(text.contains("weir_plugin_latency_bucket{plugin=\"key-auth\",phase=\"rewrite\",le=\"0.005\"}"), "{text}");
    assert!(text.contains("# TYPE weir_plugin_latency histogram"));
}

#[test]
fn a_graceful_stop_sends_the_spans_still_queued() {
    let up = Upstream::start("a");
    let (collector, got) = http_receiver();
    // Batches would wait a minute: only the stop's flush sends these.
    let config = otel_config("http", collector, "")
        .replace("batch_timeout: 0.05, inactive_timeout: 0.02", "batch_timeout: 60, inactive_timeout: 60");
    let (p, w) = traced(&config, "{opentelemetry: {sampler: {name: always_on}}}", &up);
    let r = request(p.node(), "GET", "/z", &[("traceparent", &format!("00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"))], b"");
    assert_eq!(r.status, 200);
    std::thread::sleep(Duration::from_millis(300));
    assert!(spans_of(&got, CLIENT_TRACE).is_empty(), "sent before the batch was due");
    assert!(w.terminate().success());
    assert_eq!(spans_of(&got, CLIENT_TRACE).len(), 2, "server and attempt spans, sent at the stop");
}
