//! Device tracking against fake device plugins: health changes streamed
//! through `ListAndWatch`, a plugin that crashes or ends its stream (devices
//! unhealthy at once, resource removed after a short real grace period),
//! replacement by a newer registration in both orders, and shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kpm_cache::PluginDetails;
use kpm_cache::PluginEndpoint;
use kpm_cache::PluginHandler;
use kpm_device::{AllocateRequest, DeviceConfig, DeviceError, DeviceManager, KubeletSocket};
use support::{
    Behaviour, DEADLINE, GPU, Served, device, healthy, ids, serve, wait_for_counts, wait_until,
};
use tempfile::TempDir;
use tokio::time::Instant;
use tonic::Status;

/// A device plugin as the plugin watcher finds it: served on its
/// registration socket, having advertised no endpoint.
fn on_socket(socket: impl Into<std::path::PathBuf>) -> PluginEndpoint {
    PluginEndpoint::RegistrationSocket(socket.into())
}

/// Short enough to wait for, long enough to observe the resource before.
const GRACE: Duration = Duration::from_millis(300);

struct Setup {
    dir: TempDir,
    manager: Arc<DeviceManager>,
}

fn setup(grace_period: Duration) -> Setup {
    let config = DeviceConfig::default()
        .dial_timeout(DEADLINE)
        .call_timeout(DEADLINE)
        .grace_period(grace_period);
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

    async fn register(&self, served: &Served) {
        let handler: &dyn PluginHandler = &*self.manager;
        handler
            .register(&PluginDetails::new(
                GPU,
                on_socket(served.endpoint()),
                ["v1beta1".to_owned()],
            ))
            .await
            .unwrap();
    }

    async fn deregister(&self, served: &Served) {
        let handler: &dyn PluginHandler = &*self.manager;
        handler
            .deregister(&PluginDetails::new(
                GPU,
                on_socket(served.endpoint()),
                Vec::<String>::new(),
            ))
            .await;
    }

    async fn wait_until_removed(&self) {
        wait_until(&self.manager, "the resource is removed", <[_]>::is_empty).await;
    }
}

#[tokio::test]
async fn health_changes_streamed_through_list_and_watch_are_reflected() {
    let setup = setup(DEADLINE);
    let plugin = setup.serve("gpu.sock", healthy(&["d1", "d2"])).await;
    setup.register(&plugin).await;
    wait_for_counts(&setup.manager, GPU, 2, 0).await;

    plugin.plugin.update(vec![device("d1", "Unhealthy", &[]), device("d2", "Healthy", &[])]).await;
    let status = wait_for_counts(&setup.manager, GPU, 1, 1).await;
    assert_eq!(status.devices[0].health, "Unhealthy");

    plugin.plugin.update(vec![device("d1", "Healthy", &[0]), device("d2", "Healthy", &[1])]).await;
    let status = wait_for_counts(&setup.manager, GPU, 2, 0).await;
    assert_eq!(status.devices[1].numa_nodes, [1]);

    // An update replaces the set: d1 is gone, d3 is new.
    plugin.plugin.update(vec![device("d3", "Healthy", &[]), device("d2", "Unhealthy", &[])]).await;
    let status = wait_for_counts(&setup.manager, GPU, 1, 1).await;
    assert_eq!(ids(&status), ["d2", "d3"]);

    plugin.plugin.update(Vec::new()).await;
    let status = wait_for_counts(&setup.manager, GPU, 0, 0).await;
    assert_eq!(status.endpoint, plugin.endpoint(), "a plugin without devices stays connected");
}

#[tokio::test]
async fn a_crashed_plugin_has_its_devices_unhealthy_at_once_and_its_resource_removed_after_the_grace_period()
 {
    let setup = setup(GRACE);
    let plugin = setup.serve("gpu.sock", healthy(&["d1", "d2", "d3"])).await;
    setup.register(&plugin).await;
    wait_for_counts(&setup.manager, GPU, 3, 0).await;

    let crashed_at = Instant::now();
    let crashed_at_wall = SystemTime::now();
    plugin.crash();

    let status = wait_for_counts(&setup.manager, GPU, 0, 3).await;
    assert_eq!(status.endpoint, "");
    assert!(status.devices.iter().all(|device| device.health == "Unhealthy"));
    let removal_at = status.removal_at.expect("the grace period has started");
    assert!(removal_at >= crashed_at_wall + GRACE, "{removal_at:?}");
    assert!(matches!(
        setup.manager.allocate(GPU, AllocateRequest::default()).await,
        Err(DeviceError::NoEndpoint { .. })
    ));

    setup.wait_until_removed().await;
    assert!(crashed_at.elapsed() >= GRACE, "removed after {:?}", crashed_at.elapsed());
}

#[tokio::test]
async fn a_plugin_ending_its_stream_or_failing_it_counts_as_gone() {
    let setup = setup(DEADLINE);
    let ending = setup.serve("a.sock", healthy(&["a"])).await;
    setup.register(&ending).await;
    wait_for_counts(&setup.manager, GPU, 1, 0).await;
    ending.plugin.end_streams();
    let status = wait_for_counts(&setup.manager, GPU, 0, 1).await;
    assert!(status.removal_at.is_some());

    let failing = setup.serve("b.sock", healthy(&["b"])).await;
    setup.register(&failing).await;
    let status = wait_for_counts(&setup.manager, GPU, 1, 0).await;
    assert_eq!(status.removal_at, None, "the new registration cancelled the removal");
    failing.plugin.fail_streams(Status::internal("device driver reset")).await;
    let status = wait_for_counts(&setup.manager, GPU, 0, 1).await;
    assert!(status.removal_at.is_some());
}

