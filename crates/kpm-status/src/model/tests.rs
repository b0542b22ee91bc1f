//! The status API's JSON schema, pinned: a full `GET /v1/plugins` document
//! with every field present and absent, from the library's types.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kpm::csi::{CsiDriver, CsiNode, CsiNodeDriver, DriverNodeInfo, NodeInfo, Version};
use kpm::device::{DeviceStatus, ResourceStatus};
use kpm::dra::{DeviceHealthStatus, DraDriverStatus, DraInstanceStatus};
use kpm::kube::{KubeStatus, ObjectKind, ObjectSync, PendingPublication, RequestCount, SyncError};
use kpm::{
    Generation, PluginDetails, PluginEndpoint, PluginEvent, PluginState, PluginStatus, Registration,
};
use serde_json::{Value, json};

use super::PluginList;
use crate::EventLine;

/// `2026-11-21T12:00:00.000Z` plus `millis`.
fn at(millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(1_795_262_400_000 + millis)
}

/// What the server reads from the kubelet, one part each.
struct Parts {
    plugins: Vec<PluginStatus>,
    csi_drivers: Vec<CsiDriver>,
    node: Option<NodeInfo>,
    device_resources: Vec<ResourceStatus>,
    dra_drivers: Vec<DraDriverStatus>,
    kubernetes: Option<KubeStatus>,
}

/// The document the status API serves for `parts`.
fn document(parts: Parts) -> Value {
    let list = PluginList {
        plugins: parts.plugins.into_iter().map(Into::into).collect(),
        csi_drivers: parts.csi_drivers.into_iter().map(Into::into).collect(),
        node: parts.node.unwrap_or_default().into(),
        device_resources: parts.device_resources.into_iter().map(Into::into).collect(),
        dra_drivers: parts.dra_drivers.into_iter().map(Into::into).collect(),
        kubernetes: parts.kubernetes.map(Into::into),
    };
    let document = serde_json::to_value(&list).unwrap();
    // One schema: what a reader reads back is what was written.
    let read: PluginList = serde_json::from_value(document.clone()).unwrap();
    assert_eq!(read, list);
    document
}

fn plugin(socket: &str, state: PluginState, generation: u64) -> PluginStatus {
    PluginStatus::new(socket, state, Generation::for_tests(generation))
}

/// A plugin in each state, with every field present and absent.
fn plugins() -> Vec<PluginStatus> {
    let mut registered = plugin("/r/gpu.sock", PluginState::Registered, 3);
    let socket = PluginEndpoint::RegistrationSocket("/r/gpu.sock".into());
    let gpu = PluginDetails::new("vendor.com/gpu", socket, ["v1beta1"]);
    let mut registration =
        Registration::new("/r/gpu.sock", registered.generation, "DevicePlugin", gpu, Some(4242));
    registration.registered_at = at(1);
    registered.registration = Some(registration);
    let mut backing_off =
        plugin("/r/late.sock", PluginState::BackingOff { retry_at: at(8_250) }, 4);
    backing_off.last_error = Some("GetInfo: connection refused".into());
    let mut failed = plugin("/r/odd.sock", PluginState::Failed, 5);
    failed.last_error = Some("unknown plugin type \"Odd\"".into());
    let mut leaving = registered.clone();
    leaving.socket_path = PathBuf::from("/r/old.sock");
    leaving.state = PluginState::Deregistering;
    if let Some(registration) = &mut leaving.registration {
        registration.server_pid = None;
    }

    vec![registered, backing_off, failed, plugin("/r/new.sock", PluginState::Pending, 6), leaving]
}

