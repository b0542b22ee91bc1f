//! kpm-test-support's stand-in API server as kube's client sees it, in
//! process, so that paused time holds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use http::{Request, Response};
use kpm_test_support::api_server::{ApiRequest, State};
use kube::client::Body;
use parking_lot::Mutex;

/// A client of a stand-in holding Node `node` (uid `uid-1`), and its state.
pub(crate) fn client(node: &str) -> (kube::Client, Arc<Mutex<State>>) {
    let state = Arc::new(Mutex::new(State::with_node(node)));
    let shared = Arc::clone(&state);
    let service = tower::service_fn(move |request: Request<Body>| {
        let state = Arc::clone(&shared);
        async move {
            let (parts, body) = request.into_parts();
            let body = body.collect_bytes().await.unwrap();
            let mut state = state.lock();
            if state.down {
                return Err(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "down"));
            }
            let (code, answer) = state.handle(&ApiRequest::of(&parts, &body));
            Ok(Response::builder().status(code).body(Body::from(answer)).unwrap())
        }
    });
    (kube::Client::new(service, "default"), state)
}
