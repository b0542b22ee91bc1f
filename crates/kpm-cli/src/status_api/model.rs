//! The status API's JSON documents, and their conversions from kpm's types.

use std::collections::BTreeMap;

use kpm::csi::{CsiDriver, CsiNodeDriver, NodeInfo};
use kpm::device::ResourceStatus;
use kpm::dra::DraDriverStatus;
use kpm::{PluginEvent, PluginStatus};
use serde::{Deserialize, Serialize};

/// One event of `GET /v1/events`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EventJson {
    /// RFC 3339, UTC.
    pub(crate) time: String,
    /// `subscribed` (first, once the stream is live), then `seen`,
    /// `registered`, `rejected`, `deregistered` or `retry_scheduled`.
    pub(crate) event: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub(crate) socket: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) generation: Option<u64>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none", default)]
    pub(crate) plugin_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) endpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) retry_in_ms: Option<u64>,
    /// Failed liveness probes in a row (`unresponsive`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) failures: Option<u32>,
}

impl EventJson {
    pub(crate) fn now(event: &str) -> Self {
        Self {
            time: rfc3339(std::time::SystemTime::now()),
            event: event.to_owned(),
            socket: String::new(),
            generation: None,
            plugin_type: None,
            name: None,
            endpoint: None,
            reason: None,
            retry_in_ms: None,
            failures: None,
        }
    }
}

impl From<PluginEvent> for EventJson {
    fn from(event: PluginEvent) -> Self {
        let mut json = Self::now("");
        let socket = match event {
            PluginEvent::SocketSeen { socket, generation } => {
                json.event = "seen".into();
                json.generation = Some(generation.get());
                socket
            }
            PluginEvent::Registered { socket, generation, plugin_type, name, endpoint } => {
                json.event = "registered".into();
                json.generation = Some(generation.get());
                json.plugin_type = Some(plugin_type);
                json.name = Some(name);
                json.endpoint = Some(endpoint);
                socket
            }
            PluginEvent::Rejected { socket, generation, reason } => {
                json.event = "rejected".into();
                json.generation = Some(generation.get());
                json.reason = Some(reason);
                socket
            }
            PluginEvent::Deregistered { socket, generation, plugin_type, name } => {
                json.event = "deregistered".into();
                json.generation = Some(generation.get());
                json.plugin_type = Some(plugin_type);
                json.name = Some(name);
                socket
            }
            PluginEvent::Unresponsive {
                socket,
                generation,
                plugin_type,
                name,
                failures,
                reason,
            } => {
                json.event = "unresponsive".into();
                json.generation = Some(generation.get());
                json.plugin_type = Some(plugin_type);
                json.name = Some(name);
                json.failures = Some(failures);
                json.reason = Some(reason);
                socket
            }
            PluginEvent::RetryScheduled { socket, after } => {
                json.event = "retry_scheduled".into();
                json.retry_in_ms = Some(u64::try_from(after.as_millis()).unwrap_or(u64::MAX));
                socket
            }
            // An event newer than this renderer: shown, in its debug form.
            other => {
                json.event = "other".into();
                json.reason = Some(format!("{other:?}"));
                std::path::PathBuf::new()
            }
        };
        json.socket = socket.display().to_string();
        json
    }
}

/// The body of `GET /v1/plugins`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PluginList {
    pub(crate) plugins: Vec<PluginJson>,
    #[serde(default)]
    pub(crate) csi_drivers: Vec<CsiDriverJson>,
    #[serde(default)]
    pub(crate) node: NodeJson,
    #[serde(default)]
    pub(crate) device_resources: Vec<DeviceResourceJson>,
    #[serde(default)]
    pub(crate) dra_drivers: Vec<DraDriverJson>,
}

/// A DRA driver and its instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DraDriverJson {
    pub(crate) name: String,
    pub(crate) instances: Vec<DraInstanceJson>,
    /// When the driver's resources are cleaned up unless an instance connects.
    pub(crate) cleanup_pending_until: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub(crate) devices: Vec<DraDeviceJson>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DraInstanceJson {
    pub(crate) endpoint: String,
    pub(crate) version: String,
    pub(crate) connected: bool,
    pub(crate) registered_at: String,
}

/// Device health reported by a driver's resource-health service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DraDeviceJson {
    pub(crate) pool: String,
    pub(crate) device: String,
    pub(crate) health: String,
    pub(crate) message: String,
}

