//! WebSocket and gRPC through the gateway, with real client libraries: tokio-tungstenite for
//! WebSocket (and a tungstenite echo server upstream), tonic for gRPC (a tonic server upstream,
//! a tonic client through Weir's cleartext HTTP/2 listener).
// tonic's own API returns `Result<_, tonic::Status>`, a large error type.
#![allow(clippy::result_large_err)]

mod common;

use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use common::upstream::Upstream;
use common::ws::{runtime, ws_echo};
use common::{Prefix, Weir};

/// A gateway whose first listener also speaks cleartext HTTP/2.
fn gateway(resources: &str) -> (Prefix, Weir) {
    let p = Prefix::new("", "", resources);
    let config = std::fs::read_to_string(p.dir.join("conf/config.yaml")).expect("read config");
    let port = format!("port: {}}}", p.node_port);
    p.write("conf/config.yaml", &config.replace(&port, &format!("port: {}, enable_http2: true}}", p.node_port)));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    (p, w)
}

// ---- WebSocket ----

#[test]
fn websocket_is_tunnelled_on_routes_that_enable_it() {
    let rt = runtime();
    let echo = ws_echo(&rt);
    let (p, _w) = gateway(&format!(
        "routes:\n  - id: ws\n    uri: /ws/*\n    enable_websocket: true\n    upstream:\n      nodes:\n        \"{echo}\": 1\n"
    ));
    let url = format!("ws://{}/ws/echo", p.node());
    rt.block_on(async {
        let (mut ws, resp) = tokio_tungstenite::connect_async(&url).await.expect("WebSocket handshake through weir");
        assert_eq!(resp.status(), 101);
        ws.send(Message::Text("hello".into())).await.expect("send");
        assert_eq!(ws.next().await.expect("answer").expect("frame"), Message::Text("hello".into()));
        let big = vec![7u8; 200_000];
        ws.send(Message::Binary(big.clone())).await.expect("send binary");
        assert_eq!(ws.next().await.expect("answer").expect("frame"), Message::Binary(big));
        ws.close(None).await.expect("close");
    });
}

#[test]
fn websocket_upgrade_is_not_performed_without_the_flag() {
    let up = Upstream::start("plain");
    let (p, _w) = gateway(&format!(
        "routes:\n  - id: r\n    uri: /*\n    upstream:\n      nodes:\n        \"{}\": 1\n",
        up.node()
    ));
    // The handshake goes as plain HTTP: no Upgrade or Connection reaches the upstream, and the
    // connection closes after the answer (nothing the client sends next is read as a request).
    let resp = common::request(
        p.node(),
        "GET",
        "/chat",
        &[
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
        ],
        b"",
    );
    assert_eq!(resp.status, 200);
    let echo = resp.json();
    assert!(echo["headers"].get("upgrade").is_none(), "{echo}");
    assert_eq!(echo["headers"]["sec-websocket-key"], "dGhlIHNhbXBsZSBub25jZQ==", "{echo}");
    assert_eq!(resp.header("connection"), Some("close"));
    let rt = runtime();
    let url = format!("ws://{}/chat", p.node());
    let outcome = rt.block_on(tokio_tungstenite::connect_async(&url));
    assert!(outcome.is_err(), "the upgrade was performed");
}

#[test]
fn idle_websocket_is_closed_after_timeout_read() {
    let rt = runtime();
    let echo = ws_echo(&rt);
    let (p, _w) = gateway(&format!(
        "routes:\n  - id: ws\n    uri: /ws\n    enable_websocket: true\n    upstream:\n      timeout: {{connect: 1, send: 1, read: 1}}\n      nodes:\n        \"{echo}\": 1\n"
    ));
    let url = format!("ws://{}/ws", p.node());
    rt.block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.expect("handshake");
        ws.send(Message::Text("ping".into())).await.expect("send");
        assert!(ws.next().await.is_some());
        // Nothing moves for longer than timeout.read: the gateway closes the tunnel.
        let end = tokio::time::timeout(Duration::from_secs(5), ws.next()).await.expect("the tunnel was not closed");
        assert!(!matches!(end, Some(Ok(Message::Text(_)))), "{end:?}");
    });
}

// ---- gRPC ----

#[derive(Clone, PartialEq, prost::Message)]
struct Echo {
    #[prost(string, tag = "1")]
    message: String,
    #[prost(uint32, tag = "2")]
    count: u32,
}

type GrpcBody = tonic::body::BoxBody;

