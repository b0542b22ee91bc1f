//! The DRA handler against fake DRA drivers on Unix sockets in temp dirs:
//! validation with the kubelet's reasons, service negotiation, instances per
//! driver, and calls on the serving instance (ports of the kubelet's
//! `dra_plugin_manager_test.go`, `dra_plugin_test.go` and
//! `registration_test.go`, spec C.7).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use kpm_api::constants::MAX_CONFIG_DURATION;
use kpm_cache::PluginDetails;
use kpm_cache::PluginEndpoint;
use kpm_cache::PluginHandler;
use kpm_dra::{DraConfig, DraConfigError, DraError, DraManager, InMemoryCleanup};
use kpm_test_support::{DEADLINE, within};
use support::{FakeDriver, Serves, claim, serve, strings};
use tempfile::TempDir;
use tokio::time::Instant;

/// An endpoint as a DRA driver advertises it.
fn advertised(endpoint: impl Into<String>) -> PluginEndpoint {
    PluginEndpoint::Advertised(endpoint.into())
}

const DRIVER: &str = "gpu.example.com";

struct Setup {
    dir: TempDir,
    manager: Arc<DraManager>,
}

fn setup() -> Setup {
    setup_with(DEADLINE)
}

/// A manager with `config`, on the process-wide fd budget, publishing to no one.
fn manager(config: DraConfig) -> Arc<DraManager> {
    let budget = kpm_transport::fd::budget().clone();
    DraManager::try_new(config, budget, Arc::new(InMemoryCleanup::default()), None).unwrap()
}

fn setup_with(call_timeout: Duration) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let config = DraConfig::default()
        .call_timeout(call_timeout)
        .cleanup_grace(Duration::from_secs(30))
        .root_dir(Some(dir.path().to_path_buf()));
    let manager = manager(config);
    Setup { dir, manager }
}

impl Setup {
    fn endpoint(&self, file: &str) -> String {
        self.dir.path().join(file).display().to_string()
    }

    /// Validates, then registers, like the plugin manager.
    async fn register(
        &self,
        driver: &str,
        endpoint: &str,
        services: &[&str],
    ) -> Result<(), String> {
        let handler: &dyn PluginHandler = &*self.manager;
        let services = strings(services);
        handler
            .validate(&PluginDetails::new(driver, advertised(endpoint), services.clone()))
            .await
            .map_err(|err| err.to_string())?;
        handler
            .register(&PluginDetails::new(driver, advertised(endpoint), services.clone()))
            .await
            .map_err(|err| err.to_string())
    }

    async fn deregister(&self, driver: &str, endpoint: &str) {
        let handler: &dyn PluginHandler = &*self.manager;
        handler
            .deregister(&PluginDetails::new(driver, advertised(endpoint), Vec::<String>::new()))
            .await;
    }

    /// (endpoint, version, connected) of each instance of `driver`.
    fn instances(&self, driver: &str) -> Vec<(String, String, bool)> {
        self.manager
            .drivers()
            .into_iter()
            .filter(|status| status.name == driver)
            .flat_map(|status| status.instances)
            .map(|i| (i.endpoint, i.version, i.connected))
            .collect()
    }

    /// The endpoint a prepare call went to, read from the error of a call
    /// to a driver that is not up.
    async fn serving_endpoint(&self, driver: &str) -> String {
        match self.manager.prepare(driver, vec![claim("probe")]).await {
            Err(DraError::NodePrepareResources { endpoint, .. }) => endpoint,
            other => panic!("expected a failed call, got {other:?}"),
        }
    }
}

// === Version negotiation and calls ===

#[tokio::test]
async fn a_driver_speaking_only_v1_is_called_on_v1() {
    let setup = setup();
    let driver = FakeDriver::new(Serves::V1);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    setup.register(DRIVER, &served.endpoint(), &["v1.DRAPlugin"]).await.unwrap();
    assert_eq!(setup.instances(DRIVER), [(served.endpoint(), "v1.DRAPlugin".into(), true)]);

    let response = setup.manager.prepare(DRIVER, vec![claim("uid-1")]).await.unwrap();
    let devices = &response.claims["uid-1"].devices;
    assert_eq!(devices[0].device_name, "dev-uid-1");
    assert_eq!(devices[0].share_id.as_deref(), Some("share-1"), "v1 carries the share id");
    let response = setup.manager.unprepare(DRIVER, vec![claim("uid-1")]).await.unwrap();
    assert_eq!(response.claims["uid-1"].error, "");

    let calls: Vec<_> =
        driver.calls().into_iter().map(|c| (c.version, c.method, c.claims)).collect();
    assert_eq!(
        calls,
        [
            ("v1", "NodePrepareResources", strings(&["uid-1"])),
            ("v1", "NodeUnprepareResources", strings(&["uid-1"])),
        ]
    );
}

