//! Handlers that panic or hang, in the whole manager (real watcher, real
//! sockets): every handler call is isolated by a deadline, the plugin is
//! told why it was rejected, a register cut off halfway is undone, a
//! deregistration completes all the same, and the manager keeps serving.
//! Each scenario ends with `Node::check`: convergence, exactly-once
//! deregistration, no leaked operation entries or tasks, still serving.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kpm::{
    BasicHandler, ExecutorConfig, HandlerError, ManagerHandle, PluginDetails, PluginEvent,
    PluginHandler, PluginManager,
};
use kpm_registrar::Registrar;
use kpm_test_support::{DEADLINE, wait_until};
use parking_lot::Mutex;

const HANDLER_TIMEOUT: Duration = Duration::from_millis(300);
/// What a faulty handler panics with.
const BOOM: &str = "boom";

/// Leaves the handler's own panics unreported: with `RUST_BACKTRACE` set,
/// writing a backtrace on a busy machine can outlast [`HANDLER_TIMEOUT`] and
/// turn an expected panic into a timeout. Other panics are reported as usual.
fn quiet_boom() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<String>().map(String::as_str) != Some(BOOM) {
                report(info);
            }
        }));
    });
}
/// The type of the misbehaving handler.
const TEST_PLUGIN: &str = "TestPlugin";
/// A type whose handler behaves, for the "still serving" check.
const GOOD_PLUGIN: &str = "GoodPlugin";

// === A handler that misbehaves on request ===

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Validate,
    Register,
    Deregister,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Panic,
    Hang,
}

/// Fails each step as scripted; records every call, and counts the hanging
/// calls that were cut off (their future dropped before it finished).
#[derive(Default)]
struct FaultyHandler {
    faults: Mutex<HashMap<String, Fault>>,
    calls: Mutex<Vec<String>>,
    cut_off: AtomicUsize,
}

/// Counts a hanging call as cut off when its future is dropped.
struct CutOff<'a>(&'a AtomicUsize);

impl Drop for CutOff<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl FaultyHandler {
    fn set(&self, step: Step, fault: Fault) {
        self.faults.lock().insert(format!("{step:?}"), fault);
    }

    /// `"<Step> <name>"` per call, in order.
    fn calls(&self) -> Vec<String> {
        self.calls.lock().clone()
    }

    fn cut_off(&self) -> usize {
        self.cut_off.load(Ordering::SeqCst)
    }

    async fn act(&self, step: Step, name: &str) -> Result<(), HandlerError> {
        self.calls.lock().push(format!("{step:?} {name}"));
        let fault = self.faults.lock().get(&format!("{step:?}")).copied().unwrap_or(Fault::None);
        match fault {
            Fault::None => Ok(()),
            Fault::Panic => {
                quiet_boom();
                panic!("{BOOM}")
            }
            Fault::Hang => {
                let _cut_off = CutOff(&self.cut_off);
                std::future::pending().await
            }
        }
    }
}

#[async_trait::async_trait]
impl PluginHandler for FaultyHandler {
    async fn validate(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let name = plugin.name.as_str();
        self.act(Step::Validate, name).await
    }
    async fn register(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let name = plugin.name.as_str();
        self.act(Step::Register, name).await
    }
    async fn deregister(&self, plugin: &PluginDetails) {
        let name = plugin.name.as_str();
        let _ = self.act(Step::Deregister, name).await;
    }
}

// === A manager under test ===

/// A running `PluginManager` on a temp registry with the faulty handler for
/// `TestPlugin`, a good one for `GoodPlugin`, and its events collected.
struct Node {
    manager: ManagerHandle,
    handler: Arc<FaultyHandler>,
    events: Arc<Mutex<Vec<PluginEvent>>>,
    registry: PathBuf,
    baseline_tasks: usize,
    fresh_plugins: AtomicUsize,
    stop: tokio::sync::oneshot::Sender<()>,
    running: tokio::task::JoinHandle<kpm::Result<()>>,
    _root: tempfile::TempDir,
}

