//! The status API's JSON documents, and their conversions from kpm's types.

use std::collections::BTreeMap;

use kpm::csi::{CsiDriver, CsiNodeDriver, NodeInfo};
use kpm::device::ResourceStatus;
use kpm::dra::DraDriverStatus;
use kpm::kube::{KubeStatus, ObjectSync, RequestCount};
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
    /// What kpm published to the API server; `null` when it does not publish.
    #[serde(default)]
    pub(crate) kubernetes: Option<KubernetesJson>,
}

/// How publishing to the Kubernetes API goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KubernetesJson {
    /// The Node kpm publishes for.
    pub(crate) node: String,
    /// One entry per kind of object, in display order.
    pub(crate) objects: Vec<KubeObjectJson>,
    /// API requests by verb, resource and outcome.
    pub(crate) requests: Vec<KubeRequestJson>,
}

/// The last sync and the last error of one kind of object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KubeObjectJson {
    /// `Node`, `CSINode`, `Node status` or `ResourceSlice`.
    pub(crate) kind: String,
    pub(crate) last_success: Option<String>,
    /// Kept after later successes: compare `at` with `last_success`.
    pub(crate) last_error: Option<KubeErrorJson>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KubeErrorJson {
    pub(crate) at: String,
    pub(crate) message: String,
}

/// How many requests of one verb on one resource ended one way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KubeRequestJson {
    pub(crate) verb: String,
    pub(crate) resource: String,
    /// `success`, an HTTP status code, `error` (no answer) or `timeout`.
    pub(crate) outcome: String,
    pub(crate) count: u64,
}

impl KubeRequestJson {
    pub(crate) fn failed(&self) -> bool {
        self.outcome != RequestCount::SUCCESS
    }
}

impl From<KubeStatus> for KubernetesJson {
    fn from(status: KubeStatus) -> Self {
        Self {
            node: status.node,
            objects: status
                .objects
                .into_iter()
                .map(|(kind, sync)| KubeObjectJson::new(kind.as_str(), sync))
                .collect(),
            requests: status.requests.into_iter().map(KubeRequestJson::from).collect(),
        }
    }
}

impl KubeObjectJson {
    fn new(kind: &str, sync: ObjectSync) -> Self {
        Self {
            kind: kind.to_owned(),
            last_success: sync.last_success.map(rfc3339),
            last_error: sync
                .last_error
                .map(|error| KubeErrorJson { at: rfc3339(error.at), message: error.message }),
        }
    }
}

impl From<RequestCount> for KubeRequestJson {
    fn from(request: RequestCount) -> Self {
        Self {
            verb: request.verb.to_owned(),
            resource: request.resource.to_owned(),
            outcome: request.outcome,
            count: request.count,
        }
    }
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
    /// The process serving the registration socket, once registered, if kpm
    /// can see it.
    #[serde(default)]
    pub(crate) server_pid: Option<u32>,
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
            server_pid: status.server_pid,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn list(kubernetes: Option<KubernetesJson>) -> PluginList {
        PluginList {
            plugins: Vec::new(),
            csi_drivers: Vec::new(),
            node: NodeJson::default(),
            device_resources: Vec::new(),
            dra_drivers: Vec::new(),
            kubernetes,
        }
    }

    #[test]
    fn kubernetes_is_null_unless_kpm_publishes_and_has_the_documented_fields() {
        let value = serde_json::to_value(list(None)).unwrap();
        assert_eq!(value["kubernetes"], serde_json::Value::Null);
        assert!(value.as_object().unwrap().contains_key("kubernetes"));

        let kube = KubernetesJson {
            node: "node1".into(),
            objects: vec![
                KubeObjectJson {
                    kind: "Node".into(),
                    last_success: Some("2026-11-21T12:00:00.000Z".into()),
                    last_error: None,
                },
                KubeObjectJson {
                    kind: "Node status".into(),
                    last_success: None,
                    last_error: Some(KubeErrorJson {
                        at: "2026-11-21T12:00:01.000Z".into(),
                        message: "boom".into(),
                    }),
                },
            ],
            requests: vec![KubeRequestJson {
                verb: "patch".into(),
                resource: "nodes/status".into(),
                outcome: "success".into(),
                count: 3,
            }],
        };
        let value = serde_json::to_value(list(Some(kube.clone()))).unwrap();
        assert_eq!(
            value["kubernetes"],
            json!({
                "node": "node1",
                "objects": [
                    {"kind": "Node", "last_success": "2026-11-21T12:00:00.000Z", "last_error": null},
                    {"kind": "Node status", "last_success": null,
                     "last_error": {"at": "2026-11-21T12:00:01.000Z", "message": "boom"}},
                ],
                "requests": [
                    {"verb": "patch", "resource": "nodes/status", "outcome": "success", "count": 3},
                ],
            })
        );
        // `kpm list` reads back what the server wrote.
        let read: PluginList = serde_json::from_value(value).unwrap();
        assert_eq!(read.kubernetes, Some(kube));
    }

    #[test]
    fn only_successful_requests_are_not_failures() {
        let request = |outcome: &str| KubeRequestJson {
            verb: "get".into(),
            resource: "nodes".into(),
            outcome: outcome.into(),
            count: 1,
        };
        assert!(!request("success").failed());
        for outcome in ["404", "409", "error", "timeout"] {
            assert!(request(outcome).failed(), "{outcome}");
        }
    }
}