#[tokio::test]
async fn a_driver_speaking_only_v1beta1_is_called_on_v1beta1_through_the_conversion() {
    let setup = setup();
    let driver = FakeDriver::new(Serves::V1beta1);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    setup.register(DRIVER, &served.endpoint(), &["v1beta1.DRAPlugin"]).await.unwrap();
    assert_eq!(setup.instances(DRIVER), [(served.endpoint(), "v1beta1.DRAPlugin".into(), true)]);

    let response = setup.manager.prepare(DRIVER, vec![claim("a"), claim("b")]).await.unwrap();
    assert_eq!(response.claims.len(), 2);
    let device = &response.claims["b"].devices[0];
    assert_eq!(
        (device.pool_name.as_str(), device.device_name.as_str(), device.share_id.as_ref()),
        ("pool1", "dev-b", None)
    );
    assert_eq!(device.cdi_device_ids, ["vendor.example.com/gpu=b"]);
    setup.manager.unprepare(DRIVER, vec![claim("a")]).await.unwrap();

    let calls: Vec<_> = driver.calls().into_iter().map(|c| (c.version, c.method)).collect();
    assert_eq!(calls, [("v1beta1", "NodePrepareResources"), ("v1beta1", "NodeUnprepareResources")]);
}

#[tokio::test]
async fn a_driver_offering_both_services_is_called_on_v1_whatever_the_order() {
    let setup = setup();
    let driver = FakeDriver::new(Serves::Both);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    let services = ["v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth", "v1.DRAPlugin"];
    setup.register(DRIVER, &served.endpoint(), &services).await.unwrap();
    let status = setup.manager.drivers();
    assert_eq!(status[0].instances[0].version, "v1.DRAPlugin");
    assert_eq!(
        status[0].instances[0].health_service.as_deref(),
        Some("v1alpha1.DRAResourceHealth")
    );

    setup.manager.prepare(DRIVER, vec![claim("uid-1")]).await.unwrap();
    assert_eq!(driver.calls()[0].version, "v1");
}

#[tokio::test]
async fn a_driver_advertising_v1beta1_but_serving_only_v1_fails_naming_the_service() {
    // TestGRPCMethods: server v1, chosen v1beta1.
    let setup = setup();
    let driver = FakeDriver::new(Serves::V1);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    setup.register(DRIVER, &served.endpoint(), &["v1beta1.DRAPlugin"]).await.unwrap();

    let err = setup.manager.prepare(DRIVER, vec![claim("uid-1")]).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Unimplemented), "{err}");
    let text = err.to_string();
    assert!(text.contains("k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"), "{text}");
    assert!(text.contains(&format!("DRA driver {DRIVER} at endpoint {}", served.endpoint())));
    let err = setup.manager.unprepare(DRIVER, vec![claim("uid-1")]).await.unwrap_err();
    assert!(matches!(err, DraError::NodeUnprepareResources { .. }), "{err}");
    assert_eq!(err.code(), Some(tonic::Code::Unimplemented));
    assert!(driver.calls().is_empty());
}

#[tokio::test]
async fn a_call_that_does_not_finish_in_time_fails_with_deadline_exceeded() {
    // TestGRPCWithTimeoutEnforced, with a shorter timeout.
    let timeout = Duration::from_millis(500);
    let setup = setup_with(timeout);
    let driver = FakeDriver::blocking(Serves::V1);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    setup.register(DRIVER, &served.endpoint(), &["v1.DRAPlugin"]).await.unwrap();

    // The driver never answers: the call returns only through its timeout,
    // never before it (no upper bound: `within` only stops a hang).
    let start = Instant::now();
    let prepare = setup.manager.prepare(DRIVER, vec![claim("uid-1")]);
    let err = within("NodePrepareResources times out", prepare).await.unwrap_err();
    let elapsed = start.elapsed();
    assert_eq!(err.code(), Some(tonic::Code::DeadlineExceeded), "{err}");
    assert!(elapsed >= timeout, "returned after {elapsed:?}, before its {timeout:?} timeout");
    assert!(err.to_string().contains("code = DeadlineExceeded"), "{err}");
    let calls = driver.calls();
    assert_eq!(calls.len(), 1, "the driver ran the call");
    assert!(calls[0].grpc_timeout.is_some(), "the driver saw a deadline");

    let err = setup.manager.unprepare(DRIVER, vec![claim("uid-1")]).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::DeadlineExceeded), "{err}");
}

