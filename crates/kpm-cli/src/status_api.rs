//! The status API: HTTP/JSON on a Unix socket, served by `kpm run` and read
//! by `kpm list`.
//!
//! `GET /v1/plugins` returns
//! `{"plugins": [{"socket_path", "type", "name", "endpoint", "versions",
//! "state", "generation", "last_error", "registered_at"}], "csi_drivers":
//! [{"name", "endpoint", "version", "node_id", "topology", "max_volumes"}],
//! "node": {"annotations", "labels", "csinode": {"drivers": [{"name",
//! "nodeID", "topologyKeys", "allocatable": {"count"}}]}}}` with `state` one of
//! `registered`, `pending`, `failed` and `registered_at` in RFC 3339 (UTC),
//! and `"device_resources": [{"resource", "endpoint", "healthy", "unhealthy",
//! "devices": [{"id", "health"}], "removal_at"}]` and `"dra_drivers":
//! [{"name", "instances": [{"endpoint", "version", "connected",
//! "registered_at"}], "cleanup_pending_until", "devices"}]`.
//! The node part is what the kubelet would publish on its Node and CSINode
//! objects, with Kubernetes' field names.

use std::path::Path;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::routing::get;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;

use kpm::csi::{CsiDriver, CsiDrivers, CsiNodeDriver, InMemoryNodeInfo, NodeInfo};
use kpm::device::{DeviceManager, ResourceStatus};
use kpm::dra::{DraDriverStatus, DraManager};
use kpm::{PluginEvent, PluginManager, PluginStatus};
use serde::{Deserialize, Serialize};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;

use crate::CliError;

/// Path of the plugin list.
pub(crate) const PLUGINS_PATH: &str = "/v1/plugins";
/// Path of the event stream: one JSON object per line, as events happen.
pub(crate) const EVENTS_PATH: &str = "/v1/events";

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
    fn now(event: &str) -> Self {
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

/// What the status API reports on.
#[derive(Debug, Clone)]
pub(crate) struct Sources {
    pub(crate) manager: Arc<PluginManager>,
    pub(crate) csi_drivers: Arc<CsiDrivers>,
    pub(crate) node: Arc<InMemoryNodeInfo>,
    pub(crate) devices: Arc<DeviceManager>,
    pub(crate) dra: Arc<DraManager>,
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
        }
    }
}

/// The router of the status API.
pub(crate) fn router(sources: Sources) -> axum::Router {
    axum::Router::new()
        .route(PLUGINS_PATH, get(plugins))
        .route(EVENTS_PATH, get(events))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(sources)
}

async fn plugins(State(sources): State<Sources>) -> Json<PluginList> {
    Json(PluginList::from(&sources))
}

impl From<&Sources> for PluginList {
    fn from(sources: &Sources) -> Self {
        Self {
            plugins: sources.manager.status().into_iter().map(PluginJson::from).collect(),
            csi_drivers: sources.csi_drivers.list().into_iter().map(CsiDriverJson::from).collect(),
            node: sources.node.snapshot().into(),
            device_resources: sources
                .devices
                .resources()
                .into_iter()
                .map(DeviceResourceJson::from)
                .collect(),
            dra_drivers: sources.dra.drivers().into_iter().map(DraDriverJson::from).collect(),
        }
    }
}

/// Streams events as NDJSON until the client goes away: first a
/// `subscribed` line (from then on nothing is missed), then every event. A
/// client that falls too far behind gets a `lagged` line instead of the
/// events it missed.
async fn events(State(sources): State<Sources>) -> axum::response::Response {
    let subscribed = serde_json::to_string(&EventJson::now("subscribed"))
        .map(|line| line + "\n")
        .map_err(std::io::Error::other);
    let events = BroadcastStream::new(sources.manager.subscribe()).map(|event| {
        let mut line = match event {
            Ok(event) => serde_json::to_string(&EventJson::from(event)),
            Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(missed)) => {
                Ok(format!("{{\"event\":\"lagged\",\"missed\":{missed}}}"))
            }
        }
        .map_err(std::io::Error::other)?;
        line.push('\n');
        Ok::<_, std::io::Error>(line)
    });
    let stream = tokio_stream::once(subscribed).chain(events);
    axum::response::Response::builder()
        .header(hyper::header::CONTENT_TYPE, "application/x-ndjson")
        .body(axum::body::Body::from_stream(stream))
        .unwrap_or_default()
}

/// Sends `GET path` to the status API at `socket`; returns the response once
/// its status is a success, with the body still to be read.
pub(crate) async fn request(
    socket: &Path,
    path: &str,
) -> Result<hyper::Response<hyper::body::Incoming>, CliError> {
    let query_err = |message: String| CliError::QueryStatus { path: socket.to_path_buf(), message };
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| CliError::ConnectStatus { path: socket.to_path_buf(), source })?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|err| query_err(err.to_string()))?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, "kpm")
        .body(Empty::<Bytes>::new())
        .map_err(|err| query_err(err.to_string()))?;
    let response = sender.send_request(request).await.map_err(|err| query_err(err.to_string()))?;
    if !response.status().is_success() {
        return Err(query_err(format!("GET {path}: HTTP {}", response.status())));
    }
    Ok(response)
}

/// `GET path` on the status API at `socket`; returns the body.
pub(crate) async fn get_json(socket: &Path, path: &str) -> Result<Bytes, CliError> {
    let body = request(socket, path).await?.into_body().collect().await.map_err(|err| {
        CliError::QueryStatus { path: socket.to_path_buf(), message: err.to_string() }
    })?;
    Ok(body.to_bytes())
}
