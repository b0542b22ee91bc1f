//! The handler for `DRAPlugin` plugins and the driver manager, with the
//! kubelet's semantics (`pkg/kubelet/cm/dra/plugin`: `DRAPluginManager` and
//! the per-endpoint `DRAPlugin` client).
//!
//! [`DraManager`] implements [`kpm_cache::PluginHandler`]:
//!
//! - **validate** (`ValidatePlugin`): the driver name is at most 63 bytes and
//!   a DNS subdomain once lowercased; the endpoint is an absolute path that
//!   fits a Unix socket address and, when [`DraConfig::root_dir`] is set,
//!   cleans to a path inside it; the advertised services include a DRA
//!   service kpm speaks ([`choose_service`]: `v1.DRAPlugin`, else
//!   `v1beta1.DRAPlugin`). No side effects.
//! - **register** (`RegisterPlugin`): validates again; a second
//!   registration of the same (driver, endpoint) is an error, another
//!   endpoint of the same driver is a new *instance*, appended after the
//!   others. The instance gets one long-lived gRPC connection to its
//!   endpoint, dialled at once (a driver that is not up yet is not an
//!   error) and watched by a monitor task.
//! - **deregister** (`DeRegisterPlugin`): removes the instance at that
//!   endpoint only (a no-op if there is none) and closes its connection.
//!
//! # Instances and the serving instance
//!
//! Several instances per driver allow seamless upgrades: during a rolling
//! update the new pod registers `<driver>-<uid>-reg.sock` and serves on its
//! own socket while the old one still runs. Calls go to the *serving
//! instance*: the most recently registered one that is connected, else the
//! most recently registered one. When the newest instance goes away (its
//! connection drops, or it is deregistered) calls fall back to the older one.
//!
//! # Connection monitoring and cleanup
//!
//! An instance's connection counts as up from the server's first bytes
//! until the socket reports end-of-file or an error; the HTTP/2 client
//! always reads, so a driver that exits is noticed at once, well within a
//! second. While it is down the monitor dials again every 250 ms and a
//! successful dial is noticed the same way. Every change re-syncs the
//! driver: when **no** instance of a driver is connected (also after its
//! last instance is deregistered, and right after registering one that is
//! not up) a cleanup is queued for now + [`DraConfig::cleanup_grace`]
//! (30 s by default; a queued one keeps its time); when any instance
//! connects it is cancelled; when it fires, [`SliceCleanup::wipe_driver`]
//! runs exactly once. The kubelet deletes the driver's ResourceSlices of the
//! node there, and so does kpm-kube's cleanup when `kpm run` publishes to an
//! API server; without one, [`InMemoryCleanup`] records the wipes.
//!
//! # Owner and views
//!
//! Whoever creates the manager owns its lifecycle: it hands the manager to
//! the plugin manager as the `DRAPlugin` handler (the only path that
//! registers and deregisters), follows [`DraManager::hangups`], queues
//! [`DraManager::clean_up_leftovers`] once at start (only if DRA drivers can
//! register at all: otherwise every driver's leftovers would be wiped) and
//! calls [`DraManager::shutdown`]. Everyone else gets a [`DraView`]
//! ([`DraManager::view`]): [`drivers`](DraView::drivers), `prepare` and
//! `unprepare`, and nothing that registers, deregisters, cleans up or shuts
//! down.
//!
//! # Prepare and unprepare
//!
//! [`DraManager::prepare`] and [`DraManager::unprepare`] call
//! `NodePrepareResources` / `NodeUnprepareResources` on the serving
//! instance's connection with the service negotiated at registration: v1
//! directly, v1beta1 through a conversion of the messages (they differ only
//! in `Device.share_id`). Each call has a deadline of
//! [`DraConfig::call_timeout`] (45 s by default), sent to the driver as the
//! gRPC deadline and enforced locally; expiry is a `DeadlineExceeded` error.
//!
//! # Device health
//!
//! If the newest instance advertises a health service ([`pick_health_service`]:
//! `v1.DRAResourceHealth`, else `v1alpha1.DRAResourceHealth`),
//! `NodeWatchResources` is streamed on its connection and the latest device
//! list is kept in [`DraDriverStatus::devices`]. A stream that ends or fails
//! is reopened after a second; `Unimplemented` stops it for good.
//!
//! Each device's health holds for its `health_check_timeout_seconds`
//! ([`DEFAULT_HEALTH_TIMEOUT`], 30 s, when 0 or negative, as in the
//! kubelet; at most a year) from when kpm received the message that
//! reported it. At that deadline it becomes `Unknown` and its message is
//! cleared, by a timer: one per driver, set to its devices' earliest
//! deadline and moved by every message, held by the health stream's task
//! and gone with it (a driver without a health stream or without devices
//! has none; `DraManager::health_timers`, for tests, counts them). Every
//! change of a device's health (its first report, another health, an
//! expiry) is published once, as a [`PluginEvent::DraDeviceHealthChanged`]
//! on the bus given to [`DraManager::try_new`], and in order: under the
//! manager's lock. The table of devices and their deadlines is plain data,
//! driven by the stream's task.
//!
//! # Invariants
//!
//! - The crate depends on `kpm-api`, `kpm-transport` and `kpm-cache` only.
//! - No lock is held across an `.await`: the manager's state sits behind one
//!   synchronous lock, taken and released between awaits.
//! - A deregistration affects only the instance at that endpoint.
//! - All waiting goes through tokio time, so tests run on paused time.
//!
//! [`PluginEvent::DraDeviceHealthChanged`]: kpm_cache::PluginEvent::DraDeviceHealthChanged
//!
//! # Differences from the kubelet
//!
//! - **v1 is preferred.** The kubelet takes the first supported service in
//!   the plugin's order; kpm takes `v1.DRAPlugin` whenever it is advertised.
//! - **Connection state comes from the socket**, not from gRPC stats
//!   handler events; it also requires the server to have sent something,
//!   so a socket whose listener never answers does not count as connected.
//!   The first dial happens inside `register` (at most 1 s), so the status
//!   right after registration is accurate and no cleanup is queued for a
//!   driver that is up.
//! - **Health ownership is handed to the newest remaining instance** when
//!   the newest one is deregistered (the kubelet's behaviour there is not
//!   known); devices are kept through a handover and dropped when the new
//!   owner has no health service.
//! - **Health expires at its deadline.** The kubelet applies the timeout
//!   only when something reads a device's health or the driver's next
//!   message comes (kubernetes #140819; PR #140883, a deadline-driven fix,
//!   is open); kpm's timer changes the status and publishes the event at
//!   the deadline. A device a message leaves out is removed (the kubelet
//!   keeps it until it times out), the deadline is inclusive (the
//!   kubelet's "older than the timeout" is one instant later), and a
//!   timeout above a year is cut to a year (the kubelet's multiplication
//!   overflows).
//! - **The startup wipe waits for its driver.** The kubelet wipes all of
//!   the node's ResourceSlices when it starts; kpm asks the
//!   [`SliceCleanup`] which drivers left slices for the node and queues a
//!   cleanup of each one, after the grace period
//!   ([`DraManager::clean_up_leftovers`]), so that a driver registering
//!   within it keeps its slices.
//! - **Endpoint length.** Endpoints of 108 bytes or more are rejected
//!   (`must not be longer than 107 bytes`): a Unix socket path needs its
//!   terminating NUL in the 108-byte `sun_path`.
//! - **Typed services.** The chosen service is an enum, so the kubelet's
//!   `internal error: unsupported chosen service` cannot happen.
//! - No metrics yet (`DRAGRPCOperationsDuration`).