#[tokio::test]
async fn concurrent_calls_share_the_instances_one_connection() {
    // TestGRPCConnIsReused.
    let setup = setup();
    let driver = FakeDriver::new(Serves::V1);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    setup.register(DRIVER, &served.endpoint(), &["v1.DRAPlugin"]).await.unwrap();
    let (first, second) = tokio::join!(
        setup.manager.prepare(DRIVER, vec![claim("a")]),
        setup.manager.prepare(DRIVER, vec![claim("b")]),
    );
    first.unwrap();
    second.unwrap();
    setup.manager.unprepare(DRIVER, vec![claim("a"), claim("b")]).await.unwrap();
    assert_eq!(driver.calls().len(), 3);
    assert_eq!(served.accepted(), 1, "one connection, made at registration");
}

// === Validation (ports of TestRegisterPluginRejectsUntrustedInput and
// TestRegisterPluginAcceptsEndpointInsideRootDir) ===

fn kubelet_manager() -> Arc<DraManager> {
    let config = DraConfig::default().root_dir(Some("/var/lib/kubelet".into()));
    manager(config)
}

#[tokio::test]
async fn invalid_driver_names_and_endpoints_are_rejected_with_the_kubelets_reasons() {
    let manager = kubelet_manager();
    let handler: &dyn PluginHandler = &*manager;
    let services = strings(&["v1beta1.DRAPlugin"]);
    let good = "/var/lib/kubelet/plugins/foo/plugin.sock";
    let long_name = "a".repeat(64);
    let long_endpoint = "/var/lib/kubelet/plugins/example.com/\
        very_long_endpoint_name_that_exceeds_the_unix_socket_limit_108_bytes.sock";
    let cases = [
        ("empty-driver", "", good, "Required value"),
        ("driver-with-slash", "../evil", good, "invalid DRA driver name"),
        ("driver-with-space", "evil driver", good, "invalid DRA driver name"),
        ("driver-too-long", long_name.as_str(), good, "Too long"),
        ("empty-endpoint", "good.example.com", "", "empty DRA plugin endpoint"),
        ("relative-endpoint", "good.example.com", "plugin.sock", "must be an absolute path"),
        ("endpoint-too-long", "good.example.com", long_endpoint, "longer than"),
        (
            "endpoint-outside-rootDir",
            "good.example.com",
            "/run/some-other/socket.sock",
            "is not inside",
        ),
        (
            "endpoint-dotdot-escapes-rootDir",
            "good.example.com",
            "/var/lib/kubelet/../../etc/passwd",
            "is not inside",
        ),
    ];
    for (case, driver, endpoint, fragment) in cases {
        let err = handler
            .register(&PluginDetails::new(driver, advertised(endpoint), services.clone()))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(fragment), "{case}: register: {err}");
        let err = handler
            .validate(&PluginDetails::new(driver, advertised(endpoint), services.clone()))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(fragment), "{case}: validate: {err}");
    }
    assert!(manager.drivers().is_empty(), "nothing was registered");
}

#[tokio::test]
async fn endpoints_that_clean_to_a_path_inside_the_root_are_accepted() {
    let manager = kubelet_manager();
    let services = strings(&["v1beta1.DRAPlugin"]);
    for endpoint in [
        "/var/lib/kubelet/plugins/example.com/dra.sock",
        "/var/lib/kubelet/plugins/example.com/rolling/dra.sock",
        "/var/lib/kubelet/plugins_registry/example.com-common.sock",
        "/var/lib/kubelet/plugins/./example.com/../dra.sock",
    ] {
        manager
            .validate_plugin("example.com", endpoint, &services)
            .unwrap_or_else(|err| panic!("{endpoint}: {err}"));
    }
}

#[tokio::test]
async fn any_absolute_endpoint_is_accepted_without_a_root() {
    let manager = manager(DraConfig::default());
    let services = strings(&["v1.DRAPlugin"]);
    manager.validate_plugin("example.com", "/run/some-other/socket.sock", &services).unwrap();
    let err = manager.validate_plugin("example.com", "socket.sock", &services).unwrap_err();
    assert_eq!(err.to_string(), "DRA plugin endpoint \"socket.sock\" must be an absolute path");
}

