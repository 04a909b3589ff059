//! Request path normalization: the one path that routing, plugins and the upstream all see.
//!
//! A gateway that decides on one spelling of a path and forwards another lets clients walk past
//! its checks (`/pub/../api/x`, `/%61pi/x`, `//api/x`). Weir normalizes the path once, before
//! routing, and forwards exactly the normalized form, so the gateway's decision and the upstream's
//! view never differ. The rules (RFC 3986 section 6, nginx for what the RFC leaves open):
//!
//! - percent-escapes are decoded once; an escaped unreserved character (`A-Z a-z 0-9 - . _ ~`)
//!   becomes that character, every other escape stays encoded with upper-case hex digits (so
//!   `%252e` stays `%252e`: no double decoding);
//! - `%2F` stays encoded and is data inside its segment (`/projects/group%2Fname`), unless
//!   `gateway.escaped_slashes: reject` refuses it;
//! - `.` segments are removed and `..` segments remove the previous one; `..` above the root is
//!   refused, as nginx does;
//! - repeated slashes are merged (`gateway.merge_slashes`, default on, as nginx);
//! - refused with 400: raw or encoded backslashes, NUL and other control characters, malformed
//!   escapes, paths that do not start with `/`, a dot segment carrying `;` parameters (`..;`,
//!   which servlet containers treat as `..`), a `.` or `..` hidden behind `%2F` (`..%2Fadmin`,
//!   which an upstream decoding `%2F` would resolve), and escapes that do not decode to UTF-8
//!   (overlong forms such as `%C0%AF`).
//!
//! The query string is not touched.

use std::borrow::Cow;
use std::fmt;

/// Operator settings that change normalization.
#[derive(Debug, Clone, Copy)]
pub struct PathRules {
    /// Merge repeated slashes.
    pub merge_slashes: bool,
    /// Refuse `%2F` instead of keeping it encoded.
    pub reject_escaped_slashes: bool,
}

impl Default for PathRules {
    fn default() -> Self {
        PathRules { merge_slashes: true, reject_escaped_slashes: false }
    }
}

/// Why a path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// Not an absolute path (`*`, empty, or an authority-less form).
    NotAbsolute,
    /// A control character (raw or encoded), NUL included.
    ControlCharacter,
    /// A backslash, raw or encoded.
    Backslash,
    /// `%` not followed by two hex digits.
    BadEscape,
    /// `%2F` with `escaped_slashes: reject`.
    EscapedSlash,
    /// `..` that would climb above the root.
    AboveRoot,
    /// A `.` or `..` segment with `;` parameters.
    DotSegmentParameters,
    /// `%2F` next to a `.` or `..` piece (`..%2Fadmin`): an upstream that decodes `%2F` would
    /// see a dot segment the gateway never resolved.
    HiddenDotSegment,
    /// Escapes that do not decode to valid UTF-8.
    InvalidUtf8,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathError::NotAbsolute => "the path must start with /",
            PathError::ControlCharacter => "control characters are not allowed in the path",
            PathError::Backslash => "backslashes are not allowed in the path",
            PathError::BadEscape => "a % must be followed by two hex digits",
            PathError::EscapedSlash => "encoded slashes (%2F) are not allowed (gateway.escaped_slashes: reject)",
            PathError::AboveRoot => "the path climbs above the root with ..",
            PathError::DotSegmentParameters => "a . or .. segment must not carry ; parameters",
            PathError::HiddenDotSegment => "an encoded slash (%2F) must not hide a . or .. segment",
            PathError::InvalidUtf8 => "percent-escapes must decode to valid UTF-8",
        })
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn is_control(b: u8) -> bool {
    b < 0x20 || b == 0x7f
}

/// Whether a segment is `.` or `..`, possibly followed by `;` parameters.
fn dot_segment(seg: &str) -> Option<(bool, bool)> {
    let (base, params) = match seg.find(';') {
        Some(i) => (&seg[..i], true),
        None => (seg, false),
    };
    match base {
        "." => Some((false, params)),
        ".." => Some((true, params)),
        _ => None,
    }
}

