//! The long-lived gRPC connection to one instance's service socket, with its
//! state observed (spec C.5, the kubelet's stats handler).
//!
//! # How a drop is noticed
//!
//! The connection is a [`UdsChannel`] whose IO type wraps the
//! [`PermittedStream`] and reports on the connection's own reads: the HTTP/2
//! client always has a read pending on its connection (to receive frames),
//! so a server that closes the socket, or a process that exits, is seen at
//! once as end-of-file or a read error. No polling and no keepalive pings
//! are involved.
//!
//! A connection counts as *live* from the first bytes the server sends (its
//! HTTP/2 SETTINGS, right after the handshake) until end-of-file, an IO
//! error or the connection being dropped. Counting from the first bytes
//! rather than from `connect()` keeps a socket whose listener never answers
//! (a hung process, a non-gRPC server that closes at once) from counting as
//! connected. [`Connection::subscribe`] gives the number of live connections
//! (normally 0 or 1; briefly 2 while a channel is replaced).
//!
//! Reconnecting is the monitor's job (see `manager.rs`): while nothing is
//! live it dials a fresh channel every [`RECONNECT_INTERVAL`] and swaps it
//! in with [`Connection::replace_channel`]. A channel never reconnects by
//! itself: a call made before the first connection, or on a connection that
//! closed, fails as unavailable.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use kpm_transport::fd::FdBudget;
use kpm_transport::{PermittedStream, TransportError, UdsChannel};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::Instant;

/// How long one dial (connect and HTTP/2 handshake) may take, and how long a
/// new connection may take to show the server's first bytes.
pub(crate) const DIAL_TIMEOUT: Duration = Duration::from_secs(1);

/// Pause between reconnect attempts while an instance is disconnected.
pub(crate) const RECONNECT_INTERVAL: Duration = Duration::from_millis(250);

/// The channel to one instance and the count of its live connections.
#[derive(Debug)]
pub(crate) struct Connection {
    socket: PathBuf,
    live: Arc<watch::Sender<usize>>,
    channel: parking_lot::Mutex<Option<UdsChannel>>,
    budget: FdBudget,
}

impl Connection {
    /// A connection to `socket` that has not connected yet, paid from
    /// `budget`; [`Connection::reconnect`] connects it.
    pub(crate) fn new(socket: &Path, budget: FdBudget) -> Self {
        let live = Arc::new(watch::Sender::new(0));
        let channel = parking_lot::Mutex::new(None);
        Self { socket: socket.to_path_buf(), live, channel, budget }
    }

    /// The current channel (cheap to clone; calls on it share the
    /// connection); unavailable before the first connection.
    pub(crate) fn channel(&self) -> Result<UdsChannel, tonic::Status> {
        self.channel.lock().clone().ok_or_else(|| {
            tonic::Status::unavailable(format!("not connected to {}", self.socket.display()))
        })
    }

    /// Whether a connection is live.
    pub(crate) fn is_connected(&self) -> bool {
        *self.live.borrow() > 0
    }

    /// The number of live connections, updated as they come and go.
    pub(crate) fn subscribe(&self) -> watch::Receiver<usize> {
        self.live.subscribe()
    }

    /// Dials a new channel: connects and completes the client side of the
    /// HTTP/2 handshake, by `deadline`.
    async fn dial(&self, deadline: Instant) -> Result<UdsChannel, TransportError> {
        let live = Arc::clone(&self.live);
        let monitored =
            move |inner: PermittedStream| MonitoredIo { inner, live, state: IoState::Pending };
        let timeout = deadline.saturating_duration_since(Instant::now());
        let permit = self.budget.acquire().await;
        UdsChannel::connect_with(&self.socket, timeout, Duration::ZERO, permit, monitored).await
    }

    /// Makes `channel` the one calls use; the previous one is dropped, which
    /// closes its connection once no call uses it.
    fn replace_channel(&self, channel: UdsChannel) {
        drop(self.channel.lock().replace(channel));
    }

    /// Dials, swaps the new channel in and waits for the server's first
    /// bytes, all within [`DIAL_TIMEOUT`]. Returns whether the instance is
    /// connected afterwards; an error says why dialing failed.
    pub(crate) async fn reconnect(&self) -> Result<bool, TransportError> {
        let deadline = Instant::now() + DIAL_TIMEOUT;
        let channel = self.dial(deadline).await?;
        self.replace_channel(channel);
        let mut live = self.subscribe();
        let connected = tokio::time::timeout_at(deadline, live.wait_for(|live| *live > 0)).await;
        Ok(matches!(connected, Ok(Ok(_))))
    }
}

/// Where one connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IoState {
    /// Connected, nothing received yet.
    Pending,
    /// The server has sent data; counted in `live`.
    Live,
    /// End-of-file, an error, or dropped.
    Ended,
}

/// A Unix stream that reports its state to the instance's `live` count.
#[derive(Debug)]
pub(crate) struct MonitoredIo {
    inner: PermittedStream,
    live: Arc<watch::Sender<usize>>,
    state: IoState,
}

impl MonitoredIo {
    fn received_data(&mut self) {
        if self.state == IoState::Pending {
            self.state = IoState::Live;
            self.live.send_modify(|live| *live += 1);
        }
    }

    fn ended(&mut self) {
        if self.state == IoState::Live {
            self.live.send_modify(|live| *live = live.saturating_sub(1));
        }
        self.state = IoState::Ended;
    }
}

impl Drop for MonitoredIo {
    fn drop(&mut self) {
        self.ended();
    }
}

impl AsyncRead for MonitoredIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let asked = buf.remaining();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        match &result {
            Poll::Ready(Ok(())) if buf.filled().len() > before => this.received_data(),
            Poll::Ready(Ok(())) if asked > 0 => this.ended(),
            Poll::Ready(Err(_)) => this.ended(),
            _ => {}
        }
        result
    }
}

impl AsyncWrite for MonitoredIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Err(_)) = result {
            this.ended();
        }
        result
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_flush(cx);
        if let Poll::Ready(Err(_)) = result {
            this.ended();
        }
        result
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.ended();
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Err(_)) = result {
            this.ended();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    #[tokio::test]
    async fn a_connection_is_live_from_the_first_bytes_until_end_of_file() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("raw.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let live = Arc::new(watch::Sender::new(0_usize));
        let mut io = MonitoredIo {
            inner: kpm_transport::connect_stream(&socket, Duration::ZERO).await.unwrap(),
            live: Arc::clone(&live),
            state: IoState::Pending,
        };
        let (mut server, _) = listener.accept().await.unwrap();
        assert_eq!(*live.borrow(), 0, "connected but silent is not live");

        server.write_all(b"hello").await.unwrap();
        let mut buf = [0_u8; 16];
        let read = tokio::io::AsyncReadExt::read(&mut io, &mut buf).await.unwrap();
        assert_eq!(read, 5);
        assert_eq!(*live.borrow(), 1);

        drop(server);
        let read = tokio::io::AsyncReadExt::read(&mut io, &mut buf).await.unwrap();
        assert_eq!(read, 0);
        assert_eq!(*live.borrow(), 0, "end-of-file ends the connection");
        drop(io);
        assert_eq!(*live.borrow(), 0, "dropping an ended connection counts nothing twice");
    }

    #[tokio::test]
    async fn reconnecting_to_a_missing_socket_fails_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let connection = Connection::new(&dir.path().join("missing.sock"), FdBudget::default());
        let err = kpm_api::gotext::error_chain(&connection.reconnect().await.unwrap_err());
        assert!(err.contains("No such file or directory"), "{err}");
        assert!(!connection.is_connected());
    }
}
