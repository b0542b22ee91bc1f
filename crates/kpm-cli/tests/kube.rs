//! `kpm run --kubeconfig` against a stand-in API server that answers 404 to
//! everything, as one does before the node's Node exists: the status API,
//! `kpm list` and the metrics tell the operator that kpm waits for the Node,
//! and what it will publish there once it exists.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use kpm_registrar::{DEVICE_PLUGIN, Registrar};
use kpm_test_support::api_server::{self, State, kubeconfig};
use kpm_test_support::{DEADLINE, prometheus};
use parking_lot::Mutex;
use serde_json::Value;
use support::{Kpm, kpm, wait_until};

const NODE_MISSING: &str = "node \"node1\" not found; kpm waits for it and never creates it";

/// The object entry of `kind` in the status API's `kubernetes`.
fn object<'a>(kubernetes: &'a Value, kind: &str) -> &'a Value {
    kubernetes["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|object| object["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {kubernetes}"))
}

#[test]
fn a_missing_node_shows_in_the_status_api_list_and_metrics() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    // An API server without any object: every request is answered 404
    // with a `Status`, and recorded.
    let state = Arc::new(Mutex::new(State { fail: Some(404), ..State::default() }));
    let server = api_server::serve(&rt, 0, Arc::clone(&state));
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("kubeconfig");
    std::fs::write(&config, kubeconfig(&format!("http://{server}"))).unwrap();
    let metrics = kpm_test_support::free_local_addr();
    let kpm_run = Kpm::start_with(
        root.path(),
        &[
            "--kubeconfig",
            config.to_str().unwrap(),
            "--node-name",
            "node1",
            "--metrics-addr",
            &metrics,
        ],
    );

    // A device plugin registers: its capacity goes to the Node's status,
    // which does not exist.
    let plugin = Registrar::builder(DEVICE_PLUGIN, "vendor.com/gpu")
        .socket_dir(kpm_run.registry())
        .routes(support::device_plugin(&[("dev-0", "Healthy")]));
    let plugin = rt.block_on(plugin.serve()).unwrap();
    assert!(rt.block_on(plugin.wait_for_status(DEADLINE)).unwrap().plugin_registered);

    let list = kpm_run.wait_for("the Node status sync fails on the missing Node", |list| {
        object(&list["kubernetes"], "Node status")["last_error"]["message"] == NODE_MISSING
    });
    let kubernetes = &list["kubernetes"];
    assert_eq!(kubernetes["node"], "node1");
    let kinds: Vec<&str> = kubernetes["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|object| object["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["Node", "CSINode", "Node status", "ResourceSlice", "CSIDriver", "Leftovers"]
    );
    let status = object(kubernetes, "Node status");
    assert!(status["last_success"].is_null(), "{status}");
    assert!(status["last_error"]["at"].as_str().unwrap().ends_with('Z'), "{status}");
    let reads = kubernetes["requests"].as_array().unwrap().iter().find(|request| {
        request["verb"] == "get" && request["resource"] == "nodes" && request["outcome"] == "404"
    });
    assert!(reads.is_some_and(|p| p["count"].as_u64().unwrap() >= 1), "{kubernetes}");
    // The device capacity is pending, since the plugin registered.
    let pending = kubernetes["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{kubernetes}");
    assert_eq!(pending[0]["kind"], "Node status");
    assert_eq!(pending[0]["name"], "vendor.com/gpu");
    assert_eq!(pending[0]["want"], "capacity 1, allocatable 1");
    assert_eq!(pending[0]["last_error"], NODE_MISSING);
    assert!(pending[0]["since"].as_str().unwrap().ends_with('Z'), "{kubernetes}");
    // A missing Node is read, never written.
    let requests = state.lock().requests.clone();
    assert!(requests.iter().any(|r| r.starts_with("GET /api/v1/nodes/node1")), "{requests:?}");
    assert!(!requests.iter().any(|r| r.starts_with("PATCH ")), "{requests:?}");

    // `kpm list` tells the operator.
    let out = kpm(&["list", "--root-dir", root.path().to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("\nKubernetes (node node1)\n"), "{table}");
    let row = table.lines().find(|line| line.starts_with("Node status")).unwrap();
    assert!(row.contains("never") && row.contains(NODE_MISSING), "{table}");
    let pending =
        table.lines().find(|line| line.starts_with("Node status  vendor.com/gpu")).unwrap();
    assert!(
        pending.contains("capacity 1, allocatable 1") && pending.contains(NODE_MISSING),
        "{table}"
    );
    assert!(table.lines().any(|line| line.starts_with("API requests: ")), "{table}");

    // So do the metrics: failed requests are counted by their status code.
    let series = "kpm_kube_requests_total{verb=\"get\",resource=\"nodes\",outcome=\"404\"}";
    wait_until("the failed reads are counted", || {
        let samples = prometheus::scrape(&metrics);
        samples.get(series).is_some_and(|count| *count >= 1.0)
    });
    let samples = prometheus::scrape(&metrics);
    assert_eq!(samples.get("kpm_kube_pending_publications{kind=\"Node status\"}"), Some(&1.0));
    assert!(samples.contains_key("kpm_kube_oldest_pending_publication_timestamp_seconds"));
    // Nothing written yet: no timestamp but the CSIDrivers' list, a read.
    let samples = prometheus::scrape(&metrics);
    let synced = |s: &&String| s.starts_with("kpm_kube_last_sync_timestamp_seconds");
    assert!(samples.keys().filter(synced).all(|s| s.contains("CSIDriver")), "{samples:?}");
    rt.block_on(plugin.shutdown()).unwrap();
}
