//! The register and unregister operations, run through an [`OperationMap`]
//! keyed by socket path.

use kpm_api::config::check_durations;
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kpm_api::constants::MAX_REGISTRATION_MESSAGE_BYTES;
use kpm_api::registration::v1::registration_client::RegistrationClient;
use kpm_api::registration::v1::{InfoRequest, PluginInfo as WirePluginInfo, RegistrationStatus};
use kpm_cache::{
    ActualState, EventBus, Generation, HandlerError, PluginDetails, PluginEvent, PluginHandler,
    Registered, Registration, ServiceReport,
};
use kpm_transport as uds;
use kpm_transport::fd::{self, FdBudget};
use kpm_transport::{Dialer, GrpcChannel, TimedCallError};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Request};

use crate::inspection::{Inspection, Step, Steps};
use crate::isolation::{HandlerFailure, call_handler};
use crate::{ExecutorError, ExponentialBackoff, OperationMap, check_info, plugin_endpoint};

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
    /// Registrations check it too: with a config that does not pass, they
    /// are refused with this error instead of started.
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
#[derive(Debug, Clone, Default)]
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
struct RegistrationSlots {
    budget: FdBudget,
    slots: Arc<Semaphore>,
}

impl Default for RegistrationSlots {
    /// Paid from the process-wide budget until the executor is given another.
    fn default() -> Self {
        Self::new(fd::budget().clone())
    }
}

impl RegistrationSlots {
    fn new(budget: FdBudget) -> Self {
        let slots = (budget.kept_free() / CONNECTIONS_PER_REGISTRATION).max(1);
        Self { budget, slots: Arc::new(Semaphore::new(slots)) }
    }
}

impl OperationExecutor {
    /// An executor whose events go to a bus nobody listens to.
    pub fn new(config: ExecutorConfig) -> Self {
        Self::with_events(config, EventBus::default())
    }

    /// An executor that publishes registrations, rejections, deregistrations
    /// and scheduled retries on `events`.
    pub fn with_events(config: ExecutorConfig, events: EventBus) -> Self {
        Self {
            operations: OperationMap::with_events(config.backoff, events.clone()),
            config,
            events,
            slots: RegistrationSlots::default(),
        }
    }

