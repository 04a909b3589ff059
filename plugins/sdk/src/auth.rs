//! The credential kit every authentication plugin builds on: one way to index credentials,
//! compare secrets, reject, hide credentials, fall back to an anonymous consumer, and attach
//! the consumer to the request.
//!
//! - [`CredentialIndex`]: credential → consumer, built once per snapshot in
//!   `prepare_consumers` (in one call with [`index_consumers`]); two consumers claiming one
//!   credential refuse the load, naming both.
//!   Lookups bucket by a randomly keyed hash, then compare in constant time ([`ct_eq`]).
//! - [`Rejection`]: why a request was not authenticated, answered as APISIX does (401,
//!   `{"message": ...}`), never echoing the credential.
//! - [`attach_consumer`]: sets [`RequestCtx::consumer`] and tells the upstream who it is
//!   (`X-Consumer-Username`, `X-Credential-Identifier`, overwriting what a client sent).
//! - [`finish`]: the end of every auth plugin's phase: the consumer found (its credential
//!   hidden if asked), else the `anonymous_consumer`, else the rejection.
//!
//! ```
//! use std::sync::Arc;
//! use weir_plugin::auth::{CredentialIndex, Rejection};
//! use weir_plugin::Consumer;
//!
//! let (jack, rose) = (Arc::new(Consumer::named("jack")), Arc::new(Consumer::named("rose")));
//! let index = CredentialIndex::build("key", [(b"k1".to_vec(), &jack, ()), (b"k2".to_vec(), &rose, ())])
//!     .expect("unique keys");
//! assert_eq!(index.find(b"k2").map(|(c, _)| &*c.username), Some("rose"));
//! assert!(index.find(b"nope").is_none());
//! let dup = CredentialIndex::build("key", [(b"k".to_vec(), &jack, ()), (b"k".to_vec(), &rose, ())]);
//! assert_eq!(dup.err().as_deref(), Some("consumers `jack` and `rose` have the same key; it must be unique"));
//! let _ = Rejection::Invalid("Invalid API key in request").response();
//! ```

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use http::header::WWW_AUTHENTICATE;
use http::{HeaderName, HeaderValue, StatusCode};

use crate::prehashed::PrehashedMap;
use crate::{Consumer, ConsumerDirectory, ConsumerRef, Flow, PluginResponse, RequestCtx, SharedState};

/// `X-Consumer-Username`: the consumer's name, to the upstream.
pub const CONSUMER_USERNAME: HeaderName = HeaderName::from_static("x-consumer-username");
/// `X-Credential-Identifier`: the id of the credential that identified the consumer.
pub const CREDENTIAL_IDENTIFIER: HeaderName = HeaderName::from_static("x-credential-identifier");

/// Constant-time equality of two byte strings (time depends only on the lengths).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// Credentials (and their owners, and what the plugin keeps with each) sharing one bucket.
type Bucket<V> = Vec<(Box<[u8]>, Arc<Consumer>, V)>;

/// Credential → consumer index of one snapshot (see the module documentation).
pub struct CredentialIndex<V> {
    hasher: RandomState,
    /// By the credential's keyed hash (uniform and secret to clients: not hashed again).
    buckets: PrehashedMap<Bucket<V>>,
}

impl<V> CredentialIndex<V> {
    /// Indexes `(credential, consumer, value)` triples; `what` names the credential in the
    /// message that refuses a duplicate (`key`, `username`, `key_id`).
    pub fn build<'c>(
        what: &str,
        items: impl IntoIterator<Item = (Vec<u8>, &'c Arc<Consumer>, V)>,
    ) -> Result<Self, String> {
        let hasher = RandomState::new();
        let mut buckets: PrehashedMap<Bucket<V>> = PrehashedMap::default();
        for (key, consumer, value) in items {
            let bucket = buckets.entry(hasher.hash_one(&key)).or_default();
            if let Some((_, first, _)) = bucket.iter().find(|(k, _, _)| **k == *key) {
                return Err(format!(
                    "consumers `{}` and `{}` have the same {what}; it must be unique",
                    first.username, consumer.username
                ));
            }
            bucket.push((key.into_boxed_slice(), consumer.clone(), value));
        }
        Ok(CredentialIndex { hasher, buckets })
    }

