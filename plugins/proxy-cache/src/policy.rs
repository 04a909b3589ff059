//! What may be stored and for how long: `Cache-Control` directives of requests and responses,
//! `Expires`, and the rules a shared cache keeps whatever the configuration says.
//!
//! Never stored: a response with `Set-Cookie`, with `Cache-Control: private`, `no-store` or
//! `no-cache`, with `Vary: *` (or a `Vary` of more than [`MAX_VARY`] names); a response to a
//! request carrying `Authorization` that no consumer of the gateway accounts for, unless the
//! response says `public`, `s-maxage` or `must-revalidate` (RFC 9111 section 3.5). With
//! `cache_control: true` the upstream's validity (`s-maxage`, `max-age`, `Expires`) is the
//! entry's time to live, and a response already stale by it is not stored.

use weir_plugin::http::{header, HeaderMap, HeaderName};

/// Most header names a stored response's `Vary` may list.
pub const MAX_VARY: usize = 16;

/// The directives of `Cache-Control` that matter here.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Directives {
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    pub min_fresh: Option<u64>,
    pub no_store: bool,
    pub no_cache: bool,
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub only_if_cached: bool,
}

/// Parses every `Cache-Control` field of `headers` (comma lists, quoted values with commas,
/// any case). A delta-seconds that is not a number counts as 0 (already stale); one too large
/// is saturated.
pub fn directives(headers: &HeaderMap) -> Directives {
    let mut d = Directives::default();
    for value in headers.get_all(header::CACHE_CONTROL) {
        let Ok(text) = value.to_str() else {
            // Not text: the conservative reading.
            d.no_store = true;
            continue;
        };
        for item in split_items(text) {
            let (name, arg) = match item.split_once('=') {
                Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
                None => (item.trim(), None),
            };
            let secs = || Some(arg.map_or(0, delta_seconds));
            match name.to_ascii_lowercase().as_str() {
                "max-age" => d.max_age = secs(),
                "s-maxage" => d.s_maxage = secs(),
                "min-fresh" => d.min_fresh = secs(),
                "no-store" => d.no_store = true,
                "no-cache" => d.no_cache = true,
                "private" => d.private = true,
                "public" => d.public = true,
                "must-revalidate" | "proxy-revalidate" => d.must_revalidate = true,
                "only-if-cached" => d.only_if_cached = true,
                _ => {}
            }
        }
    }
    d
}

/// Splits a directive list on commas outside double quotes.
fn split_items(text: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&text[start..]);
    items.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

/// RFC 9111 delta-seconds: digits only; too large saturates, anything else is 0.
fn delta_seconds(arg: &str) -> u64 {
    if arg.is_empty() || !arg.bytes().all(|b| b.is_ascii_digit()) {
        return 0;
    }
    arg.parse().unwrap_or(u64::MAX)
}

/// The upstream's own validity in milliseconds from `now_ms`: `s-maxage`, else `max-age`, else
/// `Expires` (an invalid date is in the past); `None` when it gives none. Negative is stale.
pub fn upstream_ttl_ms(d: &Directives, headers: &HeaderMap, now_ms: u64) -> Option<i128> {
    if let Some(secs) = d.s_maxage.or(d.max_age) {
        return Some(i128::from(secs) * 1000);
    }
    let expires = headers.get(header::EXPIRES)?;
    let at_ms = expires.to_str().ok().and_then(http_date_ms).unwrap_or(0);
    Some(i128::from(at_ms) - i128::from(now_ms))
}

/// An HTTP date (IMF-fixdate, RFC 850 or asctime) as Unix milliseconds.
pub fn http_date_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    let secs = chrono::DateTime::parse_from_rfc2822(text).map(|t| t.timestamp()).ok().or_else(|| {
        ["%A, %d-%b-%y %H:%M:%S GMT", "%a %b %e %H:%M:%S %Y"]
            .iter()
            .find_map(|f| chrono::NaiveDateTime::parse_from_str(text, f).ok())
            .map(|t| t.and_utc().timestamp())
    })?;
    u64::try_from(secs).ok().map(|s| s.saturating_mul(1000))
}

