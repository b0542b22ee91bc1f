//! How the fakes (features `csi` and `registration`) are served: a tonic
//! server on the current runtime on a real Unix socket, over connections
//! that count themselves and that the test can freeze.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio_stream::StreamExt as _;
use tonic::service::Routes;

/// The connections of a served fake. Each fake's `Served` reads the fields
/// its tests ask about.
#[derive(Debug)]
pub(crate) struct Connections {
    /// Accepted and not yet closed.
    pub(crate) open: watch::Sender<usize>,
    /// Accepted so far, closed or not.
    pub(crate) accepted: AtomicUsize,
    /// Once set, no connection reads again (see [`Tracked`]).
    pub(crate) frozen: AtomicBool,
}

/// A fake's server on the current runtime; dropping it aborts the server
/// task.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) connections: Arc<Connections>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    /// Serves `routes` on `socket`, bound on return.
    pub(crate) async fn start(socket: &Path, routes: Routes) -> Self {
        let connections = Arc::new(Connections {
            open: watch::Sender::new(0),
            accepted: AtomicUsize::new(0),
            frozen: AtomicBool::new(false),
        });
        let counter = Arc::clone(&connections);
        let incoming = kpm_transport::bind(socket)
            .await
            .expect("bind the fake's socket")
            .map(move |stream| stream.map(|inner| Tracked::new(inner, Arc::clone(&counter))));
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_routes(routes)
                .serve_with_incoming(incoming)
                .await;
        });
        Self { connections, task }
    }
}

/// A server-side connection that counts itself in when accepted and out
/// when the server drops it, and stops reading once frozen.
struct Tracked {
    inner: kpm_transport::Connection,
    connections: Arc<Connections>,
}

impl Tracked {
    fn new(inner: kpm_transport::Connection, connections: Arc<Connections>) -> Self {
        connections.accepted.fetch_add(1, Ordering::SeqCst);
        connections.open.send_modify(|open| *open += 1);
        Self { inner, connections }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.connections.open.send_modify(|open| *open -= 1);
    }
}

impl tonic::transport::server::Connected for Tracked {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.connections.frozen.load(Ordering::SeqCst) {
            // As a stopped process's: the kernel takes what is sent, nothing
            // reads it, nothing answers, not even an HTTP/2 PING. No waker
            // is kept, since nothing ever thaws it.
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
