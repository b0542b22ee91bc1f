//! The requests kpm sends, pinned literally against kube-rs's test double (a
//! mocked `tower` service): verbs, paths, query strings (field manager,
//! field selectors), content types and bodies, and what kpm does with 404,
//! 409, 500 and no answer. The behaviour against a real API server is
//! `cargo xtask kube-e2e`'s.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use kpm_csi::{DriverNodeInfo, NodeInfoSink};
use kpm_dra::SliceCleanup;
use kpm_kube::{KubeConfig, KubePublisher, ObjectKind};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

/// One request kpm must send next, and the answer it gets.
struct Step {
    method: &'static str,
    uri: &'static str,
    /// The JSON body kpm must send, if the step checks it.
    body: Option<Value>,
    status: u16,
    answer: Value,
}

fn step(method: &'static str, uri: &'static str, status: u16, answer: Value) -> Step {
    Step { method, uri, body: None, status, answer }
}

fn with_body(mut step: Step, body: Value) -> Step {
    step.body = Some(body);
    step
}

/// A Kubernetes `Status` answer.
fn failure(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
           "message": format!("{reason} (test)"), "reason": reason, "code": code})
}

fn node(resource_version: &str, annotations: &Value, labels: &Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "node1", "uid": "uid-1", "resourceVersion": resource_version,
        "annotations": annotations, "labels": labels}})
}

/// Answers kpm's requests by `script`, checking each; returns the content
/// types kpm sent. The reconcile loop's watches of the Node and the CSINode
/// (a list, then a watch, by name) are refused: their requests are
/// checked once and left out of the scripts.
async fn serve(
    mut handle: Handle<Request<Body>, Response<Body>>,
    script: Vec<Step>,
) -> Vec<String> {
    let mut content_types = Vec::new();
    for (i, step) in script.into_iter().enumerate() {
        let (request, reply) = loop {
            let (request, reply) = handle.next_request().await.expect("kpm sent fewer requests");
            if !is_watch(&request) {
                break (request, reply);
            }
            let refused = serde_json::to_vec(&failure(403, "Forbidden")).unwrap();
            reply.send_response(Response::builder().status(403).body(Body::from(refused)).unwrap());
        };
        content_types.extend(answer(request, reply, step, i).await);
    }
    content_types
}

/// A request of the watches of the Node and the CSINode named `node1`.
fn is_watch(request: &Request<Body>) -> bool {
    let uri = request.uri().to_string();
    let watched = ["/api/v1/nodes?", "/apis/storage.k8s.io/v1/csinodes?"];
    let is = request.method() == "GET" && watched.iter().any(|prefix| uri.starts_with(prefix));
    if is {
        assert!(uri.contains("fieldSelector=metadata.name%3Dnode1"), "{uri}");
    }
    is
}

/// Answers kpm's `i`th request by `step`, checking it; returns its content type.
async fn answer(
    request: Request<Body>,
    reply: mock::SendResponse<Response<Body>>,
    step: Step,
    i: usize,
) -> Option<String> {
    assert_eq!(request.method().as_str(), step.method, "request {i}");
    assert_eq!(request.uri().to_string(), step.uri, "request {i}");
    let content_type = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|value| value.to_str().unwrap().to_owned());
    let body = request.into_body().collect_bytes().await.unwrap();
    if let Some(expected) = step.body {
        let sent: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(sent, expected, "body of request {i}");
    }
    let answer = serde_json::to_vec(&step.answer).unwrap();
    reply.send_response(Response::builder().status(step.status).body(Body::from(answer)).unwrap());
    content_type
}

fn publisher() -> (KubePublisher, Handle<Request<Body>, Response<Body>>) {
    publisher_with(KubeConfig::default())
}

fn publisher_with(config: KubeConfig) -> (KubePublisher, Handle<Request<Body>, Response<Body>>) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    (KubePublisher::new(client, "node1", config).unwrap(), handle)
}

fn csi_info() -> DriverNodeInfo {
    DriverNodeInfo {
        node_id: "node1-id".into(),
        max_volumes_per_node: 7,
        topology: [("topology.example.com/zone".to_owned(), "z1".to_owned())].into(),
    }
}

