//! `kpm::Kubelet` publishing through the Kubernetes API, against kube-rs's
//! test double (a mocked `tower` service) on paused time: a kind that is
//! disabled leaves what its plugins published alone, since none of them
//! can register again.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use kpm::kube::{KubeConfig, KubePublisher};
use kpm::{Kubelet, PluginKind};
use kpm_test_support::{DEADLINE, wait_until};
use kube::client::Body;
use parking_lot::Mutex;
use tower_test::mock::{self, Handle};

/// The DRA cleanup grace period of these tests.
const GRACE: Duration = Duration::from_secs(30);

/// The node's leftovers: a ResourceSlice of `gpu.example.com`, which is not
/// registered.
const SLICES: &str = r#"{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
    "metadata": {"resourceVersion": "1"}, "items": [{"apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice", "metadata": {"name": "node1-gpu"},
    "spec": {"driver": "gpu.example.com", "nodeName": "node1"}}]}"#;

const LIST_SLICES: &str =
    "GET /apis/resource.k8s.io/v1/resourceslices?&fieldSelector=spec.nodeName%3Dnode1";
const WIPE_GPU: &str = "DELETE /apis/resource.k8s.io/v1/resourceslices?&fieldSelector=spec.nodeName%3Dnode1%2Cspec.driver%3Dgpu.example.com";

/// An API server with the node's leftovers: the ResourceSlice list is
/// [`SLICES`], a delete succeeds, anything else is not found. Records every
/// request as `METHOD uri`.
async fn api_server(
    mut handle: Handle<Request<Body>, Response<Body>>,
    seen: Arc<Mutex<Vec<String>>>,
) {
    while let Some((request, reply)) = handle.next_request().await {
        let request = format!("{} {}", request.method(), request.uri());
        let (status, body) = if request == LIST_SLICES {
            (200, SLICES)
        } else if request.starts_with("DELETE ") {
            (200, r#"{"kind": "Status", "apiVersion": "v1", "status": "Success"}"#)
        } else {
            (
                404,
                r#"{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}"#,
            )
        };
        seen.lock().push(request);
        reply.send_response(
            Response::builder().status(status).body(Body::from(body.as_bytes().to_vec())).unwrap(),
        );
    }
}

/// Runs a kubelet publishing to [`api_server`], with the `disabled` kinds,
/// for four DRA grace periods; returns the requests it sent.
async fn requests_of_a_kubelet_without(disabled: &[PluginKind]) -> Vec<String> {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let server = tokio::spawn(api_server(handle, Arc::clone(&seen)));
    let client = kube::Client::new(service, "default");
    let publisher = KubePublisher::new(client, "node1", KubeConfig::default()).unwrap();
    let root = tempfile::tempdir().unwrap();
    let kubelet = disabled
        .iter()
        .fold(Kubelet::builder(), |builder, kind| builder.disable(*kind))
        .root_dir(root.path())
        .liveness(None)
        .dra_config(kpm::dra::DraConfig::default().cleanup_grace(GRACE))
        .kubernetes(publisher)
        .build()
        .unwrap();
    // On paused time, every timer due within four grace periods fires,
    // and what it sends is answered, before the kubelet is stopped.
    kubelet.run(tokio::time::sleep(GRACE * 4)).await.unwrap();
    server.abort();
    seen.lock().clone()
}

#[tokio::test(start_paused = true)]
async fn with_dra_enabled_a_leftover_drivers_slices_are_deleted_after_the_grace_period() {
    let requests = requests_of_a_kubelet_without(&[]).await;
    assert!(requests.iter().any(|r| r == LIST_SLICES), "{requests:#?}");
    assert!(requests.iter().any(|r| r == WIPE_GPU), "{requests:#?}");
}

/// The kubelet's own check is for DRA: a disabled device manager has no
/// resources to publish anyway, so the capacity half guards `disable` itself.
#[tokio::test(start_paused = true)]
async fn disabled_kinds_leave_leftover_slices_and_capacity_alone() {
    let requests = requests_of_a_kubelet_without(&[PluginKind::Dra, PluginKind::Device]).await;
    let touched: Vec<_> =
        requests.iter().filter(|r| r.contains("resourceslices") || r.contains("/status")).collect();
    assert!(touched.is_empty(), "{touched:#?}");
}

const CSI_DRIVER: &str = "csi.example.com";
const CSINODE_PATCH: &str = "PATCH /apis/storage.k8s.io/v1/csinodes/node1?&fieldManager=kpm";

/// An API server for one CSI driver: its CSIDriver sets
/// `nodeAllocatableUpdatePeriodSeconds: 10` (the watch that follows the
/// list never answers), the Node exists, the CSINode is created; every
/// other read finds nothing. Records every request as `METHOD uri`, with
/// the body of each CSINode patch.
async fn csi_api_server(
    mut handle: Handle<Request<Body>, Response<Body>>,
    seen: Arc<Mutex<Vec<String>>>,
) {
    let node = r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1",
        "uid": "uid-1", "resourceVersion": "5"}}"#;
    let csidrivers = r#"{"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriverList",
        "metadata": {"resourceVersion": "7"}, "items": [{"apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver", "metadata": {"name": "csi.example.com", "resourceVersion": "7"},
        "spec": {"nodeAllocatableUpdatePeriodSeconds": 10}}]}"#;
    let not_found = r#"{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}"#;
    let mut watches = Vec::new();
    while let Some((request, reply)) = handle.next_request().await {
        let (method, uri) = (request.method().to_string(), request.uri().to_string());
        let body = request.into_body().collect_bytes().await.unwrap();
        let mut line = format!("{method} {uri}");
        if line.starts_with(CSINODE_PATCH) {
            line = format!("{line} {}", String::from_utf8_lossy(&body));
        }
        seen.lock().push(line);
        if uri.contains("watch=true") {
            watches.push(reply);
            continue;
        }
        let (status, answer) = match (method.as_str(), uri.split('?').next().unwrap_or_default()) {
            (_, "/api/v1/nodes/node1") => (200, node.to_owned()),
            ("GET", "/apis/storage.k8s.io/v1/csidrivers") => (200, csidrivers.to_owned()),
            ("POST", "/apis/storage.k8s.io/v1/csinodes") => {
                (201, String::from_utf8_lossy(&body).into_owned())
            }
            ("PATCH", "/apis/storage.k8s.io/v1/csinodes/node1") => (200, "{}".to_owned()),
            _ => (404, not_found.to_owned()),
        };
        reply.send_response(
            Response::builder().status(status).body(Body::from(answer.into_bytes())).unwrap(),
        );
    }
}

/// KEP-4876 through the facade: the CSIDriver's period has the driver's
/// count refreshed, and a changed count is one patch of its CSINode entry.
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
        .liveness(None)
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
        let bodies = seen.iter().filter_map(|r| r.strip_prefix(CSINODE_PATCH));
        bodies.map(|body| serde_json::from_str(body).unwrap()).collect()
    };

    // Three periods with the same count: no patch.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(patches(), Vec::<serde_json::Value>::new());
    std::fs::write(&limit, "40").unwrap();
    let changed = tokio::time::Instant::now();
    wait_until("the new count is patched", || !patches().is_empty()).await;
    assert!(changed.elapsed() <= Duration::from_secs(10), "within one period");
    assert_eq!(
        patches(),
        [
            serde_json::json!({"spec": {"drivers": [{"name": CSI_DRIVER, "allocatable": {"count": 40}}]}})
        ]
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(patches().len(), 1, "one patch per change");

    plugin.shutdown().await.unwrap();
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    server.abort();
}
