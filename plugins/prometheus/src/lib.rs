//! `prometheus`: request metrics in Prometheus' text format, served on a listener of its own
//! (`plugin_attr.prometheus.export_addr`, default 127.0.0.1:9091, at `export_uri`).
//!
//! Enabled on a route, a service or a global rule, its `log` hook counts each request in
//! APISIX's families (`http_status`, `http_latency`, `bandwidth`), labelled with the matched
//! route's id, URI and host patterns, the service, the consumer and the upstream node, never
//! with the raw path. The scrape adds what the host and other plugins register through
//! `weir_plugin::metrics` (connections, requests, upstream health, node info, short-url).
//!
//! Recording takes no lock: each worker thread counts into series of its own (`record`),
//! registered once in a shared list that the scrape merges.

mod phases;
mod series;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::metrics::{render_sources, Exposition};
use weir_plugin::{
    parse_conf, register_plugin, schema_of, BuildContext, ControlEndpoint, ControlResponse, InitEnv, Late, Plugin,
    PluginInstance, PluginListener, RequestCtx, Value,
};

/// `plugin_attr.prometheus`.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Attr {
    /// Where the exporter listens.
    #[serde(default)]
    pub export_addr: ExportAddr,
    /// The path metrics are served at.
    #[serde(default = "default_uri")]
    #[schemars(regex(pattern = r"^/"), length(max = 256))]
    pub export_uri: String,
    /// Prefix of every metric family name; `apisix_` makes APISIX's dashboards work unchanged.
    #[serde(default = "default_prefix")]
    #[schemars(regex(pattern = r"^([a-zA-Z_:][a-zA-Z0-9_:]*)?$"), length(max = 64))]
    pub metric_prefix: String,
    /// Upper bounds of the latency histogram's buckets, in milliseconds, ascending.
    #[serde(default = "default_buckets")]
    #[schemars(length(min = 1, max = 64))]
    pub default_buckets: Vec<f64>,
    /// Time every plugin phase of every request into `plugin_latency{plugin, phase}` (a
    /// histogram in milliseconds). Off by default: then nothing is timed.
    #[serde(default)]
    pub plugin_latency: bool,
}

/// `plugin_attr.prometheus.export_addr`.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExportAddr {
    /// Address.
    #[serde(default = "default_ip")]
    pub ip: IpAddr,
    /// Port.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
}

impl Default for ExportAddr {
    fn default() -> Self {
        ExportAddr { ip: default_ip(), port: default_port() }
    }
}

impl Default for Attr {
    fn default() -> Self {
        Attr {
            export_addr: ExportAddr::default(),
            export_uri: default_uri(),
            metric_prefix: default_prefix(),
            default_buckets: default_buckets(),
            plugin_latency: false,
        }
    }
}

fn default_ip() -> IpAddr {
    IpAddr::from([127, 0, 0, 1])
}
fn default_port() -> u16 {
    9091
}
fn default_uri() -> String {
    "/weir/prometheus/metrics".into()
}
fn default_prefix() -> String {
    "weir_".into()
}
/// APISIX's default latency buckets (ms).
fn default_buckets() -> Vec<f64> {
    vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 30000.0, 60000.0]
}

/// Route configuration: nothing to set.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {}

/// The settings in force (`init`).
static ATTR: Mutex<Option<Attr>> = Mutex::new(None);

fn attr() -> Attr {
    ATTR.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default()
}

/// The plugin.
pub struct Prometheus;

struct Instance;

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::LOG
    }
    fn log(&self, ctx: &RequestCtx) {
        series::record(ctx);
    }
}

/// The whole scrape: request metrics, then every registered source.
pub fn render() -> String {
    let attr = attr();
    let mut e = Exposition::new(&attr.metric_prefix);
    series::write(&mut e);
    phases::write(&mut e);
    render_sources(&mut e);
    e.into_text()
}

impl Plugin for Prometheus {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "prometheus"
    }
    fn priority(&self) -> i32 {
        500
    }
    fn version(&self) -> f64 {
        0.2
    }
    fn attr_schema(&self) -> Option<Value> {
        Some(schema_of::<Attr>())
    }
    fn init(&self, attr: Option<&Value>, env: &InitEnv) -> Result<(), String> {
        let attr: Attr = match attr {
            Some(v) => parse_conf(v)?,
            None => Attr::default(),
        };
        if attr.default_buckets.windows(2).any(|w| w[0] >= w[1])
            || attr.default_buckets.iter().any(|b| !b.is_finite() || *b <= 0.0)
        {
            return Err("default_buckets: must be positive and strictly ascending".into());
        }
        let mut current = ATTR.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = current.as_ref() {
            if old.export_addr != attr.export_addr || old.export_uri != attr.export_uri {
                log::warn!("plugin_attr.prometheus: export_addr and export_uri apply at the next restart");
            }
        }
        series::set_buckets(&attr.default_buckets);
        if !env.check_only {
            weir_plugin::measure::set_latency_recorder(phases::record);
            weir_plugin::measure::set_always(weir_plugin::measure::FOR_LATENCY, attr.plugin_latency);
        }
        *current = Some(attr);
        Ok(())
    }
    fn listener(&self, attr: Option<&Value>) -> Option<PluginListener> {
        let attr: Attr = attr.and_then(|v| parse_conf(v).ok()).unwrap_or_default();
        let endpoint = ControlEndpoint::sync(&["GET"], &[attr.export_uri.as_str()], |_| ControlResponse {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            headers: Vec::new(),
            body: render().into(),
        });
        Some(PluginListener {
            addr: SocketAddr::new(attr.export_addr.ip, attr.export_addr.port),
            key: "plugin_attr.prometheus.export_addr".into(),
            endpoints: vec![endpoint],
        })
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let _ = conf;
        Ok(Arc::new(Instance))
    }
}

register_plugin!(Prometheus);
