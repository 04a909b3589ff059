//! The authorization-code flow: the redirect to the provider (state, nonce, PKCE `S256`, and a
//! sealed login cookie holding them with the original URL), the callback (state checked, code
//! exchanged, ID token verified, userinfo read, session cookie set), sessions on later requests
//! (renewed with the refresh token once expired), and logout.

use serde_json::{Map, Value};
use weir_plugin::http::{header, HeaderValue, StatusCode};
use weir_plugin::{Flow, PluginResponse, RequestCtx};

use crate::client::CallError;
use crate::conf::UnauthAction;
use crate::jwt::Expect;
use crate::provider::MetaError;
use crate::session::{self, Login, Session, LOGIN, SESSION};
use crate::{now, upstream, Failure, Instance, SessionSettings};

/// How long a login may take between the redirect and the callback.
pub const LOGIN_TTL: i64 = 600;
/// The default `redirect_uri` suffix (APISIX's).
pub const REDIRECT_SUFFIX: &str = "/.apisix/redirect";

/// The flow for one request.
pub async fn run(inst: &Instance, s: &SessionSettings, ctx: &mut RequestCtx) -> Result<Flow<'static>, Failure> {
    let now = now();
    if ctx.path == inst.conf.logout_path {
        return logout(inst, s, ctx).await;
    }
    let (redirect_uri, redirect_path) = redirect_uri(inst, ctx);
    if ctx.path == redirect_path {
        return callback(inst, s, ctx, now).await;
    }
    let (found, chunks) = session::read_session(&s.sealer, &ctx.headers, &s.name, now);
    if let Some(mut sess) = found {
        if sess.expires_at - inst.conf.access_token_expires_leeway > now {
            upstream::session(ctx, &inst.conf, &sess);
            return Ok(Flow::Continue);
        }
        if inst.conf.renew_access_token_on_expiry && sess.refresh_token.is_some() {
            match refresh(inst, &mut sess, now).await {
                Ok(()) => {
                    let cookies = session_cookies(s, &sess, chunks, now, ctx.scheme == "https")?;
                    ctx.response_headers.extend(cookies.into_iter().map(|v| (header::SET_COOKIE, v)));
                    upstream::session(ctx, &inst.conf, &sess);
                    return Ok(Flow::Continue);
                }
                Err(why) => log::info!("openid-connect: the session could not be renewed: {why}"),
            }
        }
    }
    match inst.conf.unauth_action {
        UnauthAction::Pass => Ok(Flow::Continue),
        UnauthAction::Deny => Err(Failure::status(StatusCode::UNAUTHORIZED, "authentication required")),
        UnauthAction::Auth => login(inst, s, ctx, redirect_uri, now).await,
    }
}

/// The absolute `redirect_uri` of this request and its path.
fn redirect_uri(inst: &Instance, ctx: &RequestCtx) -> (String, String) {
    let host = ctx.header("host").map(str::to_owned).unwrap_or_else(|| ctx.local_addr.to_string());
    let origin = format!("{}://{host}", ctx.scheme);
    match &inst.conf.redirect_uri {
        Some(r) if r.starts_with('/') => (format!("{origin}{r}"), r.split('?').next().unwrap_or(r).to_owned()),
        Some(r) => {
            let path = url::Url::parse(r).map(|u| u.path().to_owned()).unwrap_or_default();
            (r.clone(), path)
        }
        None => {
            let path = if ctx.path.ends_with(REDIRECT_SUFFIX) {
                ctx.path.clone()
            } else {
                format!("{}{REDIRECT_SUFFIX}", ctx.path.trim_end_matches('/'))
            };
            (format!("{origin}{path}"), path)
        }
    }
}

