//! The client's real address behind trusted proxies, with nginx's realip semantics: shared by
//! the gateway-wide `gateway.real_ip` setting and the `real-ip` plugin, so that both decide the
//! same way.
//!
//! A header is believed only when the peer that sent it is trusted. From `X-Forwarded-For`
//! (every field line, in order), the non-recursive choice is the last address (the one the
//! trusted peer added); the recursive one walks from the right past every trusted address and
//! takes the first untrusted one (or the leftmost, when all are trusted). A value that is not an
//! IP address (`unknown`, a host name, garbage) met on the walk makes nothing believed (nginx
//! declines such a header too).
//!
//! ```
//! use weir_plugin::cidr::Cidr;
//! use weir_plugin::client_ip::from_forwarded_for;
//! let trusted = [Cidr::parse("10.0.0.0/8").expect("cidr")];
//! let real = from_forwarded_for(["203.0.113.7, 10.0.0.2"].into_iter(), &trusted, true);
//! assert_eq!(real, Some("203.0.113.7".parse().expect("ip")));
//! let forged = from_forwarded_for(["1.1.1.1, 203.0.113.7"].into_iter(), &trusted, true);
//! assert_eq!(forged, Some("203.0.113.7".parse().expect("ip")), "a client cannot push itself further left");
//! ```

use std::net::{IpAddr, SocketAddr};

use crate::cidr::Cidr;

/// Whether `ip` is inside one of `trusted`.
pub fn is_trusted(trusted: &[Cidr], ip: IpAddr) -> bool {
    trusted.iter().any(|c| c.contains(ip))
}

/// An address as proxies write it: `1.2.3.4`, `1.2.3.4:80`, `::1`, `[::1]` or `[::1]:80`
/// (surrounding spaces allowed). The port, when one is given, comes back too.
pub fn parse_addr(s: &str) -> Option<(IpAddr, Option<u16>)> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some((ip, None));
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some((sa.ip(), Some(sa.port())));
    }
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<IpAddr>().ok().map(|ip| (ip, None))
}

/// The client address `X-Forwarded-For` names, given its field values in order (see the module
/// documentation). `None` when no usable address is there.
pub fn from_forwarded_for<'a>(
    values: impl Iterator<Item = &'a str>,
    trusted: &[Cidr],
    recursive: bool,
) -> Option<IpAddr> {
    // Few proxies per request: the fields on the stack, most of the time.
    let mut items: smallvec_lite::Items<'a> = smallvec_lite::Items::default();
    for v in values {
        for item in v.split(',') {
            let item = item.trim();
            if !item.is_empty() {
                items.push(item);
            }
        }
    }
    let list = items.as_slice();
    if !recursive {
        return parse_addr(list.last()?).map(|(ip, _)| ip);
    }
    let mut chosen = None;
    for item in list.iter().rev() {
        let (ip, _) = parse_addr(item)?;
        chosen = Some(ip);
        if !is_trusted(trusted, ip) {
            break;
        }
    }
    chosen
}

/// A list that keeps its first eight items inline (the usual proxy chain) and spills over to the
/// heap beyond.
mod smallvec_lite {
    #[derive(Default)]
    pub struct Items<'a> {
        inline: [&'a str; 8],
        len: usize,
        spill: Vec<&'a str>,
    }

    impl<'a> Items<'a> {
        pub fn push(&mut self, s: &'a str) {
            if self.len < self.inline.len() && self.spill.is_empty() {
                self.inline[self.len] = s;
                self.len += 1;
            } else {
                if self.spill.is_empty() {
                    self.spill.extend_from_slice(&self.inline[..self.len]);
                }
                self.spill.push(s);
            }
        }
        pub fn as_slice(&self) -> &[&'a str] {
            if self.spill.is_empty() {
                &self.inline[..self.len]
            } else {
                &self.spill
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn forwarded_for_as_nginx_realip_reads_it() {
        let trusted = [Cidr::parse("10.0.0.0/8").unwrap_or_else(|e| panic!("{e}"))];
        let pick = |v: &[&str], r| from_forwarded_for(v.iter().copied(), &trusted, r);
        assert_eq!(pick(&["1.1.1.1, 2.2.2.2"], false), Some(ip("2.2.2.2")), "not recursive: the last");
        assert_eq!(pick(&["1.1.1.1, 2.2.2.2, 10.0.0.9"], true), Some(ip("2.2.2.2")));
        assert_eq!(pick(&["1.1.1.1", "10.1.1.1"], true), Some(ip("1.1.1.1")), "several field lines");
        assert_eq!(pick(&["10.0.0.1, 10.0.0.2"], true), Some(ip("10.0.0.1")), "all trusted: the leftmost");
        assert_eq!(pick(&["junk, 10.0.0.2"], true), None, "garbage: nothing is believed, as nginx declines");
        assert_eq!(pick(&["1.1.1.1, junk"], true), None);
        assert_eq!(pick(&[""], false), None);
        assert_eq!(pick(&["[2001:db8::1]:443"], false), Some(ip("2001:db8::1")));
        let long: Vec<String> = (0..20).map(|i| format!("10.0.0.{i}")).collect();
        let long: Vec<&str> = long.iter().map(String::as_str).collect();
        assert_eq!(pick(&long, true), Some(ip("10.0.0.0")), "past the inline capacity");
    }

    #[test]
    fn addresses_with_and_without_ports() {
        assert_eq!(parse_addr(" 1.2.3.4 "), Some((ip("1.2.3.4"), None)));
        assert_eq!(parse_addr("1.2.3.4:80"), Some((ip("1.2.3.4"), Some(80))));
        assert_eq!(parse_addr("[::1]"), Some((ip("::1"), None)));
        assert_eq!(parse_addr("[::1]:8080"), Some((ip("::1"), Some(8080))));
        assert_eq!(parse_addr("example.com"), None);
    }
}
