//! The accept path of every server kpm runs: gRPC on Unix sockets
//! ([`Incoming`](super::Incoming)) and HTTP/1 on a Unix socket or TCP
//! ([`Http1Incoming`]).
//!
//! - Each accepted connection holds a [`ServerPermit`] of the
//!   [fd budget](crate::fd), taken after `accept()` (idle server
//!   connections are shed when none is free) and released when it closes.
//! - A connection that has not sent its HTTP/2 preface (the magic and its
//!   SETTINGS frame), or the head of its first HTTP/1 request, within the
//!   handshake timeout is closed ([`DEFAULT_HANDSHAKE_TIMEOUT`]).
//! - A connection is idle while no request is open on it, as the server
//!   reports through [`TrackRequests`]; a server without that layer has
//!   every connection count as idle.
//! - A shortage of fds (`EMFILE`, `ENFILE`) neither ends accepting nor
//!   spins: accepting pauses briefly, or, for a listener that keeps a spare
//!   fd, gives that up to accept the waiting client at once.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::time::Sleep;

use crate::fd::{self, Activity, FdBudget, OpenRequest, ServerPermit};

/// How long a client may take to send its HTTP/2 preface or its first
/// HTTP/1 request head before its connection is closed.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Octets of the HTTP/2 client magic (`PRI * HTTP/2.0…`), which a frame
/// header of 9 octets follows.
const MAGIC: usize = 24;
const FRAME_HEADER: usize = 9;

/// A listener kpm's servers accept on.
pub trait Listen: Send + 'static {
    /// An accepted connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// Accepts the next connection.
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Io>>;

    /// The address listened on, for logs: a socket path, or host and port.
    fn name(&self) -> Arc<str>;
}

impl Listen for UnixListener {
    type Io = UnixStream;

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<UnixStream>> {
        UnixListener::poll_accept(self, cx).map_ok(|(io, _)| io)
    }

    fn name(&self) -> Arc<str> {
        let path = self.local_addr().ok().and_then(|addr| addr.as_pathname().map(Path::to_owned));
        path.map_or_else(|| Arc::from(""), |path| Arc::from(path.display().to_string()))
    }
}

impl Listen for TcpListener {
    type Io = TcpStream;

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<TcpStream>> {
        TcpListener::poll_accept(self, cx).map_ok(|(io, _)| io)
    }

    fn name(&self) -> Arc<str> {
        self.local_addr().map_or_else(|_| Arc::from(""), |addr| Arc::from(addr.to_string()))
    }
}

/// What a client must send before its connection counts as set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    Http1,
    Http2,
}

type Paying = Pin<Box<dyn Future<Output = ServerPermit> + Send>>;

/// The accept loop shared by every server: accept, pay for the connection
/// with a permit, wait out shortages.
pub(crate) struct Acceptor<L: Listen> {
    listener: L,
    name: Arc<str>,
    protocol: Protocol,
    handshake_timeout: Duration,
    /// The process-wide budget unless set, looked up at the first accept:
    /// binding must not size it before `fd::init`.
    budget: Option<FdBudget>,
    /// Whether to keep a spare fd, and the spare while it is kept.
    keeps_spare: bool,
    spare: Option<std::fs::File>,
    /// Set after a shortage: accepting resumes when it fires.
    backoff: Option<Pin<Box<Sleep>>>,
    /// A connection accepted, waiting for its permit.
    paying: Option<(L::Io, Paying)>,
}

impl<L: Listen> std::fmt::Debug for Acceptor<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("listener", &self.name)
            .field("protocol", &self.protocol)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("spare", &self.spare.is_some())
            .field("paying", &self.paying.is_some())
            .finish_non_exhaustive()
    }
}

impl<L: Listen> Acceptor<L> {
    pub(crate) fn new(listener: L, protocol: Protocol) -> Self {
        Self {
            name: listener.name(),
            listener,
            protocol,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            budget: None,
            keeps_spare: false,
            spare: None,
            backoff: None,
            paying: None,
        }
    }

    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    pub(crate) fn set_handshake_timeout(&mut self, timeout: Duration) {
        self.handshake_timeout = timeout;
    }

    pub(crate) fn keep_spare_fd(&mut self) {
        self.keeps_spare = true;
    }

    pub(crate) fn set_budget(&mut self, budget: FdBudget) {
        self.budget = Some(budget);
    }

