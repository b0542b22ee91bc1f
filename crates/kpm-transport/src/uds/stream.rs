//! Outgoing connections, each paying for its file descriptor with a permit
//! of the [fd budget](crate::fd), released exactly when the connection
//! closes, and counted in a [`LiveConnections`] while live when their
//! [`Dialer`](super::Dialer) was given one.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixSocket, UnixStream};
use tokio::sync::watch;

use crate::fd::{self, FdBudget, FdPermit};

/// Pause between connection attempts refused during the `refused_retry` window.
const REFUSED_RETRY_INTERVAL: Duration = Duration::from_millis(5);

/// A connected Unix stream and the fd permit it holds: dropping it closes
/// the socket and releases the permit together. For hyper, wrap it in
/// `hyper_util::rt::TokioIo`. Made by [`Dialer::stream`](super::Dialer::stream).
#[derive(Debug)]
pub struct PermittedStream {
    io: UnixStream,
    _permit: FdPermit,
    /// Where the connection is counted while live, if anywhere.
    observed: Option<Observed>,
}

impl PermittedStream {
    /// The stream itself.
    pub fn get_ref(&self) -> &UnixStream {
        &self.io
    }

    /// Counts this connection in `live` from the first bytes it reads until
    /// it ends.
    pub(super) fn counted_in(mut self, live: &LiveConnections) -> Self {
        self.observed = Some(Observed { live: Arc::clone(&live.count), state: LiveState::Pending });
        self
    }

    /// The connection ended (end-of-file, an IO error, a shutdown): it no
    /// longer counts as live.
    fn ended(&mut self) {
        if let Some(observed) = &mut self.observed {
            observed.ended();
        }
    }
}

/// The connections a [`Dialer`](super::Dialer) opened that are *live*: from
/// the first bytes the server sends (its HTTP/2 SETTINGS, right after the
/// handshake) until end-of-file, an IO error or the connection being
/// dropped. Counting from the first bytes rather than from `connect()`
/// keeps a socket whose listener never answers (a hung process, a server
/// that closes at once) from counting as connected.
///
/// The count comes from the connection's own reads: an HTTP/2 client always
/// has a read pending on its connection, so a server that closes the
/// socket, or a process that exits, is seen at once, with no polling and no
/// keepalive PINGs. Clones share the count.
#[derive(Debug, Clone, Default)]
pub struct LiveConnections {
    count: Arc<watch::Sender<usize>>,
}

impl LiveConnections {
    /// A count of zero, to give a [`Dialer`](super::Dialer) with
    /// [`Dialer::counted_in`](super::Dialer::counted_in).
    pub fn new() -> Self {
        Self::default()
    }

    /// The live connections now.
    pub fn count(&self) -> usize {
        *self.count.borrow()
    }

    /// The count, updated as connections come and go.
    pub fn subscribe(&self) -> watch::Receiver<usize> {
        self.count.subscribe()
    }
}

/// Where one observed connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LiveState {
    /// Connected, nothing received yet.
    Pending,
    /// The server has sent data; counted.
    Live,
    /// End-of-file, an error, or dropped.
    Ended,
}

/// An observed connection's count and its place in it.
#[derive(Debug)]
struct Observed {
    live: Arc<watch::Sender<usize>>,
    state: LiveState,
}

impl Observed {
    fn received_data(&mut self) {
        if self.state == LiveState::Pending {
            self.state = LiveState::Live;
            self.live.send_modify(|live| *live += 1);
        }
    }

    fn ended(&mut self) {
        if self.state == LiveState::Live {
            self.live.send_modify(|live| *live = live.saturating_sub(1));
        }
        self.state = LiveState::Ended;
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        self.ended();
    }
}

/// A permit and the socket it pays for, not yet connected.
#[derive(Debug)]
pub(super) struct Prepared {
    pub(super) permit: FdPermit,
    pub(super) socket: UnixSocket,
}

/// Connects `prepared`'s socket to `path`, with a fresh socket for each
/// refused attempt (a socket whose connect failed cannot be used again),
/// for up to `refused_retry` (a socket file exists from the server's
/// `bind()`, before its `listen()`).
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
            Ok(io) => return Ok(PermittedStream { io, _permit: permit, observed: None }),
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
        let this = self.get_mut();
        let asked = buf.remaining();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Some(observed) = &mut this.observed {
            match &result {
                Poll::Ready(Ok(())) if buf.filled().len() > before => observed.received_data(),
                Poll::Ready(Ok(())) if asked > 0 => observed.ended(),
                Poll::Ready(Err(_)) => observed.ended(),
                _ => {}
            }
        }
        result
    }
}

/// Writes go to the stream unchanged; a failed one, or a shutdown, ends an
/// observed connection.
impl AsyncWrite for PermittedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Err(_)) = result {
            this.ended();
        }
        result
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Err(_)) = result {
            this.ended();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_flush(cx);
        if let Poll::Ready(Err(_)) = result {
            this.ended();
        }
        result
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.ended();
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

impl AsFd for PermittedStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.io.as_fd()
    }
}
