"""The OpenID provider of tests/oidc.rs: PyPI's oidc-provider-mock (authorization-code flow,
refresh tokens, userinfo, end_session, JWKS), plus what it lacks, under /test and /introspect:

- POST /introspect: RFC 7662 over the mock's access tokens (client_secret_basic, client
  `weir` / `weir-secret`; anything else is a 401).
- GET /test/jwt?sub=&scope=&exp_in=&iss=&alg=&kid=: a JWT access token signed with the
  provider's key (alg=none: an unsigned one; alg=HS256: "signed" with the public key's modulus).
- GET /test/opaque?sub=&scope=&exp_in=: an opaque access token the introspection endpoint knows.
- POST /test/rotate: a new signing key (the JWKS then lists only it).

Usage: python oidc_provider.py [port] [access_token_max_age_seconds]; prints the port.
"""
import base64
import hashlib
import hmac
import json
import os
import secrets
import sys
import time
import warnings
from datetime import datetime, timedelta, timezone

os.environ.setdefault("AUTHLIB_INSECURE_TRANSPORT", "1")
warnings.simplefilter("ignore")

import flask  # noqa: E402
import werkzeug.serving  # noqa: E402
from authlib import jose  # noqa: E402

import oidc_provider_mock  # noqa: E402
from oidc_provider_mock._storage import AccessToken, User, storage  # noqa: E402

CLIENT = ("weir", "weir-secret")

port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
max_age = int(sys.argv[2]) if len(sys.argv) > 2 else 3600
app = oidc_provider_mock.app(access_token_max_age=timedelta(seconds=max_age))


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def issuer() -> str:
    return flask.request.host_url.rstrip("/")


@app.post("/introspect")
def introspect():
    auth = flask.request.headers.get("Authorization", "")
    expected = "Basic " + base64.b64encode(f"{CLIENT[0]}:{CLIENT[1]}".encode()).decode()
    if not hmac.compare_digest(auth, expected):
        return flask.jsonify({"error": "invalid_client"}), 401
    token = storage.get_access_token(flask.request.form.get("token", ""))
    if token is None or token.is_expired():
        return flask.jsonify({"active": False})
    return flask.jsonify({
        "active": True,
        "sub": token.user_id,
        "scope": token.scope,
        "client_id": CLIENT[0],
        "exp": int(token.expires_at.timestamp()),
        "iss": issuer(),
    })


@app.get("/test/jwt")
def mint_jwt():
    args = flask.request.args
    now = int(time.time())
    payload = {
        "iss": args.get("iss", issuer()),
        "sub": args.get("sub", "alice"),
        "aud": args.get("aud", "weir"),
        "scope": args.get("scope", "openid"),
        "iat": now,
        "exp": now + int(args.get("exp_in", "300")),
    }
    alg = args.get("alg", "RS256")
    key = storage.jwk
    kid = args.get("kid", key.thumbprint())
    if alg == "none":
        head = {"alg": "none", "typ": "JWT"}
        return b64(json.dumps(head).encode()) + "." + b64(json.dumps(payload).encode()) + "."
    if alg == "HS256":
        # The confusion attack: HMAC keyed with the public key's bytes.
        head = {"alg": "HS256", "typ": "JWT", "kid": kid}
        signing = b64(json.dumps(head).encode()) + "." + b64(json.dumps(payload).encode())
        secret = json.dumps(key.as_dict()).encode()
        sig = hmac.new(secret, signing.encode(), hashlib.sha256).digest()
        return signing + "." + b64(sig)
    token = jose.jwt.encode({"alg": alg, "kid": kid, "typ": "JWT"}, payload, key)
    return token.decode() if isinstance(token, bytes) else token


@app.get("/test/opaque")
def mint_opaque():
    args = flask.request.args
    sub = args.get("sub", "alice")
    if storage.get_user(sub) is None:
        storage.store_user(User(sub=sub, claims={"email": sub}))
    token = secrets.token_urlsafe(24)
    storage.store_access_token(AccessToken(
        token=token,
        user_id=sub,
        scope=args.get("scope", "openid"),
        expires_at=datetime.now(timezone.utc) + timedelta(seconds=int(args.get("exp_in", "300"))),
    ))
    return token


@app.post("/test/rotate")
def rotate():
    storage.jwk = jose.RSAKey.generate_key(is_private=True)
    return "", 204


server = werkzeug.serving.make_server("127.0.0.1", port, app, threaded=True)
print(server.server_port, flush=True)
server.serve_forever()
