//! RFC 7662 token introspection: the token is posted to the introspection endpoint (configured,
//! else the discovery document's) with the client's credentials (`client_secret_basic` or
//! `client_secret_post`); an `active: true` answer is the token's claims.

use serde_json::{Map, Value};
use weir_plugin::http::StatusCode;
use weir_plugin::RequestCtx;

use crate::client::CallError;
use crate::{Failure, Instance};

/// The claims of an active token.
pub async fn introspect(inst: &Instance, ctx: &RequestCtx, token: &str) -> Result<Map<String, Value>, Failure> {
    let endpoint = match &inst.conf.introspection_endpoint {
        Some(e) => e.clone(),
        None => {
            let d = inst.meta.discovery(&inst.provider).await.map_err(|e| Failure::unavailable(&e))?;
            d.introspection_endpoint.clone().ok_or_else(|| {
                Failure::status(StatusCode::SERVICE_UNAVAILABLE, "the identity provider has no introspection endpoint")
            })?
        }
    };
    let extra: Vec<_> =
        inst.addon_headers.iter().filter_map(|n| ctx.headers.get(n).map(|v| (n.clone(), v.clone()))).collect();
    let client = (inst.conf.client_id.as_str(), inst.conf.client_secret.as_deref(), inst.introspection_auth);
    let form = [("token", token), ("token_type_hint", "access_token")];
    let answer = match inst.provider.post_form(&endpoint, &form, client, &extra).await {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(Failure::invalid_token("introspection failed")),
        Err(CallError::Unreachable(why)) => {
            log::error!("openid-connect: introspection: {why}");
            return Err(Failure::status(StatusCode::SERVICE_UNAVAILABLE, "the identity provider is unavailable"));
        }
        Err(CallError::Refused(why)) => {
            log::error!("openid-connect: introspection: {why}");
            return Err(Failure::invalid_token("introspection failed"));
        }
    };
    if answer.get("active") != Some(&Value::Bool(true)) {
        return Err(Failure::invalid_token("token is not active"));
    }
    if answer.get("exp").and_then(Value::as_i64).is_some_and(|exp| exp <= crate::now()) {
        return Err(Failure::invalid_token("token expired"));
    }
    Ok(answer)
}
