//! Certificates ordered from an ACME CA (RFC 8555, with the `instant-acme` client) for `ssls`
//! entries that have `acme` instead of a certificate.
//!
//! One task per entry, on the `acme` thread: it reads the entry's stored certificate
//! (`data/acme/<ssl id>/cert.pem`, `key.pem`, mode 0600), sleeps until two thirds of *its*
//! lifetime have passed (or a renewal is asked for: `POST /v1/certificates/{id}/renew`), orders a
//! new one, stores it and rebuilds the resources (the certificate table reads the stored files).
//! A failed order keeps the certificate in use, logs the CA's problem document, and is retried
//! after 1, 2, 4... minutes (at most 6 hours). Challenges are answered by the data plane:
//! HTTP-01 at `/.well-known/acme-challenge/<token>` on every plain listener ([`http_answer`]),
//! TLS-ALPN-01 on the TLS listener to a ClientHello offering `acme-tls/1` ([`alpn_certificate`]).
//! With the etcd provider the instances share all of this through etcd ([`fleet`]): one orders,
//! every one serves and answers the CA.

pub mod fleet;
mod http;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};

/// What `start` needs from config.yaml and the prefix.
pub struct Settings {
    /// The prefix's `data/` directory.
    pub data_dir: PathBuf,
    /// `gateway.acme`.
    pub defaults: SslAcme,
    /// `gateway.ssl.ssl_trusted_certificate`, resolved against the prefix.
    pub trusted: Option<PathBuf>,
    /// With the etcd provider: where the fleet shares its ACME state.
    pub fleet: Option<fleet::Settings>,
}
use std::time::Duration;

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, ExternalAccountKey, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use parking_lot::{Mutex, RwLock};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;

use crate::resources::model::{AcmeChallenge, Ssl, SslAcme};

/// What a certificate entry's ACME side is doing, for `/v1/certificates` and the log.
#[derive(Debug, Clone, Default, serde::Serialize, schemars::JsonSchema)]
pub struct Status {
    /// When the stored certificate expires (Unix seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_after: Option<i64>,
    /// When it is renewed next (Unix seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renew_at: Option<i64>,
    /// Why the last order failed (cleared by the next success).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Orders that succeeded since the process started.
    pub issued: u64,
}

struct Entry {
    conf: Resolved,
    renew: Arc<tokio::sync::Notify>,
    /// Another instance of the fleet stored a certificate for this entry.
    stored: Arc<tokio::sync::Notify>,
    status: Arc<Mutex<Status>>,
    task: tokio::task::AbortHandle,
}

/// An entry's `acme` with `gateway.acme`'s defaults applied.
#[derive(Debug, Clone, PartialEq)]
struct Resolved {
    id: String,
    domains: Vec<String>,
    email: Option<String>,
    directory_url: String,
    challenge: AcmeChallenge,
    eab: Option<(String, String)>,
}

/// An account: the directory and the contact.
type AccountKey = (String, Option<String>);

/// The process's ACME side.
pub struct Manager {
    dir: PathBuf,
    defaults: SslAcme,
    tls: Arc<rustls::ClientConfig>,
    on_issued: Box<dyn Fn() + Send + Sync>,
    runtime: tokio::runtime::Handle,
    entries: Mutex<HashMap<String, Entry>>,
    accounts: tokio::sync::Mutex<HashMap<AccountKey, Arc<Account>>>,
    http_tokens: RwLock<HashMap<String, String>>,
    alpn: RwLock<HashMap<String, Arc<CertifiedKey>>>,
    fleet: Option<fleet::Fleet>,
}

static MANAGER: OnceLock<Arc<Manager>> = OnceLock::new();
/// Set while some HTTP-01 challenge is open: the data plane looks only then.
static HTTP_OPEN: AtomicBool = AtomicBool::new(false);

/// Where an entry's certificate and key are stored, under the prefix's `data/`.
pub fn files(data_dir: &Path, id: &str) -> (PathBuf, PathBuf) {
    let dir = data_dir.join("acme").join(sanitize(id));
    (dir.join("cert.pem"), dir.join("key.pem"))
}

