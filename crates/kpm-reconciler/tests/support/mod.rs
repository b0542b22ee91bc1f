//! Scripted plugins and handlers for reconciler tests: what each plugin
//! incarnation does, played by kpm-test-support's fake registration plugin
//! on a real Unix socket, and a handler that checks the per-socket call
//! protocol as it records.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kpm_cache::{ActualState, DesiredState, EventBus, HandlerError, PluginDetails, PluginHandler};
use kpm_executor::{ExecutorConfig, OperationExecutor};
use kpm_reconciler::{Reconciler, ReconcilerConfig};
use kpm_test_support::registration::{FakePlugin, Reply, Served, info};
use parking_lot::Mutex;
use tonic::Status;

// === Scripted plugin ===

/// How one plugin incarnation behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginScript {
    pub plugin_type: String,
    pub name: String,
    /// GetInfo fails this many times before it answers.
    pub get_info_failures: usize,
    /// GetInfo never answers.
    pub hang: bool,
    /// NotifyRegistrationStatus(true) fails this many times.
    pub notify_failures: usize,
}

impl PluginScript {
    pub fn device(name: &str) -> Self {
        Self {
            plugin_type: "DevicePlugin".into(),
            name: name.into(),
            get_info_failures: 0,
            hang: false,
            notify_failures: 0,
        }
    }

    /// The fake plugin that behaves as the script says.
    pub fn plugin(&self) -> FakePlugin {
        // A hanging plugin hangs from its first call on, failures or not.
        let (failures, answer) =
            if self.hang { (0, Reply::Hang) } else { (self.get_info_failures, Reply::Answer) };
        FakePlugin::new(info(&self.plugin_type, &self.name, &["v1beta1"]))
            .get_info(vec![starting(); failures], answer)
            .notify(
                vec![Reply::Fail(Status::unavailable("plugin is busy")); self.notify_failures],
                Reply::Answer,
            )
    }
}

/// A `GetInfo` failure of a plugin that is not ready yet.
pub fn starting() -> Reply {
    Reply::Fail(Status::unavailable("plugin is starting"))
}

/// Stops a plugin: its server stops and its socket file goes.
pub fn stop(plugin: Served) {
    let socket = plugin.socket.clone();
    drop(plugin);
    let _ = std::fs::remove_file(socket);
}

// === Scripted handler ===

/// Where one socket is in the handler protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    #[default]
    Idle,
    Validated,
    Registered,
}

#[derive(Debug, Default)]
struct SocketCalls {
    phase: Phase,
    in_flight: usize,
    registrations: usize,
    deregistrations: usize,
}

/// Failure script of the handler, per plugin name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandlerScript {
    /// Names whose validation always fails.
    pub reject: Vec<String>,
    /// Validation fails this many times per name before it passes.
    pub validate_failures: usize,
    /// Register fails this many times per name before it passes.
    pub register_failures: usize,
}

/// A handler that records calls per endpoint (the socket path, since the
/// scripted plugins report no endpoint) and records every protocol violation.
#[derive(Debug, Default)]
pub struct Handler {
    script: HandlerScript,
    state: Mutex<HandlerState>,
}

#[derive(Debug, Default)]
struct HandlerState {
    sockets: HashMap<String, SocketCalls>,
    validate_calls: HashMap<String, usize>,
    register_calls: HashMap<String, usize>,
    log: Vec<String>,
    violations: Vec<String>,
}

impl Handler {
    pub fn new(script: HandlerScript) -> Arc<Self> {
        Arc::new(Self { script, state: Mutex::new(HandlerState::default()) })
    }

    /// Enters a call: checks the phase and that no other call for the socket runs.
    fn enter(&self, call: &str, name: &str, endpoint: &str, expected: &[Phase]) {
        let mut state = self.state.lock();
        state.log.push(format!("{call} {name} {endpoint}"));
        let socket = state.sockets.entry(endpoint.to_owned()).or_default();
        socket.in_flight += 1;
        let (in_flight, phase) = (socket.in_flight, socket.phase);
        if in_flight > 1 {
            state.violations.push(format!("{call} {endpoint}: concurrent calls"));
        }
        if !expected.contains(&phase) {
            state.violations.push(format!("{call} {endpoint}: in phase {phase:?}"));
        }
    }

    fn leave(&self, endpoint: &str, phase: Phase) {
        let mut state = self.state.lock();
        let socket = state.sockets.entry(endpoint.to_owned()).or_default();
        socket.in_flight -= 1;
        socket.phase = phase;
        match phase {
            Phase::Registered => socket.registrations += 1,
            Phase::Idle | Phase::Validated => {}
        }
    }

