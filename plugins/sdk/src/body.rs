//! Streaming response-body transforms: a plugin turns the body into another (compression, a
//! rewrite) chunk by chunk as it goes to the client, never holding the whole body.
//!
//! The host's side is the body filter: a plugin whose `header_filter` returns
//! [`crate::BodyFilter::Filter`] sees every chunk in `body_filter`, may replace it, and is called
//! once more with an empty chunk and `eof` when the body ends (also for a chunked body that ends
//! in trailers). The same hook is the *response tap*: a plugin that only reads the chunks (a
//! cache filling an entry) leaves them as they are. The response keeps its `Content-Length`
//! only when no plugin filters it.
//!
//! This module adds the state a transform keeps between chunks: [`begin`] puts a [`Transform`]
//! in the request's slots (in `header_filter`), [`step`] runs it on each chunk (in
//! `body_filter`) and finishes it at the end. It also holds what content-coding plugins share:
//! [`accepts`] (the client's `Accept-Encoding`), [`TypeList`] (the `types` field) and
//! [`compressible`] (every reason not to encode a response).
//!
//! ```
//! use weir_plugin::body::{self, Transform};
//! use weir_plugin::{Bytes, RequestCtx};
//! # use weir_plugin::http::{HeaderMap, Method};
//!
//! struct Upper;
//! impl Transform for Upper {
//!     fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
//!         out.extend(input.iter().map(u8::to_ascii_uppercase));
//!         Ok(())
//!     }
//!     fn finish(&mut self, out: &mut Vec<u8>) -> std::io::Result<()> {
//!         out.extend_from_slice(b"!");
//!         Ok(())
//!     }
//! }
//! # let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
//! # let mut ctx = RequestCtx::new(Method::GET, "/".into(), String::new(), HeaderMap::new(), addr, "127.0.0.1".into(), addr);
//! body::begin(&mut ctx, Upper);
//! let mut chunk = Bytes::from_static(b"abc");
//! body::step::<Upper>(&mut ctx, &mut chunk, false);
//! assert_eq!(&chunk[..], b"ABC");
//! let mut last = Bytes::new();
//! body::step::<Upper>(&mut ctx, &mut last, true);
//! assert_eq!(&last[..], b"!");
//! ```

use bytes::Bytes;
use http::header::{
    ACCEPT_ENCODING, ACCEPT_RANGES, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, ETAG, VARY,
};
use http::{HeaderValue, Method};

use crate::{BodyFilter, RequestCtx, ResponseHead};

/// A body transform: fed the body in order, it appends what it has ready to `out`.
pub trait Transform: 'static {
    /// Consumes `input`; appends the output that is ready (possibly nothing).
    fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> std::io::Result<()>;
    /// The body ended: appends the rest.
    fn finish(&mut self, out: &mut Vec<u8>) -> std::io::Result<()>;
}

/// The running transform of one response, in the request's slots (keyed by `T`).
struct Running<T>(T);

/// Starts transforming this response's body with `t` (from `header_filter`, which then returns
/// [`crate::BodyFilter::Filter`]).
pub fn begin<T: Transform>(ctx: &mut RequestCtx, t: T) {
    ctx.slots.insert(Running(t));
}

/// Runs the transform begun with [`begin`] on `chunk` (from `body_filter`): the chunk becomes
/// its output, and at `eof` the transform is finished and dropped. A transform that fails
/// (it cannot, for the encoders in use, short of memory) ends the body where it is, logged.
pub fn step<T: Transform>(ctx: &mut RequestCtx, chunk: &mut Bytes, eof: bool) {
    let Some(Running(t)) = ctx.slots.get_mut::<Running<T>>() else { return };
    let mut out = Vec::with_capacity(if eof { chunk.len() + 64 } else { chunk.len() / 2 + 64 });
    let mut result = t.feed(chunk, &mut out);
    if eof && result.is_ok() {
        result = t.finish(&mut out);
    }
    if eof || result.is_err() {
        ctx.slots.remove::<Running<T>>();
    }
    if let Err(e) = result {
        log::error!("body transform failed: {e}; the body ends here");
        *chunk = Bytes::new();
        return;
    }
    *chunk = Bytes::from(out);
}

/// Whether the client accepts `coding` (`gzip`, `br`) by its `Accept-Encoding`: listed (or `*`)
/// with a quality above zero.
pub fn accepts(ctx: &RequestCtx, coding: &str) -> bool {
    let mut star = None;
    for value in ctx.headers.get_all(ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()) {
        for item in value.split(',') {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q=").or_else(|| p.trim().strip_prefix("Q=")))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            if name.eq_ignore_ascii_case(coding) {
                return q > 0.0;
            }
            if name == "*" {
                star = Some(q > 0.0);
            }
        }
    }
    star.unwrap_or(false)
}