fn sanitize(id: &str) -> String {
    id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// Starts the ACME thread (once per process); `on_issued` runs after a certificate is stored (the
/// gateway rebuilds its resources, whose certificate table reads the stored files). The entries'
/// tasks start with [`sync`].
pub fn start(settings: Settings, on_issued: impl Fn() + Send + Sync + 'static) -> Result<(), String> {
    let extra = match &settings.trusted {
        None => Vec::new(),
        Some(path) => CertificateDer::pem_file_iter(path)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("gateway.ssl.ssl_trusted_certificate: {}: {e}", path.display()))?,
    };
    let tls = Arc::new(crate::tls::client_config_trusting(&extra).map_err(|e| format!("gateway.ssl: {e}"))?);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("acme".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return log::error!("ACME: no runtime: {e}"),
            };
            let _ = tx.send(runtime.handle().clone());
            runtime.block_on(std::future::pending::<()>());
        })
        .map_err(|e| format!("cannot start the ACME thread: {e}"))?;
    let runtime = rx.recv().map_err(|_| "the ACME thread did not start".to_owned())?;
    let manager = Arc::new(Manager {
        dir: settings.data_dir,
        defaults: settings.defaults,
        tls,
        on_issued: Box::new(on_issued),
        runtime,
        entries: Mutex::new(HashMap::new()),
        accounts: tokio::sync::Mutex::new(HashMap::new()),
        http_tokens: RwLock::new(HashMap::new()),
        alpn: RwLock::new(HashMap::new()),
        fleet: settings.fleet.map(fleet::Fleet::new),
    });
    if manager.fleet.is_some() {
        manager.runtime.spawn(fleet::follow(Arc::downgrade(&manager)));
    }
    let _ = MANAGER.set(manager);
    Ok(())
}

/// Brings the ACME tasks in line with `ssls` (after every publish).
pub fn sync(ssls: &[Arc<Ssl>]) {
    if let Some(m) = MANAGER.get() {
        m.sync(ssls);
    }
}

/// The key authorization for an HTTP-01 request path, while that challenge is open.
pub fn http_answer(path: &str) -> Option<String> {
    if !HTTP_OPEN.load(Ordering::Relaxed) {
        return None;
    }
    let token = path.strip_prefix("/.well-known/acme-challenge/")?;
    MANAGER.get()?.http_tokens.read().get(token).cloned()
}

/// The TLS-ALPN-01 certificate for `sni`, while that challenge is open.
pub fn alpn_certificate(sni: &str) -> Option<Arc<CertifiedKey>> {
    MANAGER.get()?.alpn.read().get(sni).cloned()
}

