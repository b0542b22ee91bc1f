//! Serves the status API from a [`KubeletHandle`].

use std::os::unix::fs::DirBuilderExt as _;
use std::path::Path;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::get;
use kpm::KubeletHandle;
use kpm::transport::{self as uds, BoundSocket};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;

use crate::listener::{self, HttpListener};
use crate::{EVENTS_PATH, EventLine, PLUGINS_PATH, PluginList, StatusError};

/// The status API server and the socket file it owns.
#[derive(Debug)]
pub struct StatusServer {
    socket: BoundSocket,
    task: tokio::task::JoinHandle<()>,
}

impl StatusServer {
    /// Serves the status API of `kubelet` on `socket` (owner only), creating
    /// its directory if needed. Clients must send a request within
    /// `handshake_timeout`; the listener keeps a spare fd, given up to accept
    /// a client when the process is out of fds, so `kpm list` answers at the
    /// limit.
    pub async fn start(
        socket: &Path,
        kubelet: KubeletHandle,
        handshake_timeout: Duration,
    ) -> Result<Self, StatusError> {
        if let Some(dir) = socket.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(kpm::api::OWN_DIR_MODE)
                .create(dir)
                .map_err(|source| StatusError::CreateDir { path: dir.to_path_buf(), source })?;
        }
        let (incoming, bound) =
            uds::bind_with_mode(socket, uds::OWNER_ONLY).await.map_err(StatusError::Bind)?;
        let listener = HttpListener::new(
            incoming
                .into_http1()
                .spare_fd()
                .handshake_timeout(handshake_timeout)
                .budget(kubelet.manager().fd_budget().clone()),
        );
        let router = router(kubelet);
        let path = socket.to_path_buf();
        let task = tokio::spawn(async move {
            if let Err(source) = listener::serve(listener, router).await {
                tracing::error!(socket = %path.display(), error = %source, "status API stopped");
            }
        });
        tracing::info!(socket = %socket.display(), "status API listening");
        Ok(Self { socket: bound, task })
    }

    /// Removes the socket file if it is still ours, and stops serving.
    pub fn stop(self) {
        if let Err(err) = self.socket.remove() {
            let socket = self.socket.path().display();
            tracing::warn!(%socket, error = %err, "cannot remove status socket");
        }
        self.task.abort();
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
    let events =
        BroadcastStream::new(kubelet.manager().subscribe()).filter_map(|event| match event {
            Ok(event) => EventLine::new(&event),
            Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(missed)) => {
                Some(EventLine::lagged(missed))
            }
        });
    let lines = tokio_stream::once(EventLine::subscribed()).chain(events).map(|line| {
        let mut line = serde_json::to_string(&line).map_err(std::io::Error::other)?;
        line.push('\n');
        Ok::<_, std::io::Error>(line)
    });
    axum::response::Response::builder()
        .header(hyper::header::CONTENT_TYPE, "application/x-ndjson")
        .body(axum::body::Body::from_stream(lines))
        .unwrap_or_default()
}
