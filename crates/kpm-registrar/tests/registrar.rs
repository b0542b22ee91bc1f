//! The registrar against real clients: registration sockets in temp dirs,
//! called over gRPC the way a node agent calls them.

// Test helpers may unwrap: a failed setup fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kpm_api::csi::v1::GetPluginInfoRequest;
use kpm_api::csi::v1::identity_client::IdentityClient;
use kpm_api::registration::v1::InfoRequest;
use kpm_api::registration::v1::registration_client::RegistrationClient;
use kpm_registrar::{
    CSI_PLUGIN, DEVICE_PLUGIN, DRA_PLUGIN, MAX_SOCKET_PATH_BYTES, PluginInfo, Registrar,
    RegistrarBuilder, RegistrarError, RegistrationStatus, default_versions, socket_file_name,
};
use kpm_test_support::DEADLINE;
use kpm_test_support::csi::{FakeCsiDriver, Reply};
use kpm_transport::TransportError;
use tonic::transport::Channel;

// === Helpers ===

fn gpu_plugin(dir: &Path) -> RegistrarBuilder {
    Registrar::builder(DEVICE_PLUGIN, "vendor.com/gpu").socket_dir(dir)
}

async fn client(socket: &Path) -> RegistrationClient<Channel> {
    RegistrationClient::new(dial(socket).await)
}

/// A channel to `socket`, paid from the process-wide fd budget.
async fn dial(socket: &Path) -> Channel {
    let dialer = kpm_transport::Dialer::new(kpm_transport::fd::budget().clone(), DEADLINE);
    dialer.grpc(socket).await.unwrap().channel
}

async fn get_info(socket: &Path) -> PluginInfo {
    client(socket).await.get_info(InfoRequest {}).await.unwrap().into_inner()
}

async fn notify(socket: &Path, plugin_registered: bool, error: &str) {
    let status = RegistrationStatus { plugin_registered, error: error.into() };
    let mut client = client(socket).await;
    let call = client.notify_registration_status(status);
    tokio::time::timeout(DEADLINE, call).await.expect("notify must answer at once").unwrap();
}

fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_socket())
}

fn registered() -> RegistrationStatus {
    RegistrationStatus { plugin_registered: true, error: String::new() }
}

fn rejected(reason: &str) -> RegistrationStatus {
    RegistrationStatus { plugin_registered: false, error: reason.into() }
}

// === GetInfo ===

#[tokio::test]
async fn get_info_returns_exactly_the_configured_plugin_info() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = Registrar::builder(DRA_PLUGIN, "gpu.example.com")
        .socket_dir(dir.path())
        .endpoint("/var/lib/kubelet/plugins/gpu.example.com/dra.sock")
        .versions(["v1.DRAPlugin", "v1beta1.DRAPlugin"])
        .serve()
        .await
        .unwrap();

    let expected = PluginInfo {
        r#type: "DRAPlugin".into(),
        name: "gpu.example.com".into(),
        endpoint: "/var/lib/kubelet/plugins/gpu.example.com/dra.sock".into(),
        supported_versions: vec!["v1.DRAPlugin".into(), "v1beta1.DRAPlugin".into()],
    };
    assert_eq!(get_info(registrar.socket_path()).await, expected);
    assert_eq!(registrar.plugin_info(), &expected);
}

#[tokio::test]
async fn get_info_returns_an_empty_endpoint_when_none_is_configured() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = gpu_plugin(dir.path()).serve().await.unwrap();

    let info = get_info(registrar.socket_path()).await;

    assert_eq!(info.endpoint, "");
    assert_eq!(info.name, "vendor.com/gpu");
    assert_eq!(info.r#type, "DevicePlugin");
}

