//! kpm's own servers inside the fd budget: `kpm run` under `ulimit -n 64`,
//! its permits held by connections to `kubelet.sock` (or, separately, to
//! the status socket) that never speak, still registers a device plugin
//! through `kubelet.sock` and a CSI plugin from the registry. Connections
//! idle for a second are shed, longest idle first, when an accept or a
//! registration finds no permit free; the rest are closed by the handshake
//! timeout.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::os::unix::net::UnixStream;

use kpm_api::deviceplugin::v1beta1::RegisterRequest;
use kpm_api::deviceplugin::v1beta1::registration_client::RegistrationClient;
use kpm_registrar::stub::StubCsiDriver;
use kpm_registrar::{CSI_PLUGIN, Registrar};
use kpm_test_support::prometheus;
use kpm_test_support::{DEADLINE, OwnRuntime, free_local_addr};
use support::{Kpm, wait_until};

const NOFILE: u32 = 64;
/// Far more than kpm's budget under [`NOFILE`].
const SILENT: u32 = 200;
const HANDSHAKE_TIMEOUT: &str = "5";

#[test]
fn silent_connections_to_kubelet_sock_keep_no_plugin_from_registering() {
    registers_despite_silent_connections_to("device-plugins/kubelet.sock");
}

#[test]
fn silent_connections_to_the_status_socket_keep_no_plugin_from_registering() {
    registers_despite_silent_connections_to("kpm.sock");
}

fn registers_despite_silent_connections_to(socket: &str) {
    // This process holds the silent connections: it needs more than kpm.
    kpm::transport::fd::raise_soft_limit().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let addr = free_local_addr();
    let args = ["--metrics-addr", &addr, "--handshake-timeout", HANDSHAKE_TIMEOUT];
    let kpm = Kpm::start_with_nofile(root, NOFILE, &args);
    kpm.kubelet_sock();
    let metrics = || prometheus::scrape(&addr);
    let metric = |series: &str| metrics().get(series).copied().unwrap_or_default();

    let silent: Vec<_> =
        (0..SILENT).map(|_| UnixStream::connect(root.join(socket)).unwrap()).collect();
    // The silent connections take every permit, as fast as they are shed.
    let in_use = || {
        let held = metrics();
        (held["kpm_fd_budget{state=\"in_use\"}"], held["kpm_fd_budget{state=\"budget\"}"])
    };
    wait_until("the silent connections hold the whole budget", || {
        let (in_use, budget) = in_use();
        in_use >= budget
    });
    let (_, budget) = in_use();
    eprintln!("{socket}: the {budget} permits are in use after {SILENT} silent connections");
    assert!(budget < f64::from(SILENT), "the silent connections outnumber the budget");

    // A CSI plugin in the registry and a device plugin through kubelet.sock.
    let registry = kpm.registry();
    let (sent, received) = std::sync::mpsc::channel();
    let csi = OwnRuntime::start(move || async move {
        let driver = StubCsiDriver::new("csi.example.com", "node-1").routes();
        let registrar = Registrar::builder(CSI_PLUGIN, "csi.example.com")
            .socket_dir(&registry)
            .routes(driver)
            .serve()
            .await
            .unwrap();
        sent.send(registrar).unwrap();
    });
    let registrar = received.recv().unwrap();
    let devices = root.join("device-plugins");
    let nic =
        support::serve(&devices.join("nic.sock"), support::device_plugin(&[("nic-0", "Healthy")]));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let channel = kpm::transport::Dialer::new(kpm::transport::fd::budget().clone(), DEADLINE)
            .grpc(&devices.join("kubelet.sock"))
            .await
            .unwrap()
            .channel;
        let request = RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "nic.sock".into(),
            resource_name: "vendor.com/nic".into(),
            options: None,
        };
        RegistrationClient::new(channel).register(request).await.unwrap();
    });
    wait_until("the CSI plugin and the device plugin are registered", || {
        let status = kpm.status();
        let csi = status["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "csi.example.com" && p["state"] == "registered");
        let nic = status["device_resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["resource"] == "vendor.com/nic" && r["healthy"] == 1);
        csi && nic
    });
    assert!(registrar.statuses().iter().all(|s| s.plugin_registered), "{:?}", registrar.statuses());
    // A registration found no permit free and shed silent connections.
    assert!(metric("kpm_fd_shed_connections_total") >= 1.0);

    let log = kpm.log();
    let listener = root.join(socket).display().to_string();
    assert!(
        log.lines().any(|l| l.contains("closing idle server connections") && l.contains(&listener)),
        "no shedding of {listener} logged:\n{log}"
    );
    assert!(!log.contains("Too many open files"), "{log}");
    drop(kpm);
    drop(silent);
    nic.stop();
    drop(registrar);
    csi.stop();
}
