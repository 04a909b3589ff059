//! Stream routes compiled for matching: which route takes a TCP connection or UDP session.
//!
//! A connection is matched on the listener address and port it arrived on, the client address
//! and, on TLS listeners, the SNI. Among matching routes the most specific wins: an exact SNI,
//! then the longest wildcard SNI, then the longest client prefix, then a set `server_addr`, then
//! a set `server_port`; ties go to the route defined first. Stream routes are few, so matching is
//! a scan over routes sorted by specificity once per snapshot.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use weir_plugin::cidr::Cidr;
use weir_plugin::StreamInstance;

use crate::plugins::StreamEntry;
use crate::resources::model::StreamRoute;
use crate::tables::upstream::CompiledUpstream;

/// A stream plugin configuration bound to its runtime instance.
#[derive(Clone)]
pub struct BoundStreamPlugin {
    /// The plugin.
    pub entry: Arc<StreamEntry>,
    /// The instance built from the configuration.
    pub instance: Arc<dyn StreamInstance>,
}

/// Stream plugins of one route, in priority order.
pub type StreamChain = Arc<[BoundStreamPlugin]>;

/// How a route matches the SNI.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SniMatch {
    Exact(String),
    /// `.example.com` for `*.example.com`.
    Suffix(String),
}

/// Why a stream route does not take a connection (the first of its filters that refuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamReject {
    /// The listener address is not `server_addr`.
    ServerAddr,
    /// The listener port is not `server_port`.
    ServerPort,
    /// The client is not in `remote_addr`.
    RemoteAddr,
    /// The SNI (or its absence) does not match `sni`.
    Sni,
}

impl StreamReject {
    /// The route field that refused.
    pub fn field(self) -> &'static str {
        match self {
            StreamReject::ServerAddr => "server_addr",
            StreamReject::ServerPort => "server_port",
            StreamReject::RemoteAddr => "remote_addr",
            StreamReject::Sni => "sni",
        }
    }
}

/// A stream route ready for matching.
pub struct CompiledStreamRoute {
    /// The route as configured.
    pub route: Arc<StreamRoute>,
    /// Its id.
    pub id: Arc<str>,
    /// Where connections go.
    pub upstream: Option<Arc<CompiledUpstream>>,
    /// Its stream plugins.
    pub plugins: StreamChain,
    server_addr: Option<IpAddr>,
    server_port: Option<u16>,
    remote: Option<Cidr>,
    sni: Option<SniMatch>,
    order: usize,
}

impl CompiledStreamRoute {
    /// Compiles a validated route (malformed addresses were refused by the snapshot builder).
    pub fn new(
        route: Arc<StreamRoute>,
        upstream: Option<Arc<CompiledUpstream>>,
        plugins: StreamChain,
        order: usize,
    ) -> Self {
        let sni = route.sni.as_deref().map(|s| {
            let s = s.to_ascii_lowercase();
            match s.strip_prefix('*') {
                Some(suffix) => SniMatch::Suffix(suffix.to_owned()),
                None => SniMatch::Exact(s),
            }
        });
        CompiledStreamRoute {
            id: Arc::from(route.id.0.as_str()),
            server_addr: route.server_addr.as_deref().and_then(|a| a.parse().ok()),
            server_port: route.server_port,
            remote: route.remote_addr.as_deref().and_then(|a| Cidr::parse(a).ok()),
            sni,
            upstream,
            plugins,
            order,
            route,
        }
    }

