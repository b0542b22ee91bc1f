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