    /// The next connection and its admission. Never fails for a shortage
    /// of fds or a client that gave up before it was accepted.
    pub(crate) fn poll_accept(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(L::Io, Admission)>> {
        let budget = self.budget.get_or_insert_with(|| fd::budget().clone());
        loop {
            if let Some((io, mut paying)) = self.paying.take() {
                let Poll::Ready(permit) = paying.as_mut().poll(cx) else {
                    self.paying = Some((io, paying));
                    return Poll::Pending;
                };
                let admission = Admission::new(permit, self.protocol, self.handshake_timeout);
                return Poll::Ready(Ok((io, admission)));
            }
            if let Some(backoff) = &mut self.backoff {
                ready!(backoff.as_mut().poll(cx));
                self.backoff = None;
            }
            if self.keeps_spare && self.spare.is_none() {
                self.spare = spare_fd();
            }
            match ready!(self.listener.poll_accept(cx)) {
                Ok(io) => {
                    budget.fd_available();
                    let (budget, name) = (budget.clone(), Arc::clone(&self.name));
                    let paying = Box::pin(async move { budget.server_permit(name).await });
                    self.paying = Some((io, paying));
                }
                Err(err) if fd::is_shortage(&err) => {
                    budget.shortage("accept");
                    // Giving up the spare frees an fd for the waiting client
                    // at once; without one, the client waits in the backlog.
                    if self.spare.take().is_none() {
                        self.backoff = Some(Box::pin(tokio::time::sleep(fd::SHORTAGE_PAUSE)));
                    }
                }
                // The client gave up before it was accepted: take the next one.
                Err(err)
                    if matches!(
                        err.kind(),
                        io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(err) => return Poll::Ready(Err(err)),
            }
        }
    }
}

/// An fd to give up when fds run out (as nginx and libuv do); `None` while
/// none can be had.
fn spare_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// What an accepted connection holds: its permit, and its handshake until
/// the client completed it.
#[derive(Debug)]
pub(crate) struct Admission {
    permit: ServerPermit,
    handshake: Option<Handshake>,
}

#[derive(Debug)]
struct Handshake {
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
    progress: Progress,
}

/// How much of its handshake a client has sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// Octets of the preface seen, and the SETTINGS frame's length.
    Http2 { seen: usize, settings: usize },
    /// How much of the `\r\n\r\n` ending a request head was just seen.
    Http1 { matched: u8 },
}

impl Progress {
    fn new(protocol: Protocol) -> Self {
        match protocol {
            Protocol::Http1 => Self::Http1 { matched: 0 },
            Protocol::Http2 => Self::Http2 { seen: 0, settings: 0 },
        }
    }

    /// Takes in the next octets from the client; `true` once the handshake
    /// is complete.
    fn advance(&mut self, bytes: &[u8]) -> bool {
        for &byte in bytes {
            match self {
                Self::Http2 { seen, settings } => {
                    if (MAGIC..MAGIC + 3).contains(seen) {
                        *settings = (*settings << 8) | usize::from(byte);
                    }
                    *seen += 1;
                    if *seen >= MAGIC + FRAME_HEADER + *settings {
                        return true;
                    }
                }
                Self::Http1 { matched } => {
                    *matched = match (byte, *matched) {
                        (b'\r', 2) => 3,
                        (b'\n', 1 | 3) => *matched + 1,
                        (b'\r', _) => 1,
                        _ => 0,
                    };
                    if *matched == 4 {
                        return true;
                    }
                }
            }
        }
        false
    }
}

impl Admission {
    fn new(permit: ServerPermit, protocol: Protocol, timeout: Duration) -> Self {
        let handshake = Handshake {
            deadline: Box::pin(tokio::time::sleep(timeout)),
            timeout,
            progress: Progress::new(protocol),
        };
        Self { permit, handshake: Some(handshake) }
    }

    pub(crate) fn activity(&self) -> &Activity {
        self.permit.activity()
    }

    /// Before a read: fails once the connection was shed or its handshake
    /// timed out, and arranges to be woken for either. (A server always
    /// reads an idle or handshaking connection, so failing reads closes it.)
    fn poll_read_allowed(&mut self, socket: &str, cx: &mut Context<'_>) -> io::Result<()> {
        if self.permit.poll_shed(cx) {
            return Err(shed());
        }
        if let Some(handshake) = &mut self.handshake
            && handshake.deadline.as_mut().poll(cx).is_ready()
        {
            let timeout = handshake.timeout;
            tracing::debug!(socket, ?timeout, "closing a connection: no handshake in time");
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client sent no preface or request within {timeout:?}"),
            ));
        }
        Ok(())
    }

    /// Reads through `read` unless the connection was shed or its
    /// handshake timed out, and follows the handshake in what was read.
    pub(crate) fn poll_read(
        &mut self,
        socket: &str,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        read: impl FnOnce(&mut Context<'_>, &mut ReadBuf<'_>) -> Poll<io::Result<()>>,
    ) -> Poll<io::Result<()>> {
        self.poll_read_allowed(socket, cx)?;
        let start = buf.filled().len();
        ready!(read(cx, buf))?;
        if let Some(handshake) = &mut self.handshake
            && handshake.progress.advance(&buf.filled()[start..])
        {
            self.handshake = None;
        }
        Poll::Ready(Ok(()))
    }
}

fn shed() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "idle connection closed: the file descriptor budget ran short",
    )
}

