//! gRPC over Unix domain sockets, the way the kubelet does it: dial the raw
//! filesystem path (no `unix://` URI, so any path works), no TLS, HTTP/2.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// Why a Unix-socket connection or listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Connecting to the socket failed (missing file, nobody listening, ...).
    #[error("dial {}: {}", path.display(), root_cause(source))]
    Dial {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    /// Connecting did not finish in time.
    #[error("dial {}: timed out after {timeout:?}", path.display())]
    DialTimeout { path: PathBuf, timeout: Duration },
    /// A live server already answers on the socket; it is not ours to remove.
    #[error("bind {}: socket is in use by a live server", path.display())]
    InUse { path: PathBuf },
    /// Removing a stale socket file or binding the new one failed.
    #[error("bind {}: {source}", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Pause between connection attempts refused during the `refused_retry` window.
const REFUSED_RETRY_INTERVAL: Duration = Duration::from_millis(5);

/// Connects to the gRPC server on the Unix socket `path`, waiting at most
/// `timeout` for the connection (including the HTTP/2 handshake).
pub async fn dial(path: &Path, timeout: Duration) -> Result<Channel, TransportError> {
    dial_patiently(path, timeout, Duration::ZERO).await
}

/// Like [`dial`], but a refused connection is retried every few milliseconds
/// for up to `refused_retry`. A socket file appears at `bind()`, before the
/// server calls `listen()`; plugins built on gRPC's C core leave a visible gap
/// there, and a refusal in it says nothing about the plugin's health.
pub async fn dial_patiently(
    path: &Path,
    timeout: Duration,
    refused_retry: Duration,
) -> Result<Channel, TransportError> {
    let socket = path.to_path_buf();
    // The URI is never resolved, the connector below ignores it; `localhost`
    // becomes the `:authority`, as with the kubelet's dialer.
    let endpoint = Endpoint::from_static("http://localhost").connect_timeout(timeout);
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move {
            let give_up = tokio::time::Instant::now() + refused_retry;
            loop {
                match UnixStream::connect(&socket).await {
                    Err(err)
                        if err.kind() == io::ErrorKind::ConnectionRefused
                            && tokio::time::Instant::now() < give_up =>
                    {
                        tokio::time::sleep(REFUSED_RETRY_INTERVAL).await;
                    }
                    connected => return connected.map(TokioIo::new),
                }
            }
        }
    }));
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(source)) => Err(TransportError::Dial { path: path.to_path_buf(), source }),
        Err(_) => Err(TransportError::DialTimeout { path: path.to_path_buf(), timeout }),
    }
}

/// Binds a listener on `path` for a tonic server
/// (`Server::builder().add_service(..).serve_with_incoming(incoming)`).
///
/// A socket file left behind by a dead server is removed first (`bind` would
/// fail otherwise); a socket a live server still answers on is never touched.
/// The caller owns the file afterwards and should remove it on shutdown.
pub async fn bind(path: &Path) -> Result<UnixListenerStream, TransportError> {
    let bind_err = |source| TransportError::Bind { path: path.to_path_buf(), source };
    match std::fs::symlink_metadata(path) {
        Ok(_) if UnixStream::connect(path).await.is_ok() => {
            return Err(TransportError::InUse { path: path.to_path_buf() });
        }
        Ok(_) => std::fs::remove_file(path).map_err(bind_err)?,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(bind_err(err)),
    }
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    Ok(UnixListenerStream::new(listener))
}

/// The innermost cause: tonic's own text is only "transport error", the OS
/// error underneath says what went wrong.
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}
