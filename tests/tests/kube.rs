//! `kpm::Kubelet` publishing through the Kubernetes API, against kube-rs's
//! test double (a mocked `tower` service) on paused time: what an earlier
//! run published and no plugin registers again (DRA slices, device
//! resources, CSI drivers) is removed after its grace period and kept when
//! its plugin comes back in time, without a flap; another manager's fields
//! are never named; and a kind that is disabled leaves what its plugins
//! published alone, since none of them can register again.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use kpm::kube::{KubeConfig, KubePublisher};
use kpm::{Kubelet, KubeletBuilder, KubeletHandle, PluginKind};
use kpm_registrar::Registrar;
use kpm_registrar::stub::{StubCsiDriver, StubDevicePlugin};
use kpm_test_support::api_server::{ApiRequest, State};
use kpm_test_support::{DEADLINE, wait_until};
use kube::client::Body;
use parking_lot::Mutex;
use serde_json::{Value, json};
use support::serve_service;
use tokio::time::Instant;
use tower_test::mock::{self, Handle};

/// The DRA cleanup grace period of these tests.
const GRACE: Duration = Duration::from_secs(30);
/// The device manager's grace period (its default).
const DEVICE_GRACE: Duration = Duration::from_secs(300);
/// The CSI leftovers' grace period (its default).
const CSI_GRACE: Duration = Duration::from_secs(30);

const GPU: &str = "vendor.com/gpu";
const CSI_DRIVER: &str = "csi.example.com";

/// The node's leftovers: a ResourceSlice of `gpu.example.com`, which is not
/// registered.
const SLICES: &str = r#"{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
    "metadata": {"resourceVersion": "1"}, "items": [{"apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice", "metadata": {"name": "node1-gpu"},
    "spec": {"driver": "gpu.example.com", "nodeName": "node1"}}]}"#;

const LIST_SLICES: &str =
    "GET /apis/resource.k8s.io/v1/resourceslices?&fieldSelector=spec.nodeName%3Dnode1";
const WIPE_GPU: &str = "DELETE /apis/resource.k8s.io/v1/resourceslices?&fieldSelector=spec.nodeName%3Dnode1%2Cspec.driver%3Dgpu.example.com";

const NODE_PATH: &str = "/api/v1/nodes/node1";
const NODE_STATUS_PATH: &str = "/api/v1/nodes/node1/status";
const CSINODE_PATH: &str = "/apis/storage.k8s.io/v1/csinodes/node1";

/// `csi.example.com`'s CSINode entry as the stub driver of these tests
/// reports it, so that its registration writes nothing.
fn csi_entry() -> Value {
    json!({"name": CSI_DRIVER, "nodeID": "node-1",
        "topologyKeys": ["topology.example.com/zone"], "allocatable": {"count": 7}})
}

/// Another agent's CSINode entry.
fn other_entry() -> Value {
    json!({"name": "other.example.com", "nodeID": "x"})
}

fn update(manager: &str, subresource: Option<&str>, fields: &Value) -> Value {
    json!({"manager": manager, "operation": "Update", "apiVersion": "v1",
        "subresource": subresource, "fieldsType": "FieldsV1", "fieldsV1": fields})
}