/// Every ACME entry's status, by id.
pub fn statuses() -> Vec<(String, Status)> {
    let Some(m) = MANAGER.get() else { return Vec::new() };
    let mut all: Vec<_> = m.entries.lock().iter().map(|(id, e)| (id.clone(), e.status.lock().clone())).collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

/// Asks for `id`'s certificate to be ordered now; `false` when no ACME entry has that id.
pub fn renew(id: &str) -> bool {
    let Some(m) = MANAGER.get() else { return false };
    match m.entries.lock().get(id) {
        Some(e) => {
            e.renew.notify_one();
            true
        }
        None => false,
    }
}

impl Manager {
    fn resolve(&self, ssl: &Ssl, acme: &SslAcme) -> Result<Resolved, String> {
        let d = &self.defaults;
        let domains = match (&acme.domains, &d.domains, &ssl.snis, &ssl.sni) {
            (own, _, _, _) if !own.is_empty() => own.clone(),
            (_, _, Some(snis), _) => snis.clone(),
            (_, _, None, Some(sni)) => vec![sni.clone()],
            _ => return Err("acme: no `domains` and no `snis`".into()),
        };
        let directory_url = acme
            .directory_url
            .clone()
            .or_else(|| d.directory_url.clone())
            .ok_or("acme: no `directory_url` (here or in gateway.acme)")?;
        let eab = acme.eab.clone().or_else(|| d.eab.clone()).map(|e| (e.kid, e.hmac_key));
        Ok(Resolved {
            id: ssl.id.0.clone(),
            domains: domains.into_iter().map(|d| d.to_ascii_lowercase()).collect(),
            email: acme.email.clone().or_else(|| d.email.clone()),
            directory_url,
            challenge: acme.challenge.or(d.challenge).unwrap_or(AcmeChallenge::Http01),
            eab,
        })
    }

    fn sync(self: &Arc<Self>, ssls: &[Arc<Ssl>]) {
        let mut wanted = HashMap::new();
        for ssl in ssls.iter().filter(|s| s.status == 1) {
            let Some(acme) = &ssl.acme else { continue };
            match self.resolve(ssl, acme) {
                Ok(r) => {
                    wanted.insert(r.id.clone(), r);
                }
                Err(e) => log::error!("ssls[{}]: {e}", ssl.id),
            }
        }
        let mut entries = self.entries.lock();
        entries.retain(|id, e| {
            let keep = wanted.get(id).is_some_and(|w| *w == e.conf);
            if !keep {
                e.task.abort();
            }
            keep
        });
        for (id, conf) in wanted {
            if entries.contains_key(&id) {
                continue;
            }
            let renew = Arc::new(tokio::sync::Notify::new());
            let stored = Arc::new(tokio::sync::Notify::new());
            let status = Arc::new(Mutex::new(Status::default()));
            let wake = Wake { renew: renew.clone(), stored: stored.clone() };
            let task = self.runtime.spawn(keep_fresh(Arc::downgrade(self), conf.clone(), wake, status.clone()));
            entries.insert(id, Entry { conf, renew, stored, status, task: task.abort_handle() });
        }
    }

    async fn account(&self, conf: &Resolved) -> Result<Arc<Account>, String> {
        let key = (conf.directory_url.clone(), conf.email.clone());
        let mut accounts = self.accounts.lock().await;
        if let Some(a) = accounts.get(&key) {
            return Ok(a.clone());
        }
        let name = format!("{:016x}", fnv64(format!("{}|{}", key.0, key.1.as_deref().unwrap_or("")).as_bytes()));
        let file = self.dir.join("acme").join("accounts").join(format!("{name}.json"));
        let builder = || Account::builder_with_http(Box::new(http::Https { tls: self.tls.clone() }));
        let stored = match &self.fleet {
            Some(f) => f.account(&name).await?,
            None => std::fs::read(&file).ok().and_then(|b| serde_json::from_slice::<AccountCredentials>(&b).ok()),
        };
        let account = match stored {
            Some(creds) => builder().from_credentials(creds).await.map_err(|e| problem(&e))?,
            None => {
                let contact = conf.email.as_ref().map(|e| format!("mailto:{e}"));
                let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
                let new = NewAccount { contact: &contacts, terms_of_service_agreed: true, only_return_existing: false };
                let eab = match &conf.eab {
                    None => None,
                    Some((kid, key)) => {
                        use base64::Engine;
                        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                            .decode(key.trim_end_matches('='))
                            .map_err(|_| "acme.eab.hmac_key is not base64url".to_owned())?;
                        Some(ExternalAccountKey::new(kid.clone(), &bytes))
                    }
                };
                let (account, creds) = builder()
                    .create(&new, conf.directory_url.clone(), eab.as_ref())
                    .await
                    .map_err(|e| format!("creating the account: {}", problem(&e)))?;
                let text = serde_json::to_vec(&creds).map_err(|e| e.to_string())?;
                match &self.fleet {
                    // Another instance created one first: the fleet uses that one.
                    Some(f) => match f.share_account(&name, &text).await? {
                        Some(theirs) => builder().from_credentials(theirs).await.map_err(|e| problem(&e))?,
                        None => account,
                    },
                    None => {
                        write_private(&file, &text)?;
                        account
                    }
                }
            }
        };
        let account = Arc::new(account);
        accounts.insert(key, account.clone());
        Ok(account)
    }

    /// Orders `conf`'s certificate: the chain and the key (PEM). With a fleet `claim`, the
    /// challenge answers are published to the fleet too.
    async fn order(&self, conf: &Resolved, mut claim: Option<&mut fleet::Claim>) -> Result<(String, String), String> {
        let account = self.account(conf).await?;
        let ids: Vec<Identifier> = conf.domains.iter().map(|d| Identifier::Dns(d.clone())).collect();
        let mut order = account.new_order(&NewOrder::new(&ids)).await.map_err(|e| problem(&e))?;
        let kind = match conf.challenge {
            AcmeChallenge::Http01 => ChallengeType::Http01,
            AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
        };
        let mut opened = Vec::new();
        let result = async {
            let mut authorizations = order.authorizations();
            while let Some(authz) = authorizations.next().await {
                let mut authz = authz.map_err(|e| problem(&e))?;
                if authz.status == AuthorizationStatus::Valid {
                    continue;
                }
                let mut challenge =
                    authz.challenge(kind.clone()).ok_or_else(|| format!("the CA offers no {kind:?} challenge"))?;
                let domain = challenge.identifier().to_string();
                let key_auth = challenge.key_authorization();
                match conf.challenge {
                    AcmeChallenge::Http01 => {
                        if let Some(c) = claim.as_deref_mut() {
                            c.open_http(&challenge.token, key_auth.as_str()).await?;
                        }
                        self.http_tokens.write().insert(challenge.token.clone(), key_auth.as_str().to_owned());
                        HTTP_OPEN.store(true, Ordering::Relaxed);
                        opened.push((Some(challenge.token.clone()), domain));
                    }
                    AcmeChallenge::TlsAlpn01 => {
                        let cert = alpn_challenge_cert(&domain, key_auth.digest().as_ref())?;
                        if let Some(c) = claim.as_deref_mut() {
                            c.open_alpn(&domain, key_auth.digest().as_ref()).await?;
                        }
                        self.alpn.write().insert(domain.clone(), cert);
                        opened.push((None, domain));
                    }
                }
                challenge.set_ready().await.map_err(|e| problem(&e))?;
            }
            let status = order.poll_ready(&RetryPolicy::default()).await.map_err(|e| problem(&e))?;
            if status != OrderStatus::Ready {
                return Err(format!("the order is {status:?}: {}", why_invalid(&mut order).await));
            }
            let key_pem = order.finalize().await.map_err(|e| problem(&e))?;
            let chain_pem = order.poll_certificate(&RetryPolicy::default()).await.map_err(|e| problem(&e))?;
            Ok((chain_pem, key_pem))
        }
        .await;
        for (token, domain) in opened {
            if let Some(c) = claim.as_deref_mut() {
                c.close(token.as_deref(), &domain).await;
            }
            match token {
                Some(t) => {
                    let mut tokens = self.http_tokens.write();
                    tokens.remove(&t);
                    HTTP_OPEN.store(!tokens.is_empty(), Ordering::Relaxed);
                }
                None => {
                    self.alpn.write().remove(&domain);
                }
            }
        }
        result
    }

    /// Orders `conf`'s certificate and stores it in the local files.
    async fn order_here(&self, conf: &Resolved) -> Result<(), String> {
        let (chain_pem, key_pem) = self.order(conf, None).await?;
        let (cert_file, key_file) = files(&self.dir, &conf.id);
        write_private(&key_file, key_pem.as_bytes())?;
        write_private(&cert_file, chain_pem.as_bytes())
    }
}

/// When a certificate valid from `not_before` to `not_after` (Unix seconds) is renewed: at two
/// thirds of its lifetime.
fn renew_at(not_before: i64, not_after: i64) -> i64 {
    not_before + (not_after - not_before) * 2 / 3
}

/// How long to wait after `failures` failed orders in a row: 1, 2, 4... minutes, at most 6 hours.
fn backoff(failures: u32) -> Duration {
    Duration::from_secs(60u64 << failures.saturating_sub(1).min(9)).min(Duration::from_secs(6 * 3600))
}

/// FNV-1a, 64 bits: a name for an account's file that stays the same across builds.
fn fnv64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// The problem documents of the order's failed challenges.
async fn why_invalid(order: &mut instant_acme::Order) -> String {
    let mut out = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(authz)) = authorizations.next().await {
        for c in &authz.challenges {
            if let Some(p) = &c.error {
                out.push(format!(
                    "{}: {}",
                    p.r#type.as_deref().unwrap_or("problem"),
                    p.detail.as_deref().unwrap_or("")
                ));
            }
        }
    }
    if out.is_empty() {
        "no problem document".into()
    } else {
        out.join("; ")
    }
}

