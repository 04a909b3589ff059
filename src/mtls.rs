//! Mutual TLS: client certificates Weir asks for on the TLS listener (`ssls[].client`, per server
//! name: the CA, the chain depth, the paths served without one), what a verified certificate tells
//! the request (subject and SHA-1 fingerprint, nginx's `$ssl_client_*`), and the certificates
//! Weir presents to upstreams (`upstream.tls.client_cert`, or `client_cert_id`).

use std::sync::{Arc, OnceLock};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme};
use weir_plugin::ClientCert;

use crate::resources::model::SslClient;

/// How the clients of one `ssls` entry authenticate.
pub struct ClientAuth {
    /// Checks the chain against `ca` (and its depth).
    pub verifier: Arc<dyn ClientCertVerifier>,
    /// Paths served without a certificate (with any, the certificate is optional at the
    /// handshake and required by each request whose path none of them matches).
    pub skip: Vec<regex::Regex>,
    /// The listener configurations that ask for this entry's client certificates (HTTP/1.1
    /// only, and with `h2`), built on the first handshake that needs each.
    pub configs: [OnceLock<Arc<ServerConfig>>; 2],
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientAuth").field("skip", &self.skip.len()).finish()
    }
}

impl ClientAuth {
    /// Compiles `ssls[].client`; errors are `(key, reason)`.
    pub fn build(client: &SslClient) -> Result<ClientAuth, (String, String)> {
        let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(client.ca.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| ("client.ca".to_owned(), format!("not valid PEM: {e}")))?;
        if cas.is_empty() {
            return Err(("client.ca".into(), "no certificate found in the PEM text".into()));
        }
        let mut roots = RootCertStore::empty();
        for (i, ca) in cas.iter().enumerate() {
            roots.add(ca.clone()).map_err(|e| ("client.ca".to_owned(), format!("certificate {i}: {e}")))?;
        }
        let mut skip = Vec::with_capacity(client.skip_mtls_uri_regex.len());
        for (i, re) in client.skip_mtls_uri_regex.iter().enumerate() {
            let compiled =
                regex::Regex::new(re).map_err(|e| (format!("client.skip_mtls_uri_regex[{i}]"), e.to_string()))?;
            skip.push(compiled);
        }
        let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), crate::tls::provider());
        let builder = if skip.is_empty() { builder } else { builder.allow_unauthenticated() };
        let inner = builder.build().map_err(|e| ("client.ca".to_owned(), e.to_string()))?;
        let verifier = Arc::new(DepthLimited { inner, cas, depth: usize::from(client.depth) });
        Ok(ClientAuth { verifier, skip, configs: [OnceLock::new(), OnceLock::new()] })
    }

    /// Whether a request for `path` (normalized) may go on without a client certificate.
    pub fn skips(&self, path: &str) -> bool {
        self.skip.iter().any(|re| re.is_match(path))
    }
}

/// WebPKI verification, plus nginx's `ssl_verify_depth`: at most `depth` CA certificates above
/// the client's, counting the intermediates the client sends (a copy of a trusted CA among them
/// is not counted) and the trusted CA itself.
#[derive(Debug)]
struct DepthLimited {
    inner: Arc<dyn ClientCertVerifier>,
    cas: Vec<CertificateDer<'static>>,
    depth: usize,
}

impl ClientCertVerifier for DepthLimited {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let above = intermediates.iter().filter(|c| !self.cas.iter().any(|ca| ca.as_ref() == c.as_ref())).count();
        if above + 1 > self.depth {
            return Err(rustls::Error::General(format!(
                "client certificate chain has {above} intermediate(s); depth {} allows {}",
                self.depth,
                self.depth - 1
            )));
        }
        self.inner.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// What a verified client certificate tells requests: its subject (RFC 2253, as nginx's
/// `$ssl_client_s_dn`) and SHA-1 fingerprint (hex, `$ssl_client_fingerprint`).
pub fn client_cert(leaf: &CertificateDer<'_>) -> ClientCert {
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, leaf.as_ref());
    let mut fingerprint = String::with_capacity(40);
    for b in digest.as_ref() {
        use std::fmt::Write;
        let _ = write!(fingerprint, "{b:02x}");
    }
    let subject = match x509_parser::parse_x509_certificate(leaf.as_ref()) {
        Ok((_, cert)) => rfc2253(cert.subject()),
        Err(_) => String::new(),
    };
    ClientCert { subject: Arc::from(subject), fingerprint: Arc::from(fingerprint) }
}

