//! Outgoing connections, each paying for its file descriptor with a permit
//! of the [fd budget](crate::fd), released exactly when the connection closes.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::{UnixSocket, UnixStream};

use crate::TransportError;
use crate::fd::{self, FdBudget, FdPermit};

/// Pause between connection attempts refused during the `refused_retry` window.
const REFUSED_RETRY_INTERVAL: Duration = Duration::from_millis(5);

/// A connected Unix stream and the fd permit it holds: dropping it closes
/// the socket and releases the permit together. For hyper, wrap it in
/// `hyper_util::rt::TokioIo`.
#[derive(Debug)]
pub struct PermittedStream {
    io: UnixStream,
    _permit: FdPermit,
}

impl PermittedStream {
    /// The stream itself.
    pub fn get_ref(&self) -> &UnixStream {
        &self.io
    }
}

/// Connects to the Unix socket `path` with a permit of the process-wide
/// budget, waiting for one first; see [`connect_with_permit`]. To bound
/// only the connection in time, not the wait for a permit, acquire one
/// with [`fd::budget`] first.
pub async fn connect_stream(path: &Path, refused_retry: Duration) -> io::Result<PermittedStream> {
    let permit = fd::budget().acquire().await;
    connect_with_permit(path, refused_retry, permit).await
}

/// Connects to the Unix socket `path`, the connection holding `permit`. A
/// refused connection is retried every few milliseconds for up to
/// `refused_retry` (a socket file exists from the server's `bind()`, before
/// its `listen()`); a shortage of fds (`EMFILE`, `ENFILE`) is waited out,
/// never returned.
pub async fn connect_with_permit(
    path: &Path,
    refused_retry: Duration,
    permit: FdPermit,
) -> io::Result<PermittedStream> {
    let socket = new_socket(&permit.budget()).await?;
    connect_prepared(path, refused_retry, Prepared { permit, socket }).await
}

/// [`connect_with_permit`] for the crate's own clients: a failure is a
/// [`TransportError::Connect`] naming `path`.
pub(super) async fn dial_stream(
    path: &Path,
    refused_retry: Duration,
    permit: FdPermit,
) -> Result<PermittedStream, TransportError> {
    connect_with_permit(path, refused_retry, permit)
        .await
        .map_err(|source| TransportError::Connect { path: path.to_path_buf(), source })
}

/// A permit and the socket it pays for, not yet connected.
#[derive(Debug)]
pub(super) struct Prepared {
    pub(super) permit: FdPermit,
    pub(super) socket: UnixSocket,
}

/// Connects `prepared`'s socket to `path`, with a fresh socket for each
/// refused attempt (a socket whose connect failed cannot be used again).
pub(super) async fn connect_prepared(
    path: &Path,
    refused_retry: Duration,
    prepared: Prepared,
) -> io::Result<PermittedStream> {
    let Prepared { permit, mut socket } = prepared;
    // Past the clock's range: retry until the caller gives up.
    let give_up = tokio::time::Instant::now().checked_add(refused_retry);
    loop {
        match socket.connect(path).await {
            Ok(io) => return Ok(PermittedStream { io, _permit: permit }),
            Err(err)
                if err.kind() == io::ErrorKind::ConnectionRefused
                    && give_up.is_none_or(|at| tokio::time::Instant::now() < at) =>
            {
                tokio::time::sleep(REFUSED_RETRY_INTERVAL).await;
                socket = new_socket(&permit.budget()).await?;
            }
            Err(err) => return Err(err),
        }
    }
}

/// A new Unix stream socket; a shortage of fds is waited out, and recorded
/// in `budget`.
pub(super) async fn new_socket(budget: &FdBudget) -> io::Result<UnixSocket> {
    loop {
        match UnixSocket::new_stream() {
            Ok(socket) => {
                budget.fd_available();
                return Ok(socket);
            }
            Err(err) if fd::is_shortage(&err) => budget.wait_for_fd("socket").await,
            Err(err) => return Err(err),
        }
    }
}

impl AsyncRead for PermittedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

write_through_io!(PermittedStream);

impl AsFd for PermittedStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.io.as_fd()
    }
}
