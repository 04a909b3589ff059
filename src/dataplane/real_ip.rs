//! `gateway.real_ip`: the client's address behind trusted proxies, decided once per request
//! before routing, so that route `remote_addrs`, `vars`, every plugin, the `X-Forwarded-For` sent
//! upstream, the access log and the metrics all see the same client. The decision itself is the
//! SDK's (`weir_plugin::client_ip`), shared with the `real-ip` plugin.

use std::net::{IpAddr, SocketAddr};

use http::header::{HeaderMap, HeaderName};
use weir_plugin::cidr::Cidr;
use weir_plugin::client_ip::{from_forwarded_for, is_trusted, parse_addr};

use crate::config::{RealIpHeader, RealIpSection};

/// The compiled setting.
pub struct RealIp {
    trusted: Vec<Cidr>,
    header: RealIpHeader,
    recursive: bool,
}

static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

impl RealIp {
    /// From the validated configuration (addresses that do not parse were refused at load).
    pub fn new(conf: &RealIpSection) -> Self {
        RealIp {
            trusted: conf.trusted_addresses.iter().filter_map(|a| Cidr::parse(a).ok()).collect(),
            header: conf.header,
            recursive: conf.recursive,
        }
    }

    /// The client's address when `peer` is trusted and its header names one; `None` keeps the
    /// peer. The peer's port stays (as nginx keeps `$remote_port` for a header without one).
    pub fn client(&self, peer: SocketAddr, headers: &HeaderMap) -> Option<SocketAddr> {
        if !is_trusted(&self.trusted, peer.ip()) {
            return None;
        }
        let ip: IpAddr = match self.header {
            RealIpHeader::XRealIp => parse_addr(headers.get(&X_REAL_IP)?.to_str().ok()?)?.0,
            RealIpHeader::XForwardedFor => {
                let values = headers.get_all(&X_FORWARDED_FOR).iter().filter_map(|v| v.to_str().ok());
                from_forwarded_for(values, &self.trusted, self.recursive)?
            }
        };
        Some(SocketAddr::new(ip, peer.port()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(header: RealIpHeader, recursive: bool) -> RealIp {
        RealIp::new(&RealIpSection { trusted_addresses: vec!["10.0.0.0/8".into()], header, recursive })
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn only_trusted_peers_name_the_client() {
        let proxy: SocketAddr = "10.1.2.3:5000".parse().unwrap_or_else(|e| panic!("{e}"));
        let stranger: SocketAddr = "198.51.100.9:5000".parse().unwrap_or_else(|e| panic!("{e}"));
        let real = conf(RealIpHeader::XRealIp, false);
        let h = headers(&[("x-real-ip", "203.0.113.7")]);
        assert_eq!(real.client(proxy, &h), Some("203.0.113.7:5000".parse().unwrap_or_else(|e| panic!("{e}"))));
        assert_eq!(real.client(stranger, &h), None, "a forged header from outside is ignored");
        assert_eq!(real.client(proxy, &headers(&[("x-real-ip", "nonsense")])), None);
        let xff = conf(RealIpHeader::XForwardedFor, true);
        let h = headers(&[("x-forwarded-for", "1.1.1.1, 203.0.113.7, 10.0.0.5")]);
        assert_eq!(xff.client(proxy, &h).map(|a| a.ip().to_string()).as_deref(), Some("203.0.113.7"));
        assert_eq!(xff.client(stranger, &h), None);
    }
}
