//! The calls on one registration socket: dial, `GetInfo`, the handler's
//! validation and registration, the notification; run by the register
//! operation ([`Register`]) and, up to the validation, by an inspection.

use std::future::Future;
use std::path::PathBuf;
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
use kpm_transport::{Dialer, GrpcChannel, TimedCallError};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Request};

use super::ExecutorConfig;
use super::{Handlers, RegistrationSlots, call_deregister};
use crate::inspection::{Inspection, Step, Steps};
use crate::isolation::{HandlerFailure, call_handler};
use crate::{ExecutorError, check_info, plugin_endpoint};

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
pub(crate) struct Attempt {
    pub(crate) socket: PathBuf,
    pub(crate) handlers: Arc<Handlers>,
    pub(crate) config: ExecutorConfig,
    pub(crate) slots: RegistrationSlots,
}

/// A plugin as its `GetInfo` answer describes it, with the handler of its
/// type, which validated it, and the connection it answered on.
struct Admitted {
    info: WirePluginInfo,
    /// What its handler is told: the name, versions and the endpoint it
    /// serves (the registration socket when it gave none).
    plugin: PluginDetails,
    handler: Arc<dyn PluginHandler>,
    connection: Connection,
}

impl Admitted {
    /// What a handler call owns: the handler and the plugin's details.
    fn handler_args(&self) -> (Arc<dyn PluginHandler>, PluginDetails) {
        (Arc::clone(&self.handler), self.plugin.clone())
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
        let plugin =
            PluginDetails::new(info.name.clone(), endpoint, info.supported_versions.clone());
        let admitted = Admitted { info, plugin, handler, connection };
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
        let (handler, plugin) = admitted.handler_args();
        let timeout = self.config.handler_timeout;
        call_handler(&admitted.info.r#type, timeout, async move {
            match step {
                HandlerStep::Validate => handler.validate(&plugin).await,
                HandlerStep::Register => handler.register(&plugin).await,
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
        let (handler, plugin) = admitted.handler_args();
        let timeout = self.config.handler_timeout;
        call_handler(&admitted.info.r#type, timeout, async move { handler.inspect(&plugin).await })
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
        let dialer = Dialer::new(self.slots.reach.clone(), self.config.dial_timeout)
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
    pub(crate) async fn inspect(&self) -> Inspection {
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
            endpoint: Some(admitted.plugin.endpoint),
            service,
            outcome,
        }
    }
}

/// One register operation and what it needs.
pub(crate) struct Register {
    pub(crate) attempt: Attempt,
    pub(crate) generation: Generation,
    pub(crate) actual_state: Arc<ActualState>,
    pub(crate) events: EventBus,
}

impl Register {
    /// Registers the plugin, publishing the outcome: `Registered`, or
    /// `Rejected` with the reason.
    pub(crate) async fn run(self) -> Result<(), ExecutorError> {
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
        let registration = Registration::new(
            attempt.socket.clone(),
            self.generation,
            admitted.info.r#type.clone(),
            admitted.plugin.clone(),
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