/// A publisher with a sync that succeeded, one that failed, and a
/// publication the API server does not hold yet.
fn kubernetes() -> KubeStatus {
    let mut kube = KubeStatus::default();
    kube.node = "node1".into();
    let mut synced = ObjectSync::default();
    synced.last_success = Some(at(2));
    let mut failing = ObjectSync::default();
    failing.last_error = Some(SyncError::new(at(3), "boom"));
    kube.objects = vec![(ObjectKind::Node, synced), (ObjectKind::NodeStatus, failing)];
    kube.requests = vec![RequestCount::new("patch", "nodes/status", "success", 3)];
    let mut pending = PendingPublication::new(
        ObjectKind::NodeStatus,
        "vendor.com/gpu",
        "capacity 2, allocatable 1",
        false,
        at(3),
    );
    pending.last_error = Some("boom".into());
    kube.pending = vec![pending];
    kube
}

fn full() -> Parts {
    Parts {
        plugins: plugins(),
        csi_drivers: vec![
            CsiDriver {
                name: "csi.example.com".into(),
                endpoint: "unix:///csi/csi.sock".into(),
                version: Version::parse_generic("v1.2.0-rc1").unwrap(),
                node: Some(DriverNodeInfo {
                    node_id: "node-1".into(),
                    max_volumes_per_node: 16,
                    topology: BTreeMap::from([("zone".into(), "a".into())]),
                }),
                allocatable_update_period: Some(std::time::Duration::from_secs(60)),
                allocatable_refreshed_at: Some(at(4)),
            },
            CsiDriver {
                name: "early.example.com".into(),
                endpoint: "/csi/early.sock".into(),
                version: Version::parse_generic("1.0").unwrap(),
                node: None,
                allocatable_update_period: None,
                allocatable_refreshed_at: None,
            },
        ],
        node: Some(NodeInfo {
            annotations: BTreeMap::from([(
                "csi.volume.kubernetes.io/nodeid".into(),
                r#"{"csi.example.com":"node-1"}"#.into(),
            )]),
            labels: BTreeMap::from([("zone".into(), "a".into())]),
            csinode: CsiNode {
                drivers: vec![
                    CsiNodeDriver {
                        name: "csi.example.com".into(),
                        node_id: "node-1".into(),
                        topology_keys: vec!["zone".into()],
                        allocatable_count: Some(16),
                    },
                    CsiNodeDriver {
                        name: "plain.example.com".into(),
                        node_id: "n1".into(),
                        topology_keys: Vec::new(),
                        allocatable_count: None,
                    },
                ],
            },
        }),
        device_resources: vec![
            ResourceStatus {
                resource: "vendor.com/gpu".into(),
                endpoint: "/dp/gpu.sock".into(),
                healthy: 1,
                unhealthy: 1,
                devices: vec![
                    DeviceStatus { id: "a".into(), health: "Healthy".into(), numa_nodes: vec![0] },
                    DeviceStatus {
                        id: "b".into(),
                        health: "Unhealthy".into(),
                        numa_nodes: Vec::new(),
                    },
                ],
                removal_at: None,
            },
            ResourceStatus {
                resource: "vendor.com/nic".into(),
                endpoint: String::new(),
                healthy: 0,
                unhealthy: 0,
                devices: Vec::new(),
                removal_at: Some(at(300_000)),
            },
        ],
        dra_drivers: dra_drivers(),
        kubernetes: Some(kubernetes()),
    }
}

/// A DRA driver with an instance and devices (one expired), and one gone
/// whose cleanup is pending.
fn dra_drivers() -> Vec<DraDriverStatus> {
    vec![
        DraDriverStatus {
            name: "gpu.example.com".into(),
            instances: vec![DraInstanceStatus {
                endpoint: "/p/dra.sock".into(),
                version: "v1.DRAPlugin".into(),
                connected: true,
                registered_at: at(4),
                health_service: Some("v1.DRAResourceHealth".into()),
            }],
            cleanup_pending_until: None,
            devices: vec![
                DeviceHealthStatus {
                    pool: "pool".into(),
                    device: "gpu-0".into(),
                    health: "Healthy".into(),
                    message: String::new(),
                    reported_at: at(5),
                    expires_at: Some(at(30_005)),
                },
                DeviceHealthStatus {
                    pool: "pool".into(),
                    device: "gpu-1".into(),
                    health: "Unknown".into(),
                    message: String::new(),
                    reported_at: at(6),
                    expires_at: None,
                },
            ],
        },
        DraDriverStatus {
            name: "gone.example.com".into(),
            instances: Vec::new(),
            cleanup_pending_until: Some(at(30_000)),
            devices: Vec::new(),
        },
    ]
}

