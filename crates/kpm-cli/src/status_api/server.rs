//! Serves the status API from a [`KubeletHandle`].

use std::io;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::Path;

use axum::Json;
use axum::extract::State;
use axum::routing::get;
use kpm::KubeletHandle;
use kpm::transport::fd;
use kpm::transport::{self as uds, BoundSocket};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;

use super::model::{EventLine, PluginList};
use super::{EVENTS_PATH, PLUGINS_PATH};
use crate::CliError;

/// The status API server and the socket file it owns.
#[derive(Debug)]
pub(crate) struct StatusServer {
    socket: BoundSocket,
    task: tokio::task::JoinHandle<()>,
}

impl StatusServer {
    /// Serves the status API of `kubelet` on `socket` (owner only), creating
    /// its directory if needed.
    pub(crate) async fn start(socket: &Path, kubelet: KubeletHandle) -> Result<Self, CliError> {
        if let Some(dir) = socket.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(kpm::api::OWN_DIR_MODE)
                .create(dir)
                .map_err(|source| CliError::CreateRoot { path: dir.to_path_buf(), source })?;
        }
        let (incoming, bound) =
            uds::bind_with_mode(socket, uds::OWNER_ONLY).await.map_err(CliError::StatusSocket)?;
        let listener = SpareFdListener::new(incoming.into_listener());
        let router = router(kubelet);
        let path = socket.to_path_buf();
        let task = tokio::spawn(async move {
            if let Err(source) = axum::serve(listener, router).await {
                tracing::error!(socket = %path.display(), error = %source, "status API stopped");
            }
        });
        tracing::info!(socket = %socket.display(), "status API listening");
        Ok(Self { socket: bound, task })
    }

    /// Removes the socket file if it is still ours, and stops serving.
    pub(crate) fn stop(self) {
        if let Err(err) = self.socket.remove() {
            let socket = self.socket.path().display();
            tracing::warn!(%socket, error = %err, "cannot remove status socket");
        }
        self.task.abort();
    }
}

/// The status API's listener, which keeps answering when kpm is out of file
/// descriptors: it holds a spare fd, closes it when accepting fails for lack
/// of fds so that the waiting client can be accepted, and opens it again
/// before the next accept (as nginx and libuv do). Without a spare, a
/// shortage pauses accepting briefly; no error ever ends the loop.
#[derive(Debug)]
struct SpareFdListener {
    listener: UnixListener,
    spare: Option<std::fs::File>,
}

impl SpareFdListener {
    fn new(listener: UnixListener) -> Self {
        Self { listener, spare: spare_fd() }
    }
}

/// An fd to give up when fds run out; `None` while none can be had.
fn spare_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

impl axum::serve::Listener for SpareFdListener {
    type Io = UnixStream;
    type Addr = tokio::net::unix::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let budget = fd::budget();
        loop {
            if self.spare.is_none() {
                self.spare = spare_fd();
            }
            match self.listener.accept().await {
                Ok(accepted) => {
                    budget.fd_available();
                    return accepted;
                }
                Err(err) if fd::is_shortage(&err) => {
                    const STEP: &str = "accept on the status API";
                    // Giving up the spare frees an fd at once; without one, wait.
                    if self.spare.take().is_some() {
                        budget.shortage(STEP);
                    } else {
                        budget.wait_for_fd(STEP).await;
                    }
                }
                // A client that gave up before it was accepted.
                Err(err) if err.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(err) => {
                    tracing::warn!(error = %err, "status API cannot accept a connection");
                    tokio::time::sleep(fd::SHORTAGE_PAUSE).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// The router of the status API.
fn router(kubelet: KubeletHandle) -> axum::Router {
    axum::Router::new()
        .route(PLUGINS_PATH, get(plugins))
        .route(EVENTS_PATH, get(events))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(kubelet)
}

async fn plugins(State(kubelet): State<KubeletHandle>) -> Json<PluginList> {
    Json(PluginList::from(&kubelet))
}

/// Streams events as NDJSON until the client goes away: first a
/// `subscribed` line (from then on nothing is missed), then every event. A
/// client that falls too far behind gets a `lagged` line instead of the
/// events it missed.
async fn events(State(kubelet): State<KubeletHandle>) -> axum::response::Response {
    let subscribed = serde_json::to_string(&EventLine::subscribed())
        .map(|line| line + "\n")
        .map_err(std::io::Error::other);
    let events = BroadcastStream::new(kubelet.manager().subscribe()).map(|event| {
        let mut line = match event {
            Ok(event) => serde_json::to_string(&EventLine::new(&event)),
            Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(missed)) => {
                Ok(format!("{{\"event\":\"lagged\",\"missed\":{missed}}}"))
            }
        }
        .map_err(std::io::Error::other)?;
        line.push('\n');
        Ok::<_, std::io::Error>(line)
    });
    let stream = tokio_stream::once(subscribed).chain(events);
    axum::response::Response::builder()
        .header(hyper::header::CONTENT_TYPE, "application/x-ndjson")
        .body(axum::body::Body::from_stream(stream))
        .unwrap_or_default()
}