fn redirect(location: &str) -> Result<PluginResponse, Failure> {
    let mut r = PluginResponse { status: StatusCode::FOUND, headers: Default::default(), body: Default::default() };
    let v = HeaderValue::from_str(location)
        .map_err(|_| Failure::status(StatusCode::INTERNAL_SERVER_ERROR, "the redirect target is not a header value"))?;
    r.headers.insert(header::LOCATION, v);
    r.headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

fn add_cookie(r: &mut PluginResponse, v: Option<HeaderValue>) {
    if let Some(v) = v {
        r.headers.append(header::SET_COOKIE, v);
    }
}

fn internal(what: &str) -> Failure {
    log::error!("openid-connect: {what}");
    Failure::status(StatusCode::INTERNAL_SERVER_ERROR, what)
}

/// The redirect to the authorization endpoint, with a login cookie.
async fn login(
    inst: &Instance,
    s: &SessionSettings,
    ctx: &RequestCtx,
    redirect_uri: String,
    now: i64,
) -> Result<Flow<'static>, Failure> {
    let d = inst.meta.discovery(&inst.provider).await.map_err(|e| Failure::unavailable(&e))?;
    let Some(endpoint) = &d.authorization_endpoint else {
        return Err(Failure::unavailable(&MetaError::Invalid(
            "the discovery document has no authorization_endpoint".into(),
        )));
    };
    let random = || s.sealer.random(32).ok_or_else(|| internal("no randomness for the login"));
    let verifier = if inst.conf.use_pkce { Some(random()?) } else { None };
    let login = Login {
        state: random()?,
        nonce: random()?,
        verifier,
        original_url: ctx.request_uri().into_owned(),
        redirect_uri,
        until: now + LOGIN_TTL,
    };
    let mut url = url::Url::parse(endpoint)
        .map_err(|_| Failure::unavailable(&MetaError::Invalid("authorization_endpoint is not a URL".into())))?;
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("response_type", "code")
            .append_pair("client_id", &inst.conf.client_id)
            .append_pair("redirect_uri", &login.redirect_uri)
            .append_pair("scope", &inst.conf.scope)
            .append_pair("state", &login.state)
            .append_pair("nonce", &login.nonce);
        if let Some(v) = &login.verifier {
            q.append_pair("code_challenge", &pkce_challenge(v)).append_pair("code_challenge_method", "S256");
        }
        for (k, v) in inst.conf.authorization_params.iter().flatten() {
            match v {
                Value::String(s) => q.append_pair(k, s),
                other => q.append_pair(k, &other.to_string()),
            };
        }
    }
    let plain = serde_json::to_vec(&login).map_err(|_| internal("the login could not be serialized"))?;
    let sealed = s.sealer.seal(LOGIN, &plain).ok_or_else(|| internal("the login could not be sealed"))?;
    let mut r = redirect(url.as_str())?;
    add_cookie(&mut r, s.attrs.set_cookie(&s.login_name, &sealed, LOGIN_TTL, ctx.scheme == "https"));
    Ok(Flow::Respond(r))
}

/// `base64url(SHA-256(verifier))` (RFC 7636 `S256`).
pub fn pkce_challenge(verifier: &str) -> String {
    use base64::Engine as _;
    let d = ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(d.as_ref())
}

/// The login cookie of this request, if it opens, is not expired and matches `state`.
pub fn check_login(s: &SessionSettings, ctx: &RequestCtx, state: Option<&str>, now: i64) -> Result<Login, Failure> {
    let deny = |m: &str| Failure::status(StatusCode::UNAUTHORIZED, m);
    let Some(value) = session::cookie(&ctx.headers, &s.login_name) else {
        return Err(deny("no login in progress for this callback"));
    };
    let login = s
        .sealer
        .open(LOGIN, value)
        .and_then(|p| serde_json::from_slice::<Login>(&p).ok())
        .ok_or_else(|| deny("the login cookie is invalid"))?;
    if login.until <= now {
        return Err(deny("the login expired; start again"));
    }
    let state = state.ok_or_else(|| deny("the callback has no state"))?;
    if !weir_plugin::auth::ct_eq(state.as_bytes(), login.state.as_bytes()) {
        return Err(deny("the callback's state does not match the login"));
    }
    Ok(login)
}

fn arg(ctx: &RequestCtx, name: &str) -> Option<String> {
    url::form_urlencoded::parse(ctx.query.as_bytes()).find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
}

fn token_error(e: CallError) -> Failure {
    match e {
        CallError::Unreachable(why) => {
            log::error!("openid-connect: token endpoint: {why}");
            Failure::status(StatusCode::SERVICE_UNAVAILABLE, "the identity provider is unavailable")
        }
        CallError::Refused(why) => {
            log::warn!("openid-connect: token endpoint: {why}");
            Failure::status(StatusCode::UNAUTHORIZED, "the identity provider refused the token request")
        }
    }
}

