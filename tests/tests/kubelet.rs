//! `kpm::Kubelet`, the composition `kpm run` runs: the kubelet's three
//! handlers behind one manager, real plugins of each type on real sockets,
//! and the handlers' views on the handle. Also: a DRA endpoint outside the
//! root refused alike by an inspection (what `kpm probe` runs, telling the
//! plugin nothing) and by the running kubelet, disabled kinds, the fd
//! budget, and every setting at and beyond its bound.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kpm::{BasicHandler, Kubelet, PluginKind};
use kpm_registrar::stub::{StubCsiDriver, StubDevicePlugin, StubDraDriver};
use kpm_registrar::{Registrar, RegistrarBuilder};
use kpm_test_support::{DEADLINE, wait_until};
use support::serve_service;

/// A kubelet running on a temp root until the test ends.
struct Node {
    root: tempfile::TempDir,
    handle: kpm::KubeletHandle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    running: tokio::task::JoinHandle<kpm::Result<()>>,
}

impl Node {
    fn start(builder: impl FnOnce(kpm::KubeletBuilder) -> kpm::KubeletBuilder) -> Self {
        let root = tempfile::tempdir().unwrap();
        let kubelet =
            builder(Kubelet::builder().root_dir(root.path()).manager(|m| m.liveness(None)))
                .build()
                .unwrap();
        let handle = kubelet.handle();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(kubelet.run(async { drop(stopped.await) }));
        Self { root, handle, stop: Some(stop), running }
    }

    fn registry(&self) -> std::path::PathBuf {
        self.root.path().join(kpm::api::PLUGINS_REGISTRY_DIR_NAME)
    }

    /// Serves `builder`'s plugin in the registry; returns it with what it was told.
    async fn plugin(
        &self,
        builder: RegistrarBuilder,
    ) -> (Registrar, kpm_registrar::RegistrationStatus) {
        wait_until("the registry directory is created", || self.registry().is_dir()).await;
        let plugin = builder.socket_dir(self.registry()).serve().await.unwrap();
        let status = plugin.wait_for_status(DEADLINE).await.unwrap();
        (plugin, status)
    }

    /// Serves the CSI driver `csi.example.com` (node id `node-1`) and its
    /// registrar; returns both once it is told it registered.
    async fn csi_plugin(&self) -> (tokio::task::JoinHandle<()>, Registrar) {
        let csi_socket = self.root.path().join("plugins/csi.example.com/csi.sock");
        let service =
            serve_service(&csi_socket, StubCsiDriver::new("csi.example.com", "node-1").routes())
                .await;
        let (registrar, told) = self
            .plugin(
                Registrar::builder(kpm::api::CSI_PLUGIN, "csi.example.com")
                    .versions(["1.0.0"])
                    .endpoint(&csi_socket),
            )
            .await;
        assert!(told.plugin_registered, "{told:?}");
        (service, registrar)
    }

