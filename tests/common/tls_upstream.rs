//! A real HTTPS upstream for tests: rustls with a self-signed certificate for `localhost` and
//! 127.0.0.1. Answers every request with `{"tls": true, "sni": <server name or null>}`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

pub struct TlsUpstream {
    pub addr: SocketAddr,
    /// The self-signed certificate (PEM), for tests that trust it.
    pub cert_pem: String,
}

impl TlsUpstream {
    pub fn start() -> TlsUpstream {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("generate certificate");
        let cert_pem = cert.cert.pem();
        let cert_der = cert.cert.der().clone();
        let key_der = rustls::pki_types::PrivateKeyDer::try_from(cert.key_pair.serialize_der()).expect("key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert_der], key_der)
            .expect("server config");
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(tcp) = tcp else { continue };
                let config = config.clone();
                std::thread::spawn(move || {
                    let Ok(conn) = rustls::ServerConnection::new(config) else { return };
                    let mut tls = rustls::StreamOwned::new(conn, tcp);
                    loop {
                        let mut reader = BufReader::new(&mut tls);
                        let mut line = String::new();
                        loop {
                            let mut l = String::new();
                            if reader.read_line(&mut l).unwrap_or(0) == 0 {
                                return;
                            }
                            if l == "\r\n" {
                                break;
                            }
                            line.push_str(&l);
                        }
                        drop(reader);
                        let sni = tls.conn.server_name().map(str::to_owned);
                        let body = serde_json::json!({"tls": true, "sni": sni}).to_string();
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if tls.write_all(resp.as_bytes()).is_err() {
                            return;
                        }
                        let _ = tls.flush();
                    }
                });
            }
        });
        TlsUpstream { addr, cert_pem }
    }
}
