//! The `Authorization: Signature ...` header: `keyId`, `algorithm`, `headers` and `signature`
//! as quoted, comma-separated fields (APISIX 3.x's shape; other fields are ignored). The parser
//! borrows from the header and refuses what it cannot read; it is fuzzed (`hmac_authorization`).

/// The fields of a `Signature` authorization.
#[derive(Debug, PartialEq, Eq)]
pub struct Params<'a> {
    /// `keyId`: the credential.
    pub key_id: &'a str,
    /// `algorithm`: `hmac-sha1`, `hmac-sha256`, `hmac-sha512`.
    pub algorithm: &'a str,
    /// `headers`: the signed header names (and `@request-target`), in order.
    pub headers: Vec<&'a str>,
    /// `signature`: base64 of the MAC.
    pub signature: &'a str,
}

/// Parses the header's value. Errors are APISIX's answer texts.
pub fn parse_authorization(value: &str) -> Result<Params<'_>, &'static str> {
    let Some(rest) = value.strip_prefix("Signature") else {
        return Err("client request can't be validated: Authorization header does not start with 'Signature'");
    };
    let (mut key_id, mut algorithm, mut signature, mut headers) = (None, None, None, Vec::new());
    for field in rest.split(',') {
        let field = field.trim_start();
        let Some((key, quoted)) = field.split_once('=') else { continue };
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric()) {
            continue;
        }
        let Some(value) = quoted.strip_prefix('"').and_then(|q| q.split_once('"')).map(|(v, _)| v) else { continue };
        match key {
            "keyId" => key_id = Some(value),
            "algorithm" => algorithm = Some(value),
            "signature" => signature = Some(value),
            "headers" => headers = value.split(' ').filter(|h| !h.is_empty()).collect(),
            _ => {}
        }
    }
    match (key_id, algorithm, signature) {
        (Some(key_id), Some(algorithm), Some(signature)) if !key_id.is_empty() && !signature.is_empty() => {
            Ok(Params { key_id, algorithm, headers, signature })
        }
        (_, None, Some(_)) => Err("client request can't be validated: algorithm missing"),
        _ => Err("client request can't be validated: keyId or signature missing"),
    }
}

/// Fuzzing entry point: any bytes, as a header value, must parse or be refused, never panic.
pub fn fuzz_authorization(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = parse_authorization(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apisix_headers_parse() {
        let v = r#"Signature keyId="john-key",algorithm="hmac-sha256",headers="@request-target date",signature="wWfKQvPDr0wHQ4IHdluB4IzeNZcj0bGJs2wvoCOT5rM=""#;
        let p = parse_authorization(v).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.key_id, "john-key");
        assert_eq!(p.algorithm, "hmac-sha256");
        assert_eq!(p.headers, ["@request-target", "date"]);
        assert_eq!(p.signature, "wWfKQvPDr0wHQ4IHdluB4IzeNZcj0bGJs2wvoCOT5rM=");
    }

    #[test]
    fn unreadable_headers_are_refused() {
        for bad in [
            "Bearer x",
            "Signature",
            r#"Signature keyId="k""#,
            r#"Signature keyId="",algorithm="a",signature="s""#,
            r#"Signature keyId="k",signature="s""#,
        ] {
            assert!(parse_authorization(bad).is_err(), "{bad}");
        }
        // Unquoted and unknown fields are ignored, not misread.
        let p = parse_authorization(r#"Signature keyId=k,keyId="real",x="y",algorithm="hmac-sha1",signature="c2ln""#);
        assert_eq!(p.map(|p| p.key_id), Ok("real"));
    }
}
