//! The response envelope: `{code, message, timestamp, data}` at the top and per item.

use serde_json::{json, Value};
use weir_plugin::http::StatusCode;
use weir_plugin::{Flow, PluginResponse};

use crate::validate::Rejected;

/// A request-level error: HTTP status = envelope code, `data: []`.
pub fn request_error(status: StatusCode, message: &str, now: i64) -> Flow {
    Flow::Respond(PluginResponse::json(
        status,
        &json!({"code": status.as_u16(), "message": message, "timestamp": now, "data": []}),
    ))
}

/// A successful item.
pub fn item_ok(origin_url: &str, code: &str, short_base: &str, now: i64) -> Value {
    json!({
        "code": 200,
        "message": "success",
        "timestamp": now,
        "data": {"origin_url": origin_url, "short_code": code, "short_url": format!("{short_base}/{code}")},
    })
}

/// A failed item.
pub fn item_err(rejected: Option<&Rejected>, now: i64) -> Value {
    let (origin, message) = match rejected {
        Some(r) => (r.origin_url.clone(), r.message.clone()),
        None => (None, "not stored".to_owned()),
    };
    json!({
        "code": 400,
        "message": message,
        "timestamp": now,
        "data": {"origin_url": origin, "short_code": null, "short_url": null},
    })
}

/// The envelope for items: 200 `success`, 207 `partial success` (HTTP 200), or 400 (HTTP 400).
pub fn respond(items: Vec<Value>, now: i64) -> PluginResponse {
    let ok = items.iter().filter(|i| i["code"] == 200).count();
    let (code, message, status) = if ok == items.len() {
        (200, "success".to_owned(), StatusCode::OK)
    } else if ok > 0 {
        (207, "partial success".to_owned(), StatusCode::OK)
    } else {
        (400, format!("no entry was valid ({} rejected)", items.len()), StatusCode::BAD_REQUEST)
    };
    PluginResponse::json(status, &json!({"code": code, "message": message, "timestamp": now, "data": items}))
}
