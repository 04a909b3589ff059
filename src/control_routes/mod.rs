//! What the control server answers, as data: the built-in endpoint table (paths, what each
//! serves, methods; also what `crate::openapi` documents) and the routes plugins mount
//! ([`plugins::PluginRoutes`]). It knows no HTTP server and no gateway state: the state builds
//! plugin routes with it when the plugin set changes, and the control server (`crate::control`)
//! dispatches with it, so neither depends on the other.

pub mod plugins;

use std::sync::OnceLock;

pub use plugins::PluginRoutes;

/// Resource kinds dumped by `/v1/<kinds>` and `/v1/<kind>/{id}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Routes.
    Route,
    /// Services.
    Service,
    /// Upstream objects.
    Upstream,
}

impl Kind {
    /// `route`, `service`, `upstream`.
    pub fn singular(self) -> &'static str {
        match self {
            Kind::Route => "route",
            Kind::Service => "service",
            Kind::Upstream => "upstream",
        }
    }
}

/// What a built-in path serves (the table's values; also what `crate::openapi` documents).
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub enum Tag {
    Schema,
    OpenApi,
    Healthchecks,
    HealthMissingId,
    Healthcheck,
    Gc,
    ConfigStatus,
    PluginMetadatas,
    PluginMetadata,
    List(Kind),
    One(Kind),
    PluginsReload,
    Explain,
    Dashboard,
    DashboardStats,
    Certificates,
    CertificateRenew,
}

/// A resolved built-in endpoint with its captured parameters.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// `GET /v1/schema`.
    Schema,
    /// `GET /v1/openapi.json`.
    OpenApi,
    /// `GET /v1/healthcheck`.
    Healthchecks,
    /// `GET /v1/healthcheck/{src_type}` (no id).
    HealthMissingId(String),
    /// `GET /v1/healthcheck/{src_type}/{src_id}`.
    Healthcheck(String, String),
    /// `POST /v1/gc`.
    Gc,
    /// `GET /v1/config_status`.
    ConfigStatus,
    /// `GET /v1/plugin_metadatas`.
    PluginMetadatas,
    /// `GET /v1/plugin_metadata/{plugin_name}`.
    PluginMetadata(String),
    /// `GET /v1/routes|services|upstreams`.
    List(Kind),
    /// `GET /v1/route|service|upstream/{id}`.
    One(Kind, String),
    /// `PUT /v1/plugins/reload`.
    PluginsReload,
    /// `POST /v1/explain`.
    Explain,
    /// `GET /v1/dashboard` (and `GET /`).
    Dashboard,
    /// `GET /v1/dashboard/stats`.
    DashboardStats,
    /// `GET /v1/certificates`.
    Certificates,
    /// `POST /v1/certificates/{id}/renew`.
    CertificateRenew(String),
}

const GET: &[&str] = &["GET"];

/// Every built-in endpoint: `(path, what it serves, methods)`.
pub fn endpoints() -> impl Iterator<Item = (&'static str, Tag, &'static [&'static str])> {
    table().iter().copied()
}

fn table() -> &'static [(&'static str, Tag, &'static [&'static str])] {
    &[
        ("/v1/schema", Tag::Schema, GET),
        ("/v1/openapi.json", Tag::OpenApi, GET),
        ("/v1/healthcheck", Tag::Healthchecks, GET),
        ("/v1/healthcheck/{src_type}", Tag::HealthMissingId, GET),
        ("/v1/healthcheck/{src_type}/", Tag::HealthMissingId, GET),
        ("/v1/healthcheck/{src_type}/{src_id}", Tag::Healthcheck, GET),
        ("/v1/gc", Tag::Gc, &["POST"]),
        ("/v1/config_status", Tag::ConfigStatus, &["GET"]),
        ("/v1/plugin_metadatas", Tag::PluginMetadatas, GET),
        ("/v1/plugin_metadata/{plugin_name}", Tag::PluginMetadata, GET),
        ("/v1/routes", Tag::List(Kind::Route), GET),
        ("/v1/route/{id}", Tag::One(Kind::Route), GET),
        ("/v1/services", Tag::List(Kind::Service), GET),
        ("/v1/service/{id}", Tag::One(Kind::Service), GET),
        ("/v1/upstreams", Tag::List(Kind::Upstream), GET),
        ("/v1/upstream/{id}", Tag::One(Kind::Upstream), GET),
        ("/v1/plugins/reload", Tag::PluginsReload, &["PUT"]),
        ("/v1/explain", Tag::Explain, &["POST"]),
        ("/v1/dashboard", Tag::Dashboard, GET),
        ("/v1/dashboard/stats", Tag::DashboardStats, GET),
        ("/v1/certificates", Tag::Certificates, GET),
        ("/v1/certificates/{id}/renew", Tag::CertificateRenew, &["POST"]),
        ("/", Tag::Dashboard, GET),
    ]
}

