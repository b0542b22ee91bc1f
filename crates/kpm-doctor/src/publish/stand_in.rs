//! kpm-test-support's stand-in API server as kube's client sees it, in
//! process, so that paused time holds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use kpm_test_support::api_server::{self, Shared, State};
use parking_lot::Mutex;

/// A client of a stand-in holding Node `node` (uid `uid-1`), and its state.
pub(crate) fn client(node: &str) -> (kube::Client, Shared) {
    let state = Arc::new(Mutex::new(State::with_node(node)));
    (kube::Client::new(api_server::service(Arc::clone(&state)), "default"), state)
}
