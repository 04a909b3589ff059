//! The response envelope: `{code, message, timestamp, data}` at the top and per item.
//!
//! Items are typed and borrow what they show: a 100-entry answer is serialized straight into
//! its body, without building a `serde_json::Value` tree per item (that tree was a third of the
//! instructions of a whole creation request).

use serde::{Serialize, Serializer};
use weir_plugin::http::StatusCode;
use weir_plugin::{Flow, PluginResponse};

use crate::validate::Rejected;

/// A request-level error: HTTP status = envelope code, `data: []`.
pub fn request_error(status: StatusCode, message: &str, now: i64) -> Flow<'static> {
    Flow::Respond(error_response(status, message, now))
}

fn error_response(status: StatusCode, message: &str, now: i64) -> PluginResponse {
    let envelope = Envelope { code: status.as_u16(), data: &[], message, timestamp: now };
    PluginResponse::json_of(status, &envelope)
}

/// 405 with the `Allow` field RFC 9110 requires (`allow`: the methods the target takes).
pub fn method_not_allowed(message: &str, allow: &'static str, now: i64) -> Flow<'static> {
    let mut resp = error_response(StatusCode::METHOD_NOT_ALLOWED, message, now);
    resp.headers.insert(weir_plugin::http::header::ALLOW, weir_plugin::http::HeaderValue::from_static(allow));
    Flow::Respond(resp)
}

/// One entry's result. Fields in the order the JSON text has always had them (sorted).
#[derive(Serialize)]
pub struct Item<'a> {
    code: u16,
    data: ItemData<'a>,
    message: &'a str,
    timestamp: i64,
}

#[derive(Serialize)]
struct ItemData<'a> {
    origin_url: Option<&'a str>,
    short_code: Option<&'a str>,
    short_url: Option<ShortUrl<'a>>,
}

/// `{short_base}/{code}`, written into the JSON text without a string of its own.
struct ShortUrl<'a>(&'a str, &'a str);

impl Serialize for ShortUrl<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{}/{}", self.0, self.1))
    }
}

/// A successful item.
pub fn item_ok<'a>(origin_url: &'a str, code: &'a str, short_base: &'a str, now: i64) -> Item<'a> {
    Item {
        code: 200,
        data: ItemData {
            origin_url: Some(origin_url),
            short_code: Some(code),
            short_url: Some(ShortUrl(short_base, code)),
        },
        message: "success",
        timestamp: now,
    }
}

/// A failed item with its own code (409: the `custom_code` is taken).
pub fn item_fail<'a>(code: u16, origin_url: &'a str, message: &'a str, now: i64) -> Item<'a> {
    Item {
        code,
        data: ItemData { origin_url: Some(origin_url), short_code: None, short_url: None },
        message,
        timestamp: now,
    }
}

/// A successful management answer: HTTP 200, envelope code 200 `success`, `data` as given.
pub fn data<T: Serialize + ?Sized>(data: &T, now: i64) -> PluginResponse {
    #[derive(Serialize)]
    struct One<'a, T: ?Sized> {
        code: u16,
        data: &'a T,
        message: &'a str,
        timestamp: i64,
    }
    PluginResponse::json_of(StatusCode::OK, &One { code: 200, data, message: "success", timestamp: now })
}

/// A failed item.
pub fn item_err(rejected: Option<&Rejected>, now: i64) -> Item<'_> {
    let (origin_url, message) = match rejected {
        Some(r) => (r.origin_url.as_deref(), r.message.as_str()),
        None => (None, "not stored"),
    };
    Item { code: 400, data: ItemData { origin_url, short_code: None, short_url: None }, message, timestamp: now }
}

/// The top level of every answer.
#[derive(Serialize)]
struct Envelope<'a> {
    code: u16,
    data: &'a [Item<'a>],
    message: &'a str,
    timestamp: i64,
}

/// The envelope for items: 200 `success`, 207 `partial success` (HTTP 200), or 400 (HTTP 400).
pub fn respond(items: &[Item<'_>], now: i64) -> PluginResponse {
    let ok = items.iter().filter(|i| i.code == 200).count();
    // 409 only when every failure is a taken code (the docs' rule): a request that also holds
    // an invalid entry is the client's to fix first, 400.
    let only_conflicts = items.iter().all(|i| i.code == 409);
    let none_valid;
    let (code, message, status) = if ok == items.len() {
        (200, "success", StatusCode::OK)
    } else if ok > 0 {
        (207, "partial success", StatusCode::OK)
    } else if only_conflicts {
        none_valid = format!("no entry was stored ({} rejected, a custom_code taken)", items.len());
        (409, none_valid.as_str(), StatusCode::CONFLICT)
    } else {
        none_valid = format!("no entry was valid ({} rejected)", items.len());
        (400, none_valid.as_str(), StatusCode::BAD_REQUEST)
    };
    PluginResponse::json_of(status, &Envelope { code, data: items, message, timestamp: now })
}
