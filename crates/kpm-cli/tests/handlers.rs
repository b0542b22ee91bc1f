//! Device plugins and DRA drivers end to end through `kpm run`: device
//! plugins registering both ways (plugin watcher and `kubelet.sock`), and a
//! DRA driver whose connection is monitored.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use kpm_api::deviceplugin::v1beta1::RegisterRequest;
use kpm_api::deviceplugin::v1beta1::registration_client::RegistrationClient;
use kpm_registrar::Registrar;
use kpm_registrar::stub::StubDraDriver;
use kpm_test_support::DEADLINE;
use serde_json::{Value, json};
use support::Kpm;

fn resource<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list["device_resources"].as_array()?.iter().find(|r| r["resource"] == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugins_register_through_the_watcher_and_through_kubelet_sock() {
    let root = tempfile::tempdir().unwrap();
    let kpm = Kpm::start(root.path());
    let kubelet_sock = kpm.kubelet_sock();

    // The plugin-watcher way: a registration socket of type DevicePlugin that
    // also serves the DevicePlugin service.
    let gpu = Registrar::builder(kpm::api::DEVICE_PLUGIN, "vendor.com/gpu")
        .routes(support::device_plugin(&[("gpu-0", "Healthy"), ("gpu-1", "Unhealthy")]))
        .socket_dir(kpm.registry())
        .serve()
        .await
        .unwrap();
    assert!(gpu.wait_for_status(DEADLINE).await.unwrap().plugin_registered);

    // The kubelet.sock way: serve in the device-plugins directory, then Register.
    let nic_socket = root.path().join("device-plugins").join("nic.sock");
    let nic = support::serve(&nic_socket, support::device_plugin(&[("nic-0", "Healthy")]));
    let channel = kpm::transport::Dialer::new(kpm::transport::fd::budget().clone(), DEADLINE)
        .grpc(&kubelet_sock)
        .await
        .unwrap()
        .channel;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "nic.sock".into(),
            resource_name: "vendor.com/nic".into(),
            options: None,
        })
        .await
        .unwrap();

    let list = kpm.wait_for("both resources list their devices", |list| {
        resource(list, "vendor.com/gpu")
            .is_some_and(|r| r["devices"].as_array().unwrap().len() == 2)
            && resource(list, "vendor.com/nic").is_some_and(|r| r["healthy"] == 1)
    });
    assert_eq!(
        resource(&list, "vendor.com/gpu").unwrap(),
        &json!({
            "resource": "vendor.com/gpu",
            "endpoint": gpu.socket_path().display().to_string(),
            "healthy": 1,
            "unhealthy": 1,
            "devices": [{"id": "gpu-0", "health": "Healthy"}, {"id": "gpu-1", "health": "Unhealthy"}],
        })
    );
    assert_eq!(
        resource(&list, "vendor.com/nic").unwrap()["endpoint"],
        nic_socket.display().to_string()
    );

    // An endpoint that escapes the directory is refused with a reason.
    let channel = kpm::transport::Dialer::new(kpm::transport::fd::budget().clone(), DEADLINE)
        .grpc(&kubelet_sock)
        .await
        .unwrap()
        .channel;
    let escape = RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "../escape.sock".into(),
            resource_name: "vendor.com/escape".into(),
            options: None,
        })
        .await
        .unwrap_err();
    assert!(escape.message().contains("invalid endpoint"), "{escape:?}");

    // The plugin goes: its devices turn unhealthy at once (removed after the grace period).
    nic.stop();
    kpm.wait_for("the nic devices are unhealthy", |list| {
        resource(list, "vendor.com/nic").is_some_and(|r| r["healthy"] == 0 && r["unhealthy"] == 1)
    });
    gpu.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_driver_registers_and_its_connection_is_watched() {
    let root = tempfile::tempdir().unwrap();
    let kpm = Kpm::start(root.path());
    let data_dir = root.path().join("plugins").join("gpu.example.com");
    std::fs::create_dir_all(&data_dir).unwrap();
    let service = data_dir.join("dra.sock");
    let driver = support::serve(&service, StubDraDriver::new().routes());

    // As the Go kubelet plugin helper does: <driver>-<uid>-reg.sock, service names as versions.
    let plugin = Registrar::builder(kpm::api::DRA_PLUGIN, "gpu.example.com")
        .versions(["v1.DRAPlugin", "v1beta1.DRAPlugin"])
        .endpoint(&service)
        .rolling_update_uid("pod-1")
        .socket_dir(kpm.registry())
        .serve()
        .await
        .unwrap();
    let status = plugin.wait_for_status(DEADLINE).await.unwrap();
    assert!(status.plugin_registered, "{status:?}");

    let list = kpm.wait_for("the driver is connected", |list| {
        list["dra_drivers"][0]["instances"][0]["connected"] == true
    });
    let driver_json = &list["dra_drivers"][0];
    assert_eq!(driver_json["name"], "gpu.example.com");
    assert_eq!(driver_json["instances"][0]["endpoint"], service.display().to_string());
    assert_eq!(driver_json["instances"][0]["version"], "v1.DRAPlugin");
    assert!(driver_json["cleanup_pending_until"].is_null());

    // The driver's service goes away: noticed, and a cleanup is scheduled.
    driver.stop();
    kpm.wait_for("the loss is noticed", |list| {
        list["dra_drivers"][0]["instances"][0]["connected"] == false
            && list["dra_drivers"][0]["cleanup_pending_until"].is_string()
    });
    plugin.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_endpoint_outside_the_root_is_rejected_with_a_reason() {
    let root = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let kpm = Kpm::start(root.path());
    let plugin = Registrar::builder(kpm::api::DRA_PLUGIN, "gpu.example.com")
        .versions(["v1.DRAPlugin"])
        .endpoint(elsewhere.path().join("dra.sock"))
        .socket_dir(kpm.registry())
        .serve()
        .await
        .unwrap();
    let status = plugin.wait_for_status(DEADLINE).await.unwrap();
    assert!(!status.plugin_registered);
    assert!(status.error.contains("is not inside"), "{}", status.error);
}
