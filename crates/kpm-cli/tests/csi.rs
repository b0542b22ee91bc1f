//! CSI end to end, the way node-driver-registrar does it: a CSI driver serves
//! `csi.v1` Identity and Node on its own socket, a registration socket
//! (kpm-registrar) points at it, and `kpm run` registers the driver and
//! publishes its node information on the status API.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;

use kpm_registrar::Registrar;
use kpm_test_support::DEADLINE;
use kpm_test_support::csi::{FakeCsiDriver, Reply, Served, info, serve};
use serde_json::json;
use support::Kpm;
use tonic::Status;

const DRIVER: &str = "csi.example.com";
const ZONE_KEY: &str = "topology.csi.example.com/zone";

/// What the driver's NodeGetInfo answers once it works: `max_volumes`.
fn node_info(max_volumes: i64) -> Reply {
    info("node-1", max_volumes, &[(ZONE_KEY, "zone-a")])
}

/// Serves a CSI driver whose NodeGetInfo fails its first `failures` calls,
/// then reports 16 volumes.
async fn serve_driver(socket: &Path, failures: usize) -> Served {
    let script = vec![Reply::Fail(Status::unavailable("topology not ready yet")); failures];
    serve(socket, FakeCsiDriver::new(DRIVER, script, node_info(16))).await
}

/// Registers the driver the way node-driver-registrar does.
async fn register(registry: &Path, driver_socket: &Path, uid: &str) -> Registrar {
    Registrar::builder(kpm_registrar::CSI_PLUGIN, DRIVER)
        .versions(["1.0.0"])
        .endpoint(driver_socket)
        .rolling_update_uid(uid)
        .socket_dir(registry)
        .serve()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csi_driver_registers_publishes_node_info_and_cleans_up() {
    let root = tempfile::tempdir().unwrap();
    let kpm = Kpm::start(root.path());
    let driver_dir = root.path().join("plugins").join(DRIVER);
    std::fs::create_dir_all(&driver_dir).unwrap();
    let driver_socket = driver_dir.join("csi.sock");
    let driver = serve_driver(&driver_socket, 0).await;
    let registry = root.path().join("plugins_registry");

    let plugin = register(&registry, &driver_socket, "a").await;
    let status = plugin.wait_for_status(DEADLINE).await.unwrap();
    assert!(status.plugin_registered, "{status:?}");

    let list = kpm.wait_for("the driver is listed", |l| l["csi_drivers"][0]["name"] == DRIVER);
    assert_eq!(
        list["csi_drivers"],
        json!([{
            "name": DRIVER,
            "endpoint": driver_socket.display().to_string(),
            "version": "1.0.0",
            "node_id": "node-1",
            "topology": { ZONE_KEY: "zone-a" },
            "max_volumes": 16,
            "allocatable_update_period_s": null,
            "allocatable_refreshed_at": null,
        }])
    );
    assert_eq!(
        list["node"],
        json!({
            "annotations": { "csi.volume.kubernetes.io/nodeid": "{\"csi.example.com\":\"node-1\"}" },
            "labels": { ZONE_KEY: "zone-a" },
            "csinode": { "drivers": [{
                "name": DRIVER,
                "nodeID": "node-1",
                "topologyKeys": [ZONE_KEY],
                "allocatable": { "count": 16 },
            }]},
        })
    );

    // A second instance with the same version is rejected with the kubelet's reason.
    let same = register(&registry, &driver_socket, "b").await;
    let rejected = same.wait_for_status(DEADLINE).await.unwrap();
    assert!(!rejected.plugin_registered);
    assert!(
        rejected.error.contains("Another driver with the same name is already registered"),
        "{}",
        rejected.error
    );
    same.shutdown().await.unwrap();

    // The registration socket goes: the driver and its node entries go, labels stay.
    plugin.shutdown().await.unwrap();
    let list = kpm.wait_for("the driver is gone", |l| {
        l["csi_drivers"].as_array().is_some_and(Vec::is_empty)
            && l["node"]["csinode"]["drivers"].as_array().is_some_and(Vec::is_empty)
    });
    assert_eq!(list["node"]["annotations"], json!({}));
    assert_eq!(list["node"]["labels"], json!({ ZONE_KEY: "zone-a" }));
    drop(driver);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_node_get_info_is_reported_then_retried() {
    let root = tempfile::tempdir().unwrap();
    let kpm = Kpm::start(root.path());
    let driver_socket = root.path().join("csi.sock");
    let driver = serve_driver(&driver_socket, 1).await;

    let plugin = register(&root.path().join("plugins_registry"), &driver_socket, "a").await;
    let first = plugin.wait_for_status(DEADLINE).await.unwrap();
    assert!(!first.plugin_registered);
    assert!(first.error.contains("topology not ready yet"), "{}", first.error);

    // The executor retries after its backoff, and NodeGetInfo now answers.
    let mut statuses = plugin.status();
    let registered = tokio::time::timeout(
        DEADLINE,
        statuses.wait_for(|s| s.as_ref().is_some_and(|s| s.plugin_registered)),
    )
    .await;
    assert!(registered.is_ok(), "statuses: {:?}", plugin.statuses());
    kpm.wait_for("the driver is listed with its node id", |l| {
        l["csi_drivers"][0]["node_id"] == "node-1"
    });
    plugin.shutdown().await.unwrap();
    drop(driver);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_update_period_the_allocatable_count_follows_the_driver() {
    let root = tempfile::tempdir().unwrap();
    // 3 s is raised to the API's minimum of 10 s.
    let kpm =
        Kpm::start_with(root.path(), &["--csi-allocatable-update-period", "csi.example.com=3"]);
    let driver_socket = root.path().join("csi.sock");
    let server = serve_driver(&driver_socket, 0).await;
    let plugin = register(&root.path().join("plugins_registry"), &driver_socket, "a").await;
    assert!(plugin.wait_for_status(DEADLINE).await.unwrap().plugin_registered);
    let list = kpm.wait_for("the driver is listed", |l| l["csi_drivers"][0]["max_volumes"] == 16);
    assert_eq!(list["csi_drivers"][0]["allocatable_update_period_s"], 10);

    server.driver.set_fallback(node_info(40));
    let list = kpm.wait_for("the new count is published", |l| {
        l["node"]["csinode"]["drivers"][0]["allocatable"]["count"] == 40
    });
    assert_eq!(list["csi_drivers"][0]["max_volumes"], 40);
    assert!(list["csi_drivers"][0]["allocatable_refreshed_at"].is_string(), "{list}");
    let table = support::kpm(&["list", "--root-dir", root.path().to_str().unwrap()]);
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.contains("every 10s, "), "{table}");
    plugin.shutdown().await.unwrap();
    drop(server);
}
