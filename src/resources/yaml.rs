//! The `yaml` resource provider's document: `conf/resources.yaml` read into a raw resource
//! document. Watching the file and applying changes is `crate::watch::yaml`.

use std::path::Path;

use serde_json::Value;

use crate::config::read_yaml;
use crate::error::ConfigError;

/// Reads the resource document (a missing file is an empty set).
pub fn load(path: &Path) -> Result<Value, ConfigError> {
    Ok(read_yaml(path)?.unwrap_or_else(|| Value::Object(Default::default())))
}
