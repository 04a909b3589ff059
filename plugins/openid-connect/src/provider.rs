//! The provider's metadata, fetched lazily and cached: the discovery document (retried after a
//! bounded backoff when it could not be read, so a provider that is down costs one attempt per
//! backoff period, not one per request) and the JWKS (refreshed when a token names an unknown
//! `kid`, at most once per [`JWKS_MIN_REFRESH`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::Jwk;
use serde_json::Value;

use crate::client::{CallError, Provider};

/// The first wait after a failed discovery; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between two discovery attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// The JWKS is fetched again for an unknown `kid` at most this often.
pub const JWKS_MIN_REFRESH: Duration = Duration::from_secs(10);

/// The fields of the discovery document Weir uses.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    /// `issuer`.
    pub issuer: Option<String>,
    /// `authorization_endpoint`.
    pub authorization_endpoint: Option<String>,
    /// `token_endpoint`.
    pub token_endpoint: Option<String>,
    /// `userinfo_endpoint`.
    pub userinfo_endpoint: Option<String>,
    /// `jwks_uri`.
    pub jwks_uri: Option<String>,
    /// `end_session_endpoint`.
    pub end_session_endpoint: Option<String>,
    /// `introspection_endpoint`.
    pub introspection_endpoint: Option<String>,
}

impl Discovery {
    /// The fields of a discovery document.
    pub fn parse(doc: &Value) -> Discovery {
        let s = |k: &str| doc.get(k).and_then(Value::as_str).map(str::to_owned);
        Discovery {
            issuer: s("issuer"),
            authorization_endpoint: s("authorization_endpoint"),
            token_endpoint: s("token_endpoint"),
            userinfo_endpoint: s("userinfo_endpoint"),
            jwks_uri: s("jwks_uri"),
            end_session_endpoint: s("end_session_endpoint"),
            introspection_endpoint: s("introspection_endpoint"),
        }
    }
}

/// The keys of a JWKS that Weir can use (the others are skipped).
#[derive(Debug, Default)]
pub struct Keys {
    /// The usable keys.
    pub keys: Vec<Jwk>,
}

impl Keys {
    /// The usable keys of a JWKS document.
    pub fn parse(doc: &Value) -> Keys {
        let keys = doc
            .get("keys")
            .and_then(Value::as_array)
            .map(|ks| ks.iter().filter_map(|k| serde_json::from_value::<Jwk>(k.clone()).ok()).collect())
            .unwrap_or_default();
        Keys { keys }
    }
}

/// Why the metadata is not at hand.
#[derive(Debug)]
pub enum MetaError {
    /// The provider could not be asked now (or failed recently): retry later.
    Unavailable(String),
    /// The provider answered something unusable.
    Invalid(String),
}

#[derive(Default)]
struct State {
    discovery: Option<(Arc<Discovery>, Instant)>,
    failed: Option<(Instant, Duration, String)>,
    jwks: Option<(Arc<Keys>, Instant)>,
    jwks_attempt: Option<Instant>,
}

/// The metadata cache of one configuration.
pub struct Metadata {
    discovery_url: Option<String>,
    max_age: Duration,
    state: Mutex<State>,
}

impl Metadata {
    /// A cache for `discovery_url`, whose entries are kept `max_age`.
    pub fn new(discovery_url: Option<String>, max_age: Duration) -> Metadata {
        Metadata { discovery_url, max_age, state: Mutex::new(State::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The discovery document: cached, or fetched unless the last attempt failed within the
    /// backoff period.
    pub async fn discovery(&self, provider: &Provider) -> Result<Arc<Discovery>, MetaError> {
        let Some(url) = &self.discovery_url else { return Ok(Arc::new(Discovery::default())) };
        {
            let st = self.lock();
            if let Some((d, at)) = &st.discovery {
                if at.elapsed() < self.max_age {
                    return Ok(d.clone());
                }
            }
            if let Some((at, wait, why)) = &st.failed {
                if at.elapsed() < *wait {
                    return Err(MetaError::Unavailable(why.clone()));
                }
            }
        }
        match provider.get_json(url, None).await {
            Ok(doc) => {
                let d = Arc::new(Discovery::parse(&doc));
                let mut st = self.lock();
                st.discovery = Some((d.clone(), Instant::now()));
                st.failed = None;
                Ok(d)
            }
            Err(e) => {
                let why = format!("discovery: {e}");
                log::warn!("openid-connect: {why}");
                let mut st = self.lock();
                // A stale document still serves while the provider is down.
                if let Some((d, _)) = &st.discovery {
                    return Ok(d.clone());
                }
                let wait = st.failed.as_ref().map_or(FIRST_BACKOFF, |(_, w, _)| (*w * 2).min(MAX_BACKOFF));
                st.failed = Some((Instant::now(), wait, why.clone()));
                Err(match e {
                    CallError::Unreachable(_) => MetaError::Unavailable(why),
                    CallError::Refused(_) => MetaError::Invalid(why),
                })
            }
        }
    }

    /// The JWKS; fetched again when `refresh` (a token named an unknown `kid`) and no fetch was
    /// tried within [`JWKS_MIN_REFRESH`]. `Ok(None)` when a refresh was asked but is not allowed
    /// yet (or failed). A JWKS that cannot be fetched again keeps serving while it is known.
    pub async fn jwks(&self, provider: &Provider, refresh: bool) -> Result<Option<Arc<Keys>>, MetaError> {
        let stale = {
            let mut st = self.lock();
            let recent = st.jwks_attempt.is_some_and(|at| at.elapsed() < JWKS_MIN_REFRESH);
            match &st.jwks {
                Some((k, at)) if !refresh && (at.elapsed() < self.max_age || recent) => return Ok(Some(k.clone())),
                Some(_) if refresh && recent => return Ok(None),
                None if recent => {
                    return Err(MetaError::Unavailable("jwks: the last fetch failed less than 10 s ago".into()))
                }
                _ => {}
            }
            st.jwks_attempt = Some(Instant::now());
            st.jwks.as_ref().map(|(k, _)| k.clone())
        };
        let d = self.discovery(provider).await?;
        let Some(uri) = &d.jwks_uri else {
            return Err(MetaError::Invalid("the discovery document has no jwks_uri".into()));
        };
        match provider.get_json(uri, None).await {
            Ok(doc) => {
                let keys = Arc::new(Keys::parse(&doc));
                self.lock().jwks = Some((keys.clone(), Instant::now()));
                Ok(Some(keys))
            }
            Err(e) => {
                log::warn!("openid-connect: jwks: {e}");
                match stale {
                    Some(k) => Ok(if refresh { None } else { Some(k) }),
                    None => Err(match e {
                        CallError::Unreachable(r) => MetaError::Unavailable(format!("jwks: {r}")),
                        CallError::Refused(r) => MetaError::Invalid(format!("jwks: {r}")),
                    }),
                }
            }
        }
    }
}