/// Posts `form` to the token endpoint.
async fn token_request(inst: &Instance, form: &[(&str, &str)]) -> Result<Map<String, Value>, Failure> {
    let d = inst.meta.discovery(&inst.provider).await.map_err(|e| Failure::unavailable(&e))?;
    let Some(endpoint) = &d.token_endpoint else {
        return Err(Failure::unavailable(&MetaError::Invalid("the discovery document has no token_endpoint".into())));
    };
    let client = (inst.conf.client_id.as_str(), inst.conf.client_secret.as_deref(), inst.token_auth);
    match inst.provider.post_form(endpoint, form, client, &[]).await.map_err(token_error)? {
        Value::Object(m) => Ok(m),
        _ => Err(Failure::status(StatusCode::UNAUTHORIZED, "the identity provider refused the token request")),
    }
}

/// Verifies an ID token of the provider (`nonce`: the login's, at the callback).
async fn verify_id_token(
    inst: &Instance,
    token: &str,
    nonce: Option<&str>,
    now: i64,
) -> Result<Map<String, Value>, Failure> {
    let parsed = inst.parse_jwt(token)?;
    let issuers = inst.issuers().await?;
    let expect = Expect {
        issuers: issuers.as_deref(),
        audience: inst.conf.claim_validator.as_ref().and_then(|c| c.audience.as_ref()),
        client_id: &inst.conf.client_id,
        id_token: true,
        nonce,
        iat_slack: inst.conf.iat_slack,
        now,
    };
    inst.verify_jwt(parsed, &expect).await
}

fn str_field(m: &Map<String, Value>, k: &str) -> Option<String> {
    m.get(k).and_then(Value::as_str).map(str::to_owned)
}

/// When the tokens of a token response expire: `expires_in` (or `access_token_expires_in`),
/// bounded by the ID token's `exp` when one came with it.
fn expiry(inst: &Instance, tokens: &Map<String, Value>, id_exp: Option<i64>, now: i64) -> i64 {
    let access = tokens
        .get("expires_in")
        .and_then(|v| v.as_i64().or_else(|| v.as_str().and_then(|s| s.parse().ok())))
        .or(inst.conf.access_token_expires_in.map(|s| s.min(i64::MAX as u64) as i64))
        .map(|s| now.saturating_add(s));
    match (access, id_exp) {
        (Some(a), Some(i)) => a.min(i),
        (Some(a), None) => a,
        (None, Some(i)) => i,
        (None, None) => now + 3600,
    }
}

/// The callback on `redirect_uri`: the code exchanged for tokens, the session set.
async fn callback(inst: &Instance, s: &SessionSettings, ctx: &RequestCtx, now: i64) -> Result<Flow<'static>, Failure> {
    if let Some(err) = arg(ctx, "error") {
        let err: String = err.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').take(64).collect();
        return Err(Failure::status(
            StatusCode::UNAUTHORIZED,
            format!("the identity provider refused the login: {err}"),
        ));
    }
    let login = check_login(s, ctx, arg(ctx, "state").as_deref(), now)?;
    let code = arg(ctx, "code").ok_or_else(|| Failure::status(StatusCode::BAD_REQUEST, "the callback has no code"))?;
    let mut form = vec![
        ("grant_type", "authorization_code"),
        ("code", code.as_str()),
        ("redirect_uri", login.redirect_uri.as_str()),
    ];
    if let Some(v) = &login.verifier {
        form.push(("code_verifier", v.as_str()));
    }
    let tokens = token_request(inst, &form).await?;
    let id_token = str_field(&tokens, "id_token")
        .ok_or_else(|| Failure::status(StatusCode::UNAUTHORIZED, "the token response has no ID token"))?;
    let claims = verify_id_token(inst, &id_token, Some(&login.nonce), now).await?;
    let access_token = str_field(&tokens, "access_token");
    let userinfo = match (&access_token, inst.conf.set_userinfo_header) {
        (Some(at), true) => userinfo(inst, at).await,
        _ => None,
    };
    let id_exp = claims.get("exp").and_then(Value::as_i64);
    let sess = Session {
        expires_at: expiry(inst, &tokens, id_exp, now),
        claims,
        id_token,
        access_token,
        refresh_token: str_field(&tokens, "refresh_token"),
        userinfo,
        until: now.saturating_add(s.lifetime),
    };
    let https = ctx.scheme == "https";
    let (_, old_chunks) = session::read_split(&ctx.headers, &s.name).unwrap_or_default();
    let mut r = redirect(&login.original_url)?;
    for v in session_cookies(s, &sess, old_chunks, now, https)? {
        r.headers.append(header::SET_COOKIE, v);
    }
    add_cookie(&mut r, s.attrs.set_cookie(&s.login_name, "", 0, https));
    Ok(Flow::Respond(r))
}

