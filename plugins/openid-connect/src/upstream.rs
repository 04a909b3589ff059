//! The identity headers sent upstream: set only from verified data, and every client-sent copy
//! removed first (a client cannot pose as a user). `X-ID-Token` and `X-Userinfo` are the base64
//! (standard, padded) of the JSON, as APISIX sends them.

use base64::Engine as _;
use serde_json::Value;
use weir_plugin::http::{header, HeaderName, HeaderValue};
use weir_plugin::RequestCtx;

use crate::conf::Conf;

/// `X-Access-Token`.
pub const X_ACCESS_TOKEN: HeaderName = HeaderName::from_static("x-access-token");
/// `X-ID-Token`.
pub const X_ID_TOKEN: HeaderName = HeaderName::from_static("x-id-token");
/// `X-Userinfo`.
pub const X_USERINFO: HeaderName = HeaderName::from_static("x-userinfo");
/// `X-Refresh-Token`.
pub const X_REFRESH_TOKEN: HeaderName = HeaderName::from_static("x-refresh-token");
/// `X-Raw-ID-Token`.
pub const X_RAW_ID_TOKEN: HeaderName = HeaderName::from_static("x-raw-id-token");

/// Removes the client's copies of every header this plugin sets.
pub fn clear(ctx: &mut RequestCtx) {
    for h in [X_ACCESS_TOKEN, X_ID_TOKEN, X_USERINFO, X_REFRESH_TOKEN, X_RAW_ID_TOKEN] {
        ctx.headers.remove(h);
    }
}

fn set(ctx: &mut RequestCtx, name: HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        ctx.headers.insert(name, v);
    }
}

/// The header carrying the access token upstream (`X-Access-Token`, or `Authorization` when so
/// configured), if configured.
pub fn access_token_header(conf: &Conf, token: &str) -> Option<(HeaderName, HeaderValue)> {
    if !conf.set_access_token_header {
        return None;
    }
    if conf.access_token_in_authorization_header {
        HeaderValue::from_str(&format!("Bearer {token}")).ok().map(|v| (header::AUTHORIZATION, v))
    } else {
        HeaderValue::from_str(token).ok().map(|v| (X_ACCESS_TOKEN, v))
    }
}

/// The access token upstream (see [`access_token_header`]).
pub fn access_token(ctx: &mut RequestCtx, conf: &Conf, token: &str) {
    if let Some((name, value)) = access_token_header(conf, token) {
        ctx.headers.insert(name, value);
    }
}

/// `base64(JSON(value))` as a header value.
pub fn json_value(value: &Value) -> Option<HeaderValue> {
    HeaderValue::from_str(&base64::engine::general_purpose::STANDARD.encode(value.to_string())).ok()
}

/// `name: base64(JSON(value))`.
pub fn json_header(ctx: &mut RequestCtx, name: HeaderName, value: &Value) {
    if let Some(v) = json_value(value) {
        ctx.headers.insert(name, v);
    }
}

/// The headers of a session (authorization-code flow).
pub fn session(ctx: &mut RequestCtx, conf: &Conf, s: &crate::session::Session) {
    if let Some(at) = &s.access_token {
        access_token(ctx, conf, at);
    }
    if conf.set_id_token_header {
        json_header(ctx, X_ID_TOKEN, &Value::Object(s.claims.clone()));
    }
    if conf.set_userinfo_header {
        if let Some(u) = &s.userinfo {
            json_header(ctx, X_USERINFO, u);
        }
    }
    if conf.set_refresh_token_header {
        if let Some(rt) = &s.refresh_token {
            set(ctx, X_REFRESH_TOKEN, rt);
        }
    }
    if conf.set_raw_id_token_header {
        set(ctx, X_RAW_ID_TOKEN, &s.id_token);
    }
}
