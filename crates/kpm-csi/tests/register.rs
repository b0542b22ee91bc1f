//! The CSI handler against fake CSI drivers on Unix sockets in temp dirs:
//! validation, registration with NodeGetInfo, the node info it publishes,
//! failures and their cleanup, deregistration.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kpm_cache::PluginDetails;
use kpm_cache::PluginEndpoint;
use kpm_cache::PluginHandler;
use kpm_csi::{
    CsiConfig, CsiError, CsiHandler, CsiNode, CsiNodeDriver, DriverNodeInfo, InMemoryNodeInfo,
    NODE_ID_ANNOTATION, NodeInfo,
};
use kpm_test_support::csi::{FakeCsiDriver as FakeDriver, Reply, Served, info, serve};
use kpm_test_support::{DEADLINE, within};
use tempfile::TempDir;
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::Status;

/// An endpoint as a driver advertises it.
fn advertised(endpoint: impl Into<String>) -> PluginEndpoint {
    PluginEndpoint::Advertised(endpoint.into())
}

const DRIVER: &str = "csi.example.com";
const ZONE: &str = "topology.csi.example.com/zone";

struct Setup {
    dir: TempDir,
    sink: Arc<InMemoryNodeInfo>,
    handler: Arc<CsiHandler>,
}

fn setup() -> Setup {
    setup_with_timeout(DEADLINE)
}

fn setup_with_timeout(timeout: Duration) -> Setup {
    let sink = Arc::new(InMemoryNodeInfo::default());
    let handler = CsiHandler::try_new(
        sink.clone(),
        CsiConfig::default().node_get_info_timeout(timeout),
        kpm_transport::fd::budget().clone(),
    )
    .unwrap();
    Setup { dir: tempfile::tempdir().unwrap(), sink, handler: Arc::new(handler) }
}

impl Setup {
    async fn serve(&self, file: &str, driver: FakeDriver) -> Served {
        serve(&self.dir.path().join(file), driver).await
    }

    /// Validates, then registers, like the plugin manager.
    async fn register(&self, name: &str, served: &Served, versions: &[&str]) -> Result<(), String> {
        self.register_at(name, &served.endpoint(), versions).await
    }

    async fn register_at(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[&str],
    ) -> Result<(), String> {
        let handler: &dyn PluginHandler = &*self.handler;
        let plugin = PluginDetails::new(name, advertised(endpoint), versions.iter().copied());
        handler.validate(&plugin).await.map_err(|err| err.to_string())?;
        handler.register(&plugin).await.map_err(|err| err.to_string())
    }

    async fn deregister(&self, name: &str, served: &Served) {
        let handler: &dyn PluginHandler = &*self.handler;
        handler
            .deregister(&PluginDetails::new(
                name,
                advertised(served.endpoint()),
                Vec::<String>::new(),
            ))
            .await;
    }

    fn node(&self) -> NodeInfo {
        self.sink.snapshot()
    }

    fn registered(&self) -> Vec<String> {
        self.handler.drivers().list().into_iter().map(|driver| driver.name).collect()
    }
}

fn strings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn csinode_entry(name: &str, node_id: &str, keys: &[&str], count: Option<i32>) -> CsiNodeDriver {
    CsiNodeDriver {
        name: name.into(),
        node_id: node_id.into(),
        topology_keys: keys.iter().map(|key| (*key).to_owned()).collect(),
        allocatable_count: count,
    }
}

