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
    /// Parsed `short_base` and `short_bases` (to refuse loops).
    pub bases: &'a [url::Url],
    /// Largest `valid_day`.
    pub max_valid_day: u32,
    /// `valid_day` when absent (none: never expires).
    pub default_valid_day: Option<u32>,
    /// Seconds in a day (86400; tests shorten it).
    pub day_secs: i64,
    /// Hosts (`host[:port]`, lower case, the port only when not the scheme's default) `domain`
    /// may name: those of `short_base` and `short_bases`, in the order of `bases`.
    pub domains: &'a [String],
}

/// Longest `custom_code`.
pub const MAX_CODE_LEN: usize = 64;
/// Shortest `custom_code`.
pub const MIN_CUSTOM_CODE_LEN: usize = 4;
/// Most tags of a link.
pub const MAX_TAGS: usize = 20;
/// Longest tag, in bytes.
pub const MAX_TAG_BYTES: usize = 64;
/// Longest title, in bytes.
pub const MAX_TITLE_BYTES: usize = 512;

/// Whether `code` could be a code: 1 to 64 of [A-Za-z0-9_-].
pub fn is_code(code: &str) -> bool {
    !code.is_empty()
        && code.len() <= MAX_CODE_LEN
        && code.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
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
    with_fuzz_limits(|limits| fuzz_batch_with(body, limits))
}

/// Runs `f` with the limits the fuzz targets use (`https://s.example/`, 365 days).
fn with_fuzz_limits(f: impl FnOnce(&Limits<'_>)) {
    let bases: Vec<url::Url> = url::Url::parse("https://s.example/").into_iter().collect();
    let domains = ["s.example".to_owned()];
    f(&Limits { bases: &bases, max_valid_day: 365, default_valid_day: None, day_secs: 86_400, domains: &domains })
}

fn fuzz_batch_with(body: &[u8], limits: &Limits<'_>) {
    let now = 1_700_000_000;
    if let Ok(results) = batch(body, limits, now) {
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
    check_url(&origin, limits.bases).map_err(reject)?;
    let days = match obj.get("valid_day") {
        None | Some(Value::Null) => limits.default_valid_day,
        Some(v) => Some(valid_day(v, limits.max_valid_day).map_err(reject)?),
    };
    let mut out = NewEntry {
        origin_url: origin.clone(),
        expires_at: days.map(|d| now + i64::from(d) * limits.day_secs),
        ..NewEntry::default()
    };
    if let Some(v) = obj.get("valid_until").filter(|v| !v.is_null()) {
        if obj.get("valid_day").is_some_and(|v| !v.is_null()) {
            return Err(reject("valid_until: give valid_day or valid_until, not both".into()));
        }
        let t = rfc3339("valid_until", v).map_err(reject)?;
        if t <= now {
            return Err(reject("valid_until: must be in the future".into()));
        }
        out.expires_at = Some(t);
    }
    if let Some(v) = obj.get("custom_code").filter(|v| !v.is_null()) {
        out.custom_code = Some(custom_code(v).map_err(reject)?);
    }
    match obj.get("find_if_exists") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => out.find_if_exists = *b,
        Some(_) => return Err(reject("find_if_exists: must be true or false".into())),
    }
    if let Some(v) = obj.get("valid_since").filter(|v| !v.is_null()) {
        out.valid_since = Some(rfc3339("valid_since", v).map_err(reject)?);
    }
    if let Some(v) = obj.get("max_visits").filter(|v| !v.is_null()) {
        out.max_visits = Some(max_visits(v).map_err(reject)?);
    }
    if let Some(v) = obj.get("tags").filter(|v| !v.is_null()) {
        out.tags = tags(v).map_err(reject)?;
    }
    if let Some(v) = obj.get("title").filter(|v| !v.is_null()) {
        // An empty title is no title: `""` and `null` ask for the same link (find_if_exists).
        out.title = Some(title(v).map_err(reject)?).filter(|t| !t.is_empty());
    }
    if let Some(v) = obj.get("domain").filter(|v| !v.is_null()) {
        let Some(d) = v.as_str() else {
            return Err(reject("domain: must be a string".into()));
        };
        let Some(d) = known_domain(&d.to_ascii_lowercase(), limits) else {
            return Err(reject(format!(
                "domain: `{d}` is not one of the configured short bases ({})",
                limits.domains.join(", ")
            )));
        };
        // The default base's domain is no domain, as Shlink has it: both make the same short URL,
        // and `find_if_exists` must find the one link for either.
        out.domain = Some(d).filter(|d| limits.domains.first() != Some(d));
    }
    if out.valid_since.zip(out.expires_at).is_some_and(|(a, b)| a >= b) {
        return Err(reject("valid_since: must be before the expiry".into()));
    }
    Ok(out)
}

/// The configured domain `d` (lower case) names: itself, or, written with its base's default
/// port (`sho.rt:443` for `https://sho.rt`), the domain as configured.
fn known_domain(d: &str, limits: &Limits<'_>) -> Option<String> {
    if limits.domains.iter().any(|known| known == d) {
        return Some(d.to_owned());
    }
    let (host, port) = d.rsplit_once(':')?;
    let port = port.parse::<u16>().ok()?;
    limits
        .bases
        .iter()
        .zip(limits.domains)
        .find(|(base, _)| {
            base.port().is_none()
                && base.port_or_known_default() == Some(port)
                && base.host_str().is_some_and(|h| h.eq_ignore_ascii_case(host))
        })
        .map(|(_, known)| known.clone())
}

/// An RFC 3339 date as Unix seconds.
pub fn rfc3339(field: &str, v: &Value) -> Result<i64, String> {
    let Some(s) = v.as_str() else {
        return Err(format!("{field}: must be an RFC 3339 date string, e.g. 2030-01-31T12:00:00Z"));
    };
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|d| d.timestamp())
        .map_err(|err| format!("{field}: `{s}` is not an RFC 3339 date ({err}), e.g. 2030-01-31T12:00:00Z"))
}

