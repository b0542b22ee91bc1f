//! The connections a gRPC server of kpm's accepts on a Unix socket, each read
//! through an [`authority::Rewriter`](super::authority).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf as _, Bytes, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::Stream;
use tonic::transport::server::Connected;

use super::authority::{Malformed, Rewriter, Scan};
use super::server::{Acceptor, Admission, ConnectionInfo, Http1Incoming, Protocol};
use crate::fd::{Activity, FdBudget};

/// How much more to read at a time while a frame header or a header block is
/// incomplete.
const HELD_READ: usize = 8 * 1024;

/// The connections accepted on a socket bound by [`bind`](super::bind), for
/// tonic's `serve_with_incoming`. Each one is a [`Connection`].
///
/// The stream never ends, and never yields an error for a shortage of fds
/// or a connection aborted before it was accepted: tonic's server goes on
/// polling at once after an error, which would spin. A shortage pauses
/// accepting briefly (tokio time) and is logged once per episode by the
/// [fd budget](crate::fd). Each connection holds a permit of that budget
/// and must send its HTTP/2 preface within the handshake timeout
/// ([`Incoming::handshake_timeout`]); [`TrackRequests`](super::TrackRequests)
/// is the layer that tells its idle connections from busy ones.
#[derive(Debug)]
pub struct Incoming {
    acceptor: Acceptor<UnixListener>,
    socket: Arc<Path>,
}

impl Incoming {
    /// Accepts on a listener made elsewhere (an inherited or pre-bound
    /// socket). Prefer [`bind`](super::bind), which also replaces a stale file.
    pub fn new(listener: UnixListener) -> Self {
        let socket = listener
            .local_addr()
            .ok()
            .and_then(|addr| addr.as_pathname().map(Arc::from))
            .unwrap_or_else(|| Arc::from(Path::new("")));
        Self { acceptor: Acceptor::new(listener, Protocol::Http2), socket }
    }

    /// Closes connections that have not sent their HTTP/2 preface within
    /// `timeout` ([`DEFAULT_HANDSHAKE_TIMEOUT`](super::DEFAULT_HANDSHAKE_TIMEOUT)
    /// unless set).
    #[must_use]
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.acceptor.set_handshake_timeout(timeout);
        self
    }

    /// Pays for connections from `budget` instead of the process-wide one.
    #[must_use]
    pub fn budget(mut self, budget: FdBudget) -> Self {
        self.acceptor.set_budget(budget);
        self
    }

    /// The same listener for a server that speaks HTTP/1 (the status API):
    /// it has no `:authority` to worry about.
    pub fn into_http1(self) -> Http1Incoming<UnixListener> {
        Http1Incoming::from_acceptor(self.acceptor)
    }
}

impl Stream for Incoming {
    type Item = io::Result<Connection>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let (io, admission) = ready!(this.acceptor.poll_accept(cx))?;
        Poll::Ready(Some(Ok(Connection::new(io, admission, Arc::clone(&this.socket)))))
    }
}

/// One accepted connection. What the server writes goes to the client as it
/// is; what the client sends reaches the server with every header block's
/// `:authority` made one h2 accepts, so grpc-go clients that send the socket's
/// path get the same answers as any other. Frames other than header blocks
/// are read straight into the server's buffer; only what shares a read with a
/// header block is copied once more.
#[derive(Debug)]
pub struct Connection {
    io: UnixStream,
    admission: Admission,
    socket: Arc<Path>,
    client: ClientBytes,
}

impl Connection {
    fn new(io: UnixStream, admission: Admission, socket: Arc<Path>) -> Self {
        Self { io, admission, socket, client: ClientBytes::default() }
    }

    /// The connection's activity, which tonic hands to
    /// [`TrackRequests`](super::TrackRequests) in [`ConnectionInfo`].
    pub fn activity(&self) -> &Activity {
        self.admission.activity()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let Self { io, socket, client, admission } = self.get_mut();
        admission.poll_read(&socket.to_string_lossy(), cx, buf, |cx, buf| {
            client.poll_read(io, socket, cx, buf)
        })
    }
}