impl From<DraDriverStatus> for DraDriverJson {
    fn from(driver: DraDriverStatus) -> Self {
        Self {
            name: driver.name,
            instances: driver
                .instances
                .into_iter()
                .map(|i| DraInstanceJson {
                    endpoint: i.endpoint,
                    version: i.version,
                    connected: i.connected,
                    registered_at: rfc3339(i.registered_at),
                })
                .collect(),
            cleanup_pending_until: driver.cleanup_pending_until.map(rfc3339),
            devices: driver
                .devices
                .into_iter()
                .map(|d| DraDeviceJson {
                    pool: d.pool,
                    device: d.device,
                    health: d.health,
                    message: d.message,
                })
                .collect(),
        }
    }
}

/// An extended resource served by a device plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeviceResourceJson {
    pub(crate) resource: String,
    pub(crate) endpoint: String,
    pub(crate) healthy: usize,
    pub(crate) unhealthy: usize,
    pub(crate) devices: Vec<DeviceJson>,
    /// Set while the resource waits out the grace period after its plugin went.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) removal_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeviceJson {
    pub(crate) id: String,
    pub(crate) health: String,
}

impl From<ResourceStatus> for DeviceResourceJson {
    fn from(resource: ResourceStatus) -> Self {
        Self {
            resource: resource.resource,
            endpoint: resource.endpoint,
            healthy: resource.healthy,
            unhealthy: resource.unhealthy,
            devices: resource
                .devices
                .into_iter()
                .map(|d| DeviceJson { id: d.id, health: d.health })
                .collect(),
            removal_at: resource.removal_at.map(rfc3339),
        }
    }
}

fn rfc3339(at: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// A registered CSI driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CsiDriverJson {
    pub(crate) name: String,
    pub(crate) endpoint: String,
    pub(crate) version: String,
    pub(crate) node_id: Option<String>,
    pub(crate) topology: BTreeMap<String, String>,
    pub(crate) max_volumes: Option<i64>,
}

/// What the node publishes about its CSI drivers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeJson {
    pub(crate) annotations: BTreeMap<String, String>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) csinode: CsiNodeJson,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CsiNodeJson {
    pub(crate) drivers: Vec<CsiNodeDriverJson>,
}

/// A CSINode driver entry, with the Kubernetes API's field names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CsiNodeDriverJson {
    pub(crate) name: String,
    #[serde(rename = "nodeID")]
    pub(crate) node_id: String,
    #[serde(rename = "topologyKeys")]
    pub(crate) topology_keys: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) allocatable: Option<AllocatableJson>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AllocatableJson {
    pub(crate) count: i32,
}

impl From<CsiDriver> for CsiDriverJson {
    fn from(driver: CsiDriver) -> Self {
        let node = driver.node;
        Self {
            name: driver.name,
            endpoint: driver.endpoint,
            version: driver.version.to_string(),
            node_id: node.as_ref().map(|n| n.node_id.clone()),
            max_volumes: node.as_ref().map(|n| n.max_volumes_per_node),
            topology: node.map(|n| n.topology).unwrap_or_default(),
        }
    }
}

impl From<NodeInfo> for NodeJson {
    fn from(node: NodeInfo) -> Self {
        Self {
            annotations: node.annotations,
            labels: node.labels,
            csinode: CsiNodeJson {
                drivers: node.csinode.drivers.into_iter().map(CsiNodeDriverJson::from).collect(),
            },
        }
    }
}

impl From<CsiNodeDriver> for CsiNodeDriverJson {
    fn from(driver: CsiNodeDriver) -> Self {
        Self {
            name: driver.name,
            node_id: driver.node_id,
            topology_keys: driver.topology_keys,
            allocatable: driver.allocatable_count.map(|count| AllocatableJson { count }),
        }
    }
}

/// One plugin, as the status API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PluginJson {
    pub(crate) socket_path: String,
    #[serde(rename = "type")]
    pub(crate) plugin_type: String,
    pub(crate) name: String,
    pub(crate) endpoint: String,
    pub(crate) versions: Vec<String>,
    pub(crate) state: String,
    pub(crate) generation: u64,
    pub(crate) last_error: Option<String>,
    pub(crate) registered_at: Option<String>,
    /// When the next attempt starts, while `backing_off`.
    #[serde(default)]
    pub(crate) retry_at: Option<String>,
}

impl From<PluginStatus> for PluginJson {
    fn from(status: PluginStatus) -> Self {
        Self {
            socket_path: status.socket_path.display().to_string(),
            plugin_type: status.plugin_type,
            name: status.name,
            endpoint: status.endpoint,
            versions: status.versions,
            state: status.state.as_str().to_owned(),
            generation: status.generation,
            last_error: status.last_error,
            registered_at: status.registered_at.map(rfc3339),
            retry_at: status.state.retry_at().map(rfc3339),
        }
    }
}
