//! Server certificates: `ssls` resources compiled into a table of certified keys (part of the
//! resource snapshot; the listener's resolver, `dataplane::resolver`, looks names up in it).
//!
//! Selection (docs/data-plane.md): the exact SNI, then the longest wildcard suffix
//! (`*.example.com` answers any name ending in `.example.com`), then `gateway.ssl.fallback_sni`;
//! otherwise the handshake fails with a fatal alert. Among the certificates of one entry (an RSA
//! and an ECDSA one, say), the first whose key can sign with a scheme the client offers wins.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::tls::backend::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use crate::mtls::{ClientAuth, ClientIdentity};
use crate::resources::model::{Ssl, SslType};

/// Days before expiry from which loading a certificate logs a warning.
pub const EXPIRY_WARNING_DAYS: i64 = 14;

/// The certificates of one `ssls` entry.
#[derive(Debug)]
pub struct SslCerts {
    /// The entry's id.
    pub id: String,
    /// Certified keys, in the order the entry lists them (`cert` first, then `certs`).
    pub keys: Vec<Arc<CertifiedKey>>,
    /// Mutual TLS (`client`): how its clients authenticate.
    pub client: Option<Arc<ClientAuth>>,
}

impl SslCerts {
    /// The first certificate whose key can sign with one of `schemes`.
    pub fn choose(&self, schemes: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.keys.iter().find(|k| k.key.choose_scheme(schemes).is_some()).cloned()
    }
}

/// Every enabled certificate, by server name.
#[derive(Debug, Default, Clone)]
pub struct CertTable {
    exact: HashMap<String, Arc<SslCerts>>,
    /// `(".example.com", certs)`, longest suffix first.
    wildcards: Vec<(String, Arc<SslCerts>)>,
    /// Files the certificates were read from (watched with the resource file).
    pub files: Vec<PathBuf>,
    /// Whether some entry asks its clients for certificates (handshakes then read the SNI
    /// before choosing a configuration).
    pub client_auth: bool,
    /// `type: client` entries by id: certificates Weir presents to upstreams.
    pub identities: HashMap<String, Arc<ClientIdentity>>,
}

/// A problem with one `ssls` entry: `(key, reason)`.
pub type SslIssue = (String, String);