fn router() -> &'static matchit::Router<(Tag, &'static [&'static str])> {
    static ROUTER: OnceLock<matchit::Router<(Tag, &'static [&'static str])>> = OnceLock::new();
    ROUTER.get_or_init(|| {
        let mut r = matchit::Router::new();
        for (path, tag, methods) in table() {
            if let Err(e) = r.insert(*path, (*tag, *methods)) {
                panic!("built-in control route {path}: {e}");
            }
        }
        r
    })
}

/// The built-in endpoint at `path`, with its allowed methods.
pub fn lookup(path: &str) -> Option<(Endpoint, &'static [&'static str])> {
    let m = router().at(path).ok()?;
    let p = |k: &str| m.params.get(k).unwrap_or_default().to_owned();
    let (tag, methods) = *m.value;
    let endpoint = match tag {
        Tag::Schema => Endpoint::Schema,
        Tag::OpenApi => Endpoint::OpenApi,
        Tag::Healthchecks => Endpoint::Healthchecks,
        Tag::HealthMissingId => Endpoint::HealthMissingId(p("src_type")),
        Tag::Healthcheck => Endpoint::Healthcheck(p("src_type"), p("src_id")),
        Tag::Gc => Endpoint::Gc,
        Tag::ConfigStatus => Endpoint::ConfigStatus,
        Tag::PluginMetadatas => Endpoint::PluginMetadatas,
        Tag::PluginMetadata => Endpoint::PluginMetadata(p("plugin_name")),
        Tag::List(k) => Endpoint::List(k),
        Tag::One(k) => Endpoint::One(k, p("id")),
        Tag::PluginsReload => Endpoint::PluginsReload,
        Tag::Explain => Endpoint::Explain,
        Tag::Dashboard => Endpoint::Dashboard,
        Tag::DashboardStats => Endpoint::DashboardStats,
        Tag::Certificates => Endpoint::Certificates,
        Tag::CertificateRenew => Endpoint::CertificateRenew(p("id")),
    };
    Some((endpoint, methods))
}

/// A concrete path matching a matchit `pattern` (parameters filled with `x`).
fn sample(pattern: &str) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                out.push('x');
            }
            c => out.push(c),
        }
    }
    out
}

/// The built-in endpoint a plugin route `pattern` would shadow or be shadowed by, if any.
pub fn shadowed_by(pattern: &str) -> Option<String> {
    if lookup(&sample(pattern)).is_some() {
        return Some(sample(pattern));
    }
    let mut alone = matchit::Router::new();
    alone.insert(pattern, ()).ok()?;
    table().iter().map(|(p, _, _)| sample(p)).find(|s| alone.at(s).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_and_shadowing() {
        assert_eq!(sample("/v1/route/{id}"), "/v1/route/x");
        assert_eq!(sample("/a/{{b}}"), "/a/{b}");
        assert!(shadowed_by("/v1/schema").is_some());
        assert!(shadowed_by("/v1/route/foo").is_some());
        assert!(shadowed_by("/v1/{*rest}").is_some());
        assert!(shadowed_by("/v1/plugin/example-plugin/hello").is_none());
    }

    #[test]
    fn healthcheck_paths() {
        assert!(matches!(lookup("/v1/healthcheck/routes"), Some((Endpoint::HealthMissingId(t), _)) if t == "routes"));
        assert!(matches!(lookup("/v1/healthcheck/routes/"), Some((Endpoint::HealthMissingId(_), _))));
        assert!(matches!(lookup("/v1/healthcheck/routes/1"), Some((Endpoint::Healthcheck(_, i), _)) if i == "1"));
        assert!(lookup("/v1/nothing").is_none());
    }
}
