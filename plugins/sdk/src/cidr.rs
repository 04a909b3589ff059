//! IP addresses and CIDR blocks (`remote_addrs` of routes, `remote_addr` of stream routes,
//! address lists of plugins), and [`CidrSet`]: a list of them matched without a scan.

use std::collections::HashSet;
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

/// A set of addresses and networks (an allow or deny list), built once: the networks are
/// grouped by prefix length, so a lookup costs one hash probe per distinct prefix length in the
/// list (at most 33 for IPv4, 129 for IPv6), not one comparison per entry. An IPv4-mapped IPv6
/// client (`::ffff:10.0.0.1`) matches the IPv4 entries too, as [`Cidr::contains`] does.
#[derive(Debug, Clone, Default)]
pub struct CidrSet {
    /// `(prefix length, masked networks)`, longest prefix first.
    v4: Vec<(u8, HashSet<u32>)>,
    v6: Vec<(u8, HashSet<u128>)>,
}

fn mask4(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix))
    }
}

fn mask6(prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(prefix))
    }
}

impl CidrSet {
    /// The set of `cidrs`.
    pub fn new(cidrs: impl IntoIterator<Item = Cidr>) -> CidrSet {
        let mut set = CidrSet::default();
        for c in cidrs {
            match c.addr {
                IpAddr::V4(a) => {
                    let net = u32::from(a) & mask4(c.prefix);
                    group(&mut set.v4, c.prefix).insert(net);
                }
                IpAddr::V6(a) => {
                    let net = u128::from(a) & mask6(c.prefix);
                    group(&mut set.v6, c.prefix).insert(net);
                }
            }
        }
        set.v4.sort_by_key(|g| std::cmp::Reverse(g.0));
        set.v6.sort_by_key(|g| std::cmp::Reverse(g.0));
        set
    }

    /// Parses every entry of `list` (`field` names the list in messages: `whitelist[2]: ...`).
    pub fn parse(list: &[String], field: &str) -> Result<CidrSet, String> {
        let mut cidrs = Vec::with_capacity(list.len());
        for (i, s) in list.iter().enumerate() {
            cidrs.push(Cidr::parse(s).map_err(|e| format!("{field}[{i}]: {e}"))?);
        }
        Ok(CidrSet::new(cidrs))
    }

    /// Whether the set has no entry.
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    /// Whether `ip` is one of the addresses or inside one of the networks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.contains_v4(u32::from(a)),
            IpAddr::V6(a) => {
                let bits = u128::from(a);
                self.v6.iter().any(|(p, nets)| nets.contains(&(bits & mask6(*p))))
                    || a.to_ipv4_mapped().is_some_and(|v4| self.contains_v4(u32::from(v4)))
            }
        }
    }

    fn contains_v4(&self, bits: u32) -> bool {
        self.v4.iter().any(|(p, nets)| nets.contains(&(bits & mask4(*p))))
    }
}

fn group<T>(groups: &mut Vec<(u8, HashSet<T>)>, prefix: u8) -> &mut HashSet<T> {
    let at = match groups.iter().position(|(p, _)| *p == prefix) {
        Some(at) => at,
        None => {
            groups.push((prefix, HashSet::new()));
            groups.len() - 1
        }
    };
    &mut groups[at].1
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

    #[test]
    fn a_set_matches_addresses_and_networks_of_both_families() {
        let list: Vec<String> = ["192.168.0.1/24", "10.1.2.3", "fd00::/8", "2001:db8::1", "0.0.0.0/32"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let set = CidrSet::parse(&list, "whitelist").unwrap_or_else(|e| panic!("{e}"));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap_or_else(|e| panic!("{s}: {e}"));
        assert!(set.contains(ip("192.168.0.200")), "host bits of the entry are masked");
        assert!(!set.contains(ip("192.168.1.1")));
        assert!(set.contains(ip("10.1.2.3")));
        assert!(!set.contains(ip("10.1.2.4")));
        assert!(set.contains(ip("fd12::1")));
        assert!(set.contains(ip("2001:db8::1")));
        assert!(!set.contains(ip("2001:db8::2")));
        assert!(set.contains(ip("::ffff:10.1.2.3")), "an IPv4-mapped client matches IPv4 entries");
        assert!(!set.contains(ip("::ffff:10.1.2.4")));
        let all = CidrSet::parse(&["0.0.0.0/0".to_string()], "x").unwrap_or_default();
        assert!(all.contains(ip("8.8.8.8")) && !all.contains(ip("::1")));
        assert_eq!(
            CidrSet::parse(&["1.2.3.4".to_string(), "1.2.3.4/40".to_string()], "blacklist").err().as_deref(),
            Some("blacklist[1]: `1.2.3.4/40`: prefix length must be 0-32")
        );
        assert!(CidrSet::default().is_empty() && !set.is_empty());
    }
}
