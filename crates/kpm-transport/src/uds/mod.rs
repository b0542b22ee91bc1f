//! gRPC over Unix domain sockets, the way the kubelet does it: dial the raw
//! filesystem path (no `unix://` URI, so any path works), no TLS, HTTP/2.
//!
//! Every gRPC server kpm runs on a Unix socket accepts through [`bind`] (or
//! [`Incoming::new`]), whose connections take any `:authority` grpc-go sends,
//! the socket's path included (see [`Connection`]), and never stop nor spin
//! on a shortage of fds. Every connection kpm dials holds a permit of the
//! [fd budget](crate::fd) for as long as it is open ([`PermittedStream`]),
//! and so does every connection its servers accept ([`Incoming`],
//! [`Http1Incoming`]): those must complete their handshake in time, and
//! the idle ones are shed when the budget runs short.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};

use kpm_api::FileId;

use crate::error::TransportError;
use crate::fd::{self, FdPermit};

/// `AsyncWrite` for a stream type whose writes all go, unchanged, to its
/// `io` field (reads may not: see [`Connection`]).
macro_rules! write_through_io {
    ($type:ty) => {
        impl tokio::io::AsyncWrite for $type {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.io.is_write_vectored()
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
            }
        }
    };
}

mod authority;
mod bare_ping;
mod client;
mod incoming;
mod server;
mod stream;

pub use authority::MAX_HEADER_BLOCK;
pub use bare_ping::bare_ping;
pub use client::{CallError, PINGS_PER_CALL, ResponseBody, SmallBufferCodec, UdsChannel};
pub use incoming::{Connection, Incoming};
pub use server::{
    ConnectionInfo, DEFAULT_HANDSHAKE_TIMEOUT, Http1Connection, Http1Incoming, Listen,
    TrackRequests, TrackRequestsService, Tracked,
};
pub use stream::{PermittedStream, connect_stream, connect_with_permit};

/// Connects to the gRPC server on the Unix socket `path`, waiting at most
/// `timeout` for the connection (including the HTTP/2 handshake).
///
/// The connection holds a permit of the [fd budget](crate::fd), waited for
/// before the timeout starts, as is an fd shortage: kpm's own lack of fds
/// is never a plugin's failure.
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
    dial_with_peer(path, timeout, refused_retry).await.map(|(channel, _)| channel)
}

/// Like [`dial_patiently`], and also says which process serves the socket:
/// the pid the kernel recorded when the server called `listen()`
/// (`SO_PEERCRED`), in kpm's pid namespace. `None` when the kernel reports 0:
/// the server runs in a pid namespace kpm cannot see into.
pub async fn dial_with_peer(
    path: &Path,
    timeout: Duration,
    refused_retry: Duration,
) -> Result<(Channel, Option<u32>), TransportError> {
    let permit = fd::budget().acquire().await;
    dial_with_permit(path, timeout, refused_retry, permit).await
}

/// Like [`dial_with_peer`], with a permit the caller took: from a budget of
/// its own, or an optional holder's from
/// [`FdBudget::try_acquire`](crate::fd::FdBudget::try_acquire). Should the
/// channel reconnect later, the new connection waits for a permit of its
/// own from the same budget.
pub async fn dial_with_permit(
    path: &Path,
    timeout: Duration,
    refused_retry: Duration,
    permit: FdPermit,
) -> Result<(Channel, Option<u32>), TransportError> {
    let budget = permit.budget();
    let socket = stream::new_socket(&budget)
        .await
        .map_err(|source| TransportError::Socket { path: path.to_path_buf(), source })?;
    // Taken by the first connection; a reconnection prepares its own.
    let first = Arc::new(Mutex::new(Some(stream::Prepared { permit, socket })));
    let target: Arc<Path> = Arc::from(path);
    let peer = Arc::new(OnceLock::new());
    let seen = Arc::clone(&peer);
    // The URI is never resolved, the connector below ignores it; `localhost`
    // becomes the `:authority`, as with the kubelet's dialer.
    let endpoint = Endpoint::from_static("http://localhost").connect_timeout(timeout);
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
        let (target, first, seen) = (Arc::clone(&target), Arc::clone(&first), Arc::clone(&seen));
        let budget = budget.clone();
        async move {
            let prepared = first.lock().unwrap_or_else(PoisonError::into_inner).take();
            let prepared = match prepared {
                Some(prepared) => prepared,
                None => stream::Prepared {
                    permit: budget.acquire().await,
                    socket: stream::new_socket(&budget).await?,
                },
            };
            let stream = stream::connect_prepared(&target, refused_retry, prepared).await?;
            // The first connection's answer; a reconnection keeps it.
            let _ = seen.set(server_pid(stream.get_ref()));
            Ok::<_, io::Error>(TokioIo::new(stream))
        }
    }));
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(channel)) => Ok((channel, peer.get().copied().flatten())),
        Ok(Err(source)) => Err(TransportError::Dial { path: path.to_path_buf(), source }),
        Err(_) => Err(TransportError::DialTimeout { path: path.to_path_buf(), timeout }),
    }
}