/// `test.Echo`: `Say` (unary: echoes, or fails with NOT_FOUND for "fail"), `Count` (server
/// streaming: `count` messages, then DATA_LOSS when `message` is "fail").
#[derive(Clone)]
struct EchoService;

impl tonic::server::NamedService for EchoService {
    const NAME: &'static str = "test.Echo";
}

struct Say;

impl tonic::server::UnaryService<Echo> for Say {
    type Response = Echo;
    type Future = tonic::codegen::BoxFuture<tonic::Response<Echo>, tonic::Status>;
    fn call(&mut self, req: tonic::Request<Echo>) -> Self::Future {
        Box::pin(async move {
            let m = req.into_inner();
            if m.message == "fail" {
                return Err(tonic::Status::not_found("no such thing"));
            }
            Ok(tonic::Response::new(Echo { message: format!("echo: {}", m.message), count: m.count }))
        })
    }
}

struct Count;

impl tonic::server::ServerStreamingService<Echo> for Count {
    type Response = Echo;
    type ResponseStream = tonic::codegen::BoxStream<Echo>;
    type Future = tonic::codegen::BoxFuture<tonic::Response<Self::ResponseStream>, tonic::Status>;
    fn call(&mut self, req: tonic::Request<Echo>) -> Self::Future {
        Box::pin(async move {
            let m = req.into_inner();
            let mut items: Vec<Result<Echo, tonic::Status>> =
                (0..m.count).map(|i| Ok(Echo { message: format!("{} {i}", m.message), count: i })).collect();
            if m.message == "fail" {
                items.push(Err(tonic::Status::data_loss("stream broke")));
            }
            let stream: Self::ResponseStream = Box::pin(tonic::codegen::tokio_stream::iter(items));
            Ok(tonic::Response::new(stream))
        })
    }
}

impl<B> tonic::codegen::Service<http::Request<B>> for EchoService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<GrpcBody>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match req.uri().path() {
            "/test.Echo/Say" => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(tonic::codec::ProstCodec::<Echo, Echo>::default());
                Ok(grpc.unary(Say, req).await)
            }),
            "/test.Echo/Count" => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(tonic::codec::ProstCodec::<Echo, Echo>::default());
                Ok(grpc.server_streaming(Count, req).await)
            }),
            _ => Box::pin(async move { Ok(tonic::Status::unimplemented("no such method").into_http()) }),
        }
    }
}

fn grpc_server(rt: &tokio::runtime::Runtime) -> SocketAddr {
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
    let addr = listener.local_addr().expect("addr");
    rt.spawn(async move {
        let incoming = tonic::codegen::tokio_stream::wrappers::TcpListenerStream::new(listener);
        let _ = tonic::transport::Server::builder().add_service(EchoService).serve_with_incoming(incoming).await;
    });
    addr
}

struct Client(tonic::client::Grpc<tonic::transport::Channel>);

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect to weir");
        Client(tonic::client::Grpc::new(channel))
    }

    async fn say(&mut self, message: &str) -> Result<Echo, tonic::Status> {
        self.0.ready().await.map_err(|e| tonic::Status::unknown(e.to_string()))?;
        let path = http::uri::PathAndQuery::from_static("/test.Echo/Say");
        let req = tonic::Request::new(Echo { message: message.into(), count: 0 });
        self.0.unary(req, path, tonic::codec::ProstCodec::<Echo, Echo>::default()).await.map(|r| r.into_inner())
    }

    /// The messages of a `Count` call, and how the stream ended.
    async fn count(&mut self, message: &str, n: u32) -> (Vec<Echo>, Result<(), tonic::Status>) {
        if let Err(e) = self.0.ready().await {
            return (Vec::new(), Err(tonic::Status::unknown(e.to_string())));
        }
        let path = http::uri::PathAndQuery::from_static("/test.Echo/Count");
        let req = tonic::Request::new(Echo { message: message.into(), count: n });
        let mut stream =
            match self.0.server_streaming(req, path, tonic::codec::ProstCodec::<Echo, Echo>::default()).await {
                Ok(r) => r.into_inner(),
                Err(s) => return (Vec::new(), Err(s)),
            };
        let mut got = Vec::new();
        loop {
            match stream.message().await {
                Ok(Some(m)) => got.push(m),
                Ok(None) => return (got, Ok(())),
                Err(s) => return (got, Err(s)),
            }
        }
    }
}

