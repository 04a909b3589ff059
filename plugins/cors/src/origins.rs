//! Which origin a response allows: APISIX's origin lists (`*`, `**`, `a,b`), regexes and
//! metadata references, compiled at build and decided per response without allocating.

use regex::RegexSet;
use weir_plugin::http::HeaderValue;

/// An origin list as APISIX writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origins {
    /// `*`: any origin, answered `*`.
    Any,
    /// `**`: any origin, answered with the request's own (credentials allowed).
    Echo,
    /// `a,b,...`: these origins exactly (one origin, or `null`, is a list of one).
    List(Vec<Box<str>>),
}

/// What a response allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed<'r> {
    /// Answer `*`.
    Star,
    /// Answer the request's origin.
    Origin(&'r HeaderValue),
}

impl Origins {
    /// Parses a validated list.
    pub fn parse(text: &str) -> Origins {
        match text {
            "*" => Origins::Any,
            "**" => Origins::Echo,
            list => Origins::List(list.split(',').map(Box::from).collect()),
        }
    }

    /// The answer to a request from `origin` (`None`: no `Origin` header).
    pub fn allow<'r>(&self, origin: Option<&'r HeaderValue>) -> Option<Allowed<'r>> {
        match (self, origin) {
            (Origins::Any, _) | (Origins::Echo, None) => Some(Allowed::Star),
            (Origins::Echo, Some(o)) => Some(Allowed::Origin(o)),
            (Origins::List(list), Some(o)) => {
                list.iter().any(|l| l.as_bytes() == o.as_bytes()).then_some(Allowed::Origin(o))
            }
            (Origins::List(_), None) => None,
        }
    }

    /// Whether the answer never depends on the request's origin.
    pub fn is_any(&self) -> bool {
        *self == Origins::Any
    }
}

/// Origins allowed by one kind of header (`Access-Control-Allow-Origin`, `Timing-Allow-Origin`):
/// a list, or regexes (which then replace the list, as in APISIX), and for the former the
/// plugin metadata's lists named by `allow_origins_by_metadata`.
#[derive(Debug)]
pub struct OriginRule {
    /// The configured list (`allow_origins`).
    pub list: Option<Origins>,
    /// `*_by_regex`: searched in the request's origin (unanchored, as APISIX).
    pub regex: Option<RegexSet>,
    /// The metadata lists named by `allow_origins_by_metadata`; `None` without that field.
    pub metadata: Option<Vec<Origins>>,
}

fn regex_allows<'r>(set: &RegexSet, origin: Option<&'r HeaderValue>) -> Option<Allowed<'r>> {
    let o = origin?;
    set.is_match(o.to_str().ok()?).then_some(Allowed::Origin(o))
}

impl OriginRule {
    /// The answer to a request from `origin`, following APISIX's order: metadata lists first
    /// (they answer with the request's origin); then the regexes, or else the list, except
    /// that a list left at `*` does not open a route that names metadata lists.
    pub fn allow<'r>(&self, origin: Option<&'r HeaderValue>) -> Option<Allowed<'r>> {
        if let Some(lists) = &self.metadata {
            if let Some(o) = origin {
                if lists.iter().any(|l| l.allow(Some(o)).is_some()) {
                    return Some(Allowed::Origin(o));
                }
            }
            if self.list.as_ref().is_none_or(Origins::is_any) && self.regex.is_none() {
                return None;
            }
        }
        match (&self.regex, &self.list) {
            (Some(set), _) => regex_allows(set, origin),
            (None, Some(list)) => list.allow(origin),
            (None, None) => None,
        }
    }

    /// Whether the answer may differ from one origin to another (`Vary: Origin`).
    pub fn depends_on_origin(&self) -> bool {
        self.regex.is_some() || self.metadata.is_some() || self.list.as_ref().is_some_and(|l| !l.is_any())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn lists_as_apisix() {
        let (a, b) = (hv("http://a.com"), hv("http://b.com"));
        assert_eq!(Origins::parse("*").allow(None), Some(Allowed::Star));
        assert_eq!(Origins::parse("*").allow(Some(&a)), Some(Allowed::Star));
        assert_eq!(Origins::parse("**").allow(Some(&a)), Some(Allowed::Origin(&a)));
        assert_eq!(Origins::parse("**").allow(None), Some(Allowed::Star));
        let list = Origins::parse("http://a.com,http://c.com");
        assert_eq!(list.allow(Some(&a)), Some(Allowed::Origin(&a)));
        assert_eq!(list.allow(Some(&b)), None);
        assert_eq!(list.allow(None), None);
        assert_eq!(Origins::parse("http://a.com").allow(Some(&a)), Some(Allowed::Origin(&a)));
        assert_eq!(Origins::parse("http://a.com").allow(Some(&hv("http://a.com.evil.org"))), None);
        let null = hv("null");
        assert_eq!(Origins::parse("null").allow(Some(&null)), Some(Allowed::Origin(&null)));
    }
}
