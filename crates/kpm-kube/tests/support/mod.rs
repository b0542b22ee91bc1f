//! kpm-test-support's stand-in API server as kube's client sees it, in
//! process so that paused time holds, with its watches streamed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{Full, StreamBody};
use kpm_kube::{KubeConfig, KubePublisher};
use kpm_test_support::api_server::{ApiRequest, State};
use kube::client::Body;
use parking_lot::Mutex;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnboundedReceiverStream;

pub(crate) type Shared = Arc<Mutex<State>>;

/// A client of a stand-in holding Node `node1` (uid `uid-1`), and its state.
pub(crate) fn client() -> (kube::Client, Shared) {
    let state = Arc::new(Mutex::new(State::with_node("node1")));
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
            let query = parts.uri.query().unwrap_or_default();
            if let Some(resource) = State::watched(parts.uri.path(), query) {
                let lines = UnboundedReceiverStream::new(state.watch(&resource))
                    .map(|line| Ok::<_, Infallible>(http_body::Frame::data(Bytes::from(line))));
                let body = BoxBody::new(StreamBody::new(lines));
                return Ok(Response::builder().status(200).body(body).unwrap());
            }
            let (code, answer) = state.handle(&ApiRequest::of(&parts, &body));
            Ok(Response::builder()
                .status(code)
                .body(BoxBody::new(Full::new(Bytes::from(answer))))
                .unwrap())
        }
    });
    (kube::Client::new(service, "default"), state)
}

/// A publisher for `node1` on a fresh stand-in.
pub(crate) fn publisher() -> (KubePublisher, Shared) {
    publisher_with(KubeConfig::default())
}

pub(crate) fn publisher_with(config: KubeConfig) -> (KubePublisher, Shared) {
    let (client, state) = client();
    (KubePublisher::new(client, "node1", config).unwrap(), state)
}

/// Waits on paused time, at most a minute, for `condition` on the stand-in.
pub(crate) async fn eventually(state: &Shared, what: &str, condition: impl Fn(&State) -> bool) {
    for _ in 0..6000 {
        if condition(&state.lock()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within a minute; requests: {:?}", state.lock().requests);
}
