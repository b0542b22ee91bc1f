//! What happens to plugins, as a broadcast stream for status APIs and tests.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::broadcast;

use crate::{Generation, PluginEndpoint};

/// One thing that happened to a registration socket, or to the health of a
/// registered plugin's device.
///
/// With feature `serde`, it serializes as the status API's event lines do:
/// `{"event": "seen" | "registered" | "rejected" | "deregistered" |
/// "unresponsive" | "retry_scheduled", "socket", …}`, with `type` for
/// `plugin_type` and `retry_in_ms` for `after`; a device's health as
/// `{"event": "device_health", "driver", "pool", "device", "health",
/// "previous", "expired", "message"}` (`previous` is `null` for a device's
/// first report).
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
        /// Where the plugin serves (its target, as one string, in JSON).
        endpoint: PluginEndpoint,
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
    /// The health of a DRA driver's device changed: a first report, a
    /// report with another health, or its report expired (`Unknown` once no
    /// report came within the device's health check timeout). Only DRA
    /// drivers' devices: a device plugin's device health is in the device
    /// manager's view, not on the bus.
    #[cfg_attr(feature = "serde", serde(rename = "device_health"))]
    DraDeviceHealthChanged {
        /// The DRA driver.
        driver: String,
        /// The device's pool.
        pool: String,
        /// The device's name in its pool.
        device: String,
        /// Its health now: `Healthy`, `Unhealthy` or `Unknown`.
        health: String,
        /// Its health before; `None` for its first report.
        previous: Option<String>,
        /// Whether it changed because its report expired, not by a report.
        expired: bool,
        /// The driver's explanation with the health; empty once expired.
        message: String,
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

/// How many events of each kind a bus published since it was created.
///
/// The bus counts an event before it sends it, so the counts are exact
/// whatever a subscriber missed, and a subscriber that received an event
/// reads counts that include it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventCounts {
    /// Plugins registered ([`PluginEvent::Registered`]), by type.
    pub registrations: BTreeMap<String, u64>,
    /// Plugins deregistered ([`PluginEvent::Deregistered`]), by type.
    pub deregistrations: BTreeMap<String, u64>,
    /// Registration attempts that failed ([`PluginEvent::Rejected`]).
    pub rejections: u64,
    /// Failed operations whose retry waits for a backoff
    /// ([`PluginEvent::RetryScheduled`]).
    pub retries_scheduled: u64,
    /// Registered plugins found unresponsive and renewed
    /// ([`PluginEvent::Unresponsive`]).
    pub unresponsive: u64,
    /// Changes of a DRA device's health, expiries included
    /// ([`PluginEvent::DraDeviceHealthChanged`]).
    pub device_health_changes: u64,
}

/// The live counters behind [`EventCounts`].
#[derive(Debug, Default)]
struct Counters {
    registrations: ByType,
    deregistrations: ByType,
    rejections: AtomicU64,
    retries_scheduled: AtomicU64,
    unresponsive: AtomicU64,
    device_health_changes: AtomicU64,
}

impl Counters {
    fn count(&self, event: &PluginEvent) {
        match event {
            PluginEvent::Registered { plugin_type, .. } => self.registrations.add(plugin_type),
            PluginEvent::Deregistered { plugin_type, .. } => self.deregistrations.add(plugin_type),
            PluginEvent::Rejected { .. } => add(&self.rejections),
            PluginEvent::RetryScheduled { .. } => add(&self.retries_scheduled),
            PluginEvent::Unresponsive { .. } => add(&self.unresponsive),
            PluginEvent::DraDeviceHealthChanged { .. } => add(&self.device_health_changes),
            PluginEvent::SocketSeen { .. } => {}
        }
    }

    fn snapshot(&self) -> EventCounts {
        EventCounts {
            registrations: self.registrations.snapshot(),
            deregistrations: self.deregistrations.snapshot(),
            rejections: self.rejections.load(Ordering::Relaxed),
            retries_scheduled: self.retries_scheduled.load(Ordering::Relaxed),
            unresponsive: self.unresponsive.load(Ordering::Relaxed),
            device_health_changes: self.device_health_changes.load(Ordering::Relaxed),
        }
    }
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Counters by plugin type: once a type is known, a read lock and an atomic
/// add. Types are few: only those with a handler register.
#[derive(Debug, Default)]
struct ByType(RwLock<HashMap<String, AtomicU64>>);

impl ByType {
    fn add(&self, plugin_type: &str) {
        if let Some(counter) = self.0.read().get(plugin_type) {
            add(counter);
            return;
        }
        add(self.0.write().entry(plugin_type.to_owned()).or_default());
    }

    fn snapshot(&self) -> BTreeMap<String, u64> {
        let counters = self.0.read();
        counters.iter().map(|(t, counter)| (t.clone(), counter.load(Ordering::Relaxed))).collect()
    }
}

/// A broadcast of [`PluginEvent`]s. Publishing never blocks; a subscriber
/// that falls more than the capacity behind gets a `Lagged` error and
/// resumes with newer events. The bus also counts what it publishes
/// ([`EventBus::counts`]), for metrics that must not depend on keeping up.
#[derive(Debug, Clone)]
pub struct EventBus {
    tx: broadcast::Sender<PluginEvent>,
    counters: Arc<Counters>,
}

impl EventBus {
    /// Events kept for slow subscribers.
    pub const DEFAULT_CAPACITY: usize = 1024;

