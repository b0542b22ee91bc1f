//! What the kubelet tests share: a plugin's own service on a real socket.

#![allow(clippy::unwrap_used)]

use std::path::Path;

/// Serves a plugin's own service on `socket` until the task is aborted.
pub(crate) async fn serve_service(
    socket: &Path,
    routes: tonic::service::Routes,
) -> tokio::task::JoinHandle<()> {
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let incoming = kpm::transport::bind(socket).await.unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    })
}
