//! kpm: the kubelet plugin manager, in Rust.
//!
//! A [`PluginManager`] watches a registry directory (by default
//! `/var/lib/kubelet/plugins_registry`) for the registration sockets of CSI
//! drivers, device plugins and DRA drivers, registers each plugin with the
//! [`PluginHandler`] of its type and tells the plugin the outcome, and
//! deregisters it when its socket goes. It reacts to filesystem events within
//! milliseconds, re-lists the directory to repair missed events, and retries
//! failures with per-socket exponential backoff.
//!
//! [`Kubelet`] is that manager with the kubelet's own handlers (CSI,
//! device plugins with `kubelet.sock`, DRA), composed the way `kpm run`
//! runs it; [`PluginManager`] alone takes the handlers you give it.
//!
//! This crate composes the layers: [`kpm_watcher`] (filesystem →
//! DesiredState), [`kpm_reconciler`] (DesiredState → operations),
//! [`kpm_executor`] (operations over gRPC), [`kpm_cache`] (the states and the
//! handler trait) and [`kpm_api`] (the wire; its names and limits as
//! [`api`]); of
//! `kpm-transport`, the Unix-socket transport, [`transport`] has what a
//! binary needs.
//!
//! Both hand out a cheap handle before running ([`ManagerHandle`],
//! [`KubeletHandle`]) that reads and never writes, but for adding a handler
//! for a type that has none: nothing reached through a handle registers,
//! deregisters, connects, serves or shuts down, which compile-fail doctests
//! on [`KubeletHandle`] show. The counters of [`ManagerStats`] are counted
//! by the event bus as it publishes, so they never depend on a subscriber
//! keeping up. Feature `serde` gives the status types the JSON shape of
//! kpm's status API (`kpm_api::json` has the one time format).
//!
//! Public structs and enums that will grow are `#[non_exhaustive]`, and
//! `missing_docs` is denied. The modules that name what a node agent uses
//! of the crates below ([`api`], [`transport`], and with their features
//! `csi`, `device`, `dra`, `kube`) name it one item at a time: the
//! handlers' inner helpers stay in their crates, and the facade's semver
//! does not follow theirs.
//!
//! A node agent that does what `kpm run` does, minus its status API, is
//! `examples/node_agent.rs`. With a handler of your own:
//!
//! ```no_run
//! use std::sync::Arc;
//! use kpm::{BasicHandler, PluginManager};
//! use tokio::sync::broadcast::error::RecvError;
//!
//! # async fn example() -> Result<(), kpm::Error> {
//! let manager = PluginManager::builder()
//!     .registry_dir("/var/lib/kubelet/plugins_registry")
//!     .handler(kpm::api::DEVICE_PLUGIN, Arc::new(BasicHandler::new(kpm::api::DEVICE_PLUGIN)))
//!     .build()?;
//! let mut events = manager.handle().subscribe();
//! tokio::spawn(async move {
//!     loop {
//!         match events.recv().await {
//!             Ok(event) => println!("{event:?}"),
//!             // Events were dropped while this task was slow; the current
//!             // state is always in `ManagerHandle::status`.
//!             Err(RecvError::Lagged(missed)) => eprintln!("missed {missed} events"),
//!             Err(RecvError::Closed) => break,
//!         }
//!     }
//! });
//! manager.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod basic_handler;
mod kubelet;
mod manager;
mod status;

/// The attribute a [`PluginHandler`] implementation carries
/// (`#[kpm::async_trait]`), re-exported so that writing a handler needs no
/// dependency of its own.
pub use async_trait::async_trait;
pub use basic_handler::{BasicHandler, BasicRegistration};
pub use kpm_api::PluginKind;
pub use kpm_cache::{
    DesiredPlugin, EventCounts, Generation, HandlerError, PluginDetails, PluginEndpoint,
    PluginEvent, PluginHandler, Registration, ServiceReport,
};
pub use kpm_executor::{
    Backoff, BackoffError, ExecutorConfig, ExecutorError, ExponentialBackoff, InspectedStep,
    Inspection, Step, check_info, plugin_endpoint,
};
pub use kpm_liveness::{LivenessConfig, LivenessStats, SharedConnections};
pub use kpm_reconciler::{ReconcilerConfig, ReconcilerError};
pub use kpm_watcher::WatcherConfig;
pub use kubelet::{Kubelet, KubeletBuilder, KubeletHandle};
pub use manager::{
    MAX_EVENT_CAPACITY, ManagerHandle, ManagerStats, PluginManager, PluginManagerBuilder,
};
pub use status::{ActualStateView, DesiredStateView, PluginState, PluginStatus};

/// The CSI handler: version rules, the drivers store, NodeGetInfo and the
/// node information the kubelet publishes. Named one by one, as
/// [`crate::api`]: what a node agent configures, implements and reads, not the
/// handler's helpers (its client, the annotation's parsing).
#[cfg(feature = "csi")]
pub mod csi {
    pub use kpm_csi::{
        AllocatableUpdatePeriods, BoxError, CsiConfig, CsiDriver, CsiDrivers, CsiError, CsiHandler,
        CsiNode, CsiNodeDriver, DEFAULT_NODE_GET_INFO_TIMEOUT, DriverNodeInfo, InMemoryNodeInfo,
        MIN_ALLOCATABLE_UPDATE_PERIOD, NODE_ID_ANNOTATION, NodeInfo, NodeInfoError, NodeInfoSink,
        Version, highest_supported_version,
    };
}

