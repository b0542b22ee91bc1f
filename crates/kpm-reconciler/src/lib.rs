//! The reconciler: drives [`ActualState`] towards [`DesiredState`] through the
//! [`OperationExecutor`], and owns the table of plugin handlers.
//!
//! Unlike the kubelet's reconciler, which polls once a second, it wakes when
//! DesiredState changes, when an operation completes, when a backoff expires
//! and when a handler is added, and then looks only at the sockets concerned:
//! the paths DesiredState journaled as changed
//! ([`DesiredState::take_changed`]), the paths whose operation completed
//! ([`OperationMap::take_completed`](kpm_executor::OperationMap::take_completed))
//! and the paths whose backoff, recorded when a start was refused, has
//! expired. The work per event is O(changed sockets). A full pass over every
//! desired, registered or attempted socket runs when a handler is added and
//! every [`ReconcilerConfig::reconcile_period`] as a safety net.
//!
//! Each socket is decided alone, from its desired generation (the
//! [registrable](DesiredState::registrable) one: a socket held back because
//! its endpoint is gone counts as absent), its registered generation and its
//! executor entry:
//! - registered but not desired: unregister;
//! - registered in another incarnation than desired: re-register (unregister,
//!   then register, as one operation);
//! - desired but not registered: register; a new incarnation starts with a
//!   clean backoff;
//! - neither: forget its executor entry.
//!
//! Within a batch every unregistration and re-registration starts before any
//! registration (what an old plugin held, such as a device resource moving
//! to another socket path, is released first), each phase in path order.
//!
//! Invariant: nothing is lost. Every state change that matters to a socket
//! (its DesiredState entry, the end of its operation, the end of its backoff)
//! puts the socket in a later batch: a journal is written before its signal
//! wakes the loop, and a pass drains the journals before it reads the
//! caches. What no event reports (ActualState changed by someone else) is
//! found by the periodic full pass. And since every operation goes through
//! the executor's one operation per socket, a handler sees, per socket, only
//! validate → register → deregister sequences, never two calls at once, and
//! every registration is deregistered exactly once.
//!
//! `tests/properties.rs` checks these, and convergence, over random scripts
//! of socket churn, misbehaving plugins and handlers and a late handler,
//! with real sockets on paused time; it runs every script a second time
//! with the periodic pass out of reach, so that the safety net cannot hide
//! a lost event.
//!
//! A full pass costs a lookup per socket, so on a node where nothing happens
//! it is skipped: when the last full pass found every socket in sync, no pass
//! acted since, and neither state's [change
//! count](DesiredState::change_count) has moved, it would find the same.

#![deny(missing_docs)]

use kpm_api::config::check_durations;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kpm_cache::{
    ActualState, ChangeSignal, DesiredState, EventBus, Generation, PluginEvent, PluginHandler,
    Registered,
};
use kpm_executor::{ExecutorError, Handlers, Inspection, OperationExecutor};
use parking_lot::Mutex;
use tokio::time::Instant;

/// Settings of the reconciler. Build it from [`Default`] with the setters;
/// the fields are public to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconcilerConfig {
    /// Period of the safety-net full pass; every other pass is triggered by
    /// an event and looks only at the sockets it concerns.
    /// [`Duration::ZERO`] turns the periodic pass off (passes still run on
    /// events and when a handler is added). At most [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION)
    /// (365 days); see [`validate`](Self::validate).
    pub reconcile_period: Duration,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        Self { reconcile_period: Duration::from_secs(10) }
    }
}

impl ReconcilerConfig {
    /// Sets [`reconcile_period`](Self::reconcile_period) (default 10 s; zero: no
    /// periodic pass).
    #[must_use]
    pub fn reconcile_period(mut self, period: Duration) -> Self {
        self.reconcile_period = period;
        self
    }

    /// Checks `reconcile_period` is at most [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION) (zero is
    /// allowed: no periodic pass). [`Reconciler::run`] would not panic on a
    /// longer one (a period past the clock's range means no periodic pass),
    /// but such a setting is a mistake worth reporting:
    /// [`Reconciler::try_new`] refuses it.
    pub fn validate(&self) -> Result<(), ReconcilerError> {
        Ok(check_durations(&[], &[("reconcile_period", self.reconcile_period)])?)
    }
}

