//! `ip-restriction`: lets a client through, or refuses it, by its address. One name, as in
//! APISIX, for two plugins sharing one configuration and one compiled list ([`Rule`]): the HTTP
//! plugin ([`http`], access phase, answers `{"message": ...}` with `response_code`) and the
//! stream plugin ([`stream`], closes the connection before any upstream is contacted).
//!
//! APISIX's fields: `whitelist` or `blacklist` (exactly one), each a list of IPs and CIDRs;
//! `message` and `response_code` for HTTP (accepted and unused on stream routes, as in APISIX).

pub mod http;
pub mod stream;

use std::net::IpAddr;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::cidr::CidrSet;

/// Route configuration, HTTP and stream alike.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Only these clients get through.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub whitelist: Option<Vec<String>>,
    /// These clients are refused.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub blacklist: Option<Vec<String>>,
    /// `{"message": ...}` of a refused HTTP request.
    #[serde(default = "default_message")]
    #[schemars(length(min = 1, max = 1024))]
    pub message: String,
    /// Status of a refused HTTP request.
    #[serde(default = "default_code")]
    #[schemars(range(min = 403, max = 404))]
    pub response_code: u16,
}

fn default_message() -> String {
    "Your IP address is not allowed".into()
}

fn default_code() -> u16 {
    403
}

/// A compiled whitelist or blacklist: the one matcher of both plugins.
#[derive(Debug)]
pub struct Rule {
    set: CidrSet,
    allow: bool,
}

impl Rule {
    /// Compiles the list of `conf`; exactly one of `whitelist` and `blacklist` is required, and
    /// an entry that is not an IP or CIDR is refused with its place (`whitelist[1]: ...`).
    pub fn new(conf: &Conf) -> Result<Rule, String> {
        match (&conf.whitelist, &conf.blacklist) {
            (Some(w), None) => Ok(Rule { set: CidrSet::parse(w, "whitelist")?, allow: true }),
            (None, Some(b)) => Ok(Rule { set: CidrSet::parse(b, "blacklist")?, allow: false }),
            _ => Err("exactly one of `whitelist` and `blacklist` is required".into()),
        }
    }

    /// Whether a client at `ip` is refused.
    pub fn refuses(&self, ip: IpAddr) -> bool {
        self.set.contains(ip) != self.allow
    }

    /// Which list refused a client, for log lines.
    pub fn reason(&self) -> &'static str {
        if self.allow {
            "is not in the whitelist"
        } else {
            "is in the blacklist"
        }
    }
}

weir_plugin::register_plugin!(http::IpRestriction);
weir_plugin::register_stream_plugin!(stream::IpRestriction);

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(v: serde_json::Value) -> Conf {
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn one_list_exactly() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap_or_else(|e| panic!("{e}"));
        let allow =
            Rule::new(&conf(serde_json::json!({"whitelist": ["10.0.0.0/8"]}))).unwrap_or_else(|e| panic!("{e}"));
        assert!(!allow.refuses(ip("10.1.1.1")) && allow.refuses(ip("11.1.1.1")));
        let deny = Rule::new(&conf(serde_json::json!({"blacklist": ["10.0.0.0/8"]}))).unwrap_or_else(|e| panic!("{e}"));
        assert!(deny.refuses(ip("10.1.1.1")) && !deny.refuses(ip("11.1.1.1")));
        assert!(Rule::new(&conf(serde_json::json!({}))).is_err());
        assert!(Rule::new(&conf(serde_json::json!({"whitelist": ["1.1.1.1"], "blacklist": ["2.2.2.2"]}))).is_err());
        assert_eq!(
            Rule::new(&conf(serde_json::json!({"whitelist": ["1.1.1.1", "localhost"]}))).err().as_deref(),
            Some("whitelist[1]: `localhost` is not an IP address or CIDR")
        );
    }
}
