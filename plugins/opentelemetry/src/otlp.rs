//! OTLP's protobuf wire format for the messages the exporter sends, written straight from a
//! request's record into one buffer: no intermediate message structs, no allocation per
//! attribute, each length computed once. Field numbers are those of
//! `opentelemetry/proto/trace/v1/trace.proto`, `common/v1/common.proto` and
//! `collector/trace/v1/trace_service.proto`; the unit tests decode what is written here with
//! the upstream types (`opentelemetry-proto`).
//!
//! The same bytes are an OTLP/HTTP body and an OTLP/gRPC message ([`RawCodec`]).

use bytes::{Buf, BufMut, Bytes};

/// A span's kind (`Span.SpanKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

/// An attribute's value (`AnyValue`).
#[derive(Debug, Clone, Copy)]
pub enum Val<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
    Double(f64),
}

const LEN: u8 = 2;
const VARINT: u8 = 0;
const I64: u8 = 1;
const I32: u8 = 5;

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, u64::from(field << 3 | u32::from(wire)));
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bytes of `v` as a varint.
fn varint_len(v: u64) -> usize {
    // 1 + floor(log128(v)), with 0 taking one byte.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// A length-delimited field: key, length, bytes.
fn bytes_field(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(out, field, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A length-delimited field whose bytes are `parts` one after the other.
fn joined_field(out: &mut Vec<u8>, field: u32, parts: &[&str]) {
    key(out, field, LEN);
    varint(out, parts.iter().map(|p| p.len()).sum::<usize>() as u64);
    for p in parts {
        out.extend_from_slice(p.as_bytes());
    }
}

/// Bytes of a length-delimited field with a one-byte key and `n` bytes of content.
fn delimited_len(n: usize) -> usize {
    1 + varint_len(n as u64) + n
}

/// A `KeyValue` as field `field` of the enclosing message.
pub fn key_value(out: &mut Vec<u8>, field: u32, k: &str, v: Val<'_>) {
    let any = match v {
        Val::Str(s) => delimited_len(s.len()),
        Val::Int(i) => 1 + varint_len(i as u64),
        Val::Bool(_) => 2,
        Val::Double(_) => 9,
    };
    key(out, field, LEN);
    varint(out, (delimited_len(k.len()) + delimited_len(any)) as u64);
    bytes_field(out, 1, k.as_bytes());
    key(out, 2, LEN);
    varint(out, any as u64);
    match v {
        Val::Str(s) => bytes_field(out, 1, s.as_bytes()),
        Val::Int(i) => {
            key(out, 3, VARINT);
            varint(out, i as u64);
        }
        Val::Bool(b) => {
            key(out, 2, VARINT);
            out.push(u8::from(b));
        }
        Val::Double(d) => {
            key(out, 4, I64);
            out.extend_from_slice(&d.to_le_bytes());
        }
    }
}

/// What a span is, but for its attributes and status (written after it with [`SpanWriter`]).
pub struct SpanHead<'a> {
    pub trace_id: &'a [u8; 16],
    pub span_id: &'a [u8; 8],
    pub parent_id: Option<&'a [u8; 8]>,
    pub trace_state: &'a str,
    /// The name, as parts written one after the other (no formatting).
    pub name: &'a [&'a str],
    pub kind: Kind,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
}

/// The spans of one export, and the scratch a span is written into before its length is known.
#[derive(Default)]
pub struct Batch {
    spans: Vec<u8>,
    span: Vec<u8>,
}

/// One span being written: attributes, then the status, then [`SpanWriter::end`].
pub struct SpanWriter<'b> {
    batch: &'b mut Batch,
}