/// The `types` field of a compression plugin: media types (`text/html`), or `*` for all.
#[derive(Debug, Clone)]
pub enum TypeList {
    /// Every type.
    All,
    /// These (lowercase, without parameters).
    Only(Vec<String>),
}

impl TypeList {
    /// From the configuration: `"*"`, or a list (which may hold `"*"`).
    pub fn new(types: &[String]) -> Self {
        if types.iter().any(|t| t == "*") {
            return TypeList::All;
        }
        TypeList::Only(types.iter().map(|t| t.trim().to_ascii_lowercase()).collect())
    }
    /// Whether a `Content-Type` value is listed (`text/html; charset=utf-8` is `text/html`).
    pub fn contains(&self, content_type: Option<&str>) -> bool {
        match self {
            TypeList::All => true,
            TypeList::Only(list) => {
                let Some(ct) = content_type else { return false };
                let base = ct.split(';').next().unwrap_or("").trim();
                list.iter().any(|t| t.eq_ignore_ascii_case(base))
            }
        }
    }
}

/// The `types` field as configured: a list of media types, or `"*"`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Types {
    /// `"*"`: every type.
    Star(#[schemars(regex(pattern = r"^\*$"))] String),
    /// These media types.
    List(#[schemars(length(min = 1))] Vec<String>),
}

impl Types {
    /// APISIX's default: `text/html` only.
    pub fn html() -> Types {
        Types::List(vec!["text/html".into()])
    }
}

/// What a content-coding plugin decides per response, built once from the fields every such
/// plugin has (`types`, `min_length`, `http_version`, `vary`): [`Encoding::start`] is its whole
/// header filter but for making the encoder.
#[derive(Debug, Clone)]
pub struct Encoding {
    coding: &'static str,
    types: TypeList,
    min_length: u64,
    http10: bool,
    vary: bool,
}

impl Encoding {
    /// `coding` (`gzip`, `br`) with the plugin's fields; `http_version` must be 1.0 or 1.1.
    pub fn new(
        coding: &'static str,
        types: &Types,
        min_length: u64,
        http_version: f64,
        vary: bool,
    ) -> Result<Self, String> {
        if http_version != 1.0 && http_version != 1.1 {
            return Err(format!("http_version: {http_version} is not 1.0 or 1.1"));
        }
        let types = match types {
            Types::Star(_) => TypeList::All,
            Types::List(list) => TypeList::new(list),
        };
        Ok(Encoding { coding, types, min_length, http10: http_version == 1.0, vary })
    }

    /// Starts encoding this response with the transform `make` builds, when it should be encoded
    /// at all ([`compressible`], and HTTP/1.0 only with `http_version: 1.0`): the header filter of
    /// a content-coding plugin.
    pub fn start<T: Transform>(
        &self,
        ctx: &mut RequestCtx,
        resp: &mut ResponseHead,
        make: impl FnOnce() -> T,
    ) -> BodyFilter {
        if ctx.version == http::Version::HTTP_10 && !self.http10 {
            return BodyFilter::Skip;
        }
        if !compressible(ctx, resp, self.coding, &self.types, self.min_length) {
            return BodyFilter::Skip;
        }
        mark_encoded(resp, self.coding, self.vary);
        begin(ctx, make());
        BodyFilter::Filter
    }
}

/// Whether this response should be encoded with `coding` (nginx's gzip rules): the client accepts
/// it, the request is not HEAD, the status has a body, the body is not a range of another
/// (`206`, `Content-Range`: its offsets count the unencoded bytes, and nginx leaves ranges alone
/// too), nobody encoded it already, its type is listed, and its length (when known) is at least
/// `min_length`.
pub fn compressible(ctx: &RequestCtx, resp: &ResponseHead, coding: &str, types: &TypeList, min_length: u64) -> bool {
    let status = resp.status.as_u16();
    if ctx.method == Method::HEAD || status < 200 || status == 204 || status == 206 || status == 304 {
        return false;
    }
    if resp.headers.contains_key(CONTENT_RANGE) {
        return false;
    }
    if resp.headers.contains_key(CONTENT_ENCODING) || !accepts(ctx, coding) {
        return false;
    }
    let ct = resp.headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
    if !types.contains(ct) {
        return false;
    }
    let len = resp.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    len.is_none_or(|n| n >= min_length)
}

/// Marks `resp` as encoded with `coding`: `Content-Encoding` set, `Content-Length` removed (the
/// host frames the new body), `Accept-Ranges` removed (a range of the encoded body cannot be
/// served: nginx clears it too), a strong `ETag` made weak (the bytes changed, as nginx does),
/// and `Vary: Accept-Encoding` added when `vary`.
pub fn mark_encoded(resp: &mut ResponseHead, coding: &'static str, vary: bool) {
    resp.headers.insert(CONTENT_ENCODING, HeaderValue::from_static(coding));
    resp.headers.remove(CONTENT_LENGTH);
    resp.headers.remove(ACCEPT_RANGES);
    if let Some(tag) = resp.headers.get(ETAG).and_then(|v| v.to_str().ok()) {
        if !tag.starts_with("W/") {
            if let Ok(weak) = HeaderValue::from_str(&format!("W/{tag}")) {
                resp.headers.insert(ETAG, weak);
            }
        }
    }
    if vary {
        let listed = resp
            .headers
            .get_all(VARY)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("accept-encoding") || t.trim() == "*");
        if !listed {
            resp.headers.append(VARY, HeaderValue::from_static("Accept-Encoding"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    struct TestRequest(RequestCtx);
    impl TestRequest {
        fn get(_: &str) -> Self {
            TestRequest(crate::phase::tests_support::ctx())
        }
        fn header(mut self, k: &'static str, v: &str) -> Self {
            self.0.headers.append(k, HeaderValue::from_str(v).unwrap_or_else(|e| panic!("{e}")));
            self
        }
        fn build(self) -> RequestCtx {
            self.0
        }
    }

    fn head(pairs: &[(&'static str, &'static str)]) -> ResponseHead {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        ResponseHead { status: StatusCode::OK, headers: h }
    }

    #[test]
    fn accept_encoding_with_qualities() {
        let ctx = |v: &str| TestRequest::get("/").header("accept-encoding", v).build();
        assert!(accepts(&ctx("gzip, deflate, br"), "br"));
        assert!(accepts(&ctx("GZIP"), "gzip"));
        assert!(!accepts(&ctx("gzip;q=0, br"), "gzip"));
        assert!(accepts(&ctx("*"), "gzip"));
        assert!(!accepts(&ctx("*, gzip;q=0"), "gzip"));
        assert!(!accepts(&ctx("identity"), "gzip"));
        assert!(!accepts(&TestRequest::get("/").build(), "gzip"));
    }

    #[test]
    fn what_is_not_compressed() {
        let types = TypeList::new(&["text/html".into(), "application/json".into()]);
        let gz = TestRequest::get("/").header("accept-encoding", "gzip").build();
        let html = [("content-type", "text/html; charset=utf-8")];
        assert!(compressible(&gz, &head(&html), "gzip", &types, 20));
        assert!(!compressible(&gz, &head(&[("content-type", "image/png")]), "gzip", &types, 20));
        let encoded = [("content-type", "text/html"), ("content-encoding", "br")];
        assert!(!compressible(&gz, &head(&encoded), "gzip", &types, 20), "already encoded");
        let small = [("content-type", "text/html"), ("content-length", "19")];
        assert!(!compressible(&gz, &head(&small), "gzip", &types, 20));
        let plain = TestRequest::get("/").build();
        assert!(!compressible(&plain, &head(&html), "gzip", &types, 20), "not asked for");
        let mut no_content = head(&html);
        no_content.status = StatusCode::NO_CONTENT;
        assert!(!compressible(&gz, &no_content, "gzip", &types, 20));
        let mut partial = head(&[("content-type", "text/html"), ("content-range", "bytes 0-99/1000")]);
        assert!(!compressible(&gz, &partial, "gzip", &types, 20), "a range, by its Content-Range");
        partial.status = StatusCode::PARTIAL_CONTENT;
        assert!(!compressible(&gz, &partial, "gzip", &types, 20), "a 206");
        assert!(compressible(&gz, &head(&[]), "gzip", &TypeList::new(&["*".into()]), 20));
    }

    #[test]
    fn marking_weakens_etags_and_adds_vary_once() {
        let mut h =
            head(&[("content-length", "100"), ("etag", "\"abc\""), ("vary", "Origin"), ("accept-ranges", "bytes")]);
        mark_encoded(&mut h, "gzip", true);
        assert_eq!(h.headers["content-encoding"], "gzip");
        assert!(!h.headers.contains_key("content-length"));
        assert!(!h.headers.contains_key("accept-ranges"), "a range of the encoded body cannot be served");
        assert_eq!(h.headers["etag"], "W/\"abc\"");
        let vary: Vec<_> = h.headers.get_all("vary").iter().collect();
        assert_eq!(vary, ["Origin", "Accept-Encoding"]);
        mark_encoded(&mut h, "gzip", true);
        assert_eq!(h.headers.get_all("vary").iter().count(), 2);
    }
}
