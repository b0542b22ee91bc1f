//! The prober against real plugins: tonic registration servers on Unix
//! sockets in temp dirs that answer, hang, or are gone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use kpm_api::config::DurationOutOfRange;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use kpm_api::constants::MAX_CONFIG_DURATION;
use kpm_api::registration::v1::registration_server::{Registration, RegistrationServer};
use kpm_api::registration::v1::{
    InfoRequest, PluginInfo as WirePluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use kpm_cache::{
    ActualState, DesiredState, EventBus, Generation, HandlerError, PluginEvent, PluginHandler,
    PluginInfo,
};
use kpm_liveness::{LivenessConfig, LivenessError, LivenessProber};
use tonic::{Request, Response, Status};

/// A plugin whose GetInfo answers or hangs, switchable while it runs.
#[derive(Default)]
struct Plugin {
    hang: AtomicBool,
}

#[tonic::async_trait]
impl Registration for Plugin {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<WirePluginInfo>, Status> {
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        Ok(Response::new(WirePluginInfo {
            r#type: "TestPlugin".into(),
            name: "test".into(),
            endpoint: String::new(),
            supported_versions: vec!["v1".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        _: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

async fn serve(socket: &Path) -> (Arc<Plugin>, tokio::task::JoinHandle<()>) {
    let plugin = Arc::new(Plugin::default());
    let incoming = kpm_api::uds::bind(socket).await.unwrap();
    let service = RegistrationServer::from_arc(Arc::clone(&plugin));
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
    });
    (plugin, server)
}

struct NoHandler;

#[async_trait::async_trait]
impl PluginHandler for NoHandler {
    async fn validate(&self, _: &str, _: &str, _: &[String]) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn register(&self, _: &str, _: &str, _: &[String]) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn deregister(&self, _: &str, _: &str) {}
}

struct Harness {
    desired: Arc<DesiredState>,
    actual: Arc<ActualState>,
    events: EventBus,
    prober: LivenessProber,
}

fn harness(config: LivenessConfig) -> Harness {
    let desired = Arc::new(DesiredState::new());
    let actual = Arc::new(ActualState::new());
    let events = EventBus::default();
    let prober =
        LivenessProber::new(Arc::clone(&desired), Arc::clone(&actual), events.clone(), config)
            .unwrap();
    Harness { desired, actual, events, prober }
}

fn quick() -> LivenessConfig {
    LivenessConfig {
        period: Duration::from_secs(10),
        failure_threshold: 3,
        timeout: Duration::from_millis(100),
    }
}

impl Harness {
    /// Records `socket` as present and registered, as the reconciler would.
    fn registered(&self, socket: &Path) -> Generation {
        let generation = self.desired.add_or_update(socket).unwrap();
        self.actual
            .add(PluginInfo {
                socket_path: socket.to_path_buf(),
                generation,
                plugin_type: "TestPlugin".into(),
                name: "test".into(),
                endpoint: socket.display().to_string(),
                versions: vec!["v1".into()],
                registered_at: SystemTime::now(),
                handler: Arc::new(NoHandler),
            })
            .unwrap();
        generation
    }
}

fn unresponsive(events: &mut tokio::sync::broadcast::Receiver<PluginEvent>) -> Vec<PluginEvent> {
    std::iter::from_fn(|| events.try_recv().ok())
        .filter(|event| matches!(event, PluginEvent::Unresponsive { .. }))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answering_plugin_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ok.sock");
    let _served = serve(&socket).await;
    let h = harness(quick());
    let generation = h.registered(&socket);
    let mut events = h.events.subscribe();
    for _ in 0..5 {
        h.prober.probe_all().await;
    }
    assert_eq!(h.desired.generation(&socket), Some(generation));
    assert!(unresponsive(&mut events).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_plugin_is_renewed_after_the_threshold_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("hang.sock");
    let (plugin, _server) = serve(&socket).await;
    plugin.hang.store(true, Ordering::SeqCst);
    let h = harness(quick());
    let generation = h.registered(&socket);
    let mut events = h.events.subscribe();

    for _ in 0..2 {
        h.prober.probe_all().await;
        assert_eq!(h.desired.generation(&socket), Some(generation), "below the threshold");
    }
    h.prober.probe_all().await;
    let renewed = h.desired.generation(&socket).unwrap();
    assert!(renewed > generation, "the third failure renews the socket");
    let reported = unresponsive(&mut events);
    let [PluginEvent::Unresponsive { socket: s, generation: g, name, failures, reason, .. }] =
        reported.as_slice()
    else {
        panic!("one Unresponsive event: {reported:?}");
    };
    assert_eq!((s, *g, name.as_str(), *failures), (&socket, generation, "test", 3));
    assert!(reason.contains("timed out"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_resets_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("flaky.sock");
    let (plugin, _server) = serve(&socket).await;
    let h = harness(quick());
    let generation = h.registered(&socket);
    for hang in [true, true, false, true, true, false, true, true] {
        plugin.hang.store(hang, Ordering::SeqCst);
        h.prober.probe_all().await;
    }
    assert_eq!(h.desired.generation(&socket), Some(generation), "never three in a row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_nobody_listens_on_is_renewed_at_the_first_probe() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("crashed.sock");
    // The plugin crashed: its socket file is left behind, connections are refused.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let h = harness(quick());
    let generation = h.registered(&socket);
    let mut events = h.events.subscribe();
    h.prober.probe_all().await;
    assert!(h.desired.generation(&socket).unwrap() > generation);
    let reported = unresponsive(&mut events);
    assert!(
        matches!(reported.as_slice(), [PluginEvent::Unresponsive { failures: 3, reason, .. }]
            if reason.contains("crashed.sock")),
        "{reported:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_recreated_meanwhile_is_not_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("moved.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let h = harness(quick());
    h.registered(&socket);
    // The watcher saw a new socket file: a new incarnation, not yet registered.
    let newer = h.desired.add_or_update(&socket).unwrap();
    let mut events = h.events.subscribe();
    h.prober.probe_all().await;
    assert_eq!(h.desired.generation(&socket), Some(newer));
    assert!(unresponsive(&mut events).is_empty());
}

/// Runs the prober with `config` on paused time against a plugin that is
/// gone, registered anew after each renewal; returns when each of `rounds`
/// renewals happened, counted from the start.
async fn renewals(config: LivenessConfig, rounds: usize) -> Vec<Duration> {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("gone.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let h = harness(config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = tokio::time::Instant::now();
    let run = h.prober.run(async {
        let _ = stopped.await;
    });
    tokio::pin!(run);
    let mut renewed = Vec::new();
    for _ in 0..rounds {
        h.actual.remove(&socket);
        let generation = h.registered(&socket);
        let renewal = async {
            let mut changes = h.desired.subscribe();
            while h.desired.generation(&socket) == Some(generation) {
                changes.changed().await;
            }
            started.elapsed()
        };
        renewed.push(tokio::select! {
            () = &mut run => panic!("run stopped on its own"),
            elapsed = renewal => elapsed,
        });
    }
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(1), run).await.expect("run returns on shutdown");
    renewed
}

#[tokio::test(start_paused = true)]
async fn run_probes_once_per_period_until_shutdown() {
    // Not at start (plugins were just registered), one period later.
    assert_eq!(renewals(quick(), 1).await, [Duration::from_secs(10)]);
}

#[tokio::test(start_paused = true)]
async fn run_with_the_longest_period_probes_once_per_period() {
    let config = LivenessConfig { period: MAX_CONFIG_DURATION, ..quick() };
    let period = MAX_CONFIG_DURATION;
    assert_eq!(renewals(config, 3).await, [period, 2 * period, 3 * period]);
}

#[test]
fn periods_beyond_the_bound_are_refused_and_the_bound_accepted() {
    for too_long in [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        MAX_CONFIG_DURATION + Duration::from_nanos(1),
    ] {
        let config = LivenessConfig { period: too_long, ..quick() };
        let error = config.validate().unwrap_err();
        assert!(
            matches!(error, LivenessError::InvalidConfig(DurationOutOfRange { field: "period", value, .. }) if value == too_long),
            "{error}"
        );
        assert!(error.to_string().contains("period"), "{error}");
        let refused = LivenessProber::new(
            Arc::new(DesiredState::new()),
            Arc::new(ActualState::new()),
            EventBus::default(),
            config,
        );
        assert_eq!(refused.map(|_| ()), Err(error));
    }
    let longest =
        LivenessConfig { period: MAX_CONFIG_DURATION, timeout: MAX_CONFIG_DURATION, ..quick() };
    assert_eq!(longest.validate(), Ok(()));
}

#[test]
fn invalid_settings_are_refused() {
    let config = |period, failure_threshold, timeout| LivenessConfig {
        period: Duration::from_millis(period),
        failure_threshold,
        timeout: Duration::from_millis(timeout),
    };
    assert_eq!(config(0, 3, 0).validate(), Err(LivenessError::ZeroPeriod));
    assert_eq!(config(1000, 0, 100).validate(), Err(LivenessError::ZeroThreshold));
    assert!(matches!(config(1000, 3, 2000).validate(), Err(LivenessError::InvalidTimeout { .. })));
    assert_eq!(LivenessConfig::default().validate(), Ok(()));
}
