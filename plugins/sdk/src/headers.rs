//! Header operations (`add` / `set` / `remove`) as plugins configure them, e.g. proxy-rewrite on
//! the request and response-rewrite on the response.

use std::collections::BTreeMap;

use http::HeaderName;
use schemars::JsonSchema;
use serde::Deserialize;

/// Header operations, as configured.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeaderOps {
    /// Appended (existing values kept).
    #[serde(default)]
    pub add: BTreeMap<String, String>,
    /// Replaced.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Removed.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// Header operations with their names parsed (values stay text: a plugin may template them).
#[derive(Debug, Default)]
pub struct NamedHeaderOps {
    /// Appended.
    pub add: Vec<(HeaderName, String)>,
    /// Replaced.
    pub set: Vec<(HeaderName, String)>,
    /// Removed.
    pub remove: Vec<HeaderName>,
}

fn name(k: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("header `{k}`: {e}"))
}

impl HeaderOps {
    /// Parses every header name; an invalid one is an error naming it.
    pub fn named(&self) -> Result<NamedHeaderOps, String> {
        let pairs = |m: &BTreeMap<String, String>| -> Result<Vec<(HeaderName, String)>, String> {
            m.iter().map(|(k, v)| Ok((name(k)?, v.clone()))).collect()
        };
        Ok(NamedHeaderOps {
            add: pairs(&self.add)?,
            set: pairs(&self.set)?,
            remove: self.remove.iter().map(|k| name(k)).collect::<Result<_, _>>()?,
        })
    }
}
