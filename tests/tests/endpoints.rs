//! A plugin's service socket removed while its registration socket stays
//! (kubernetes #132660: the kubelet keeps dialling the deleted path): kpm
//! deregisters the plugin, tells it nothing (node-driver-registrar exits on
//! `false`), and registers it again once a server binds the path. Real
//! plugins of each type on real sockets, the real inotify watch.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kpm::{Kubelet, PluginState};
use kpm_registrar::stub::{StubCsiDriver, StubDevicePlugin, StubDraDriver};
use kpm_registrar::{Registrar, RegistrarBuilder};
use kpm_test_support::{DEADLINE, wait_until};
use support::serve_service;

const CSI_SOCKET: &str = "plugins/csi.example.com/csi.sock";

fn csi_routes() -> tonic::service::Routes {
    StubCsiDriver::new("csi.example.com", "node-1").routes()
}

/// A kubelet, with liveness on (probes far off: the endpoint watch alone
/// must find the removal), running on a temp root until the test ends.
struct Node {
    root: tempfile::TempDir,
    handle: kpm::KubeletHandle,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Node {
    fn start() -> Self {
        let root = tempfile::tempdir().unwrap();
        let liveness = kpm::LivenessConfig::default().period(Some(Duration::from_secs(3600)));
        let kubelet = Kubelet::builder()
            .root_dir(root.path())
            .manager(|m| m.liveness(Some(liveness)))
            .build()
            .unwrap();
        let handle = kubelet.handle();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(kubelet.run(async { drop(stopped.await) }));
        Self { root, handle, _stop: stop }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    async fn register(&self, builder: RegistrarBuilder) -> Registrar {
        let registry = self.path(kpm::api::PLUGINS_REGISTRY_DIR_NAME);
        wait_until("the registry directory is created", || registry.is_dir()).await;
        let plugin = builder.socket_dir(registry).serve().await.unwrap();
        let told = plugin.wait_for_status(DEADLINE).await.unwrap();
        assert!(told.plugin_registered, "{told:?}");
        plugin
    }

    /// Serves the CSI driver `csi.example.com` on `endpoint` and registers
    /// it; returns the service's task and its registrar.
    async fn csi_driver(&self, endpoint: &Path) -> (tokio::task::JoinHandle<()>, Registrar) {
        let service = serve_service(endpoint, csi_routes()).await;
        let builder = Registrar::builder(kpm::api::CSI_PLUGIN, "csi.example.com")
            .versions(["1.0.0"])
            .endpoint(endpoint);
        (service, self.register(builder).await)
    }

    fn state(&self, plugin: &Registrar) -> Option<(PluginState, Option<String>)> {
        let status = self.handle.manager().status();
        let status = status.into_iter().find(|s| s.socket_path == plugin.socket_path())?;
        Some((status.state, status.last_error))
    }

    /// Waits until `plugin` is held for its removed endpoint, then until a
    /// new server at `endpoint` has it registered again, told `true` twice
    /// and never `false`.
    async fn held_then_registered_again(
        &self,
        plugin: &Registrar,
        endpoint: &Path,
        routes: impl FnOnce() -> tonic::service::Routes,
    ) -> tokio::task::JoinHandle<()> {
        wait_until("the plugin is held for its endpoint", || {
            self.state(plugin).is_some_and(|(state, error)| {
                state == PluginState::EndpointGone
                    && error.is_some_and(|e| e.contains(&endpoint.display().to_string()))
            })
        })
        .await;
        let service = serve_service(endpoint, routes()).await;
        wait_until(
            kpm_test_support::lazy(|| {
                format!(
                    "the plugin is registered again: {:?} {:?} {:?}",
                    self.handle.manager().status(),
                    self.handle.manager().stats().liveness,
                    plugin.statuses()
                )
            }),
            || {
                self.state(plugin).is_some_and(|(state, _)| state == PluginState::Registered)
                    && plugin.statuses().len() == 2
            },
        )
        .await;
        assert!(plugin.statuses().iter().all(|told| told.plugin_registered), "never told false");
        service
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csi_driver_whose_socket_is_removed_is_deregistered_until_it_is_served_again() {
    let node = Node::start();
    let endpoint = node.path(CSI_SOCKET);
    let (service, plugin) = node.csi_driver(&endpoint).await;
    assert_eq!(node.handle.csi_drivers().len(), 1);

    // The driver still serves, on a path nobody can dial any more.
    std::fs::remove_file(&endpoint).unwrap();
    wait_until("the driver is gone", || node.handle.csi_drivers().is_empty()).await;
    let node_info = node.handle.node_info().unwrap();
    assert!(node_info.csinode.drivers.is_empty(), "its CSINode entry went too");

    service.abort();
    let _service = node.held_then_registered_again(&plugin, &endpoint, csi_routes).await;
    assert_eq!(node.handle.csi_drivers().list()[0].endpoint, endpoint.display().to_string());
    assert_eq!(node.handle.manager().stats().liveness.unwrap().endpoints_gone, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_plugin_whose_endpoint_is_removed_is_deregistered_until_it_is_served_again() {
    let node = Node::start();
    // Not in device-plugins/: serving kubelet.sock empties it.
    let endpoint = node.path("plugins/example.com-gpu/gpu.sock");
    let routes = || StubDevicePlugin::new([("gpu-0", "Healthy")]).0.routes();
    let service = serve_service(&endpoint, routes()).await;
    let plugin = node
        .register(
            Registrar::builder(kpm::api::DEVICE_PLUGIN, "example.com/gpu").endpoint(&endpoint),
        )
        .await;
    let healthy = |n| {
        move |node: &Node| {
            node.handle.devices().resource("example.com/gpu").is_some_and(|r| r.healthy == n)
        }
    };
    wait_until("the GPU is healthy", || healthy(1)(&node)).await;

    std::fs::remove_file(&endpoint).unwrap();
    service.abort();
    wait_until("its devices are unhealthy", || healthy(0)(&node)).await;
    let _service = node.held_then_registered_again(&plugin, &endpoint, routes).await;
    wait_until("the GPU is healthy again", || healthy(1)(&node)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_instance_whose_endpoint_is_removed_goes_and_the_other_stays() {
    let node = Node::start();
    let endpoint = |uid: &str| node.path(&format!("plugins/gpu.example.com/dra-{uid}.sock"));
    let instance = |uid: &str| {
        Registrar::builder(kpm::api::DRA_PLUGIN, "gpu.example.com")
            .versions([kpm::api::DRA_V1_SERVICE])
            .endpoint(endpoint(uid))
            .rolling_update_uid(uid)
    };
    let service_a = serve_service(&endpoint("a"), StubDraDriver::new().routes()).await;
    let _service_b = serve_service(&endpoint("b"), StubDraDriver::new().routes()).await;
    let plugin_a = node.register(instance("a")).await;
    let _plugin_b = node.register(instance("b")).await;
    let endpoints = || -> Vec<String> {
        let drivers = node.handle.dra().drivers();
        drivers.iter().flat_map(|d| d.instances.iter().map(|i| i.endpoint.clone())).collect()
    };
    wait_until("both instances are registered", || endpoints().len() == 2).await;

    std::fs::remove_file(endpoint("a")).unwrap();
    let b = endpoint("b").display().to_string();
    wait_until("only instance b is left", || endpoints() == [b.clone()]).await;
    service_a.abort();
    let _service_a = node
        .held_then_registered_again(&plugin_a, &endpoint("a"), || StubDraDriver::new().routes())
        .await;
    wait_until("both instances are back", || endpoints().len() == 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csi_driver_whose_socket_is_replaced_is_registered_anew_at_once() {
    let node = Node::start();
    let endpoint = node.path(CSI_SOCKET);
    let (_old, plugin) = node.csi_driver(&endpoint).await;

    // The monitor learns of a registration after the plugin does: a file
    // replaced before it looks is the one it takes as the endpoint.
    let watched = || node.handle.manager().stats().liveness.unwrap().watched_endpoints;
    wait_until("the endpoint is watched", || watched() == 1).await;
    // A new server's socket renamed over the old one: never a gap.
    let fresh = node.path("plugins/csi.example.com/csi.sock.new");
    let _new = serve_service(&fresh, csi_routes()).await;
    std::fs::rename(&fresh, &endpoint).unwrap();
    wait_until("the driver is registered anew", || plugin.statuses().len() == 2).await;
    assert!(plugin.statuses().iter().all(|told| told.plugin_registered));
    let stats = node.handle.manager().stats().liveness.unwrap();
    assert_eq!((stats.endpoints_gone, stats.renewals), (1, 1));
}