const NODE: &str = "/api/v1/nodes/node1";
const NODE_PATCH: &str = "/api/v1/nodes/node1?&fieldManager=kpm";
const CSINODE: &str = "/apis/storage.k8s.io/v1/csinodes/node1";
const IDS: &str = r#"{"csi.example.com":"node1-id"}"#;

#[tokio::test]
async fn a_csi_driver_sets_the_annotation_and_label_then_creates_the_csinode_owned_by_the_node() {
    let (publisher, handle) = publisher();
    let script = vec![
        step("GET", NODE, 200, node("5", &json!({}), &json!({"kubernetes.io/hostname": "node1"}))),
        step("GET", CSINODE, 404, failure(404, "NotFound")),
        with_body(
            step("PATCH", NODE_PATCH, 200, node("6", &json!({}), &json!({}))),
            json!({"metadata": {
                "resourceVersion": "5",
                "annotations": {"csi.volume.kubernetes.io/nodeid": IDS},
                "labels": {"topology.example.com/zone": "z1"}}}),
        ),
        with_body(
            step("POST", "/apis/storage.k8s.io/v1/csinodes?&fieldManager=kpm", 201, json!({})),
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": {"name": "node1", "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": "node1", "uid": "uid-1"}]},
                "spec": {"drivers": [{"name": "csi.example.com", "nodeID": "node1-id",
                    "topologyKeys": ["topology.example.com/zone"], "allocatable": {"count": 7}}]}}),
        ),
    ];
    let server = tokio::spawn(serve(handle, script));
    publisher.node_info().install_driver("csi.example.com", &csi_info()).await.unwrap();
    let content_types = server.await.unwrap();
    assert_eq!(content_types, ["application/merge-patch+json", "application/json"]);
    let status = publisher.status();
    assert!(status.objects.iter().all(|(kind, sync)| {
        sync.last_error.is_none()
            && sync.last_success.is_some() == matches!(kind, ObjectKind::Node | ObjectKind::CsiNode)
    }));
}