impl CertTable {
    /// Whether no certificate is loaded.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcards.is_empty()
    }

    /// Certificates for `sni` (lower-case): exact name, then the longest wildcard.
    pub fn find(&self, sni: &str) -> Option<&Arc<SslCerts>> {
        if let Some(c) = self.exact.get(sni) {
            return Some(c);
        }
        self.wildcards
            .iter()
            .find(|(suffix, _)| sni.len() > suffix.len() && sni.ends_with(suffix.as_str()))
            .map(|(_, c)| c)
    }

    /// The entry a request's Host (without port) belongs to, when it asks for client
    /// certificates: its id and rules.
    pub fn client_auth_for(&self, host: &str) -> Option<(&str, &ClientAuth)> {
        let entry = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            self.find(&host.to_ascii_lowercase())
        } else {
            self.find(host)
        }?;
        Some((entry.id.as_str(), entry.client.as_deref()?))
    }

    /// `(ssl id, server name, not_after)` of every served name's first certificate, sorted.
    pub fn expiries(&self) -> Vec<(String, String, i64)> {
        let not_after = |c: &SslCerts| {
            let leaf = c.keys.first()?.cert.first()?;
            let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
            Some(parsed.validity().not_after.timestamp())
        };
        let exact = self.exact.iter().map(|(n, c)| (n.clone(), c));
        let wild = self.wildcards.iter().map(|(suffix, c)| (format!("*{suffix}"), c));
        let mut out: Vec<_> = exact.chain(wild).filter_map(|(n, c)| Some((c.id.clone(), n, not_after(c)?))).collect();
        out.sort();
        out
    }

    /// Compiles `ssls` (`(owner, entry)` pairs); `base` resolves `cert_file` / `key_file`.
    /// Problems are returned per owner; disabled entries are validated but not served.
    pub fn build<O: std::fmt::Display>(ssls: &[(O, Arc<Ssl>)], base: &Path) -> (CertTable, Vec<(String, SslIssue)>) {
        let mut table = CertTable::default();
        let mut issues = Vec::new();
        // (The claiming entry's name is made only for the message of a conflict.)
        let mut claimed: HashMap<String, &O> = HashMap::new();
        for (owner, ssl) in ssls {
            let mut problem = |key: &str, why: String| issues.push((owner.to_string(), (key.to_owned(), why)));
            if ssl.kind == Some(SslType::Client) {
                if let Some(identity) = client_identity(ssl, base, &mut problem) {
                    table.identities.insert(ssl.id.0.clone(), Arc::new(identity));
                }
                continue;
            }
            let client = match ssl.client.as_ref().map(ClientAuth::build) {
                None => None,
                Some(Ok(auth)) => Some(Arc::new(auth)),
                Some(Err((key, why))) => {
                    problem(&key, why);
                    continue;
                }
            };
            let snis = match (&ssl.snis, &ssl.sni) {
                (Some(_), Some(_)) => {
                    problem("sni", "`sni` and `snis` are mutually exclusive".into());
                    continue;
                }
                (Some(list), None) => list.clone(),
                (None, Some(one)) => vec![one.clone()],
                (None, None) => {
                    problem("snis", "an ssl needs `snis` (or `sni`)".into());
                    continue;
                }
            };
            let mut names = Vec::with_capacity(snis.len());
            for (i, sni) in snis.iter().enumerate() {
                match check_sni(sni) {
                    Ok(n) => names.push(n),
                    Err(e) => problem(&format!("snis[{i}]"), e),
                }
            }
            let mut keys = Vec::new();
            let main = match (&ssl.cert, &ssl.key, &ssl.cert_file, &ssl.key_file) {
                _ if ssl.acme.is_some() => {
                    if ssl.cert.is_some() || ssl.key.is_some() || ssl.cert_file.is_some() || ssl.key_file.is_some() {
                        problem(
                            "acme",
                            "`acme` orders the certificate: no `cert`, `key`, `cert_file` or `key_file`".into(),
                        );
                    }
                    // Issued and stored by the ACME task (`acme`); until then the names are not served.
                    let (cf, kf) = crate::acme::files(&base.join("data"), &ssl.id.0);
                    table.files.push(cf.clone());
                    table.files.push(kf.clone());
                    if let (Ok(c), Ok(k)) = (read_pem(&cf), read_pem(&kf)) {
                        match certified_key(&c, &k) {
                            Ok(key) => keys.push(key),
                            Err(e) => log::warn!("ssls[{}]: the stored ACME certificate is not served: {e}", ssl.id),
                        }
                    }
                    None
                }
                (Some(c), Some(k), None, None) => Some((c.clone(), k.clone(), "cert")),
                (None, None, Some(cf), Some(kf)) => {
                    let (cp, kp) = (base.join(cf), base.join(kf));
                    table.files.push(cp.clone());
                    table.files.push(kp.clone());
                    match (read_pem(&cp), read_pem(&kp)) {
                        (Ok(c), Ok(k)) => Some((c, k, "cert_file")),
                        (Err(e), _) => {
                            problem("cert_file", e);
                            None
                        }
                        (_, Err(e)) => {
                            problem("key_file", e);
                            None
                        }
                    }
                }
                _ => {
                    problem("cert", "an ssl needs `cert` and `key` (PEM text) or `cert_file` and `key_file`".into());
                    None
                }
            };
            if ssl.certs.len() != ssl.keys.len() {
                problem(
                    "keys",
                    format!("{} certs but {} keys: they pair up in order", ssl.certs.len(), ssl.keys.len()),
                );
            }
            let extra = ssl.certs.iter().zip(&ssl.keys).enumerate().map(|(i, (c, k))| (c.clone(), k.clone(), i));
            if let Some((cert, key, at)) = main {
                match certified_key(&cert, &key) {
                    Ok(k) => keys.push(k),
                    Err(e) => problem(at, e),
                }
            }
            for (cert, key, i) in extra {
                match certified_key(&cert, &key) {
                    Ok(k) => keys.push(k),
                    Err(e) => problem(&format!("certs[{i}]"), e),
                }
            }
            if keys.is_empty() || ssl.status == 0 {
                continue;
            }
            table.client_auth |= client.is_some();
            let certs = Arc::new(SslCerts { id: ssl.id.0.clone(), keys, client });
            for (i, name) in names.into_iter().enumerate() {
                if let Some(other) = claimed.get(&name) {
                    problem(&format!("snis[{i}]"), format!("`{name}` is already claimed by {other}"));
                    continue;
                }
                claimed.insert(name.clone(), owner);
                match name.strip_prefix('*') {
                    Some(suffix) => table.wildcards.push((suffix.to_owned(), certs.clone())),
                    None => {
                        table.exact.insert(name, certs.clone());
                    }
                }
            }
        }
        table.wildcards.sort_by_key(|w| std::cmp::Reverse(w.0.len()));
        (table, issues)
    }
}