    async fn stop(mut self) {
        drop(self.stop.take());
        self.running.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_of_all_three_types_register_and_show_in_the_handlers_views() {
    let node = Node::start(|builder| builder);
    let root = node.root.path().to_path_buf();

    let (gpus, _devices) = StubDevicePlugin::new([("gpu-0", "Healthy"), ("gpu-1", "Healthy")]);
    let (_gpu, told) = node
        .plugin(
            Registrar::builder(kpm::api::DEVICE_PLUGIN, "example.com/gpu").routes(gpus.routes()),
        )
        .await;
    assert!(told.plugin_registered, "{told:?}");

    let _csi = node.csi_plugin().await;

    let dra_socket = root.join("plugins/gpu.example.com/dra.sock");
    let _dra_service = serve_service(&dra_socket, StubDraDriver::new().routes()).await;
    let (_dra, told) = node
        .plugin(
            Registrar::builder(kpm::api::DRA_PLUGIN, "gpu.example.com")
                .versions([kpm::api::DRA_V1_SERVICE])
                .endpoint(&dra_socket),
        )
        .await;
    assert!(told.plugin_registered, "{told:?}");

    let handle = &node.handle;
    wait_until("both GPUs are reported healthy", || {
        handle.devices().resource("example.com/gpu").is_some_and(|r| r.healthy == 2)
    })
    .await;
    assert_eq!(handle.csi_drivers().list()[0].name, "csi.example.com");
    let node_info = handle.node_info().expect("the default node-info sink is in memory");
    assert_eq!(node_info.csinode.drivers[0].node_id, "node-1");
    assert_eq!(handle.dra().drivers()[0].name, "gpu.example.com");
    wait_until("all three are registered", || {
        let status = handle.manager().status();
        status.len() == 3 && status.iter().all(|s| s.state == kpm::PluginState::Registered)
    })
    .await;
    node.stop().await;
}

/// A DRA driver's health service: one device, `Healthy` for 1 s, then
/// nothing more.
struct OneHealthReport;

#[tonic::async_trait]
impl kpm_api::dra_health::v1::dra_resource_health_server::DraResourceHealth for OneHealthReport {
    type NodeWatchResourcesStream = std::pin::Pin<
        Box<
            dyn tokio_stream::Stream<
                    Item = Result<
                        kpm_api::dra_health::v1::NodeWatchResourcesResponse,
                        tonic::Status,
                    >,
                > + Send,
        >,
    >;

    async fn node_watch_resources(
        &self,
        _: tonic::Request<kpm_api::dra_health::v1::NodeWatchResourcesRequest>,
    ) -> Result<tonic::Response<Self::NodeWatchResourcesStream>, tonic::Status> {
        use kpm_api::dra_health::v1 as health;
        use tokio_stream::StreamExt as _;
        let report = health::NodeWatchResourcesResponse {
            devices: vec![health::DeviceHealth {
                device: Some(health::DeviceIdentifier {
                    pool_name: "pool".into(),
                    device_name: "gpu-0".into(),
                }),
                health: health::HealthStatus::Healthy.into(),
                last_updated_time: 0,
                health_check_timeout_seconds: 1,
                message: String::new(),
            }],
        };
        let stream = tokio_stream::once(Ok(report)).chain(tokio_stream::pending());
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

/// The DRA manager publishes its device health changes on the manager's
/// bus: the facade hands it over, so they reach `subscribe` (the status
/// API's event stream) and the counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_device_health_changes_reach_the_managers_events() {
    let node = Node::start(|builder| builder);
    let mut events = node.handle.manager().subscribe();
    let dra_socket = node.root.path().join("plugins/gpu.example.com/dra.sock");
    let health = kpm_api::dra_health::v1::dra_resource_health_server::DraResourceHealthServer::new(
        OneHealthReport,
    );
    let _dra_service =
        serve_service(&dra_socket, StubDraDriver::new().routes().add_service(health)).await;
    let (_dra, told) = node
        .plugin(
            Registrar::builder(kpm::api::DRA_PLUGIN, "gpu.example.com")
                .versions([kpm::api::DRA_V1_SERVICE, kpm::api::DRA_HEALTH_V1_SERVICE])
                .endpoint(&dra_socket),
        )
        .await;
    assert!(told.plugin_registered, "{told:?}");

    let mut changes = Vec::new();
    while changes.len() < 2 {
        let event = kpm_test_support::within("two health changes", events.recv()).await.unwrap();
        if let kpm::PluginEvent::DraDeviceHealthChanged {
            driver, device, health, expired, ..
        } = event
        {
            assert_eq!((driver.as_str(), device.as_str()), ("gpu.example.com", "gpu-0"));
            changes.push((health, expired));
        }
    }
    assert_eq!(changes, [("Healthy".to_owned(), false), ("Unknown".to_owned(), true)]);
    assert_eq!(node.handle.manager().stats().events.device_health_changes, 2);
    assert_eq!(node.handle.dra().drivers()[0].devices[0].health, "Unknown");
    node.stop().await;
}

/// Liveness probes a device plugin serving on its registration socket over
/// the device manager's `ListAndWatch` connection (the facade hands it
/// over), and keeps connections of its own only for a plugin no handler
/// holds one to: a CSI driver's registrar and its endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_share_the_device_plugins_connection_and_keep_two_for_a_csi_driver() {
    let liveness = kpm::LivenessConfig::default()
        .period(Some(Duration::from_millis(100)))
        .timeout(Duration::from_millis(100));
    let node = Node::start(|builder| builder.manager(|m| m.liveness(Some(liveness))));
    let handle = node.handle.clone();
    let stats = move || handle.manager().stats().liveness.expect("liveness is on");

    let (gpus, _devices) = StubDevicePlugin::new([("gpu-0", "Healthy")]);
    let (_gpu, told) = node
        .plugin(
            Registrar::builder(kpm::api::DEVICE_PLUGIN, "example.com/gpu").routes(gpus.routes()),
        )
        .await;
    assert!(told.plugin_registered, "{told:?}");
    wait_until("5 probes of the device plugin", || stats().probes >= 5).await;
    assert_eq!(stats().probe_connections, 0, "probed over the ListAndWatch connection");

    let _csi = node.csi_plugin().await;
    wait_until("a connection kept to each CSI socket", || stats().probe_connections == 2).await;
    let probes = stats().probes;
    wait_until("5 more probes", || stats().probes >= probes + 5).await;
    let stats = stats();
    assert_eq!((stats.probe_connections, stats.failed_probes), (2, 0));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_endpoint_outside_the_root_is_refused_alike_by_the_handler_and_the_running_kubelet() {
    let outside = tempfile::tempdir().unwrap();
    let endpoint = outside.path().join("dra.sock");
    let _service = serve_service(&endpoint, StubDraDriver::new().routes()).await;
    let versions = [kpm::api::DRA_V1_SERVICE.to_owned()];

    let registrar = || {
        Registrar::builder(kpm::api::DRA_PLUGIN, "gpu.example.com")
            .versions(versions.clone())
            .endpoint(&endpoint)
    };

    // What `kpm probe` asks: an inspection, nothing running.
    let probe_root = tempfile::tempdir().unwrap();
    let probed = Kubelet::builder().root_dir(probe_root.path()).build().unwrap();
    let plugin = registrar().socket_dir(outside.path()).serve().await.unwrap();
    let inspection = probed.handle().manager().inspect(plugin.socket_path()).await;
    assert_eq!(inspection.failed_step(), Some(kpm::Step::Validate), "{inspection:?}");
    let refused = match inspection.outcome {
        Err(kpm::ExecutorError::Validate { source, .. }) => source.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(plugin.statuses().is_empty(), "an inspection tells the plugin nothing");

    // What `kpm run` does with the same plugin.
    let node = Node::start(|builder| builder);
    let (_plugin, told) = node.plugin(registrar()).await;
    assert!(!told.plugin_registered);
    let root_of = |text: &str, root: &Path| text.replace(&root.display().to_string(), "<root>");
    let told = root_of(&told.error, node.root.path());
    let refused = root_of(&refused, probe_root.path());
    assert!(told.ends_with(&format!("validation failed with err: {refused}")), "{told}");
    assert!(refused.contains(&format!("{:?}", endpoint.display().to_string())), "{refused}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_kind_has_no_handler_and_its_plugins_are_told_so() {
    let node = Node::start(|builder| builder.disable(PluginKind::Device));
    let (plugin, told) =
        node.plugin(Registrar::builder(kpm::api::DEVICE_PLUGIN, "example.com/gpu")).await;
    assert!(!told.plugin_registered);
    assert!(told.error.contains("no handler registered for plugin type: DevicePlugin"), "{told:?}");
    assert!(!node.root.path().join("device-plugins/kubelet.sock").exists());

    let probed = Kubelet::builder().disable(PluginKind::Device).build().unwrap();
    let inspection = probed.handle().manager().inspect(plugin.socket_path()).await;
    assert!(
        matches!(
            &inspection.outcome,
            Err(kpm::ExecutorError::UnknownPluginType { plugin_type, .. }) if plugin_type == "DevicePlugin"
        ),
        "{inspection:?}"
    );
    assert_eq!(inspection.info.unwrap().name, "example.com/gpu", "what GetInfo answered");
    node.stop().await;
}

/// Whether `result` is the refusal of a second handler for `plugin_type`.
fn refused_as_taken<T>(result: &kpm::Result<T>, plugin_type: &str) -> bool {
    matches!(
        result,
        Err(kpm::Error::AddHandler {
            plugin_type: named,
            source: kpm::ReconcilerError::HandlerExists { .. },
        }) if named == plugin_type
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_for_a_type_the_kubelet_serves_is_refused_and_the_kubelets_handler_stays() {
    let node = Node::start(|builder| builder);
    let basic = || Arc::new(BasicHandler::new(kpm::api::CSI_PLUGIN));
    let added = node.handle.manager().add_handler(kpm::api::CSI_PLUGIN, basic());
    assert!(refused_as_taken(&added, kpm::api::CSI_PLUGIN));

    // The kubelet's CSI handler registers the driver: it is in its store.
    let _csi = node.csi_plugin().await;
    let drivers = node.handle.csi_drivers().list();
    assert_eq!(drivers.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["csi.example.com"]);

    // A type of its own is added once, then refused too.
    let other = || Arc::new(BasicHandler::new("OtherPlugin"));
    node.handle.manager().add_handler("OtherPlugin", other()).unwrap();
    assert!(refused_as_taken(
        &node.handle.manager().add_handler("OtherPlugin", other()),
        "OtherPlugin"
    ));
    node.stop().await;
}

#[test]
fn a_builder_refuses_a_type_given_twice_or_one_the_kubelet_serves() {
    let basic = |plugin_type: &str| Arc::new(BasicHandler::new(plugin_type));
    let csi = kpm::api::CSI_PLUGIN;
    let built = Kubelet::builder().manager(|m| m.handler(csi, basic(csi))).build();
    assert!(refused_as_taken(&built, csi));
    // A disabled kind's type is free for a handler of one's own.
    Kubelet::builder()
        .disable(PluginKind::Csi)
        .manager(|m| m.handler(csi, basic(csi)))
        .build()
        .unwrap();

    let built = kpm::PluginManager::builder()
        .handler("OtherPlugin", basic("OtherPlugin"))
        .handler("OtherPlugin", basic("OtherPlugin"))
        .build();
    assert!(refused_as_taken(&built, "OtherPlugin"));
}

#[tokio::test]
async fn kubelet_sock_is_served_while_running_and_removed_after() {
    let node = Node::start(|builder| builder);
    let kubelet_sock = node.root.path().join("device-plugins/kubelet.sock");
    wait_until("kubelet.sock is served", || kubelet_sock.exists()).await;
    node.stop().await;
    assert!(!kubelet_sock.exists());
}

/// A kubelet given an fd budget of its own pays from it, not from the
/// process-wide one: a registration waits while the budget is spent and
/// goes on once a permit comes back; the device plugin's endpoint
/// connection, the DRA driver's and a connection `kubelet.sock` accepts each
/// hold one of its permits, and every permit is back once the kubelet stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_given_an_fd_budget_pays_every_connection_from_it() {
    let budget = kpm::transport::fd::FdBudget::new(8, None);
    let mut spent = Vec::new();
    for _ in 0..budget.size() {
        spent.push(budget.acquire().await);
    }
    let node = Node::start(|builder| builder.fd_budget(budget.clone()));
    wait_until("the registry directory is created", || node.registry().is_dir()).await;
    let (gpus, _devices) = StubDevicePlugin::new([("gpu-0", "Healthy")]);
    let plugin = Registrar::builder(kpm::api::DEVICE_PLUGIN, "example.com/gpu")
        .routes(gpus.routes())
        .socket_dir(node.registry())
        .serve()
        .await
        .unwrap();
    wait_until("the registration waits for a permit", || budget.stats().permit_waits >= 1).await;
    let status = node.handle.manager().status();
    assert!(status.iter().all(|s| s.state != kpm::PluginState::Registered), "{status:?}");

    drop(spent);
    let told = plugin.wait_for_status(DEADLINE).await.unwrap();
    assert!(told.plugin_registered, "{told:?}");
    wait_until("only the endpoint connection is held", || budget.in_use() == 1).await;
    assert_eq!(node.handle.manager().fd_budget().stats(), budget.stats(), "the same budget");

    let dra_socket = node.root.path().join("plugins/gpu.example.com/dra.sock");
    let _dra_service = serve_service(&dra_socket, StubDraDriver::new().routes()).await;
    let (_dra, told) = node
        .plugin(
            Registrar::builder(kpm::api::DRA_PLUGIN, "gpu.example.com")
                .versions([kpm::api::DRA_V1_SERVICE])
                .endpoint(&dra_socket),
        )
        .await;
    assert!(told.plugin_registered, "{told:?}");
    wait_until("and the DRA driver's connection", || budget.in_use() == 2).await;

    let kubelet_sock = node.root.path().join("device-plugins/kubelet.sock");
    let accepted = tokio::net::UnixStream::connect(&kubelet_sock).await.unwrap();
    wait_until("kubelet.sock's connection holds a permit", || budget.in_use() == 3).await;
    drop(accepted);
    wait_until("released when it closes", || budget.in_use() == 2).await;

    node.stop().await;
    wait_until("every permit is back", || budget.in_use() == 0).await;
    drop(plugin);
}

/// Every duration setting of the builder, set to `value`.
fn with_every_duration(value: Duration) -> Vec<(&'static str, kpm::KubeletBuilder)> {
    let builder = || Kubelet::builder();
    vec![
        ("watcher_config", builder().manager(|m| m.resync_period(value))),
        (
            "reconciler_config",
            builder().manager(|m| {
                m.reconciler_config(kpm::ReconcilerConfig::default().reconcile_period(value))
            }),
        ),
        ("shutdown_grace", builder().manager(|m| m.shutdown_grace(value))),
        (
            "liveness",
            builder()
                .manager(|m| m.liveness(Some(kpm::LivenessConfig::default().period(Some(value))))),
        ),
        (
            "executor_config",
            builder().manager(|m| {
                m.executor_config(kpm::ExecutorConfig::default().handler_timeout(value))
            }),
        ),
        (
            "csi_config",
            builder().csi_config(kpm::csi::CsiConfig::default().node_get_info_timeout(value)),
        ),
        (
            "device_config",
            builder().device_config(kpm::device::DeviceConfig::default().grace_period(value)),
        ),
        ("dra_config", builder().dra_config(kpm::dra::DraConfig::default().cleanup_grace(value))),
    ]
}

#[test]
fn settings_out_of_range_are_refused_naming_the_setting() {
    for capacity in [0, kpm::MAX_EVENT_CAPACITY + 1, usize::MAX] {
        let err = Kubelet::builder().manager(|m| m.event_capacity(capacity)).build().unwrap_err();
        assert!(
            matches!(err, kpm::Error::InvalidConfig { setting: "event_capacity", .. }),
            "{err}"
        );
    }
    assert!(
        Kubelet::builder().manager(|m| m.event_capacity(kpm::MAX_EVENT_CAPACITY)).build().is_ok()
    );

    let longest = kpm::api::MAX_CONFIG_DURATION;
    for too_long in
        [longest + Duration::from_nanos(1), Duration::from_secs(u64::MAX), Duration::MAX]
    {
        for (setting, builder) in with_every_duration(too_long) {
            match builder.build() {
                Err(kpm::Error::InvalidConfig { setting: named, reason }) => {
                    assert_eq!(named, setting, "{reason}");
                    assert!(reason.contains("365 days"), "{setting}: {reason}");
                }
                other => panic!("{setting} = {too_long:?}: {other:?}"),
            }
        }
    }
    for (setting, builder) in with_every_duration(longest) {
        assert!(builder.build().is_ok(), "{setting} = {longest:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_kubelet_with_the_longest_settings_runs_and_stops() {
    let root = tempfile::tempdir().unwrap();
    let longest = kpm::api::MAX_CONFIG_DURATION;
    let kubelet = Kubelet::builder()
        .root_dir(root.path())
        .manager(|m| {
            m.resync_period(longest)
                .reconciler_config(kpm::ReconcilerConfig::default().reconcile_period(longest))
                .shutdown_grace(longest)
                .liveness(Some(kpm::LivenessConfig::default().period(Some(longest))))
        })
        .csi_config(kpm::csi::CsiConfig::default().node_get_info_timeout(longest))
        .device_config(kpm::device::DeviceConfig::default().grace_period(longest))
        .dra_config(kpm::dra::DraConfig::default().cleanup_grace(longest))
        .build()
        .unwrap();
    // Three of the longest periods go by on paused time: no timer overflows.
    let running = tokio::spawn(kubelet.run(tokio::time::sleep(longest * 3)));
    running.await.unwrap().unwrap();
}
