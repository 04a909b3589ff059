//! Reading config.yaml: the paths of an installation ([`Prefix`]), YAML into JSON values, and
//! [`Config::load`]: schema validation, deserialization, the rule checks, and etcd TLS files.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::Config;
use crate::error::ConfigError;
use crate::plugins::Catalog;
use crate::validate::{CompiledSchema, Issue};

/// Paths of one Weir installation.
#[derive(Debug, Clone)]
pub struct Prefix {
    /// The prefix directory (`-p`).
    pub dir: PathBuf,
}

impl Prefix {
    /// A prefix directory.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Prefix { dir: dir.into() }
    }
    /// `conf/config.yaml`.
    pub fn config_file(&self) -> PathBuf {
        self.dir.join("conf").join("config.yaml")
    }
    /// `conf/resources.yaml`.
    pub fn resources_file(&self) -> PathBuf {
        self.dir.join("conf").join("resources.yaml")
    }
    /// `data/`, where plugins keep durable state.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }
}

/// Reads a YAML file into a JSON value; a missing file is `None`, an empty one is `{}`.
pub fn read_yaml(path: &Path) -> Result<Option<Value>, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ConfigError::one(path, "", format!("cannot read: {e}"))),
    };
    parse_yaml(path, &text).map(Some)
}

/// Parses YAML text into a JSON value (an empty document is `{}`).
pub fn parse_yaml(path: &Path, text: &str) -> Result<Value, ConfigError> {
    match serde_yaml::from_str::<Value>(text) {
        Ok(Value::Null) => Ok(Value::Object(Default::default())),
        Ok(v) => Ok(v),
        Err(e) => {
            let at = e.location().map(|l| format!("line {}, column {}", l.line(), l.column())).unwrap_or_default();
            Err(ConfigError::one(path, at, format!("invalid YAML: {e}")))
        }
    }
}

impl Config {
    /// The JSON Schema of config.yaml.
    pub fn schema() -> Value {
        weir_plugin::schema_of::<Config>()
    }

