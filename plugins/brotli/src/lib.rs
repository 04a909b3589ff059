//! `brotli`: compresses response bodies with Brotli for clients that accept `br`, as APISIX's
//! `brotli` plugin does, streaming: each chunk is compressed as it goes to the client
//! (`weir_plugin::body`), so a body is never held whole. With `gzip` on the same route, Brotli
//! wins for clients that accept both (its priority is higher, and gzip skips an encoded body).
//!
//! Skipped, as nginx skips: clients that do not accept br, HEAD requests, 1xx/204/304
//! answers, bodies already encoded (`Content-Encoding`), types not in `types`, and bodies whose
//! `Content-Length` is below `min_length`. The response loses its `Content-Length` (the body is
//! sent chunked or, on HTTP/2, in frames), a strong `ETag` becomes weak, and `vary` adds
//! `Vary: Accept-Encoding`.

use std::io::Write;
use std::sync::Arc;

use brotli::enc::backward_references::BrotliEncoderMode;
use brotli::enc::BrotliEncoderParams;
use brotli::CompressorWriter;
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
    /// Compression level (quality), 0 (fastest) to 11 (smallest).
    #[serde(default = "six")]
    #[schemars(range(min = 0, max = 11))]
    pub comp_level: u32,
    /// Encoder mode: 0 generic, 1 text, 2 font.
    #[serde(default)]
    #[schemars(range(min = 0, max = 2))]
    pub mode: u32,
    /// Window size, log2: 10 to 24 (0: the encoder's choice).
    #[serde(default = "nineteen")]
    #[schemars(range(min = 0, max = 24))]
    pub lgwin: u32,
    /// Input block size, log2: 16 to 24 (0: the encoder's choice).
    #[serde(default)]
    #[schemars(range(min = 0, max = 24))]
    pub lgblock: u32,
    /// Lowest HTTP version compressed (nginx's `gzip_http_version`): 1.0 or 1.1.
    #[serde(default = "http11")]
    pub http_version: f64,
    /// Add `Vary: Accept-Encoding`.
    #[serde(default)]
    pub vary: bool,
}

fn twenty() -> u64 {
    20
}
fn six() -> u32 {
    6
}
fn nineteen() -> u32 {
    19
}
fn http11() -> f64 {
    1.1
}

/// The plugin.
pub struct Brotli;

struct Instance {
    encoding: Encoding,
    params: BrotliEncoderParams,
}

/// One response's encoder (taken when the body ends: finishing consumes it).
struct Encoder(Option<CompressorWriter<Vec<u8>>>);

/// The encoder's input buffer.
const BUFFER: usize = 16 << 10;

impl Transform for Encoder {
    fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
        let Some(w) = self.0.as_mut() else { return Ok(()) };
        w.write_all(input)?;
        out.append(w.get_mut());
        Ok(())
    }
    fn finish(&mut self, out: &mut Vec<u8>) -> std::io::Result<()> {
        if let Some(w) = self.0.take() {
            out.append(&mut w.into_inner());
        }
        Ok(())
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        // Reads Accept-Encoding (a request header) after forwarding.
        Late { headers: true, header_filter: true, log: false }
    }
    fn header_filter(&self, ctx: &mut RequestCtx, resp: &mut ResponseHead) -> BodyFilter {
        self.encoding.start(ctx, resp, || {
            Encoder(Some(CompressorWriter::with_params(Vec::with_capacity(8 << 10), BUFFER, &self.params)))
        })
    }
    fn body_filter(&self, ctx: &mut RequestCtx, chunk: &mut Bytes, eof: bool) {
        body::step::<Encoder>(ctx, chunk, eof);
    }
}

impl Plugin for Brotli {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "brotli"
    }
    fn priority(&self) -> i32 {
        996
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let encoding = Encoding::new("br", &conf.types, conf.min_length, conf.http_version, conf.vary)?;
        if conf.lgwin != 0 && conf.lgwin < 10 {
            return Err(format!("lgwin: {} is not 0 or 10 to 24", conf.lgwin));
        }
        if conf.lgblock != 0 && conf.lgblock < 16 {
            return Err(format!("lgblock: {} is not 0 or 16 to 24", conf.lgblock));
        }
        let params = BrotliEncoderParams {
            quality: conf.comp_level as i32,
            lgwin: if conf.lgwin == 0 { 22 } else { conf.lgwin as i32 },
            lgblock: conf.lgblock as i32,
            mode: match conf.mode {
                1 => BrotliEncoderMode::BROTLI_MODE_TEXT,
                2 => BrotliEncoderMode::BROTLI_MODE_FONT,
                _ => BrotliEncoderMode::BROTLI_MODE_GENERIC,
            },
            ..BrotliEncoderParams::default()
        };
        Ok(Arc::new(Instance { encoding, params }))
    }
}

register_plugin!(Brotli);

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
        let p = instance(&super::Brotli, json!({"types": ["application/json"], "min_length": 1, "vary": true}))
            .unwrap_or_else(|e| panic!("{e}"));
        let body = br#"{"hello": "world", "again": "world world world world"}"#;
        let mut ctx = TestRequest::get("/").header("accept-encoding", "gzip, br").build();
        let (h, out) = respond(std::slice::from_ref(&p), &mut ctx, head("application/json"), body);
        assert_eq!(h.headers["content-encoding"], "br");
        assert_eq!(h.headers["vary"], "Accept-Encoding");
        let mut plain = Vec::new();
        brotli::Decompressor::new(&out[..], 4096).read_to_end(&mut plain).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plain, body);
        let mut ctx = TestRequest::get("/").build();
        let (h, out) = respond(std::slice::from_ref(&p), &mut ctx, head("application/json"), body);
        assert!(!h.headers.contains_key("content-encoding"));
        assert_eq!(&out[..], body, "untouched for a client that did not ask");
        let mut ctx = TestRequest::get("/").header("accept-encoding", "br").build();
        let (h, _) = respond(&[p], &mut ctx, head("image/png"), body);
        assert!(!h.headers.contains_key("content-encoding"));
    }

    #[test]
    fn apisix_examples_load() {
        for conf in [
            json!({}),
            json!({"types": "*", "min_length": 20, "comp_level": 6, "mode": 0, "lgwin": 19, "lgblock": 0, "http_version": 1.1, "vary": true}),
            json!({"types": ["text/html", "application/json"], "comp_level": 11, "lgblock": 16}),
        ] {
            instance(&super::Brotli, conf.clone()).unwrap_or_else(|e| panic!("{conf}: {e}"));
        }
        assert!(instance(&super::Brotli, json!({"comp_level": 12})).is_err());
        assert!(instance(&super::Brotli, json!({"lgwin": 5})).is_err());
    }
}
