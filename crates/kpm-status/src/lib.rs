//! The status API of `kpm run`: HTTP/JSON on a Unix socket (`kpm.sock` in
//! the kubelet root), served by `kpm run` and read by `kpm list`, `kpm
//! watch` and the doctor; and, feature `server`, `kpm run`'s Prometheus
//! metrics.
//!
//! `GET /v1/plugins` returns
//! `{"plugins": [{"socket_path", "type", "name", "endpoint", "versions",
//! "state", "generation", "last_error", "registered_at", "retry_at",
//! "server_pid"}], "csi_drivers":
//! [{"name", "endpoint", "version", "node_id", "topology", "max_volumes"}],
//! "node": {"annotations", "labels", "csinode": {"drivers": [{"name",
//! "nodeID", "topologyKeys", "allocatable": {"count"}}]}}}` with `state` one of
//! `registered`, `pending`, `backing_off` (with `retry_at`), `failed`,
//! `deregistering` or `held` (its endpoint is gone), and `registered_at` and
//! `retry_at` in RFC 3339 (UTC),
//! and `"device_resources": [{"resource", "endpoint", "healthy", "unhealthy",
//! "devices": [{"id", "health"}], "removal_at"}]` and `"dra_drivers":
//! [{"name", "instances": [{"endpoint", "version", "connected",
//! "registered_at"}], "cleanup_pending_until", "devices": [{"pool", "device",
//! "health", "message", "reported_at", "expires_at"}]}]` (`devices` absent
//! when empty; `expires_at`, when the health becomes `Unknown` without a
//! fresh report, `null` once it has), and
//! `"kubernetes"`: `null` unless kpm publishes to an API server, else
//! `{"node", "objects": [{"kind", "last_success", "last_error": null |
//! {"at", "message"}}], "requests": [{"verb", "resource", "outcome",
//! "count"}], "pending": [{"kind", "name", "want", "removes", "since",
//! "last_error"}]}` (one object per kind: `Node`, `CSINode`, `Node status`,
//! `ResourceSlice`, `CSIDriver`, `Leftovers`; `pending`, what the API server
//! does not hold yet; times in RFC 3339).
//! The node part is what the kubelet would publish on its Node and CSINode
//! objects, with Kubernetes' field names.
//!
//! `GET /v1/events` streams NDJSON: a `subscribed` line, then one line per
//! event (see [`event::EventLine`]): `{"time", "event", …}` with the fields
//! of [`kpm::PluginEvent`], a DRA device's health change as `{"time",
//! "event": "device_health", "driver", "pool", "device", "health",
//! "previous", "expired", "message"}`.
//!
//! The documents are typed, one schema on both sides: [`model::PluginList`]
//! and [`event::EventLine`] are what the server writes (built from the
//! library's status types of a [`kpm::KubeletHandle`]) and what [`client`]
//! reads back. A golden test pins the schema.
//!
//! Feature `server` adds [`server::StatusServer`], [`metrics`] (the
//! metrics of `kpm run`, and [`metrics::serve_registry`], the one way kpm
//! serves a registry, for `kpm doctor --watch` too) and the accept path
//! both serve through.

pub mod client;
mod error;
pub mod event;
#[cfg(feature = "server")]
mod listener;
#[cfg(feature = "server")]
pub mod metrics;
pub mod model;
#[cfg(feature = "server")]
pub mod server;

pub use client::{Client, Events};
pub use error::StatusError;
pub use event::{Event, EventLine};
pub use model::PluginList;

/// Name of the status API socket in the kubelet root directory.
pub const STATUS_SOCKET_NAME: &str = "kpm.sock";
/// Path of the plugin list.
pub const PLUGINS_PATH: &str = "/v1/plugins";
/// Path of the event stream: NDJSON, one event per line.
pub const EVENTS_PATH: &str = "/v1/events";