impl Batch {
    /// Starts a span (sampled: flags 1).
    pub fn span(&mut self, h: &SpanHead<'_>) -> SpanWriter<'_> {
        let s = &mut self.span;
        s.clear();
        bytes_field(s, 1, h.trace_id);
        bytes_field(s, 2, h.span_id);
        if !h.trace_state.is_empty() {
            bytes_field(s, 3, h.trace_state.as_bytes());
        }
        if let Some(p) = h.parent_id {
            bytes_field(s, 4, p);
        }
        joined_field(s, 5, h.name);
        key(s, 6, VARINT);
        varint(s, h.kind as u64);
        key(s, 7, I64);
        s.extend_from_slice(&h.start_unix_nano.to_le_bytes());
        key(s, 8, I64);
        s.extend_from_slice(&h.end_unix_nano.to_le_bytes());
        key(s, 16, I32);
        s.extend_from_slice(&1u32.to_le_bytes());
        SpanWriter { batch: self }
    }

    /// The `ExportTraceServiceRequest` of the spans written, under one resource (its
    /// attributes already encoded as `Resource` fields) and the `weir` scope; the batch is
    /// empty again afterwards.
    pub fn finish(&mut self, resource: &[u8]) -> Bytes {
        let mut scope = Vec::with_capacity(32);
        bytes_field(&mut scope, 1, b"weir");
        bytes_field(&mut scope, 2, env!("CARGO_PKG_VERSION").as_bytes());
        let scope_spans = delimited_len(scope.len()) + self.spans.len();
        let resource_spans = delimited_len(resource.len()) + delimited_len(scope_spans);
        let mut out = Vec::with_capacity(delimited_len(resource_spans) + 2);
        key(&mut out, 1, LEN);
        varint(&mut out, resource_spans as u64);
        bytes_field(&mut out, 1, resource);
        key(&mut out, 2, LEN);
        varint(&mut out, scope_spans as u64);
        bytes_field(&mut out, 1, &scope);
        out.extend_from_slice(&self.spans);
        self.spans.clear();
        Bytes::from(out)
    }
}

impl SpanWriter<'_> {
    /// An attribute.
    pub fn attr(&mut self, k: &str, v: Val<'_>) -> &mut Self {
        key_value(&mut self.batch.span, 9, k, v);
        self
    }

    /// A string attribute.
    pub fn text(&mut self, k: &str, v: &str) -> &mut Self {
        self.attr(k, Val::Str(v))
    }

    /// An integer attribute.
    pub fn int(&mut self, k: &str, v: i64) -> &mut Self {
        self.attr(k, Val::Int(v))
    }

    /// The span failed (`Status.code` ERROR), with a message (may be empty).
    pub fn error(&mut self, message: &str) -> &mut Self {
        let s = &mut self.batch.span;
        let inner = if message.is_empty() { 0 } else { delimited_len(message.len()) } + 2;
        key(s, 15, LEN);
        varint(s, inner as u64);
        if !message.is_empty() {
            bytes_field(s, 2, message.as_bytes());
        }
        key(s, 3, VARINT);
        s.push(2);
        self
    }

    /// Ends the span: appended to the batch.
    pub fn end(self) {
        let b = self.batch;
        key(&mut b.spans, 2, LEN);
        varint(&mut b.spans, b.span.len() as u64);
        b.spans.extend_from_slice(&b.span);
    }
}

/// A gRPC codec sending bytes already encoded (an `ExportTraceServiceRequest` from
/// [`Batch::finish`]) and ignoring the answer's body (an `ExportTraceServiceResponse`, whose
/// partial-success details are not used).
#[derive(Debug, Default, Clone, Copy)]
pub struct RawCodec;

/// [`RawCodec`]'s two halves.
#[derive(Debug, Default, Clone, Copy)]
pub struct Raw;

