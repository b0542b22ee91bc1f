//! The reconciler: drives [`ActualState`] towards [`DesiredState`] through the
//! [`OperationExecutor`], and owns the table of plugin handlers.
//!
//! Unlike the kubelet's reconciler, which polls once a second, it wakes when
//! DesiredState changes, when an operation completes, when a backoff expires
//! and when a handler is added; a slow periodic pass is only a safety net.
//!
//! A pass, in socket-path order:
//! 1. every registered plugin whose socket is gone is unregistered; one whose
//!    socket has a new incarnation is re-registered (unregister, then
//!    register, as one operation);
//! 2. every desired socket that is not registered is registered; a new
//!    incarnation starts with a clean backoff;
//! 3. executor entries of sockets that are neither desired nor registered are
//!    forgotten.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kpm_cache::{
    ActualState, ChangeSignal, DesiredState, EventBus, Generation, PluginEvent, PluginHandler,
};
use kpm_executor::{ExecutorError, Handlers, OperationExecutor};
use parking_lot::Mutex;
use tokio::time::Instant;

/// Settings of the reconciler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcilerConfig {
    /// Period of the safety-net pass; every other pass is triggered by an event.
    pub resync_period: Duration,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        Self { resync_period: Duration::from_secs(10) }
    }
}

/// Drives ActualState towards DesiredState.
pub struct Reconciler {
    desired: Arc<DesiredState>,
    actual: Arc<ActualState>,
    executor: OperationExecutor,
    events: EventBus,
    config: ReconcilerConfig,
    /// Copy-on-write: each operation gets the table as it was when it started.
    handlers: Mutex<Arc<Handlers>>,
    handlers_changed: ChangeSignal,
    /// The incarnation last handed to the executor per socket path, to tell a
    /// new incarnation (clean backoff) from a retry of the same one.
    attempted: Mutex<HashMap<PathBuf, Generation>>,
    /// Starts refused because the socket was backing off, for metrics.
    backoff_skips: AtomicU64,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("handler_types", &self.handler_types())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Reconciler {
    pub fn new(
        desired: Arc<DesiredState>,
        actual: Arc<ActualState>,
        executor: OperationExecutor,
        events: EventBus,
        config: ReconcilerConfig,
    ) -> Self {
        Self {
            desired,
            actual,
            executor,
            events,
            config,
            handlers: Mutex::new(Arc::new(Handlers::new())),
            handlers_changed: ChangeSignal::default(),
            attempted: Mutex::new(HashMap::new()),
            backoff_skips: AtomicU64::new(0),
        }
    }

    /// Sets the handler for `plugin_type`, before or after [`run`](Self::run)
    /// starts. Sockets that are not registered yet (for instance because no
    /// handler knew their type) are retried at once.
    pub fn add_handler(&self, plugin_type: impl Into<String>, handler: Arc<dyn PluginHandler>) {
        let plugin_type = plugin_type.into();
        {
            let mut handlers = self.handlers.lock();
            let mut table = Handlers::clone(&handlers);
            table.insert(plugin_type.clone(), handler);
            *handlers = Arc::new(table);
        }
        for plugin in self.desired.snapshot() {
            if !self.actual.contains_generation(&plugin.socket_path, plugin.generation) {
                self.executor.operations().reset_backoff(&plugin.socket_path);
            }
        }
        tracing::info!(%plugin_type, "plugin handler added");
        self.handlers_changed.bump();
    }

    /// The plugin types that have a handler, sorted.
    pub fn handler_types(&self) -> Vec<String> {
        let mut types: Vec<String> = self.handlers.lock().keys().cloned().collect();
        types.sort();
        types
    }

    pub fn executor(&self) -> &OperationExecutor {
        &self.executor
    }

    /// How many operations were not started because their socket was
    /// backing off after a failure (the kubelet logs these at V(4)).
    pub fn backoff_skips(&self) -> u64 {
        self.backoff_skips.load(Ordering::Relaxed)
    }

    /// Runs passes until `shutdown` completes. Returns without waiting for
    /// running operations; see [`OperationExecutor::operations`] for that.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        // Subscribe before the first pass so that no change is missed.
        let mut desired_changes = self.desired.subscribe();
        let mut completions = self.executor.operations().completions();
        let mut handler_changes = self.handlers_changed.subscribe();
        tokio::pin!(shutdown);
        loop {
            self.reconcile();
            let now = Instant::now();
            let resync = now + self.config.resync_period;
            // Only future expiries: a key whose retry time passed without a
            // start (its socket went away) must not make this loop spin.
            let wake_at = self
                .executor
                .operations()
                .next_retry_at()
                .filter(|at| *at > now)
                .map_or(resync, |at| at.min(resync));
            tokio::select! {
                () = &mut shutdown => break,
                () = desired_changes.changed() => {}
                () = completions.changed() => {}
                () = handler_changes.changed() => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
        tracing::debug!("reconciler stopped");
    }

    /// One pass. Cheap when nothing changed: O(n) over both caches, no IO.
    pub fn reconcile(&self) {
        let handlers = Arc::clone(&self.handlers.lock());
        let mut attempted = self.attempted.lock();

        // 1. Unregister plugins whose socket is gone; re-register new incarnations.
        for (socket, registered_generation) in self.actual.generations() {
            let desired = self.desired.generation(&socket);
            if desired == Some(registered_generation) {
                continue;
            }
            let Some(registered) = self.actual.get(&socket) else { continue };
            match desired {
                None => {
                    self.start(&socket, self.executor.unregister(registered, self.actual.clone()));
                }
                Some(generation) => {
                    if self.note_attempt(&mut attempted, &socket, generation) {
                        self.executor.operations().reset_backoff(&socket);
                    }
                    let started = self.executor.reregister(
                        registered,
                        generation,
                        Arc::clone(&handlers),
                        self.actual.clone(),
                    );
                    self.start(&socket, started);
                }
            }
        }

        // 2. Register desired sockets that are not registered at all.
        for plugin in self.desired.snapshot() {
            let socket = &plugin.socket_path;
            if self.actual.contains(socket) {
                continue; // registered, or handled in step 1
            }
            if self.note_attempt(&mut attempted, socket, plugin.generation) {
                self.executor.operations().reset_backoff(socket);
            }
            // Cheaper than building an operation only to have it refused.
            if self.executor.operations().is_pending(socket) {
                continue;
            }
            let started = self.executor.register(
                socket,
                plugin.generation,
                Arc::clone(&handlers),
                self.actual.clone(),
            );
            self.start(socket, started);
        }

        // 3. Forget sockets that are neither desired nor registered.
        attempted.retain(|socket, _| {
            let gone = !self.desired.contains(socket) && !self.actual.contains(socket);
            if gone {
                self.executor.operations().forget(socket);
            }
            !gone
        });
    }

    /// Records that `generation` is being attempted for `socket`; true if it is
    /// an incarnation not attempted before (announced as a new socket).
    fn note_attempt(
        &self,
        attempted: &mut HashMap<PathBuf, Generation>,
        socket: &Path,
        generation: Generation,
    ) -> bool {
        if attempted.insert(socket.to_path_buf(), generation) == Some(generation) {
            return false;
        }
        self.events.publish(PluginEvent::SocketSeen { socket: socket.to_path_buf(), generation });
        true
    }

    fn start(&self, socket: &Path, started: Result<(), ExecutorError>) {
        match started {
            Ok(()) => tracing::debug!(socket = %socket.display(), "operation started"),
            // Expected while an operation runs or backs off: the completion or
            // the backoff expiry wakes the loop again.
            Err(ExecutorError::Backoff { .. }) => {
                self.backoff_skips.fetch_add(1, Ordering::Relaxed);
            }
            Err(ExecutorError::AlreadyRunning { .. } | ExecutorError::FailedPermanently { .. }) => {
            }
            Err(err) => {
                tracing::error!(socket = %socket.display(), error = %err, "cannot start operation");
            }
        }
    }
}
