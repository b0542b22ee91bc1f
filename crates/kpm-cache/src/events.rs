//! What happens to plugins, as a broadcast stream for status APIs and tests.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::Generation;

/// One thing that happened to a registration socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginEvent {
    /// A socket (incarnation) was found and will be registered.
    SocketSeen { socket: PathBuf, generation: Generation },
    /// The plugin was accepted by its handler and told so.
    Registered {
        socket: PathBuf,
        generation: Generation,
        plugin_type: String,
        name: String,
        endpoint: String,
    },
    /// A registration attempt failed; `reason` says at which step and why.
    Rejected { socket: PathBuf, generation: Generation, reason: String },
    /// The plugin's socket is gone (or was re-created) and its handler was told.
    Deregistered { socket: PathBuf, generation: Generation, plugin_type: String, name: String },
    /// The registered plugin stopped answering liveness probes (or nobody
    /// listens on its socket any more); it is deregistered and registered anew.
    Unresponsive {
        socket: PathBuf,
        generation: Generation,
        plugin_type: String,
        name: String,
        failures: u32,
        reason: String,
    },
    /// The next attempt on the socket waits for its backoff.
    RetryScheduled { socket: PathBuf, after: Duration },
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

    pub fn new(capacity: usize) -> Self {
        Self { tx: broadcast::Sender::new(capacity.max(1)) }
    }

    pub fn publish(&self, event: PluginEvent) {
        // No subscribers is fine: events are for whoever listens.
        let _ = self.tx.send(event);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<PluginEvent> {
        self.tx.subscribe()
    }
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new(Self::DEFAULT_CAPACITY)
    }
}