    /// The consumer owning `key`, with its value. Every candidate of the bucket is compared, in
    /// constant time.
    pub fn find(&self, key: &[u8]) -> Option<(&Arc<Consumer>, &V)> {
        let bucket = self.buckets.get(&self.hasher.hash_one(key))?;
        let mut found = None;
        for (k, consumer, value) in bucket {
            if ct_eq(k, key) {
                found = Some((consumer, value));
            }
        }
        found
    }

    /// How many credentials are indexed.
    pub fn len(&self) -> usize {
        self.buckets.values().map(Vec::len).sum()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

/// `prepare_consumers` of a credential plugin in one call: each consumer's credential parsed
/// as `C` (the plugin's consumer configuration), turned into `(credential, value)` by `entry`,
/// and indexed (`what` names the credential in the message refusing a duplicate).
pub fn index_consumers<C, V>(
    what: &str,
    consumers: &[ConsumerRef<'_>],
    entry: impl Fn(C) -> (Vec<u8>, V),
) -> Result<Option<SharedState>, String>
where
    C: serde::de::DeserializeOwned,
    V: Send + Sync + 'static,
{
    let mut items = Vec::with_capacity(consumers.len());
    for c in consumers {
        let (credential, value) = entry(crate::parse_conf::<C>(c.conf)?);
        items.push((credential, c.consumer, value));
    }
    Ok(Some(Arc::new(CredentialIndex::build(what, items)?)))
}

/// Why a request was not authenticated. The message is APISIX's for the case; it never
/// contains the credential.
#[derive(Debug, Clone)]
pub enum Rejection {
    /// No credential in the request.
    Missing(&'static str),
    /// A credential that identifies no one, or a malformed one.
    Invalid(&'static str),
    /// As `Invalid`, with a `WWW-Authenticate` challenge (basic-auth's realm).
    Challenge(&'static str, HeaderValue),
}

impl Rejection {
    /// The 401 answer.
    pub fn response(self) -> PluginResponse {
        match self {
            Rejection::Missing(m) | Rejection::Invalid(m) => PluginResponse::message(StatusCode::UNAUTHORIZED, m),
            Rejection::Challenge(m, challenge) => {
                let mut r = PluginResponse::message(StatusCode::UNAUTHORIZED, m);
                r.headers.insert(WWW_AUTHENTICATE, challenge);
                r
            }
        }
    }
}

/// Sets the request's consumer and the headers that tell the upstream who it is (overwriting
/// any the client sent: a client cannot claim an identity).
pub fn attach_consumer(ctx: &mut RequestCtx, consumer: Arc<Consumer>) {
    match &consumer.username_header {
        Some(v) => ctx.headers.insert(CONSUMER_USERNAME, v.clone()),
        None => ctx.headers.remove(CONSUMER_USERNAME),
    };
    match consumer.credential_id.as_deref().and_then(|id| HeaderValue::from_str(id).ok()) {
        Some(v) => ctx.headers.insert(CREDENTIAL_IDENTIFIER, v),
        None => ctx.headers.remove(CREDENTIAL_IDENTIFIER),
    };
    ctx.consumer = Some(consumer);
}

/// The consumer named by an auth plugin's `anonymous_consumer`, looked up at load: a name that
/// is no consumer refuses the configuration.
pub fn anonymous(name: Option<&str>, consumers: &ConsumerDirectory) -> Result<Option<Arc<Consumer>>, String> {
    match name {
        None => Ok(None),
        Some(n) => match consumers.get(n) {
            Some(c) => Ok(Some(c.clone())),
            None => Err(format!("anonymous_consumer: consumer `{n}` does not exist")),
        },
    }
}

/// The end of an auth plugin's phase: with a consumer found, `hide` removes the credential
/// (`hide_credentials`) and the consumer is attached; without one, the anonymous consumer is
/// attached if configured; else the rejection is the answer.
pub fn finish(
    ctx: &mut RequestCtx,
    found: Result<Arc<Consumer>, Rejection>,
    anonymous: Option<&Arc<Consumer>>,
    hide: impl FnOnce(&mut RequestCtx),
) -> Flow<'static> {
    match (found, anonymous) {
        (Ok(c), _) => {
            hide(ctx);
            attach_consumer(ctx, c);
        }
        (Err(_), Some(c)) => attach_consumer(ctx, c.clone()),
        (Err(r), None) => return Flow::Respond(r.response()),
    }
    Flow::Continue
}

/// Removes every `name` argument from a query string (`hide_credentials`), keeping the order
/// and spelling of the others.
pub fn remove_query_arg(query: &mut String, name: &str) {
    if !query.split('&').any(|kv| kv.split('=').next() == Some(name)) {
        return;
    }
    let kept: Vec<&str> = query.split('&').filter(|kv| kv.split('=').next() != Some(name)).collect();
    *query = kept.join("&");
}

/// The `WWW-Authenticate` challenge `<scheme> realm="<realm>"` of a plugin's 401 answers, made
/// once per configuration (quotes in the realm are dropped; a realm that cannot be a header
/// value refuses the configuration).
pub fn challenge(scheme: &str, realm: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(&format!("{scheme} realm=\"{}\"", realm.replace('"', "")))
        .map_err(|_| format!("realm: {realm:?} is not a valid header value"))
}

/// Removes every cookie named `name` from the request's `Cookie` headers (`hide_credentials`),
/// keeping the others; a header left empty is dropped.
pub fn remove_cookie(headers: &mut http::HeaderMap, name: &str) {
    let lines: Vec<String> =
        headers.get_all(http::header::COOKIE).iter().filter_map(|v| v.to_str().ok()).map(str::to_owned).collect();
    if lines.is_empty() {
        return;
    }
    headers.remove(http::header::COOKIE);
    for line in lines {
        let kept: Vec<&str> = line
            .split(';')
            .map(str::trim)
            .filter(|kv| !kv.is_empty() && kv.split('=').next().map(str::trim) != Some(name))
            .collect();
        if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
            if !kept.is_empty() {
                headers.append(http::header::COOKIE, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_removed_by_name_only() {
        let mut h = http::HeaderMap::new();
        h.append(http::header::COOKIE, HeaderValue::from_static("a=1; jwt=secret; jwtx=2"));
        h.append(http::header::COOKIE, HeaderValue::from_static("jwt=again"));
        remove_cookie(&mut h, "jwt");
        let left: Vec<&str> = h.get_all(http::header::COOKIE).iter().filter_map(|v| v.to_str().ok()).collect();
        assert_eq!(left, ["a=1; jwtx=2"]);
    }

    #[test]
    fn constant_time_eq() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
    }

    #[test]
    fn query_args_are_removed_by_name_only() {
        let mut q = "a=1&apikey=k&apikeyx=2&apikey".to_owned();
        remove_query_arg(&mut q, "apikey");
        assert_eq!(q, "a=1&apikeyx=2");
        let mut q = "a=1".to_owned();
        remove_query_arg(&mut q, "apikey");
        assert_eq!(q, "a=1");
    }

    #[test]
    fn attached_consumers_overwrite_claims() {
        let mut ctx = crate::phase::tests_support::ctx();
        ctx.headers.insert(CONSUMER_USERNAME, HeaderValue::from_static("admin"));
        ctx.headers.insert(CREDENTIAL_IDENTIFIER, HeaderValue::from_static("forged"));
        attach_consumer(&mut ctx, Arc::new(Consumer::named("jack")));
        assert_eq!(ctx.header("x-consumer-username"), Some("jack"));
        assert_eq!(ctx.header("x-credential-identifier"), None);
        assert_eq!(ctx.consumer.as_ref().map(|c| &*c.username), Some("jack"));
    }
}
