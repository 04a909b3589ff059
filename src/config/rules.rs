//! The rules of config.yaml a schema cannot express: loopback-only control listener, port
//! conflicts between listeners, etcd TLS against its hosts, Admin API keys and addresses, and
//! plugin names (known, listed once, HTTP versus stream).

use std::net::SocketAddr;

use super::{Config, ConfigProvider, Listen, StreamListen, EXAMPLE_ADMIN_KEY};
use crate::plugins::Catalog;
use crate::validate::{did_you_mean, Issue};

impl Config {
    /// `deployment.etcd.tls` against the hosts it applies to.
    fn check_etcd_tls(&self, issues: &mut Vec<Issue>) {
        let etcd = &self.deployment.etcd;
        let Some(tls) = &etcd.tls else { return };
        if !tls.verify {
            issues.push(Issue::new(
                "deployment.etcd.tls.verify",
                "not verifying etcd's certificate would let anyone on the path serve this gateway's resources; give the CA that signs it in deployment.etcd.tls.ca instead",
            ));
        }
        if tls.cert.is_some() != tls.key.is_some() {
            let missing = if tls.cert.is_some() { "key" } else { "cert" };
            issues.push(Issue::new(
                format!("deployment.etcd.tls.{missing}"),
                "a client certificate needs both `cert` and `key`",
            ));
        }
        for (i, h) in etcd.host.iter().enumerate() {
            if !h.starts_with("https://") {
                issues.push(Issue::new(
                    format!("deployment.etcd.host[{i}]"),
                    format!("`{h}` is plain http but deployment.etcd.tls is set: use https:// endpoints"),
                ));
            }
        }
    }