/// The Node as an earlier run of kpm left it: `vendor.com/gpu` (4 devices)
/// in capacity and allocatable, the node-id annotation with
/// `csi.example.com` and another agent's driver, a topology label; the
/// kubelet's `cpu` and `example.com/nic` beside them.
fn node() -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "node1", "uid": "uid-1", "resourceVersion": "5",
        "labels": {"topology.example.com/zone": "z1"},
        "annotations": {"csi.volume.kubernetes.io/nodeid":
            r#"{"csi.example.com":"node-1","other.example.com":"x"}"#},
        "managedFields": [
            update("kubelet", Some("status"), &json!({"f:status": {
                "f:capacity": {"f:cpu": {}, "f:example.com/nic": {}},
                "f:allocatable": {"f:cpu": {}, "f:example.com/nic": {}}}})),
            update("kpm", None, &json!({"f:metadata": {
                "f:annotations": {".": {}, "f:csi.volume.kubernetes.io/nodeid": {}},
                "f:labels": {"f:topology.example.com/zone": {}}}})),
            update("kpm", Some("status"), &json!({"f:status": {
                "f:capacity": {"f:vendor.com/gpu": {}},
                "f:allocatable": {"f:vendor.com/gpu": {}}}}))]},
        "status": {
            "capacity": {"cpu": "4", "example.com/nic": "2", "vendor.com/gpu": "4"},
            "allocatable": {"cpu": "4", "example.com/nic": "2", "vendor.com/gpu": "4"}}})
}

/// The CSINode an earlier run of kpm left: `csi.example.com`'s entry, kpm's,
/// beside another agent's.
fn csinode() -> Value {
    let kpms = json!({"f:spec": {"f:drivers": {r#"k:{"name":"csi.example.com"}"#: {
        ".": {}, "f:allocatable": {".": {}, "f:count": {}}, "f:name": {}, "f:nodeID": {},
        "f:topologyKeys": {}}}}});
    let others = json!({"f:spec": {"f:drivers": {r#"k:{"name":"other.example.com"}"#: {
            ".": {}, "f:name": {}, "f:nodeID": {}}}}});
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {
        "name": "node1", "resourceVersion": "7",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node1", "uid": "uid-1"}],
        "managedFields": [update("kpm", None, &kpms), update("other-agent", None, &others)]},
        "spec": {"drivers": [csi_entry(), other_entry()]}})
}

/// What the stand-in API server holds; `None` is not found.
#[derive(Clone)]
struct Objects {
    node: Option<Value>,
    csinode: Option<Value>,
    slices: Value,
}

impl Objects {
    /// An earlier run's leftovers of every kind.
    fn leftovers() -> Self {
        Self {
            node: Some(node()),
            csinode: Some(csinode()),
            slices: serde_json::from_str(SLICES).unwrap(),
        }
    }

    /// Only the DRA leftovers.
    fn slices() -> Self {
        Self { node: None, csinode: None, ..Self::leftovers() }
    }
}

/// One request kpm sent: when (since the API server started), `METHOD
/// uri`, and its JSON body (`null` without one).
#[derive(Debug, Clone)]
struct Sent {
    at: Duration,
    request: String,
    body: Value,
}

/// An API server holding `objects` (kpm-test-support's stand-in, whose
/// writes change them); records every request. The watches of the Node and
/// the CSINode are held open and never answered.
async fn api_server(
    mut handle: Handle<Request<Body>, Response<Body>>,
    objects: Objects,
    seen: Arc<Mutex<Vec<Sent>>>,
) {
    let start = Instant::now();
    let mut state = State {
        node: objects.node,
        csinode: objects.csinode,
        slices: objects.slices["items"].as_array().cloned().unwrap_or_default(),
        resource_version: 7,
        ..State::default()
    };
    let mut watches = Vec::new();
    while let Some((request, reply)) = handle.next_request().await {
        let line = format!("{} {}", request.method(), request.uri());
        let (parts, body) = request.into_parts();
        let body = body.collect_bytes().await.unwrap();
        let value =
            if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap() };
        seen.lock().push(Sent { at: start.elapsed(), request: line, body: value });
        if State::watched(parts.uri.path(), parts.uri.query().unwrap_or_default()).is_some() {
            watches.push(reply);
            continue;
        }
        let (status, answer) = state.handle(&ApiRequest::of(&parts, &body));
        reply.send_response(Response::builder().status(status).body(Body::from(answer)).unwrap());
    }
}

