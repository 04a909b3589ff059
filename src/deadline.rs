//! Steps of a connection that must finish in time, shared by the HTTP listeners
//! (`dataplane::server`) and the stream proxy (`stream::tcp`): the helper that times them and
//! the limits both use.

use std::time::Duration;

/// How long a TLS handshake may take (nginx's `ssl_handshake_timeout`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `step` within `limit`: its error and its timeout become one message naming `what`
/// ("TLS handshake failed: ...", "TLS handshake timed out"), for the debug log or a stream's
/// close reason.
pub async fn within<T, E: std::fmt::Display>(
    limit: Duration,
    what: &str,
    step: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, step).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what} failed: {e}")),
        Err(_) => Err(format!("{what} timed out ({limit:?})")),
    }
}
