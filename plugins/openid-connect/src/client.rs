//! Requests to the provider through the host's HTTP client: JSON GETs, form POSTs with client
//! authentication, and the reading of their answers. Reasons returned here go to logs only.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;
use weir_plugin::http::{header, HeaderValue, Method};
use weir_plugin::{HttpClient, OutboundRequest};

use crate::conf::ClientAuth;

/// The host's client with the provider settings of one configuration.
pub struct Provider {
    /// The host's client.
    pub http: Arc<dyn HttpClient>,
    /// Per request.
    pub timeout: Duration,
    /// Verify certificates.
    pub verify_tls: bool,
}

/// Why the provider gave no usable answer.
#[derive(Debug)]
pub enum CallError {
    /// No answer at all (down, refused, timeout): the provider is unavailable.
    Unreachable(String),
    /// An answer that is not what was asked (status, body).
    Refused(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Unreachable(r) | CallError::Refused(r) => f.write_str(r),
        }
    }
}

impl Provider {
    fn request(&self, method: Method, url: &str) -> OutboundRequest {
        let mut req = OutboundRequest::new(method, url);
        req.timeout = self.timeout;
        req.verify_tls = self.verify_tls;
        req.headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        req
    }

    async fn json(&self, req: OutboundRequest) -> Result<Value, CallError> {
        let url = req.url.clone();
        let resp = self.http.send(req).await.map_err(|e| CallError::Unreachable(format!("{url}: {}", e.reason)))?;
        let body: Result<Value, _> = serde_json::from_slice(&resp.body);
        if !resp.status.is_success() {
            let detail = body
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
                .map(|e| format!(" ({e})"))
                .unwrap_or_default();
            return Err(CallError::Refused(format!("{url} answered {}{detail}", resp.status.as_u16())));
        }
        match body {
            Ok(v @ Value::Object(_)) => Ok(v),
            _ => Err(CallError::Refused(format!("{url}: the answer is not a JSON object"))),
        }
    }

    /// `GET url` as a JSON object, with an optional bearer token.
    pub async fn get_json(&self, url: &str, bearer: Option<&str>) -> Result<Value, CallError> {
        let mut req = self.request(Method::GET, url);
        if let Some(token) = bearer {
            let v = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| CallError::Refused("the access token is not a header value".into()))?;
            req.headers.insert(header::AUTHORIZATION, v);
        }
        self.json(req).await
    }

    /// `POST url` with a form body and the client's credentials, as a JSON object.
    pub async fn post_form(
        &self,
        url: &str,
        form: &[(&str, &str)],
        client: (&str, Option<&str>, ClientAuth),
        extra_headers: &[(weir_plugin::http::HeaderName, HeaderValue)],
    ) -> Result<Value, CallError> {
        let (id, secret, auth) = client;
        let mut body = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in form {
            body.append_pair(k, v);
        }
        let mut req = self.request(Method::POST, url);
        for (k, v) in extra_headers {
            req.headers.insert(k.clone(), v.clone());
        }
        match (auth, secret) {
            (ClientAuth::Basic, Some(secret)) => {
                // RFC 6749 2.3.1: both parts form-encoded before Basic.
                let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
                let pair = format!("{}:{}", enc(id), enc(secret));
                let value = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair));
                let v = HeaderValue::from_str(&value)
                    .map_err(|_| CallError::Refused("client credentials are not a header value".into()))?;
                req.headers.insert(header::AUTHORIZATION, v);
            }
            (ClientAuth::Post, Some(secret)) => {
                body.append_pair("client_id", id);
                body.append_pair("client_secret", secret);
            }
            (_, None) => {
                body.append_pair("client_id", id);
            }
        }
        req.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-www-form-urlencoded"));
        req.body = body.finish().into_bytes().into();
        self.json(req).await
    }
}
