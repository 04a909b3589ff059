//! `gateway.proxy_cache` of config.yaml: the cache zones responses may be stored in, declared as
//! APISIX declares them under `apisix.proxy_cache` (a default TTL for disk zones and a list of
//! zones, each in memory or on disk, with sizes written as nginx writes them: `50m`, `1G`).
//!
//! The host owns the section: its schema is part of config.yaml's (derived from these types),
//! [`ProxyCacheSection::check`] holds the rules a schema cannot express, relative `disk_path`s
//! are made absolute against the prefix directory, and the result reaches plugins in
//! [`crate::InitEnv::proxy_cache`]. Without the section, APISIX's two default zones exist:
//! `disk_cache_one` (on disk, under the prefix's `data/`) and `memory_cache` (in memory, 50m).
//!
//! ```
//! use weir_plugin::cache_zones::{parse_size, ProxyCacheSection};
//!
//! let section = ProxyCacheSection::default();
//! assert_eq!(section.zones.len(), 2);
//! assert!(section.check().is_empty());
//! assert_eq!(parse_size("50m"), Ok(50 << 20));
//! assert_eq!(section.cache_ttl_secs(), Ok(10));
//! ```

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `gateway.proxy_cache`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProxyCacheSection {
    /// How long a response stays fresh in a disk zone when neither the upstream nor the plugin
    /// configuration says (`10s`; a number of seconds, or a number with `s`, `m`, `h` or `d`).
    #[serde(default = "default_ttl")]
    pub cache_ttl: Amount,
    /// The zones; when given, they replace the two default ones.
    #[serde(default = "default_zones")]
    #[schemars(length(min = 1))]
    pub zones: Vec<CacheZone>,
}

/// One cache zone: in memory (`name` and `memory_size` only) or on disk (all five keys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheZone {
    /// The name plugins refer to (`cache_zone`).
    #[schemars(length(min = 1, max = 100))]
    pub name: String,
    /// Memory of the zone: all of a memory zone's entries; a disk zone's key index and the
    /// recently served entries it keeps in memory.
    pub memory_size: Amount,
    /// Bytes of entry files a disk zone keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size: Option<Amount>,
    /// The directory of a disk zone's files (relative: under the prefix directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub disk_path: Option<String>,
    /// Subdirectory levels of a disk zone, as nginx's `levels` (`1:2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[12](:[12]){0,2}$"))]
    pub cache_levels: Option<String>,
}

/// A size (`50m`, `1G`, `4096`) or a duration (`10s`, `5m`, `300`) as written in config.yaml.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Amount {
    /// A plain number (bytes, seconds).
    Number(u64),
    /// A number with a unit.
    Text(#[schemars(regex(pattern = r"^[0-9]+[a-zA-Z]?$"))] String),
}

impl CacheZone {
    /// Whether the zone keeps its entries on disk.
    pub fn is_disk(&self) -> bool {
        self.disk_path.is_some()
    }
}

fn default_ttl() -> Amount {
    Amount::Text("10s".into())
}

fn default_zones() -> Vec<CacheZone> {
    vec![
        CacheZone {
            name: "disk_cache_one".into(),
            memory_size: Amount::Text("50m".into()),
            disk_size: Some(Amount::Text("1G".into())),
            disk_path: Some("data/proxy_cache/disk_cache_one".into()),
            cache_levels: Some("1:2".into()),
        },
        CacheZone {
            name: "memory_cache".into(),
            memory_size: Amount::Text("50m".into()),
            disk_size: None,
            disk_path: None,
            cache_levels: None,
        },
    ]
}

impl Default for ProxyCacheSection {
    fn default() -> Self {
        ProxyCacheSection { cache_ttl: default_ttl(), zones: default_zones() }
    }
}

/// Bytes of a size as nginx writes it: a number, optionally followed by `k`, `m` or `g` (either
/// case, powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let (digits, unit) = split_unit(text);
    let shift = match unit {
        None => 0,
        Some('k' | 'K') => 10,
        Some('m' | 'M') => 20,
        Some('g' | 'G') => 30,
        Some(u) => return Err(format!("`{text}`: unknown size unit `{u}` (k, m or g)")),
    };
    let n: u64 = digits.parse().map_err(|_| format!("`{text}` is not a size (`50m`, `1G`, `4096`)"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("`{text}` is too large"))
}

