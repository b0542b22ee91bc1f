//! Device plugins registering through the plugin watcher (the
//! `PluginHandler` calls) and through `kubelet.sock`: validation with the
//! kubelet's texts, what gets connected, and the registration cases of the
//! kubelet's handler and manager tests (spec B.8).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use kpm_api::deviceplugin::v1beta1::Empty;
use kpm_api::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use kpm_cache::PluginDetails;
use kpm_cache::PluginEndpoint;
use kpm_cache::PluginHandler;
use kpm_device::{DeviceConfig, DeviceError, DeviceManager, DeviceStatus, KubeletSocket};
use support::{
    Behaviour, DEADLINE, GPU, Served, device, healthy, ids, register, request, serve,
    wait_for_counts, wait_until,
};
use tempfile::TempDir;
use tonic::{Code, Status};

/// A device plugin as the plugin watcher finds it: served on its
/// registration socket, having advertised no endpoint.
fn on_socket(socket: impl Into<std::path::PathBuf>) -> PluginEndpoint {
    PluginEndpoint::RegistrationSocket(socket.into())
}

struct Setup {
    dir: TempDir,
    manager: Arc<DeviceManager>,
}

fn setup() -> Setup {
    let config = DeviceConfig::default().dial_timeout(DEADLINE).call_timeout(DEADLINE);
    Setup {
        dir: tempfile::tempdir().unwrap(),
        manager: DeviceManager::try_new(config, kpm_transport::fd::budget().clone()).unwrap(),
    }
}

impl Setup {
    async fn serve(
        &self,
        file: &str,
        devices: Vec<kpm_api::deviceplugin::v1beta1::Device>,
    ) -> Served {
        serve(self.dir.path(), file, devices, Behaviour::default()).await
    }

    async fn kubelet_sock(&self) -> KubeletSocket {
        self.manager.serve_registration(self.dir.path()).await.unwrap()
    }

    /// Validates, then registers, like the plugin manager.
    async fn register(&self, name: &str, endpoint: &str) -> Result<(), String> {
        let handler: &dyn PluginHandler = &*self.manager;
        let versions = ["v1beta1".to_owned()];
        handler
            .validate(&PluginDetails::new(name, on_socket(endpoint), versions.clone()))
            .await
            .map_err(|err| err.to_string())?;
        handler
            .register(&PluginDetails::new(name, on_socket(endpoint), versions.clone()))
            .await
            .map_err(|err| err.to_string())
    }

    async fn deregister(&self, name: &str, endpoint: &str) {
        let handler: &dyn PluginHandler = &*self.manager;
        handler
            .deregister(&PluginDetails::new(name, on_socket(endpoint), Vec::<String>::new()))
            .await;
    }
}

fn status_of(device_id: &str, health: &str, numa_nodes: &[i64]) -> DeviceStatus {
    DeviceStatus { id: device_id.into(), health: health.into(), numa_nodes: numa_nodes.to_vec() }
}

// === Both paths ===

#[tokio::test]
async fn a_plugin_registered_by_the_plugin_watcher_has_its_devices_listed() {
    let setup = setup();
    let devices = vec![
        device("d2", "Healthy", &[1]),
        device("d3", "Unhealthy", &[]),
        device("d1", "Healthy", &[0]),
    ];
    let plugin = setup.serve("gpu.sock", devices).await;

    setup.register(GPU, &plugin.endpoint()).await.unwrap();

    let status = wait_for_counts(&setup.manager, GPU, 2, 1).await;
    assert_eq!(status.endpoint, plugin.endpoint());
    assert_eq!(
        status.devices,
        [
            status_of("d1", "Healthy", &[0]),
            status_of("d2", "Healthy", &[1]),
            status_of("d3", "Unhealthy", &[])
        ]
    );
    assert_eq!(status.removal_at, None);
    assert_eq!(plugin.plugin.options_calls(), 1);
    assert_eq!(plugin.plugin.list_and_watch_calls(), 1);
}