#[tokio::test(start_paused = true)]
async fn a_conflict_starts_again_from_a_fresh_read_keeping_the_other_writers_entry() {
    let (publisher, handle) = publisher();
    let other = r#"{"other.example.com":"x"}"#;
    let both = r#"{"csi.example.com":"node1-id","other.example.com":"x"}"#;
    let labels = json!({"topology.example.com/zone": "z1"});
    let csinode = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": "node1", "resourceVersion": "9", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "node1", "uid": "uid-1"}]},
        "spec": {"drivers": [{"name": "csi.example.com", "nodeID": "node1-id",
            "topologyKeys": ["topology.example.com/zone"], "allocatable": {"count": 7}}]}});
    let script = vec![
        step("GET", NODE, 200, node("5", &json!({}), &labels)),
        step("GET", CSINODE, 200, csinode.clone()),
        step("PATCH", NODE_PATCH, 409, failure(409, "Conflict")),
        step(
            "GET",
            NODE,
            200,
            node("7", &json!({"csi.volume.kubernetes.io/nodeid": other}), &labels),
        ),
        // The CSINode entry is up to date: no write.
        step("GET", CSINODE, 200, csinode),
        with_body(
            step("PATCH", NODE_PATCH, 200, json!({})),
            json!({"metadata": {"resourceVersion": "7",
                "annotations": {"csi.volume.kubernetes.io/nodeid": both}}}),
        ),
    ];
    let server = tokio::spawn(serve(handle, script));
    publisher.node_info().install_driver("csi.example.com", &csi_info()).await.unwrap();
    server.await.unwrap();
    let requests: Vec<_> = publisher
        .status()
        .requests
        .iter()
        .map(|r| (r.verb, r.resource, r.outcome.clone(), r.count))
        .collect();
    assert_eq!(
        requests,
        [
            ("get", "csinodes", "success".to_owned(), 2),
            ("get", "nodes", "success".to_owned(), 2),
            ("patch", "nodes", "409".to_owned(), 1),
            ("patch", "nodes", "success".to_owned(), 1),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn after_four_failed_attempts_the_registration_fails_naming_the_step() {
    let (publisher, handle) = publisher();
    let script = (0..4).map(|_| step("GET", NODE, 500, failure(500, "InternalError"))).collect();
    let server = tokio::spawn(serve(handle, script));
    let err =
        publisher.node_info().install_driver("csi.example.com", &csi_info()).await.unwrap_err();
    server.await.unwrap();
    let text = err.to_string();
    assert!(
        text.starts_with(
            r#"error updating Node object with CSI driver node info: get nodes "node1": "#
        ),
        "{text}"
    );
    let (_, node) = &publisher.status().objects[0];
    assert!(node.last_error.is_some() && node.last_success.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_missing_node_is_waited_for_not_created() {
    let (publisher, handle) = publisher();
    let script = (0..4).map(|_| step("GET", NODE, 404, failure(404, "NotFound"))).collect();
    let server = tokio::spawn(serve(handle, script));
    let err =
        publisher.node_info().install_driver("csi.example.com", &csi_info()).await.unwrap_err();
    server.await.unwrap();
    assert_eq!(
        err.to_string(),
        r#"error updating Node object with CSI driver node info: node "node1" not found; kpm waits for it and never creates it"#
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_without_an_answer_times_out() {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let config = KubeConfig::default().request_timeout(Duration::from_secs(3));
    let publisher =
        KubePublisher::new(kube::Client::new(service, "default"), "node1", config).unwrap();
    // Takes every request and never answers.
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(request) = handle.next_request().await {
            held.push(request);
        }
    });
    let err = publisher.node_info().uninstall_driver("csi.example.com").await.unwrap_err();
    assert!(err.to_string().contains(r#"get nodes "node1": no answer within 3s"#), "{err}");
    let requests = publisher.status().requests;
    assert_eq!(requests.len(), 1);
    assert_eq!((requests[0].resource, requests[0].outcome.as_str()), ("nodes", "timeout"));
    assert!(requests[0].count >= 4, "{requests:?}");
    server.abort();
}

#[tokio::test(start_paused = true)]
async fn a_dra_wipe_lists_then_deletes_the_drivers_slices_of_this_node_retrying_until_it_succeeds()
{
    let (publisher, handle) = publisher();
    let uri = "/apis/resource.k8s.io/v1/resourceslices?&fieldSelector=spec.nodeName%3Dnode1%2Cspec.driver%3Da.example.com";
    let list = |items: Value| json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {}, "items": items});
    let slice = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node1-a"}, "spec": {"driver": "a.example.com", "nodeName": "node1"}});
    let script = vec![
        step("GET", uri, 500, failure(500, "InternalError")),
        step("GET", uri, 200, list(json!([slice]))),
        step("DELETE", uri, 503, failure(503, "ServiceUnavailable")),
        step("GET", uri, 200, list(json!([slice]))),
        step("DELETE", uri, 200, list(json!([]))),
    ];
    let server = tokio::spawn(serve(handle, script));
    publisher.slice_cleanup().wipe_driver("a.example.com").await;
    server.await.unwrap();
    let (_, slices) = &publisher.status().objects[3];
    assert!(slices.last_success.is_some());
}

#[tokio::test]
async fn the_drivers_with_slices_of_this_node_are_listed_once() {
    let (publisher, handle) = publisher();
    let slice = |driver: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{driver}-x")}, "spec": {"driver": driver, "nodeName": "node1"}})
    };
    let script = vec![step(
        "GET",
        "/apis/resource.k8s.io/v1/resourceslices?&fieldSelector=spec.nodeName%3Dnode1",
        200,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {},
            "items": [slice("b.example.com"), slice("a.example.com"), slice("b.example.com")]}),
    )];
    let server = tokio::spawn(serve(handle, script));
    assert_eq!(
        publisher.slice_cleanup().published_drivers().await,
        ["a.example.com", "b.example.com"]
    );
    server.await.unwrap();
}

#[tokio::test]
async fn a_refreshed_count_rewrites_the_drivers_csinode_entry_alone() {
    let (publisher, handle) = publisher();
    let labels = json!({"topology.example.com/zone": "z1"});
    let entry = |count: Value| {
        json!({"name": "csi.example.com", "nodeID": "node1-id",
            "topologyKeys": ["topology.example.com/zone"], "allocatable": count})
    };
    let csinode = |count: Value| {
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": "node1", "resourceVersion": "9", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "node1", "uid": "uid-1"}]},
            "spec": {"drivers": [{"name": "other.example.com", "nodeID": "x"}, entry(count)]}})
    };
    let script = vec![
        step(
            "GET",
            NODE,
            200,
            node("5", &json!({"csi.volume.kubernetes.io/nodeid": IDS}), &labels),
        ),
        step("GET", CSINODE, 200, csinode(json!({"count": 7}))),
        with_body(
            step("PUT", "/apis/storage.k8s.io/v1/csinodes/node1?&fieldManager=kpm", 200, json!({})),
            csinode(json!({"count": 9})),
        ),
    ];
    let server = tokio::spawn(serve(handle, script));
    let nine = DriverNodeInfo { max_volumes_per_node: 9, ..csi_info() };
    publisher.node_info().update_allocatable("csi.example.com", &nine).await.unwrap();
    let content_types = server.await.unwrap();
    assert_eq!(content_types, ["application/json"]);
}