/// Seconds of a duration as nginx writes it: a number, optionally followed by `s`, `m`, `h` or
/// `d`.
pub fn parse_secs(text: &str) -> Result<u64, String> {
    let (digits, unit) = split_unit(text);
    let mul = match unit {
        None | Some('s') => 1,
        Some('m') => 60,
        Some('h') => 3600,
        Some('d') => 86_400,
        Some(u) => return Err(format!("`{text}`: unknown time unit `{u}` (s, m, h or d)")),
    };
    let n: u64 = digits.parse().map_err(|_| format!("`{text}` is not a duration (`10s`, `5m`, `300`)"))?;
    n.checked_mul(mul).ok_or_else(|| format!("`{text}` is too large"))
}

fn split_unit(text: &str) -> (&str, Option<char>) {
    match text.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => (&text[..text.len() - 1], Some(c)),
        _ => (text, None),
    }
}

impl Amount {
    /// The amount as bytes.
    pub fn bytes(&self) -> Result<u64, String> {
        match self {
            Amount::Number(n) => Ok(*n),
            Amount::Text(t) => parse_size(t),
        }
    }
    /// The amount as seconds.
    pub fn secs(&self) -> Result<u64, String> {
        match self {
            Amount::Number(n) => Ok(*n),
            Amount::Text(t) => parse_secs(t),
        }
    }
}

impl ProxyCacheSection {
    /// `cache_ttl` in seconds.
    pub fn cache_ttl_secs(&self) -> Result<u64, String> {
        self.cache_ttl.secs()
    }

    /// The zone called `name`.
    pub fn zone(&self, name: &str) -> Option<&CacheZone> {
        self.zones.iter().find(|z| z.name == name)
    }

    /// The rules a schema cannot express, as `(key under gateway.proxy_cache, reason)`: sizes and
    /// durations that parse and are not zero, unique zone names, and a disk zone's keys all
    /// present (APISIX's two zone shapes).
    pub fn check(&self) -> Vec<(String, String)> {
        let mut issues = Vec::new();
        match self.cache_ttl.secs() {
            Ok(0) => issues.push(("cache_ttl".into(), "must be at least 1 second".into())),
            Ok(_) => {}
            Err(e) => issues.push(("cache_ttl".into(), e)),
        }
        for (i, z) in self.zones.iter().enumerate() {
            let at = |key: &str| format!("zones[{i}].{key}");
            if self.zones[..i].iter().any(|o| o.name == z.name) {
                issues.push((at("name"), format!("zone `{}` is declared twice", z.name)));
            }
            let mut size = |key: &str, amount: &Amount| match amount.bytes() {
                Ok(0) => issues.push((at(key), "must be larger than 0".into())),
                Ok(_) => {}
                Err(e) => issues.push((at(key), e)),
            };
            size("memory_size", &z.memory_size);
            if let Some(d) = &z.disk_size {
                size("disk_size", d);
            }
            let disk_keys = [z.disk_size.is_some(), z.disk_path.is_some(), z.cache_levels.is_some()];
            if disk_keys.iter().any(|k| *k) && !disk_keys.iter().all(|k| *k) {
                let missing: Vec<&str> = ["disk_size", "disk_path", "cache_levels"]
                    .iter()
                    .zip(disk_keys)
                    .filter(|(_, present)| !present)
                    .map(|(k, _)| *k)
                    .collect();
                issues.push((
                    at(missing[0]),
                    format!(
                        "a disk zone needs disk_size, disk_path and cache_levels (missing: {}); a memory zone has name and memory_size only",
                        missing.join(", ")
                    ),
                ));
            }
        }
        issues
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse_as_nginx_writes_them() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("1T").is_err());
        assert!(parse_size("m").is_err());
        assert!(parse_size("99999999999999999999g").is_err());
        assert!(parse_size("18446744073709551615g").is_err(), "overflow is an error");
        assert_eq!(parse_secs("10s"), Ok(10));
        assert_eq!(parse_secs("2h"), Ok(7200));
        assert_eq!(parse_secs("300"), Ok(300));
        assert!(parse_secs("10x").is_err());
    }

    #[test]
    fn zone_shapes_and_names_are_checked() {
        let mut s = ProxyCacheSection::default();
        s.zones[1].name = "disk_cache_one".into();
        s.zones[0].cache_levels = None;
        s.zones[1].memory_size = Amount::Text("0".into());
        let issues = s.check();
        let keys: Vec<&str> = issues.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["zones[0].cache_levels", "zones[1].name", "zones[1].memory_size"], "{issues:?}");
        assert!(issues[0].1.contains("missing: cache_levels"), "{issues:?}");
    }
}