#[tokio::test]
async fn registering_a_driver_publishes_its_node_info_and_closes_the_connection() {
    let setup = setup();
    let served = setup
        .serve("csi.sock", FakeDriver::always(DRIVER, info("node-1", 16, &[(ZONE, "z1")])))
        .await;

    setup.register(DRIVER, &served, &["0.3.0", "v1.2.0", "2.0.0"]).await.unwrap();

    let driver = setup.handler.drivers().get(DRIVER).unwrap();
    assert_eq!(driver.endpoint, served.endpoint());
    assert_eq!(driver.version.to_string(), "1.2.0");
    assert_eq!(
        driver.node,
        Some(DriverNodeInfo {
            node_id: "node-1".into(),
            max_volumes_per_node: 16,
            topology: strings(&[(ZONE, "z1")]),
        })
    );
    assert_eq!(
        setup.node(),
        NodeInfo {
            annotations: strings(&[(NODE_ID_ANNOTATION, r#"{"csi.example.com":"node-1"}"#)]),
            labels: strings(&[(ZONE, "z1")]),
            csinode: CsiNode { drivers: vec![csinode_entry(DRIVER, "node-1", &[ZONE], Some(16))] },
        }
    );
    assert_eq!(served.driver.calls(), 1);
    served.wait_until_no_connection_is_open().await;
}

/// Upstream `TestClientNodeGetInfo`, against a real driver on a socket.
#[tokio::test]
async fn node_get_info_returns_what_the_driver_reports_or_its_error() {
    let setup = setup();
    let topology = [("com.example.csi-topology/zone", "zone1")];
    let ok = setup.serve("ok.sock", FakeDriver::always(DRIVER, info("node1", 16, &topology))).await;
    let failing = setup
        .serve("err.sock", FakeDriver::always(DRIVER, Reply::Fail(Status::internal("grpc error"))))
        .await;

    let got = kpm_csi::node_get_info(&ok.endpoint(), DEADLINE, kpm_transport::fd::budget())
        .await
        .unwrap();
    assert_eq!(
        got,
        DriverNodeInfo {
            node_id: "node1".into(),
            max_volumes_per_node: 16,
            topology: strings(&topology),
        }
    );
    let err = kpm_csi::node_get_info(&failing.endpoint(), DEADLINE, kpm_transport::fd::budget())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CsiError::NodeGetInfo { status, .. } if status.message() == "grpc error")
    );
    assert_eq!(
        err.to_string(),
        format!(
            "NodeGetInfo on {}: rpc error: code = Internal desc = grpc error",
            failing.endpoint()
        )
    );

    // The connection is closed after the call, either way.
    ok.wait_until_no_connection_is_open().await;
    failing.wait_until_no_connection_is_open().await;
}

#[tokio::test]
async fn re_registering_a_name_needs_a_strictly_higher_version() {
    let setup = setup();
    let old = setup.serve("old.sock", FakeDriver::always(DRIVER, info("node-old", 0, &[]))).await;
    let new = setup.serve("new.sock", FakeDriver::always(DRIVER, info("node-new", 0, &[]))).await;
    setup.register(DRIVER, &old, &["v1.1.0"]).await.unwrap();

    for (versions, label) in [(["1.0.9"], "lower"), (["v1.1"], "equal")] {
        let err = setup.register(DRIVER, &new, &versions).await.unwrap_err();
        assert_eq!(
            err,
            format!(
                "validation failed for CSI Driver {DRIVER} at endpoint {}: kubernetes.io/csi: \
                 ValidatePlugin for CSI driver \"{DRIVER}\" failed. Another driver with the same \
                 name is already registered with a higher supported version: \"1.1.0\"",
                new.endpoint()
            ),
            "{label}"
        );
        // RegisterPlugin re-runs the check and returns its error unwrapped.
        let err = setup
            .handler
            .register(&PluginDetails::new(
                DRIVER,
                advertised(new.endpoint()),
                [versions[0].to_owned()],
            ))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "kubernetes.io/csi: RegisterPlugin for CSI driver \"{DRIVER}\" failed. Another \
                 driver with the same name is already registered with a higher supported \
                 version: \"1.1.0\""
            ),
            "{label}"
        );
    }
    assert_eq!(new.driver.calls(), 0, "rejected registrations never reach the driver");
    assert_eq!(setup.handler.drivers().get(DRIVER).unwrap().endpoint, old.endpoint());

    setup.register(DRIVER, &new, &["v1.2.0"]).await.unwrap();
    let driver = setup.handler.drivers().get(DRIVER).unwrap();
    assert_eq!((driver.endpoint, driver.version.to_string()), (new.endpoint(), "1.2.0".into()));
    assert_eq!(setup.node().node_ids_text(), r#"{"csi.example.com":"node-new"}"#);
}