/// Why a response is not stored (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStored {
    Status,
    /// 204 and 304 have no body to store (and a 304 answers one client's condition).
    NoBody,
    NoCacheVars,
    Directive,
    SetCookie,
    VaryStar,
    Authorization,
    AlreadyStale,
    TooLarge,
}

/// What the header filter knows about a response and its request.
pub struct Response<'a> {
    pub status: u16,
    pub headers: &'a HeaderMap,
    /// The request carried `Authorization` and no consumer isolates the key.
    pub unaccounted_authorization: bool,
    /// A `no_cache` variable had a value other than empty and `0`.
    pub no_cache: bool,
}

/// The rules of a configuration that decide storing.
pub struct Rules<'a> {
    pub statuses: &'a [u16],
    /// `cache_control`: the upstream's validity is the time to live.
    pub honour_validity: bool,
    /// The time to live otherwise.
    pub ttl_ms: u64,
    /// Largest body stored.
    pub max_body: u64,
}

/// Whether `r` is stored, and for how long (milliseconds), and the header names its `Vary`
/// lists.
pub fn storable(rules: &Rules<'_>, r: &Response<'_>, now_ms: u64) -> Result<(u64, Vec<HeaderName>), NotStored> {
    if !rules.statuses.contains(&r.status) {
        return Err(NotStored::Status);
    }
    if matches!(r.status, 204 | 304) {
        return Err(NotStored::NoBody);
    }
    if r.no_cache {
        return Err(NotStored::NoCacheVars);
    }
    let d = directives(r.headers);
    if d.private || d.no_store || d.no_cache {
        return Err(NotStored::Directive);
    }
    if r.headers.contains_key(header::SET_COOKIE) {
        return Err(NotStored::SetCookie);
    }
    let vary = vary_names(r.headers).ok_or(NotStored::VaryStar)?;
    if r.unaccounted_authorization && !(d.public || d.s_maxage.is_some() || d.must_revalidate) {
        return Err(NotStored::Authorization);
    }
    let declared = r.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    if declared.is_some_and(|n: u64| n > rules.max_body) {
        return Err(NotStored::TooLarge);
    }
    let ttl = match rules.honour_validity.then(|| upstream_ttl_ms(&d, r.headers, now_ms)).flatten() {
        Some(ms) if ms <= 0 => return Err(NotStored::AlreadyStale),
        Some(ms) => u64::try_from(ms).unwrap_or(u64::MAX),
        None => rules.ttl_ms,
    };
    Ok((ttl, vary))
}