    /// Rules the schema cannot express.
    pub(super) fn check(&self, catalog: &Catalog) -> Vec<Issue> {
        let mut issues = Vec::new();
        if let Some(log) = &self.gateway.access_log {
            if let Err(e) = crate::access_log::Format::parse(&log.format) {
                issues.push(Issue::new("gateway.access_log.format", e));
            }
        }
        for (i, server) in self.gateway.dns_resolver.iter().enumerate() {
            if let Err(e) = super::gateway::parse_dns_server(server) {
                issues.push(Issue::new(format!("gateway.dns_resolver[{i}]"), e));
            }
        }
        if self.gateway.dns_min_ttl > self.gateway.dns_max_ttl {
            issues.push(Issue::new(
                "gateway.dns_min_ttl",
                format!("{} is above gateway.dns_max_ttl ({})", self.gateway.dns_min_ttl, self.gateway.dns_max_ttl),
            ));
        }
        for (i, l) in self.gateway.node_listen.iter().enumerate() {
            if l.http3() || l.quic_retry() {
                let why = "HTTP/3 needs TLS: set enable_http3 on a gateway.ssl.listen entry";
                issues.push(Issue::new(format!("gateway.node_listen[{i}].enable_http3"), why));
            }
        }
        let control = &self.gateway.control;
        if !control.ip.is_loopback() {
            issues.push(Issue::new(
                "gateway.control.ip",
                format!(
                    "{} is not a loopback address; the control server may only listen on 127.0.0.0/8 or ::1",
                    control.ip
                ),
            ));
        }
        if self.gateway.enable_control && self.gateway.node_listen.iter().any(|l| l.addr().port() == control.port) {
            issues.push(Issue::new(
                "gateway.control.port",
                format!("control port {} conflicts with node_listen", control.port),
            ));
        }
        let ssl = &self.gateway.ssl;
        if self.gateway.enable_control && ssl.enable && ssl.listen.iter().any(|l| l.addr().port() == control.port) {
            issues.push(Issue::new(
                "gateway.control.port",
                format!("control port {} conflicts with gateway.ssl.listen", control.port),
            ));
        }
        if let Some(real) = &self.gateway.real_ip {
            for (i, a) in real.trusted_addresses.iter().enumerate() {
                if let Err(e) = weir_plugin::cidr::Cidr::parse(a) {
                    issues.push(Issue::new(format!("gateway.real_ip.trusted_addresses[{i}]"), e));
                }
            }
        }
        let pp = self.gateway.proxy_protocol.clone().unwrap_or_default();
        if pp.enable_tcp_pp && self.gateway.stream_proxy.as_ref().is_none_or(|s| s.tcp.is_empty()) {
            issues.push(Issue::new(
                "gateway.proxy_protocol.enable_tcp_pp",
                "there is no stream proxy TCP listener (gateway.stream_proxy.tcp) to expect PROXY headers on",
            ));
        }
        if pp.listen_https_port.is_some() && !ssl.enable {
            issues.push(Issue::new(
                "gateway.proxy_protocol.listen_https_port",
                "a TLS listener needs gateway.ssl.enable: true",
            ));
        }
        let pp_http: Vec<Listen> = pp.listen_http_port.map(Listen::Port).into_iter().collect();
        let pp_https: Vec<Listen> = pp.listen_https_port.map(Listen::Port).into_iter().collect();
        let mut seen = Vec::new();
        let ssl_listen = if ssl.enable { &ssl.listen[..] } else { &[] };
        let all = self.gateway.node_listen.iter().map(|l| ("gateway.node_listen", l)).enumerate();
        let all = all.chain(ssl_listen.iter().map(|l| ("gateway.ssl.listen", l)).enumerate());
        let all = all.chain(pp_http.iter().map(|l| ("gateway.proxy_protocol.listen_http_port", l)).enumerate());
        let all = all.chain(pp_https.iter().map(|l| ("gateway.proxy_protocol.listen_https_port", l)).enumerate());
        let all = all.map(|(i, (key, l))| (i, key, l.addr()));
        let tcp: &[StreamListen] = self.gateway.stream_proxy.as_ref().map_or(&[], |s| &s.tcp[..]);
        let all = all.chain(tcp.iter().enumerate().map(|(i, l)| (i, "gateway.stream_proxy.tcp", l.addr())));
        let all: Vec<(usize, &str, SocketAddr)> = all.collect();
        if self.gateway.enable_control && tcp.iter().any(|l| l.addr().port() == control.port) {
            issues.push(Issue::new(
                "gateway.control.port",
                format!("control port {} conflicts with gateway.stream_proxy.tcp", control.port),
            ));
        }
        let mut udp_seen: Vec<SocketAddr> = Vec::new();
        for (i, l) in self.gateway.stream_proxy.iter().flat_map(|s| s.udp.iter()).enumerate() {
            if udp_seen.contains(&l.addr()) {
                issues.push(Issue::new(
                    format!("gateway.stream_proxy.udp[{i}]"),
                    format!("{} is listed twice", l.addr()),
                ));
            }
            udp_seen.push(l.addr());
        }
        for (i, key, addr) in all {
            let clash = seen.iter().any(|s: &SocketAddr| {
                s.port() == addr.port() && (*s == addr || s.ip().is_unspecified() || addr.ip().is_unspecified())
            });
            if clash {
                let key =
                    if key.starts_with("gateway.proxy_protocol") { key.to_owned() } else { format!("{key}[{i}]") };
                issues.push(Issue::new(key, format!("{addr} is already a listener")));
            }
            seen.push(addr);
        }
        for (key, why) in self.gateway.proxy_cache.check() {
            issues.push(Issue::new(format!("gateway.proxy_cache.{key}"), why));
        }
        self.check_etcd_tls(&mut issues);
        let admin = &self.deployment.admin;
        if admin.enable_admin == Some(true) && self.deployment.config_provider == ConfigProvider::Yaml {
            issues.push(Issue::new(
                "deployment.admin.enable_admin",
                "the Admin API writes resources to etcd: it needs deployment.config_provider: etcd (with the yaml provider, edit conf/resources.yaml)",
            ));
        }
        if self.admin_enabled() {
            if admin.admin_key.is_empty() {
                issues.push(Issue::new(
                    "deployment.admin.admin_key",
                    "the Admin API needs at least one key (`{name, key, role: admin}`)",
                ));
            }
            for (i, k) in admin.admin_key.iter().enumerate() {
                if k.key.trim().is_empty() {
                    issues.push(Issue::new(
                        format!("deployment.admin.admin_key[{i}].key"),
                        "an admin key may not be empty",
                    ));
                } else if k.key == EXAMPLE_ADMIN_KEY && !admin.admin_listen.ip.is_loopback() {
                    issues.push(Issue::new(
                        format!("deployment.admin.admin_key[{i}].key"),
                        "this is the documented example key; choose your own before listening beyond loopback",
                    ));
                }
            }
            for (i, c) in admin.allow_admin.iter().enumerate() {
                if let Err(e) = weir_plugin::cidr::Cidr::parse(c) {
                    issues.push(Issue::new(format!("deployment.admin.allow_admin[{i}]"), e));
                }
            }
            let port = admin.admin_listen.port;
            let taken = self.gateway.node_listen.iter().any(|l| l.addr().port() == port)
                || (self.gateway.enable_control && control.port == port)
                || (ssl.enable && ssl.listen.iter().any(|l| l.addr().port() == port));
            if taken {
                issues.push(Issue::new(
                    "deployment.admin.admin_listen.port",
                    format!("port {port} is already a listener"),
                ));
            }
        }
        let names = catalog.names();
        if let Some(plugins) = &self.plugins {
            for (i, name) in plugins.iter().enumerate() {
                if catalog.get(name).is_none() {
                    let why = if catalog.stream_get(name).is_some() {
                        format!("`{name}` is a stream plugin: list it under `stream_plugins`")
                    } else {
                        unknown_plugin(name, &names)
                    };
                    issues.push(Issue::new(format!("plugins[{i}]"), why));
                } else if plugins[..i].contains(name) {
                    issues.push(Issue::new(format!("plugins[{i}]"), format!("plugin `{name}` is listed twice")));
                }
            }
        }
        let stream_names = catalog.stream_names();
        for (i, name) in self.stream_plugins.iter().flatten().enumerate() {
            let at = format!("stream_plugins[{i}]");
            if catalog.stream_get(name).is_some() {
                if self.stream_plugins.iter().flatten().take(i).any(|n| n == name) {
                    issues.push(Issue::new(at, format!("stream plugin `{name}` is listed twice")));
                }
            } else if catalog.get(name).is_some() {
                issues.push(Issue::new(at, format!("`{name}` is an HTTP plugin: list it under `plugins`")));
            } else if stream_names.is_empty() {
                issues
                    .push(Issue::new(at, format!("unknown stream plugin `{name}`: this build has no stream plugins")));
            } else {
                let why = match did_you_mean(name, &stream_names) {
                    Some(s) => format!("unknown stream plugin `{name}` (did you mean `{s}`?)"),
                    None => format!(
                        "unknown stream plugin `{name}`; compiled into this binary: {}",
                        stream_names.join(", ")
                    ),
                };
                issues.push(Issue::new(at, why));
            }
        }
        for (name, attr) in &self.plugin_attr {
            let path = format!("plugin_attr.{name}");
            match catalog.get(name) {
                None => issues.push(Issue::new(path, unknown_plugin(name, &names))),
                Some(entry) => match &entry.attr_schema {
                    None => issues.push(Issue::new(path, format!("plugin `{name}` takes no plugin_attr"))),
                    Some(schema) => {
                        if let Err(found) = schema.check(attr) {
                            issues.extend(found.into_iter().map(|i| i.under(&path)));
                        }
                    }
                },
            }
        }
        issues
    }
}

