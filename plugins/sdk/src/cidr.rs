//! IP addresses and CIDR blocks (`remote_addrs` of routes, `remote_addr` of stream routes,
//! address lists of plugins).

use std::net::IpAddr;

/// An IP network: address and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `1.2.3.4`, `10.0.0.0/8`, `::1` or `fd00::/8`.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (ip, prefix) = match s.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = ip.parse().map_err(|_| format!("`{s}` is not an IP address or CIDR"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("`{s}`: prefix length must be 0-{max}")),
            },
        };
        Ok(Cidr { addr, prefix })
    }

    /// The prefix length (32 or 128 for a single address): how specific the network is.
    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is inside this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match (self.addr, ip) {
            (IpAddr::V4(_), IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => return false,
            },
            (_, ip) => ip,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(self.prefix)) };
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = if self.prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(self.prefix)) };
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_matches() {
        let c = Cidr::parse("10.0.0.0/8").unwrap_or_else(|e| panic!("{e}"));
        assert!(c.contains("10.2.3.4".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))));
        assert!(!c.contains(IpAddr::from([11, 0, 0, 1])));
        assert!(Cidr::parse("1.2.3.4/33").is_err());
        assert!(Cidr::parse("nope").is_err());
        let one = Cidr::parse("127.0.0.1").unwrap_or_else(|e| panic!("{e}"));
        assert!(one.contains(IpAddr::from([127, 0, 0, 1])));
        assert!(Cidr::parse("::/0")
            .map(|c| c.contains("::1".parse().unwrap_or(IpAddr::from([0u8; 16]))))
            .unwrap_or(false));
    }
}
