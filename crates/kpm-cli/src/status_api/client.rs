//! Reads the status API of a running `kpm run`.

use std::path::Path;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::CliError;

/// Sends `GET path` to the status API at `socket`; returns the response once
/// its status is a success, with the body still to be read.
pub(crate) async fn request(
    socket: &Path,
    path: &str,
) -> Result<hyper::Response<hyper::body::Incoming>, CliError> {
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
    if !response.status().is_success() {
        return Err(query_err(format!("GET {path}: HTTP {}", response.status())));
    }
    Ok(response)
}

/// `GET path` on the status API at `socket`; returns the body.
pub(crate) async fn get_json(socket: &Path, path: &str) -> Result<Bytes, CliError> {
    let body = request(socket, path).await?.into_body().collect().await.map_err(|err| {
        CliError::QueryStatus { path: socket.to_path_buf(), message: err.to_string() }
    })?;
    Ok(body.to_bytes())
}