#[tokio::test]
async fn a_failing_node_get_info_removes_the_driver_and_a_retry_succeeds() {
    let setup = setup();
    let old = setup
        .serve("old.sock", FakeDriver::always(DRIVER, info("node-1", 0, &[(ZONE, "z1")])))
        .await;
    let new = setup
        .serve(
            "new.sock",
            FakeDriver::new(
                DRIVER,
                vec![Reply::Fail(Status::unavailable("driver is not ready yet"))],
                info("node-1", 8, &[(ZONE, "z1")]),
            ),
        )
        .await;
    setup.register(DRIVER, &old, &["1.0.0"]).await.unwrap();

    let err = setup.register(DRIVER, &new, &["1.1.0"]).await.unwrap_err();
    assert_eq!(
        err,
        format!(
            "NodeGetInfo on {}: rpc error: code = Unavailable desc = driver is not ready yet",
            new.endpoint()
        )
    );
    // As in the kubelet, the older registration of the name is gone as well.
    assert!(setup.registered().is_empty());
    assert_eq!(setup.node(), NodeInfo { labels: strings(&[(ZONE, "z1")]), ..NodeInfo::default() });

    // The executor retries with backoff; the driver is ready by then.
    setup.register(DRIVER, &new, &["1.1.0"]).await.unwrap();
    assert_eq!(setup.registered(), [DRIVER]);
    assert_eq!(setup.node().csinode.drivers, [csinode_entry(DRIVER, "node-1", &[ZONE], Some(8))]);
    assert_eq!(new.driver.calls(), 2);
}

