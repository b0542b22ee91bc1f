//! The handler for `CSIPlugin` plugins, with the kubelet's semantics
//! (`pkg/volume/csi`: the registration handler, the NodeGetInfo client and the
//! `nodeinfomanager`).
//!
//! [`CsiHandler`] implements [`kpm_cache::PluginHandler`]:
//!
//! - **validate** (`ValidatePlugin`): the reported versions must include a
//!   1.x version ([`highest_supported_version`]: the highest 1.x wins, 0.x is
//!   rejected, 2.x and above are ignored), and a driver already registered
//!   under the same name must have a strictly lower version. No side effects.
//! - **register** (`RegisterPlugin`): validates again against the store as it
//!   is now; stores the driver in [`CsiDrivers`] (name → endpoint and version,
//!   replacing an older entry); calls `csi.v1.Node/NodeGetInfo` on the
//!   endpoint ([`node_get_info`], default timeout 2 min, see [`CsiConfig`]);
//!   rejects an empty node id; publishes the node info through the
//!   [`NodeInfoSink`]; records the node info in the store. If a step after
//!   storing fails, the driver is removed from the store and from the node
//!   info and the error is returned: the plugin is told `false` with the
//!   reason and the executor retries with backoff. As in the kubelet, this
//!   also removes an older, still registered entry of the same name.
//! - **deregister** (`DeRegisterPlugin`): removes the driver from the store,
//!   its node-id annotation entry and its CSINode entry. Topology labels stay.
//!
//! The handler also refreshes a driver's allocatable count (KEP-4876, the
//! kubelet's `csiNodeUpdater`): a driver with an update period, the node's
//! own ([`CsiConfig::allocatable_update_period`]) before the cluster's
//! ([`AllocatableUpdatePeriods`], fed by kpm-kube's CSIDriver watch), is
//! asked `NodeGetInfo` on that period by a task of its own, and a changed
//! limit goes to [`NodeInfoSink::update_allocatable`]. Registration,
//! deregistration, a change of period and the handler's drop start or stop
//! that task, so a deregistered driver is never refreshed.
//!
//! Error texts are the kubelet's, so that a plugin and a log reader see the
//! same reasons as with the kubelet (see [`CsiError`]).
//!
//! # Node info
//!
//! What the kubelet publishes on the Node and CSINode objects is modelled by
//! [`NodeInfo`]: the [`NODE_ID_ANNOTATION`] (a JSON object from driver name to
//! node id, sorted keys), topology labels (a value collision is an error;
//! labels are never removed) and the CSINode driver entries (`name`, `nodeID`,
//! sorted `topologyKeys`, `allocatable.count` from `max_volumes_per_node`,
//! clamped to `i32::MAX`, none for 0). [`NodeInfoSink`] is where node info
//! leaves the handler: [`InMemoryNodeInfo`] keeps it in memory for the status
//! API, and kpm-kube's sink publishes it to an API server without any change
//! to the handler, applying the same update functions to the objects it
//! reads. This crate depends on `kpm-api`, `kpm-transport` and `kpm-cache`
//! only.
//!
//! # Differences from the kubelet
//!
//! - **Deregistration checks the endpoint.** The kubelet's `DeRegisterPlugin`
//!   ignores the endpoint, so the deregistration of an old socket removes a
//!   newer registration of the same driver name at another endpoint. Here a
//!   deregistration only takes effect if the driver is registered at that
//!   endpoint; otherwise it is logged (debug) and ignored.
//! - **One registration per name at a time.** Registrations and
//!   deregistrations of one driver name are serialised, so two sockets
//!   reporting the same name and version cannot both pass validation.
//! - **Cancellation cleans up.** A register call dropped before it finishes
//!   removes the driver from the store and the node info.
//! - **Endpoints may be gRPC targets.** The kubelet dials the endpoint as a
//!   raw path; a `unix://` or `unix:` prefix is stripped first (see
//!   [`kpm_api::endpoint_path`]).
//! - **No API round trips here.** The in-memory sink has no retry and
//!   backoff, so its errors are the bare step errors (for example the
//!   topology collision) rather than wrapped in `error updating Node object
//!   with CSI driver node info: ...`. Retries against an API server, and the
//!   CSINode's owner reference, are the Kubernetes sink's (kpm-kube). The
//!   Node's `attachable-volumes-csi-*` capacity and the migrated-plugins
//!   annotation are out of scope.
//! - **NodeGetInfo errors name the step and the endpoint**, then give the
//!   kubelet's text: `NodeGetInfo on <endpoint>: rpc error: code = <code> desc = <message>`.

#![deny(missing_docs)]

mod client;
mod config;
mod error;
mod handler;
mod locks;
mod node_info;
mod refresh;
mod store;
mod version;
mod version_rules;

pub use client::node_get_info;
pub use config::{CsiConfig, DEFAULT_NODE_GET_INFO_TIMEOUT};
pub use error::{BoxError, CsiError, NodeInfoError};
pub use handler::CsiHandler;
pub use node_info::{
    CsiNode, CsiNodeDriver, InMemoryNodeInfo, NodeInfo, NodeInfoSink, add_topology_labels,
    parse_node_id_annotation, remove_node_id_annotation, set_node_id_annotation,
};
pub use refresh::{AllocatableUpdatePeriods, MIN_ALLOCATABLE_UPDATE_PERIOD};
pub use store::{CsiDriver, CsiDrivers, DriverNodeInfo};
pub use version::Version;
pub use version_rules::highest_supported_version;

/// The kubelet's name of the CSI volume plugin; prefixes its CSI messages.
pub const CSI_PLUGIN_NAME: &str = "kubernetes.io/csi";

/// The Node annotation that maps CSI driver names to their node ids.
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";