    /// Why the route does not take a connection, in the order checked (`None`: it does). The one
    /// check both the stream proxy ([`StreamTable::find`]) and `POST /v1/explain` make.
    #[inline]
    fn refuses(&self, local: SocketAddr, remote: IpAddr, sni: Option<&str>) -> Option<StreamReject> {
        if self.server_addr.is_some_and(|a| a != local.ip()) {
            Some(StreamReject::ServerAddr)
        } else if self.server_port.is_some_and(|p| p != local.port()) {
            Some(StreamReject::ServerPort)
        } else if self.remote.is_some_and(|c| !c.contains(remote)) {
            Some(StreamReject::RemoteAddr)
        } else if !match (&self.sni, sni) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(SniMatch::Exact(e)), Some(s)) => e == s,
            (Some(SniMatch::Suffix(suffix)), Some(s)) => s.len() > suffix.len() && s.ends_with(suffix.as_str()),
        } {
            Some(StreamReject::Sni)
        } else {
            None
        }
    }

    /// Higher is more specific (compared as a tuple).
    fn specificity(&self) -> (usize, u8, bool, bool) {
        let sni = match &self.sni {
            None => 0,
            Some(SniMatch::Suffix(s)) => 1 + s.len(),
            Some(SniMatch::Exact(_)) => usize::MAX,
        };
        (sni, self.remote.map_or(0, |c| c.prefix_len() + 1), self.server_addr.is_some(), self.server_port.is_some())
    }
}

/// Every stream route of a snapshot, most specific first.
#[derive(Default, Clone)]
pub struct StreamTable {
    routes: Vec<Arc<CompiledStreamRoute>>,
}

impl StreamTable {
    /// Orders `routes` for matching.
    pub fn new(routes: Vec<CompiledStreamRoute>) -> Self {
        let mut routes: Vec<Arc<CompiledStreamRoute>> = routes.into_iter().map(Arc::new).collect();
        routes.sort_by(|a, b| b.specificity().cmp(&a.specificity()).then(a.order.cmp(&b.order)));
        StreamTable { routes }
    }

    /// The route for a connection on `local` from `remote` asking for `sni` (lower-case).
    pub fn find(&self, local: SocketAddr, remote: IpAddr, sni: Option<&str>) -> Option<&Arc<CompiledStreamRoute>> {
        self.routes.iter().find(|r| r.refuses(local, remote, sni).is_none())
    }

    /// Every stream route in the order [`StreamTable::find`] tries them (most specific first),
    /// with why each refuses the connection; the first that does not is the one chosen.
    pub fn explain(
        &self,
        local: SocketAddr,
        remote: IpAddr,
        sni: Option<&str>,
    ) -> Vec<(&Arc<CompiledStreamRoute>, Option<StreamReject>)> {
        self.routes.iter().map(|r| (r, r.refuses(local, remote, sni))).collect()
    }

    /// Whether no stream route is loaded.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::model::Id;

    fn route(id: &str, f: impl FnOnce(&mut StreamRoute)) -> CompiledStreamRoute {
        let mut r: StreamRoute = match serde_json::from_value(serde_json::json!({"id": id})) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        };
        r.id = Id(id.into());
        f(&mut r);
        CompiledStreamRoute::new(Arc::new(r), None, Arc::from([]), 0)
    }

    #[test]
    fn most_specific_route_wins() {
        let table = StreamTable::new(vec![
            route("any", |_| {}),
            route("port", |r| r.server_port = Some(9100)),
            route("lan", |r| r.remote_addr = Some("10.0.0.0/8".into())),
            route("host", |r| r.remote_addr = Some("10.1.2.3".into())),
            route("wild", |r| r.sni = Some("*.example.com".into())),
            route("exact", |r| r.sni = Some("db.example.com".into())),
        ]);
        let local: SocketAddr = ([127, 0, 0, 1], 9100).into();
        let find =
            |remote: [u8; 4], sni: Option<&str>| table.find(local, IpAddr::from(remote), sni).map(|r| r.id.to_string());
        assert_eq!(find([192, 168, 0, 1], None).as_deref(), Some("port"));
        assert_eq!(find([10, 9, 9, 9], None).as_deref(), Some("lan"));
        assert_eq!(find([10, 1, 2, 3], None).as_deref(), Some("host"));
        assert_eq!(find([10, 1, 2, 3], Some("x.example.com")).as_deref(), Some("wild"));
        assert_eq!(find([10, 1, 2, 3], Some("db.example.com")).as_deref(), Some("exact"));
        let other: SocketAddr = ([127, 0, 0, 1], 9101).into();
        assert_eq!(
            table.find(other, IpAddr::from([1, 1, 1, 1]), None).map(|r| r.id.to_string()).as_deref(),
            Some("any")
        );
    }
}
