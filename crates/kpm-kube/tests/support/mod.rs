//! Publishers on kpm-test-support's stand-in API server, served in process
//! so that paused time holds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::sync::Arc;
use std::time::Duration;

use kpm_kube::{KubeConfig, KubePublisher};
use kpm_test_support::api_server::{self, Shared, State};
use parking_lot::Mutex;

/// A client of a stand-in holding Node `node1` (uid `uid-1`), and its state.
pub(crate) fn client() -> (kube::Client, Shared) {
    let state = Arc::new(Mutex::new(State::with_node("node1")));
    (kube::Client::new(api_server::service(Arc::clone(&state)), "default"), state)
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