/// The one error type of the reconciler crate: its work never fails (failed
/// operations are retried with backoff), only its config and a second
/// handler for a plugin type can be refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcilerError {
    /// A duration of the [`ReconcilerConfig`] is out of range.
    #[error("invalid reconciler config: {0}")]
    InvalidConfig(#[from] kpm_api::config::DurationOutOfRange),
    /// [`Reconciler::add_handler`] for a plugin type that has a handler.
    #[error("add handler: plugin type {plugin_type} already has a handler")]
    HandlerExists {
        /// The plugin type.
        plugin_type: String,
    },
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
    /// Held for a whole pass, so passes never interleave.
    state: Mutex<State>,
    /// Starts refused because the socket was backing off, for metrics.
    backoff_skips: AtomicU64,
    /// Full passes skipped because nothing could have changed since one
    /// found every socket in sync: only the tests look.
    #[cfg(test)]
    full_passes_skipped: AtomicU64,
}

/// What the reconciler remembers between passes.
#[derive(Debug, Default)]
struct State {
    /// The incarnation last handed to the executor per socket path, to tell a
    /// new incarnation (clean backoff) from a retry of the same one.
    attempted: HashMap<PathBuf, Generation>,
    /// When a socket refused because of its backoff may be tried again. An
    /// entry made stale by a later event only costs one idle look at it.
    retries: BTreeSet<(Instant, PathBuf)>,
    /// The change counts of DesiredState and ActualState read before the
    /// last full pass, if it found every socket in sync and no pass has
    /// acted since.
    in_sync_at: Option<(u64, u64)>,
}

impl State {
    /// Moves the sockets whose backoff has expired by `now` into `dirty`.
    fn take_due(&mut self, now: Instant, dirty: &mut HashSet<PathBuf>) {
        while self.retries.first().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, socket)) = self.retries.pop_first() {
                dirty.insert(socket);
            }
        }
    }
}

/// What one socket needs, as [`Reconciler::decide`] found it.
#[derive(Debug)]
enum Action {
    Unregister(Registered),
    Reregister(Registered, Generation),
    Register(Generation),
    Forget,
}

impl Action {
    /// The order of actions within a batch: what an old plugin held is
    /// released before anything registers. Forgetting has no effect outside.
    fn phase(&self) -> u8 {
        match self {
            Self::Unregister(_) | Self::Reregister(..) => 0,
            Self::Register(_) => 1,
            Self::Forget => 2,
        }
    }
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
    /// A reconciler with `config`, checked here once
    /// ([`ReconcilerConfig::validate`]: the error names the field), that
    /// drives `actual` towards `desired` through `executor`, publishing on
    /// `events`. It has no handlers yet ([`add_handler`](Self::add_handler))
    /// and does nothing until [`run`](Self::run).
    pub fn try_new(
        config: ReconcilerConfig,
        desired: Arc<DesiredState>,
        actual: Arc<ActualState>,
        executor: OperationExecutor,
        events: EventBus,
    ) -> Result<Self, ReconcilerError> {
        config.validate()?;
        Ok(Self {
            desired,
            actual,
            executor,
            events,
            config,
            handlers: Mutex::new(Arc::new(Handlers::new())),
            handlers_changed: ChangeSignal::default(),
            state: Mutex::new(State::default()),
            backoff_skips: AtomicU64::new(0),
            #[cfg(test)]
            full_passes_skipped: AtomicU64::new(0),
        })
    }

    /// Adds the handler for `plugin_type`, before or after [`run`](Self::run)
    /// starts. Sockets that are not registered yet (for instance because no
    /// handler knew their type) have their backoff reset and are retried at
    /// once, by a full pass. The table is copy-on-write: each operation sees
    /// it as it was when the operation started.
    ///
    /// A type that has a handler keeps it: replacing it would leave its
    /// registered plugins with a handler that never saw them, so that is
    /// [`ReconcilerError::HandlerExists`].
    pub fn add_handler(
        &self,
        plugin_type: impl Into<String>,
        handler: Arc<dyn PluginHandler>,
    ) -> Result<(), ReconcilerError> {
        let plugin_type = plugin_type.into();
        {
            let mut handlers = self.handlers.lock();
            if handlers.contains_key(&plugin_type) {
                return Err(ReconcilerError::HandlerExists { plugin_type });
            }
            let mut table = Handlers::clone(&handlers);
            table.insert(plugin_type.clone(), handler);
            *handlers = Arc::new(table);
        }
        for socket in self.desired.paths() {
            if self.desired.generation(&socket) != self.actual.generation(&socket) {
                self.executor.operations().reset_backoff(&socket);
            }
        }
        tracing::info!(%plugin_type, "plugin handler added");
        self.handlers_changed.bump();
        Ok(())
    }