impl Node {
    async fn start() -> Self {
        let root = tempfile::tempdir().unwrap();
        let registry = root.path().join("plugins_registry");
        let handler = Arc::new(FaultyHandler::default());
        let manager = PluginManager::builder()
            .registry_dir(&registry)
            .handler(TEST_PLUGIN, handler.clone())
            .handler(GOOD_PLUGIN, Arc::new(BasicHandler::new(GOOD_PLUGIN)))
            .executor_config(ExecutorConfig::default().handler_timeout(HANDLER_TIMEOUT))
            .liveness(None)
            .build()
            .unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let handle = manager.handle();
        let mut subscription = handle.subscribe();
        let collected = Arc::clone(&events);
        tokio::spawn(async move {
            while let Ok(event) = subscription.recv().await {
                collected.lock().push(event);
            }
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(manager.run(async { drop(stopped.await) }));
        wait_until("the registry directory is created", || registry.is_dir()).await;
        let mut node = Self {
            manager: handle,
            handler,
            events,
            registry,
            baseline_tasks: 0,
            fresh_plugins: AtomicUsize::new(0),
            stop,
            running,
            _root: root,
        };
        // The tasks' baseline, once everything is up: after a first plugin.
        let warm_up = node.plugin(GOOD_PLUGIN, "warm-up.example.com").await;
        assert!(warm_up.wait_for_status(DEADLINE).await.unwrap().plugin_registered);
        node.wait_for_state(warm_up.socket_path(), "registered").await;
        let warm_up_socket = warm_up.socket_path().to_path_buf();
        warm_up.shutdown().await.unwrap();
        node.wait_event("the warm-up plugin is deregistered", |e| {
            deregistered_key(e).is_some_and(|(s, _)| s == warm_up_socket)
        })
        .await;
        wait_until("the warm-up plugin is gone", || {
            node.states().is_empty() && node.manager.stats().operations == 0
        })
        .await;
        node.baseline_tasks = tokio::runtime::Handle::current().metrics().num_alive_tasks();
        node.events.lock().clear();
        node
    }

    /// Serves a plugin of `plugin_type` called `name`, version 1.0.
    async fn plugin(&self, plugin_type: &str, name: &str) -> Registrar {
        Registrar::builder(plugin_type, name)
            .versions(["1.0"])
            .socket_dir(&self.registry)
            .serve()
            .await
            .unwrap()
    }

    /// Each socket's state by name (a backoff's retry time is left out).
    fn states(&self) -> BTreeMap<PathBuf, &'static str> {
        self.manager.status().into_iter().map(|s| (s.socket_path, s.state.as_str())).collect()
    }

    async fn wait_for_state(&self, socket: &Path, state: &'static str) {
        let what = format!("{} is {state}", socket.display());
        wait_until(&what, || self.states().get(socket) == Some(&state)).await;
    }

    fn events(&self) -> Vec<PluginEvent> {
        self.events.lock().clone()
    }

    /// Waits for an event `matches` accepts; returns it.
    async fn wait_event(&self, what: &str, matches: impl Fn(&PluginEvent) -> bool) -> PluginEvent {
        wait_until(what, || self.events().iter().any(&matches)).await;
        self.events().into_iter().find(matches).unwrap()
    }

    /// The checks every scenario ends with; `expected` is every socket still
    /// present and its state.
    async fn check(&self, expected: &[(&Path, &'static str)]) {
        // Still serving: a fresh plugin of a well-behaved type registers and leaves.
        let n = self.fresh_plugins.fetch_add(1, Ordering::SeqCst);
        let fresh = self.plugin(GOOD_PLUGIN, &format!("fresh-{n}.example.com")).await;
        assert!(fresh.wait_for_status(DEADLINE).await.unwrap().plugin_registered);
        let fresh_socket = fresh.socket_path().to_path_buf();
        self.wait_for_state(&fresh_socket, "registered").await;
        fresh.shutdown().await.unwrap();

        // Convergence.
        let expected: BTreeMap<PathBuf, &'static str> =
            expected.iter().map(|(socket, state)| (socket.to_path_buf(), *state)).collect();
        wait_until(&format!("the status is {expected:?}"), || self.states() == expected).await;

        // Exactly once: every registration that is no longer registered was
        // deregistered once, after it; nothing else was deregistered.
        let registered_now: HashSet<(PathBuf, u64)> = self
            .manager
            .actual_state()
            .snapshot()
            .into_iter()
            .map(|info| (info.socket_path, info.generation.get()))
            .collect();
        wait_until("every ended registration is deregistered", || {
            let events = self.events();
            let deregistered: HashSet<_> = events.iter().filter_map(deregistered_key).collect();
            events
                .iter()
                .filter_map(registered_key)
                .all(|k| registered_now.contains(&k) || deregistered.contains(&k))
        })
        .await;
        let mut registered = HashMap::new();
        let mut deregistered = HashSet::new();
        for (at, event) in self.events().iter().enumerate() {
            if let Some(k) = registered_key(event) {
                assert!(registered.insert(k.clone(), at).is_none(), "registered twice: {k:?}");
            }
            if let Some(k) = deregistered_key(event) {
                assert!(registered.get(&k).is_some_and(|r| *r < at), "not registered: {k:?}");
                assert!(deregistered.insert(k.clone()), "deregistered twice: {k:?}");
            }
        }

        // No leaks: an executor entry per failing socket only; with no
        // plugins left, the runtime's tasks are back to their baseline.
        let failing = expected.values().filter(|s| **s != "registered").count();
        wait_until(&format!("{failing} executor entries"), || {
            self.manager.stats().operations == failing
        })
        .await;
        if expected.is_empty() {
            let runtime = tokio::runtime::Handle::current();
            let baseline = self.baseline_tasks;
            wait_until(&format!("tasks back to {baseline}"), || {
                runtime.metrics().num_alive_tasks() <= baseline
            })
            .await;
        }
    }

    /// Stops the manager; it must stop cleanly.
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.running.await.unwrap().unwrap();
    }
}

fn registered_key(event: &PluginEvent) -> Option<(PathBuf, u64)> {
    match event {
        PluginEvent::Registered { socket, generation, .. } => {
            Some((socket.clone(), generation.get()))
        }
        _ => None,
    }
}

fn deregistered_key(event: &PluginEvent) -> Option<(PathBuf, u64)> {
    match event {
        PluginEvent::Deregistered { socket, generation, .. } => {
            Some((socket.clone(), generation.get()))
        }
        _ => None,
    }
}

/// Waits until `plugin` is told it is registered (after a retry).
async fn registers_at_a_retry(plugin: &Registrar) {
    let mut status = plugin.status();
    let registered = tokio::time::timeout(
        DEADLINE,
        status.wait_for(|s| s.as_ref().is_some_and(|s| s.plugin_registered)),
    )
    .await;
    assert!(registered.is_ok(), "registered at a retry");
}

const PANICKED: &str = "the TestPlugin handler panicked: boom";
const HUNG: &str = "the TestPlugin handler did not answer within 300ms";

// === validate ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_validate_is_reported_and_retried_until_it_answers() {
    let node = Node::start().await;
    node.handler.set(Step::Validate, Fault::Panic);
    let plugin = node.plugin(TEST_PLUGIN, "validate-panics.example.com").await;
    let socket = plugin.socket_path().to_path_buf();
    let status = plugin.wait_for_status(DEADLINE).await.unwrap();
    assert!(!status.plugin_registered);
    assert_eq!(
        status.error,
        format!("RegisterPlugin error -- plugin validation failed with err: {PANICKED}")
    );
    node.wait_for_state(&socket, "backing_off").await;
    node.check(&[(&socket, "backing_off")]).await;
    assert!(node.handler.calls().iter().all(|c| c.starts_with("Validate")));

    // The next attempt, after the backoff, meets a handler that answers.
    node.handler.set(Step::Validate, Fault::None);
    registers_at_a_retry(&plugin).await;
    node.check(&[(&socket, "registered")]).await;

    plugin.shutdown().await.unwrap();
    node.check(&[]).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_validate_is_cut_off_at_the_deadline() {
    let node = Node::start().await;
    node.handler.set(Step::Validate, Fault::Hang);
    let plugin = node.plugin(TEST_PLUGIN, "validate-hangs.example.com").await;
    let socket = plugin.socket_path().to_path_buf();
    let status = plugin.wait_for_status(DEADLINE).await.unwrap();
    assert!(!status.plugin_registered);
    assert_eq!(
        status.error,
        format!("RegisterPlugin error -- plugin validation failed with err: {HUNG}")
    );
    assert!(node.handler.cut_off() >= 1, "the hanging call is dropped");
    node.check(&[(&socket, "backing_off")]).await;

    plugin.shutdown().await.unwrap();
    node.check(&[]).await;
    assert_eq!(node.handler.cut_off(), node.handler.calls().len(), "every hanging call ended");
    node.stop().await;
}

// === register ===

/// A plugin meets a register that misbehaves as `fault`: it is told
/// `reason`, and the handler, which may have stopped halfway, is told to
/// forget it. Returns the running node and the plugin, still failed.
async fn register_undone(fault: Fault, name: &str, reason: &str) -> (Node, Registrar, PathBuf) {
    let node = Node::start().await;
    node.handler.set(Step::Register, fault);
    let plugin = node.plugin(TEST_PLUGIN, name).await;
    let socket = plugin.socket_path().to_path_buf();
    let status = plugin.wait_for_status(DEADLINE).await.unwrap();
    assert!(!status.plugin_registered);
    assert_eq!(
        status.error,
        format!("RegisterPlugin error -- plugin registration failed with err: {reason}")
    );
    assert_eq!(
        node.handler.calls()[..3],
        [format!("Validate {name}"), format!("Register {name}"), format!("Deregister {name}")]
    );
    (node, plugin, socket)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_register_is_undone_and_retried() {
    let (node, plugin, socket) =
        register_undone(Fault::Panic, "register-panics.example.com", PANICKED).await;
    node.check(&[(&socket, "backing_off")]).await;
    assert!(
        !node.events().iter().any(|e| registered_key(e).is_some_and(|(s, _)| s == socket)),
        "a plugin whose register panicked is never registered"
    );

    node.handler.set(Step::Register, Fault::None);
    registers_at_a_retry(&plugin).await;
    node.check(&[(&socket, "registered")]).await;
    plugin.shutdown().await.unwrap();
    node.check(&[]).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_register_is_cut_off_and_undone() {
    let (node, plugin, socket) =
        register_undone(Fault::Hang, "register-hangs.example.com", HUNG).await;
    assert!(node.handler.cut_off() >= 1, "the hanging call is dropped");
    node.check(&[(&socket, "backing_off")]).await;

    plugin.shutdown().await.unwrap();
    node.check(&[]).await;
    node.stop().await;
}

// === deregister ===

/// A plugin registers with a deregister that misbehaves as `fault`, then
/// its socket goes: it is deregistered exactly once all the same.
async fn deregistered_despite(fault: Fault) {
    let node = Node::start().await;
    node.handler.set(Step::Deregister, fault);
    let plugin = node.plugin(TEST_PLUGIN, "deregister-fails.example.com").await;
    let socket = plugin.socket_path().to_path_buf();
    assert!(plugin.wait_for_status(DEADLINE).await.unwrap().plugin_registered);
    node.check(&[(&socket, "registered")]).await;

    plugin.shutdown().await.unwrap();
    node.wait_event("the plugin is deregistered", |e| {
        deregistered_key(e).is_some_and(|(s, _)| s == socket)
    })
    .await;
    node.check(&[]).await;
    let deregisters = node.handler.calls().iter().filter(|c| c.starts_with("Deregister")).count();
    assert_eq!(deregisters, 1);
    if fault == Fault::Hang {
        assert_eq!(node.handler.cut_off(), 1, "the hanging call is dropped");
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_deregister_still_deregisters_once() {
    deregistered_despite(Fault::Panic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_deregister_still_deregisters_once() {
    deregistered_despite(Fault::Hang).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_deregister_does_not_block_the_next_incarnation() {
    let node = Node::start().await;
    node.handler.set(Step::Deregister, Fault::Hang);
    let name = "restarts.example.com";
    let first = node.plugin(TEST_PLUGIN, name).await;
    let socket = first.socket_path().to_path_buf();
    assert!(first.wait_for_status(DEADLINE).await.unwrap().plugin_registered);
    // Told before it is recorded.
    node.wait_for_state(&socket, "registered").await;
    let first_generation = node.manager.actual_state().get(&socket).unwrap().generation;

    // The plugin restarts: the old incarnation's deregister hangs until its
    // deadline, then the new one registers.
    first.shutdown().await.unwrap();
    let second = node.plugin(TEST_PLUGIN, name).await;
    assert!(second.wait_for_status(DEADLINE).await.unwrap().plugin_registered);
    node.wait_for_state(&socket, "registered").await;
    let second_generation = node.manager.actual_state().get(&socket).unwrap().generation;
    assert!(second_generation > first_generation);
    node.check(&[(&socket, "registered")]).await;

    second.shutdown().await.unwrap();
    node.check(&[]).await;
    assert_eq!(node.handler.cut_off(), 2, "both hanging deregisters are dropped");
    node.stop().await;
}
