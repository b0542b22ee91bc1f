//! Waiting for what the kubelet's state shows, by polling: the check's
//! kubelet has no event for every state a check waits for.

use std::time::Duration;

use tokio::time::Instant;

/// How often a wait looks at the kubelet's state.
pub(crate) const POLL: Duration = Duration::from_millis(10);

/// Polls `done` every [`POLL`] until it gives a value, for at most `bound`.
pub(crate) async fn wait_for<T>(bound: Duration, mut done: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(value) = done() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}