    /// The plugin types that have a handler, sorted.
    pub fn handler_types(&self) -> Vec<String> {
        let mut types: Vec<String> = self.handlers.lock().keys().cloned().collect();
        types.sort();
        types
    }

    /// What registering `socket` would find now, with the handlers this
    /// reconciler registers with; registers nothing (see
    /// [`OperationExecutor::inspect`]).
    pub async fn inspect(&self, socket: &Path) -> Inspection {
        let handlers = Arc::clone(&self.handlers.lock());
        self.executor.inspect(socket, handlers).await
    }

    /// The executor the operations run on, to query their state.
    pub fn executor(&self) -> &OperationExecutor {
        &self.executor
    }

    /// How many operations were not started because their socket was
    /// backing off after a failure (the kubelet logs these at V(4)).
    pub fn backoff_skips(&self) -> u64 {
        self.backoff_skips.load(Ordering::Relaxed)
    }

    /// How many full passes were skipped because neither state had changed
    /// since one that found every socket in sync.
    #[cfg(test)]
    fn full_passes_skipped(&self) -> u64 {
        self.full_passes_skipped.load(Ordering::Relaxed)
    }

    /// Runs until `shutdown` completes: a full pass first, then a pass over
    /// the changed sockets after every wake-up, and a full pass when a
    /// handler is added and every `reconcile_period`. Returns without waiting
    /// for running operations; see [`OperationExecutor::operations`] for that.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        // Subscribe before the first pass so that no change is missed.
        let mut desired_changes = self.desired.subscribe();
        let mut completions = self.executor.operations().completions();
        let mut handler_changes = self.handlers_changed.subscribe();
        tokio::pin!(shutdown);
        let mut full = true;
        // `None`: no periodic pass (period zero, or past the clock's range).
        let mut resync_at = None;
        loop {
            if full || resync_at.is_some_and(|at| Instant::now() >= at) {
                self.reconcile();
                resync_at = self.next_full_pass(Instant::now());
            } else {
                self.reconcile_changed();
            }
            // Due retries were taken by the pass: every one left is in the future.
            let wake_at = match (self.next_retry(), resync_at) {
                (Some(retry), Some(resync)) => Some(retry.min(resync)),
                (retry, resync) => retry.or(resync),
            };
            full = false;
            tokio::select! {
                () = &mut shutdown => break,
                () = desired_changes.changed() => {}
                () = completions.changed() => {}
                () = handler_changes.changed() => full = true,
                () = sleep_until(wake_at) => {}
            }
        }
        tracing::debug!("reconciler stopped");
    }

    /// A full pass: every socket that is desired, registered or attempted,
    /// and every socket an event reported. O(n) lookups, no IO; only the
    /// sockets that need an operation are sorted. Skipped when it would
    /// find what the last one found: every socket in sync (see the crate
    /// docs).
    pub fn reconcile(&self) {
        let mut state = self.state.lock();
        // Read before the look: a change made during it moves a count.
        let changes = (self.desired.change_count(), self.actual.change_count());
        // Drain before listing: a change after the drain is either in the
        // listing or journaled for the next pass.
        let mut sockets = self.take_dirty(&mut state);
        if sockets.is_empty() && state.in_sync_at == Some(changes) {
            #[cfg(test)]
            self.full_passes_skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        sockets.extend(self.desired.paths());
        sockets.extend(self.actual.paths());
        sockets.extend(state.attempted.keys().cloned());
        let acted = self.reconcile_sockets(&mut state, sockets);
        state.in_sync_at = (!acted).then_some(changes);
    }

    /// A pass over the sockets an event reported since the previous pass.
    fn reconcile_changed(&self) {
        let mut state = self.state.lock();
        let dirty = self.take_dirty(&mut state);
        if !dirty.is_empty() && self.reconcile_sockets(&mut state, dirty) {
            state.in_sync_at = None;
        }
    }

    /// Drains the journals of DesiredState and of the operation map, and the
    /// retries that are due.
    fn take_dirty(&self, state: &mut State) -> HashSet<PathBuf> {
        let mut dirty: HashSet<PathBuf> = self.desired.take_changed().into_iter().collect();
        dirty.extend(self.executor.operations().take_completed());
        state.take_due(Instant::now(), &mut dirty);
        dirty
    }

    /// When the periodic full pass after one at `now` is due; `None` when
    /// there is none: the period is zero, or too long for the clock to
    /// represent (checked, as [`run`](Self::run) takes any config).
    fn next_full_pass(&self, now: Instant) -> Option<Instant> {
        let period = self.config.reconcile_period;
        if period.is_zero() {
            return None;
        }
        now.checked_add(period)
    }

    fn next_retry(&self) -> Option<Instant> {
        self.state.lock().retries.first().map(|(at, _)| *at)
    }

    /// Takes the actions `sockets` need; whether any did.
    fn reconcile_sockets(&self, state: &mut State, sockets: HashSet<PathBuf>) -> bool {
        let handlers = Arc::clone(&self.handlers.lock());
        let actions = self.plan(sockets);
        let acted = !actions.is_empty();
        for (socket, action) in actions {
            self.apply(state, &handlers, &socket, action);
        }
        acted
    }

    /// The actions `sockets` need, in the order to take them: by phase, then
    /// by path. Only sockets that need something are sorted.
    fn plan(&self, sockets: HashSet<PathBuf>) -> Vec<(PathBuf, Action)> {
        let mut actions: Vec<(PathBuf, Action)> = sockets
            .into_iter()
            .filter_map(|socket| self.decide(&socket).map(|action| (socket, action)))
            .collect();
        actions.sort_unstable_by(|(a_socket, a), (b_socket, b)| {
            a.phase().cmp(&b.phase()).then_with(|| a_socket.cmp(b_socket))
        });
        actions
    }

    /// What `socket` needs, if anything.
    fn decide(&self, socket: &Path) -> Option<Action> {
        // A held socket is not to be registered: as if absent.
        let desired = self.desired.registrable(socket);
        let registered = match self.actual.generation(socket) {
            Some(generation) if Some(generation) == desired => return None,
            // Fetched only now: most sockets are in sync and need no copy.
            Some(_) => self.actual.registered(socket),
            None => None,
        };
        match (registered, desired) {
            // Registered in the desired incarnation since the look above.
            (Some(old), Some(generation)) if old.registration.generation == generation => None,
            (Some(info), Some(generation)) => Some(Action::Reregister(info, generation)),
            (Some(info), None) => Some(Action::Unregister(info)),
            (None, Some(generation)) => Some(Action::Register(generation)),
            (None, None) => Some(Action::Forget),
        }
    }

    fn apply(&self, state: &mut State, handlers: &Arc<Handlers>, socket: &Path, action: Action) {
        let operations = self.executor.operations();
        match action {
            Action::Unregister(info) => {
                let started = self.executor.unregister(info, Arc::clone(&self.actual));
                self.start(state, socket, started);
            }
            Action::Reregister(info, generation) => {
                if self.note_attempt(state, socket, generation) {
                    operations.reset_backoff(socket);
                }
                let started = self.executor.reregister(
                    info,
                    generation,
                    Arc::clone(handlers),
                    Arc::clone(&self.actual),
                );
                self.start(state, socket, started);
            }
            Action::Register(generation) => {
                if self.note_attempt(state, socket, generation) {
                    operations.reset_backoff(socket);
                }
                // Cheaper than building an operation only to have it refused;
                // its completion brings the socket back.
                if operations.is_pending(socket) {
                    return;
                }
                let started = self.executor.register(
                    socket,
                    generation,
                    Arc::clone(handlers),
                    Arc::clone(&self.actual),
                );
                self.start(state, socket, started);
            }
            Action::Forget => {
                operations.forget(socket);
                state.attempted.remove(socket);
            }
        }
    }

    /// Records that `generation` is being attempted for `socket`; true if it is
    /// an incarnation not attempted before (announced as a new socket).
    fn note_attempt(&self, state: &mut State, socket: &Path, generation: Generation) -> bool {
        if state.attempted.insert(socket.to_path_buf(), generation) == Some(generation) {
            return false;
        }
        self.events.publish(PluginEvent::SocketSeen { socket: socket.to_path_buf(), generation });
        true
    }

    fn start(&self, state: &mut State, socket: &Path, started: Result<(), ExecutorError>) {
        match started {
            Ok(()) => tracing::debug!(socket = %socket.display(), "operation started"),
            // The socket comes back when its backoff expires.
            Err(ExecutorError::Backoff { until, .. }) => {
                self.backoff_skips.fetch_add(1, Ordering::Relaxed);
                state.retries.insert((until, socket.to_path_buf()));
            }
            // The running operation's completion brings the socket back; a
            // permanent failure waits for a new incarnation or a new handler.
            Err(ExecutorError::AlreadyRunning { .. } | ExecutorError::FailedPermanently { .. }) => {
            }
            Err(err) => {
                tracing::error!(socket = %socket.display(), error = %err, "cannot start operation");
            }
        }
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
