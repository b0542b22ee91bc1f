//! The status API: HTTP/JSON on a Unix socket, served by `kpm run` and read
//! by `kpm list`.
//!
//! `GET /v1/plugins` returns
//! `{"plugins": [{"socket_path", "type", "name", "endpoint", "versions",
//! "state", "generation", "last_error", "registered_at"}]}` with `state` one of
//! `registered`, `pending`, `failed` and `registered_at` in RFC 3339 (UTC).

use std::path::Path;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::routing::get;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use kpm::{PluginManager, PluginStatus};
use serde::{Deserialize, Serialize};

use crate::CliError;

/// Path of the plugin list.
pub(crate) const PLUGINS_PATH: &str = "/v1/plugins";

/// The body of `GET /v1/plugins`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PluginList {
    pub(crate) plugins: Vec<PluginJson>,
}

/// One plugin, as the status API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PluginJson {
    pub(crate) socket_path: String,
    #[serde(rename = "type")]
    pub(crate) plugin_type: String,
    pub(crate) name: String,
    pub(crate) endpoint: String,
    pub(crate) versions: Vec<String>,
    pub(crate) state: String,
    pub(crate) generation: u64,
    pub(crate) last_error: Option<String>,
    pub(crate) registered_at: Option<String>,
}

impl From<PluginStatus> for PluginJson {
    fn from(status: PluginStatus) -> Self {
        Self {
            socket_path: status.socket_path.display().to_string(),
            plugin_type: status.plugin_type,
            name: status.name,
            endpoint: status.endpoint,
            versions: status.versions,
            state: status.state.as_str().to_owned(),
            generation: status.generation,
            last_error: status.last_error,
            registered_at: status
                .registered_at
                .map(|at| humantime::format_rfc3339_millis(at).to_string()),
        }
    }
}

/// The router of the status API.
pub(crate) fn router(manager: Arc<PluginManager>) -> axum::Router {
    axum::Router::new()
        .route(PLUGINS_PATH, get(plugins))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(manager)
}

async fn plugins(State(manager): State<Arc<PluginManager>>) -> Json<PluginList> {
    Json(PluginList { plugins: manager.status().into_iter().map(PluginJson::from).collect() })
}

/// `GET path` on the status API at `socket`; returns the body.
pub(crate) async fn get_json(socket: &Path, path: &str) -> Result<Bytes, CliError> {
    let query_err = |message: String| CliError::QueryStatus { path: socket.to_path_buf(), message };
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| CliError::ConnectStatus { path: socket.to_path_buf(), source })?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|err| query_err(err.to_string()))?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, "kpm")
        .body(Empty::<Bytes>::new())
        .map_err(|err| query_err(err.to_string()))?;
    let response = sender.send_request(request).await.map_err(|err| query_err(err.to_string()))?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(|err| query_err(err.to_string()))?;
    if !status.is_success() {
        return Err(query_err(format!("GET {path}: HTTP {status}")));
    }
    Ok(body.to_bytes())
}
