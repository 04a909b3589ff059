//! The HTTPS client the ACME account talks to its CA with: hyper's HTTP/1.1 over Weir's rustls
//! (the system's roots plus `gateway.ssl.ssl_trusted_certificate`), one connection per call
//! (an order makes a dozen calls, minutes or months apart).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};
use rustls::pki_types::ServerName;

/// HTTPS to the ACME directory.
pub struct Https {
    pub tls: Arc<rustls::ClientConfig>,
}

fn other(e: impl std::fmt::Display) -> instant_acme::Error {
    instant_acme::Error::Other(e.to_string().into())
}

/// Longest a call to the CA may take, connection and body included: a CA that stops answering
/// fails the order (retried with backoff) instead of holding it, and in a fleet its lock, open.
const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl HttpClient for Https {
    fn request(
        &self,
        req: http::Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let call = call(self.tls.clone(), req);
        Box::pin(async move {
            match tokio::time::timeout(CALL_TIMEOUT, call).await {
                Ok(answer) => answer,
                Err(_) => Err(other(format!("the CA did not answer within {} s", CALL_TIMEOUT.as_secs()))),
            }
        })
    }
}

async fn call(
    tls: Arc<rustls::ClientConfig>,
    mut req: http::Request<BodyWrapper<Bytes>>,
) -> Result<BytesResponse, instant_acme::Error> {
    let uri = req.uri().clone();
    if uri.scheme_str() != Some("https") {
        return Err(other(format!("{uri}: the ACME directory must be https")));
    }
    let host = uri.host().ok_or_else(|| other(format!("{uri}: no host")))?.to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await.map_err(other)?;
    let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_owned()).map_err(other)?;
    let stream = tokio_rustls::TlsConnector::from(tls).connect(name, tcp).await.map_err(other)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(other)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    // Origin form and a Host header, as HTTP/1.1 asks.
    let authority = uri.authority().map(|a| a.as_str().to_owned()).unwrap_or(host);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    *req.uri_mut() = path.parse().map_err(other)?;
    let host_value = http::HeaderValue::from_str(&authority).map_err(other)?;
    req.headers_mut().insert(http::header::HOST, host_value);
    let resp = sender.send_request(req).await.map_err(other)?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.map_err(other)?.to_bytes();
    Ok(BytesResponse::from(http::Response::from_parts(parts, Full::new(body))))
}