/// The device-plugin manager: both registration paths (plugin watcher and
/// `kubelet.sock`), `ListAndWatch` device tracking and allocation access.
/// Named one by one, as [`crate::api`]; the allocation calls' request and response
/// types are the device plugin API's own messages (`v1beta1`, frozen
/// upstream), which a node agent builds and reads as the kubelet passes them
/// through: wrapping them would copy them, so for these types the facade's
/// semver follows that API's.
#[cfg(feature = "device")]
pub mod device {
    pub use kpm_device::{
        AllocateRequest, AllocateResponse, ContainerAllocateRequest, ContainerAllocateResponse,
        ContainerPreferredAllocationRequest, ContainerPreferredAllocationResponse,
        DEFAULT_CALL_TIMEOUT, DEFAULT_DIAL_TIMEOUT, DEFAULT_GRACE_PERIOD,
        DEFAULT_PRE_START_TIMEOUT, DeviceConfig, DeviceConfigError, DeviceError, DeviceManager,
        DevicePluginOptions, DevicePluginReport, DeviceStatus, DeviceView,
        PreferredAllocationRequest, PreferredAllocationResponse, ResourceStatus,
        is_extended_resource_name,
    };
}

/// The DRA driver manager: instances per driver, service versions,
/// connection monitoring with a cleanup grace period, prepare / unprepare.
/// Named one by one, as [`crate::api`]: not the handler's validation steps.
#[cfg(feature = "dra")]
pub mod dra {
    pub use kpm_dra::{
        DEFAULT_CALL_TIMEOUT, DEFAULT_CLEANUP_GRACE, DEFAULT_HEALTH_TIMEOUT, DeviceHealthStatus,
        DraConfig, DraConfigError, DraDriverStatus, DraEndpointReport, DraError, DraInstanceStatus,
        DraManager, DraService, DraView, HealthService, InMemoryCleanup, SliceCleanup,
        health_timeout,
    };
}

/// Publishing to the Kubernetes API: CSINode and the Node's CSI annotation
/// and labels, device capacity, ResourceSlice cleanup (feature `kube`).
/// Named one by one, as [`crate::api`]: the publisher, its settings and status,
/// the reads of the node's objects, and the kube-rs client they take (a
/// node agent hands kpm the client it already has, so the facade's semver
/// follows kube's for it).
#[cfg(feature = "kube")]
pub mod kube {
    pub use kpm_kube::{
        Client, DEFAULT_CAPACITY_INTERVAL, DEFAULT_CSI_CLEANUP_GRACE, DEFAULT_REQUEST_TIMEOUT,
        KubeConfig, KubeError, KubePublisher, KubeStatus, NodeObjects, NodeResources, ObjectKind,
        ObjectSync, PendingPublication, RequestCount, SyncError, client_from_kubeconfig,
        in_cluster_client, observe_node,
    };
}

pub mod transport;

/// Watching a plugin process for its exit the way kpm's liveness monitor
/// does: [`liveness::open_pidfd`].
pub mod liveness {
    pub use kpm_liveness::open_pidfd;
}

/// What the watcher makes of a registry directory: every entry, the
/// registration sockets and what it ignores and why ([`registry::survey`],
/// the walk the watcher lists the directory with).
pub mod registry {
    pub use kpm_watcher::{Ignored, RegistryEntry, survey};
}

/// The plugin APIs' names and limits a node agent needs: plugin types,
/// the kubelet's directory and socket names, DRA service names, the socket
/// path of an advertised endpoint, and how kpm renders an error chain. Named one by one, so that the facade's API
/// does not grow with the wire crate; the generated gRPC types are in the
/// `kpm-api` crate, for plugins and tests that speak the protocols.
pub mod api {
    pub use kpm_api::constants::{
        CSI_PLUGIN, DEFAULT_ROOT_DIR, DEVICE_PLUGIN, DEVICE_PLUGIN_VERSION,
        DEVICE_PLUGINS_DIR_NAME, DRA_HEALTH_V1_SERVICE, DRA_HEALTH_V1ALPHA1_SERVICE, DRA_PLUGIN,
        DRA_SUPPORTED_SERVICES, DRA_V1_SERVICE, DRA_V1BETA1_SERVICE, KUBELET_SOCKET_NAME,
        MAX_CONFIG_DURATION, MAX_SOCKET_PATH_BYTES, OWN_DIR_MODE, PLUGINS_REGISTRY_DIR_NAME,
    };
    pub use kpm_api::endpoint_path;
    pub use kpm_api::gotext::error_chain;
    /// The range a setting takes, and the refusal of one out of it
    /// (`kpm_api::config`), for the configs of crates above the facade.
    pub mod config {
        pub use kpm_api::config::{Bounds, OutOfRange, REQUEST_TIMEOUT};
    }
}

/// Errors of the plugin manager.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting of the builder is out of range.
    #[error("invalid setting {setting}: {reason}")]
    InvalidConfig {
        /// The builder method or config field.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The registry directory could not be watched.
    #[error("start watching the registry directory: {0}")]
    StartWatcher(#[from] kpm_watcher::WatcherError),
    /// A handler was added for a plugin type that already has one (given
    /// twice to a builder, or one the [`Kubelet`] serves itself): the first
    /// handler stays.
    #[error("add handler: {source}")]
    AddHandler {
        /// The plugin type.
        plugin_type: String,
        /// Why it was refused.
        source: kpm_reconciler::ReconcilerError,
    },
    /// `kubelet.sock` could not be served for device plugins.
    #[cfg(feature = "device")]
    #[error("serve kubelet.sock: {0}")]
    ServeKubeletSocket(#[from] kpm_device::DeviceError),
}

/// `Result` with kpm's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