/// The process serving the other end of `stream`, from `SO_PEERCRED`: the
/// one that called `listen()`, in kpm's pid namespace. `None` when the
/// kernel reports 0 (a pid namespace kpm cannot see into) or cannot tell.
pub(crate) fn server_pid(stream: &UnixStream) -> Option<u32> {
    let pid = stream.peer_cred().ok()?.pid()?;
    u32::try_from(pid).ok().filter(|&pid| pid != 0)
}

/// Binds a listener on `path` for a tonic server
/// (`Server::builder().add_service(..).serve_with_incoming(incoming)`), whose
/// connections accept any `:authority` (see [`Connection`]).
///
/// A socket file left behind by a dead server is removed first (`bind` would
/// fail otherwise); a socket a live server still answers on is never touched.
/// The caller owns the file afterwards and should remove it on shutdown.
pub async fn bind(path: &Path) -> Result<Incoming, TransportError> {
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
    Ok(Incoming::new(listener))
}

/// The socket path of a plugin's endpoint. The kubelet dials an endpoint
/// as a raw path; some plugins (CSI drivers) report a gRPC target instead
/// (`unix:///csi/csi.sock` or `unix:/csi/csi.sock`), so a `unix://` or
/// `unix:` prefix is stripped and both forms work.
pub fn endpoint_path(endpoint: &str) -> &Path {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    Path::new(path)
}

/// The identity of the file at `path` (not following a symlink), if it can
/// be read: what tells a socket re-created there from the one seen before.
pub fn file_id_at(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path).ok().map(|meta| FileId::of(&meta))
}

/// Mode of the sockets kpm serves itself (`kubelet.sock`, `kpm.sock`): only
/// the owner (root on a node) may connect, as with the kubelet's sockets,
/// which need write permission and are created 0755.
pub const OWNER_ONLY: u32 = 0o600;

/// Like [`bind`], then restricts the socket file to `mode` and records which
/// file it is, so that shutdown removes only that file.
pub async fn bind_with_mode(
    path: &Path,
    mode: u32,
) -> Result<(Incoming, BoundSocket), TransportError> {
    use std::os::unix::fs::PermissionsExt as _;
    let incoming = bind(path).await?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|source| TransportError::Bind { path: path.to_path_buf(), source })?;
    Ok((incoming, BoundSocket::new(path)))
}

/// A socket file a server bound. Removed on shutdown only while it is still
/// that file: a newer server may have replaced it at the same path, and kpm
/// never unlinks a socket it does not own.
#[derive(Debug, Clone)]
pub struct BoundSocket {
    path: PathBuf,
    file: Option<FileId>,
}

impl BoundSocket {
    /// Records the file at `path`; call it right after binding.
    pub fn new(path: &Path) -> Self {
        Self { path: path.to_path_buf(), file: file_id_at(path) }
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file if it is still the one bound. `Ok(false)`: it was
    /// already gone, or replaced and left alone. Call it while the listener
    /// is still open: that keeps the inode from being reused meanwhile.
    pub fn remove(&self) -> io::Result<bool> {
        let Some(ours) = self.file else { return Ok(false) };
        match file_id_at(&self.path) {
            Some(now) if now == ours => match std::fs::remove_file(&self.path) {
                Ok(()) => Ok(true),
                Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(err) => Err(err),
            },
            _ => Ok(false),
        }
    }
}

/// A request that carries `timeout` as its gRPC deadline (`grpc-timeout`), so
/// the plugin knows how long it has. The header cannot carry more than about
/// 11,000 years, so the deadline sent is at most
/// [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION).
pub fn timed_request<M>(message: M, timeout: Duration) -> tonic::Request<M> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout.min(kpm_api::constants::MAX_CONFIG_DURATION));
    request
}

/// Awaits `call` for at most `timeout`; `Err(None)` means it ran out of time.
/// The deadline sent along with the call can fire a moment before ours, with
/// whatever code the client or server picks: any failure once the time is up
/// counts as running out of time.
pub async fn within<T, E>(
    timeout: Duration,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, Option<E>> {
    let started = tokio::time::Instant::now();
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(_)) if started.elapsed() >= timeout => Err(None),
        Ok(Err(err)) => Err(Some(err)),
        Err(_) => Err(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn within_tells_running_out_of_time_from_failing() {
        let second = Duration::from_secs(1);
        assert_eq!(within(second, async { Ok::<_, &str>(7) }).await, Ok(7));
        assert_eq!(within(second, async { Err::<(), _>("refused") }).await, Err(Some("refused")));
        let hang = within(second, std::future::pending::<Result<(), &str>>());
        assert_eq!(hang.await, Err(None));
        // A failure that arrives only when the time is up is the timeout.
        let late = within(second, async {
            tokio::time::sleep(second).await;
            Err::<(), _>("cancelled by the client's own deadline")
        });
        assert_eq!(late.await, Err(None));
        assert!(timed_request((), second).metadata().get("grpc-timeout").is_some());
    }
}
