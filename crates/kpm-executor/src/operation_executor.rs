//! The register and unregister operations, run through an [`OperationMap`]
//! keyed by socket path; the steps of one registration are in
//! [`attempt`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kpm_api::config::check_durations;
use kpm_cache::{ActualState, EventBus, Generation, PluginEvent, PluginHandler, Registered};
use kpm_transport::Reach;
use tokio::sync::Semaphore;

use crate::inspection::Inspection;
use crate::isolation::call_handler;
use crate::{ExecutorError, ExponentialBackoff, OperationMap};

mod attempt;

use attempt::{Attempt, Register};

/// Handlers by plugin type, as the reconciler hands them to one operation.
pub type Handlers = HashMap<String, Arc<dyn PluginHandler>>;

/// Timeouts and backoff of the executor. The defaults are the kubelet's.
/// Every duration is at most [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION) (365 days) and the
/// timeouts are non-zero; see [`validate`](Self::validate). Build it from
/// [`Default`] with the setters; the fields are public to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecutorConfig {
    /// Connecting to a registration socket (kubelet: 10 s).
    pub dial_timeout: Duration,
    /// Window in which a refused connection is retried every few milliseconds
    /// before it counts as a failure (covers the bind-before-listen gap).
    pub refused_retry: Duration,
    /// The `GetInfo` call (kubelet: 1 s).
    pub get_info_timeout: Duration,
    /// Each `NotifyRegistrationStatus` call (kubelet: 5 s).
    pub notify_timeout: Duration,
    /// Each call of a handler (validate, register, deregister), which runs in
    /// a task of its own: a handler that hangs or panics fails that call only
    /// (kubelet: none). Above the CSI handler's two-minute `NodeGetInfo`.
    pub handler_timeout: Duration,
    /// Waits between failed operations on one socket.
    pub backoff: ExponentialBackoff,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            dial_timeout: Duration::from_secs(10),
            refused_retry: Duration::from_millis(250),
            get_info_timeout: Duration::from_secs(1),
            notify_timeout: Duration::from_secs(5),
            handler_timeout: Duration::from_secs(180),
            backoff: ExponentialBackoff::default(),
        }
    }
}

impl ExecutorConfig {
    /// Sets [`dial_timeout`](Self::dial_timeout) (default 10 s).
    #[must_use]
    pub fn dial_timeout(mut self, timeout: Duration) -> Self {
        self.dial_timeout = timeout;
        self
    }

    /// Sets [`refused_retry`](Self::refused_retry) (default 250 ms; zero: a
    /// refused connection fails at once).
    #[must_use]
    pub fn refused_retry(mut self, window: Duration) -> Self {
        self.refused_retry = window;
        self
    }

    /// Sets [`get_info_timeout`](Self::get_info_timeout) (default 1 s).
    #[must_use]
    pub fn get_info_timeout(mut self, timeout: Duration) -> Self {
        self.get_info_timeout = timeout;
        self
    }

    /// Sets [`notify_timeout`](Self::notify_timeout) (default 5 s).
    #[must_use]
    pub fn notify_timeout(mut self, timeout: Duration) -> Self {
        self.notify_timeout = timeout;
        self
    }