/// A distinguished name as RFC 2253 writes it: the last RDN first, `,` between RDNs, `+` within
/// one, short attribute names (CN, O, OU, C, L, ST...) or the dotted OID, and special characters
/// escaped with `\`.
pub fn rfc2253(name: &x509_parser::x509::X509Name<'_>) -> String {
    let mut out = String::new();
    for (i, rdn) in name.iter_rdn().collect::<Vec<_>>().into_iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, atv) in rdn.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            let oid = atv.attr_type();
            let short = x509_parser::objects::oid2abbrev(oid, x509_parser::objects::oid_registry());
            match short {
                Ok(s) => out.push_str(s),
                Err(_) => out.push_str(&oid.to_id_string()),
            }
            out.push('=');
            let value = atv.as_str().unwrap_or("");
            for (k, c) in value.chars().enumerate() {
                let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';' | '=')
                    || (k == 0 && (c == ' ' || c == '#'))
                    || (k + 1 == value.chars().count() && c == ' ');
                if special {
                    out.push('\\');
                }
                out.push(c);
            }
        }
    }
    out
}

/// A connection whose server name wants client certificates: what it presented, under which
/// entry.
#[derive(Debug)]
pub struct ConnAuth {
    /// The verified certificate (none: the entry's `skip_mtls_uri_regex` let the client in
    /// without one).
    pub cert: Option<Arc<ClientCert>>,
    /// The id of the `ssls` entry whose CA verified it.
    pub entry: Arc<str>,
    /// That entry's rules.
    pub auth: Arc<ClientAuth>,
}

/// Whether a request on an HTTPS connection may go on, by its normalized path and the entry
/// its Host belongs to (`host_entry`: that entry's id and rules, when it asks for client
/// certificates): `None`, or the status and reason to refuse it with. A certificate verified
/// for one server name does not open another one's routes (a client may name any Host after the
/// handshake).
pub fn refusal(
    conn: Option<&ConnAuth>,
    host_entry: Option<(&str, &ClientAuth)>,
    path: &str,
) -> Option<(http::StatusCode, &'static str)> {
    const REQUIRED: (http::StatusCode, &str) = (http::StatusCode::BAD_REQUEST, "a client certificate is required");
    if let Some(c) = conn {
        if c.cert.is_none() && !c.auth.skips(path) {
            return Some(REQUIRED);
        }
    }
    let (id, auth) = host_entry?;
    let presented = conn.and_then(|c| c.cert.as_ref().map(|_| &*c.entry));
    if presented == Some(id) || auth.skips(path) {
        return None;
    }
    match presented {
        Some(_) => {
            Some((http::StatusCode::MISDIRECTED_REQUEST, "the client certificate was verified for another host"))
        }
        None => Some(REQUIRED),
    }
}

/// A client certificate and key Weir presents to upstreams.
#[derive(Debug, PartialEq)]
pub struct ClientIdentity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl ClientIdentity {
    /// Parses a PEM chain and key (checked to belong together).
    pub fn from_pem(cert: &str, key: &str) -> Result<ClientIdentity, String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("the client certificate is not valid PEM: {e}"))?;
        if chain.is_empty() {
            return Err("no certificate found in the client certificate's PEM text".into());
        }
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
            .map_err(|e| format!("the client key is not a PEM private key: {e}"))?;
        let identity = ClientIdentity { chain, key };
        identity.client_config(true, false)?;
        Ok(identity)
    }

    /// A client configuration presenting this identity (`verify`: the upstream's certificate).
    pub fn client_config(&self, verify: bool, h2: bool) -> Result<rustls::ClientConfig, String> {
        let mut config = crate::tls::client_config_with(verify, Some((self.chain.clone(), self.key.clone_key())))?;
        config.alpn_protocols = vec![if h2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn subjects_are_written_the_rfc_2253_way() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("{e}"));
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CountryName, "DE");
        dn.push(rcgen::DnType::OrganizationName, "Acme, Inc.");
        dn.push(rcgen::DnType::CommonName, "client=1");
        params.distinguished_name = dn;
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let cert = params.self_signed(&key).unwrap_or_else(|e| panic!("{e}"));
        let info = super::client_cert(cert.der());
        assert_eq!(&*info.subject, r"CN=client\=1,O=Acme\, Inc.,C=DE");
        assert_eq!(info.fingerprint.len(), 40);
        assert!(info.fingerprint.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }
}