/// The names `Vary` lists (lower case, sorted, unique); `None` for `*` or too many.
fn vary_names(headers: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut names = Vec::new();
    for value in headers.get_all(header::VARY) {
        let text = value.to_str().ok()?;
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if item == "*" {
                return None;
            }
            names.push(HeaderName::from_bytes(item.to_ascii_lowercase().as_bytes()).ok()?);
        }
    }
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup();
    (names.len() <= MAX_VARY).then_some(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn directives_are_read_from_every_field_with_quotes_and_case() {
        let d = directives(&headers(&[
            ("cache-control", "Public, max-age=60"),
            ("cache-control", "private=\"set-cookie, x\", S-MaxAge=\"10\""),
        ]));
        assert!(d.public && d.private && !d.no_store);
        assert_eq!((d.max_age, d.s_maxage), (Some(60), Some(10)));
        let d = directives(&headers(&[("cache-control", "max-age=abc, min-fresh=99999999999999999999999")]));
        assert_eq!((d.max_age, d.min_fresh), (Some(0), Some(u64::MAX)), "invalid is stale, huge saturates");
        assert_eq!(directives(&headers(&[("cache-control", ",,")])), Directives::default());
    }

    #[test]
    fn validity_comes_from_s_maxage_then_max_age_then_expires() {
        let now = 1_700_000_000_000;
        let h = headers(&[("cache-control", "max-age=5, s-maxage=7")]);
        assert_eq!(upstream_ttl_ms(&directives(&h), &h, now), Some(7_000));
        let h = headers(&[("expires", "Tue, 14 Nov 2023 22:13:30 GMT")]);
        assert_eq!(upstream_ttl_ms(&directives(&h), &h, now), Some(10_000));
        let h = headers(&[("expires", "0")]);
        assert!(upstream_ttl_ms(&directives(&h), &h, now).is_some_and(|t| t < 0), "invalid dates are past");
        assert_eq!(upstream_ttl_ms(&Directives::default(), &HeaderMap::new(), now), None);
        assert_eq!(http_date_ms("Sunday, 06-Nov-94 08:49:37 GMT"), Some(784_111_777_000));
        assert_eq!(http_date_ms("Sun Nov  6 08:49:37 1994"), Some(784_111_777_000));
    }

    #[test]
    fn the_shared_cache_rules_hold_whatever_the_configuration() {
        let rules = Rules { statuses: &[200, 404], honour_validity: false, ttl_ms: 300_000, max_body: 100 };
        let check = |pairs: &[(&'static str, &'static str)], auth: bool| {
            let h = headers(pairs);
            storable(
                &rules,
                &Response { status: 200, headers: &h, unaccounted_authorization: auth, no_cache: false },
                0,
            )
            .map(|(ttl, vary)| (ttl, vary.len()))
        };
        assert_eq!(check(&[], false), Ok((300_000, 0)));
        assert_eq!(check(&[("cache-control", "private")], false), Err(NotStored::Directive));
        assert_eq!(check(&[("cache-control", "no-store")], false), Err(NotStored::Directive));
        assert_eq!(check(&[("cache-control", "no-cache")], false), Err(NotStored::Directive));
        assert_eq!(check(&[("set-cookie", "a=1")], false), Err(NotStored::SetCookie));
        assert_eq!(check(&[("vary", "Accept, *")], false), Err(NotStored::VaryStar));
        assert_eq!(check(&[("vary", "Accept-Encoding, accept-encoding, X")], false), Ok((300_000, 2)));
        assert_eq!(check(&[], true), Err(NotStored::Authorization));
        assert_eq!(check(&[("cache-control", "public")], true), Ok((300_000, 0)));
        assert_eq!(check(&[("content-length", "101")], false), Err(NotStored::TooLarge));
        assert_eq!(check(&[("cache-control", "max-age=1")], false), Ok((300_000, 0)), "validity ignored");
        let h = HeaderMap::new();
        let r = Response { status: 500, headers: &h, unaccounted_authorization: false, no_cache: false };
        assert_eq!(storable(&rules, &r, 0).err(), Some(NotStored::Status));
        let listed = Rules { statuses: &[304], ..rules };
        let r = Response { status: 304, headers: &h, unaccounted_authorization: false, no_cache: false };
        assert_eq!(storable(&listed, &r, 0).err(), Some(NotStored::NoBody), "even when listed");
        let r = Response { status: 200, headers: &h, unaccounted_authorization: false, no_cache: true };
        assert_eq!(storable(&rules, &r, 0).err(), Some(NotStored::NoCacheVars));
    }

    #[test]
    fn cache_control_true_takes_the_upstream_validity() {
        let rules = Rules { statuses: &[200], honour_validity: true, ttl_ms: 300_000, max_body: 100 };
        let check = |pairs: &[(&'static str, &'static str)]| {
            let h = headers(pairs);
            storable(
                &rules,
                &Response { status: 200, headers: &h, unaccounted_authorization: false, no_cache: false },
                0,
            )
            .map(|(ttl, _)| ttl)
        };
        assert_eq!(check(&[("cache-control", "max-age=2")]), Ok(2_000));
        assert_eq!(check(&[("cache-control", "max-age=0")]), Err(NotStored::AlreadyStale));
        assert_eq!(check(&[]), Ok(300_000), "no validity given: the configured ttl");
    }
}