fn custom_code(v: &Value) -> Result<String, String> {
    let Some(s) = v.as_str() else {
        return Err("custom_code: must be a string".into());
    };
    if s.len() < MIN_CUSTOM_CODE_LEN || !is_code(s) {
        return Err(format!(
            "custom_code: `{s}` must be {MIN_CUSTOM_CODE_LEN} to {MAX_CODE_LEN} characters of A-Z, a-z, 0-9, _ and -"
        ));
    }
    Ok(s.to_owned())
}

fn max_visits(v: &Value) -> Result<i64, String> {
    match v.as_i64() {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(format!("max_visits: `{v}` is not a whole number of visits of at least 1")),
    }
}

fn tags(v: &Value) -> Result<Vec<String>, String> {
    let Some(a) = v.as_array() else {
        return Err("tags: must be an array of strings".into());
    };
    if a.len() > MAX_TAGS {
        return Err(format!("tags: at most {MAX_TAGS} tags, got {}", a.len()));
    }
    let mut out = Vec::with_capacity(a.len());
    for t in a {
        let Some(t) = t.as_str() else {
            return Err("tags: must be an array of strings".into());
        };
        if t.is_empty() || t.len() > MAX_TAG_BYTES || t.chars().any(char::is_control) {
            return Err(format!("tags: `{t}` must be 1 to {MAX_TAG_BYTES} bytes without control characters"));
        }
        out.push(t.to_owned());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn title(v: &Value) -> Result<String, String> {
    match v.as_str() {
        Some(t) if t.len() <= MAX_TITLE_BYTES && !t.chars().any(char::is_control) => Ok(t.to_owned()),
        Some(_) => Err(format!("title: must be at most {MAX_TITLE_BYTES} bytes without control characters")),
        None => Err("title: must be a string".into()),
    }
}

/// A validated `PATCH`: each field `None` when absent, `Some(None)` when cleared with `null`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Patch {
    /// New URL.
    pub origin_url: Option<String>,
    /// New expiry (from `valid_until` or `valid_day`, counted from now).
    pub expires_at: Option<Option<i64>>,
    /// New start of validity.
    pub valid_since: Option<Option<i64>>,
    /// New cap.
    pub max_visits: Option<Option<i64>>,
    /// New tags (`null` or `[]` clears).
    pub tags: Option<Vec<String>>,
    /// New title.
    pub title: Option<Option<String>>,
}

/// Fields a `PATCH` may carry.
pub const PATCH_FIELDS: [&str; 7] =
    ["origin_url", "valid_since", "valid_until", "valid_day", "max_visits", "tags", "title"];

/// Parses and validates a `PATCH /short/v1/urls/{code}` body.
pub fn patch(body: &[u8], limits: &Limits<'_>, now: i64) -> Result<Patch, String> {
    if body.len() > MAX_BODY {
        return Err(format!("request body larger than {MAX_BODY} bytes"));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("request body is not valid JSON: {e}"))?;
    let Some(obj) = v.as_object() else {
        return Err("request body must be a JSON object".into());
    };
    if let Some(k) = obj.keys().find(|k| !PATCH_FIELDS.contains(&k.as_str())) {
        return Err(format!("{k}: is not a field that can be changed (those are: {})", PATCH_FIELDS.join(", ")));
    }
    let mut p = Patch::default();
    if let Some(v) = obj.get("origin_url") {
        let Some(u) = v.as_str() else {
            return Err("origin_url: must be a string".into());
        };
        check_url(u, limits.bases)?;
        p.origin_url = Some(u.to_owned());
    }
    if obj.contains_key("valid_day") && obj.contains_key("valid_until") {
        return Err("valid_until: give valid_day or valid_until, not both".into());
    }
    if let Some(v) = obj.get("valid_day") {
        p.expires_at = Some(match v {
            Value::Null => None,
            v => Some(now + i64::from(valid_day(v, limits.max_valid_day)?) * limits.day_secs),
        });
    }
    if let Some(v) = obj.get("valid_until") {
        p.expires_at = Some(match v {
            Value::Null => None,
            v => {
                // As at creation. A date in the past would have the sweep, which deletes links
                // 7 days after they expire, delete this one within a minute and free its code
                // for anyone to take (ending a link is DELETE: its code stays taken).
                let t = rfc3339("valid_until", v)?;
                if t <= now {
                    return Err("valid_until: must be in the future (to end a link now, DELETE it)".into());
                }
                Some(t)
            }
        });
    }
    if let Some(v) = obj.get("valid_since") {
        p.valid_since = Some(if v.is_null() { None } else { Some(rfc3339("valid_since", v)?) });
    }
    if let Some(v) = obj.get("max_visits") {
        p.max_visits = Some(if v.is_null() { None } else { Some(max_visits(v)?) });
    }
    if let Some(v) = obj.get("tags") {
        p.tags = Some(if v.is_null() { Vec::new() } else { tags(v)? });
    }
    if let Some(v) = obj.get("title") {
        p.title = Some(if v.is_null() { None } else { Some(title(v)?).filter(|t| !t.is_empty()) });
    }
    Ok(p)
}

/// A query's name and value, percent-decoded.
type QueryPair<'a> = (std::borrow::Cow<'a, str>, std::borrow::Cow<'a, str>);

/// Names of the list's parameters, whose values must be UTF-8 once percent-decoded.
const LIST_PARAMS: [&str; 7] = ["page", "page_size", "search", "tag", "since", "until", "order_by"];

/// The pairs of a query (`application/x-www-form-urlencoded`). A value of one of the list's
/// parameters that is not UTF-8 once decoded (`search=%FF`) is an error: decoded lossily it
/// would search for U+FFFD and answer an empty page as if nothing matched. Other pairs are
/// decoded lossily and ignored by the caller.
fn query_pairs(query: &str) -> Result<Vec<QueryPair<'_>>, String> {
    fn decode(raw: &str) -> Result<std::borrow::Cow<'_, str>, ()> {
        if !raw.bytes().any(|b| b == b'%' || b == b'+') {
            return Ok(raw.into());
        }
        let spaced = raw.replace('+', " ");
        let bytes: Vec<u8> = percent_encoding::percent_decode_str(&spaced).collect();
        String::from_utf8(bytes).map(Into::into).map_err(|_| ())
    }
    let mut out = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let Ok(k) = decode(k) else { continue };
        match decode(v) {
            Ok(v) => out.push((k, v)),
            Err(()) if LIST_PARAMS.contains(&&*k) => return Err(format!("{k}: not valid UTF-8 once percent-decoded")),
            Err(()) => {}
        }
    }
    Ok(out)
}