#[tokio::test]
async fn bad_service_lists_are_rejected_with_the_kubelets_texts() {
    // registration_test: no-services and version cases.
    let setup = setup();
    let endpoint = setup.endpoint("dra.sock");
    let prefix = format!(
        "invalid supported gRPC versions of DRA driver plugin {DRIVER} at endpoint {endpoint}: "
    );
    let err = setup.register(DRIVER, &endpoint, &[]).await.unwrap_err();
    assert_eq!(
        err,
        format!("{prefix}empty list of supported gRPC services (aka supported versions)")
    );
    for services in [&["1.0.0"][..], &["v1alpha1.DRAResourceHealth"], &["some-other-service"]] {
        let err = setup.register(DRIVER, &endpoint, services).await.unwrap_err();
        assert_eq!(
            err,
            format!(
                "{prefix}none of services supported by the plugin ([\"{}\"]) are supported by \
                 the kubelet ([\"v1.DRAPlugin\" \"v1beta1.DRAPlugin\"])",
                services[0]
            )
        );
    }
    assert!(setup.manager.drivers().is_empty());
}

#[tokio::test]
async fn a_non_dra_entry_in_the_service_list_is_ignored() {
    // registration_test: two-services.
    let setup = setup();
    let driver = FakeDriver::new(Serves::V1beta1);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    let services = ["v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"];
    setup.register(DRIVER, &served.endpoint(), &services).await.unwrap();
    assert_eq!(setup.instances(DRIVER)[0].1, "v1beta1.DRAPlugin");
}

// === Instances (ports of TestAddSameName, TestDelete, TestGetDRAPlugin) ===

#[tokio::test]
async fn the_same_endpoint_cannot_be_registered_twice_but_another_endpoint_adds_an_instance() {
    let setup = setup();
    let (old, new) = (setup.endpoint("old.sock"), setup.endpoint("new.sock"));
    // Nothing listens: registration does not need the driver to be up.
    setup.register(DRIVER, &old, &["v1beta1.DRAPlugin"]).await.unwrap();
    assert_eq!(setup.serving_endpoint(DRIVER).await, old);

    let err = setup.register(DRIVER, &old, &["v1.DRAPlugin"]).await.unwrap_err();
    assert_eq!(err, format!("endpoint {old} already registered for DRA driver plugin {DRIVER}"));

    setup.register(DRIVER, &new, &["v1beta1.DRAPlugin"]).await.unwrap();
    assert_eq!(setup.serving_endpoint(DRIVER).await, new, "neither is connected: the newest");
    let endpoints: Vec<_> = setup.instances(DRIVER).into_iter().map(|i| (i.0, i.2)).collect();
    assert_eq!(endpoints, [(old.clone(), false), (new.clone(), false)], "registration order");

    setup.deregister(DRIVER, &old).await;
    assert_eq!(setup.serving_endpoint(DRIVER).await, new);
}

#[tokio::test]
async fn the_same_endpoint_may_serve_two_drivers() {
    let setup = setup();
    let endpoint = setup.endpoint("shared.sock");
    setup.register("a.example.com", &endpoint, &["v1.DRAPlugin"]).await.unwrap();
    setup.register("b.example.com", &endpoint, &["v1.DRAPlugin"]).await.unwrap();
    let names: Vec<_> = setup.manager.drivers().into_iter().map(|d| d.name).collect();
    assert_eq!(names, ["a.example.com", "b.example.com"]);
}

#[tokio::test]
async fn deregistering_removes_only_that_instance_and_twice_is_a_no_op() {
    let setup = setup();
    let (first, second) = (setup.endpoint("first.sock"), setup.endpoint("second.sock"));
    setup.register(DRIVER, &first, &["v1.DRAPlugin"]).await.unwrap();
    setup.register(DRIVER, &second, &["v1.DRAPlugin"]).await.unwrap();

    setup.deregister(DRIVER, &first).await;
    setup.deregister(DRIVER, &first).await;
    setup.deregister(DRIVER, &setup.endpoint("unknown.sock")).await;
    setup.deregister("unknown.example.com", &second).await;
    let endpoints: Vec<_> = setup.instances(DRIVER).into_iter().map(|i| i.0).collect();
    assert_eq!(endpoints, [second.as_str()]);

    setup.deregister(DRIVER, &second).await;
    assert!(setup.instances(DRIVER).is_empty());
    let err = setup.manager.prepare(DRIVER, vec![claim("uid-1")]).await.unwrap_err();
    assert_eq!(err.to_string(), format!("DRA driver {DRIVER} is not registered"));
}

