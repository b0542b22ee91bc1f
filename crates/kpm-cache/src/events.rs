//! What happens to plugins, as a broadcast stream for status APIs and tests.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::Generation;

/// One thing that happened to a registration socket.
///
/// With feature `serde`, it serializes as the status API's event lines do:
/// `{"event": "seen" | "registered" | "rejected" | "deregistered" |
/// "unresponsive" | "retry_scheduled", "socket", …}`, with `type` for
/// `plugin_type` and `retry_in_ms` for `after`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(tag = "event", rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum PluginEvent {
    /// A socket (incarnation) was found and will be registered.
    #[cfg_attr(feature = "serde", serde(rename = "seen"))]
    SocketSeen {
        /// The registration socket.
        #[cfg_attr(feature = "serde", serde(serialize_with = "json::path"))]
        socket: PathBuf,
        /// The incarnation that was found.
        generation: Generation,
    },
    /// The plugin was accepted by its handler and told so.
    Registered {
        /// The registration socket.
        #[cfg_attr(feature = "serde", serde(serialize_with = "json::path"))]
        socket: PathBuf,
        /// The incarnation that was registered.
        generation: Generation,
        /// The type the plugin reported, which chose the handler.
        #[cfg_attr(feature = "serde", serde(rename = "type"))]
        plugin_type: String,
        /// The plugin's name.
        name: String,
        /// The plugin's service socket.
        endpoint: String,
    },
    /// A registration attempt failed; `reason` says at which step and why.
    Rejected {
        /// The registration socket.
        #[cfg_attr(feature = "serde", serde(serialize_with = "json::path"))]
        socket: PathBuf,
        /// The incarnation that failed.
        generation: Generation,
        /// The failing step and its error, as the plugin was told.
        reason: String,
    },
    /// The plugin's socket is gone (or was re-created) and its handler was told.
    Deregistered {
        /// The registration socket.
        #[cfg_attr(feature = "serde", serde(serialize_with = "json::path"))]
        socket: PathBuf,
        /// The incarnation that was deregistered.
        generation: Generation,
        /// The plugin's type.
        #[cfg_attr(feature = "serde", serde(rename = "type"))]
        plugin_type: String,
        /// The plugin's name.
        name: String,
    },
    /// The registered plugin stopped answering liveness probes (or nobody
    /// listens on its socket any more); it is deregistered and registered anew.
    Unresponsive {
        /// The registration socket.
        #[cfg_attr(feature = "serde", serde(serialize_with = "json::path"))]
        socket: PathBuf,
        /// The incarnation that stopped answering.
        generation: Generation,
        /// The plugin's type.
        #[cfg_attr(feature = "serde", serde(rename = "type"))]
        plugin_type: String,
        /// The plugin's name.
        name: String,
        /// Why the last probe failed.
        reason: String,
        /// Consecutive failed probes.
        failures: u32,
    },
    /// The next attempt on the socket waits for its backoff.
    RetryScheduled {
        /// The registration socket.
        #[cfg_attr(feature = "serde", serde(serialize_with = "json::path"))]
        socket: PathBuf,
        /// How long until the next attempt.
        #[cfg_attr(
            feature = "serde",
            serde(rename = "retry_in_ms", serialize_with = "json::millis")
        )]
        after: Duration,
    },
}

/// How [`PluginEvent`] writes its paths and durations.
#[cfg(feature = "serde")]
mod json {
    use std::path::Path;
    use std::time::Duration;

    use serde::Serializer;

    /// As text, any bytes that are not UTF-8 replaced: a name a plugin chose
    /// must not fail the event.
    pub(super) fn path<S: Serializer>(path: &Path, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&path.display())
    }

    /// Whole milliseconds.
    pub(super) fn millis<S: Serializer>(
        after: &Duration,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(after.as_millis()).unwrap_or(u64::MAX))
    }
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

#[cfg(all(test, feature = "serde"))]
mod tests {
    use std::os::unix::ffi::OsStrExt as _;

    use serde_json::json;

    use super::*;

    fn socket() -> PathBuf {
        PathBuf::from("/r/a.sock")
    }

    /// The event lines of the status API (`GET /v1/events`, which adds the
    /// `time`), field for field.
    #[test]
    fn events_serialize_as_the_status_api_lines() {
        let generation = crate::DesiredState::new().add_or_update(&socket()).unwrap();
        assert_eq!(generation.get(), 1);
        let cases = [
            (
                PluginEvent::SocketSeen { socket: socket(), generation },
                json!({"event": "seen", "socket": "/r/a.sock", "generation": 1}),
            ),
            (
                PluginEvent::Registered {
                    socket: socket(),
                    generation,
                    plugin_type: "DevicePlugin".into(),
                    name: "gpu".into(),
                    endpoint: "/r/e.sock".into(),
                },
                json!({"event": "registered", "socket": "/r/a.sock", "generation": 1,
                       "type": "DevicePlugin", "name": "gpu", "endpoint": "/r/e.sock"}),
            ),
            (
                PluginEvent::Rejected { socket: socket(), generation, reason: "no handler".into() },
                json!({"event": "rejected", "socket": "/r/a.sock", "generation": 1,
                       "reason": "no handler"}),
            ),
            (
                PluginEvent::Deregistered {
                    socket: socket(),
                    generation,
                    plugin_type: "CSIPlugin".into(),
                    name: "csi".into(),
                },
                json!({"event": "deregistered", "socket": "/r/a.sock", "generation": 1,
                       "type": "CSIPlugin", "name": "csi"}),
            ),
            (
                PluginEvent::Unresponsive {
                    socket: socket(),
                    generation,
                    plugin_type: "CSIPlugin".into(),
                    name: "csi".into(),
                    reason: "GetInfo: deadline exceeded".into(),
                    failures: 3,
                },
                json!({"event": "unresponsive", "socket": "/r/a.sock", "generation": 1,
                       "type": "CSIPlugin", "name": "csi",
                       "reason": "GetInfo: deadline exceeded", "failures": 3}),
            ),
            (
                PluginEvent::RetryScheduled {
                    socket: socket(),
                    after: Duration::from_micros(1_500_900),
                },
                json!({"event": "retry_scheduled", "socket": "/r/a.sock", "retry_in_ms": 1500}),
            ),
            (
                PluginEvent::SocketSeen {
                    socket: PathBuf::from(std::ffi::OsStr::from_bytes(b"/r/\xff.sock")),
                    generation,
                },
                json!({"event": "seen", "socket": "/r/\u{fffd}.sock", "generation": 1}),
            ),
        ];
        for (event, line) in cases {
            assert_eq!(serde_json::to_value(&event).unwrap(), line, "{event:?}");
        }
    }
}
