//! `gzip`: compresses response bodies for clients that accept it, as APISIX's `gzip` plugin
//! (nginx's `gzip` directives) does, streaming: each chunk is compressed as it goes to the
//! client (`weir_plugin::body`), so a body is never held whole.
//!
//! Skipped, as nginx skips: clients that do not accept gzip, HEAD requests, 1xx/204/304
//! answers, bodies already encoded (`Content-Encoding`), types not in `types`, and bodies whose
//! `Content-Length` is below `min_length`. The response loses its `Content-Length` (the body is
//! sent chunked or, on HTTP/2, in frames), a strong `ETag` becomes weak, and `vary` adds
//! `Vary: Accept-Encoding`.

use std::io::Write;
use std::sync::Arc;

use flate2::write::GzEncoder;
use flate2::Compression;
use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::body::{self, Encoding, Transform, Types};
use weir_plugin::{
    register_plugin, BodyFilter, BuildContext, Bytes, Late, Plugin, PluginInstance, RequestCtx, ResponseHead,
};

/// Route configuration (APISIX 3.x fields).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Media types to compress, or `"*"` for all.
    #[serde(default = "Types::html")]
    pub types: Types,
    /// Smallest `Content-Length` compressed (bodies of unknown length always are).
    #[serde(default = "twenty")]
    #[schemars(range(min = 1))]
    pub min_length: u64,
    /// Compression level, 1 (fastest) to 9 (smallest).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 9))]
    pub comp_level: u32,
    /// Lowest HTTP version compressed (nginx's `gzip_http_version`): 1.0 or 1.1.
    #[serde(default = "http11")]
    pub http_version: f64,
    /// nginx's `gzip_buffers`; accepted for APISIX compatibility (the encoder sizes its own).
    #[serde(default)]
    pub buffers: Option<Buffers>,
    /// Add `Vary: Accept-Encoding`.
    #[serde(default)]
    pub vary: bool,
}

/// nginx's `gzip_buffers number size`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Buffers {
    /// Number of buffers.
    #[serde(default = "thirty_two")]
    #[schemars(range(min = 1))]
    pub number: u32,
    /// Size of each.
    #[serde(default = "four_k")]
    #[schemars(range(min = 1))]
    pub size: u32,
}

fn twenty() -> u64 {
    20
}
fn one() -> u32 {
    1
}
fn http11() -> f64 {
    1.1
}
fn thirty_two() -> u32 {
    32
}
fn four_k() -> u32 {
    4096
}

/// The plugin.
pub struct Gzip;

struct Instance {
    encoding: Encoding,
    level: Compression,
}

/// One response's encoder.
struct Encoder(GzEncoder<Vec<u8>>);

impl Transform for Encoder {
    fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
        self.0.write_all(input)?;
        out.append(self.0.get_mut());
        Ok(())
    }
    fn finish(&mut self, out: &mut Vec<u8>) -> std::io::Result<()> {
        self.0.try_finish()?;
        out.append(self.0.get_mut());
        Ok(())
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        // Reads Accept-Encoding (a request header) after forwarding.
        Late { headers: true, header_filter: true, log: false }
    }
    fn header_filter(&self, ctx: &mut RequestCtx, resp: &mut ResponseHead) -> BodyFilter {
        self.encoding.start(ctx, resp, || Encoder(GzEncoder::new(Vec::with_capacity(8 << 10), self.level)))
    }
    fn body_filter(&self, ctx: &mut RequestCtx, chunk: &mut Bytes, eof: bool) {
        body::step::<Encoder>(ctx, chunk, eof);
    }
}

impl Plugin for Gzip {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "gzip"
    }
    fn priority(&self) -> i32 {
        995
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let encoding = Encoding::new("gzip", &conf.types, conf.min_length, conf.http_version, conf.vary)?;
        Ok(Arc::new(Instance { encoding, level: Compression::new(conf.comp_level) }))
    }
}

register_plugin!(Gzip);

#[cfg(test)]
mod tests {
    use std::io::Read;

    use serde_json::json;
    use weir_plugin::http::{HeaderMap, HeaderValue, StatusCode};
    use weir_plugin::testing::{instance, respond, TestRequest};
    use weir_plugin::ResponseHead;

    fn head(ct: &'static str) -> ResponseHead {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static(ct));
        ResponseHead { status: StatusCode::OK, headers: h }
    }

    #[test]
    fn compresses_listed_types_for_clients_that_ask() {
        let p = instance(&super::Gzip, json!({"types": ["application/json"], "min_length": 1, "vary": true}))
            .unwrap_or_else(|e| panic!("{e}"));
        let body = br#"{"hello": "world", "again": "world world world world"}"#;
        let mut ctx = TestRequest::get("/").header("accept-encoding", "gzip, br").build();
        let (h, out) = respond(std::slice::from_ref(&p), &mut ctx, head("application/json"), body);
        assert_eq!(h.headers["content-encoding"], "gzip");
        assert_eq!(h.headers["vary"], "Accept-Encoding");
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&out[..]).read_to_end(&mut plain).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plain, body);
        let mut ctx = TestRequest::get("/").build();
        let (h, out) = respond(std::slice::from_ref(&p), &mut ctx, head("application/json"), body);
        assert!(!h.headers.contains_key("content-encoding"));
        assert_eq!(&out[..], body, "untouched for a client that did not ask");
        let mut ctx = TestRequest::get("/").header("accept-encoding", "gzip").build();
        let (h, _) = respond(&[p], &mut ctx, head("image/png"), body);
        assert!(!h.headers.contains_key("content-encoding"));
    }

    #[test]
    fn apisix_examples_load() {
        for conf in [
            json!({}),
            json!({"types": "*", "min_length": 20, "comp_level": 1, "http_version": 1.1, "buffers": {"number": 32, "size": 4096}, "vary": true}),
            json!({"types": ["text/html", "application/json"], "comp_level": 9}),
        ] {
            instance(&super::Gzip, conf.clone()).unwrap_or_else(|e| panic!("{conf}: {e}"));
        }
        assert!(instance(&super::Gzip, json!({"comp_level": 10})).is_err());
        assert!(instance(&super::Gzip, json!({"types": "text/html"})).is_err(), "a string other than *");
    }
}