/// A date's error in a query, with the likely cause when the date holds a space: an offset's `+`
/// written as is, which a query decodes as a space.
fn plus_hint(err: String) -> String {
    if err.contains(' ') && err.split('`').nth(1).is_some_and(|date| date.contains(' ')) {
        format!("{err} (in a query a `+` is a space: write the offset's `+` as %2B)")
    } else {
        err
    }
}

/// Parses the query of `GET /short/v1/urls`.
pub fn list_query(query: &str) -> Result<crate::store::links::ListQuery, String> {
    use crate::store::links::{ListQuery, Order};
    let mut q = ListQuery::default();
    for (k, v) in query_pairs(query)? {
        let num = |max: u32| -> Result<u32, String> {
            match v.parse::<u32>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(format!("{k}: `{v}` must be a whole number from 1 to {max}")),
            }
        };
        match &*k {
            "page" => q.page = num(1_000_000)?,
            "page_size" => q.page_size = num(100)?,
            "search" if !v.is_empty() => q.search = Some(v.chars().take(256).collect()),
            "tag" if !v.is_empty() => q.tag = Some(v.into_owned()),
            "since" => q.since = Some(rfc3339("since", &Value::String(v.into_owned())).map_err(plus_hint)?),
            "until" => q.until = Some(rfc3339("until", &Value::String(v.into_owned())).map_err(plus_hint)?),
            "order_by" => {
                q.order = match &*v {
                    "created_at" => Order::CreatedAsc,
                    "-created_at" => Order::CreatedDesc,
                    "visits" => Order::VisitsAsc,
                    "-visits" => Order::VisitsDesc,
                    _ => return Err(format!("order_by: `{v}` is not one of created_at, -created_at, visits, -visits")),
                }
            }
            // Empty `search` / `tag`: no filter. Other names are ignored, as Shlink does: an
            // authentication plugin may carry its credential there (key-auth's `apikey`,
            // jwt-auth's `jwt`), and the request must still be served.
            _ => {}
        }
    }
    Ok(q)
}

