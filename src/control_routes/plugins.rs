//! Plugin control endpoints mounted with `matchit`.
//!
//! Without `control.router`, plugin URIs match literally. With `radixtree_uri_with_parameter`,
//! `:name` segments capture one non-empty segment. A trailing `*` is a prefix match in both modes.
//! A plugin URI that would shadow (or be shadowed by) a built-in endpoint is refused, as are two
//! plugins claiming one URI.

use std::sync::Arc;

use weir_plugin::ControlHandler;

use crate::config::ControlRouter;
use crate::plugins::EnabledSet;

/// One mounted endpoint.
pub struct Mounted {
    /// The plugin that owns it.
    pub plugin: &'static str,
    /// Accepted methods.
    pub methods: Vec<&'static str>,
    /// Handler.
    pub handler: ControlHandler,
}

/// The control routes of the enabled plugins.
#[derive(Default)]
pub struct PluginRoutes {
    router: matchit::Router<Vec<Arc<Mounted>>>,
}

/// What a lookup found.
pub struct Found<'a> {
    /// Candidates at the path (filter by method).
    pub mounted: &'a [Arc<Mounted>],
    /// Captured parameters.
    pub params: Vec<(String, String)>,
}

impl PluginRoutes {
    /// Mounts the endpoints of every enabled plugin.
    pub fn build(enabled: &EnabledSet, mode: Option<ControlRouter>) -> Result<PluginRoutes, String> {
        let with_params = mode == Some(ControlRouter::RadixtreeUriWithParameter);
        let mut patterns: Vec<(String, String, Vec<Arc<Mounted>>)> = Vec::new();
        for entry in &enabled.by_priority {
            for ep in entry.plugin.control_endpoints() {
                let mounted =
                    Arc::new(Mounted { plugin: entry.name, methods: ep.methods.clone(), handler: ep.handler });
                for uri in &ep.uris {
                    if !uri.starts_with('/') {
                        return Err(format!("plugin `{}`: control uri `{uri}` must start with `/`", entry.name));
                    }
                    for pattern in to_patterns(uri, with_params) {
                        if let Some(sample) = super::shadowed_by(&pattern) {
                            return Err(format!(
                                "plugin `{}`: control uri `{uri}` conflicts with built-in endpoint `{sample}`",
                                entry.name
                            ));
                        }
                        match patterns.iter_mut().find(|(p, _, _)| *p == pattern) {
                            Some((_, owner, list)) => {
                                let clash = list.iter().any(|m| m.methods.iter().any(|x| mounted.methods.contains(x)));
                                if clash {
                                    return Err(format!(
                                        "plugin `{}`: control uri `{uri}` is already mounted by plugin `{owner}`",
                                        entry.name
                                    ));
                                }
                                list.push(mounted.clone());
                            }
                            None => patterns.push((pattern, entry.name.to_owned(), vec![mounted.clone()])),
                        }
                    }
                }
            }
        }
        let mut router = matchit::Router::new();
        for (pattern, owner, list) in patterns {
            router
                .insert(pattern.clone(), list)
                .map_err(|e| format!("plugin `{owner}`: control uri `{pattern}`: {e}"))?;
        }
        Ok(PluginRoutes { router })
    }

    /// Looks a path up.
    pub fn at(&self, path: &str) -> Option<Found<'_>> {
        let m = self.router.at(path).ok()?;
        let params =
            m.params.iter().filter(|(k, _)| *k != "__rest").map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
        Some(Found { mounted: m.value, params })
    }
}

/// matchit patterns for one plugin URI.
pub fn to_patterns(uri: &str, with_params: bool) -> Vec<String> {
    let (base, prefix) = match uri.strip_suffix('*') {
        Some(b) => (b, true),
        None => (uri, false),
    };
    let converted: Vec<String> = base
        .split('/')
        .map(|seg| {
            let escaped = seg.replace('{', "{{").replace('}', "}}");
            match seg.strip_prefix(':') {
                Some(name) if with_params && !name.is_empty() => format!("{{{name}}}"),
                _ => escaped,
            }
        })
        .collect();
    let path = converted.join("/");
    if !prefix {
        return vec![path];
    }
    if path.ends_with('/') {
        vec![path.clone(), format!("{path}{{*__rest}}")]
    } else {
        vec![path.clone(), format!("{path}/{{*__rest}}")]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_by_mode() {
        assert_eq!(to_patterns("/v1/plugin/x/echo/:word", true), ["/v1/plugin/x/echo/{word}"]);
        assert_eq!(to_patterns("/v1/plugin/x/echo/:word", false), ["/v1/plugin/x/echo/:word"]);
        assert_eq!(to_patterns("/v1/plugin/x/{a}", false), ["/v1/plugin/x/{{a}}"]);
        assert_eq!(to_patterns("/v1/plugin/x/*", false), ["/v1/plugin/x/", "/v1/plugin/x/{*__rest}"]);
    }
}