/// What [`plugins`] serialize to.
fn expected_plugins() -> Value {
    json!([
        {
            "socket_path": "/r/gpu.sock", "type": "DevicePlugin", "name": "vendor.com/gpu",
            "endpoint": "/r/gpu.sock", "versions": ["v1beta1"], "state": "registered",
            "generation": 3, "last_error": null, "registered_at": "2026-11-21T12:00:00.001Z",
            "retry_at": null, "server_pid": 4242,
        },
        {
            "socket_path": "/r/late.sock", "type": "", "name": "", "endpoint": "",
            "versions": [], "state": "backing_off", "generation": 4,
            "last_error": "GetInfo: connection refused", "registered_at": null,
            "retry_at": "2026-11-21T12:00:08.250Z", "server_pid": null,
        },
        {
            "socket_path": "/r/odd.sock", "type": "", "name": "", "endpoint": "",
            "versions": [], "state": "failed", "generation": 5,
            "last_error": "unknown plugin type \"Odd\"", "registered_at": null,
            "retry_at": null, "server_pid": null,
        },
        {
            "socket_path": "/r/new.sock", "type": "", "name": "", "endpoint": "",
            "versions": [], "state": "pending", "generation": 6, "last_error": null,
            "registered_at": null, "retry_at": null, "server_pid": null,
        },
        {
            "socket_path": "/r/old.sock", "type": "DevicePlugin", "name": "vendor.com/gpu",
            "endpoint": "/r/gpu.sock", "versions": ["v1beta1"], "state": "deregistering",
            "generation": 3, "last_error": null, "registered_at": "2026-11-21T12:00:00.001Z",
            "retry_at": null, "server_pid": null,
        },
    ])
}

#[test]
fn the_plugin_list_keeps_its_schema() {
    let expected = json!({
        "plugins": expected_plugins(),
        "csi_drivers": [
            {
                "name": "csi.example.com", "endpoint": "unix:///csi/csi.sock", "version": "1.2.0",
                "node_id": "node-1", "topology": {"zone": "a"}, "max_volumes": 16,
                "allocatable_update_period_s": 60,
                "allocatable_refreshed_at": "2026-11-21T12:00:00.004Z",
            },
            {
                "name": "early.example.com", "endpoint": "/csi/early.sock", "version": "1.0",
                "node_id": null, "topology": {}, "max_volumes": null,
                "allocatable_update_period_s": null, "allocatable_refreshed_at": null,
            },
        ],
        "node": {
            "annotations": {"csi.volume.kubernetes.io/nodeid": "{\"csi.example.com\":\"node-1\"}"},
            "labels": {"zone": "a"},
            "csinode": {"drivers": [
                {"name": "csi.example.com", "nodeID": "node-1", "topologyKeys": ["zone"],
                 "allocatable": {"count": 16}},
                {"name": "plain.example.com", "nodeID": "n1", "topologyKeys": []},
            ]},
        },
        "device_resources": [
            {
                "resource": "vendor.com/gpu", "endpoint": "/dp/gpu.sock", "healthy": 1,
                "unhealthy": 1,
                "devices": [{"id": "a", "health": "Healthy"}, {"id": "b", "health": "Unhealthy"}],
            },
            {
                "resource": "vendor.com/nic", "endpoint": "", "healthy": 0, "unhealthy": 0,
                "devices": [], "removal_at": "2026-11-21T12:05:00.000Z",
            },
        ],
        "dra_drivers": [
            {
                "name": "gpu.example.com",
                "instances": [{"endpoint": "/p/dra.sock", "version": "v1.DRAPlugin",
                               "connected": true, "registered_at": "2026-11-21T12:00:00.004Z"}],
                "cleanup_pending_until": null,
                "devices": [
                    {"pool": "pool", "device": "gpu-0", "health": "Healthy", "message": "",
                     "reported_at": "2026-11-21T12:00:00.005Z",
                     "expires_at": "2026-11-21T12:00:30.005Z"},
                    {"pool": "pool", "device": "gpu-1", "health": "Unknown", "message": "",
                     "reported_at": "2026-11-21T12:00:00.006Z", "expires_at": null},
                ],
            },
            {
                "name": "gone.example.com", "instances": [],
                "cleanup_pending_until": "2026-11-21T12:00:30.000Z",
            },
        ],
        "kubernetes": {
            "node": "node1",
            "objects": [
                {"kind": "Node", "last_success": "2026-11-21T12:00:00.002Z", "last_error": null},
                {"kind": "Node status", "last_success": null,
                 "last_error": {"at": "2026-11-21T12:00:00.003Z", "message": "boom"}},
            ],
            "requests": [
                {"verb": "patch", "resource": "nodes/status", "outcome": "success", "count": 3},
            ],
            "pending": [
                {"kind": "Node status", "name": "vendor.com/gpu",
                 "want": "capacity 2, allocatable 1", "removes": false,
                 "since": "2026-11-21T12:00:00.003Z", "last_error": "boom"},
            ],
        },
    });
    let document = document(full());
    assert_eq!(document, expected);
    // `kpm list -o json` prints the keys in the server's order.
    let keys = |value: &Value| value.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        keys(&document),
        ["plugins", "csi_drivers", "node", "device_resources", "dra_drivers", "kubernetes"]
    );
    assert_eq!(
        keys(&document["plugins"][1]),
        [
            "socket_path",
            "type",
            "name",
            "endpoint",
            "versions",
            "state",
            "generation",
            "last_error",
            "registered_at",
            "retry_at",
            "server_pid"
        ]
    );
}

