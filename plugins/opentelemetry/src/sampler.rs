//! Samplers, in APISIX's shape: `{name, options: {fraction, root: {name, options: {fraction}}}}`.

use schemars::JsonSchema;
use serde::Deserialize;

/// `sampler.name` (and `sampler.options.root.name`).
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SamplerName {
    /// Every request.
    AlwaysOn,
    /// None (APISIX's default).
    #[default]
    AlwaysOff,
    /// A fraction of traces, decided by the trace id (every service with the same fraction
    /// decides the same way).
    TraceIdRatio,
    /// The client's decision (its `traceparent`'s sampled flag), else the root sampler's.
    ParentBase,
}

/// `sampler`.
#[derive(Debug, Clone, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct SamplerConf {
    /// The strategy.
    #[serde(default)]
    pub name: SamplerName,
    /// Its parameters.
    #[serde(default)]
    pub options: SamplerOptions,
}

/// `sampler.options`.
#[derive(Debug, Clone, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct SamplerOptions {
    /// `trace_id_ratio`'s fraction, 0 to 1.
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub fraction: f64,
    /// `parent_base`'s sampler for requests without a parent (default `always_off`).
    #[serde(default)]
    pub root: Option<RootConf>,
}

/// `sampler.options.root`.
#[derive(Debug, Clone, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct RootConf {
    /// `always_on`, `always_off` or `trace_id_ratio`.
    #[serde(default)]
    pub name: SamplerName,
    /// Its parameters.
    #[serde(default)]
    pub options: RootOptions,
}

/// `sampler.options.root.options`.
#[derive(Debug, Clone, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct RootOptions {
    /// `trace_id_ratio`'s fraction, 0 to 1.
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub fraction: f64,
}

/// A compiled sampler.
#[derive(Debug, Clone, PartialEq)]
pub enum Sampler {
    AlwaysOn,
    AlwaysOff,
    /// Sampled when the trace id's last 8 bytes, shifted right by one, are below this.
    Ratio(u64),
    ParentBased(Box<Sampler>),
}

fn ratio(fraction: f64, path: &str) -> Result<Sampler, String> {
    if !(0.0..=1.0).contains(&fraction) {
        return Err(format!("{path}: {fraction} is not between 0 and 1"));
    }
    // As OpenTelemetry's TraceIdRatioBased: a threshold over 63 bits of the trace id.
    Ok(Sampler::Ratio((fraction * (1u64 << 63) as f64) as u64))
}

impl Sampler {
    /// Compiles `conf`; errors name the key under `sampler`.
    pub fn compile(conf: &SamplerConf) -> Result<Sampler, String> {
        Ok(match conf.name {
            SamplerName::AlwaysOn => Sampler::AlwaysOn,
            SamplerName::AlwaysOff => Sampler::AlwaysOff,
            SamplerName::TraceIdRatio => ratio(conf.options.fraction, "options.fraction")?,
            SamplerName::ParentBase => {
                let root = conf.options.root.clone().unwrap_or_default();
                Sampler::ParentBased(Box::new(match root.name {
                    SamplerName::AlwaysOn => Sampler::AlwaysOn,
                    SamplerName::AlwaysOff => Sampler::AlwaysOff,
                    SamplerName::TraceIdRatio => ratio(root.options.fraction, "options.root.options.fraction")?,
                    SamplerName::ParentBase => {
                        return Err("options.root.name: `parent_base` cannot be its own root".into());
                    }
                }))
            }
        })
    }

    /// Whether to record the trace `trace_id`, whose client's `traceparent` said `parent`.
    pub fn sample(&self, trace_id: &[u8; 16], parent: Option<bool>) -> bool {
        match self {
            Sampler::AlwaysOn => true,
            Sampler::AlwaysOff => false,
            Sampler::Ratio(threshold) => {
                let mut low = [0u8; 8];
                low.copy_from_slice(&trace_id[8..]);
                (u64::from_be_bytes(low) >> 1) < *threshold
            }
            Sampler::ParentBased(root) => match parent {
                Some(sampled) => sampled,
                None => root.sample(trace_id, None),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(v: serde_json::Value) -> Result<Sampler, String> {
        Sampler::compile(&serde_json::from_value(v).map_err(|e| e.to_string())?)
    }

    #[test]
    fn ratio_samples_about_its_fraction() {
        let s = compile(serde_json::json!({"name": "trace_id_ratio", "options": {"fraction": 0.25}}))
            .unwrap_or_else(|e| panic!("{e}"));
        let n = (0..20_000).filter(|_| s.sample(&weir_plugin::measure::new_trace_id(), None)).count();
        assert!((4000..6000).contains(&n), "{n} of 20000");
        let none = compile(serde_json::json!({"name": "trace_id_ratio"})).unwrap_or_else(|e| panic!("{e}"));
        assert!(!none.sample(&[0xff; 16], None) && !none.sample(&[0; 16], None));
        let all = compile(serde_json::json!({"name": "trace_id_ratio", "options": {"fraction": 1}}))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(all.sample(&[0xff; 16], None));
    }

    #[test]
    fn parent_base_follows_the_parent_then_its_root() {
        let s = compile(serde_json::json!({"name": "parent_base", "options": {"root": {"name": "always_on"}}}))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(s.sample(&[1; 16], None));
        assert!(!s.sample(&[1; 16], Some(false)));
        let default_root = compile(serde_json::json!({"name": "parent_base"})).unwrap_or_else(|e| panic!("{e}"));
        assert!(!default_root.sample(&[1; 16], None) && default_root.sample(&[1; 16], Some(true)));
        assert!(
            compile(serde_json::json!({"name": "parent_base", "options": {"root": {"name": "parent_base"}}})).is_err()
        );
        assert_eq!(compile(serde_json::json!({})), Ok(Sampler::AlwaysOff), "APISIX's default");
    }
}