    /// A bus that keeps up to `capacity` events (at least one) for slow
    /// subscribers.
    pub fn new(capacity: usize) -> Self {
        Self { tx: broadcast::Sender::new(capacity.max(1)), counters: Arc::default() }
    }

    /// Counts `event`, then sends it to every current subscriber; never blocks.
    pub fn publish(&self, event: PluginEvent) {
        self.counters.count(&event);
        // No subscribers is fine: events are for whoever listens.
        let _ = self.tx.send(event);
    }

    /// How many events of each kind were published so far, by any clone of
    /// this bus.
    pub fn counts(&self) -> EventCounts {
        self.counters.snapshot()
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

/// A change of `gpu.example.com`'s device `pool1/dev1` to `Unknown`.
#[cfg(test)]
fn device_health(previous: Option<&str>, expired: bool) -> PluginEvent {
    PluginEvent::DraDeviceHealthChanged {
        driver: "gpu.example.com".into(),
        pool: "pool1".into(),
        device: "dev1".into(),
        health: "Unknown".into(),
        previous: previous.map(str::to_owned),
        expired,
        message: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket() -> PathBuf {
        PathBuf::from("/r/a.sock")
    }

    #[test]
    fn counts_are_exact_however_far_a_subscriber_lags() {
        let bus = EventBus::new(1);
        let mut lagging = bus.subscribe();
        let generation = crate::DesiredState::new().add_or_update(&socket()).unwrap();
        let registered = |plugin_type: &str| PluginEvent::Registered {
            socket: socket(),
            generation,
            plugin_type: plugin_type.into(),
            name: "p".into(),
            endpoint: PluginEndpoint::RegistrationSocket(socket()),
        };
        for _ in 0..100 {
            bus.publish(registered("DevicePlugin"));
            bus.publish(PluginEvent::SocketSeen { socket: socket(), generation });
            bus.publish(PluginEvent::Rejected { socket: socket(), generation, reason: "r".into() });
        }
        let clone = bus.clone();
        clone.publish(registered("CSIPlugin"));
        clone.publish(PluginEvent::Deregistered {
            socket: socket(),
            generation,
            plugin_type: "CSIPlugin".into(),
            name: "p".into(),
        });
        clone.publish(PluginEvent::RetryScheduled { socket: socket(), after: Duration::ZERO });
        clone.publish(PluginEvent::Unresponsive {
            socket: socket(),
            generation,
            plugin_type: "CSIPlugin".into(),
            name: "p".into(),
            reason: "r".into(),
            failures: 3,
        });
        clone.publish(device_health(Some("Healthy"), true));

        assert!(matches!(
            lagging.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(missed)) if missed == 304
        ));
        let counts = bus.counts();
        assert_eq!(
            counts.registrations,
            BTreeMap::from([("CSIPlugin".into(), 1), ("DevicePlugin".into(), 100)])
        );
        assert_eq!(counts.deregistrations, BTreeMap::from([("CSIPlugin".into(), 1)]));
        assert_eq!(counts.rejections, 100);
        assert_eq!(counts.retries_scheduled, 1);
        assert_eq!(counts.unresponsive, 1);
        assert_eq!(counts.device_health_changes, 1);
    }
}

#[cfg(all(test, feature = "serde"))]
mod serde_tests {
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
                    endpoint: PluginEndpoint::Advertised("/r/e.sock".into()),
                },
                json!({"event": "registered", "socket": "/r/a.sock", "generation": 1,
                       "type": "DevicePlugin", "name": "gpu", "endpoint": "/r/e.sock"}),
            ),
            (
                PluginEvent::Registered {
                    socket: socket(),
                    generation,
                    plugin_type: "DevicePlugin".into(),
                    name: "gpu".into(),
                    endpoint: PluginEndpoint::RegistrationSocket(socket()),
                },
                json!({"event": "registered", "socket": "/r/a.sock", "generation": 1,
                       "type": "DevicePlugin", "name": "gpu", "endpoint": "/r/a.sock"}),
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
            (
                device_health(Some("Healthy"), true),
                json!({"event": "device_health", "driver": "gpu.example.com", "pool": "pool1",
                       "device": "dev1", "health": "Unknown", "previous": "Healthy",
                       "expired": true, "message": ""}),
            ),
            (
                device_health(None, false),
                json!({"event": "device_health", "driver": "gpu.example.com", "pool": "pool1",
                       "device": "dev1", "health": "Unknown", "previous": null,
                       "expired": false, "message": ""}),
            ),
        ];
        for (event, line) in cases {
            assert_eq!(serde_json::to_value(&event).unwrap(), line, "{event:?}");
        }
    }
}