#[tokio::test]
async fn versions_default_to_the_api_version_of_the_plugin_type() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = gpu_plugin(dir.path()).serve().await.unwrap();

    assert_eq!(get_info(registrar.socket_path()).await.supported_versions, ["v1beta1"]);
    assert_eq!(default_versions(DEVICE_PLUGIN), ["v1beta1"]);
    assert_eq!(default_versions(CSI_PLUGIN), ["1.0.0"]);
    assert_eq!(default_versions(DRA_PLUGIN), ["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
    assert!(default_versions("FooPlugin").is_empty());
}

#[tokio::test]
async fn versions_can_be_set_to_none() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = gpu_plugin(dir.path()).versions(Vec::<String>::new()).serve().await.unwrap();

    assert!(get_info(registrar.socket_path()).await.supported_versions.is_empty());
}

#[tokio::test]
async fn extra_services_are_served_on_the_registration_socket() {
    let driver = std::sync::Arc::new(FakeCsiDriver::always("csi.example.com", Reply::Hang));
    let dir = tempfile::tempdir().unwrap();
    let registrar = Registrar::builder(CSI_PLUGIN, "csi.example.com")
        .socket_dir(dir.path())
        .routes(driver.routes())
        .serve()
        .await
        .unwrap();

    let channel = dial(registrar.socket_path()).await;
    let driver = IdentityClient::new(channel).get_plugin_info(GetPluginInfoRequest {}).await;

    assert_eq!(driver.unwrap().into_inner().name, "csi.example.com");
    assert_eq!(get_info(registrar.socket_path()).await.name, "csi.example.com");
}

// === Socket naming ===

#[tokio::test]
async fn the_socket_is_named_after_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let registrar =
        Registrar::builder(CSI_PLUGIN, "csi.example.com").socket_dir(dir.path()).serve().await;

    let registrar = registrar.unwrap();
    assert_eq!(registrar.socket_path(), dir.path().join("csi.example.com-reg.sock"));
    assert!(is_socket(registrar.socket_path()));
}

#[tokio::test]
async fn a_rolling_update_uid_makes_the_socket_name_unique_per_instance() {
    let dir = tempfile::tempdir().unwrap();
    let builder = |uid| {
        Registrar::builder(DRA_PLUGIN, "gpu.example.com")
            .socket_dir(dir.path())
            .rolling_update_uid(uid)
    };

    let old = builder("uid-1").serve().await.unwrap();
    let new = builder("uid-2").serve().await.unwrap();

    assert_eq!(old.socket_path(), dir.path().join("gpu.example.com-uid-1-reg.sock"));
    assert_eq!(new.socket_path(), dir.path().join("gpu.example.com-uid-2-reg.sock"));
    assert_eq!(get_info(old.socket_path()).await.name, "gpu.example.com");
    assert_eq!(get_info(new.socket_path()).await.name, "gpu.example.com");
}

#[test]
fn an_empty_rolling_update_uid_is_ignored() {
    let builder = Registrar::builder(DRA_PLUGIN, "gpu.example.com").rolling_update_uid("");

    assert_eq!(
        builder.socket_path().unwrap(),
        Path::new("/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock")
    );
}

#[tokio::test]
async fn slashes_in_the_name_are_replaced_in_the_file_name_only() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = gpu_plugin(dir.path()).serve().await.unwrap();

    assert_eq!(registrar.socket_path(), dir.path().join("vendor.com_gpu-reg.sock"));
    assert_eq!(get_info(registrar.socket_path()).await.name, "vendor.com/gpu");
}

#[test]
fn file_names_are_never_hidden_and_never_leave_the_directory() {
    assert_eq!(socket_file_name("../etc/x", None), "_._etc_x-reg.sock");
    assert_eq!(socket_file_name(".hidden", None), "_hidden-reg.sock");
    assert_eq!(socket_file_name("a/b", Some("pod/1")), "a_b-pod_1-reg.sock");
    assert_eq!(socket_file_name("nul\0name", None), "nul_name-reg.sock");
}