    /// Dials plugins with permits of `budget` instead of the process-wide
    /// [fd budget](kpm_transport::fd::budget), and sizes how many
    /// registrations may run at once from it.
    #[must_use]
    pub fn with_fd_budget(mut self, budget: FdBudget) -> Self {
        self.slots = RegistrationSlots::new(budget);
        self
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
    ///
    /// Refused with [`ExecutorError::InvalidConfig`] when the executor's
    /// config does not pass [`ExecutorConfig::validate`].
    pub fn register(
        &self,
        socket: &Path,
        generation: Generation,
        handlers: Arc<Handlers>,
        actual_state: Arc<ActualState>,
    ) -> Result<(), ExecutorError> {
        let op = self.register_op(socket, generation, handlers, actual_state)?;
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
    /// operation (the kubelet needed two reconcile passes for this). Refused
    /// like [`register`](Self::register) on an invalid config.
    pub fn reregister(
        &self,
        old: Registered,
        generation: Generation,
        handlers: Arc<Handlers>,
        actual_state: Arc<ActualState>,
    ) -> Result<(), ExecutorError> {
        let socket = old.registration.socket_path.clone();
        let op = self.register_op(&socket, generation, handlers, Arc::clone(&actual_state))?;
        let events = self.events.clone();
        let timeout = self.config.handler_timeout;
        self.operations.start(&socket, async move {
            deregister(&old, &actual_state, &events, timeout).await;
            op.run().await
        })
    }

    /// The register operation; refused on an invalid config, whose timeouts
    /// it would hand to the timers and to the `grpc-timeout` header.
    fn register_op(
        &self,
        socket: &Path,
        generation: Generation,
        handlers: Arc<Handlers>,
        actual_state: Arc<ActualState>,
    ) -> Result<Register, ExecutorError> {
        self.config.validate()?;
        Ok(Register {
            attempt: self.attempt(socket, handlers),
            generation,
            actual_state,
            events: self.events.clone(),
        })
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
    /// this executor's timeouts; an invalid config is the outcome.
    pub async fn inspect(&self, socket: &Path, handlers: Arc<Handlers>) -> Inspection {
        if let Err(err) = self.config.validate() {
            return Inspection {
                socket: socket.to_path_buf(),
                steps: Vec::new(),
                info: None,
                endpoint: None,
                server_pid: None,
                service: None,
                outcome: Err(err),
            };
        }
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
async fn call_deregister(old: &Registered, handler_timeout: Duration) {
    let info = &old.registration;
    let (handler, plugin) = (Arc::clone(&old.handler), info.plugin.clone());
    let call = async move {
        handler.deregister(&plugin.name, &plugin.endpoint).await;
        Ok(())
    };
    if let Err(failure) = call_handler(&info.plugin_type, handler_timeout, call).await {
        tracing::error!(
            socket = %info.socket_path.display(), plugin = %info.plugin.name, error = %failure.error,
            "handler failed to deregister the plugin; dropping it anyway"
        );
    }
}

/// How long after `GetInfo` its connection is trusted for the notification.
const REUSE_CONNECTION_FOR: Duration = Duration::from_secs(1);

/// The connection `GetInfo` was asked on, and when it was opened.
struct Connection {
    client: RegistrationClient<Channel>,
    opened: Instant,
    /// Who answered `GetInfo`: the process liveness watches.
    server_pid: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
enum HandlerStep {
    Validate,
    Register,
}

/// As the kubelet names the step in the reason a plugin is sent.
impl std::fmt::Display for HandlerStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Validate => "plugin validation",
            Self::Register => "plugin registration",
        })
    }
}

/// The calls on one registration socket, the register operation's and an
/// inspection's alike: dial, `GetInfo`, the handler's checks, the
/// notification.
struct Attempt {
    socket: PathBuf,
    handlers: Arc<Handlers>,
    config: ExecutorConfig,
    slots: RegistrationSlots,
}

/// A plugin as its `GetInfo` answer describes it, with the handler of its
/// type, which validated it, and the connection it answered on.
struct Admitted {
    info: WirePluginInfo,
    endpoint: String,
    handler: Arc<dyn PluginHandler>,
    connection: Connection,
}

impl Admitted {
    /// What a handler call owns: the handler, and the plugin's name,
    /// endpoint and versions.
    fn handler_args(&self) -> (Arc<dyn PluginHandler>, String, String, Vec<String>) {
        (
            Arc::clone(&self.handler),
            self.info.name.clone(),
            self.endpoint.clone(),
            self.info.supported_versions.clone(),
        )
    }
}

/// Why a plugin was refused before its handler registered it, what it
/// answered `GetInfo` if it did, and, where it can be told, what it is told.
struct Refusal {
    error: ExecutorError,
    info: Option<WirePluginInfo>,
    tell: Option<(Connection, String)>,
}

impl From<ExecutorError> for Refusal {
    fn from(error: ExecutorError) -> Self {
        Self { error, info: None, tell: None }
    }
}

impl Attempt {
    /// The register operation's steps before the handler registers the
    /// plugin, each timed into `steps`: dial, `GetInfo`, the answer's
    /// bounds, the handler of its type, the handler's validation.
    async fn admit(&self, steps: &mut Steps) -> Result<Admitted, Refusal> {
        let (client, server_pid) = steps.time(Step::Dial, self.dial()).await?;
        steps.server_pid = server_pid;
        let (info, connection) =
            steps.time(Step::GetInfo, self.get_info(client, server_pid)).await?;
        let checked = steps.time(Step::CheckInfo, async { check_info(&info) }).await;
        if let Err(reason) = checked {
            let message = format!("RegisterPlugin error -- invalid plugin info: {reason}");
            let error = ExecutorError::InvalidInfo { socket: self.socket.clone(), reason };
            return Err(Refusal { error, info: Some(info), tell: Some((connection, message)) });
        }
        let found = steps.time(Step::Handler, async { self.handlers.get(&info.r#type).cloned() });
        let Some(handler) = found.await else {
            let message = format!(
                "RegisterPlugin error -- no handler registered for plugin type: {} at socket {}",
                info.r#type,
                self.socket.display()
            );
            let error = ExecutorError::UnknownPluginType {
                socket: self.socket.clone(),
                plugin_type: info.r#type.clone(),
            };
            return Err(Refusal { error, info: Some(info), tell: Some((connection, message)) });
        };
        let endpoint = plugin_endpoint(&info, &self.socket);
        let admitted = Admitted { info, endpoint, handler, connection };
        let validated = steps.time(Step::Validate, self.call(&admitted, HandlerStep::Validate));
        if let Err(failure) = validated.await {
            return Err(self.refuse(admitted, HandlerStep::Validate, failure.error));
        }
        Ok(admitted)
    }

    /// The refusal of `admitted` by its handler at `step`.
    fn refuse(&self, admitted: Admitted, step: HandlerStep, source: HandlerError) -> Refusal {
        let message = format!("RegisterPlugin error -- {step} failed with err: {source}");
        let (socket, name) = (self.socket.clone(), admitted.info.name.clone());
        let error = match step {
            HandlerStep::Validate => ExecutorError::Validate { socket, name, source },
            HandlerStep::Register => ExecutorError::Register { socket, name, source },
        };
        Refusal { error, info: Some(admitted.info), tell: Some((admitted.connection, message)) }
    }

    /// Tells the plugin why it was refused, where it can be told; returns
    /// the refusal's error. A failure to deliver it is only logged.
    async fn tell(&self, refusal: Refusal) -> ExecutorError {
        if let Some((connection, message)) = refusal.tell
            && let Err(err) = self.notify(&connection, false, message).await
        {
            tracing::warn!(
                socket = %self.socket.display(), error = %err,
                "could not tell the plugin why its registration failed"
            );
        }
        refusal.error
    }

    /// Calls the handler of `admitted` for `step`, isolated (see [`call_handler`]).
    async fn call(&self, admitted: &Admitted, step: HandlerStep) -> Result<(), HandlerFailure> {
        let (handler, name, endpoint, versions) = admitted.handler_args();
        let timeout = self.config.handler_timeout;
        call_handler(&admitted.info.r#type, timeout, async move {
            match step {
                HandlerStep::Validate => handler.validate(&name, &endpoint, &versions).await,
                HandlerStep::Register => handler.register(&name, &endpoint, &versions).await,
            }
        })
        .await
    }

    /// Asks the handler of `admitted` what it sees of the plugin's own
    /// service, isolated like its other calls.
    async fn inspect_service(
        &self,
        admitted: &Admitted,
    ) -> Result<Option<Box<dyn ServiceReport>>, ExecutorError> {
        let (handler, name, endpoint, versions) = admitted.handler_args();
        let timeout = self.config.handler_timeout;
        call_handler(&admitted.info.r#type, timeout, async move {
            handler.inspect(&name, &endpoint, &versions).await
        })
        .await
        .map_err(|failure| ExecutorError::InspectService {
            socket: self.socket.clone(),
            name: admitted.info.name.clone(),
            source: failure.error,
        })
    }

    /// A registration client on a new connection, and the pid of the process
    /// serving the socket.
    async fn dial(&self) -> Result<(RegistrationClient<Channel>, Option<u32>), ExecutorError> {
        let dialer = Dialer::new(self.slots.budget.clone(), self.config.dial_timeout)
            .retry_refused_for(self.config.refused_retry);
        let GrpcChannel { channel, server_pid, .. } = dialer
            .grpc(&self.socket)
            .await
            .map_err(|source| ExecutorError::Dial { socket: self.socket.clone(), source })?;
        let client = RegistrationClient::new(channel)
            .max_decoding_message_size(MAX_REGISTRATION_MESSAGE_BYTES);
        Ok((client, server_pid))
    }

    async fn get_info(
        &self,
        mut client: RegistrationClient<Channel>,
        server_pid: Option<u32>,
    ) -> Result<(WirePluginInfo, Connection), Refusal> {
        let opened = Instant::now();
        let timeout = self.config.get_info_timeout;
        let socket = || self.socket.clone();
        match with_deadline(timeout, InfoRequest {}, |req| client.get_info(req)).await {
            Ok(info) => Ok((info, Connection { client, opened, server_pid })),
            Err(TimedCallError::Failed(status)) if status.code() == Code::Unimplemented => {
                Err(ExecutorError::NotARegistrationSocket {
                    socket: socket(),
                    message: status.message().to_owned(),
                }
                .into())
            }
            // An answer over the size limit: the plugin is there, tell it why.
            Err(TimedCallError::Failed(source)) if source.code() == Code::OutOfRange => {
                let message = format!(
                    "RegisterPlugin error -- GetInfo answer rejected: {}",
                    source.message()
                );
                let connection = Connection { client, opened, server_pid };
                let error = ExecutorError::GetInfo { socket: socket(), source };
                Err(Refusal { error, info: None, tell: Some((connection, message)) })
            }
            Err(TimedCallError::Failed(source)) => {
                Err(ExecutorError::GetInfo { socket: socket(), source }.into())
            }
            Err(TimedCallError::TimedOut) => {
                Err(ExecutorError::GetInfoTimeout { socket: socket(), timeout }.into())
            }
        }
    }

    /// Sends the outcome, on the `GetInfo` connection if it is recent, else on
    /// a fresh one: the handler may have taken minutes (CSI waits on
    /// NodeGetInfo) and the first connection may be gone by then.
    async fn notify(
        &self,
        connection: &Connection,
        registered: bool,
        error: String,
    ) -> Result<(), ExecutorError> {
        let mut client = if connection.opened.elapsed() < REUSE_CONNECTION_FOR {
            connection.client.clone()
        } else {
            self.dial().await?.0
        };
        let timeout = self.config.notify_timeout;
        let status = RegistrationStatus { plugin_registered: registered, error };
        match with_deadline(timeout, status, |req| client.notify_registration_status(req)).await {
            Ok(_) => Ok(()),
            Err(TimedCallError::Failed(source)) => {
                Err(ExecutorError::Notify { socket: self.socket.clone(), source })
            }
            Err(TimedCallError::TimedOut) => {
                Err(ExecutorError::NotifyTimeout { socket: self.socket.clone(), timeout })
            }
        }
    }

    /// The inspection of this socket: the admission's steps, then the
    /// handler's look at the plugin's own service; nothing is registered
    /// and the plugin is told nothing.
    async fn inspect(&self) -> Inspection {
        let mut steps = Steps::default();
        let admitted = match self.admit(&mut steps).await {
            Ok(admitted) => admitted,
            Err(Refusal { error, info, .. }) => {
                let server_pid = steps.server_pid;
                let endpoint = info.as_ref().map(|info| plugin_endpoint(info, &self.socket));
                return Inspection {
                    socket: self.socket.clone(),
                    steps: steps.taken,
                    info,
                    endpoint,
                    server_pid,
                    service: None,
                    outcome: Err(error),
                };
            }
        };
        let service = steps.time(Step::Service, self.inspect_service(&admitted)).await;
        let (service, outcome) = match service {
            Ok(report) => (report, Ok(())),
            Err(err) => (None, Err(err)),
        };
        Inspection {
            socket: self.socket.clone(),
            steps: steps.taken,
            server_pid: admitted.connection.server_pid,
            info: Some(admitted.info),
            endpoint: Some(admitted.endpoint),
            service,
            outcome,
        }
    }
}

/// One register operation and what it needs.
struct Register {
    attempt: Attempt,
    generation: Generation,
    actual_state: Arc<ActualState>,
    events: EventBus,
}

impl Register {
    async fn run(self) -> Result<(), ExecutorError> {
        // Never closed, so a slot always comes; held until the outcome is known.
        let slot = self.attempt.slots.slots.acquire().await.ok();
        let outcome = self.register().await;
        drop(slot);
        let socket = self.attempt.socket.clone();
        let event = match &outcome {
            Ok(info) => PluginEvent::Registered {
                socket,
                generation: self.generation,
                plugin_type: info.plugin_type.clone(),
                name: info.plugin.name.clone(),
                endpoint: info.plugin.endpoint.clone(),
            },
            Err(err) => PluginEvent::Rejected {
                socket,
                generation: self.generation,
                reason: err.to_string(),
            },
        };
        self.events.publish(event);
        outcome.map(drop)
    }

    async fn register(&self) -> Result<Registration, ExecutorError> {
        let attempt = &self.attempt;
        let admitted = match attempt.admit(&mut Steps::default()).await {
            Ok(admitted) => admitted,
            Err(refusal) => return Err(attempt.tell(refusal).await),
        };
        let plugin = PluginDetails::new(
            admitted.info.name.clone(),
            admitted.endpoint.clone(),
            admitted.info.supported_versions.clone(),
        );
        let registration = Registration::new(
            attempt.socket.clone(),
            self.generation,
            admitted.info.r#type.clone(),
            plugin,
            admitted.connection.server_pid,
        );
        let mut registered = Registered::new(registration, Arc::clone(&admitted.handler));
        if let Err(failure) = attempt.call(&admitted, HandlerStep::Register).await {
            if failure.aborted {
                // It may have stopped halfway: nothing may stay registered.
                call_deregister(&registered, attempt.config.handler_timeout).await;
            }
            let refusal = attempt.refuse(admitted, HandlerStep::Register, failure.error);
            return Err(attempt.tell(refusal).await);
        }
        registered.registration.registered_at = SystemTime::now();

        let recorded =
            attempt.notify(&admitted.connection, true, String::new()).await.and_then(|()| {
                self.actual_state.add(registered.clone()).map_err(|source| {
                    ExecutorError::ActualState { socket: attempt.socket.clone(), source }
                })
            });
        if let Err(err) = recorded {
            // The plugin does not know it is registered: undo, retry later.
            call_deregister(&registered, attempt.config.handler_timeout).await;
            return Err(err);
        }
        tracing::info!(
            socket = %attempt.socket.display(), plugin = %registered.registration.plugin.name,
            plugin_type = %registered.registration.plugin_type,
            endpoint = %registered.registration.plugin.endpoint,
            generation = %self.generation, "plugin registered"
        );
        Ok(registered.registration)
    }
}

/// Makes a unary call that must finish within `timeout` (sent to the plugin
/// too, in case it ignores ours); `DeadlineExceeded` from either side is
/// [`TimedCallError::TimedOut`].
async fn with_deadline<M, R, F>(
    timeout: Duration,
    message: M,
    call: impl FnOnce(Request<M>) -> F,
) -> Result<R, TimedCallError<tonic::Status>>
where
    F: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
{
    match uds::timed_call(timeout, call(uds::timed_request(message, timeout))).await {
        Ok(response) => Ok(response.into_inner()),
        Err(TimedCallError::Failed(status)) if status.code() == Code::DeadlineExceeded => {
            Err(TimedCallError::TimedOut)
        }
        Err(failed) => Err(failed),
    }
}