#[test]
fn grpc_unary_and_streaming_calls_pass_with_their_trailers() {
    let rt = runtime();
    let server = grpc_server(&rt);
    let dead = common::free_port();
    let (p, _w) = gateway(&format!(
        "routes:\n  - id: grpc\n    uri: /test.Echo/*\n    upstream:\n      scheme: grpc\n      nodes:\n        \"{server}\": 1\n\
         \x20 - id: down\n    uri: /down.Echo/*\n    upstream:\n      scheme: grpc\n      timeout: {{connect: 1, send: 1, read: 1}}\n      nodes:\n        \"127.0.0.1:{dead}\": 1\n"
    ));
    rt.block_on(async {
        let mut client = Client::connect(p.node()).await;
        let reply = client.say("hi").await.expect("unary call");
        assert_eq!(reply.message, "echo: hi");
        // An error status the server sends passes through (headers-only answer).
        let err = client.say("fail").await.expect_err("NOT_FOUND");
        assert_eq!(err.code(), tonic::Code::NotFound);
        assert_eq!(err.message(), "no such thing");
        // Server streaming: every message, then the status in the trailers.
        let (got, end) = client.count("n", 5).await;
        assert_eq!(end.map_err(|s| s.to_string()), Ok(()));
        assert_eq!(got.iter().map(|m| m.count).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        let (got, end) = client.count("fail", 3).await;
        assert_eq!(got.len(), 3);
        let status = end.expect_err("DATA_LOSS in the trailers");
        assert_eq!(status.code(), tonic::Code::DataLoss);
        assert_eq!(status.message(), "stream broke");
        // Many calls on one client connection, concurrently (HTTP/2 streams both sides).
        let calls = (0..50).map(|i| {
            let mut c = Client(client.0.clone());
            async move { c.say(&format!("n{i}")).await.map(|r| r.message) }
        });
        let replies = futures_util::future::join_all(calls).await;
        for (i, r) in replies.into_iter().enumerate() {
            assert_eq!(r.map_err(|s| s.to_string()), Ok(format!("echo: n{i}")));
        }
    });
    // A gateway error on a gRPC route is a gRPC status, not a JSON body.
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", p.node()))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.expect("ready");
        let path = http::uri::PathAndQuery::from_static("/down.Echo/Say");
        let req = tonic::Request::new(Echo { message: "x".into(), count: 0 });
        let err = grpc.unary(req, path, tonic::codec::ProstCodec::<Echo, Echo>::default()).await.expect_err("down");
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
        assert!(err.message().contains("502 Bad Gateway"), "{err:?}");
    });
}

#[test]
fn grpcs_upstream_over_tls_with_alpn_h2() {
    let rt = runtime();
    let server = grpc_server(&rt);
    // The TLS end: a Weir terminating TLS (HTTP/2 by ALPN) in front of the gRPC server.
    let key = rcgen::KeyPair::generate().expect("key");
    let cert =
        rcgen::CertificateParams::new(vec!["back.test".to_owned()]).expect("params").self_signed(&key).expect("sign");
    let back = Prefix::new("", "", "");
    back.write("conf/back.crt", &cert.pem());
    back.write("conf/back.key", &key.serialize_pem());
    back.write_config(
        &format!("  ssl:\n    listen: [{{ip: 127.0.0.1, port: {}}}]\n    fallback_sni: back.test\n", back.tls_port),
        "",
    );
    back.write_resources(&format!(
        "routes:\n  - id: g\n    uri: /test.Echo/*\n    upstream:\n      scheme: grpc\n      nodes:\n        \"{server}\": 1\n\
         ssls:\n  - id: 1\n    snis: [back.test]\n    cert_file: conf/back.crt\n    key_file: conf/back.key\n"
    ));
    let back_weir = Weir::start(&back);
    back_weir.wait_ready(back.node());
    // The front: gRPC over TLS to the back (a self-signed certificate: verification off).
    let (front, _w) = gateway(&format!(
        "routes:\n  - id: g\n    uri: /test.Echo/*\n    upstream:\n      scheme: grpcs\n      tls: {{verify: false}}\n      nodes:\n        \"{}\": 1\n",
        back.tls()
    ));
    rt.block_on(async {
        let mut client = Client::connect(front.node()).await;
        assert_eq!(
            client.say("over tls").await.map(|r| r.message).map_err(|s| s.to_string()),
            Ok("echo: over tls".into())
        );
        let (got, end) = client.count("fail", 2).await;
        assert_eq!(got.len(), 2);
        assert_eq!(end.expect_err("DATA_LOSS").code(), tonic::Code::DataLoss);
    });
}
