//! The document of `GET /v1/plugins`, typed: the server builds it from the
//! library's status types and writes it, readers (`kpm list`, the doctor)
//! read it back with the same types, so that there is one schema.
//!
//! Fields are written in their declaration order, the order `kpm list -o
//! json` prints. Readers tolerate a newer `kpm run`: unknown fields are
//! skipped, absent ones take their default, and a pending publication of a
//! kind this reader does not know is left out, not the others.

use std::collections::BTreeMap;

use kpm::kube::PendingPublication;
use kpm_api::json::Rfc3339;
use serde::{Deserialize, Deserializer, Serialize};

/// The body of `GET /v1/plugins`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PluginList {
    /// Every registration socket, registered or not.
    pub plugins: Vec<Plugin>,
    /// The registered CSI drivers.
    pub csi_drivers: Vec<CsiDriver>,
    /// What the kubelet would publish on its Node and CSINode objects.
    pub node: Node,
    /// The device plugins' resources.
    pub device_resources: Vec<DeviceResource>,
    /// The DRA drivers, with their instances and device health.
    pub dra_drivers: Vec<DraDriver>,
    /// What kpm published to the API server; `null` when it does not publish.
    pub kubernetes: Option<Kubernetes>,
}

/// One registration socket and where it is in its registration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Plugin {
    /// The registration socket.
    pub socket_path: String,
    /// The type the plugin reported; empty until registered.
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// The plugin's name; empty until registered.
    pub name: String,
    /// Where the plugin serves, one string; empty until registered.
    pub endpoint: String,
    /// The versions it supports; empty until registered.
    pub versions: Vec<String>,
    /// `registered`, `pending`, `backing_off`, `failed`, `deregistering`
    /// or `held` (its endpoint is gone).
    pub state: String,
    /// The incarnation of the socket.
    pub generation: u64,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// When it was registered.
    pub registered_at: Option<Rfc3339>,
    /// When the next attempt is, while it backs off.
    pub retry_at: Option<Rfc3339>,
    /// The process serving the socket, when known.
    pub server_pid: Option<u32>,
}

/// A registered CSI driver: its node info flattened, `null` (the topology
/// `{}`) until `NodeGetInfo` answered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CsiDriver {
    /// The driver name.
    pub name: String,
    /// Where it serves.
    pub endpoint: String,
    /// The highest CSI version it supports.
    pub version: String,
    /// How the driver names this node.
    pub node_id: Option<String>,
    /// Its topology segments.
    pub topology: BTreeMap<String, String>,
    /// Its volume limit; 0 is none reported.
    pub max_volumes: Option<i64>,
    /// The period of its allocatable count's refresh, in seconds.
    pub allocatable_update_period_s: Option<u64>,
    /// When the refresh last answered.
    pub allocatable_refreshed_at: Option<Rfc3339>,
}

/// What the kubelet would publish on its Node and CSINode objects, with
/// Kubernetes' field names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Node {
    /// The Node's annotations (the CSI node ids).
    pub annotations: BTreeMap<String, String>,
    /// The Node's labels (the drivers' topology).
    pub labels: BTreeMap<String, String>,
    /// The CSINode's spec.
    pub csinode: CsiNode,
}

/// The spec of the node's CSINode.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CsiNode {
    /// One entry per installed driver.
    pub drivers: Vec<CsiNodeDriver>,
}

/// A driver entry of the CSINode.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CsiNodeDriver {
    /// The driver name.
    pub name: String,
    /// The driver's node id.
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// The keys of its topology, sorted.
    #[serde(rename = "topologyKeys")]
    pub topology_keys: Vec<String>,
    /// Its volume limit; absent when it reported none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<Allocatable>,
}

/// A CSINode driver's `allocatable`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocatable {
    /// The number of volumes the node takes of the driver.
    pub count: i32,
}

/// A device plugin's resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceResource {
    /// The extended resource name.
    pub resource: String,
    /// Its current endpoint; empty once it went away.
    pub endpoint: String,
    /// Devices reported `Healthy`.
    pub healthy: u64,
    /// Every other device.
    pub unhealthy: u64,
    /// The devices, sorted by id.
    pub devices: Vec<Device>,
    /// When it is removed, in its grace period after its endpoint went away.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removal_at: Option<Rfc3339>,
}

/// One device of a resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Device {
    /// The id the plugin reported.
    pub id: String,
    /// `Healthy`, `Unhealthy`, or what else the plugin reported.
    pub health: String,
}

/// A DRA driver.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DraDriver {
    /// The driver name.
    pub name: String,
    /// Its instances, the newest last.
    pub instances: Vec<DraInstance>,
    /// When its resources are cleaned up unless an instance connects.
    pub cleanup_pending_until: Option<Rfc3339>,
    /// Its devices' health; absent when it reported none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DraDevice>,
}

/// One instance of a DRA driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraInstance {
    /// Its service socket.
    pub endpoint: String,
    /// The service it is called on.
    pub version: String,
    /// Whether its connection is up.
    pub connected: bool,
    /// When it was registered.
    pub registered_at: Rfc3339,
}

/// The health of one device of a DRA driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraDevice {
    /// The device's pool.
    pub pool: String,
    /// The device's name in its pool.
    pub device: String,
    /// `Healthy`, `Unhealthy` or `Unknown`.
    pub health: String,
    /// The driver's explanation.
    #[serde(default)]
    pub message: String,
    /// When kpm received its last report.
    pub reported_at: Rfc3339,
    /// When its health becomes `Unknown` without a fresh report; `null`
    /// once it has.
    #[serde(default)]
    pub expires_at: Option<Rfc3339>,
}

/// How publishing to the API server goes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Kubernetes {
    /// The Node kpm publishes for.
    pub node: String,
    /// One entry per kind of object.
    pub objects: Vec<ObjectSync>,
    /// The API requests made, by verb, resource and outcome.
    pub requests: Vec<RequestCount>,
    /// What the API server does not hold yet, oldest first.
    #[serde(deserialize_with = "readable")]
    pub pending: Vec<PendingPublication>,
}

/// How publishing one kind of object went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ObjectSync {
    /// `Node`, `CSINode`, `Node status`, `ResourceSlice`, `CSIDriver` or
    /// `Leftovers`.
    pub kind: String,
    /// When kpm last wrote (or found up to date) an object of this kind.
    pub last_success: Option<Rfc3339>,
    /// The last failure, kept after later successes.
    pub last_error: Option<SyncError>,
}

/// A failed sync.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncError {
    /// When it failed.
    pub at: Rfc3339,
    /// The error, with its causes.
    pub message: String,
}

/// How many API requests of one verb on one resource ended one way.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RequestCount {
    /// The Kubernetes verb.
    pub verb: String,
    /// The resource, e.g. `nodes/status`.
    pub resource: String,
    /// `success`, an HTTP status code, `error` or `timeout`.
    pub outcome: String,
    /// The number of requests.
    pub count: u64,
}

/// The entries of a list this reader can read: one a newer writer added a
/// kind to is left out, not the others.
fn readable<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let entries = Vec::<serde_json::Value>::deserialize(deserializer)?;
    Ok(entries.into_iter().filter_map(|entry| serde_json::from_value(entry).ok()).collect())
}

mod from_kubelet;
#[cfg(test)]
mod tests;
