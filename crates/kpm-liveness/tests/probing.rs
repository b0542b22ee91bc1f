//! The monitor against real plugins: tonic registration servers on Unix
//! sockets in temp dirs that answer, hang, or are gone, and real processes
//! whose exit the kernel reports.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kpm_api::config::DurationOutOfRange;
use kpm_api::constants::{CSI_PLUGIN, MAX_CONFIG_DURATION};
use kpm_cache::{
    ActualState, DesiredState, EventBus, Generation, HandlerError, PluginDetails, PluginEndpoint,
    PluginEvent, PluginHandler, Registered,
};
use kpm_liveness::{
    LivenessConfig, LivenessError, LivenessMonitor, MAX_KEPT_CONNECTIONS, SharedConnections,
};
use kpm_test_support::csi;
use kpm_test_support::registration::{FakePlugin, Reply, info, serve};
use kpm_test_support::{lazy, wait_until, within};
use kpm_transport::{Dialer, UdsChannel};
use tokio::sync::broadcast;

/// A plugin of the type and name the tests register, answering every call.
fn answering() -> FakePlugin {
    FakePlugin::new(info("TestPlugin", "test", &["v1"]))
}

/// A plugin whose `GetInfo` never answers.
fn hanging() -> FakePlugin {
    answering().get_info([], Reply::Hang)
}

struct NoHandler;

#[async_trait::async_trait]
impl PluginHandler for NoHandler {
    async fn validate(&self, _: &PluginDetails) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn register(&self, _: &PluginDetails) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn deregister(&self, _: &PluginDetails) {}
}

/// The caches and bus a monitor follows, the monitor running on them, and a
/// subscription to its events taken before it started.
struct Harness {
    desired: Arc<DesiredState>,
    actual: Arc<ActualState>,
    events: EventBus,
    monitor: Arc<LivenessMonitor>,
    reported: broadcast::Receiver<PluginEvent>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    running: tokio::task::JoinHandle<()>,
}

fn start(config: LivenessConfig) -> Harness {
    start_with(config, |monitor| monitor)
}

/// Like [`start`], with the monitor set up further by `set_up`.
fn start_with(
    config: LivenessConfig,
    set_up: impl FnOnce(LivenessMonitor) -> LivenessMonitor,
) -> Harness {
    let desired = Arc::new(DesiredState::new());
    let actual = Arc::new(ActualState::new());
    let events = EventBus::default();
    let reported = events.subscribe();
    let budget = kpm_transport::fd::budget().clone();
    let monitor = LivenessMonitor::try_new(
        config,
        budget,
        Arc::clone(&desired),
        Arc::clone(&actual),
        events.clone(),
    )
    .unwrap();
    let monitor = Arc::new(set_up(monitor));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let monitor = Arc::clone(&monitor);
        async move {
            monitor
                .run(async {
                    let _ = stopped.await;
                })
                .await;
        }
    });
    Harness { desired, actual, events, monitor, reported, stop: Some(stop), running }
}

/// Probes every 100 ms, each step within 50 ms; no process watched.
fn quick() -> LivenessConfig {
    LivenessConfig::default()
        .period(Some(Duration::from_millis(100)))
        .failure_threshold(3)
        .timeout(Duration::from_millis(50))
        .watch_exits(false)
}

impl Harness {
    /// Records `socket` as present and registered, served by `pid`, and
    /// reports it, as the reconciler and the executor would.
    fn registered(&self, socket: &Path, server_pid: Option<u32>) -> Generation {
        self.register(socket, "TestPlugin", socket, server_pid)
    }

    /// Like [`registered`](Self::registered), a plugin of `plugin_type`
    /// that reported `endpoint`.
    fn registered_as(&self, socket: &Path, plugin_type: &str, endpoint: &Path) -> Generation {
        self.register(socket, plugin_type, endpoint, None)
    }