//!
//! # Features
//!
//! - `serde`: `Serialize` for the status types, as kpm's status API shows
//!   them.
//! - `testing`: accessors for tests only (`DraManager::health_timers`);
//!   the crate's own integration tests turn it on.

#![deny(missing_docs)]

mod cleanup;
mod connection;
mod convert;
mod error;
mod health;
mod manager;
mod validate;
mod view;

pub use cleanup::{InMemoryCleanup, SliceCleanup};
pub use error::{DraConfigError, DraError};
pub use health::{DEFAULT_HEALTH_TIMEOUT, DeviceHealthStatus, health_timeout};
pub use manager::{
    DEFAULT_CALL_TIMEOUT, DEFAULT_CLEANUP_GRACE, DraConfig, DraDriverStatus, DraEndpointReport,
    DraInstanceStatus, DraManager,
};
pub use validate::{
    DraService, HealthService, MAX_DRIVER_NAME_LEN, choose_service, pick_health_service,
    validate_driver_name, validate_endpoint,
};
pub use view::DraView;

/// Spawns `task` on the current tokio runtime; outside one (which the
/// handler's async entry points never are) nothing runs and a warning is
/// logged instead of panicking.
fn spawn<F>(task: F) -> Option<tokio::task::JoinHandle<()>>
where
    F: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => Some(runtime.spawn(task)),
        Err(err) => {
            tracing::warn!(error = %err, "no tokio runtime; background task not started");
            None
        }
    }
}
