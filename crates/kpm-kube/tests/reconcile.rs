//! The reconcile loop against the stand-in API server with watches, on
//! paused time: outages, a flapping API server, another writer, and no
//! write while nothing differs. The real kube-apiserver is `cargo xtask
//! kube-e2e`'s (`outage`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use kpm_csi::{DriverNodeInfo, NodeInfoSink};
use kpm_dra::SliceCleanup;
use kpm_kube::ObjectKind;
use serde_json::json;
use support::{eventually, publisher};

const ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

fn info(node_id: &str) -> DriverNodeInfo {
    DriverNodeInfo {
        node_id: node_id.into(),
        max_volumes_per_node: 7,
        topology: [("topology.example.com/zone".to_owned(), "z1".to_owned())].into(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_driver_that_leaves_during_an_outage_is_withdrawn_once_the_api_server_is_back() {
    let (publisher, state) = publisher();
    let sink = publisher.node_info();
    sink.install_driver("a.example.com", &info("a-1")).await.unwrap();
    sink.install_driver("b.example.com", &info("b-1")).await.unwrap();
    assert_eq!(state.lock().csinode_drivers(), ["a.example.com", "b.example.com"]);
    let csinode = state.lock().csinode.clone().unwrap();
    assert_eq!(
        csinode["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": "node1", "uid": "uid-1"}])
    );
    assert!(publisher.status().pending.is_empty());

    state.lock().go_down();
    // The kubelet's four attempts fail: the deregistration says so, and
    // kpm keeps at it.
    let err = sink.uninstall_driver("a.example.com").await.unwrap_err();
    assert!(
        err.to_string().starts_with("error removing CSI driver node info from Node object"),
        "{err}"
    );
    let pending = publisher.status().pending;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!((pending[0].kind, pending[0].name.as_str()), (ObjectKind::Node, "a.example.com"));
    assert!(pending[0].last_error.as_deref().unwrap().contains("down"), "{pending:?}");
    tokio::time::sleep(Duration::from_secs(60)).await;

    state.lock().down = false;
    let back = tokio::time::Instant::now();
    eventually(&state, "a.example.com withdrawn", |state| {
        state.csinode_drivers() == ["b.example.com"]
            && state.annotation(ANNOTATION).as_deref() == Some(r#"{"b.example.com":"b-1"}"#)
    })
    .await;
    // The loop retries every 5 s at most.
    assert!(back.elapsed() <= Duration::from_secs(6), "{:?}", back.elapsed());
    eventually(&state, "nothing pending", |_| publisher.status().pending.is_empty()).await;
    // Labels stay, as the kubelet leaves them.
    let node = state.lock().node.clone().unwrap();
    assert_eq!(node["metadata"]["labels"]["topology.example.com/zone"], "z1");
}

#[tokio::test(start_paused = true)]
async fn nothing_is_written_while_nothing_differs() {
    let (publisher, state) = publisher();
    publisher.node_info().install_driver("a.example.com", &info("a-1")).await.unwrap();
    let writes = state.lock().writes();
    // Another writer's changes to what kpm does not publish wake the loop,
    // which reads and finds nothing to do.
    for i in 0..10 {
        state.lock().change_node(|node| node["metadata"]["labels"]["other"] = json!(i.to_string()));
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
    assert_eq!(state.lock().writes(), writes, "{:?}", state.lock().requests);
    let reads =
        state.lock().requests.iter().filter(|r| r.starts_with("GET /api/v1/nodes/node1")).count();
    assert!(reads >= 10, "each change read: {reads}");
}

#[tokio::test(start_paused = true)]
async fn another_writers_removal_of_kpms_entry_is_undone_and_its_own_entries_kept() {
    let (publisher, state) = publisher();
    publisher.node_info().install_driver("a.example.com", &info("a-1")).await.unwrap();
    state.lock().change_csinode(|csinode| {
        csinode["spec"]["drivers"] = json!([{"name": "other.example.com", "nodeID": "o-1"}]);
    });
    state.lock().change_node(|node| {
        node["metadata"]["annotations"][ANNOTATION] = json!(r#"{"other.example.com":"o-1"}"#);
    });
    eventually(&state, "kpm's entries back beside the other writer's", |state| {
        state.csinode_drivers() == ["other.example.com", "a.example.com"]
            && state.annotation(ANNOTATION).as_deref()
                == Some(r#"{"a.example.com":"a-1","other.example.com":"o-1"}"#)
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn drivers_coming_and_going_on_a_flapping_api_server_end_as_registered() {
    let (publisher, state) = publisher();
    let sink = publisher.node_info();
    let flapping = {
        let state = state.clone();
        tokio::spawn(async move {
            for i in 0..40 {
                if i % 2 == 0 {
                    state.lock().go_down();
                } else {
                    state.lock().down = false;
                }
                tokio::time::sleep(Duration::from_millis(170)).await;
            }
            state.lock().down = false;
        })
    };
    for round in 0..5 {
        for driver in ["a.example.com", "b.example.com", "c.example.com"] {
            let _maybe = sink.install_driver(driver, &info(&format!("{driver}-{round}"))).await;
        }
        for driver in ["a.example.com", "c.example.com"] {
            let _maybe = sink.uninstall_driver(driver).await;
        }
    }
    flapping.await.unwrap();
    eventually(&state, "only b.example.com, with its last node id", |state| {
        state.csinode_drivers() == ["b.example.com"]
            && state.annotation(ANNOTATION).as_deref()
                == Some(r#"{"b.example.com":"b.example.com-4"}"#)
    })
    .await;
    eventually(&state, "nothing pending", |_| publisher.status().pending.is_empty()).await;
}

#[tokio::test(start_paused = true)]
async fn a_topology_collision_fails_the_registration_at_once_and_is_not_retried() {
    let (publisher, state) = publisher();
    state.lock().change_node(|node| {
        node["metadata"]["labels"]["topology.example.com/zone"] = json!("z2");
    });
    let err =
        publisher.node_info().install_driver("a.example.com", &info("a-1")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"error updating Node object with CSI driver node info: detected topology value collision: driver reported "topology.example.com/zone":"z1" but existing label is "topology.example.com/zone":"z2""#
    );
    let requests = state.lock().requests.len();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(state.lock().requests.len(), requests, "a refusal waits for a change");
    assert_eq!(state.lock().writes(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_registration_during_an_outage_fails_after_the_kubelets_four_attempts() {
    let (publisher, state) = publisher();
    state.lock().go_down();
    let start = tokio::time::Instant::now();
    let err =
        publisher.node_info().install_driver("a.example.com", &info("a-1")).await.unwrap_err();
    assert!(
        err.to_string().starts_with("error updating Node object with CSI driver node info: "),
        "{err}"
    );
    // 10 + 50 + 250 ms, each stretched by at most a tenth.
    assert!(start.elapsed() <= Duration::from_millis(350), "{:?}", start.elapsed());
}

fn slice(driver: &str, node: &str) -> serde_json::Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{driver}")},
        "spec": {"driver": driver, "nodeName": node}})
}

#[tokio::test(start_paused = true)]
async fn a_wipe_in_an_outage_deletes_the_drivers_slices_of_this_node_once_back() {
    let (publisher, state) = publisher();
    state.lock().slices = vec![
        slice("a.example.com", "node1"),
        slice("a.example.com", "node2"),
        slice("b.example.com", "node1"),
    ];
    let cleanup = publisher.slice_cleanup();
    assert_eq!(cleanup.published_drivers().await, ["a.example.com", "b.example.com"]);
    state.lock().go_down();
    let wipe = tokio::spawn(async move { cleanup.wipe_driver("a.example.com").await });
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!wipe.is_finished());
    state.lock().down = false;
    wipe.await.unwrap();
    let left: Vec<String> = state
        .lock()
        .slices
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left, ["node2-a.example.com", "node1-b.example.com"]);
    let deletes = state.lock().requests.iter().filter(|r| r.starts_with("DELETE ")).count();
    assert_eq!(deletes, 1);
}

#[tokio::test(start_paused = true)]
async fn a_wipe_called_off_leaves_the_slices() {
    let (publisher, state) = publisher();
    state.lock().slices = vec![slice("a.example.com", "node1")];
    state.lock().go_down();
    let cleanup = publisher.slice_cleanup();
    let wipe = tokio::spawn(async move { cleanup.wipe_driver("a.example.com").await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(publisher.status().pending.len(), 1);
    // The driver connected again: the DRA manager drops the wipe.
    wipe.abort();
    let _aborted = wipe.await;
    state.lock().down = false;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(state.lock().slices.len(), 1);
    assert_eq!(state.lock().writes(), 0);
}