#[tokio::test]
async fn a_plugin_registered_through_kubelet_sock_has_its_devices_listed() {
    let setup = setup();
    let kubelet = setup.kubelet_sock().await;
    assert_eq!(kubelet.socket_path(), setup.dir.path().join("kubelet.sock"));
    let plugin = setup.serve("gpu.sock", healthy(&["b", "a"])).await;

    plugin.register(kubelet.socket_path(), GPU).await.unwrap();

    // Register returns once the plugin is connected.
    assert_eq!(setup.manager.resource(GPU).unwrap().endpoint, plugin.endpoint());
    let status = wait_for_counts(&setup.manager, GPU, 2, 0).await;
    assert_eq!(ids(&status), ["a", "b"]);
    kubelet.shutdown().await;
}

#[tokio::test]
async fn resources_are_listed_sorted_by_name() {
    let setup = setup();
    let kubelet = setup.kubelet_sock().await;
    let fpga = setup.serve("fpga.sock", healthy(&["f"])).await;
    let gpu = setup.serve("gpu.sock", healthy(&["g"])).await;
    let nic = setup.serve("nic.sock", healthy(&["n"])).await;

    gpu.register(kubelet.socket_path(), "vendor.com/gpu").await.unwrap();
    setup.register("example.org/nic", &nic.endpoint()).await.unwrap();
    fpga.register(kubelet.socket_path(), "vendor.com/fpga").await.unwrap();

    let resources = wait_until(&setup.manager, "three resources with a device each", |all| {
        all.len() == 3 && all.iter().all(|status| status.healthy == 1)
    })
    .await;
    let names: Vec<_> = resources.iter().map(|status| status.resource.as_str()).collect();
    assert_eq!(names, ["example.org/nic", "vendor.com/fpga", "vendor.com/gpu"]);
}

// === Validation ===

#[tokio::test]
async fn invalid_register_requests_are_rejected_with_the_kubelets_texts_and_nothing_is_connected() {
    let setup = setup();
    let kubelet = setup.kubelet_sock().await;
    let plugin = setup.serve("gpu.sock", healthy(&["a"])).await;
    let dir = kubelet.socket_path().parent().unwrap().display().to_string();
    let absolute = plugin.endpoint();

    let cases = [
        (
            request("v1alpha", GPU, "gpu.sock"),
            "requested API version \"v1alpha\" is not supported by kubelet. \
             Supported version is [\"v1beta1\"]"
                .to_owned(),
        ),
        (request("v1beta1", "gpu", "gpu.sock"), "the ResourceName \"gpu\" is invalid".to_owned()),
        (
            request("v1beta1", "kubernetes.io/gpu", "gpu.sock"),
            "the ResourceName \"kubernetes.io/gpu\" is invalid".to_owned(),
        ),
        (
            request("v1beta1", GPU, &absolute),
            format!("invalid endpoint \"{absolute}\": must be a socket file name inside {dir}"),
        ),
        (
            request("v1beta1", GPU, "../x.sock"),
            format!("invalid endpoint \"../x.sock\": must be a socket file name inside {dir}"),
        ),
        (
            request("v1beta1", GPU, "a/b.sock"),
            format!("invalid endpoint \"a/b.sock\": must be a socket file name inside {dir}"),
        ),
        (
            request("v1beta1", GPU, ""),
            format!("invalid endpoint \"\": must be a socket file name inside {dir}"),
        ),
    ];
    for (request, expected) in cases {
        let status = register(kubelet.socket_path(), request.clone()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{request:?}");
        assert_eq!(status.message(), expected, "{request:?}");
    }
    assert_eq!(plugin.plugin.options_calls(), 0, "nothing was dialed");
    assert!(setup.manager.resources().is_empty());
}

#[tokio::test]
async fn invalid_plugins_are_rejected_by_validation_with_the_kubelets_texts() {
    let setup = setup();
    let plugin = setup.serve("gpu.sock", healthy(&["a"])).await;
    let handler: &dyn PluginHandler = &*setup.manager;
    let endpoint = plugin.endpoint();

    let versions = ["v1alpha1".to_owned(), "v1".to_owned()];
    let err = handler
        .validate(&PluginDetails::new(GPU, on_socket(&endpoint), versions.clone()))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "manager version, v1beta1, is not among plugin supported versions [v1alpha1 v1]"
    );
    let versions = ["v1beta1".to_owned()];
    for name in ["gpu", "kubernetes.io/gpu", "requests.vendor.com/gpu"] {
        let err = handler
            .validate(&PluginDetails::new(name, on_socket(&endpoint), versions.clone()))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("invalid name of device plugin socket: the ResourceName \"{name}\" is invalid")
        );
        // Register checks again.
        assert!(
            handler
                .register(&PluginDetails::new(name, on_socket(&endpoint), versions.clone()))
                .await
                .is_err()
        );
    }
    assert_eq!(plugin.plugin.options_calls(), 0);
    assert!(setup.manager.resources().is_empty());
}