    /// Sets [`handler_timeout`](Self::handler_timeout) (default 180 s).
    #[must_use]
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = timeout;
        self
    }

    /// Sets [`backoff`](Self::backoff) (default [`ExponentialBackoff::default`]:
    /// 500 ms doubling to 2 min 2 s).
    #[must_use]
    pub fn backoff(mut self, backoff: ExponentialBackoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Checks the ranges: the four timeouts non-zero (a zero deadline fails
    /// every call) and at most [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION), `refused_retry` at
    /// most that (zero: a refused connection fails at once). The backoff is
    /// checked when it is made ([`ExponentialBackoff::try_new`]).
    ///
    /// [`OperationExecutor::try_new`] checks it, once: an executor never
    /// runs with a config that does not pass.
    pub fn validate(&self) -> Result<(), ExecutorError> {
        let timeouts = [
            ("dial_timeout", self.dial_timeout),
            ("get_info_timeout", self.get_info_timeout),
            ("notify_timeout", self.notify_timeout),
            ("handler_timeout", self.handler_timeout),
        ];
        Ok(check_durations(&timeouts, &[("refused_retry", self.refused_retry)])?)
    }
}

/// Connections a register operation may hold at once: its `GetInfo`
/// connection, the handler's own (CSI `NodeGetInfo`, a device plugin's
/// endpoint) and a fresh one for the notification.
const CONNECTIONS_PER_REGISTRATION: usize = 3;

/// Starts register and unregister operations, one at a time per socket.
///
/// The methods return whether the operation *started*; its outcome shows in
/// [`ActualState`], in the socket's [`OperationMap`] entry and on the event bus.
#[derive(Debug, Clone)]
pub struct OperationExecutor {
    operations: OperationMap,
    config: ExecutorConfig,
    events: EventBus,
    slots: RegistrationSlots,
}

/// The [fd budget](kpm_transport::fd) registrations dial from, and the
/// registrations that may dial at once, so that their connections always
/// fit in it: optional holders leave a quarter of it free, and as many
/// registrations as that quarter can pay three connections each may run.
/// Without the bound, registrations holding their `GetInfo` connections
/// could take every permit and wait forever for the handler's. A
/// registration waiting for a slot is not a failure: it starts when one is
/// released.
#[derive(Debug, Clone)]
pub(crate) struct RegistrationSlots {
    pub(crate) reach: Reach,
    pub(crate) slots: Arc<Semaphore>,
}

impl RegistrationSlots {
    fn new(reach: Reach) -> Self {
        let slots = (reach.budget().kept_free() / CONNECTIONS_PER_REGISTRATION).max(1);
        Self { reach, slots: Arc::new(Semaphore::new(slots)) }
    }
}

impl OperationExecutor {
    /// An executor with `config`, checked here once
    /// ([`ExecutorConfig::validate`]: the error names the field), that dials
    /// plugins with permits of the budget of `reach` (the process-wide one
    /// is [`kpm_transport::fd::budget`]), on the host it sees, and sizes
    /// from it how many registrations may run at once. It publishes
    /// registrations, rejections, deregistrations and scheduled retries on
    /// `events`.
    pub fn try_new(
        config: ExecutorConfig,
        reach: impl Into<Reach>,
        events: EventBus,
    ) -> Result<Self, ExecutorError> {
        config.validate()?;
        Ok(Self {
            operations: OperationMap::with_events(config.backoff, events.clone()),
            config,
            events,
            slots: RegistrationSlots::new(reach.into()),
        })
    }

    /// The operation map, to query pending operations and backoffs, reset a
    /// key's backoff, forget a key, or wait for completions.
    pub fn operations(&self) -> &OperationMap {
        &self.operations
    }

    /// The timeouts and backoff the operations run with.
    pub fn config(&self) -> &ExecutorConfig {
        &self.config
    }

    /// Starts registering the plugin behind `socket` (incarnation `generation`):
    /// dial, `GetInfo`, pick the handler by type, validate, register, notify
    /// the plugin, record it in `actual_state`. A failure after the handler
    /// accepted the plugin undoes the registration, so nothing is left
    /// half-registered and the operation is retried with backoff.
    pub fn register(
        &self,
        socket: &Path,
        generation: Generation,
        handlers: Arc<Handlers>,
        actual_state: Arc<ActualState>,
    ) -> Result<(), ExecutorError> {
        let op = self.register_op(socket, generation, handlers, actual_state);
        self.operations.start(socket, op.run())
    }

    /// Starts unregistering `old`: it leaves `actual_state` first (so that a
    /// socket re-created meanwhile is seen as a new registration), then its
    /// handler is told. The plugin itself is not contacted: its socket is gone.
    pub fn unregister(
        &self,
        old: Registered,
        actual_state: Arc<ActualState>,
    ) -> Result<(), ExecutorError> {
        let events = self.events.clone();
        let timeout = self.config.handler_timeout;
        self.operations.start(&old.registration.socket_path.clone(), async move {
            deregister(&old, &actual_state, &events, timeout).await;
            Ok(())
        })
    }

    /// Starts re-registering a socket whose incarnation changed: unregisters
    /// `old` and registers incarnation `generation`, in that order, as one
    /// operation (the kubelet needed two reconcile passes for this).
    pub fn reregister(
        &self,
        old: Registered,
        generation: Generation,
        handlers: Arc<Handlers>,
        actual_state: Arc<ActualState>,
    ) -> Result<(), ExecutorError> {
        let socket = old.registration.socket_path.clone();
        let op = self.register_op(&socket, generation, handlers, Arc::clone(&actual_state));
        let events = self.events.clone();
        let timeout = self.config.handler_timeout;
        self.operations.start(&socket, async move {
            deregister(&old, &actual_state, &events, timeout).await;
            op.run().await
        })
    }

    /// The register operation of incarnation `generation` of `socket`.
    fn register_op(
        &self,
        socket: &Path,
        generation: Generation,
        handlers: Arc<Handlers>,
        actual_state: Arc<ActualState>,
    ) -> Register {
        Register {
            attempt: self.attempt(socket, handlers),
            generation,
            actual_state,
            events: self.events.clone(),
        }
    }

    fn attempt(&self, socket: &Path, handlers: Arc<Handlers>) -> Attempt {
        Attempt {
            socket: socket.to_path_buf(),
            handlers,
            config: self.config,
            slots: self.slots.clone(),
        }
    }

    /// Runs the register operation's steps on `socket` up to the handler's
    /// validation, then asks the handler what it sees of the plugin's own
    /// service ([`PluginHandler::inspect`]), timing each step: what would
    /// happen if `kpm run` found this socket now. Nothing is registered,
    /// the plugin is not notified, no connection outlives the call, and
    /// the socket's operation entry is left alone. Each step is bounded by
    /// this executor's timeouts.
    pub async fn inspect(&self, socket: &Path, handlers: Arc<Handlers>) -> Inspection {
        self.attempt(socket, handlers).inspect().await
    }
}

/// Removes `old` from `actual_state` and tells its handler. Only the call
/// that removes that incarnation deregisters, so each registration is
/// deregistered exactly once.
async fn deregister(
    old: &Registered,
    actual_state: &ActualState,
    events: &EventBus,
    handler_timeout: Duration,
) {
    let info = &old.registration;
    if actual_state.remove_generation(&info.socket_path, info.generation).is_none() {
        return;
    }
    call_deregister(old, handler_timeout).await;
    tracing::info!(
        socket = %info.socket_path.display(), plugin = %info.plugin.name,
        plugin_type = %info.plugin_type, "plugin deregistered"
    );
    events.publish(PluginEvent::Deregistered {
        socket: info.socket_path.clone(),
        generation: info.generation,
        plugin_type: info.plugin_type.clone(),
        name: info.plugin.name.clone(),
    });
}

/// Tells the handler to forget `old`, isolated: a deregister that hangs or
/// panics is logged, and the plugin counts as deregistered all the same.
pub(crate) async fn call_deregister(old: &Registered, handler_timeout: Duration) {
    let info = &old.registration;
    let (handler, plugin) = (Arc::clone(&old.handler), info.plugin.clone());
    let call = async move {
        handler.deregister(&plugin).await;
        Ok(())
    };
    if let Err(failure) = call_handler(&info.plugin_type, handler_timeout, call).await {
        tracing::error!(
            socket = %info.socket_path.display(), plugin = %info.plugin.name, error = %failure.error,
            "handler failed to deregister the plugin; dropping it anyway"
        );
    }
}