#[tokio::test]
async fn a_hanging_node_get_info_times_out_after_the_configured_timeout() {
    let timeout = Duration::from_millis(200);
    let setup = setup_with_timeout(timeout);
    let served = setup.serve("csi.sock", FakeDriver::always(DRIVER, Reply::Hang)).await;

    // The driver never answers: registration gives up through the timeout,
    // never before it (no upper bound: `within` only stops a hang).
    let started = Instant::now();
    let plugin = PluginDetails::new(DRIVER, advertised(served.endpoint()), ["1.0.0"]);
    let register = setup.handler.register(&plugin);
    let err = within("NodeGetInfo times out", register).await.unwrap_err();
    let err = *err.downcast::<CsiError>().unwrap();
    let elapsed = started.elapsed();

    assert!(matches!(err, CsiError::NodeGetInfoTimeout { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "NodeGetInfo on {}: no answer within 200ms (context deadline exceeded)",
            served.endpoint()
        )
    );
    assert!(elapsed >= timeout, "gave up after {elapsed:?}");
    assert!(setup.registered().is_empty());
    assert_eq!(setup.node(), NodeInfo::default());
}

#[tokio::test]
async fn an_empty_node_id_is_rejected() {
    let setup = setup();
    let served =
        setup.serve("csi.sock", FakeDriver::always(DRIVER, info("", 0, &[(ZONE, "z1")]))).await;

    let err = setup.register(DRIVER, &served, &["1.0.0"]).await.unwrap_err();

    assert_eq!(err, "error adding CSI driver node info: driverNodeID must not be empty");
    assert!(setup.registered().is_empty());
    assert_eq!(setup.node(), NodeInfo::default());
}

#[tokio::test]
async fn a_driver_whose_topology_collides_with_another_drivers_labels_is_rejected() {
    let setup = setup();
    let first = setup
        .serve("a.sock", FakeDriver::always("a.example.com", info("a", 0, &[(ZONE, "z1")])))
        .await;
    let second = setup
        .serve(
            "b.sock",
            FakeDriver::always("b.example.com", info("b", 0, &[("other", "x"), (ZONE, "z2")])),
        )
        .await;
    setup.register("a.example.com", &first, &["1.0.0"]).await.unwrap();
    let before = setup.node();

    let err = setup.register("b.example.com", &second, &["1.0.0"]).await.unwrap_err();

    assert_eq!(
        err,
        format!(
            "detected topology value collision: driver reported \"{ZONE}\":\"z2\" but existing \
             label is \"{ZONE}\":\"z1\""
        )
    );
    assert_eq!(setup.node(), before, "the first driver's node info is untouched");
    assert_eq!(setup.registered(), ["a.example.com"]);
}

#[tokio::test]
async fn deregistering_removes_the_driver_and_its_entries_but_keeps_its_labels() {
    let setup = setup();
    let a = setup
        .serve("a.sock", FakeDriver::always("a.example.com", info("na", 0, &[(ZONE, "z1")])))
        .await;
    let b = setup
        .serve("b.sock", FakeDriver::always("b.example.com", info("nb", 3, &[("rack", "r1")])))
        .await;
    setup.register("a.example.com", &a, &["1.0.0"]).await.unwrap();
    setup.register("b.example.com", &b, &["1.0.0"]).await.unwrap();
    assert_eq!(setup.node().node_ids_text(), r#"{"a.example.com":"na","b.example.com":"nb"}"#);

    setup.deregister("a.example.com", &a).await;
    assert_eq!(setup.registered(), ["b.example.com"]);
    assert_eq!(
        setup.node(),
        NodeInfo {
            annotations: strings(&[(NODE_ID_ANNOTATION, r#"{"b.example.com":"nb"}"#)]),
            labels: strings(&[(ZONE, "z1"), ("rack", "r1")]),
            csinode: CsiNode {
                drivers: vec![csinode_entry("b.example.com", "nb", &["rack"], Some(3))]
            },
        }
    );

    setup.deregister("b.example.com", &b).await;
    assert!(setup.registered().is_empty());
    assert_eq!(
        setup.node(),
        NodeInfo { labels: strings(&[(ZONE, "z1"), ("rack", "r1")]), ..NodeInfo::default() },
        "the annotation goes when empty; labels stay"
    );
}

#[tokio::test]
async fn deregistering_a_replaced_endpoint_leaves_the_newer_registration_alone() {
    let setup = setup();
    let old = setup.serve("old.sock", FakeDriver::always(DRIVER, info("n", 0, &[]))).await;
    let new = setup.serve("new.sock", FakeDriver::always(DRIVER, info("n", 0, &[]))).await;
    setup.register(DRIVER, &old, &["1.0.0"]).await.unwrap();
    setup.register(DRIVER, &new, &["1.1.0"]).await.unwrap();
    let registered = setup.node();

    // Unlike the kubelet, which ignores the endpoint and would remove the newer driver.
    setup.deregister(DRIVER, &old).await;
    assert_eq!(setup.handler.drivers().get(DRIVER).unwrap().endpoint, new.endpoint());
    assert_eq!(setup.node(), registered);

    setup.deregister(DRIVER, &new).await;
    assert!(setup.registered().is_empty());
    assert_eq!(setup.node(), NodeInfo::default());
}

#[tokio::test]
async fn an_unreachable_endpoint_fails_with_the_reason() {
    let setup = setup();
    let endpoint = setup.dir.path().join("missing.sock").display().to_string();

    let err = setup.register_at(DRIVER, &endpoint, &["1.0.0"]).await.unwrap_err();

    assert!(err.starts_with(&format!("NodeGetInfo on {endpoint}: dial {endpoint}")), "{err}");
    assert!(err.contains("No such file or directory"), "{err}");
    assert!(setup.registered().is_empty());
}

#[tokio::test]
async fn endpoints_given_as_unix_targets_are_dialed_by_path() {
    let setup = setup();
    let served = setup.serve("csi.sock", FakeDriver::always(DRIVER, info("n", 0, &[]))).await;
    let endpoint = format!("unix://{}", served.endpoint());

    setup.register_at(DRIVER, &endpoint, &["1.0.0"]).await.unwrap();

    assert_eq!(setup.handler.drivers().get(DRIVER).unwrap().endpoint, endpoint);
    assert_eq!(served.driver.calls(), 1);
}

#[tokio::test]
async fn registrations_of_one_name_run_one_at_a_time() {
    let setup = setup();
    let gate = Arc::new(Notify::new());
    let failing_reply =
        Reply::After(gate.clone(), Box::new(Reply::Fail(Status::unavailable("not ready"))));
    let old = setup.serve("old.sock", FakeDriver::always(DRIVER, failing_reply)).await;
    let new = setup.serve("new.sock", FakeDriver::always(DRIVER, info("n", 0, &[]))).await;

    let handler = setup.handler.clone();
    let old_endpoint = old.endpoint();
    let first = tokio::spawn(async move {
        handler.register(&PluginDetails::new(DRIVER, advertised(&old_endpoint), ["1.0.0"])).await
    });
    old.driver.wait_for_calls(1).await;
    let handler = setup.handler.clone();
    let new_endpoint = new.endpoint();
    let second = tokio::spawn(async move {
        handler.register(&PluginDetails::new(DRIVER, advertised(&new_endpoint), ["1.1.0"])).await
    });
    gate.notify_one();

    assert!(first.await.unwrap().is_err());
    second.await.unwrap().unwrap();
    // Run concurrently, the first registration's cleanup would have removed the second.
    assert_eq!(setup.handler.drivers().get(DRIVER).unwrap().endpoint, new.endpoint());
    assert_eq!(setup.node().node_ids_text(), r#"{"csi.example.com":"n"}"#);
}

#[tokio::test]
async fn a_cancelled_registration_leaves_nothing_registered() {
    let setup = setup();
    let old = setup.serve("old.sock", FakeDriver::always(DRIVER, info("n", 0, &[]))).await;
    let hanging = setup.serve("new.sock", FakeDriver::always(DRIVER, Reply::Hang)).await;
    setup.register(DRIVER, &old, &["1.0.0"]).await.unwrap();

    let plugin = PluginDetails::new(DRIVER, advertised(hanging.endpoint()), ["1.1.0"]);
    let register = setup.handler.register(&plugin);
    let cancelled = async {
        hanging.driver.wait_for_calls(1).await;
    };
    tokio::select! {
        result = register => panic!("registration finished: {result:?}"),
        () = cancelled => {}
    }

    assert!(setup.registered().is_empty(), "the store entry goes at once");
    // The node info is removed in a task holding the name's lock: once a
    // deregistration of the name got the lock, it is gone.
    setup.deregister(DRIVER, &old).await;
    assert_eq!(setup.node(), NodeInfo::default());
}

trait NodeIdsText {
    fn node_ids_text(&self) -> String;
}

impl NodeIdsText for NodeInfo {
    /// The node id annotation, or "" without one.
    fn node_ids_text(&self) -> String {
        self.annotations.get(NODE_ID_ANNOTATION).cloned().unwrap_or_default()
    }
}

/// Checks the fake driver's connection count, which the tests above rely on.
#[tokio::test]
async fn a_call_holds_one_connection_until_it_ends() {
    let setup = setup();
    let served = setup.serve("csi.sock", FakeDriver::always(DRIVER, Reply::Hang)).await;
    let endpoint = served.endpoint();
    let call = tokio::spawn(async move {
        kpm_csi::node_get_info(&endpoint, DEADLINE, kpm_transport::fd::budget()).await
    });
    served.driver.wait_for_calls(1).await;
    assert_eq!(served.open_connections(), 1);

    call.abort();
    served.wait_until_no_connection_is_open().await;
}