/// "unknown plugin" with a suggestion and the list of what is compiled in.
pub fn unknown_plugin(name: &str, known: &[String]) -> String {
    match did_you_mean(name, known) {
        Some(s) => format!("unknown plugin `{name}` (did you mean `{s}`?)"),
        None => format!("unknown plugin `{name}`; compiled into this binary: {}", known.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::path::Path;

    fn check(raw: Value) -> Result<Config, String> {
        Config::from_value(Path::new("conf/config.yaml"), &raw, &Catalog::empty()).map_err(|e| e.to_string())
    }

    #[test]
    fn non_loopback_control_ip_is_refused() {
        let e = check(json!({"gateway": {"control": {"ip": "0.0.0.0"}}})).unwrap_err();
        assert!(e.contains("gateway.control.ip: 0.0.0.0 is not a loopback address"), "{e}");
        assert!(check(json!({"gateway": {"control": {"ip": "127.0.0.2"}}})).is_ok());
        assert!(check(json!({"gateway": {"control": {"ip": "::1"}}})).is_ok());
    }

    #[test]
    fn control_port_conflicting_with_node_listen_is_refused() {
        let e = check(json!({"gateway": {"node_listen": [9080, {"ip": "127.0.0.1", "port": 9090}]}})).unwrap_err();
        assert!(e.contains("control port 9090 conflicts with node_listen"), "{e}");
        assert!(check(json!({"gateway": {"enable_control": false, "node_listen": [9090]}})).is_ok());
    }

    #[test]
    fn unknown_plugins_are_refused() {
        let e = check(json!({"plugins": ["nope"]})).unwrap_err();
        assert!(e.contains("plugins[0]: unknown plugin `nope`"), "{e}");
        let e = check(json!({"plugin_attr": {"nope": {}}})).unwrap_err();
        assert!(e.contains("plugin_attr.nope: unknown plugin"), "{e}");
        let e = check(json!({"stream_plugins": ["mqtt-proxy"]})).unwrap_err();
        assert!(e.contains("stream_plugins[0]"), "{e}");
    }

    #[test]
    fn admin_api_rules() {
        let e = check(json!({"deployment": {"admin": {"enable_admin": true}}})).unwrap_err();
        assert!(e.contains("deployment.admin.enable_admin: the Admin API writes resources to etcd"), "{e}");
        let e = check(json!({"deployment": {"config_provider": "etcd"}})).unwrap_err();
        assert!(e.contains("deployment.admin.admin_key: the Admin API needs at least one key"), "{e}");
        let key = |k: &str, ip: &str| {
            json!({"deployment": {"config_provider": "etcd", "admin": {
                "admin_listen": {"ip": ip, "port": 9180},
                "admin_key": [{"name": "a", "key": k, "role": "admin"}]}}})
        };
        assert!(check(key("s3cret", "127.0.0.1")).is_ok());
        assert!(check(key(EXAMPLE_ADMIN_KEY, "127.0.0.1")).is_ok());
        let e = check(key(EXAMPLE_ADMIN_KEY, "0.0.0.0")).unwrap_err();
        assert!(e.contains("admin_key[0].key: this is the documented example key"), "{e}");
        let e = check(key(" ", "127.0.0.1")).unwrap_err();
        assert!(e.contains("admin_key[0].key: an admin key may not be empty"), "{e}");
        // Without the Admin API the etcd provider needs no key.
        assert!(check(json!({"deployment": {"config_provider": "etcd", "admin": {"enable_admin": false}}})).is_ok());
    }
}
