#!/usr/bin/env python3
"""Credentials for benches/auth.sh, with the standard library and the openssl command only.

  auth_tokens.py DIR                 writes keys, tokens, headers and consumers under DIR
  auth_tokens.py serve DIR PORT      serves DIR's OIDC discovery document and JWKS on PORT
"""
import base64, hashlib, hmac, http.server, json, os, subprocess, sys, time
from email.utils import formatdate


def b64u(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def openssl(*args, data=None):
    return subprocess.run(["openssl", *args], input=data, capture_output=True, check=True).stdout


def der_to_raw(sig, size):
    # ECDSA-Sig-Value ::= SEQUENCE { r INTEGER, s INTEGER }
    i = 2 if sig[1] < 0x80 else 3
    out = b""
    for _ in range(2):
        assert sig[i] == 2
        n = sig[i + 1]
        out += sig[i + 2:i + 2 + n].lstrip(b"\0").rjust(size, b"\0")
        i += 2 + n
    return out


def token(alg, claims, key, kid=None):
    header = {"alg": alg, "typ": "JWT"}
    if kid:
        header["kid"] = kid
    signing = (b64u(json.dumps(header).encode()) + "." + b64u(json.dumps(claims).encode())).encode()
    if alg == "HS256":
        sig = hmac.new(key.encode(), signing, hashlib.sha256).digest()
    elif alg == "RS256":
        sig = openssl("dgst", "-sha256", "-sign", key, data=signing)
    else:
        sig = der_to_raw(openssl("dgst", "-sha256", "-sign", key, data=signing), 32)
    return signing.decode() + "." + b64u(sig)


def write(d):
    os.makedirs(d, exist_ok=True)
    rsa, ec = f"{d}/rsa.key", f"{d}/ec.key"
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", rsa)
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", ec)
    rsa_pub = openssl("pkey", "-in", rsa, "-pubout").decode()
    ec_pub = openssl("pkey", "-in", ec, "-pubout").decode()
    modulus = bytes.fromhex(openssl("rsa", "-in", rsa, "-noout", "-modulus").decode().split("=")[1].strip())
    far = int(time.time()) + 30 * 86400
    secret = "bench-hs256-secret-of-at-least-32-bytes"
    date = formatdate(usegmt=True)
    def hmac_auth(path):
        signing = f"bench-hmac\nGET {path}\ndate: {date}\n"
        sig = base64.b64encode(hmac.new(b"bench-hmac-secret", signing.encode(), hashlib.sha256).digest()).decode()
        return {"date": date, "authorization":
                f'Signature keyId="bench-hmac",algorithm="hmac-sha256",headers="@request-target date",signature="{sig}"'}
    issuer = "http://127.0.0.1:{port}"
    consumers = [{
        "username": "bench",
        "plugins": {
            "key-auth": {"key": "bench-key"},
            "basic-auth": {"username": "bench", "password": "bench-password"},
            "jwt-auth": {"key": "bench-hs", "secret": secret},
            "hmac-auth": {"key_id": "bench-hmac", "secret_key": "bench-hmac-secret"},
        },
        "credentials": [
            {"id": "rs", "plugins": {"jwt-auth": {"key": "bench-rs", "algorithm": "RS256", "public_key": rsa_pub}}},
            {"id": "es", "plugins": {"jwt-auth": {"key": "bench-es", "algorithm": "ES256", "public_key": ec_pub}}},
        ],
    }]
    headers = {
        "key-auth": {"apikey": "bench-key"},
        "basic-auth": {"authorization": "Basic " + base64.b64encode(b"bench:bench-password").decode()},
        "jwt-hs256": {"authorization": "Bearer " + token("HS256", {"key": "bench-hs", "exp": far}, secret)},
        "jwt-rs256": {"authorization": "Bearer " + token("RS256", {"key": "bench-rs", "exp": far}, rsa)},
        "jwt-es256": {"authorization": "Bearer " + token("ES256", {"key": "bench-es", "exp": far}, ec)},
        # The request target is signed: /x for the instruction count, /hmac-auth/x for wrk.
        "hmac-auth": hmac_auth("/x"),
        "hmac-auth-wrk": hmac_auth("/hmac-auth/x"),
    }
    json.dump({"consumers": consumers, "headers": headers, "far": far,
               "jwk": {"kty": "RSA", "kid": "bench", "alg": "RS256", "use": "sig",
                       "n": b64u(modulus), "e": b64u((65537).to_bytes(3, "big"))}},
              open(f"{d}/creds.json", "w"))


def oidc_token(d, port):
    c = json.load(open(f"{d}/creds.json"))
    claims = {"iss": f"http://127.0.0.1:{port}", "sub": "bench", "aud": "bench", "exp": c["far"],
              "iat": int(time.time()) - 5, "scope": "openid"}
    return token("RS256", claims, f"{d}/rsa.key", kid="bench")


def serve(d, port):
    c = json.load(open(f"{d}/creds.json"))
    base = f"http://127.0.0.1:{port}"
    docs = {
        "/.well-known/openid-configuration": {
            "issuer": base, "jwks_uri": base + "/jwks", "authorization_endpoint": base + "/authorize",
            "token_endpoint": base + "/token", "userinfo_endpoint": base + "/userinfo",
            "id_token_signing_alg_values_supported": ["RS256"]},
        "/jwks": {"keys": [c["jwk"]]},
    }

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(docs.get(self.path.split("?")[0], {})).encode()
            self.send_response(200 if self.path.split("?")[0] in docs else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "oidc-token":
        print(oidc_token(sys.argv[2], int(sys.argv[3])))
    else:
        write(sys.argv[1])
