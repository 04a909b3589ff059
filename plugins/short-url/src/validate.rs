//! Validation of one request entry (`{origin_url, valid_day}`), each failure with a message that
//! names the field and the reason.

use serde_json::Value;
use weir_plugin::http::StatusCode;

use crate::store::NewEntry;
use crate::{MAX_BODY, MAX_ENTRIES};

/// Longest accepted `origin_url`, in bytes.
pub const MAX_URL_BYTES: usize = 2048;

/// What entry validation needs from the plugin metadata.
pub struct Limits<'a> {
    /// Parsed `short_base` (to refuse loops).
    pub short_base: Option<&'a url::Url>,
    /// Largest `valid_day`.
    pub max_valid_day: u32,
    /// `valid_day` when absent (none: never expires).
    pub default_valid_day: Option<u32>,
    /// Seconds in a day (86400; tests shorten it).
    pub day_secs: i64,
}

/// A rejected entry: the `origin_url` to echo (as submitted, if it was a string) and why.
#[derive(Debug, PartialEq, Eq)]
pub struct Rejected {
    /// `origin_url` as submitted, when it was a string.
    pub origin_url: Option<String>,
    /// The message.
    pub message: String,
}

/// Parses and validates a whole request body: 1 to [`MAX_ENTRIES`] entries in a JSON array,
/// at most [`MAX_BODY`] bytes. A request-level problem is `Err((status, message))`; otherwise each
/// entry's own result, in order.
pub fn batch(
    body: &[u8],
    limits: &Limits<'_>,
    now: i64,
) -> Result<Vec<Result<NewEntry, Rejected>>, (StatusCode, String)> {
    if body.len() > MAX_BODY {
        return Err((StatusCode::PAYLOAD_TOO_LARGE, format!("request body larger than {MAX_BODY} bytes")));
    }
    let entries: Vec<Value> = match serde_json::from_slice::<Value>(body) {
        Err(e) => return Err((StatusCode::BAD_REQUEST, format!("request body is not valid JSON: {e}"))),
        Ok(Value::Array(a)) => a,
        Ok(_) => return Err((StatusCode::BAD_REQUEST, "request body must be a JSON array of entries".into())),
    };
    if entries.is_empty() {
        return Err((StatusCode::BAD_REQUEST, "request body is an empty array: send 1 to 100 entries".into()));
    }
    if entries.len() > MAX_ENTRIES {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("too many entries: at most {MAX_ENTRIES} per request, got {}", entries.len()),
        ));
    }
    Ok(entries.iter().map(|e| entry(e, limits, now)).collect())
}

/// Fuzzing entry point: any body, with the default limits. Panics when an invariant breaks.
#[doc(hidden)]
pub fn fuzz_batch(body: &[u8]) {
    let base = url::Url::parse("https://s.example/").ok();
    let limits = Limits { short_base: base.as_ref(), max_valid_day: 365, default_valid_day: None, day_secs: 86_400 };
    let now = 1_700_000_000;
    if let Ok(results) = batch(body, &limits, now) {
        assert!(!results.is_empty() && results.len() <= MAX_ENTRIES);
        for r in results.into_iter().flatten() {
            assert!(r.origin_url.len() <= MAX_URL_BYTES, "accepted an over-long url");
            assert!(r.expires_at.is_none_or(|t| t > now && t <= now + 365 * 86_400), "bad expiry {:?}", r.expires_at);
        }
    }
}

/// Validates one entry at time `now` (Unix seconds).
pub fn entry(v: &Value, limits: &Limits<'_>, now: i64) -> Result<NewEntry, Rejected> {
    let Some(obj) = v.as_object() else {
        return Err(Rejected { origin_url: None, message: "entry: must be a JSON object".into() });
    };
    let origin = match obj.get("origin_url") {
        None | Some(Value::Null) => {
            return Err(Rejected { origin_url: None, message: "origin_url: is required".into() });
        }
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(Rejected { origin_url: None, message: "origin_url: must be a string".into() }),
    };
    let reject = |message: String| Rejected { origin_url: Some(origin.clone()), message };
    check_url(&origin, limits.short_base).map_err(reject)?;
    let days = match obj.get("valid_day") {
        None | Some(Value::Null) => limits.default_valid_day,
        Some(v) => Some(valid_day(v, limits.max_valid_day).map_err(reject)?),
    };
    Ok(NewEntry { origin_url: origin, expires_at: days.map(|d| now + i64::from(d) * limits.day_secs) })
}

