//! gRPC over Unix domain sockets, the way the kubelet does it: dial the raw
//! filesystem path (no `unix://` URI, so any path works), no TLS, HTTP/2.
//!
//! Every gRPC server kpm runs on a Unix socket accepts through [`bind`] (or
//! [`Incoming::new`]), whose connections take any `:authority` grpc-go sends,
//! the socket's path included (see [`Connection`]), and never stop nor spin
//! on a shortage of fds. Every connection kpm dials, through a [`Dialer`],
//! holds a permit of the dialer's [fd budget](crate::fd) for as long as it
//! is open ([`PermittedStream`]),
//! and so does every connection its servers accept ([`Incoming`],
//! [`Http1Incoming`]): those must complete their handshake in time, and
//! the idle ones are shed when the budget runs short.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};

use kpm_api::FileId;

use crate::error::TransportError;

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
mod dialer;
mod host_root;
mod incoming;
mod server;
mod stream;

pub use authority::MAX_HEADER_BLOCK;
pub use client::{CallError, PINGS_PER_CALL, ResponseBody, SmallBufferCodec, UdsChannel};
pub use dialer::{Dialer, GrpcChannel};
pub use host_root::{HostRoot, Reach};
pub use incoming::{Connection, Incoming};
pub use server::{
    ConnectionInfo, DEFAULT_HANDSHAKE_TIMEOUT, Http1Connection, Http1Incoming, Listen,
    TrackRequests, TrackRequestsService, Tracked,
};
pub use stream::{LiveConnections, PermittedStream};

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

/// Why a call bounded by [`timed_call`] gave no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TimedCallError<E> {
    /// The call did not finish in time, or failed once its time was up.
    #[error("timed out")]
    TimedOut,
    /// The call failed before its time was up.
    #[error(transparent)]
    Failed(E),
}

/// Awaits `call` for at most `timeout`. The deadline sent along with the
/// call ([`timed_request`]) can fire a moment before ours, with whatever
/// code the client or server picks: any failure once the time is up counts
/// as [`TimedCallError::TimedOut`].
pub async fn timed_call<T, E>(
    timeout: Duration,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, TimedCallError<E>> {
    let started = tokio::time::Instant::now();
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(_)) if started.elapsed() >= timeout => Err(TimedCallError::TimedOut),
        Ok(Err(err)) => Err(TimedCallError::Failed(err)),
        Err(_) => Err(TimedCallError::TimedOut),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn timed_call_tells_running_out_of_time_from_failing() {
        let second = Duration::from_secs(1);
        assert_eq!(timed_call(second, async { Ok::<_, &str>(7) }).await, Ok(7));
        let refused = timed_call(second, async { Err::<(), _>("refused") }).await;
        assert_eq!(refused, Err(TimedCallError::Failed("refused")));
        let hang = timed_call(second, std::future::pending::<Result<(), &str>>());
        assert_eq!(hang.await, Err(TimedCallError::TimedOut));
        // A failure that arrives only when the time is up is the timeout.
        let late = timed_call(second, async {
            tokio::time::sleep(second).await;
            Err::<(), _>("cancelled by the client's own deadline")
        });
        assert_eq!(late.await, Err(TimedCallError::TimedOut));
        assert!(timed_request((), second).metadata().get("grpc-timeout").is_some());
    }
}
