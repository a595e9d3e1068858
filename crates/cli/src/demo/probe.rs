//! How the demo looks at its nodes: a GET of a node's JSON endpoints (`/replication`)
//! and bounded polling of a condition.
//!
//! The HTTP side is a one-request HTTP/1.0 exchange over loopback — all the demo needs
//! from the node's axum server, without an HTTP client stack in the binary — over TLS
//! once the demo has set its certificates ([`use_tls`]).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the demo's GETs show its secure nodes: its CA and client root's certificate.
static TLS: OnceLock<Arc<hawser_tls::rustls::ClientConfig>> = OnceLock::new();

/// Makes every later GET an HTTPS one with `config`.
pub(crate) fn use_tls(config: Arc<hawser_tls::rustls::ClientConfig>) {
    let _ = TLS.set(config);
}

/// Deadline of one HTTP request.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// How often [`wait_until`] checks its condition.
const POLL: Duration = Duration::from_millis(100);

/// GETs `path` from the HTTP server at `addr` and parses the body as JSON.
pub(crate) async fn get_json(addr: &str, path: &str) -> anyhow::Result<serde_json::Value> {
    let body = tokio::time::timeout(HTTP_TIMEOUT, get(addr, path))
        .await
        .with_context(|| format!("GET http://{addr}{path}: no answer within {HTTP_TIMEOUT:?}"))??;
    serde_json::from_str(&body).with_context(|| format!("GET http://{addr}{path}: not JSON"))
}

async fn get(addr: &str, path: &str) -> anyhow::Result<String> {
    let tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect to http://{addr}"))?;
    let response = match TLS.get() {
        None => exchange(tcp, addr, path).await?,
        Some(config) => {
            // The demo's node certificate names 127.0.0.1, where its nodes listen.
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).to_string();
            let name = hawser_tls::rustls::pki_types::ServerName::try_from(host)
                .with_context(|| format!("no server name in {addr}"))?;
            let tls = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name, tcp)
                .await
                .with_context(|| format!("TLS to https://{addr}"))?;
            exchange(tls, addr, path).await?
        }
    };
    let response = String::from_utf8(response).context("the HTTP response is not UTF-8")?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("malformed HTTP response")?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        bail!("GET http://{addr}{path}: HTTP {status}: {body}");
    }
    Ok(body.to_string())
}

/// One GET on `stream`, read to the end.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    addr: &str,
    path: &str,
) -> anyhow::Result<Vec<u8>> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    match stream.read_to_end(&mut response).await {
        Ok(_) => Ok(response),
        // A server that closes without TLS's close_notify after the whole answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {
            Ok(response)
        }
        Err(e) => Err(e.into()),
    }
}

/// Checks `probe` every [`POLL`] until it gives `Ok`, for at most `timeout`. `Err`
/// means "not yet" and says what the probe saw; the last one is in the error when
/// time runs out.
pub(crate) async fn wait_until<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match probe().await {
            Ok(v) => return Ok(v),
            Err(seen) => seen,
        };
        if Instant::now() >= deadline {
            bail!("{what}: not done after {timeout:?} (last seen: {last})");
        }
        tokio::time::sleep(POLL).await;
    }
}
