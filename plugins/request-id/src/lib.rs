//! `request-id`: gives every request an id in a header (kept when the client sent one), passes it
//! upstream, and returns it to the client.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::http::{HeaderName, HeaderValue};
use weir_plugin::{
    register_plugin, BodyFilter, BuildContext, Flow, Late, Plugin, PluginInstance, RequestCtx, ResponseHead,
};

/// Id formats.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    // A random UUID (version 4).
    #[default]
    Uuid,
    // 21 URL-safe random characters.
    Nanoid,
}

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Header carrying the id.
    #[serde(default = "default_header")]
    #[schemars(length(min = 1))]
    pub header_name: String,
    /// Also send the id back to the client.
    #[serde(default = "yes")]
    pub include_in_response: bool,
    /// Id format.
    #[serde(default)]
    pub algorithm: Algorithm,
}

fn default_header() -> String {
    "X-Request-Id".into()
}
fn yes() -> bool {
    true
}

/// A random UUID v4 in its canonical text form.
pub fn uuid_v4() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut b = weir_plugin::random::bytes::<16>();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut out = String::with_capacity(36);
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(HEX[usize::from(x >> 4)] as char);
        out.push(HEX[usize::from(x & 0x0f)] as char);
    }
    out
}

/// A nanoid: 21 characters of the URL-safe alphabet (64 symbols: one byte's low 6 bits each,
/// without bias), as `nanoid::nanoid!()` makes them.
pub fn nanoid() -> String {
    weir_plugin::random::bytes::<21>().iter().map(|x| nanoid::alphabet::SAFE[usize::from(x & 63)]).collect()
}

/// The plugin.
pub struct RequestId;

struct Instance {
    header: HeaderName,
    include: bool,
    algorithm: Algorithm,
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late { header_filter: self.include, ..Late::NONE }
    }
    fn rewrite(&self, ctx: &mut RequestCtx) -> Flow<'_> {
        let id = match ctx.headers.get(&self.header).and_then(|v| v.to_str().ok()) {
            Some(existing) if !existing.is_empty() => existing.to_owned(),
            _ => {
                let id = match self.algorithm {
                    Algorithm::Uuid => uuid_v4(),
                    Algorithm::Nanoid => nanoid(),
                };
                if let Ok(v) = HeaderValue::from_str(&id) {
                    ctx.headers.insert(self.header.clone(), v);
                }
                id
            }
        };
        ctx.set_var("request_id", id);
        Flow::Continue
    }
    fn header_filter(&self, ctx: &mut RequestCtx, resp: &mut ResponseHead) -> BodyFilter {
        if self.include {
            if let Some(v) = ctx.var("request_id").and_then(|id| HeaderValue::from_str(&id).ok()) {
                resp.headers.insert(self.header.clone(), v);
            }
        }
        BodyFilter::Skip
    }
}

impl Plugin for RequestId {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "request-id"
    }
    fn priority(&self) -> i32 {
        12015
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let c = conf;
        let header = HeaderName::from_bytes(c.header_name.as_bytes()).map_err(|e| format!("header_name: {e}"))?;
        Ok(Arc::new(Instance { header, include: c.include_in_response, algorithm: c.algorithm }))
    }
}

weir_plugin::declare_var!("request_id");

register_plugin!(RequestId);

#[cfg(test)]
mod tests {
    #[test]
    fn uuid_shape() {
        let u = super::uuid_v4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"));
        assert_ne!(u, super::uuid_v4());
        let dashes: Vec<usize> = u.match_indices('-').map(|(i, _)| i).collect();
        assert_eq!(dashes, [8, 13, 18, 23]);
        assert!(u.chars().all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }

    #[test]
    fn nanoid_shape() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| super::nanoid()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            assert_eq!(id.len(), 21);
            assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'), "{id}");
        }
        // Every symbol of the alphabet turns up.
        let seen: std::collections::HashSet<char> = ids.iter().flat_map(|i| i.chars()).collect();
        assert_eq!(seen.len(), 64);
    }
}