/// Fuzzing entry point for the management parsers: a `PATCH` body, a list query, and a visit's
/// `Referer` and `User-Agent`.
#[doc(hidden)]
pub fn fuzz_manage(data: &[u8]) {
    with_fuzz_limits(|limits| fuzz_manage_with(data, limits))
}

fn fuzz_manage_with(data: &[u8], limits: &Limits<'_>) {
    if let Ok(p) = patch(data, limits, 1_700_000_000) {
        assert!(p.origin_url.is_none_or(|u| u.len() <= MAX_URL_BYTES));
        assert!(p.tags.is_none_or(|t| t.len() <= MAX_TAGS));
        assert!(p.max_visits.flatten().is_none_or(|m| m >= 1));
    }
    let text = String::from_utf8_lossy(data);
    if let Ok(q) = list_query(&text) {
        assert!(q.page >= 1 && (1..=100).contains(&q.page_size));
    }
    // The visit's fields taken from request headers: a stored referer is a host and nothing else.
    if let Some(host) = crate::visits::referer_host(&text) {
        assert!(!host.is_empty() && host.len() <= 253, "{host:?}");
        assert!(host.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.:".contains(&b)), "{host:?}");
    }
    let _ = crate::visits::classify(Some(&text));
}

fn check_url(s: &str, bases: &[url::Url]) -> Result<(), String> {
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
    // The WHATWG parser reads `https:host`, `https:/host`, `https:///host` and `https:\\host` as
    // `https://host/`; RFC 3986 (and the stored text the redirect sends) says `//` then the host.
    let after_scheme = s.get(u.scheme().len()..).unwrap_or_default();
    let authority = after_scheme.strip_prefix("://").filter(|a| !a.starts_with(['/', '\\']));
    if u.host_str().is_none_or(str::is_empty) || authority.is_none() {
        return Err("origin_url: has no host (the form is scheme://host/path)".into());
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err("origin_url: must not contain a user name or password".into());
    }
    if bases.iter().any(|base| points_into(&u, base)) {
        return Err("origin_url: points into this short-URL service (a redirect loop)".into());
    }
    Ok(())
}

/// Whether `u` reaches the short-URL service under `base` as the gateway routes it: the same
/// host and port (or `http` and `https` each on its default port: a host that serves one
/// serves or redirects the other, as APISIX's 9080 and 9443 serve the same routes), and a path at or under the base's once it is percent-decoded, its
/// repeated slashes merged and its dot segments resolved, as the gateway does before matching
/// routes (`//s/x` and `/%73/x` are `/s/x`). A host that is another name for the same server
/// (an IP address for a name) is not recognized.
fn points_into(u: &url::Url, base: &url::Url) -> bool {
    // (The parser drops a scheme's default port: `port()` is `None` for `https://h:443`.)
    let same_port =
        u.port_or_known_default() == base.port_or_known_default() || (u.port().is_none() && base.port().is_none());
    let same_origin = same_port
        && u.host_str().map(|h| h.trim_end_matches('.').to_ascii_lowercase())
            == base.host_str().map(|h| h.trim_end_matches('.').to_ascii_lowercase());
    if !same_origin {
        return false;
    }
    let path = routed_path(u.path());
    let base_path = routed_path(base.path());
    let base_path = base_path.trim_end_matches('/');
    path == base_path || path.starts_with(&format!("{base_path}/"))
}

/// A URL path as the gateway matches it: percent-decoded (an invalid escape stays as it is),
/// repeated slashes merged, `.` and `..` segments resolved.
fn routed_path(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                decoded.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    let decoded = String::from_utf8_lossy(&decoded);
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/').filter(|s| !s.is_empty() && *s != ".") {
        if seg == ".." {
            segments.pop();
        } else {
            segments.push(seg);
        }
    }
    let mut out = String::with_capacity(decoded.len() + 1);
    for seg in &segments {
        out.push('/');
        out.push_str(seg);
    }
    if out.is_empty() || decoded.ends_with('/') {
        out.push('/');
    }
    out
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
        limits_of(std::slice::from_ref(base), &[])
    }

    fn limits_of<'a>(bases: &'a [url::Url], domains: &'a [String]) -> Limits<'a> {
        Limits { bases, max_valid_day: 3650, default_valid_day: None, day_secs: 86_400, domains }
    }

    fn parse_bases(bases: &[&str]) -> Vec<url::Url> {
        bases.iter().filter_map(|b| url::Url::parse(b).ok()).collect()
    }

    /// A list parameter that is not UTF-8 once percent-decoded is refused (decoded lossily it
    /// searched for U+FFFD and answered an empty page); valid escapes and `+` decode as usual,
    /// and parameters the list does not know are ignored whatever they hold.
    #[test]
    fn a_list_parameter_that_is_not_utf8_is_refused() {
        for (bad, name) in [("search=%FF", "search"), ("tag=%C3", "tag"), ("page=1&since=%E2%82", "since")] {
            let err = list_query(bad).map(|_| ()).unwrap_err();
            assert_eq!(err, format!("{name}: not valid UTF-8 once percent-decoded"), "{bad}");
        }
        let q = list_query("search=caf%C3%A9+cr%C3%A8me&tag=a%2Bb&apikey=%FF&jwt").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((q.search.as_deref(), q.tag.as_deref()), (Some("café crème"), Some("a+b")));
        let err = list_query("until=2030-01-01T00:00:00+05:00").map(|_| ()).unwrap_err();
        assert!(err.ends_with("(in a query a `+` is a space: write the offset's `+` as %2B)"), "{err}");
        let q = list_query("until=2030-01-01T00:00:00%2B05:00").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(q.until, Some(1_893_438_000));
        let q = list_query("page=2&&page_size=5&search=").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((q.page, q.page_size, q.search), (2, 5, None));
    }

    /// A host comes right after `scheme://`, as RFC 3986 writes it; the forms the WHATWG parser
    /// repairs are refused (the redirect would send the text as it was given).
    #[test]
    fn a_url_without_its_authority_is_refused() {
        for bad in ["https:///nohost", "https:/nohost", "https:nohost", "https:\\\\nohost", "http:\\\\x/y"] {
            assert_eq!(
                check_url(bad, &[]),
                Err("origin_url: has no host (the form is scheme://host/path)".into()),
                "{bad}"
            );
        }
        for good in ["https://host", "HTTPS://Host/a//b", "http://[::1]:8080/x", "https://h/a\\b"] {
            assert_eq!(check_url(good, &[]), Ok(()), "{good}");
        }
    }

    /// `domain` names a short base by its host, with or without the scheme's default port.
    #[test]
    fn a_domain_with_its_default_port_is_the_configured_one() {
        let bases = parse_bases(&["https://main.example/s", "https://sho.rt/s", "http://go.example:8080/s"]);
        let domains = ["main.example".to_owned(), "sho.rt".to_owned(), "go.example:8080".to_owned()];
        let l = limits_of(&bases, &domains);
        let domain_of = |d: &str| {
            entry(&serde_json::json!({"origin_url": "https://x.example/", "domain": d}), &l, 0)
                .map(|e| e.domain.unwrap_or_default())
                .map_err(|r| r.message)
        };
        assert_eq!(domain_of("sho.rt"), Ok("sho.rt".to_owned()));
        assert_eq!(domain_of("SHO.RT:443"), Ok("sho.rt".to_owned()));
        assert_eq!(domain_of("go.example:8080"), Ok("go.example:8080".to_owned()));
        // `short_base`'s own domain is no domain (`unwrap_or_default` above makes it "").
        assert_eq!(domain_of("main.example:443"), Ok(String::new()));
        for bad in ["sho.rt:80", "sho.rt:8443", "go.example", "go.example:80", "other.example", "sho.rt:x"] {
            assert!(domain_of(bad).is_err_and(|m| m.starts_with("domain: ")), "{bad}");
        }
    }

    /// The loop check sees paths as the gateway routes them, under every short base.
    #[test]
    fn a_url_into_any_short_base_is_a_loop_however_its_path_is_spelled() {
        let bases = parse_bases(&["http://127.0.0.1:9080/s", "https://sho.rt/s/", "https://go.example/"]);
        let l = limits_of(&bases, &[]);
        for u in [
            "http://127.0.0.1:9080/s/abc",
            "http://127.0.0.1:9080//s/abc",
            "http://127.0.0.1:9080/%73/abc",
            "http://127.0.0.1:9080/x/..%2Fs/abc",
            "http://127.0.0.1:9080/s",
            "https://sho.rt/s/guide",
            "https://SHO.RT.:443/s/guide",
            "https://go.example/anything",
            "http://sho.rt/s/guide",
            "http://go.example:80/x",
        ] {
            let r = entry(&json!({"origin_url": u}), &l, 0).err().map(|r| r.message).unwrap_or_default();
            assert!(r.contains("redirect loop"), "{u}: {r:?}");
        }
        for u in [
            "http://127.0.0.1:9080/short",
            "http://127.0.0.1:9081/s/abc",
            "http://sho.rt:8443/s/guide",
            "https://sho.rt/sx",
        ] {
            assert!(entry(&json!({"origin_url": u}), &l, 0).is_ok(), "{u}");
        }
    }

    #[test]
    fn a_patch_refuses_a_valid_until_in_the_past() {
        let base = url::Url::parse("http://127.0.0.1:9080/s").unwrap_or_else(|e| panic!("{e}"));
        let r = patch(br#"{"valid_until": "2020-01-01T00:00:00Z"}"#, &limits(&base), 1_800_000_000);
        assert!(r.as_ref().is_err_and(|e| e.starts_with("valid_until: must be in the future")), "{r:?}");
        let r = patch(br#"{"valid_until": "2030-01-01T00:00:00Z"}"#, &limits(&base), 1_800_000_000);
        assert!(r.is_ok_and(|p| p.expires_at == Some(Some(1_893_456_000))));
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