impl tonic::codec::Codec for RawCodec {
    type Encode = Bytes;
    type Decode = ();
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = ();
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        let n = src.remaining();
        src.advance(n);
        Ok(Some(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
    use prost::Message;

    #[test]
    fn varint_lengths() {
        for v in [0u64, 1, 127, 128, 16_383, 16_384, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            varint(&mut out, v);
            assert_eq!(varint_len(v), out.len(), "{v}");
        }
    }

    #[test]
    fn what_is_written_decodes_with_the_upstream_types() {
        let mut resource = Vec::new();
        key_value(&mut resource, 1, "service.name", Val::Str("edge"));
        key_value(&mut resource, 1, "replicas", Val::Int(-3));
        key_value(&mut resource, 1, "canary", Val::Bool(true));
        key_value(&mut resource, 1, "weight", Val::Double(0.25));
        let mut batch = Batch::default();
        let long = "x".repeat(300);
        for n in 0..200u8 {
            let parent = [n; 8];
            let mut w = batch.span(&SpanHead {
                trace_id: &[n | 1; 16],
                span_id: &[n | 2; 8],
                parent_id: (n.is_multiple_of(2)).then_some(&parent),
                trace_state: if n == 3 { "vendor=a" } else { "" },
                name: &["GET", " ", "/users/:id"],
                kind: if n.is_multiple_of(3) { Kind::Server } else { Kind::Client },
                start_unix_nano: 1_700_000_000_000_000_000 + u64::from(n),
                end_unix_nano: 1_700_000_000_000_000_999,
            });
            w.text("url.path", if n == 7 { &long } else { "/users/7" }).int("http.response.status_code", 200);
            if n == 5 {
                w.error("connect: refused");
            }
            if n == 6 {
                w.error("");
            }
            w.end();
        }
        let bytes = batch.finish(&resource);
        // Finishing empties the batch.
        let empty = ExportTraceServiceRequest::decode(batch.finish(&resource)).unwrap_or_else(|e| panic!("{e}"));
        assert!(empty.resource_spans[0].scope_spans[0].spans.is_empty());
        let req = ExportTraceServiceRequest::decode(bytes).unwrap_or_else(|e| panic!("{e}"));
        let rs = &req.resource_spans[0];
        let attrs = &rs.resource.as_ref().unwrap_or_else(|| panic!("resource")).attributes;
        let values: Vec<_> = attrs.iter().map(|a| a.value.as_ref().and_then(|v| v.value.clone())).collect();
        assert_eq!(
            values,
            [
                Some(Value::StringValue("edge".into())),
                Some(Value::IntValue(-3)),
                Some(Value::BoolValue(true)),
                Some(Value::DoubleValue(0.25))
            ]
        );
        let scope = &rs.scope_spans[0];
        assert_eq!(scope.scope.as_ref().map(|s| s.name.as_str()), Some("weir"));
        assert_eq!(scope.spans.len(), 200);
        for (n, s) in scope.spans.iter().enumerate() {
            let n = n as u8;
            assert_eq!(s.trace_id, [n | 1; 16]);
            assert_eq!(s.span_id, [n | 2; 8]);
            assert_eq!(s.parent_span_id, if n.is_multiple_of(2) { vec![n; 8] } else { vec![] });
            assert_eq!(s.trace_state, if n == 3 { "vendor=a" } else { "" });
            assert_eq!(s.name, "GET /users/:id");
            assert_eq!(s.kind, if n.is_multiple_of(3) { 2 } else { 3 });
            assert_eq!(s.flags, 1);
            assert_eq!(s.start_time_unix_nano, 1_700_000_000_000_000_000 + u64::from(n));
            assert_eq!(s.end_time_unix_nano, 1_700_000_000_000_000_999);
            assert_eq!(s.attributes.len(), 2);
            assert_eq!(s.attributes[0].key, "url.path");
            let path = s.attributes[0].value.as_ref().and_then(|v| v.value.clone());
            assert_eq!(path, Some(Value::StringValue(if n == 7 { long.clone() } else { "/users/7".into() })));
            let status = s.status.as_ref().map(|st| (st.code, st.message.as_str()));
            let expected = match n {
                5 => Some((StatusCode::Error as i32, "connect: refused")),
                6 => Some((StatusCode::Error as i32, "")),
                _ => None,
            };
            assert_eq!(status, expected);
        }
    }
}