fn check_url(s: &str, short_base: Option<&url::Url>) -> Result<(), String> {
    if s.is_empty() {
        return Err("origin_url: must not be empty".into());
    }
    if s.len() > MAX_URL_BYTES {
        return Err(format!("origin_url: longer than {MAX_URL_BYTES} bytes ({} bytes)", s.len()));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("origin_url: must not contain whitespace or control characters".into());
    }
    let u = url::Url::parse(s).map_err(|e| format!("origin_url: not an absolute URL ({e})"))?;
    if u.scheme() != "http" && u.scheme() != "https" {
        return Err(format!("origin_url: scheme must be http or https, not `{}`", u.scheme()));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err("origin_url: has no host".into());
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err("origin_url: must not contain a user name or password".into());
    }
    if let Some(base) = short_base {
        let same_origin = u.scheme() == base.scheme()
            && u.host_str().map(str::to_ascii_lowercase) == base.host_str().map(str::to_ascii_lowercase)
            && u.port_or_known_default() == base.port_or_known_default();
        let base_path = base.path().trim_end_matches('/');
        if same_origin && (u.path() == base_path || u.path().starts_with(&format!("{base_path}/"))) {
            return Err("origin_url: points into this short-URL service (a redirect loop)".into());
        }
    }
    Ok(())
}

fn valid_day(v: &Value, max: u32) -> Result<u32, String> {
    let range = || format!("valid_day: must be between 1 and {max} days");
    let n: u64 = match v {
        Value::String(s) => {
            let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            if !digits || s.starts_with('0') {
                return Err(format!(
                    "valid_day: `{s}` is not a whole number of days (digits only, no sign, leading zero, spaces, fraction or exponent)"
                ));
            }
            s.parse().map_err(|_| range())?
        }
        Value::Number(n) => match n.as_u64() {
            Some(n) => n,
            None => return Err(format!("valid_day: `{n}` is not a whole positive number of days")),
        },
        _ => return Err("valid_day: must be a string of digits (or an integer)".into()),
    };
    if n == 0 || n > u64::from(max) {
        return Err(range());
    }
    Ok(n as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits(base: &url::Url) -> Limits<'_> {
        Limits { short_base: Some(base), max_valid_day: 3650, default_valid_day: None, day_secs: 86_400 }
    }

    #[test]
    fn accepts_good_entries() {
        let base = url::Url::parse("http://127.0.0.1:9080/s").unwrap_or_else(|e| panic!("{e}"));
        let e =
            entry(&json!({"origin_url": "https://example.com/a?b=c#d"}), &limits(&base), 1000).map_err(|r| r.message);
        assert_eq!(e.map(|e| (e.origin_url, e.expires_at)), Ok(("https://example.com/a?b=c#d".into(), None)));
        let e = entry(&json!({"origin_url": "http://x.org", "valid_day": "2"}), &limits(&base), 1000);
        assert_eq!(e.map(|e| e.expires_at).map_err(|r| r.message), Ok(Some(1000 + 2 * 86400)));
        let e = entry(&json!({"origin_url": "http://x.org", "valid_day": 7}), &limits(&base), 0);
        assert!(e.is_ok());
    }

    #[test]
    fn rejects_every_listed_bad_form() {
        let base = url::Url::parse("http://127.0.0.1:9080/s").unwrap_or_else(|e| panic!("{e}"));
        let l = limits(&base);
        let bad_urls = [
            ("", "must not be empty"),
            ("ftp://x.org/a", "scheme must be http or https"),
            ("/relative", "not an absolute URL"),
            ("http://exa mple.com", "whitespace"),
            ("http://x.org/\u{7}", "control"),
            ("http://user:pw@x.org/", "user name or password"),
            ("http://127.0.0.1:9080/s/abc", "redirect loop"),
            ("mailto:a@b.c", "scheme must be http or https"),
        ];
        for (u, why) in bad_urls {
            let r = entry(&json!({"origin_url": u}), &l, 0).err().map(|r| r.message).unwrap_or_default();
            assert!(r.starts_with("origin_url: ") && r.contains(why), "{u:?}: {r}");
        }
        let long = format!("http://x.org/{}", "a".repeat(2048));
        assert!(entry(&json!({"origin_url": long}), &l, 0).is_err());
        for vd in ["0", "-1", "abc", "3.5", "1e9", "+7", "07", " 7", "", "3651"] {
            let r = entry(&json!({"origin_url": "http://x.org", "valid_day": vd}), &l, 0).err();
            let r = r.map(|r| (r.origin_url, r.message)).unwrap_or_default();
            assert_eq!(r.0.as_deref(), Some("http://x.org"), "{vd:?}");
            assert!(r.1.starts_with("valid_day: "), "{vd:?}: {}", r.1);
        }
        for vd in [json!(0), json!(-1), json!(3.5), json!(true), json!([1])] {
            assert!(entry(&json!({"origin_url": "http://x.org", "valid_day": vd}), &l, 0).is_err(), "{vd}");
        }
        let r = entry(&json!({"valid_day": "1"}), &l, 0).err().map(|r| (r.origin_url, r.message));
        assert_eq!(r, Some((None, "origin_url: is required".into())));
        assert!(entry(&json!({"origin_url": 5}), &l, 0).is_err());
        assert!(entry(&json!("http://x.org"), &l, 0).is_err());
    }
}