/// The client-to-server direction of a connection: the rewriter, and the
/// bytes it holds back.
#[derive(Debug, Default)]
struct ClientBytes {
    rewriter: Rewriter,
    /// Client bytes read but not yet handed on: an incomplete frame header or
    /// header block, and whatever came with it.
    held: BytesMut,
    /// Rewritten frames not yet handed on.
    rewritten: Bytes,
    /// The client closed its side while bytes were held.
    closed: bool,
}

impl ClientBytes {
    fn poll_read<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        socket: &Path,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if ready!(self.poll_held(io, socket, cx, buf))? {
                return Poll::Ready(Ok(()));
            }
            let start = buf.filled().len();
            ready!(Pin::new(&mut *io).poll_read(cx, buf))?;
            if buf.filled().len() == start {
                return Poll::Ready(Ok(())); // end of stream
            }
            self.scan_fresh(socket, buf, start)?;
            if buf.filled().len() > start {
                return Poll::Ready(Ok(()));
            }
            // All of it is held: hand on what can be, or read on.
        }
    }

    /// Hands on rewritten frames, then held bytes; reads more while what is
    /// held cannot be decided. `Ready(Ok(false))`: nothing is held any more.
    fn poll_held<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        socket: &Path,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<bool>> {
        loop {
            if !self.rewritten.is_empty() {
                let n = self.rewritten.len().min(buf.remaining());
                buf.put_slice(&self.rewritten.split_to(n));
                return Poll::Ready(Ok(true));
            }
            if self.held.is_empty() {
                return Poll::Ready(Ok(false));
            }
            match self.rewriter.scan(&self.held).map_err(|err| malformed(socket, &err))? {
                Scan::Pass(n) => {
                    let n = n.min(buf.remaining());
                    buf.put_slice(&self.held[..n]);
                    self.held.advance(n);
                    self.rewriter.passed(n);
                    return Poll::Ready(Ok(true));
                }
                Scan::Rewrite { len, frames } => {
                    self.held.advance(len);
                    self.rewritten = frames.into();
                }
                Scan::NeedMore if self.closed => {
                    tracing::debug!(socket = %socket.display(), "client closed the connection inside a frame");
                    self.held.clear();
                    return Poll::Ready(Ok(false));
                }
                Scan::NeedMore => {
                    self.held.reserve(HELD_READ);
                    let read = ready!(tokio_util::io::poll_read_buf(
                        Pin::new(&mut *io),
                        cx,
                        &mut self.held
                    ))?;
                    self.closed = read == 0;
                }
            }
        }
    }

    /// Scans what was just read into `buf` from `start` on: what can pass
    /// stays, the rest is taken out and held.
    fn scan_fresh(&mut self, socket: &Path, buf: &mut ReadBuf<'_>, start: usize) -> io::Result<()> {
        let fresh = &buf.filled()[start..];
        let mut kept = 0;
        while kept < fresh.len() {
            match self.rewriter.scan(&fresh[kept..]).map_err(|err| malformed(socket, &err))? {
                Scan::Pass(n) => {
                    self.rewriter.passed(n);
                    kept += n;
                }
                Scan::Rewrite { len, frames } => {
                    self.rewritten = frames.into();
                    self.held.extend_from_slice(&fresh[kept + len..]);
                    break;
                }
                Scan::NeedMore => {
                    self.held.extend_from_slice(&fresh[kept..]);
                    break;
                }
            }
        }
        buf.set_filled(start + kept);
        Ok(())
    }
}

/// Logs why a connection closes, and the error that closes it.
fn malformed(socket: &Path, err: &Malformed) -> io::Error {
    tracing::debug!(socket = %socket.display(), error = %err, "closing a connection: malformed HTTP/2 from the client");
    io::Error::new(io::ErrorKind::InvalidData, format!("HTTP/2 from the client: {err}"))
}

write_through_io!(Connection);

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnectionInfo::new(self.io.connect_info(), self.activity().clone())
    }
}

impl AsFd for Connection {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.io.as_fd()
    }
}

#[cfg(test)]
mod tests;