/// A kubelet on a temp root publishing to [`api_server`] with `objects`,
/// running until stopped.
struct Node {
    root: tempfile::TempDir,
    handle: KubeletHandle,
    seen: Arc<Mutex<Vec<Sent>>>,
    stop: tokio::sync::oneshot::Sender<()>,
    running: tokio::task::JoinHandle<kpm::Result<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl Node {
    /// Starts it with the `disabled` kinds, the graces of these tests, and
    /// `builder`'s settings.
    fn start(
        objects: Objects,
        disabled: &[PluginKind],
        builder: impl FnOnce(KubeletBuilder) -> KubeletBuilder,
    ) -> Self {
        let (service, api) = mock::pair::<Request<Body>, Response<Body>>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let server = tokio::spawn(api_server(api, objects, Arc::clone(&seen)));
        let client = kube::Client::new(service, "default");
        let config = KubeConfig::default().csi_cleanup_grace(CSI_GRACE);
        let publisher = KubePublisher::new(client, "node1", config).unwrap();
        let root = tempfile::tempdir().unwrap();
        let kubelet = disabled
            .iter()
            .fold(Kubelet::builder(), |builder, kind| builder.disable(*kind))
            .root_dir(root.path())
            .manager(|m| m.liveness(None))
            .dra_config(kpm::dra::DraConfig::default().cleanup_grace(GRACE))
            .device_config(kpm::device::DeviceConfig::default().grace_period(DEVICE_GRACE))
            .kubernetes(publisher);
        let kubelet = builder(kubelet).build().unwrap();
        let handle = kubelet.handle();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(kubelet.run(async { drop(stopped.await) }));
        Self { root, handle, seen, stop, running, server }
    }

    /// Runs a kubelet with the `disabled` kinds for `period`; returns the
    /// requests it sent. On paused time, every timer due within the period
    /// fires, and what it sends is answered, before the kubelet is stopped.
    async fn run_for(objects: Objects, disabled: &[PluginKind], period: Duration) -> Vec<Sent> {
        let node = Self::start(objects, disabled, |builder| builder);
        tokio::time::sleep(period).await;
        node.stop().await
    }

    /// Stops the kubelet; returns the requests it sent.
    async fn stop(self) -> Vec<Sent> {
        drop(self.stop);
        self.running.await.unwrap().unwrap();
        self.server.abort();
        self.seen.lock().clone()
    }

    fn registry(&self) -> std::path::PathBuf {
        self.root.path().join(kpm::api::PLUGINS_REGISTRY_DIR_NAME)
    }

    /// Serves `builder`'s plugin in the registry, once the kubelet made it.
    async fn plugin(&self, builder: kpm_registrar::RegistrarBuilder) -> Registrar {
        wait_until("the registry directory is created", || self.registry().is_dir()).await;
        builder.socket_dir(self.registry()).serve().await.unwrap()
    }
}

/// The `nodes/status` patches that name `resource`: when, and its
/// (capacity, allocatable), `null` removing it.
fn status_patches(seen: &[Sent], resource: &str) -> Vec<(Duration, Value, Value)> {
    seen.iter()
        .filter(|sent| sent.request.starts_with(&format!("PATCH {NODE_STATUS_PATH}?")))
        .filter_map(|sent| {
            let status = &sent.body["status"];
            let capacity = status["capacity"].as_object()?.get(resource)?.clone();
            Some((sent.at, capacity, status["allocatable"][resource].clone()))
        })
        .collect()
}

/// Every write: anything but a `GET`.
fn writes(seen: &[Sent]) -> Vec<&Sent> {
    seen.iter().filter(|sent| !sent.request.starts_with("GET ")).collect()
}

/// The writes of the Node and the CSINode: CSI's.
fn csi_writes(seen: &[Sent]) -> Vec<&Sent> {
    writes(seen)
        .into_iter()
        .filter(|sent| {
            sent.request.contains(CSINODE_PATH)
                || sent.request.starts_with(&format!("PATCH {NODE_PATH}?"))
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn with_dra_enabled_a_leftover_drivers_slices_are_deleted_after_the_grace_period() {
    let requests = Node::run_for(Objects::slices(), &[], GRACE * 4).await;
    assert!(requests.iter().any(|r| r.request == LIST_SLICES), "{requests:#?}");
    assert!(requests.iter().any(|r| r.request == WIPE_GPU), "{requests:#?}");
}

#[tokio::test(start_paused = true)]
async fn an_earlier_runs_device_resource_leaves_after_the_device_grace_and_never_before() {
    let requests = Node::run_for(Objects::leftovers(), &[], DEVICE_GRACE * 2).await;
    let patches = status_patches(&requests, GPU);
    // Zero, then removed, as a resource whose plugin went away leaves.
    let counts: Vec<_> = patches.iter().map(|(_, c, a)| (c.clone(), a.clone())).collect();
    assert_eq!(counts, [(json!("0"), json!("0")), (Value::Null, Value::Null)], "{requests:#?}");
    assert!(patches.iter().all(|(at, ..)| *at >= DEVICE_GRACE), "{patches:?}");
    for other in ["cpu", "example.com/nic"] {
        assert!(status_patches(&requests, other).is_empty(), "{other}: {requests:#?}");
    }
    assert!(
        requests.iter().filter(|sent| sent.request.contains("/status")).all(|sent| {
            sent.body["status"].as_object().is_none_or(|status| {
                status.values().all(|map| map.as_object().is_some_and(|map| map.keys().eq([GPU])))
            })
        }),
        "{requests:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_earlier_runs_device_resource_goes_on_with_its_plugins_counts_without_a_flap() {
    let node = Node::start(Objects::leftovers(), &[], |builder| builder);
    // A minute in, well within the grace period.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let (gpus, _devices) =
        StubDevicePlugin::new([("gpu-0", "Healthy"), ("gpu-1", "Healthy"), ("gpu-2", "Unhealthy")]);
    let _plugin =
        node.plugin(Registrar::builder(kpm::api::DEVICE_PLUGIN, GPU).routes(gpus.routes())).await;
    let seen = Arc::clone(&node.seen);
    wait_until("the plugin's counts are published", || {
        !status_patches(&seen.lock(), GPU).is_empty()
    })
    .await;
    tokio::time::sleep(DEVICE_GRACE * 2).await;
    let requests = node.stop().await;
    let patches = status_patches(&requests, GPU);
    let counts: Vec<_> = patches.iter().map(|(_, c, a)| (c.clone(), a.clone())).collect();
    assert_eq!(counts, [(json!("3"), json!("2"))], "{requests:#?}");
    assert!(patches[0].0 < DEVICE_GRACE, "{patches:?}");
}

#[tokio::test(start_paused = true)]
async fn an_earlier_runs_csi_driver_is_withdrawn_after_the_grace_as_a_deregistration_would() {
    let requests = Node::run_for(Objects::leftovers(), &[], CSI_GRACE * 4).await;
    let writes = csi_writes(&requests);
    let lines: Vec<_> = writes.iter().map(|sent| sent.request.as_str()).collect();
    assert_eq!(
        lines,
        [
            "PUT /apis/storage.k8s.io/v1/csinodes/node1?&fieldManager=kpm",
            "PATCH /api/v1/nodes/node1?&fieldManager=kpm",
        ],
        "{requests:#?}"
    );
    assert!(writes.iter().all(|sent| sent.at >= CSI_GRACE), "{writes:#?}");
    // The other agent's entries stay; the topology label is not named.
    assert_eq!(writes[0].body["metadata"]["resourceVersion"], "7");
    assert_eq!(writes[0].body["spec"]["drivers"], json!([other_entry()]));
    assert_eq!(
        writes[1].body,
        json!({"metadata": {"resourceVersion": "5", "annotations": {
            "csi.volume.kubernetes.io/nodeid": r#"{"other.example.com":"x"}"#}}})
    );
}

#[tokio::test(start_paused = true)]
async fn an_earlier_runs_csi_driver_that_registers_in_time_is_kept() {
    let node = Node::start(Objects::leftovers(), &[], |builder| builder);
    let start = Instant::now();
    let csi_socket = node.root.path().join("plugins/csi.example.com/csi.sock");
    let driver =
        StubCsiDriver::new(CSI_DRIVER, "node-1").topology("topology.example.com/zone", "z1");
    let _service = serve_service(&csi_socket, driver.max_volumes(7).routes()).await;
    let _registrar = node
        .plugin(
            Registrar::builder(kpm::api::CSI_PLUGIN, CSI_DRIVER)
                .versions(["1.0.0"])
                .endpoint(&csi_socket),
        )
        .await;
    let drivers = Arc::clone(node.handle.csi_drivers());
    wait_until("the driver is registered", || {
        drivers.get(CSI_DRIVER).is_some_and(|d| d.node.is_some())
    })
    .await;
    assert!(start.elapsed() < CSI_GRACE, "registered {:?} after the start", start.elapsed());
    tokio::time::sleep(CSI_GRACE * 4).await;
    let requests = node.stop().await;
    // It registered with what the Node and CSINode show: nothing to write.
    assert!(csi_writes(&requests).is_empty(), "{requests:#?}");
}

/// Each kind disabled in turn, the others running past every grace: the
/// disabled kind's objects are never written.
#[tokio::test(start_paused = true)]
async fn a_disabled_kinds_leftovers_are_left_alone() {
    type Touches = fn(&Sent) -> bool;
    let kinds: [(PluginKind, Touches); 3] = [
        (PluginKind::Dra, |sent| sent.request.contains("resourceslices")),
        (PluginKind::Device, |sent| sent.request.contains("/status")),
        (PluginKind::Csi, |sent| {
            sent.request.contains(CSINODE_PATH)
                || sent.request.starts_with(&format!("PATCH {NODE_PATH}?"))
        }),
    ];
    for (kind, touches) in kinds {
        let requests = Node::run_for(Objects::leftovers(), &[kind], DEVICE_GRACE * 2).await;
        let touched: Vec<_> = requests.iter().filter(|sent| touches(sent)).collect();
        assert!(touched.is_empty(), "{kind:?}: {touched:#?}");
        // The others did clean up.
        assert!(writes(&requests).len() >= 2, "{kind:?}: {requests:#?}");
    }
    let requests = Node::run_for(Objects::leftovers(), &PluginKind::ALL, DEVICE_GRACE * 2).await;
    assert!(requests.is_empty(), "{requests:#?}");
}

/// A writer of log lines into a shared buffer, for tests that read what
/// kpm logged.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn on_a_node_without_managed_fields_no_resource_is_taken_for_a_leftover_and_one_warning_says_why()
 {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    // The test's runtime has one thread, which every task of kpm runs on.
    let _logging = tracing::subscriber::set_default(subscriber);
    let mut objects = Objects::leftovers();
    if let Some(node) = &mut objects.node {
        node["metadata"]["managedFields"] = Value::Null;
    }
    let requests = Node::run_for(objects, &[], DEVICE_GRACE * 2).await;
    assert!(status_patches(&requests, GPU).is_empty(), "{requests:#?}");
    // Both the device and the CSI leftovers read the Node.
    let node_read = format!("GET {NODE_PATH}");
    let node_reads = requests.iter().filter(|sent| sent.request == node_read).count();
    assert!(node_reads >= 2, "{requests:#?}");
    let logs = String::from_utf8(logs.0.lock().clone()).unwrap();
    let warnings: Vec<_> = logs.lines().filter(|line| line.contains("no managedFields")).collect();
    assert_eq!(warnings.len(), 1, "{logs}");
}

const CSINODE_UPDATE: &str = "PUT /apis/storage.k8s.io/v1/csinodes/node1?&fieldManager=kpm";

/// An API server for one CSI driver: its CSIDriver sets
/// `nodeAllocatableUpdatePeriodSeconds: 10` (the watch that follows the
/// list never answers), the Node exists, and kpm-test-support's stand-in
/// holds it and the CSINode kpm creates. Records every request as `METHOD
/// uri`, with the body of each CSINode update.
async fn csi_api_server(
    mut handle: Handle<Request<Body>, Response<Body>>,
    seen: Arc<Mutex<Vec<String>>>,
) {
    let csidrivers = r#"{"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriverList",
        "metadata": {"resourceVersion": "7"}, "items": [{"apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver", "metadata": {"name": "csi.example.com", "resourceVersion": "7"},
        "spec": {"nodeAllocatableUpdatePeriodSeconds": 10}}]}"#;
    let mut state = State::with_node("node1");
    let mut watches = Vec::new();
    while let Some((request, reply)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let body = body.collect_bytes().await.unwrap();
        let mut line = format!("{} {}", parts.method, parts.uri);
        if line.starts_with(CSINODE_UPDATE) {
            line = format!("{line} {}", String::from_utf8_lossy(&body));
        }
        seen.lock().push(line);
        if parts.uri.query().unwrap_or_default().contains("watch=true") {
            watches.push(reply);
            continue;
        }
        let (status, answer) = if parts.uri.path() == "/apis/storage.k8s.io/v1/csidrivers" {
            (200, csidrivers.as_bytes().to_vec())
        } else {
            state.handle(&ApiRequest::of(&parts, &body))
        };
        reply.send_response(Response::builder().status(status).body(Body::from(answer)).unwrap());
    }
}

/// KEP-4876 through the facade: the CSIDriver's period has the driver's
/// count refreshed, and a changed count is one update of the CSINode,
/// changing its entry alone.
#[tokio::test(start_paused = true)]
async fn a_csidrivers_update_period_has_the_csinode_count_follow_the_driver() {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let server = tokio::spawn(csi_api_server(handle, Arc::clone(&seen)));
    let publisher =
        KubePublisher::new(kube::Client::new(service, "default"), "node1", KubeConfig::default())
            .unwrap();
    let root = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::builder()
        .root_dir(root.path())
        .manager(|m| m.liveness(None))
        .kubernetes(publisher)
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(kubelet.run(async move { drop(stopped.await) }));

    let limit = root.path().join("max-volumes");
    std::fs::write(&limit, "16").unwrap();
    let driver =
        kpm_registrar::stub::StubCsiDriver::new(CSI_DRIVER, "node-1-id").max_volumes_file(&limit);
    let plugin = kpm_registrar::Registrar::builder(kpm_registrar::CSI_PLUGIN, CSI_DRIVER)
        .socket_dir(root.path().join("plugins_registry"))
        .routes(driver.routes())
        .serve()
        .await
        .unwrap();
    assert!(plugin.wait_for_status(DEADLINE).await.unwrap().plugin_registered);
    // The bodies of the CSINode patches.
    let patches = || -> Vec<serde_json::Value> {
        let seen = seen.lock();
        let bodies = seen.iter().filter_map(|r| r.strip_prefix(CSINODE_UPDATE));
        bodies.map(|body| serde_json::from_str::<Value>(body).unwrap()["spec"].clone()).collect()
    };

    // Three periods with the same count: no update.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(patches(), Vec::<serde_json::Value>::new());
    std::fs::write(&limit, "40").unwrap();
    let changed = tokio::time::Instant::now();
    wait_until("the new count is written", || !patches().is_empty()).await;
    assert!(changed.elapsed() <= Duration::from_secs(10), "within one period");
    assert_eq!(
        patches(),
        [serde_json::json!({"drivers": [{"name": CSI_DRIVER, "nodeID": "node-1-id",
            "allocatable": {"count": 40}}]})]
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(patches().len(), 1, "one update per change");

    plugin.shutdown().await.unwrap();
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    server.abort();
}
