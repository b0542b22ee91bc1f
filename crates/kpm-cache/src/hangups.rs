//! Hang-ups: connections to plugins that handlers lost by themselves.

use std::path::PathBuf;

use tokio::sync::broadcast;

/// Where a handler reports the endpoints whose connection ended by itself (a
/// device plugin's `ListAndWatch` stream, a DRA driver's connection): the
/// plugin may be gone. Hints for liveness, which then checks the plugin's
/// registration socket; a subscriber that falls behind misses hints,
/// nothing else.
#[derive(Debug, Clone)]
pub struct Hangups(broadcast::Sender<PathBuf>);

impl Hangups {
    /// Hang-ups kept for a subscriber that is behind.
    const KEPT: usize = 64;

    /// Reports that the connection to `endpoint` ended by itself.
    pub fn report(&self, endpoint: impl Into<PathBuf>) {
        // Nobody listening (liveness off) is fine: a hint, not a duty.
        let _ = self.0.send(endpoint.into());
    }

    /// The endpoints reported from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<PathBuf> {
        self.0.subscribe()
    }
}

impl Default for Hangups {
    fn default() -> Self {
        Self(broadcast::Sender::new(Self::KEPT))
    }
}
