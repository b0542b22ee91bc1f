//! One line of `GET /v1/events`, typed: the server writes it, `kpm watch`
//! reads it back with the same type.

use std::time::SystemTime;

use kpm::PluginEvent;
use kpm_api::json::Rfc3339;
use serde::{Deserialize, Serialize};

/// `{"time", "event", …}`: the time it was sent (RFC 3339, UTC) and the
/// event; `{"event": "lagged", "missed"}`, without a time, for a client
/// that fell too far behind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventLine {
    /// When it was sent; none on a `lagged` line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Rfc3339>,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
}

/// What an event line tells, by its `event`: [`kpm::PluginEvent`]'s with
/// `type` for the plugin type and `retry_in_ms` for the backoff, and the
/// stream's own `subscribed` and `lagged`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// The first line: from now on nothing is missed.
    Subscribed,
    /// The client fell behind and `missed` events were dropped.
    Lagged {
        /// How many.
        missed: u64,
    },
    /// A socket (incarnation) was found and will be registered.
    Seen {
        /// The registration socket.
        socket: String,
        /// The incarnation.
        generation: u64,
    },
    /// The plugin was accepted by its handler and told so.
    Registered {
        /// The registration socket.
        socket: String,
        /// The incarnation.
        generation: u64,
        /// The type the plugin reported.
        #[serde(rename = "type")]
        plugin_type: String,
        /// The plugin's name.
        name: String,
        /// Where it serves.
        endpoint: String,
    },
    /// A registration attempt failed.
    Rejected {
        /// The registration socket.
        socket: String,
        /// The incarnation.
        generation: u64,
        /// The failing step and its error.
        reason: String,
    },
    /// The plugin's socket is gone (or was re-created) and its handler was told.
    Deregistered {
        /// The registration socket.
        socket: String,
        /// The incarnation.
        generation: u64,
        /// The plugin's type.
        #[serde(rename = "type")]
        plugin_type: String,
        /// The plugin's name.
        name: String,
    },
    /// The registered plugin stopped answering; it is registered anew.
    Unresponsive {
        /// The registration socket.
        socket: String,
        /// The incarnation.
        generation: u64,
        /// The plugin's type.
        #[serde(rename = "type")]
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
        socket: String,
        /// How long until the next attempt.
        retry_in_ms: u64,
    },
    /// The health of a DRA driver's device changed.
    #[serde(rename = "device_health")]
    DeviceHealth {
        /// The DRA driver.
        driver: String,
        /// The device's pool.
        pool: String,
        /// The device's name in its pool.
        device: String,
        /// Its health now.
        health: String,
        /// Its health before; `null` for its first report.
        previous: Option<String>,
        /// Whether its report expired, rather than a report changed it.
        expired: bool,
        /// The driver's explanation; empty once expired.
        message: String,
    },
    /// An event a newer `kpm run` sends that this reader does not know.
    #[serde(other)]
    Unknown,
}

impl EventLine {
    /// The line of `event`, sent now; none for an event this version of
    /// the status API has no line for (the library's events may grow).
    pub fn new(event: &PluginEvent) -> Option<Self> {
        Event::of(event).map(Self::now)
    }

    /// The first line, sent now: from now on nothing is missed.
    pub fn subscribed() -> Self {
        Self::now(Event::Subscribed)
    }

    /// The line in place of `missed` events a slow client lost.
    pub fn lagged(missed: u64) -> Self {
        Self { time: None, event: Event::Lagged { missed } }
    }

    fn now(event: Event) -> Self {
        Self { time: Some(Rfc3339(SystemTime::now())), event }
    }
}

impl Event {
    fn of(event: &PluginEvent) -> Option<Self> {
        let path = |socket: &std::path::Path| socket.display().to_string();
        Some(match event.clone() {
            PluginEvent::SocketSeen { socket, generation } => {
                Self::Seen { socket: path(&socket), generation: generation.get() }
            }
            PluginEvent::Registered { socket, generation, plugin_type, name, endpoint } => {
                Self::Registered {
                    socket: path(&socket),
                    generation: generation.get(),
                    plugin_type,
                    name,
                    endpoint: endpoint.target().into_owned(),
                }
            }
            PluginEvent::Rejected { socket, generation, reason } => {
                Self::Rejected { socket: path(&socket), generation: generation.get(), reason }
            }
            PluginEvent::Deregistered { socket, generation, plugin_type, name } => {
                Self::Deregistered {
                    socket: path(&socket),
                    generation: generation.get(),
                    plugin_type,
                    name,
                }
            }
            PluginEvent::Unresponsive {
                socket,
                generation,
                plugin_type,
                name,
                reason,
                failures,
            } => Self::Unresponsive {
                socket: path(&socket),
                generation: generation.get(),
                plugin_type,
                name,
                reason,
                failures,
            },
            PluginEvent::RetryScheduled { socket, after } => Self::RetryScheduled {
                socket: path(&socket),
                retry_in_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
            },
            PluginEvent::DraDeviceHealthChanged {
                driver,
                pool,
                device,
                health,
                previous,
                expired,
                message,
            } => Self::DeviceHealth { driver, pool, device, health, previous, expired, message },
            _ => return None,
        })
    }
}
