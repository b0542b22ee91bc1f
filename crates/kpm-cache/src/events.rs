//! What happens to plugins, as a broadcast stream for status APIs and tests.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::Generation;

/// One thing that happened to a registration socket.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PluginEvent {
    /// A socket (incarnation) was found and will be registered.
    SocketSeen {
        /// The registration socket.
        socket: PathBuf,
        /// The incarnation that was found.
        generation: Generation,
    },
    /// The plugin was accepted by its handler and told so.
    Registered {
        /// The registration socket.
        socket: PathBuf,
        /// The incarnation that was registered.
        generation: Generation,
        /// The type the plugin reported, which chose the handler.
        plugin_type: String,
        /// The plugin's name.
        name: String,
        /// The plugin's service socket.
        endpoint: String,
    },
    /// A registration attempt failed; `reason` says at which step and why.
    Rejected {
        /// The registration socket.
        socket: PathBuf,
        /// The incarnation that failed.
        generation: Generation,
        /// The failing step and its error, as the plugin was told.
        reason: String,
    },
    /// The plugin's socket is gone (or was re-created) and its handler was told.
    Deregistered {
        /// The registration socket.
        socket: PathBuf,
        /// The incarnation that was deregistered.
        generation: Generation,
        /// The plugin's type.
        plugin_type: String,
        /// The plugin's name.
        name: String,
    },
    /// The registered plugin stopped answering liveness probes (or nobody
    /// listens on its socket any more); it is deregistered and registered anew.
    Unresponsive {
        /// The registration socket.
        socket: PathBuf,
        /// The incarnation that stopped answering.
        generation: Generation,
        /// The plugin's type.
        plugin_type: String,
        /// The plugin's name.
        name: String,
        /// Consecutive failed probes.
        failures: u32,
        /// Why the last probe failed.
        reason: String,
    },
    /// The next attempt on the socket waits for its backoff.
    RetryScheduled {
        /// The registration socket.
        socket: PathBuf,
        /// How long until the next attempt.
        after: Duration,
    },
}

/// A broadcast of [`PluginEvent`]s. Publishing never blocks; a subscriber
/// that falls more than the capacity behind gets a `Lagged` error and
/// resumes with newer events.
#[derive(Debug, Clone)]
pub struct EventBus {
    tx: broadcast::Sender<PluginEvent>,
}

impl EventBus {
    /// Events kept for slow subscribers.
    pub const DEFAULT_CAPACITY: usize = 1024;

    /// A bus that keeps up to `capacity` events (at least one) for slow
    /// subscribers.
    pub fn new(capacity: usize) -> Self {
        Self { tx: broadcast::Sender::new(capacity.max(1)) }
    }

    /// Sends `event` to every current subscriber; never blocks.
    pub fn publish(&self, event: PluginEvent) {
        // No subscribers is fine: events are for whoever listens.
        let _ = self.tx.send(event);
    }

    /// A receiver of the events published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<PluginEvent> {
        self.tx.subscribe()
    }
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new(Self::DEFAULT_CAPACITY)
    }
}
