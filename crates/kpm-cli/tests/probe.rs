//! `kpm probe`: verdicts for a good plugin and for each kind of bad one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;

use kpm_registrar::Registrar;
use support::kpm;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
}

/// Runs `kpm probe socket`; returns (exit code, stdout).
/// `kpm probe` as `kpm run --root-dir <the socket's directory>` would judge.
fn probe(socket: &Path) -> (i32, String) {
    probe_in(socket.parent().unwrap(), socket)
}

fn probe_in(root: &Path, socket: &Path) -> (i32, String) {
    let root = root.to_str().unwrap();
    let out = kpm(&["probe", "--timeout", "2", "--root-dir", root, socket.to_str().unwrap()]);
    (out.status.code().unwrap(), String::from_utf8(out.stdout).unwrap())
}

#[test]
fn a_good_device_plugin_would_register() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let plugin = rt
        .block_on(
            Registrar::builder(kpm::api::DEVICE_PLUGIN, "vendor.com/gpu")
                .routes(support::device_plugin(&[("gpu-0", "Healthy"), ("gpu-1", "Unhealthy")]))
                .socket_dir(dir.path())
                .serve(),
        )
        .unwrap();
    let (code, report) = probe(plugin.socket_path());
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("GetInfo") && report.contains("name=vendor.com/gpu"), "{report}");
    assert!(report.contains("2 devices, 1 healthy"), "{report}");
    assert!(report.ends_with("verdict: would register\n"), "{report}");
    assert!(plugin.statuses().is_empty(), "probing does not notify the plugin");
}

#[test]
fn a_device_plugin_without_its_service_would_not_register() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let plugin = rt
        .block_on(
            Registrar::builder(kpm::api::DEVICE_PLUGIN, "vendor.com/gpu")
                .socket_dir(dir.path())
                .serve(),
        )
        .unwrap();
    let (code, report) = probe(plugin.socket_path());
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("service") && report.contains("FAIL"), "{report}");
    assert!(report.contains("failed to get device plugin options"), "{report}");
    assert!(report.contains("verdict: would not register at service: "), "{report}");
}

#[test]
fn a_good_dra_driver_would_register() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let service = dir.path().join("dra.sock");
    let _driver = support::serve(&service, kpm_registrar::stub::StubDraDriver::new().routes());
    let plugin = rt
        .block_on(
            Registrar::builder(kpm::api::DRA_PLUGIN, "gpu.example.com")
                .versions(["v1.DRAPlugin"])
                .endpoint(&service)
                .socket_dir(dir.path())
                .serve(),
        )
        .unwrap();
    let (code, report) = probe(plugin.socket_path());
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("v1.DRAPlugin answers NodePrepareResources (no claims)"), "{report}");

    // `kpm run` with another root refuses this endpoint, and so does probe.
    let other_root = tempfile::tempdir().unwrap();
    let (code, report) = probe_in(other_root.path(), plugin.socket_path());
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("is not inside the kubelet root directory"), "{report}");
}
#[test]
fn an_unknown_type_would_not_register() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let plugin = rt
        .block_on(
            Registrar::builder("FancyPlugin", "fancy")
                .versions(["v1"])
                .socket_dir(dir.path())
                .serve(),
        )
        .unwrap();
    let (code, report) = probe(plugin.socket_path());
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("no handler registered for plugin type: FancyPlugin"), "{report}");
}

#[test]
fn bad_csi_versions_would_not_register_with_the_kubelets_reason() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let plugin = rt
        .block_on(
            Registrar::builder(kpm::api::CSI_PLUGIN, "csi.example.com")
                .versions(["0.3.0"])
                .socket_dir(dir.path())
                .serve(),
        )
        .unwrap();
    let (code, report) = probe(plugin.socket_path());
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("verdict: would not register at validate: "), "{report}");
    assert!(report.contains("None of the versions specified"), "{report}");
}

#[test]
fn a_csi_driver_whose_service_does_not_answer_would_not_register() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let missing = dir.path().join("missing-driver.sock");
    let plugin = rt
        .block_on(
            Registrar::builder(kpm::api::CSI_PLUGIN, "csi.example.com")
                .versions(["1.0.0"])
                .endpoint(&missing)
                .socket_dir(dir.path())
                .serve(),
        )
        .unwrap();
    let (code, report) = probe(plugin.socket_path());
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains("verdict: would not register at service: ")
            && report.contains("missing-driver.sock"),
        "{report}"
    );
}

#[test]
fn a_socket_nobody_listens_on_fails_at_dial() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let (code, report) = probe(&socket);
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains("verdict: would not register at dial: ") && report.contains("refused"),
        "{report}"
    );
}