/// The userinfo endpoint's answer (`None` when there is none or it fails: logged).
async fn userinfo(inst: &Instance, access_token: &str) -> Option<Value> {
    let d = inst.meta.discovery(&inst.provider).await.ok()?;
    let endpoint = d.userinfo_endpoint.as_ref()?;
    match inst.provider.get_json(endpoint, Some(access_token)).await {
        Ok(v) => Some(v),
        Err(e) => {
            log::warn!("openid-connect: userinfo: {e}");
            None
        }
    }
}

/// Renews the tokens of `sess` with its refresh token.
async fn refresh(inst: &Instance, sess: &mut Session, now: i64) -> Result<(), String> {
    let Some(rt) = sess.refresh_token.clone() else { return Err("no refresh token".into()) };
    let tokens =
        token_request(inst, &[("grant_type", "refresh_token"), ("refresh_token", &rt)]).await.map_err(|f| f.message)?;
    let access_token = str_field(&tokens, "access_token").ok_or("the refresh answer has no access token")?;
    let mut id_exp = None;
    if let Some(id_token) = str_field(&tokens, "id_token") {
        let claims = verify_id_token(inst, &id_token, None, now).await.map_err(|f| f.message)?;
        if claims.get("sub") != sess.claims.get("sub") {
            return Err("the renewed ID token names another subject".into());
        }
        id_exp = claims.get("exp").and_then(Value::as_i64);
        sess.claims = claims;
        sess.id_token = id_token;
    }
    // A refresh renews the session past the old ID token's expiry.
    sess.expires_at = expiry(inst, &tokens, id_exp, now);
    sess.access_token = Some(access_token);
    if let Some(new_rt) = str_field(&tokens, "refresh_token") {
        sess.refresh_token = Some(new_rt);
    }
    Ok(())
}

/// The `Set-Cookie` values of a session (and deletions of chunks an older, longer one used).
fn session_cookies(
    s: &SessionSettings,
    sess: &Session,
    old_chunks: usize,
    now: i64,
    https: bool,
) -> Result<Vec<HeaderValue>, Failure> {
    let plain = serde_json::to_vec(sess).map_err(|_| internal("the session could not be serialized"))?;
    let sealed = s.sealer.seal(SESSION, &plain).ok_or_else(|| internal("the session could not be sealed"))?;
    let parts = session::split(&s.name, &sealed).ok_or_else(|| internal("the session is too large for cookies"))?;
    let max_age = (sess.until - now).max(0);
    let mut out: Vec<HeaderValue> =
        parts.iter().filter_map(|(k, v)| s.attrs.set_cookie(k, v, max_age, https)).collect();
    for i in parts.len()..old_chunks {
        out.extend(s.attrs.set_cookie(&session::chunk_name(&s.name, i), "", 0, https));
    }
    Ok(out)
}

/// `logout_path`: the session cookies cleared, then the provider's `end_session_endpoint`
/// (with `id_token_hint` and `post_logout_redirect_uri`), or `post_logout_redirect_uri`.
async fn logout(inst: &Instance, s: &SessionSettings, ctx: &RequestCtx) -> Result<Flow<'static>, Failure> {
    let https = ctx.scheme == "https";
    let (sess, chunks) = session::read_session(&s.sealer, &ctx.headers, &s.name, now());
    let end_session = match inst.meta.discovery(&inst.provider).await {
        Ok(d) => d.end_session_endpoint.clone(),
        Err(e) if inst.conf.post_logout_redirect_uri.is_none() => return Err(Failure::unavailable(&e)),
        Err(_) => None,
    };
    let mut r = match (end_session, &inst.conf.post_logout_redirect_uri) {
        (Some(ep), post) => {
            let mut url = url::Url::parse(&ep)
                .map_err(|_| Failure::unavailable(&MetaError::Invalid("end_session_endpoint is not a URL".into())))?;
            {
                let mut q = url.query_pairs_mut();
                if let Some(p) = post {
                    q.append_pair("post_logout_redirect_uri", p);
                }
                if let Some(sess) = &sess {
                    q.append_pair("id_token_hint", &sess.id_token);
                }
            }
            redirect(url.as_str())?
        }
        (None, Some(post)) => redirect(post)?,
        (None, None) => {
            let mut r = PluginResponse::message(StatusCode::OK, "logged out");
            r.headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
    };
    for i in 0..chunks.max(1) {
        add_cookie(&mut r, s.attrs.set_cookie(&session::chunk_name(&s.name, i), "", 0, https));
    }
    Ok(Flow::Respond(r))
}