#[tokio::test]
async fn calls_fail_for_an_empty_or_unknown_driver_name() {
    let setup = setup();
    setup.register(DRIVER, &setup.endpoint("dra.sock"), &["v1.DRAPlugin"]).await.unwrap();
    let err = setup.manager.prepare("", vec![]).await.unwrap_err();
    assert_eq!(err.to_string(), "DRA driver name is empty");
    let err = setup.manager.unprepare("other.example.com", vec![]).await.unwrap_err();
    assert_eq!(err.to_string(), "DRA driver other.example.com is not registered");
    // The registered one is found; its call fails because nothing listens.
    let err = setup.manager.prepare(DRIVER, vec![claim("uid-1")]).await.unwrap_err();
    assert!(matches!(err, DraError::NodePrepareResources { .. }), "{err}");
    assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");
}

#[tokio::test]
async fn after_shutdown_registrations_and_calls_fail() {
    let setup = setup();
    let driver = FakeDriver::new(Serves::V1);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    setup.register(DRIVER, &served.endpoint(), &["v1.DRAPlugin"]).await.unwrap();
    setup.manager.shutdown().await;
    assert!(setup.manager.drivers().is_empty());
    let err = setup.manager.prepare(DRIVER, vec![claim("uid-1")]).await.unwrap_err();
    assert!(matches!(err, DraError::ShutDown), "{err}");
    let err = setup.register(DRIVER, &served.endpoint(), &["v1.DRAPlugin"]).await.unwrap_err();
    assert_eq!(err, "the DRA driver manager is shut down");
    setup.deregister(DRIVER, &served.endpoint()).await;
}

#[test]
fn durations_out_of_range_are_refused_naming_the_field() {
    let longest =
        DraConfig::default().call_timeout(MAX_CONFIG_DURATION).cleanup_grace(MAX_CONFIG_DURATION);
    assert!(DraConfig::default().validate().is_ok());
    assert!(longest.validate().is_ok(), "the bound itself is accepted");
    assert!(longest.clone().cleanup_grace(Duration::ZERO).validate().is_ok());
    let too_long = [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        MAX_CONFIG_DURATION + Duration::from_nanos(1),
    ];
    let mut refused: Vec<(&str, DraConfig)> = too_long
        .into_iter()
        .flat_map(|value| {
            [
                ("call_timeout", DraConfig::default().call_timeout(value)),
                ("cleanup_grace", DraConfig::default().cleanup_grace(value)),
            ]
        })
        .collect();
    refused.push(("call_timeout", DraConfig::default().call_timeout(Duration::ZERO)));
    for (name, config) in refused {
        let error = config.validate().unwrap_err();
        assert!(
            matches!(error, DraConfigError::DurationOutOfRange(kpm_api::config::DurationOutOfRange { field, .. }) if field == name),
            "{config:?}: {error:?}"
        );
        assert!(error.to_string().contains(name), "{error}");
    }
}

#[test]
fn an_invalid_config_makes_no_manager() {
    let budget = kpm_transport::fd::budget().clone();
    let config = DraConfig::default().call_timeout(Duration::MAX);
    let cleanup = Arc::new(InMemoryCleanup::default());
    let refused = DraManager::try_new(config, budget, cleanup, None).unwrap_err();
    assert!(
        matches!(
            refused,
            DraConfigError::DurationOutOfRange(kpm_api::config::DurationOutOfRange {
                field: "call_timeout",
                ..
            })
        ),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("call_timeout"), "{refused}");
}

#[tokio::test]
async fn calls_work_with_the_longest_call_timeout() {
    let s = setup_with(MAX_CONFIG_DURATION);
    let driver = FakeDriver::new(Serves::V1);
    let served = serve(&s.dir.path().join("dra.sock"), &driver);
    s.register(DRIVER, &served.endpoint(), &["v1.DRAPlugin"]).await.unwrap();
    s.manager.prepare(DRIVER, vec![claim("a")]).await.unwrap();
    s.manager.unprepare(DRIVER, vec![claim("a")]).await.unwrap();
}