/// The CSINode an earlier run left: kpm's entry of `csi.example.com`.
fn leftover_csinode() -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": "node1", "resourceVersion": "9", "managedFields": [
            {"manager": "kpm", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1":
                {"f:spec": {"f:drivers": {r#"k:{"name":"csi.example.com"}"#: {".": {}}}}}}]},
        "spec": {"drivers": [{"name": "csi.example.com", "nodeID": "node1-id"}]}})
}

#[tokio::test(start_paused = true)]
async fn an_earlier_runs_csi_driver_is_read_retrying_and_withdrawn_after_the_grace() {
    let (publisher, handle) = publisher();
    let grace = KubeConfig::default().csi_cleanup_grace;
    let ids = json!({"csi.volume.kubernetes.io/nodeid": IDS});
    let script = vec![
        step("GET", CSINODE, 500, failure(500, "InternalError")),
        step("GET", CSINODE, 200, leftover_csinode()),
        step("GET", NODE, 200, node("5", &ids, &json!({}))),
        // After the grace: the deregistration's passes, the CSINode entry
        // first, then the annotation entry.
        step("GET", NODE, 200, node("5", &ids, &json!({}))),
        step("GET", CSINODE, 200, leftover_csinode()),
        with_body(
            step("PUT", "/apis/storage.k8s.io/v1/csinodes/node1?&fieldManager=kpm", 200, json!({})),
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": leftover_csinode()["metadata"], "spec": {"drivers": []}}),
        ),
        step("GET", NODE, 200, node("6", &ids, &json!({}))),
        step(
            "GET",
            CSINODE,
            200,
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": "node1", "resourceVersion": "10"}, "spec": {"drivers": []}}),
        ),
        with_body(
            step("PATCH", NODE_PATCH, 200, json!({})),
            json!({"metadata": {"resourceVersion": "6",
                "annotations": {"csi.volume.kubernetes.io/nodeid": null}}}),
        ),
    ];
    let server = tokio::spawn(serve(handle, script));
    let start = tokio::time::Instant::now();
    publisher.clean_up_csi_leftovers(Arc::default()).await;
    assert!(start.elapsed() >= grace, "withdrawn after {:?}", start.elapsed());
    server.await.unwrap();
    // The failure shows, and the success after it.
    let leftovers = publisher.status().objects[5].1.clone();
    let (success, error) = (leftovers.last_success.unwrap(), leftovers.last_error.unwrap());
    assert!(error.at <= success && error.message.contains("500"), "{error:?}");
}

#[tokio::test(start_paused = true)]
async fn without_the_permission_to_read_the_clean_up_is_skipped_and_shown() {
    let (publisher, handle) = publisher();
    let script = vec![step("GET", CSINODE, 403, failure(403, "Forbidden"))];
    let server = tokio::spawn(serve(handle, script));
    // Returns at once (on paused time): nothing is retried, nothing written.
    tokio::time::timeout(Duration::from_secs(1), publisher.clean_up_csi_leftovers(Arc::default()))
        .await
        .expect("a refusal is not retried");
    server.await.unwrap();
    let (kind, leftovers) = publisher.status().objects[5].clone();
    assert_eq!(kind, ObjectKind::Leftovers);
    let error = leftovers.last_error.expect("the refusal shows").message;
    assert!(error.starts_with(r#"get csinodes "node1": "#), "{error}");
}