    fn register(
        &self,
        socket: &Path,
        plugin_type: &str,
        endpoint: &Path,
        server_pid: Option<u32>,
    ) -> Generation {
        let generation = self.desired.add_or_update(socket).unwrap();
        // Served on its registration socket: it advertised none.
        let served_at = if endpoint == socket {
            PluginEndpoint::RegistrationSocket(socket.to_path_buf())
        } else {
            PluginEndpoint::Advertised(endpoint.display().to_string())
        };
        self.actual
            .add(Registered::new(
                kpm_cache::Registration::new(
                    socket,
                    generation,
                    plugin_type,
                    PluginDetails::new("test", served_at.clone(), ["v1"]),
                    server_pid,
                ),
                Arc::new(NoHandler),
            ))
            .unwrap();
        self.events.publish(PluginEvent::Registered {
            socket: socket.to_path_buf(),
            generation,
            plugin_type: plugin_type.into(),
            name: "test".into(),
            endpoint: served_at,
        });
        generation
    }

    /// The next `Unresponsive` event.
    async fn unresponsive(&mut self) -> PluginEvent {
        within("an Unresponsive event", self.next_unresponsive()).await
    }

    /// The next `Unresponsive` event, however long it takes.
    async fn next_unresponsive(&mut self) -> PluginEvent {
        loop {
            if let event @ PluginEvent::Unresponsive { .. } = self.reported.recv().await.unwrap() {
                return event;
            }
        }
    }

    /// The `Unresponsive` events published so far.
    fn reported_unresponsive(&mut self) -> Vec<PluginEvent> {
        std::iter::from_fn(|| self.reported.try_recv().ok())
            .filter(|event| matches!(event, PluginEvent::Unresponsive { .. }))
            .collect()
    }