    /// Loads and checks `conf/config.yaml` of `prefix` (missing file: all defaults).
    pub fn load(prefix: &Prefix, catalog: &Catalog) -> Result<Config, ConfigError> {
        let path = prefix.config_file();
        let raw = read_yaml(&path)?.unwrap_or_else(|| Value::Object(Default::default()));
        let mut config = Self::from_value(&path, &raw, catalog)?;
        config.resolve_cache_paths(&prefix.dir);
        let issues = config.load_etcd_tls(&prefix.dir);
        if issues.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::new(&path, issues))
        }
    }

    /// Validates and checks a parsed config document.
    pub fn from_value(path: &Path, raw: &Value, catalog: &Catalog) -> Result<Config, ConfigError> {
        let schema = CompiledSchema::new(Self::schema()).map_err(|e| ConfigError::one(path, "", e))?;
        schema.check(raw).map_err(|issues| ConfigError::new(path, issues))?;
        let config: Config =
            serde_json::from_value(raw.clone()).map_err(|e| ConfigError::one(path, "", e.to_string()))?;
        let issues = config.check(catalog);
        if issues.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::new(path, issues))
        }
    }

    /// Makes the `disk_path` of `gateway.proxy_cache` zones absolute (relative ones are under
    /// `dir`), as plugins receive them.
    fn resolve_cache_paths(&mut self, dir: &Path) {
        for zone in &mut self.gateway.proxy_cache.zones {
            if let Some(p) = &mut zone.disk_path {
                *p = dir.join(&*p).to_string_lossy().into_owned();
            }
        }
    }

    /// Makes `deployment.etcd.tls` paths absolute (relative ones are under `dir`) and checks that
    /// each names a readable PEM file of the right kind.
    fn load_etcd_tls(&mut self, dir: &Path) -> Vec<Issue> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let mut issues = Vec::new();
        let Some(tls) = &mut self.deployment.etcd.tls else { return issues };
        for (name, path) in [("cert", &mut tls.cert), ("key", &mut tls.key), ("ca", &mut tls.ca)] {
            let Some(p) = path else { continue };
            let abs = dir.join(&*p);
            *p = abs.to_string_lossy().into_owned();
            let key = format!("deployment.etcd.tls.{name}");
            let pem = match std::fs::read(&abs) {
                Ok(b) => b,
                Err(e) => {
                    issues.push(Issue::new(key, format!("cannot read {}: {e}", abs.display())));
                    continue;
                }
            };
            let ok = if name == "key" {
                PrivateKeyDer::from_pem_slice(&pem).is_ok()
            } else {
                CertificateDer::pem_slice_iter(&pem).next().is_some_and(|c| c.is_ok())
            };
            if !ok {
                let what = if name == "key" { "a PEM private key" } else { "PEM certificates" };
                issues.push(Issue::new(key, format!("{} does not hold {what}", abs.display())));
            }
        }
        issues
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Listen;
    use serde_json::json;

    fn check(raw: Value) -> Result<Config, String> {
        Config::from_value(Path::new("conf/config.yaml"), &raw, &Catalog::empty()).map_err(|e| e.to_string())
    }

    #[test]
    fn empty_document_is_all_defaults() {
        let c = check(json!({})).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.gateway.node_listen, vec![Listen::Port(9080)]);
        assert_eq!(c.gateway.control.port, 9090);
        assert!(c.gateway.enable_control);
        assert_eq!(c.deployment.prefix, "/weir");
        assert!(c.gateway.worker_processes.count() >= 1);
    }

    #[test]
    fn unknown_keys_are_named_with_a_suggestion() {
        let e = check(json!({"gateway": {"control": {"prot": 1}}})).unwrap_err();
        assert!(e.contains("conf/config.yaml: gateway.control.prot: unknown key (did you mean `port`?)"), "{e}");
        let e = check(json!({"pluginz": []})).unwrap_err();
        assert!(e.contains("pluginz: unknown key (did you mean `plugins`?)"), "{e}");
    }

    #[test]
    fn router_and_worker_values_are_checked() {
        assert!(check(json!({"gateway": {"control": {"router": "radixtree_uri_with_parameter"}}})).is_ok());
        let e = check(json!({"gateway": {"control": {"router": "radix"}}})).unwrap_err();
        assert!(e.contains("gateway.control.router"), "{e}");
        assert!(check(json!({"gateway": {"worker_processes": 2}})).is_ok());
        assert!(check(json!({"gateway": {"worker_processes": 0}})).is_err());
        assert!(check(json!({"gateway": {"worker_processes": "many"}})).is_err());
    }

    #[test]
    fn proxy_cache_zones_are_checked_with_their_path() {
        let c = check(json!({})).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.gateway.proxy_cache.zones.len(), 2, "APISIX's default zones");
        let zones = json!({"gateway": {"proxy_cache": {"zones": [
            {"name": "m", "memory_size": "1x"},
            {"name": "d", "memory_size": "10m", "disk_path": "/tmp/d"}
        ]}}});
        let e = check(zones).unwrap_err();
        assert!(e.contains("gateway.proxy_cache.zones[0].memory_size: `1x`: unknown size unit"), "{e}");
        assert!(e.contains("gateway.proxy_cache.zones[1].disk_size: a disk zone needs"), "{e}");
        let e = check(json!({"gateway": {"proxy_cache": {"zones": [{"name": "m"}]}}})).unwrap_err();
        assert!(e.contains("gateway.proxy_cache.zones[0]"), "{e}");
        let ok =
            json!({"gateway": {"proxy_cache": {"cache_ttl": "1m", "zones": [{"name": "m", "memory_size": 65536}]}}});
        assert!(check(ok).is_ok());
    }

    #[test]
    fn yaml_errors_carry_the_location() {
        let e = parse_yaml(Path::new("c.yaml"), "gateway:\n  control: [\n").unwrap_err().to_string();
        assert!(e.starts_with("c.yaml: line "), "{e}");
    }
}
