//! The register and unregister operations against real plugins: tonic servers
//! on Unix sockets in temp dirs, driven through the `OperationExecutor`.

// Test helpers may unwrap: a failed setup fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kpm_api::constants::MAX_CONFIG_DURATION;
use kpm_api::registration::v1::{PluginInfo, RegistrationStatus};
use kpm_cache::{
    ActualState, DesiredState, EventBus, Generation, HandlerError, PluginDetails, PluginEndpoint,
    PluginHandler,
};
use kpm_executor::{
    ExecutorConfig, ExecutorError, ExponentialBackoff, Handlers, OperationExecutor, OperationStatus,
};
use kpm_test_support::registration::{FakePlugin, Reply, Served, info, serve};
use kpm_test_support::{DEADLINE, wait_until, within};
use parking_lot::Mutex;
use tonic::Status;

// === Test plugins ===

/// A device plugin called `name` that reports `endpoint`.
fn device_plugin(name: &str, endpoint: &str) -> FakePlugin {
    FakePlugin::new(PluginInfo {
        endpoint: endpoint.into(),
        ..info("DevicePlugin", name, &["v1beta1"])
    })
}

/// A device plugin whose `GetInfo` never answers.
fn hanging_plugin() -> FakePlugin {
    device_plugin("vendor.com/hanging", "").get_info([], Reply::Hang)
}

// === A recording handler ===

#[derive(Default)]
struct RecordingHandler {
    events: Mutex<Vec<String>>,
    reject_validation: Option<&'static str>,
    /// Number of `register` calls that fail before one succeeds.
    failing_registers: Mutex<usize>,
    /// What `register` does instead of returning: "panic" or "hang".
    misbehave: Option<&'static str>,
}

#[async_trait::async_trait]
impl PluginHandler for RecordingHandler {
    async fn validate(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let (name, endpoint) = (plugin.name.as_str(), &plugin.endpoint);
        self.events.lock().push(format!("validate {name} {endpoint}"));
        match self.reject_validation {
            Some(reason) => Err(reason.into()),
            None => Ok(()),
        }
    }

    async fn register(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let (name, endpoint) = (plugin.name.as_str(), &plugin.endpoint);
        self.events.lock().push(format!("register {name} {endpoint}"));
        match self.misbehave {
            Some("panic") => panic!("boom"),
            Some(_) => std::future::pending::<()>().await,
            None => {}
        }
        let mut failing = self.failing_registers.lock();
        if *failing > 0 {
            *failing -= 1;
            return Err("device manager is not ready".into());
        }
        Ok(())
    }

    async fn deregister(&self, plugin: &PluginDetails) {
        let (name, endpoint) = (plugin.name.as_str(), &plugin.endpoint);
        self.events.lock().push(format!("deregister {name} {endpoint}"));
    }
}

impl RecordingHandler {
    fn events(&self) -> Vec<String> {
        self.events.lock().clone()
    }
}

// === Harness ===

struct Harness {
    executor: OperationExecutor,
    actual: Arc<ActualState>,
    desired: DesiredState,
    handler: Arc<RecordingHandler>,
    handlers: Arc<Handlers>,
}

fn harness(handler: RecordingHandler, config: ExecutorConfig) -> Harness {
    let handler = Arc::new(handler);
    let dyn_handler: Arc<dyn PluginHandler> = handler.clone();
    Harness {
        executor: OperationExecutor::try_new(
            config,
            kpm_transport::fd::budget().clone(),
            EventBus::default(),
        )
        .unwrap(),
        actual: Arc::new(ActualState::new()),
        desired: DesiredState::new(),
        handler,
        handlers: Arc::new(Handlers::from([("DevicePlugin".to_owned(), dyn_handler)])),
    }
}

/// A config whose backoff is short enough to retry within a test.
fn fast_config() -> ExecutorConfig {
    ExecutorConfig::default().backoff(
        ExponentialBackoff::try_new(Duration::from_millis(20), Duration::from_millis(100)).unwrap(),
    )
}

impl Harness {
    fn generation(&self, socket: &Path) -> Generation {
        self.desired.add_or_update(socket).unwrap()
    }

    fn start_register(&self, socket: &Path, generation: Generation) -> Result<(), ExecutorError> {
        self.executor.register(socket, generation, self.handlers.clone(), self.actual.clone())
    }

    /// Starts a register operation and waits until it has finished.
    async fn register(&self, socket: &Path, generation: Generation) {
        self.start_register(socket, generation).unwrap();
        self.settle().await;
    }