    async fn stop(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        within("the monitor to stop", &mut self.running).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answering_plugin_is_pinged_over_one_kept_connection_and_called_every_fourth_probe() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ok.sock");
    let served = serve(&socket, answering()).await;
    let mut h = start(quick());
    let generation = h.registered(&socket, None);
    wait_until(lazy(|| format!("9 probes, {:?} so far", h.monitor.stats())), || {
        h.monitor.stats().probes >= 9
    })
    .await;
    let stats = h.monitor.stats();
    // PING, PING, PING, GetInfo, …: as many PINGs as a gRPC server takes
    // between two responses, and no more calls.
    assert_eq!(stats.probe_calls, stats.probes / 4, "{stats:?}");
    assert_eq!(stats.pings, stats.probes - stats.probe_calls, "{stats:?}");
    let calls = served.plugin.get_info_calls() as u64;
    assert!(calls >= stats.probe_calls && calls <= stats.probe_calls + 1, "{calls} served");
    assert_eq!(served.accepted_connections(), 1, "dialled once, then kept");
    assert_eq!(stats.probe_dials, 1);
    assert_eq!(h.desired.generation(&socket), Some(generation));
    assert!(h.reported_unresponsive().is_empty());
    assert_eq!(stats.probe_connections, 1);

    // Renewed (here: deregistered), its connection is let go.
    h.actual.remove(&socket);
    h.events.publish(PluginEvent::Deregistered {
        socket: socket.clone(),
        generation,
        plugin_type: "TestPlugin".into(),
        name: "test".into(),
    });
    wait_until("the kept connection let go", || h.monitor.stats().probe_connections == 0).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_kept_connections_pings_go_on_bare_connections_and_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let count = MAX_KEPT_CONNECTIONS + 2;
    let mut h = start(
        LivenessConfig::default()
            .period(Some(Duration::from_millis(500)))
            .timeout(Duration::from_millis(400))
            .watch_exits(false),
    );
    let mut plugins = Vec::new();
    for n in 0..count {
        let socket = dir.path().join(format!("p{n}.sock"));
        plugins.push(serve(&socket, answering()).await);
        h.registered(&socket, None);
    }
    let enough = 5 * count as u64;
    wait_until(lazy(|| format!("{enough} probes, {:?} so far", h.monitor.stats())), || {
        h.monitor.stats().probes >= enough
    })
    .await;
    let stats = h.monitor.stats();
    assert_eq!(stats.failed_probes, 0, "{stats:?}");
    assert!(h.reported_unresponsive().is_empty());
    assert_eq!(stats.probe_connections, MAX_KEPT_CONNECTIONS, "{stats:?}");
    // The two plugins left without a kept connection are dialled at every
    // probe: a bare connection for each PING, an HTTP/2 one for each call.
    assert!(stats.probe_dials >= (MAX_KEPT_CONNECTIONS + 2 * 4) as u64, "{stats:?}");
    assert!(stats.pings > stats.probe_calls, "{stats:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_whose_transport_stops_answering_pings_is_found_by_a_ping() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("stopped.sock");
    let served = serve(&socket, answering()).await;
    let mut h = start(quick());
    let generation = h.registered(&socket, None);
    wait_until("a PING answered", || h.monitor.stats().pings >= 1).await;

    served.freeze();
    let calls = h.monitor.stats().probe_calls;
    wait_until("a failed probe", || h.monitor.stats().failed_probes >= 1).await;
    let stats = h.monitor.stats();
    assert_eq!(stats.probe_calls, calls, "the first failure was a PING's: {stats:?}");
    let PluginEvent::Unresponsive { failures, .. } = h.unresponsive().await else { unreachable!() };
    assert_eq!(failures, 3);
    assert!(h.desired.generation(&socket).unwrap() > generation, "the socket is renewed");
    h.stop().await;
}

/// Serves a CSI driver on `endpoint` whose `Probe` answers as `ready`
/// says, or hangs (`None`), counting the calls.
async fn serve_driver(endpoint: &Path, ready: Option<bool>) -> csi::Served {
    let driver = csi::FakeCsiDriver::always("csi.example.com", csi::Reply::Hang).probe(ready);
    csi::serve(endpoint, driver).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csi_driver_that_hangs_or_is_not_ready_is_found_while_its_registrar_answers() {
    for (ready, found) in [(None, "Identity/Probe timed out"), (Some(false), "not ready")] {
        let dir = tempfile::tempdir().unwrap();
        let (socket, endpoint) = (dir.path().join("reg.sock"), dir.path().join("csi.sock"));
        let registrar = serve(&socket, answering()).await;
        let driver = serve_driver(&endpoint, ready).await;
        let mut h = start(quick());
        let generation = h.registered_as(&socket, CSI_PLUGIN, &endpoint);

        let PluginEvent::Unresponsive { failures, reason, .. } = h.unresponsive().await else {
            unreachable!()
        };
        assert_eq!(failures, 3, "{ready:?}");
        assert!(reason.contains("its driver at") && reason.contains(found), "{reason}");
        assert!(reason.contains("csi.sock"), "{reason}");
        assert!(h.desired.generation(&socket).unwrap() > generation, "the socket is renewed");
        // Found by three Probe calls, after the PINGs a driver takes; the
        // registrar answered every probe.
        assert!(driver.driver.probes() >= 3);
        assert!(registrar.plugin.get_info_calls() >= 1, "the registrar was asked too");
        h.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_csi_driver_and_its_registrar_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, endpoint) = (dir.path().join("reg.sock"), dir.path().join("csi.sock"));
    let registrar = serve(&socket, answering()).await;
    let driver = serve_driver(&endpoint, Some(true)).await;
    let mut h = start(quick());
    let generation = h.registered_as(&socket, CSI_PLUGIN, &endpoint);
    wait_until(lazy(|| format!("9 probes, {:?} so far", h.monitor.stats())), || {
        h.monitor.stats().probes >= 9
    })
    .await;
    let stats = h.monitor.stats();
    // Both sockets: PINGs, and a call on each every fourth probe.
    assert_eq!(stats.probe_calls, 2 * (stats.probes / 4), "{stats:?}");
    assert!(driver.driver.probes() >= 2);
    assert!(registrar.plugin.get_info_calls() >= 2);
    assert_eq!(stats.probe_connections, 2, "one kept to each");
    assert_eq!(h.desired.generation(&socket), Some(generation));
    assert!(h.reported_unresponsive().is_empty());
    h.stop().await;
}

/// One connection to one socket, shared as a device manager shares a plugin's.
#[derive(Debug)]
struct OneShared {
    socket: std::path::PathBuf,
    channel: UdsChannel,
}

impl SharedConnections for OneShared {
    fn connection(&self, plugin: &kpm_cache::Registration) -> Option<UdsChannel> {
        (plugin.socket_path == self.socket && !self.channel.is_closed())
            .then(|| self.channel.clone())
    }
}

async fn share(socket: &Path) -> Arc<dyn SharedConnections> {
    let dialer = Dialer::new(kpm_transport::fd::budget().clone(), Duration::from_secs(5));
    let channel = dialer.kept(socket).await.unwrap();
    Arc::new(OneShared { socket: socket.to_path_buf(), channel })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_whose_connection_is_shared_is_probed_over_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("shared.sock");
    let served = serve(&socket, answering()).await;
    let shared = share(&socket).await;
    let mut h = start_with(quick(), |monitor| monitor.with_shared_connections(shared));
    let generation = h.registered(&socket, None);
    let calls = || served.plugin.get_info_calls();
    wait_until(lazy(|| format!("5 probes, {} so far", calls())), || calls() >= 5).await;
    assert_eq!(served.accepted_connections(), 1, "no probe dialled");
    assert_eq!(h.desired.generation(&socket), Some(generation));
    assert!(h.reported_unresponsive().is_empty());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_hanging_on_a_shared_connection_is_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("shared-hang.sock");
    let served = serve(&socket, hanging()).await;
    let shared = share(&socket).await;
    let mut h = start_with(quick(), |monitor| monitor.with_shared_connections(shared));
    let generation = h.registered(&socket, None);
    let PluginEvent::Unresponsive { failures, reason, .. } = h.unresponsive().await else {
        unreachable!()
    };
    assert_eq!(failures, 3);
    assert!(reason.contains("timed out"), "{reason}");
    assert!(h.desired.generation(&socket).unwrap() > generation, "the socket is renewed");
    assert_eq!(served.accepted_connections(), 1, "no probe dialled");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_plugin_is_renewed_after_the_threshold_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("hang.sock");
    let served = serve(&socket, hanging()).await;
    let mut h = start(quick());
    let generation = h.registered(&socket, None);

    let PluginEvent::Unresponsive { socket: s, generation: g, name, failures, reason, .. } =
        h.unresponsive().await
    else {
        unreachable!()
    };
    assert_eq!(
        (s.as_path(), g, name.as_str(), failures),
        (socket.as_path(), generation, "test", 3)
    );
    assert!(reason.contains("timed out"), "{reason}");
    assert!(h.desired.generation(&socket).unwrap() > generation, "the socket is renewed");
    assert_eq!(served.plugin.get_info_calls(), 3, "no probe after the renewal");
    assert_eq!(h.monitor.stats().renewals, 1);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_resets_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("flaky.sock");
    // Two hangs, an answer, three times over, then answers: never three
    // hangs in a row.
    let flaky = std::iter::repeat_n([Reply::Hang, Reply::Hang, Reply::Answer], 3).flatten();
    let served = serve(&socket, answering().get_info(flaky, Reply::Answer)).await;
    let mut h = start(quick());
    let generation = h.registered(&socket, None);
    let calls = || served.plugin.get_info_calls();
    wait_until(lazy(|| format!("9 probes, {} so far", calls())), || calls() >= 9).await;
    assert_eq!(h.desired.generation(&socket), Some(generation));
    assert!(h.reported_unresponsive().is_empty());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_nobody_listens_on_is_renewed_at_the_first_probe() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("crashed.sock");
    // The plugin crashed: its socket file is left behind, connections are refused.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let mut h = start(quick());
    let generation = h.registered(&socket, None);
    let event = h.unresponsive().await;
    assert!(
        matches!(&event, PluginEvent::Unresponsive { failures: 3, reason, generation: g, .. }
            if reason.contains("crashed.sock") && *g == generation),
        "{event:?}"
    );
    let stats = h.monitor.stats();
    assert_eq!(stats.probes, 1);
    // Refused at the dial: nothing was asked.
    assert_eq!((stats.pings, stats.probe_calls, stats.probe_dials), (0, 0, 0), "{stats:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_dies_after_answering_is_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("died.sock");
    let served = kpm_test_support::OwnRuntime::start({
        let socket = socket.clone();
        move || async move {
            // Not dropped, which would stop it now: it goes with the runtime.
            std::mem::forget(serve(&socket, answering()).await);
        }
    });
    let mut h = start(quick());
    let generation = h.registered(&socket, None);
    wait_until("a probe", || h.monitor.stats().probes >= 1).await;
    // The process dies: its connections close, its socket file stays.
    served.stop();
    let event = h.unresponsive().await;
    assert!(
        matches!(&event, PluginEvent::Unresponsive { failures: 3, generation: g, .. } if *g == generation),
        "{event:?}"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_recreated_meanwhile_is_not_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("moved.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let mut h = start(quick());
    h.registered(&socket, None);
    // The watcher saw a new socket file: a new incarnation, not yet registered.
    let newer = h.desired.add_or_update(&socket).unwrap();
    wait_until("a probe", || h.monitor.stats().failed_probes >= 1).await;
    assert_eq!(h.desired.generation(&socket), Some(newer));
    assert!(h.reported_unresponsive().is_empty());
    h.stop().await;
}

/// A process that does nothing until it is killed, standing for a plugin
/// process; the test serves its socket itself and closes it when it kills it.
fn stand_in_process() -> tokio::process::Child {
    tokio::process::Command::new("sleep").arg("600").kill_on_drop(true).spawn().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_is_noticed_without_any_probe_and_a_socket_left_unserved_is_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("exit.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let mut process = stand_in_process();
    let mut h = start(quick().period(None).watch_exits(true));
    let generation = h.registered(&socket, process.id());
    wait_until("the process is watched", || h.monitor.stats().watched_processes == 1).await;

    drop(listener);
    process.kill().await.unwrap();
    let event = h.unresponsive().await;
    let PluginEvent::Unresponsive { generation: g, failures, reason, .. } = event else {
        unreachable!()
    };
    assert_eq!((g, failures), (generation, 0));
    let pid = process.id();
    assert!(reason.contains("exited") && reason.contains("refused"), "{reason} (pid {pid:?})");
    let stats = h.monitor.stats();
    assert_eq!((stats.exits, stats.probes, stats.watched_processes), (1, 0, 0));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_still_served_after_its_process_exited_is_left_registered() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kept.sock");
    // Another process (here, the test) keeps the socket open and served.
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let mut process = stand_in_process();
    let mut h = start(quick().period(None).watch_exits(true));
    let generation = h.registered(&socket, process.id());
    wait_until("the process is watched", || h.monitor.stats().watched_processes == 1).await;
    process.kill().await.unwrap();
    wait_until("the socket is checked twice", || h.monitor.stats().socket_checks == 2).await;
    assert_eq!(h.monitor.stats().exits, 1);
    assert_eq!(h.desired.generation(&socket), Some(generation), "not renewed");
    assert!(h.reported_unresponsive().is_empty());
    h.stop().await;
}

/// Runs the monitor with `config` on paused time against a plugin that is
/// gone, registered anew after each renewal; returns when each of `rounds`
/// renewals happened, counted from the registration before it.
async fn renewals(config: LivenessConfig, rounds: usize) -> Vec<Duration> {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("gone.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let mut h = start(config);
    let mut renewed = Vec::new();
    for _ in 0..rounds {
        h.actual.remove(&socket);
        let registered = tokio::time::Instant::now();
        h.registered(&socket, None);
        h.next_unresponsive().await;
        renewed.push(registered.elapsed());
    }
    h.stop().await;
    renewed
}

#[tokio::test(start_paused = true)]
async fn the_first_probe_falls_within_the_first_period() {
    let config = quick().period(Some(Duration::from_secs(10)));
    for after in renewals(config, 20).await {
        assert!(after < Duration::from_secs(10), "{after:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_longest_period_works_like_any_other() {
    let config = quick().period(Some(MAX_CONFIG_DURATION));
    for after in renewals(config, 3).await {
        assert!(after < MAX_CONFIG_DURATION, "{after:?}");
    }
}

#[test]
fn periods_beyond_the_bound_are_refused_and_the_bound_accepted() {
    for too_long in [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        MAX_CONFIG_DURATION + Duration::from_nanos(1),
    ] {
        let config = quick().period(Some(too_long));
        let error = config.validate().unwrap_err();
        assert!(
            matches!(error, LivenessError::InvalidConfig(DurationOutOfRange { field: "period", value, .. }) if value == too_long),
            "{error}"
        );
        assert!(error.to_string().contains("period"), "{error}");
        let refused = LivenessMonitor::try_new(
            config,
            kpm_transport::fd::budget().clone(),
            Arc::new(DesiredState::new()),
            Arc::new(ActualState::new()),
            EventBus::default(),
        );
        assert_eq!(refused.map(|_| ()), Err(error));
    }
    let longest = quick().period(Some(MAX_CONFIG_DURATION)).timeout(MAX_CONFIG_DURATION);
    assert_eq!(longest.validate(), Ok(()));
}

#[test]
fn invalid_settings_are_refused() {
    let config = |period, failure_threshold, timeout| {
        LivenessConfig::default()
            .period(Some(Duration::from_millis(period)))
            .failure_threshold(failure_threshold)
            .timeout(Duration::from_millis(timeout))
            .watch_exits(true)
    };
    assert_eq!(config(0, 3, 0).validate(), Err(LivenessError::ZeroPeriod));
    assert_eq!(config(1000, 0, 100).validate(), Err(LivenessError::ZeroThreshold));
    assert!(matches!(config(1000, 3, 2000).validate(), Err(LivenessError::InvalidTimeout { .. })));
    assert_eq!(LivenessConfig::default().validate(), Ok(()));
    // Without probes, nothing of theirs is checked.
    let exits_only = config(1, 1, 1).period(None).failure_threshold(0);
    assert_eq!(exits_only.validate(), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_to_the_endpoint_gets_the_socket_checked_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, kept) = (dir.path().join("gone-reg.sock"), dir.path().join("kept-reg.sock"));
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let _listener = std::os::unix::net::UnixListener::bind(&kept).unwrap();
    let mut h = start(quick().period(None));
    let generation = h.registered(&socket, None);
    h.registered(&kept, None);
    wait_until("both followed", || h.monitor.stats().followed == 2).await;

    // Each plugin's endpoint is its registration socket here.
    h.monitor.suspect(&kept);
    h.monitor.suspect(&socket);
    let PluginEvent::Unresponsive { socket: s, generation: g, failures, reason, .. } =
        h.unresponsive().await
    else {
        unreachable!()
    };
    assert_eq!((s, g, failures), (socket.clone(), generation, 0));
    assert!(reason.contains("connection to") && reason.contains("refused"), "{reason}");
    // The one still served is looked at once more, a second later.
    wait_until("both checked, the kept one twice", || h.monitor.stats().socket_checks == 3).await;
    assert!(h.reported_unresponsive().is_empty(), "the socket still served is left alone");
    h.stop().await;
}