#[test]
fn an_event_line_is_the_event_with_the_time_it_was_sent() {
    let line = serde_json::to_value(EventLine::subscribed()).unwrap();
    assert_eq!(line.as_object().unwrap().len(), 2, "{line}");
    assert_eq!(line["event"], "subscribed");
    let time = line["time"].as_str().unwrap();
    assert!(humantime::parse_rfc3339(time).is_ok() && time.ends_with('Z'), "{time}");
}

#[test]
fn a_device_health_line_names_the_driver_device_and_change() {
    let event = PluginEvent::DraDeviceHealthChanged {
        driver: "gpu.example.com".into(),
        pool: "pool".into(),
        device: "gpu-0".into(),
        health: "Unknown".into(),
        previous: Some("Healthy".into()),
        expired: true,
        message: String::new(),
    };
    let mut line = serde_json::to_value(EventLine::new(&event).unwrap()).unwrap();
    // One schema: a reader writes back what it read.
    let read: EventLine = serde_json::from_value(line.clone()).unwrap();
    assert_eq!(serde_json::to_value(read).unwrap(), line);
    let keys: Vec<_> = line.as_object().unwrap().keys().cloned().collect();
    assert_eq!(
        keys,
        ["time", "event", "driver", "pool", "device", "health", "previous", "expired", "message"]
    );
    line["time"] = json!("T");
    assert_eq!(
        line,
        json!({"time": "T", "event": "device_health", "driver": "gpu.example.com",
               "pool": "pool", "device": "gpu-0", "health": "Unknown", "previous": "Healthy",
               "expired": true, "message": ""})
    );
}

#[test]
fn an_empty_kubelet_gives_empty_parts_and_a_null_kubernetes() {
    let empty = Parts {
        plugins: Vec::new(),
        csi_drivers: Vec::new(),
        node: None,
        device_resources: Vec::new(),
        dra_drivers: Vec::new(),
        kubernetes: None,
    };
    let expected = json!({
        "plugins": [],
        "csi_drivers": [],
        "node": {"annotations": {}, "labels": {}, "csinode": {"drivers": []}},
        "device_resources": [],
        "dra_drivers": [],
        "kubernetes": null,
    });
    assert_eq!(document(empty), expected);
}