/// The connections accepted on a listener for an HTTP/1 server (kpm's
/// status API and metrics): the same accept path as [`Incoming`](super::Incoming),
/// without the `:authority` rewriting HTTP/2 needs. Each one is an
/// [`Http1Connection`].
#[derive(Debug)]
pub struct Http1Incoming<L: Listen> {
    acceptor: Acceptor<L>,
}

impl<L: Listen> Http1Incoming<L> {
    /// Accepts on `listener`, with the process-wide budget and the default
    /// handshake timeout.
    pub fn new(listener: L) -> Self {
        Self { acceptor: Acceptor::new(listener, Protocol::Http1) }
    }

    pub(crate) fn from_acceptor(mut acceptor: Acceptor<L>) -> Self {
        acceptor.protocol = Protocol::Http1;
        Self { acceptor }
    }

    /// Closes connections that have not sent a request head within `timeout`.
    #[must_use]
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.acceptor.set_handshake_timeout(timeout);
        self
    }

    /// Keeps a spare fd, given up to accept a client when the process is out
    /// of fds, so that this server still answers at the limit.
    #[must_use]
    pub fn spare_fd(mut self) -> Self {
        self.acceptor.keep_spare_fd();
        self
    }

    /// Pays for connections from `budget` instead of the process-wide one.
    #[must_use]
    pub fn budget(mut self, budget: FdBudget) -> Self {
        self.acceptor.set_budget(budget);
        self
    }

    /// The address listened on: a socket path, or host and port.
    pub fn name(&self) -> &str {
        self.acceptor.name()
    }

    /// The next connection; see [`Self::accept`].
    pub fn poll_accept(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<Http1Connection<L::Io>>> {
        let (io, admission) = ready!(self.acceptor.poll_accept(cx))?;
        let socket = Arc::clone(self.acceptor.name());
        Poll::Ready(Ok(Http1Connection { io, admission, socket }))
    }

    /// The next connection. Errors are neither a shortage of fds (waited
    /// out) nor a client that gave up (skipped): the caller may retry after
    /// a pause.
    pub async fn accept(&mut self) -> io::Result<Http1Connection<L::Io>> {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }
}

/// A connection an HTTP/1 server accepted, holding its permit of the fd
/// budget; its bytes pass unchanged.
#[derive(Debug)]
pub struct Http1Connection<Io> {
    io: Io,
    admission: Admission,
    socket: Arc<str>,
}

impl<Io> Http1Connection<Io> {
    /// The connection's activity: put it in each request's extensions for
    /// [`TrackRequests`].
    pub fn activity(&self) -> &Activity {
        self.admission.activity()
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &Io {
        &self.io
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Http1Connection<Io> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let io = &mut this.io;
        this.admission.poll_read(&this.socket, cx, buf, |cx, buf| Pin::new(io).poll_read(cx, buf))
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Http1Connection<Io> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A tower layer for a server on kpm's accept path (tonic's
/// `Server::builder().layer(..)`, an axum `Router::layer`): each request
/// keeps its connection from counting as idle until its response body is
/// done, so that only idle connections are shed. It finds the connection
/// in the request's extensions: the [`ConnectionInfo`] tonic puts there,
/// or an [`Activity`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackRequests;

impl<S> tower::Layer<S> for TrackRequests {
    type Service = TrackRequestsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TrackRequestsService { inner }
    }
}

/// The service of [`TrackRequests`].
#[derive(Debug, Clone)]
pub struct TrackRequestsService<S> {
    inner: S,
}

impl<S, B, R> tower::Service<http::Request<B>> for TrackRequestsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Tracked<R>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let extensions = request.extensions();
        let open = extensions
            .get::<ConnectionInfo>()
            .map(|info| &info.activity)
            .or_else(|| extensions.get::<Activity>())
            .map(Activity::request);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| Tracked { body, open }))
        })
    }
}

/// A response body that keeps its request open until it ends or is dropped.
#[derive(Debug)]
pub struct Tracked<B> {
    body: B,
    open: Option<OpenRequest>,
}

impl<B: http_body::Body<Data = Bytes> + Unpin> http_body::Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
        if frame.is_none() {
            this.open = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// What tonic puts in the extensions of each request on a
/// [`Connection`](super::Connection): the peer's credentials and the
/// connection's [`Activity`].
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    peer: tonic::transport::server::UdsConnectInfo,
    activity: Activity,
}

impl ConnectionInfo {
    pub(crate) fn new(peer: tonic::transport::server::UdsConnectInfo, activity: Activity) -> Self {
        Self { peer, activity }
    }

    /// The peer's address and credentials, as tonic gives them.
    pub fn peer(&self) -> &tonic::transport::server::UdsConnectInfo {
        &self.peer
    }

    /// The connection's activity.
    pub fn activity(&self) -> &Activity {
        &self.activity
    }
}

#[cfg(test)]
mod tests;