    async fn settle(&self) {
        within("operations finish", self.executor.operations().wait_for_completion()).await;
    }

    /// Checks that `socket` failed permanently: its entry keeps the error
    /// and has no retry time, so no backoff expiry ever starts it again
    /// (the map's paused-time tests cross hours of backoff to show it).
    fn assert_failed_permanently(&self, socket: &Path) -> ExecutorError {
        let status = self.executor.operations().status(socket);
        assert!(
            matches!(
                status,
                Some(OperationStatus { pending: false, last_error: Some(_), retry_at: None })
            ),
            "{status:?}"
        );
        let refusal = self.refusal(socket, self.desired.generation(socket).unwrap());
        assert!(matches!(refusal, ExecutorError::FailedPermanently { .. }), "{refusal}");
        refusal
    }

    /// The error a new start on `socket` is refused with.
    fn refusal(&self, socket: &Path, generation: Generation) -> ExecutorError {
        self.start_register(socket, generation).expect_err("start is refused")
    }

    /// Checks that `socket`'s last operation failed and is retried later,
    /// and returns its error. Read from the entry, not from a refused start,
    /// which a short backoff may have expired by on a busy machine.
    fn backing_off(&self, socket: &Path) -> String {
        let status = self.executor.operations().status(socket);
        match status {
            Some(OperationStatus {
                pending: false,
                last_error: Some(error),
                retry_at: Some(_),
            }) => error,
            _ => panic!("{} is not backing off: {status:?}", socket.display()),
        }
    }
}

fn status_error(served: &Served) -> String {
    let statuses = served.plugin.statuses();
    assert_eq!(statuses.len(), 1, "exactly one status: {statuses:?}");
    assert!(!statuses[0].plugin_registered);
    statuses[0].error.clone()
}

// === Tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_succeeds_and_the_plugin_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(&dir.path().join("gpu.sock"), device_plugin("vendor.com/gpu", "")).await;
    let h = harness(RecordingHandler::default(), ExecutorConfig::default());
    let generation = h.generation(&served.socket);

    h.register(&served.socket, generation).await;

    let endpoint = served.socket.display().to_string(); // empty endpoint → socket path
    assert_eq!(
        h.handler.events(),
        [
            format!("validate vendor.com/gpu {endpoint}"),
            format!("register vendor.com/gpu {endpoint}")
        ]
    );
    assert_eq!(
        served.plugin.statuses(),
        [RegistrationStatus { plugin_registered: true, error: String::new() }]
    );
    let info = h.actual.get(&served.socket).expect("registered");
    assert_eq!(
        (info.plugin.name.as_str(), info.plugin_type.as_str()),
        ("vendor.com/gpu", "DevicePlugin")
    );
    assert_eq!(info.plugin.endpoint, PluginEndpoint::RegistrationSocket(served.socket.clone()));
    assert_eq!(info.plugin.versions, ["v1beta1"]);
    assert!(h.actual.contains_generation(&served.socket, generation));
    assert!(h.executor.operations().is_empty(), "a success leaves no entry behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_endpoint_is_passed_to_the_handler() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = device_plugin("vendor.com/nic", "/run/nic/service.sock");
    let served = serve(&dir.path().join("nic-reg.sock"), plugin).await;
    let h = harness(RecordingHandler::default(), ExecutorConfig::default());
    h.register(&served.socket, h.generation(&served.socket)).await;
    assert_eq!(h.handler.events()[1], "register vendor.com/nic /run/nic/service.sock");
    assert_eq!(
        h.actual.get(&served.socket).unwrap().plugin.endpoint,
        PluginEndpoint::Advertised("/run/nic/service.sock".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_plugin_type_is_rejected_with_a_reason_naming_the_type() {
    let dir = tempfile::tempdir().unwrap();
    let fancy = FakePlugin::new(info("FancyPlugin", "fancy", &["v1"]));
    let served = serve(&dir.path().join("fancy.sock"), fancy).await;
    let h = harness(RecordingHandler::default(), fast_config());
    let generation = h.generation(&served.socket);

    h.register(&served.socket, generation).await;

    assert_eq!(
        status_error(&served),
        format!(
            "RegisterPlugin error -- no handler registered for plugin type: FancyPlugin at socket {}",
            served.socket.display()
        )
    );
    assert!(h.actual.is_empty());
    assert!(h.handler.events().is_empty());
    // No retry storm: the socket is not retried until something changes.
    let refusal = h.assert_failed_permanently(&served.socket);
    assert!(refusal.to_string().contains("FancyPlugin"), "{refusal}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_plugin_info_is_rejected_before_any_handler_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let versions = |n: usize| (0..n).map(|i| format!("v{i}")).collect::<Vec<_>>();
    let garbage = [
        ("empty-name", "DevicePlugin", String::new(), versions(1), "plugin name is empty"),
        ("empty-type", "", "a".into(), versions(1), "plugin type is empty"),
        ("control", "DevicePlugin", "a\u{7}b".into(), versions(1), "contains a control character"),
        ("versions", "DevicePlugin", "a".into(), versions(1000), "1000 supported versions"),
        // Over the decoder's limit: refused while decoding, still told why.
        ("10k-versions", "DevicePlugin", "a".into(), versions(10_000), "length too large"),
        (
            "huge",
            "DevicePlugin",
            "x".repeat(1 << 20),
            versions(1),
            "decoded message length too large",
        ),
    ];
    let h = harness(RecordingHandler::default(), fast_config());
    for (file, plugin_type, name, supported_versions, reason) in garbage {
        let garbage = PluginInfo {
            r#type: plugin_type.into(),
            name,
            endpoint: String::new(),
            supported_versions,
        };
        let served = serve(&dir.path().join(file), FakePlugin::new(garbage)).await;
        h.register(&served.socket, h.generation(&served.socket)).await;
        let error = status_error(&served);
        assert!(error.starts_with("RegisterPlugin error -- "), "{file}: {error}");
        assert!(error.contains(reason), "{file}: {error}");
        assert!(error.len() < 1024, "{file}: the reason is bounded: {} bytes", error.len());
    }
    assert!(h.actual.is_empty());
    assert!(h.handler.events().is_empty(), "no handler saw garbage: {:?}", h.handler.events());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_failure_sends_the_handlers_reason_to_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(&dir.path().join("bad.sock"), device_plugin("not-a-resource", "")).await;
    let handler = RecordingHandler {
        reject_validation: Some("the ResourceName \"not-a-resource\" is invalid"),
        ..RecordingHandler::default()
    };
    let h = harness(handler, ExecutorConfig::default());
    let generation = h.generation(&served.socket);

    h.register(&served.socket, generation).await;

    assert_eq!(
        status_error(&served),
        "RegisterPlugin error -- plugin validation failed with err: the ResourceName \"not-a-resource\" is invalid"
    );
    assert!(h.actual.is_empty());
    assert_eq!(h.handler.events().len(), 1, "register is not called: {:?}", h.handler.events());
    let error = h.backing_off(&served.socket);
    assert!(error.contains("is invalid"), "the reason is kept: {error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_register_failure_leaves_nothing_registered_and_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(&dir.path().join("gpu.sock"), device_plugin("vendor.com/gpu", "")).await;
    let handler =
        RecordingHandler { failing_registers: Mutex::new(1), ..RecordingHandler::default() };
    let h = harness(handler, fast_config());
    let generation = h.generation(&served.socket);

    h.register(&served.socket, generation).await;
    assert!(h.actual.is_empty(), "a failed register is not in the actual state");
    assert_eq!(
        status_error(&served),
        "RegisterPlugin error -- plugin registration failed with err: device manager is not ready"
    );
    h.backing_off(&served.socket);

    // Retry once the backoff allows it.
    wait_until("the backoff expires", || h.start_register(&served.socket, generation).is_ok())
        .await;
    h.settle().await;
    assert!(h.actual.contains_generation(&served.socket, generation));
    let last = served.plugin.statuses().last().cloned().unwrap();
    assert!(last.plugin_registered, "{last:?}");
    assert_eq!(h.handler.events().iter().filter(|e| e.starts_with("register")).count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_or_hangs_fails_that_registration_only() {
    let dir = tempfile::tempdir().unwrap();
    // A panic is reported as soon as it unwinds, which can take a while on a
    // busy machine with RUST_BACKTRACE set: only the hang needs a short limit.
    for (misbehave, handler_timeout, reason) in [
        ("panic", DEADLINE, "the DevicePlugin handler panicked: boom"),
        (
            "hang",
            Duration::from_millis(200),
            "the DevicePlugin handler did not answer within 200ms",
        ),
    ] {
        let served = serve(&dir.path().join(misbehave), device_plugin("vendor.com/gpu", "")).await;
        let handler =
            RecordingHandler { misbehave: Some(misbehave), ..RecordingHandler::default() };
        let config = fast_config().handler_timeout(handler_timeout);
        let h = harness(handler, config);
        h.register(&served.socket, h.generation(&served.socket)).await;

        assert_eq!(
            status_error(&served),
            format!("RegisterPlugin error -- plugin registration failed with err: {reason}")
        );
        assert!(h.actual.is_empty());
        let endpoint = served.socket.display().to_string();
        assert_eq!(
            h.handler.events()[1..],
            [
                format!("register vendor.com/gpu {endpoint}"),
                // Stopped halfway: undone.
                format!("deregister vendor.com/gpu {endpoint}"),
            ]
        );
        let error = h.backing_off(&served.socket);
        assert!(error.contains(reason), "retried later with the reason: {error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_final_notify_undoes_the_registration() {
    let dir = tempfile::tempdir().unwrap();
    let refusing = device_plugin("vendor.com/gpu", "")
        .notify([], Reply::Fail(Status::unavailable("plugin is shutting down")));
    let served = serve(&dir.path().join("gpu.sock"), refusing).await;
    let h = harness(RecordingHandler::default(), fast_config());
    let generation = h.generation(&served.socket);

    h.register(&served.socket, generation).await;

    let endpoint = served.socket.display().to_string();
    assert_eq!(
        h.handler.events(),
        [
            format!("validate vendor.com/gpu {endpoint}"),
            format!("register vendor.com/gpu {endpoint}"),
            format!("deregister vendor.com/gpu {endpoint}"),
        ]
    );
    assert!(h.actual.is_empty());
    let error = h.backing_off(&served.socket);
    assert!(error.contains("NotifyRegistrationStatus"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_get_info_does_not_block_other_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let hanging = serve(&dir.path().join("hang.sock"), hanging_plugin()).await;
    let healthy = serve(&dir.path().join("ok.sock"), device_plugin("vendor.com/ok", "")).await;
    // A GetInfo timeout far beyond the deadline: the hanging operation is
    // still running whenever the healthy plugin registers, on any machine.
    let config = ExecutorConfig::default().get_info_timeout(Duration::from_secs(3600));
    let h = harness(RecordingHandler::default(), config);

    h.start_register(&hanging.socket, h.generation(&hanging.socket)).unwrap();
    h.start_register(&healthy.socket, h.generation(&healthy.socket)).unwrap();
    wait_until("the healthy plugin registers", || h.actual.get(&healthy.socket).is_some()).await;
    assert!(h.executor.operations().is_pending(&hanging.socket));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_get_info_times_out_with_the_timeout_in_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let hanging = serve(&dir.path().join("hang.sock"), hanging_plugin()).await;
    let config = ExecutorConfig::default().get_info_timeout(Duration::from_millis(300));
    let h = harness(RecordingHandler::default(), config);
    let generation = h.generation(&hanging.socket);

    h.register(&hanging.socket, generation).await;
    let error = h.backing_off(&hanging.socket);
    assert!(error.contains("GetInfo timed out after 300ms"), "{error}");
    assert!(error.contains("hang.sock"), "{error}");
    assert!(hanging.plugin.statuses().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_file_with_nobody_listening_fails_at_dial() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap()); // file stays
    let config = ExecutorConfig::default().refused_retry(Duration::from_millis(30));
    let h = harness(RecordingHandler::default(), config);
    let generation = h.generation(&socket);

    h.register(&socket, generation).await;

    let error = h.backing_off(&socket);
    assert!(error.contains("dial") && error.contains("stale.sock"), "{error}");
    assert!(h.actual.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_socket_is_not_a_registration_socket_and_is_not_retried() {
    use kpm_test_support::csi::{FakeCsiDriver, Reply, serve};

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let server = serve(&socket, FakeCsiDriver::always("", Reply::Hang)).await;
    let h = harness(RecordingHandler::default(), fast_config());
    let generation = h.generation(&socket);

    h.register(&socket, generation).await;

    let refusal = h.assert_failed_permanently(&socket);
    assert!(refusal.to_string().contains("not a registration socket"), "{refusal}");
    // A new incarnation of the socket is tried again.
    h.executor.operations().reset_backoff(&socket);
    h.start_register(&socket, h.generation(&socket)).unwrap();
    h.settle().await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregister_calls_the_handler_once_with_the_recorded_name_and_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = device_plugin("vendor.com/gpu", "/run/gpu/service.sock");
    let served = serve(&dir.path().join("gpu.sock"), plugin).await;
    let h = harness(RecordingHandler::default(), ExecutorConfig::default());
    h.register(&served.socket, h.generation(&served.socket)).await;
    let registered = h.actual.registered(&served.socket).unwrap();
    drop(served); // the plugin is gone: unregistering must not need it

    h.executor.unregister(registered.clone(), h.actual.clone()).unwrap();
    h.settle().await;
    assert!(h.actual.is_empty());
    // A second unregister of the same plugin finds nothing to do.
    h.executor.unregister(registered, h.actual.clone()).unwrap();
    h.settle().await;

    let deregisters: Vec<_> =
        h.handler.events().into_iter().filter(|e| e.starts_with("deregister")).collect();
    assert_eq!(deregisters, ["deregister vendor.com/gpu /run/gpu/service.sock"]);
    assert!(h.executor.operations().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_operation_on_a_socket_waits_for_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let hanging = serve(&dir.path().join("hang.sock"), hanging_plugin()).await;
    let h = harness(RecordingHandler::default(), ExecutorConfig::default());
    let generation = h.generation(&hanging.socket);
    h.start_register(&hanging.socket, generation).unwrap();
    let refusal = h.refusal(&hanging.socket, generation);
    assert!(matches!(refusal, ExecutorError::AlreadyRunning { .. }), "{refusal}");
    assert!(refusal.to_string().contains("hang.sock"), "{refusal}");
}

/// Every duration of the config at [`MAX_CONFIG_DURATION`].
fn longest_config() -> ExecutorConfig {
    ExecutorConfig::default()
        .dial_timeout(MAX_CONFIG_DURATION)
        .refused_retry(MAX_CONFIG_DURATION)
        .get_info_timeout(MAX_CONFIG_DURATION)
        .notify_timeout(MAX_CONFIG_DURATION)
        .handler_timeout(MAX_CONFIG_DURATION)
        .backoff(ExponentialBackoff::try_new(MAX_CONFIG_DURATION, MAX_CONFIG_DURATION).unwrap())
}

#[test]
fn durations_out_of_range_are_refused_naming_the_field() {
    type Field = fn(&mut ExecutorConfig) -> &mut Duration;
    assert!(ExecutorConfig::default().validate().is_ok());
    assert!(longest_config().validate().is_ok(), "the bound itself is accepted");
    assert!(longest_config().refused_retry(Duration::ZERO).validate().is_ok());
    let fields: [(&str, Field); 5] = [
        ("dial_timeout", |c| &mut c.dial_timeout),
        ("refused_retry", |c| &mut c.refused_retry),
        ("get_info_timeout", |c| &mut c.get_info_timeout),
        ("notify_timeout", |c| &mut c.notify_timeout),
        ("handler_timeout", |c| &mut c.handler_timeout),
    ];
    for (name, field) in fields {
        let mut refused = vec![
            Duration::MAX,
            Duration::from_secs(u64::MAX),
            MAX_CONFIG_DURATION + Duration::from_nanos(1),
        ];
        if name != "refused_retry" {
            refused.push(Duration::ZERO);
        }
        for value in refused {
            let mut config = ExecutorConfig::default();
            *field(&mut config) = value;
            let error = config.validate().unwrap_err();
            assert!(
                matches!(error, ExecutorError::InvalidConfig(kpm_api::config::DurationOutOfRange { field, value: v, .. }) if field == name && v == value),
                "{name} = {value:?}: {error:?}"
            );
            assert!(error.to_string().contains(name), "{error}");
        }
    }
}

#[test]
fn an_executor_with_an_invalid_config_is_refused_at_construction() {
    let config = ExecutorConfig::default().get_info_timeout(Duration::MAX);
    let budget = kpm_transport::fd::budget().clone();
    let Err(refused) = OperationExecutor::try_new(config, budget, EventBus::default()) else {
        panic!("an executor was made with an invalid config");
    };
    assert!(
        matches!(
            refused,
            ExecutorError::InvalidConfig(kpm_api::config::DurationOutOfRange {
                field: "get_info_timeout",
                ..
            })
        ),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_and_failure_work_with_the_longest_durations() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(&dir.path().join("gpu.sock"), device_plugin("vendor.com/gpu", "")).await;
    let h = harness(RecordingHandler::default(), longest_config());
    let generation = h.generation(&served.socket);
    h.register(&served.socket, generation).await;
    assert!(h.actual.contains_generation(&served.socket, generation));

    // A failure backs off for the longest wait: `now + wait` is representable.
    // No socket file: the dial fails at once (a refused one would be retried
    // for `refused_retry`).
    let gone = dir.path().join("gone.sock");
    h.register(&gone, h.generation(&gone)).await;
    let retry_in =
        h.executor.operations().retry_at(&gone).expect("backing off") - tokio::time::Instant::now();
    assert!(retry_in > MAX_CONFIG_DURATION.checked_sub(DEADLINE).unwrap(), "{retry_in:?}");
}