// === Ports of handler_test.go and manager_test.go (spec B.8) ===

/// `TestConnectClient_SameResourceSameSocketDeduplicated`,
/// `TestPluginConnected_SameResourceSameSocketRejected`: here the repeat is
/// accepted (so a plugin that retries is not stuck), without a second client.
#[tokio::test]
async fn registering_the_same_resource_and_socket_again_makes_no_second_connection() {
    let setup = setup();
    let kubelet = setup.kubelet_sock().await;
    let plugin = setup.serve("gpu.sock", healthy(&["a", "b"])).await;

    for _ in 0..3 {
        setup.register(GPU, &plugin.endpoint()).await.unwrap();
    }
    plugin.register(kubelet.socket_path(), GPU).await.unwrap();

    wait_for_counts(&setup.manager, GPU, 2, 0).await;
    assert_eq!(plugin.plugin.options_calls(), 1);
    assert_eq!(plugin.plugin.list_and_watch_calls(), 1);
    assert_eq!(plugin.plugin.open_streams(), 1);
}

/// Liveness probes a device plugin over the connection the manager holds:
/// it is lent only for the current endpoint's socket, while it is current.
#[tokio::test]
async fn the_current_endpoints_connection_is_lent_to_liveness_probes() {
    let setup = setup();
    let plugin = setup.serve("gpu.sock", healthy(&["a"])).await;
    setup.register(GPU, &plugin.endpoint()).await.unwrap();
    wait_for_counts(&setup.manager, GPU, 1, 0).await;

    let channel = setup.manager.connection(GPU, &plugin.socket).unwrap();
    DevicePluginClient::new(channel).get_device_plugin_options(Empty {}).await.unwrap();
    assert_eq!(plugin.plugin.options_calls(), 2, "over the held connection");
    assert_eq!(plugin.accepted(), 1, "no second connection");
    assert!(setup.manager.connection("vendor.com/fpga", &plugin.socket).is_none());
    let other = setup.dir.path().join("other.sock");
    assert!(setup.manager.connection(GPU, &other).is_none());

    plugin.crash();
    wait_for_counts(&setup.manager, GPU, 0, 1).await;
    assert!(setup.manager.connection(GPU, &plugin.socket).is_none(), "gone");
}

/// `TestConnectClient_PluginConnectedFailureDeregisters`,
/// `TestConnect_PluginConnectedFailureClosesConnection`, `TestConnectFailureCleanup`.
#[tokio::test]
async fn a_failed_connect_leaves_nothing_behind() {
    let setup = setup();
    let missing = setup.dir.path().join("missing.sock").display().to_string();
    let err = setup.register(GPU, &missing).await.unwrap_err();
    assert!(
        err.starts_with(&format!("failed to dial device plugin {GPU}: dial {missing}: ")),
        "{err}"
    );
    assert!(setup.manager.resources().is_empty());

    let broken = serve(
        setup.dir.path(),
        "broken.sock",
        healthy(&["x"]),
        Behaviour { options_error: Some(Status::unavailable("not ready")), ..Behaviour::default() },
    )
    .await;
    let err = setup.register(GPU, &broken.endpoint()).await.unwrap_err();
    assert_eq!(
        err,
        format!(
            "failed to get device plugin options from {GPU} at {}: \
             rpc error: code = Unavailable desc = not ready",
            broken.endpoint()
        )
    );
    assert!(setup.manager.resources().is_empty());
    assert_eq!(broken.plugin.list_and_watch_calls(), 0);

    // A failed connect leaves a connected endpoint of the resource alone.
    let plugin = setup.serve("gpu.sock", healthy(&["a"])).await;
    setup.register(GPU, &plugin.endpoint()).await.unwrap();
    wait_for_counts(&setup.manager, GPU, 1, 0).await;
    setup.register(GPU, &broken.endpoint()).await.unwrap_err();
    setup.register(GPU, &missing).await.unwrap_err();
    let status = setup.manager.resource(GPU).unwrap();
    assert_eq!((status.endpoint, status.healthy), (plugin.endpoint(), 1));
    assert_eq!(plugin.plugin.open_streams(), 1);
}