#[tokio::test]
async fn a_socket_path_too_long_for_sun_path_is_a_typed_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("d".repeat(MAX_SOCKET_PATH_BYTES));
    let builder = gpu_plugin(&deep);
    let expected = deep.join("vendor.com_gpu-reg.sock");

    let err = builder.serve().await.unwrap_err();

    let RegistrarError::SocketPathTooLong { path, len, max } = &err else {
        panic!("expected SocketPathTooLong, got {err:?}");
    };
    assert_eq!((path, *len, *max), (&expected, expected.as_os_str().len(), MAX_SOCKET_PATH_BYTES));
    assert!(err.to_string().contains(&expected.display().to_string()), "{err}");
    assert!(!deep.exists(), "nothing is created for a socket that cannot be bound");
}

#[tokio::test]
async fn a_socket_path_of_exactly_the_maximum_length_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let file_len = "vendor.com_gpu-reg.sock".len();
    let pad = MAX_SOCKET_PATH_BYTES - dir.path().as_os_str().len() - 1 - file_len - 1;
    let registrar = gpu_plugin(&dir.path().join("d".repeat(pad))).serve().await.unwrap();

    assert_eq!(registrar.socket_path().as_os_str().len(), MAX_SOCKET_PATH_BYTES);
    assert_eq!(get_info(registrar.socket_path()).await.name, "vendor.com/gpu");
}

#[tokio::test]
async fn a_missing_socket_directory_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("kubelet").join("plugins_registry");

    let registrar = gpu_plugin(&nested).serve().await.unwrap();

    assert!(is_socket(&nested.join("vendor.com_gpu-reg.sock")));
    assert_eq!(get_info(registrar.socket_path()).await.name, "vendor.com/gpu");
}

#[tokio::test]
async fn a_socket_directory_that_cannot_be_created_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "").unwrap();

    let err = gpu_plugin(&file.join("sub")).serve().await.unwrap_err();

    assert!(
        matches!(&err, RegistrarError::CreateDir { path, .. } if *path == file.join("sub")),
        "{err:?}"
    );
}

// === Registration status ===

#[tokio::test]
async fn no_status_is_exposed_before_the_first_notification() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = gpu_plugin(dir.path()).serve().await.unwrap();

    assert_eq!(*registrar.status().borrow(), None);
    assert!(registrar.statuses().is_empty());
}

#[tokio::test]
async fn a_successful_registration_is_exposed_through_status_and_wait_for_status() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = gpu_plugin(dir.path()).serve().await.unwrap();

    notify(registrar.socket_path(), true, "").await;

    assert_eq!(registrar.wait_for_status(DEADLINE).await.unwrap(), registered());
    assert_eq!(*registrar.status().borrow(), Some(registered()));
}

#[tokio::test]
async fn a_rejection_carries_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = gpu_plugin(dir.path()).serve().await.unwrap();
    let reason = "RegisterPlugin error -- no handler registered for plugin type: DevicePlugin";

    notify(registrar.socket_path(), false, reason).await;

    assert_eq!(registrar.wait_for_status(DEADLINE).await.unwrap(), rejected(reason));
    assert_eq!(*registrar.status().borrow(), Some(rejected(reason)));
}

#[tokio::test]
async fn wait_for_status_waits_for_the_first_notification() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = gpu_plugin(dir.path()).serve().await.unwrap();
    let socket = registrar.socket_path().to_path_buf();

    let (status, ()) = tokio::join!(registrar.wait_for_status(DEADLINE), notify(&socket, true, ""));

    assert_eq!(status.unwrap(), registered());
}

#[tokio::test(start_paused = true)]
async fn wait_for_status_times_out_with_a_typed_error_naming_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = gpu_plugin(dir.path()).serve().await.unwrap();

    let err = registrar.wait_for_status(Duration::from_secs(30)).await.unwrap_err();

    let RegistrarError::StatusTimeout { socket, timeout } = &err else {
        panic!("expected StatusTimeout, got {err:?}");
    };
    assert_eq!((socket.as_path(), *timeout), (registrar.socket_path(), Duration::from_secs(30)));
    assert!(err.to_string().contains("vendor.com_gpu-reg.sock"), "{err}");
}