/// The certificate and key of a `type: client` entry (`cert`/`key`, or the files).
fn client_identity(ssl: &Ssl, base: &Path, problem: &mut impl FnMut(&str, String)) -> Option<ClientIdentity> {
    if ssl.client.is_some() {
        problem("client", "`client` (mutual TLS towards clients) belongs on a `server` entry".into());
    }
    let (cert, key) = match (&ssl.cert, &ssl.key, &ssl.cert_file, &ssl.key_file) {
        (Some(c), Some(k), None, None) => (c.clone(), k.clone()),
        (None, None, Some(cf), Some(kf)) => match (read_pem(&base.join(cf)), read_pem(&base.join(kf))) {
            (Ok(c), Ok(k)) => (c, k),
            (Err(e), _) => {
                problem("cert_file", e);
                return None;
            }
            (_, Err(e)) => {
                problem("key_file", e);
                return None;
            }
        },
        _ => {
            problem("cert", "a client ssl needs `cert` and `key` (PEM text) or `cert_file` and `key_file`".into());
            return None;
        }
    };
    ClientIdentity::from_pem(&cert, &key).map_err(|e| problem("cert", e)).ok()
}

/// Largest PEM file read for `cert_file` / `key_file`.
const MAX_PEM_FILE: u64 = 1 << 20;

/// Reads a PEM file: a regular file (never a device or FIFO that could block or never end) of
/// at most [`MAX_PEM_FILE`] bytes.
fn read_pem(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{shown} is not a regular file"));
    }
    if meta.len() > MAX_PEM_FILE {
        return Err(format!("{shown} is larger than {MAX_PEM_FILE} bytes"));
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {shown}: {e}"))
}

/// A valid server name (lower-cased): DNS labels of letters, digits and hyphens, optionally
/// behind a leading `*.`.
pub fn check_sni(sni: &str) -> Result<String, String> {
    let name = sni.to_ascii_lowercase();
    let host = name.strip_prefix("*.").unwrap_or(&name);
    let ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !ok || host.parse::<std::net::IpAddr>().is_ok() {
        return Err(format!("`{sni}` is not a host name (letters, digits, hyphens and dots; `*.` only in front)"));
    }
    Ok(name)
}

/// Parses a PEM chain and key, checks they belong together and the dates.
fn certified_key(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the certificate is not valid PEM: {e}"))?;
    let Some(leaf) = chain.first() else {
        return Err("no certificate found in the PEM text".into());
    };
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| format!("the key is not a PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"))?;
    check_dates(leaf)?;
    let signing = any_supported_type(&key).map_err(|e| format!("unsupported private key: {e}"))?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) => Ok(Arc::new(certified)),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err("the key does not match the certificate".into())
        }
        Err(e) => Err(format!("the certificate cannot be used: {e}")),
    }
}

/// Refuses an expired certificate; warns when it expires within [`EXPIRY_WARNING_DAYS`].
fn check_dates(leaf: &CertificateDer<'_>) -> Result<(), String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| format!("the certificate cannot be parsed: {e}"))?;
    let validity = parsed.validity();
    let now = chrono::Utc::now().timestamp();
    let not_after = validity.not_after.timestamp();
    let date = |t: i64| {
        chrono::DateTime::from_timestamp(t, 0)
            .map_or_else(|| t.to_string(), |d| d.format("%Y-%m-%d %H:%M:%S UTC").to_string())
    };
    if not_after < now {
        return Err(format!("the certificate expired on {}", date(not_after)));
    }
    if not_after - now < EXPIRY_WARNING_DAYS * 86_400 {
        let subject = parsed.subject().to_string();
        log::warn!("certificate `{subject}` expires on {}", date(not_after));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_are_checked() {
        assert_eq!(check_sni("API.example.com"), Ok("api.example.com".into()));
        assert_eq!(check_sni("*.example.com"), Ok("*.example.com".into()));
        for bad in ["", "*", "a..b", "-a.com", "a_b.com", "a.*.com", "127.0.0.1", "a b", "*example.com"] {
            assert!(check_sni(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn lookup_prefers_exact_then_longest_wildcard() {
        let c = |id: &str| Arc::new(SslCerts { id: id.into(), keys: Vec::new(), client: None });
        let mut t = CertTable::default();
        t.exact.insert("api.example.com".into(), c("exact"));
        t.wildcards = vec![(".api.example.com".into(), c("long")), (".example.com".into(), c("short"))];
        assert_eq!(t.find("api.example.com").map(|c| c.id.as_str()), Some("exact"));
        assert_eq!(t.find("v1.api.example.com").map(|c| c.id.as_str()), Some("long"));
        assert_eq!(t.find("www.example.com").map(|c| c.id.as_str()), Some("short"));
        assert_eq!(t.find("example.com").map(|c| c.id.as_str()), None);
        assert_eq!(t.find("evilexample.com").map(|c| c.id.as_str()), None);
    }
}