/// `TestDeregisterClient_WrongSocketIsNoop`, `TestPluginDisconnected_WrongSocketIsNoop`,
/// `TestPluginDisconnected_LastEndpointMarksUnhealthy`.
#[tokio::test]
async fn deregistering_a_socket_that_is_not_the_current_endpoint_is_a_noop() {
    let setup = setup();
    let a = setup.serve("a.sock", healthy(&["a1", "a2"])).await;
    let b = setup.serve("b.sock", healthy(&["b1", "b2"])).await;
    setup.register(GPU, &a.endpoint()).await.unwrap();
    setup.register(GPU, &b.endpoint()).await.unwrap();
    let status = wait_until(&setup.manager, "b's devices", |all| {
        all.first().is_some_and(|status| ids(status) == ["b1", "b2"])
    })
    .await;
    assert_eq!(status[0].endpoint, b.endpoint());

    setup.deregister(GPU, &setup.dir.path().join("c.sock").display().to_string()).await;
    setup.deregister("vendor.com/fpga", &b.endpoint()).await;
    setup.deregister(GPU, &a.endpoint()).await;
    let status = setup.manager.resource(GPU).unwrap();
    assert_eq!((status.endpoint.as_str(), status.healthy), (b.endpoint().as_str(), 2));
    assert_eq!(status.removal_at, None);
    assert_eq!(b.plugin.open_streams(), 1);

    setup.deregister(GPU, &b.endpoint()).await;
    let status = setup.manager.resource(GPU).unwrap();
    assert_eq!((status.endpoint.as_str(), status.healthy, status.unhealthy), ("", 0, 2));
    assert!(status.removal_at.is_some());
    b.plugin.wait_until_streams_are_closed().await;
}

/// `TestSameSocketRace_ReconnectAfterCleanDisconnect`,
/// `TestSameSocketRace_DisconnectBeforeReconnectAttempt`.
#[tokio::test]
async fn a_plugin_can_register_again_after_it_was_deregistered() {
    let setup = setup();
    let plugin = setup.serve("gpu.sock", healthy(&["a"])).await;
    setup.register(GPU, &plugin.endpoint()).await.unwrap();
    wait_for_counts(&setup.manager, GPU, 1, 0).await;
    setup.deregister(GPU, &plugin.endpoint()).await;
    assert_eq!(setup.manager.resource(GPU).unwrap().unhealthy, 1);

    setup.register(GPU, &plugin.endpoint()).await.unwrap();

    plugin.plugin.wait_for_list_and_watch(2).await;
    let status = wait_for_counts(&setup.manager, GPU, 1, 0).await;
    assert_eq!(status.removal_at, None);
    assert_eq!(status.endpoint, plugin.endpoint());
    assert_eq!(plugin.plugin.options_calls(), 2);
}

/// `TestSameSocketRace_FastTakeoverMayResultInInfiniteRetries`: upstream, a
/// plugin that restarts on the same socket before its old connection is
/// noticed gone is refused as `already connected` forever. Here the new
/// socket file is a new incarnation and is connected.
#[tokio::test]
async fn a_plugin_that_restarted_on_the_same_socket_is_connected_again() {
    let setup = setup();
    let kubelet = setup.kubelet_sock().await;
    let old = setup.serve("gpu.sock", healthy(&["old"])).await;
    old.register(kubelet.socket_path(), GPU).await.unwrap();
    wait_for_counts(&setup.manager, GPU, 1, 0).await;

    // The old process still serves its connection while the new one binds
    // a fresh socket file at the same path and registers.
    std::fs::remove_file(&old.socket).unwrap();
    let new = setup.serve("gpu.sock", healthy(&["new1", "new2"])).await;
    new.register(kubelet.socket_path(), GPU).await.unwrap();

    let status = wait_for_counts(&setup.manager, GPU, 2, 0).await;
    assert_eq!(ids(&status), ["new1", "new2"]);
    old.plugin.wait_until_streams_are_closed().await;

    // The old process dies late: the new connection is not affected.
    old.crash();
    assert_eq!(new.plugin.open_streams(), 1);
    let status = setup.manager.resource(GPU).unwrap();
    assert_eq!((status.healthy, status.removal_at), (2, None));
}

