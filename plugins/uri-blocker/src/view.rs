//! What the rules are matched against, built without allocating: the request URI as the
//! upstream receives it (the normalized path, then `?` and the query as sent), and, when it has
//! escapes, the same text percent-decoded once, which is what the upstream application reads.
//! A rule blocks when it matches either.

use std::cell::RefCell;

thread_local! {
    /// The two views of the current request, end to end (a worker thread serves one request at
    /// a time between awaits, and matching never awaits).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Calls `matches` on the request URI of `path` and `query`, then on its decoded form when
/// it has a `%`; whether either matched.
pub fn any_view(path: &str, query: &str, matches: impl Fn(&[u8]) -> bool) -> bool {
    let escaped = path.contains('%') || query.contains('%');
    if query.is_empty() && !escaped {
        return matches(path.as_bytes());
    }
    SCRATCH.with(|cell| {
        let Ok(mut buf) = cell.try_borrow_mut() else {
            // Not reachable (nothing here re-enters), but never panic on the request path.
            return matches(&join(path, query)) || (escaped && matches(&decode(&join(path, query))));
        };
        buf.clear();
        buf.extend_from_slice(path.as_bytes());
        if !query.is_empty() {
            buf.push(b'?');
            buf.extend_from_slice(query.as_bytes());
        }
        let raw = buf.len();
        if matches(&buf[..raw]) {
            return true;
        }
        if !escaped {
            return false;
        }
        decode_into(&mut buf, raw);
        let hit = matches(&buf[raw..]);
        if buf.capacity() > 64 << 10 {
            *buf = Vec::new();
        }
        hit
    })
}

fn join(path: &str, query: &str) -> Vec<u8> {
    let mut v = path.as_bytes().to_vec();
    if !query.is_empty() {
        v.push(b'?');
        v.extend_from_slice(query.as_bytes());
    }
    v
}

fn decode(raw: &[u8]) -> Vec<u8> {
    let mut v = raw.to_vec();
    let n = v.len();
    decode_into(&mut v, n);
    v.split_off(n)
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Appends `buf[..len]` percent-decoded once (`%XX` with two hex digits; anything else as is).
fn decode_into(buf: &mut Vec<u8>, len: usize) {
    let mut i = 0;
    while i < len {
        let b = buf[i];
        if b == b'%' && i + 2 < len {
            if let (Some(h), Some(l)) = (hex(buf[i + 1]), hex(buf[i + 2])) {
                buf.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        buf.push(b);
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn views(path: &str, query: &str) -> Vec<String> {
        let seen = RefCell::new(Vec::new());
        any_view(path, query, |v| {
            seen.borrow_mut().push(String::from_utf8_lossy(v).into_owned());
            false
        });
        seen.into_inner()
    }

    #[test]
    fn raw_then_decoded() {
        assert_eq!(views("/a", ""), ["/a"]);
        assert_eq!(views("/a", "x=1"), ["/a?x=1"]);
        assert_eq!(views("/a%20b", "q=%3Cscript%3E"), ["/a%20b?q=%3Cscript%3E", "/a b?q=<script>"]);
        assert_eq!(views("/a", "bad=%zz%4"), ["/a?bad=%zz%4", "/a?bad=%zz%4"], "invalid escapes stay");
        assert_eq!(views("/%252e", ""), ["/%252e", "/%2e"], "decoded once only");
        assert_eq!(decode(b"%41%4"), b"A%4");
    }

    #[test]
    fn a_match_on_either_view_counts() {
        assert!(any_view("/x", "q=%3Cscript", |v| v.windows(7).any(|w| w == b"<script")));
        assert!(!any_view("/x", "q=script", |v| v.windows(7).any(|w| w == b"<script")));
    }
}