/// Whether `raw` is already in normal form (the common case: no escapes, no dot segments, no
/// repeated slashes), checked in one pass without allocating.
fn is_normal(raw: &str, rules: PathRules) -> bool {
    let bytes = raw.as_bytes();
    if bytes.first() != Some(&b'/') {
        return false;
    }
    let mut seg_start = 1;
    for i in 1..=bytes.len() {
        let b = bytes.get(i).copied();
        match b {
            Some(b'%' | b'\\') => return false,
            Some(c) if is_control(c) => return false,
            Some(b'/') | None => {
                let seg = &raw[seg_start..i];
                if (seg.is_empty() && b.is_some() && rules.merge_slashes)
                    || seg.starts_with('.') && dot_segment(seg).is_some()
                {
                    return false;
                }
                seg_start = i + 1;
            }
            Some(_) => {}
        }
    }
    true
}

/// Normalizes a request path (without its query). Returns the input itself when it is already
/// normal.
pub fn normalize(raw: &str, rules: PathRules) -> Result<Cow<'_, str>, PathError> {
    if is_normal(raw, rules) {
        return Ok(Cow::Borrowed(raw));
    }
    let bytes = raw.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    // 1. Escapes: decode unreserved characters, keep the rest encoded in upper case.
    let mut canon = String::with_capacity(raw.len());
    let mut needs_utf8_check = false;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'\\' => return Err(PathError::Backslash),
            b'%' => {
                let (Some(hi), Some(lo)) =
                    (bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex))
                else {
                    return Err(PathError::BadEscape);
                };
                let v = hi << 4 | lo;
                if is_control(v) {
                    return Err(PathError::ControlCharacter);
                }
                match v {
                    b'\\' => return Err(PathError::Backslash),
                    b'/' if rules.reject_escaped_slashes => return Err(PathError::EscapedSlash),
                    v if is_unreserved(v) => canon.push(char::from(v)),
                    v => {
                        needs_utf8_check |= v >= 0x80;
                        const HEX: &[u8; 16] = b"0123456789ABCDEF";
                        canon.push('%');
                        canon.push(char::from(HEX[usize::from(v >> 4)]));
                        canon.push(char::from(HEX[usize::from(v & 15)]));
                    }
                }
                i += 3;
                continue;
            }
            c if is_control(c) => return Err(PathError::ControlCharacter),
            _ => {}
        }
        // Copy a run of ordinary bytes (keeps multi-byte UTF-8 intact).
        let start = i;
        while i < bytes.len() && !matches!(bytes[i], b'%' | b'\\') && !is_control(bytes[i]) {
            i += 1;
        }
        canon.push_str(&raw[start..i]);
    }
    if needs_utf8_check && std::str::from_utf8(&decode_all(&canon)).is_err() {
        return Err(PathError::InvalidUtf8);
    }
    // 2. Segments: dot segments and repeated slashes.
    let segments: Vec<&str> = canon[1..].split('/').collect();
    let last = segments.len() - 1;
    let mut stack: Vec<&str> = Vec::with_capacity(segments.len());
    let mut trailing_slash = false;
    for (n, seg) in segments.iter().enumerate() {
        let is_last = n == last;
        if seg.is_empty() {
            if is_last {
                trailing_slash = true;
            } else if !rules.merge_slashes {
                stack.push(seg);
            }
            continue;
        }
        match dot_segment(seg) {
            Some((_, true)) => return Err(PathError::DotSegmentParameters),
            Some((false, false)) => trailing_slash = is_last,
            Some((true, false)) => {
                if stack.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
                trailing_slash = is_last;
            }
            None if seg.contains("%2F") && seg.split("%2F").any(|piece| dot_segment(piece).is_some()) => {
                return Err(PathError::HiddenDotSegment);
            }
            None => stack.push(seg),
        }
    }
    let mut out = String::with_capacity(canon.len());
    out.push('/');
    out.push_str(&stack.join("/"));
    if trailing_slash && !stack.is_empty() {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

/// Every escape decoded (for the UTF-8 check only).
fn decode_all(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if let (Some(hi), Some(lo)) = (b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
                out.push(hi << 4 | lo);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// The host a request names, without its port (`[::1]:80` gives `::1`): what routes' `hosts`
/// are matched against (the data plane and `POST /v1/explain` both use this).
pub fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split(']').next().map(|h| h.trim_start_matches('[')).unwrap_or(host);
    }
    host.split(':').next().unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(p: &str) -> Result<String, PathError> {
        normalize(p, PathRules::default()).map(Cow::into_owned)
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for p in ["/", "/a", "/a/b/", "/a;x=1/b", "/a.b/c..d/.e", "/~user/x-y_z", "/é"] {
            assert!(matches!(normalize(p, PathRules::default()), Ok(Cow::Borrowed(_))), "{p}");
        }
    }

    #[test]
    fn rfc3986_and_nginx_rules() {
        let table: &[(&str, &str)] = &[
            ("/pub/../api/x", "/api/x"),
            ("/%61pi/x", "/api/x"),
            ("/a/%2e%2e/x", "/x"),
            ("/a/.%2E/x", "/x"),
            ("/a/./b/.", "/a/b/"),
            ("/a/b/..", "/a/"),
            ("/a/..", "/"),
            ("//api//x", "/api/x"),
            ("/a/%2f/b", "/a/%2F/b"),
            ("/projects/group%2Fname", "/projects/group%2Fname"),
            ("/a%252e%252e/b", "/a%252e%252e/b"),
            ("/x%3bjsessionid", "/x%3Bjsessionid"),
            ("/%7Euser", "/~user"),
            ("/a%20b", "/a%20b"),
            ("/caf%C3%A9", "/caf%C3%A9"),
            ("/.x/..y", "/.x/..y"),
            ("/a;p=1/../b", "/b"),
        ];
        for (input, want) in table {
            assert_eq!(n(input).as_deref(), Ok(*want), "{input}");
        }
    }

    #[test]
    fn ambiguous_paths_are_refused() {
        let table: &[(&str, PathError)] = &[
            ("/..", PathError::AboveRoot),
            ("/a/../../b", PathError::AboveRoot),
            ("/%2e%2e/etc", PathError::AboveRoot),
            ("/a\\b", PathError::Backslash),
            ("/a/..%5c/b", PathError::Backslash),
            ("/a%00", PathError::ControlCharacter),
            ("/a%0d%0aX: y", PathError::ControlCharacter),
            ("/a\u{7f}", PathError::ControlCharacter),
            ("/a%", PathError::BadEscape),
            ("/a%2", PathError::BadEscape),
            ("/a%zz", PathError::BadEscape),
            ("/pub/..;/api/x", PathError::DotSegmentParameters),
            ("/pub/%2e%2e;x/api", PathError::DotSegmentParameters),
            ("/pub/..%2Fapi/x", PathError::HiddenDotSegment),
            ("/pub/%2e%2e%2fapi/x", PathError::HiddenDotSegment),
            ("/pub/x%2F..", PathError::HiddenDotSegment),
            ("/a/..%c0%af/b", PathError::InvalidUtf8),
            ("*", PathError::NotAbsolute),
            ("", PathError::NotAbsolute),
        ];
        for (input, want) in table {
            assert_eq!(n(input), Err(*want), "{input}");
        }
    }

    #[test]
    fn operator_settings() {
        let keep_slashes = PathRules { merge_slashes: false, ..PathRules::default() };
        assert_eq!(normalize("/a//b", keep_slashes).as_deref(), Ok("/a//b"));
        assert_eq!(normalize("/a//../b", keep_slashes).as_deref(), Ok("/a/b"));
        let reject = PathRules { reject_escaped_slashes: true, ..PathRules::default() };
        assert_eq!(normalize("/a%2fb", reject), Err(PathError::EscapedSlash));
        assert_eq!(normalize("/a/b", reject).as_deref(), Ok("/a/b"));
    }

    #[test]
    fn normalizing_twice_changes_nothing() {
        for p in ["/pub/../api/x", "/%61pi//x/", "/a%2fb/./c", "/a%252e/b", "/x/%7e/y"] {
            let once = n(p).unwrap_or_default();
            assert_eq!(n(&once).as_deref(), Ok(once.as_str()), "{p}");
        }
    }
}
