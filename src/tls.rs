//! TLS as a client (rustls), for the data plane's upstream connections and the health checkers'
//! https probes: system root certificates, verification on by default, and an explicit opt-out
//! (`upstream.tls.verify: false`) that still checks handshake signatures but not the certificate
//! chain or name. Also the one crypto provider every TLS user shares.

use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The crypto backend of every TLS user (listeners, upstreams, ACME, session tickets): ring.
/// With the `aws-lc` feature, X25519 key exchange comes from aws-lc-rs ([`base_provider`]).
pub use rustls::crypto::ring as backend;

/// The [`backend`]'s provider; with the `aws-lc` feature its X25519 is aws-lc-rs', which
/// computes it in about half ring's time. The rest stays ring's: aws-lc-rs as the whole provider
/// spent more CPU per full handshake than ring with aws-lc-rs' X25519 alone (docs/data-plane.md,
/// TLS termination).
pub fn base_provider() -> CryptoProvider {
    #[allow(unused_mut)] // changed only with the `aws-lc` feature
    let mut provider = backend::default_provider();
    #[cfg(feature = "aws-lc")]
    for group in &mut provider.kx_groups {
        if group.name() == rustls::NamedGroup::X25519 {
            *group = rustls::crypto::aws_lc_rs::kx_group::X25519;
        }
    }
    provider
}

/// The [`base_provider`], shared by upstream and listener TLS.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER.get_or_init(|| Arc::new(base_provider())).clone()
}

/// The TLS listeners' provider: the [`base_provider`], with the AES-128-GCM suites first. A
/// listener picks by this order, not the client's (`ignore_client_order`), except for a client
/// that lists ChaCha20-Poly1305 first ([`prefers_chacha`]: one without AES hardware), which gets
/// its own order; BoringSSL and Go choose among AES-GCM suites and honour such clients the same
/// way. Why: most clients (OpenSSL, curl, wrk) list AES-256-GCM-SHA384 first, and its key
/// schedule runs SHA-384, which ring and aws-lc compute without SIMD on AMD CPUs: 11-15 % of a
/// full handshake's CPU on this machine, where SHA-256 uses the CPU's SHA extensions
/// (docs/data-plane.md, TLS termination).
pub fn listener_provider() -> Arc<CryptoProvider> {
    listener_suites().clone()
}

/// [`listener_provider`], borrowed (no reference count taken per handshake).
fn listener_suites() -> &'static Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER.get_or_init(|| {
        use rustls::CipherSuite as S;
        let mut provider = base_provider();
        let aes128 = |s: &rustls::SupportedCipherSuite| {
            matches!(
                s.suite(),
                S::TLS13_AES_128_GCM_SHA256
                    | S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                    | S::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
            )
        };
        // Stable: the other suites keep the backend's order.
        provider.cipher_suites.sort_by_key(|s| !aes128(s));
        Arc::new(provider)
    })
}

/// Whether a ClientHello's cipher suites put ChaCha20-Poly1305 before any AES suite this side
/// supports (GREASE and unknown values skipped): a client without AES hardware says so.
pub fn prefers_chacha(suites: &[rustls::CipherSuite]) -> bool {
    use rustls::CipherSuite as S;
    let provider = listener_suites();
    let first = suites.iter().find(|s| provider.cipher_suites.iter().any(|ours| ours.suite() == **s));
    matches!(
        first,
        Some(
            S::TLS13_CHACHA20_POLY1305_SHA256
                | S::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
                | S::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        )
    )
}

/// Makes the [`base_provider`] rustls' process-wide default, for TLS users that build their
/// configuration without naming a provider (tonic's etcd client): with the `aws-lc` feature
/// both providers are built in, and rustls would otherwise refuse to guess (a panic).
pub fn install_default_provider() {
    let _ = base_provider().install_default();
}

/// The system's root certificates, loaded once.
fn roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let mut store = RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                log::warn!("loading system root certificates: {e}");
            }
            let (added, ignored) = store.add_parsable_certificates(found.certs);
            log::debug!("upstream TLS: {added} root certificates ({ignored} unusable)");
            Arc::new(store)
        })
        .clone()
}

/// Client configuration trusting the system's roots and `extra` (verification on): for the
/// ACME directory, with `gateway.ssl.ssl_trusted_certificate`.
pub fn client_config_trusting(extra: &[CertificateDer<'static>]) -> Result<ClientConfig, String> {
    let mut store = RootCertStore::clone(&roots());
    for (i, ca) in extra.iter().enumerate() {
        store.add(ca.clone()).map_err(|e| format!("trusted certificate {i}: {e}"))?;
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("protocol versions: {e}"))?;
    Ok(builder.with_root_certificates(store).with_no_client_auth())
}

/// Client configuration for upstream connections.
pub fn client_config(verify: bool) -> ClientConfig {
    match client_config_with(verify, None) {
        Ok(c) => c,
        // Without a client certificate only the protocol versions could fail, and the ring
        // provider supports the default ones.
        Err(e) => panic!("rustls client configuration: {e}"),
    }
}

/// Client configuration for upstream connections, presenting `identity` (a certificate chain
/// and its key) when the upstream asks for one.
pub fn client_config_with(
    verify: bool,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<ClientConfig, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("protocol versions: {e}"))?;
    // ALPN stays empty: the connector sets it from the enabled HTTP versions.
    let builder = if verify {
        builder.with_root_certificates(roots())
    } else {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(NoChainCheck(provider())))
    };
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((chain, key)) => builder.with_client_auth_cert(chain, key).map_err(|e| format!("client certificate: {e}")),
    }
}

/// Accepts any certificate chain, but still verifies handshake signatures.
#[derive(Debug)]
struct NoChainCheck(Arc<CryptoProvider>);

impl ServerCertVerifier for NoChainCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use rustls::CipherSuite as S;

    #[test]
    fn a_client_prefers_chacha20_when_it_lists_it_before_any_aes_suite() {
        let grease = S::Unknown(0x0a0a);
        assert!(super::prefers_chacha(&[grease, S::TLS13_CHACHA20_POLY1305_SHA256, S::TLS13_AES_128_GCM_SHA256]));
        assert!(!super::prefers_chacha(&[grease, S::TLS13_AES_256_GCM_SHA384, S::TLS13_CHACHA20_POLY1305_SHA256]));
        assert!(super::prefers_chacha(&[S::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256]));
        assert!(!super::prefers_chacha(&[]));
    }

    #[test]
    fn x25519_comes_first_and_from_the_chosen_crypto() {
        use rustls::crypto::SupportedKxGroup;
        use rustls::NamedGroup;
        let provider = super::base_provider();
        assert_eq!(provider.kx_groups.first().map(|g| g.name()), Some(NamedGroup::X25519));
        #[cfg(feature = "aws-lc")]
        let want: &dyn SupportedKxGroup = rustls::crypto::aws_lc_rs::kx_group::X25519;
        #[cfg(not(feature = "aws-lc"))]
        let want: &dyn SupportedKxGroup = rustls::crypto::ring::kx_group::X25519;
        assert!(std::ptr::addr_eq(provider.kx_groups[0], want));
        // Everything else is ring's, with either build.
        let ring = rustls::crypto::ring::default_provider();
        assert_eq!(provider.cipher_suites.len(), ring.cipher_suites.len());
        assert!(provider
            .kx_groups
            .iter()
            .skip(1)
            .zip(ring.kx_groups.iter().skip(1))
            .all(|(a, b)| std::ptr::addr_eq(*a, *b)));
    }
}