#[tokio::test]
async fn a_plugin_registering_again_within_the_grace_period_keeps_its_resource() {
    let setup = setup(GRACE);
    let kubelet = setup.kubelet_sock().await;
    let old = setup.serve("gpu.sock", healthy(&["d1", "d2"])).await;
    old.register(kubelet.socket_path(), GPU).await.unwrap();
    wait_for_counts(&setup.manager, GPU, 2, 0).await;

    old.crash();
    wait_for_counts(&setup.manager, GPU, 0, 2).await;
    let new = setup.serve("gpu.sock", healthy(&["d1", "d2"])).await;
    new.register(kubelet.socket_path(), GPU).await.unwrap();

    let status = wait_for_counts(&setup.manager, GPU, 2, 0).await;
    assert_eq!(status.removal_at, None);
    assert_eq!(status.endpoint, new.endpoint());
    // That the cancelled timer never fires is checked on paused time in the
    // manager's unit tests.
}

#[tokio::test]
async fn a_newer_registration_replaces_the_endpoint_and_the_old_stream_ending_later_changes_nothing()
 {
    let setup = setup(GRACE);
    let old = setup.serve("old.sock", healthy(&["o1", "o2"])).await;
    setup.register(&old).await;
    wait_for_counts(&setup.manager, GPU, 2, 0).await;

    let new = setup.serve("new.sock", healthy(&["n1"])).await;
    setup.register(&new).await;

    let status = wait_for_counts(&setup.manager, GPU, 1, 0).await;
    assert_eq!((status.endpoint.as_str(), ids(&status)), (new.endpoint().as_str(), vec!["n1"]));
    old.plugin.wait_until_streams_are_closed().await;
    old.plugin.end_streams();
    old.crash();
    new.plugin.update(healthy(&["n1", "n2"])).await;
    let status = wait_for_counts(&setup.manager, GPU, 2, 0).await;
    assert_eq!((status.endpoint, status.removal_at), (new.endpoint(), None));
}

#[tokio::test]
async fn deregistering_the_old_endpoint_after_a_newer_registration_keeps_the_new_one() {
    let setup = setup(GRACE);
    let old = setup.serve("old.sock", healthy(&["o1"])).await;
    let new = setup.serve("new.sock", healthy(&["n1", "n2"])).await;
    setup.register(&old).await;
    setup.register(&new).await;
    wait_for_counts(&setup.manager, GPU, 2, 0).await;

    setup.deregister(&old).await;

    let status = setup.manager.resource(GPU).unwrap();
    assert_eq!((status.endpoint, status.healthy, status.removal_at), (new.endpoint(), 2, None));
    assert_eq!(new.plugin.open_streams(), 1);
    new.plugin.update(healthy(&["n3"])).await;
    wait_until(&setup.manager, "the new endpoint still streams", |all| {
        all.first().is_some_and(|status| ids(status) == ["n3"])
    })
    .await;
}

#[tokio::test]
async fn a_registration_after_the_old_endpoint_was_deregistered_takes_over() {
    let setup = setup(GRACE);
    let old = setup.serve("old.sock", healthy(&["o1"])).await;
    let new = setup.serve("new.sock", healthy(&["n1", "n2"])).await;
    setup.register(&old).await;
    wait_for_counts(&setup.manager, GPU, 1, 0).await;
    setup.deregister(&old).await;
    wait_for_counts(&setup.manager, GPU, 0, 1).await;

    setup.register(&new).await;

    let status = wait_for_counts(&setup.manager, GPU, 2, 0).await;
    assert_eq!((status.endpoint, status.removal_at), (new.endpoint(), None));
}

#[tokio::test]
async fn shutdown_closes_every_endpoint_stream_and_refuses_new_registrations() {
    let setup = setup(GRACE);
    let gpu = setup.serve("gpu.sock", healthy(&["g"])).await;
    let nic = setup.serve("nic.sock", healthy(&["n"])).await;
    setup.register(&gpu).await;
    let handler: &dyn PluginHandler = &*setup.manager;
    handler
        .register(&PluginDetails::new(
            "example.org/nic",
            on_socket(nic.endpoint()),
            ["v1beta1".to_owned()],
        ))
        .await
        .unwrap();
    wait_until(&setup.manager, "both resources have a healthy device", |all| {
        all.len() == 2 && all.iter().all(|status| status.healthy == 1)
    })
    .await;

    setup.manager.shutdown().await;

    gpu.plugin.wait_until_streams_are_closed().await;
    nic.plugin.wait_until_streams_are_closed().await;
    for status in setup.manager.resources() {
        assert_eq!((status.endpoint.as_str(), status.healthy, status.unhealthy), ("", 0, 1));
    }
    let err = handler
        .register(&PluginDetails::new(GPU, on_socket(gpu.endpoint()), ["v1beta1".to_owned()]))
        .await
        .unwrap_err();
    assert!(err.to_string().starts_with("device manager is shut down"), "{err}");
}