#[tokio::test]
async fn every_notification_is_recorded_in_order_and_status_follows_the_latest() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = gpu_plugin(dir.path()).serve().await.unwrap();
    let mut status = registrar.status();

    notify(registrar.socket_path(), false, "device manager is not ready").await;
    notify(registrar.socket_path(), true, "").await;

    assert_eq!(registrar.statuses(), [rejected("device manager is not ready"), registered()]);
    assert_eq!(*status.borrow_and_update(), Some(registered()));
    assert_eq!(registrar.wait_for_status(DEADLINE).await.unwrap(), registered());
}

// === Binding ===

#[tokio::test]
async fn a_stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vendor.com_gpu-reg.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(is_socket(&path), "a dropped listener leaves its socket file behind");

    let registrar = gpu_plugin(dir.path()).serve().await.unwrap();

    assert_eq!(registrar.socket_path(), path);
    assert_eq!(get_info(&path).await.name, "vendor.com/gpu");
}

#[tokio::test]
async fn a_live_socket_is_refused_with_a_typed_error_and_left_intact() {
    let dir = tempfile::tempdir().unwrap();
    let first = Registrar::builder(DEVICE_PLUGIN, "vendor.com/gpu")
        .socket_dir(dir.path())
        .endpoint("/first")
        .serve()
        .await
        .unwrap();

    let err = gpu_plugin(dir.path()).endpoint("/second").serve().await.unwrap_err();

    let RegistrarError::Bind { source: TransportError::InUse { path } } = &err else {
        panic!("expected Bind(InUse), got {err:?}");
    };
    assert_eq!(path, first.socket_path());
    assert!(err.to_string().contains("vendor.com_gpu-reg.sock"), "{err}");
    assert_eq!(get_info(first.socket_path()).await.endpoint, "/first");
}

// === Shutdown ===

#[tokio::test]
async fn shutdown_removes_the_socket_file() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = gpu_plugin(dir.path()).serve().await.unwrap();
    let path = registrar.socket_path().to_path_buf();

    registrar.shutdown().await.unwrap();

    assert!(!path.exists());
}

#[tokio::test]
async fn shutdown_finishes_while_a_client_keeps_its_connection_open() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = gpu_plugin(dir.path()).serve().await.unwrap();
    let path = registrar.socket_path().to_path_buf();
    let mut kept = client(&path).await;
    kept.get_info(InfoRequest {}).await.unwrap();

    tokio::time::timeout(DEADLINE, registrar.shutdown()).await.unwrap().unwrap();

    assert!(!path.exists());
    assert!(kept.get_info(InfoRequest {}).await.is_err(), "the server must be gone");
}

#[tokio::test]
async fn shutdown_leaves_a_socket_that_a_newer_instance_created_at_the_same_path() {
    let dir = tempfile::tempdir().unwrap();
    let old = gpu_plugin(dir.path()).endpoint("/old").serve().await.unwrap();
    // The old instance's socket is deleted under it (a preStop hook, an
    // operator) and a new instance binds the same path.
    std::fs::remove_file(old.socket_path()).unwrap();
    let new = gpu_plugin(dir.path()).endpoint("/new").serve().await.unwrap();

    old.shutdown().await.unwrap();

    assert!(is_socket(new.socket_path()));
    assert_eq!(get_info(new.socket_path()).await.endpoint, "/new");
}

#[tokio::test]
async fn dropping_the_registrar_removes_its_socket_and_stops_serving() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = gpu_plugin(dir.path()).serve().await.unwrap();
    let path: PathBuf = registrar.socket_path().to_path_buf();
    let mut kept = client(&path).await;

    drop(registrar);

    assert!(!path.exists());
    kpm_test_support::within("the server stops answering", async {
        while kept.get_info(InfoRequest {}).await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test]
async fn dropping_an_old_instance_leaves_the_newer_instance_s_socket() {
    let dir = tempfile::tempdir().unwrap();
    let old = gpu_plugin(dir.path()).serve().await.unwrap();
    std::fs::remove_file(old.socket_path()).unwrap();
    let new = gpu_plugin(dir.path()).endpoint("/new").serve().await.unwrap();

    drop(old);

    assert_eq!(get_info(new.socket_path()).await.endpoint, "/new");
}
