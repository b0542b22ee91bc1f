//! The stand-in served over TCP, for a process (the `kpm` binary, a plugin
//! of `kpm check`) that reaches it through a kubeconfig.

use std::net::SocketAddr;

use super::{ApiRequest, Shared};

/// Serves `state` on `port` of 127.0.0.1 (0: any free one) over HTTP/1.1,
/// as kube's client talks to an API server, on `rt` until it is dropped;
/// the address it listens on.
pub fn serve(rt: &tokio::runtime::Runtime, port: u16, state: Shared) -> SocketAddr {
    let router = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let state = std::sync::Arc::clone(&state);
        async move {
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
            let (code, answer) = state.lock().handle(&ApiRequest::of(&parts, &body));
            let code =
                http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
            (code, [(http::header::CONTENT_TYPE, "application/json")], answer)
        }
    });
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
        .unwrap_or_else(|err| panic!("bind 127.0.0.1:{port}: {err}"));
    let addr = listener.local_addr().expect("a bound listener's address");
    rt.spawn(async move { axum::serve(listener, router).await });
    addr
}

/// A kubeconfig for the API server at `server` (`http://…`), without
/// credentials.
pub fn kubeconfig(server: &str) -> String {
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n- name: test\n  cluster:\n    server: {server}\n\
         users:\n- name: test\n  user: {{}}\n\
         contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n\
         current-context: test\n"
    )
}