/// An ACME error with its problem document (type and detail), when the CA sent one.
fn problem(e: &instant_acme::Error) -> String {
    match e {
        instant_acme::Error::Api(p) => format!(
            "ACME problem {}: {} (status {})",
            p.r#type.as_deref().unwrap_or("(no type)"),
            p.detail.as_deref().unwrap_or("(no detail)"),
            p.status.map_or_else(|| "-".to_owned(), |s| s.to_string())
        ),
        other => other.to_string(),
    }
}

/// Writes `bytes` to `path` readable by the owner only, atomically (a new file, then rename).
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().ok_or("no parent directory")?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The self-signed certificate RFC 8737 answers a TLS-ALPN-01 challenge with.
fn alpn_challenge_cert(domain: &str, digest: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let mut params = rcgen::CertificateParams::new(vec![domain.to_owned()]).map_err(|e| e.to_string())?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    let der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let signing = crate::tls::backend::sign::any_supported_type(&der).map_err(|e| e.to_string())?;
    Ok(Arc::new(CertifiedKey::new(vec![cert.der().clone()], signing)))
}

/// `(not_before, not_after)` of the certificate in `pem` (Unix seconds), when it names every one
/// of `domains` (a certificate for other names is due at once).
fn validity_for(pem: &[u8], domains: &[String]) -> Option<(i64, i64)> {
    let der = CertificateDer::pem_slice_iter(pem).next()?.ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let names: Vec<String> = match cert.subject_alternative_name() {
        Ok(Some(san)) => san
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    if !domains.iter().all(|d| names.contains(d)) {
        return None;
    }
    let v = cert.validity();
    Some((v.not_before.timestamp(), v.not_after.timestamp()))
}

/// What wakes an entry's task before its renewal is due.
struct Wake {
    /// A renewal was asked for.
    renew: Arc<tokio::sync::Notify>,
    /// The fleet stored a certificate (read the files again).
    stored: Arc<tokio::sync::Notify>,
}

/// Why an entry's task woke.
enum Woke {
    Due,
    Asked,
    Stored,
}

async fn sleep_or_wake(wait: Duration, wake: &Wake) -> Woke {
    tokio::select! {
        () = tokio::time::sleep(wait) => Woke::Due,
        () = wake.renew.notified() => Woke::Asked,
        () = wake.stored.notified() => Woke::Stored,
    }
}

/// One entry's life: renew at two thirds of the stored certificate's lifetime (or when asked),
/// retry failures with backoff, keep the last good certificate meanwhile. In a fleet, each turn
/// goes through the fleet's lock, and another instance's certificate counts as renewed.
async fn keep_fresh(manager: Weak<Manager>, conf: Resolved, wake: Wake, status: Arc<Mutex<Status>>) {
    let mut failures: u32 = 0;
    // Set after a turn another instance had: wait for its certificate (or the lock's lapse).
    let mut held_off: Option<Duration> = None;
    // A renewal asked for while another instance held the lock: asked again at the next turn.
    let mut asked_before = false;
    loop {
        let Some(m) = manager.upgrade() else { return };
        let (cert_file, _) = files(&m.dir, &conf.id);
        let validity = std::fs::read(&cert_file).ok().and_then(|pem| validity_for(&pem, &conf.domains));
        let now = chrono::Utc::now().timestamp();
        let due = validity.map_or(now, |(nb, na)| renew_at(nb, na));
        {
            let mut s = status.lock();
            s.not_after = validity.map(|v| v.1);
            s.renew_at = Some(due);
        }
        drop(m);
        let woke = if let Some(wait) = held_off.take() {
            sleep_or_wake(wait, &wake).await
        } else if failures > 0 {
            sleep_or_wake(backoff(failures), &wake).await
        } else if due > now {
            sleep_or_wake(Duration::from_secs((due - now) as u64), &wake).await
        } else {
            Woke::Due
        };
        if let Woke::Stored = woke {
            // Another instance renewed: that answers a renewal asked for meanwhile too.
            asked_before = false;
            continue;
        }
        let Some(m) = manager.upgrade() else { return };
        let asked = matches!(woke, Woke::Asked) || std::mem::take(&mut asked_before);
        let outcome = match &m.fleet {
            None => {
                log::info!("ACME {}: ordering a certificate for {}", conf.id, conf.domains.join(", "));
                m.order_here(&conf).await.map(|()| fleet::Turn::Issued)
            }
            Some(f) => f.turn(&m, &conf, asked).await,
        };
        match outcome {
            Ok(fleet::Turn::Issued) => {
                failures = 0;
                let mut s = status.lock();
                s.last_error = None;
                s.issued += 1;
                drop(s);
                log::info!("ACME {}: certificate issued and stored", conf.id);
                (m.on_issued)();
            }
            Ok(fleet::Turn::Fresh) => failures = 0,
            Ok(fleet::Turn::Busy) => {
                failures = 0;
                asked_before = asked;
                held_off = Some(Duration::from_secs(fleet::LEASE_TTL as u64));
            }
            Ok(fleet::Turn::Later(until)) => {
                held_off = Some(Duration::from_secs((until - chrono::Utc::now().timestamp()).max(1) as u64));
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                log::error!(
                    "ACME {}: order failed ({e}); {} keeps serving, retrying in {} min",
                    conf.id,
                    if validity.is_some() { "the current certificate" } else { "nothing" },
                    backoff(failures).as_secs() / 60
                );
                status.lock().last_error = Some(e);
            }
        }
    }
}
