//! The TLS listeners' certificate resolver: on every handshake, the certificate the current
//! resource snapshot's [`CertTable`](crate::tables::certs::CertTable) has for the client's SNI (exact,
//! longest wildcard, then `gateway.ssl.fallback_sni`). Reading the snapshot per handshake is what
//! makes a changed certificate apply to the next handshake after the reload that carried it;
//! open connections keep the certificate they were established with.

use std::sync::{Arc, Weak};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::state::Gateway;

/// The ALPN protocol of ACME's TLS-ALPN-01 challenge.
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// Resolves certificates from the current snapshot's [`CertTable`](crate::tables::certs::CertTable).
pub struct SniResolver {
    gateway: Weak<Gateway>,
    fallback: Option<String>,
}

impl SniResolver {
    /// A resolver reading `gateway`'s resources; `fallback` is `gateway.ssl.fallback_sni`.
    pub fn new(gateway: &Arc<Gateway>, fallback: Option<String>) -> Self {
        SniResolver { gateway: Arc::downgrade(gateway), fallback: fallback.map(|f| f.to_ascii_lowercase()) }
    }
}

impl std::fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SniResolver").field("fallback", &self.fallback).finish()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // An ACME CA checking a TLS-ALPN-01 challenge (RFC 8737): its challenge certificate.
        if hello.alpn().is_some_and(|mut protocols| protocols.any(|p| p == ACME_TLS_ALPN)) {
            return hello.server_name().and_then(crate::acme::alpn_certificate);
        }
        let gateway = self.gateway.upgrade()?;
        let snap = gateway.resources.load();
        let table = &snap.certs;
        // rustls hands over the SNI lower-cased and without a trailing dot.
        let found = hello.server_name().and_then(|sni| table.find(sni));
        let found = found.or_else(|| self.fallback.as_deref().and_then(|f| table.find(f)));
        match found {
            Some(certs) => certs.choose(hello.signature_schemes()),
            None => {
                log::debug!("TLS handshake refused: no certificate for SNI {:?}", hello.server_name());
                None
            }
        }
    }
}