/// `TestSameSocketRace_LateDisconnectAfterReconnect`. A deregistration names
/// only (resource, socket), so a duplicate one after a reconnect on the same
/// socket closes the new connection, as upstream. The plugin manager never
/// sends one: it deregisters each registration exactly once, and a stream
/// end of the old connection is keyed by the connection, not the socket.
#[tokio::test]
async fn a_duplicate_deregistration_after_a_reconnect_on_the_same_socket_closes_the_new_connection()
{
    let setup = setup();
    let plugin = setup.serve("gpu.sock", healthy(&["a", "b"])).await;
    setup.register(GPU, &plugin.endpoint()).await.unwrap();
    setup.deregister(GPU, &plugin.endpoint()).await;
    setup.register(GPU, &plugin.endpoint()).await.unwrap();
    wait_for_counts(&setup.manager, GPU, 2, 0).await;

    setup.deregister(GPU, &plugin.endpoint()).await;

    let status = setup.manager.resource(GPU).unwrap();
    assert_eq!((status.healthy, status.unhealthy), (0, 2));
    plugin.plugin.wait_until_streams_are_closed().await;
}

/// `TestDevicePluginReRegistration` (through `kubelet.sock`) and
/// `TestDevicePluginReRegistrationProbeMode` (through the plugin watcher),
/// for every combination of the two plugin options.
#[tokio::test]
async fn re_registrations_replace_the_endpoint_and_its_devices_on_both_paths() {
    for through_kubelet_sock in [true, false] {
        for (pre_start_required, get_preferred_allocation_available) in
            [(false, false), (false, true), (true, false), (true, true)]
        {
            let case = format!(
                "kubelet.sock: {through_kubelet_sock}, pre-start: {pre_start_required}, \
                 preferred: {get_preferred_allocation_available}"
            );
            let setup = setup();
            let kubelet = setup.kubelet_sock().await;
            let options = kpm_device::DevicePluginOptions {
                pre_start_required,
                get_preferred_allocation_available,
            };
            let behaviour = Behaviour { options, ..Behaviour::default() };
            let dir = setup.dir.path();
            let connect = async |served: &Served| {
                if through_kubelet_sock {
                    served.register(kubelet.socket_path(), GPU).await.unwrap();
                } else {
                    setup.register(GPU, &served.endpoint()).await.unwrap();
                }
            };

            let first =
                serve(dir, "device.sock", healthy(&["Dev1", "Dev2"]), behaviour.clone()).await;
            connect(&first).await;
            let status = wait_for_counts(&setup.manager, GPU, 2, 0).await;
            assert_eq!(status.endpoint, first.endpoint(), "{case}");
            assert_eq!(setup.manager.options(GPU), Some(options), "{case}");

            let second =
                serve(dir, "device.sock.new", healthy(&["Dev1", "Dev2"]), behaviour.clone()).await;
            connect(&second).await;
            second.plugin.wait_for_list_and_watch(1).await;
            let status = wait_for_counts(&setup.manager, GPU, 2, 0).await;
            assert_eq!(status.endpoint, second.endpoint(), "{case}");
            first.plugin.wait_until_streams_are_closed().await;

            let third = serve(dir, "device.sock.third", healthy(&["Dev1"]), behaviour).await;
            connect(&third).await;
            let status = wait_for_counts(&setup.manager, GPU, 1, 0).await;
            assert_eq!(status.endpoint, third.endpoint(), "{case}");
            assert_eq!(ids(&status), ["Dev1"], "{case}: the update replaced the device set");
            second.plugin.wait_until_streams_are_closed().await;
            kubelet.shutdown().await;
        }
    }
}

// === kubelet.sock ===