    pub fn log(&self) -> Vec<String> {
        self.state.lock().log.clone()
    }

    pub fn violations(&self) -> Vec<String> {
        self.state.lock().violations.clone()
    }

    /// (registrations, deregistrations) seen for the socket.
    pub fn balance(&self, endpoint: &Path) -> (usize, usize) {
        let state = self.state.lock();
        state
            .sockets
            .get(&endpoint.display().to_string())
            .map_or((0, 0), |s| (s.registrations, s.deregistrations))
    }

    /// Endpoints the handler currently considers registered.
    pub fn registered(&self) -> Vec<String> {
        let state = self.state.lock();
        let mut sockets: Vec<String> = state
            .sockets
            .iter()
            .filter(|(_, s)| s.phase == Phase::Registered)
            .map(|(endpoint, _)| endpoint.clone())
            .collect();
        sockets.sort();
        sockets
    }
}

fn count(calls: &mut HashMap<String, usize>, name: &str) -> usize {
    let n = calls.entry(name.to_owned()).or_default();
    *n += 1;
    *n
}

#[async_trait::async_trait]
impl PluginHandler for Handler {
    async fn validate(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let (name, endpoint) = (plugin.name.as_str(), &*plugin.endpoint.target());
        self.enter("validate", name, endpoint, &[Phase::Idle]);
        tokio::task::yield_now().await;
        let call = count(&mut self.state.lock().validate_calls, name);
        let fail =
            self.script.reject.iter().any(|r| r == name) || call <= self.script.validate_failures;
        self.leave(endpoint, if fail { Phase::Idle } else { Phase::Validated });
        if fail { Err(format!("{name} is not acceptable").into()) } else { Ok(()) }
    }

    async fn register(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let (name, endpoint) = (plugin.name.as_str(), &*plugin.endpoint.target());
        self.enter("register", name, endpoint, &[Phase::Validated]);
        tokio::task::yield_now().await;
        let call = count(&mut self.state.lock().register_calls, name);
        let fail = call <= self.script.register_failures;
        self.leave(endpoint, if fail { Phase::Idle } else { Phase::Registered });
        if fail { Err(format!("{name}: device manager not ready").into()) } else { Ok(()) }
    }

    async fn deregister(&self, plugin: &PluginDetails) {
        let (name, endpoint) = (plugin.name.as_str(), &*plugin.endpoint.target());
        self.enter("deregister", name, endpoint, &[Phase::Registered]);
        tokio::task::yield_now().await;
        self.leave(endpoint, Phase::Idle);
        self.state.lock().sockets.entry(endpoint.to_owned()).or_default().deregistrations += 1;
    }
}

// === Manager under test ===

pub struct Manager {
    pub desired: Arc<DesiredState>,
    pub actual: Arc<ActualState>,
    pub reconciler: Arc<Reconciler>,
    pub events: EventBus,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Manager {
    /// A reconciler with the real executor, not yet running.
    pub fn new(config: ExecutorConfig) -> Self {
        Self::with_reconciler(config, ReconcilerConfig::default())
    }

    /// Like [`new`](Self::new), with a reconciler config of the test's own.
    pub fn with_reconciler(config: ExecutorConfig, reconciler: ReconcilerConfig) -> Self {
        let desired = Arc::new(DesiredState::new());
        let actual = Arc::new(ActualState::new());
        let events = EventBus::default();
        let budget = kpm_transport::fd::budget().clone();
        let executor = OperationExecutor::try_new(config, budget, events.clone()).unwrap();
        let reconciler = Arc::new(
            Reconciler::try_new(
                reconciler,
                Arc::clone(&desired),
                Arc::clone(&actual),
                executor,
                events.clone(),
            )
            .unwrap(),
        );
        Self { desired, actual, reconciler, events, stop: None, task: None }
    }

    pub fn start(&mut self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let reconciler = Arc::clone(&self.reconciler);
        self.task = Some(tokio::spawn(async move {
            reconciler.run(async { drop(rx.await) }).await;
        }));
        self.stop = Some(tx);
    }

    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }

    /// Checks `condition` whenever ActualState changes or an operation
    /// completes, and at least every second, until it holds or `within` (tokio
    /// time) passes.
    pub async fn eventually(
        &self,
        within: Duration,
        mut condition: impl FnMut(&Self) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        let mut changes = self.actual.subscribe();
        let mut completions = self.reconciler.executor().operations().completions();
        loop {
            if condition(self) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::select! {
                () = changes.changed() => {}
                () = completions.changed() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}