#[tokio::test]
async fn kubelet_sock_is_created_in_a_new_directory_closed_to_others() {
    use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
    let setup = setup();
    let dir = setup.dir.path().join("root/device-plugins");

    let kubelet = setup.manager.serve_registration(&dir).await.unwrap();

    assert_eq!(kubelet.socket_path(), dir.join("kubelet.sock"));
    assert!(std::fs::metadata(kubelet.socket_path()).unwrap().file_type().is_socket());
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & 0o007, 0, "{mode:o}");
    assert_eq!(mode & 0o700, 0o700, "{mode:o}");
    kubelet.shutdown().await;
}

#[tokio::test]
async fn a_stale_kubelet_sock_is_replaced() {
    let setup = setup();
    let path = setup.dir.path().join("kubelet.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists(), "a socket file nobody listens on");

    let kubelet = setup.kubelet_sock().await;

    let plugin = setup.serve("gpu.sock", healthy(&["a"])).await;
    plugin.register(&path, GPU).await.unwrap();
    wait_for_counts(&setup.manager, GPU, 1, 0).await;
    kubelet.shutdown().await;
}

/// As the kubelet's device manager does at start: every other socket in
/// the directory goes, the signal device plugins watch for to register
/// again; directories and other files (the kubelet's checkpoint) stay.
#[tokio::test]
async fn serving_kubelet_sock_removes_the_plugins_sockets_and_nothing_else() {
    let setup = setup();
    let dir = setup.dir.path();
    let stale = dir.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let live = dir.join("live.sock");
    let _listening = std::os::unix::net::UnixListener::bind(&live).unwrap();
    let checkpoint = dir.join("kubelet_internal_checkpoint");
    std::fs::write(&checkpoint, "{}").unwrap();
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let nested = sub.join("nested.sock");
    drop(std::os::unix::net::UnixListener::bind(&nested).unwrap());

    let kubelet = setup.kubelet_sock().await;

    assert!(!stale.exists() && !live.exists(), "the plugins' sockets are gone");
    assert!(checkpoint.exists() && nested.exists(), "other files and directories stay");
    assert!(kubelet.socket_path().exists());
    kubelet.shutdown().await;
}

#[tokio::test]
async fn a_kubelet_sock_a_live_process_answers_on_is_refused_with_an_error_naming_it() {
    let setup = setup();
    let kubelet = setup.kubelet_sock().await;
    let other =
        DeviceManager::try_new(DeviceConfig::default(), kpm_transport::fd::budget().clone())
            .unwrap();

    let err = other.serve_registration(setup.dir.path()).await.unwrap_err();

    let path = kubelet.socket_path().to_path_buf();
    match &err {
        DeviceError::KubeletSocketInUse { path: refused } => assert_eq!(refused, &path),
        other => panic!("unexpected error: {other}"),
    }
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
    // The first one still serves.
    let plugin = setup.serve("gpu.sock", healthy(&["a"])).await;
    plugin.register(&path, GPU).await.unwrap();
    assert!(other.resources().is_empty());
    assert!(setup.manager.resource(GPU).is_some());
}

#[tokio::test]
async fn shutdown_removes_kubelet_sock_but_not_a_file_someone_else_created_there() {
    let setup = setup();
    let kubelet = setup.kubelet_sock().await;
    let path = kubelet.socket_path().to_path_buf();
    kubelet.shutdown().await;
    assert!(!path.exists());

    let kubelet = setup.kubelet_sock().await;
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"someone else's").unwrap();
    kubelet.shutdown().await;
    assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");

    std::fs::remove_file(&path).unwrap();
    let kubelet = setup.kubelet_sock().await;
    drop(kubelet);
    assert!(!path.exists(), "dropping the handle removes the socket too");
}

#[tokio::test]
async fn kubelet_sock_registrations_after_shutdown_are_refused() {
    let setup = setup();
    let kubelet = setup.kubelet_sock().await;
    let plugin = setup.serve("gpu.sock", healthy(&["a"])).await;
    setup.manager.shutdown().await;

    let status = plugin.register(kubelet.socket_path(), GPU).await.unwrap_err();

    assert_eq!(status.code(), Code::Unavailable);
    assert!(status.message().starts_with("device manager is shut down"), "{status:?}");
    let err = setup.register(GPU, &plugin.endpoint()).await.unwrap_err();
    assert!(err.starts_with("device manager is shut down"), "{err}");
    assert_eq!(plugin.plugin.options_calls(), 0);
    assert!(kubelet.socket_path().exists());
}
