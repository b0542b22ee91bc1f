//! The one error type of the executor crate. Every variant names the socket
//! and the step that failed.

use std::path::PathBuf;
use std::time::Duration;

use kpm_cache::{CacheError, HandlerError};
use kpm_transport::TransportError;
use tokio::time::Instant;

/// Why an operation on a registration socket did not start or did not succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecutorError {
    // === Refusals to start an operation ===
    /// An operation on this socket is still running.
    #[error("operation for {} is already running", socket.display())]
    AlreadyRunning {
        /// The registration socket.
        socket: PathBuf,
    },

    /// The last operation on this socket failed and its backoff has not expired.
    #[error(
        "operation for {} failed; no retries permitted for {:?} (backoff {wait:?}); last error: {last_error}",
        socket.display(), until.saturating_duration_since(Instant::now())
    )]
    Backoff {
        /// The registration socket.
        socket: PathBuf,
        /// When the next attempt is allowed.
        until: Instant,
        /// The current backoff step.
        wait: Duration,
        /// The error of the failed operation.
        last_error: String,
    },

    /// The last operation on this socket failed in a way retrying cannot fix;
    /// only a new incarnation of the socket (or a new handler) is tried again.
    #[error("operation for {} failed permanently; last error: {last_error}", socket.display())]
    FailedPermanently {
        /// The registration socket.
        socket: PathBuf,
        /// The error of the failed operation.
        last_error: String,
    },

    // === Steps of the register operation ===
    /// Dialing the registration socket failed (for the first call or for the
    /// final notification).
    #[error("register {}: dial: {source}", socket.display())]
    Dial {
        /// The registration socket.
        socket: PathBuf,
        /// The transport's error.
        #[source]
        source: TransportError,
    },

    /// The plugin answered `GetInfo` with an error.
    #[error("register {}: GetInfo: {source}", socket.display())]
    GetInfo {
        /// The registration socket.
        socket: PathBuf,
        /// The status the plugin returned.
        #[source]
        source: tonic::Status,
    },

    /// The plugin did not answer `GetInfo` in time.
    #[error("register {}: GetInfo timed out after {timeout:?}", socket.display())]
    GetInfoTimeout {
        /// The registration socket.
        socket: PathBuf,
        /// The deadline that passed.
        timeout: Duration,
    },

    /// The socket answers gRPC but not the registration service: most likely a
    /// driver's service socket placed in the registry directory.
    #[error(
        "register {}: not a registration socket (pluginregistration.Registration/GetInfo is unimplemented): {message}",
        socket.display()
    )]
    NotARegistrationSocket {
        /// The registration socket.
        socket: PathBuf,
        /// The `Unimplemented` status's message.
        message: String,
    },

    /// The `GetInfo` answer is malformed or out of bounds; see
    /// [`check_info`](crate::check_info).
    #[error("register {}: check GetInfo answer: {reason}", socket.display())]
    InvalidInfo {
        /// The registration socket.
        socket: PathBuf,
        /// Which bound the answer breaks.
        reason: String,
    },

    /// No handler is registered for the type the plugin reported.
    #[error("register {}: no handler registered for plugin type: {plugin_type}", socket.display())]
    UnknownPluginType {
        /// The registration socket.
        socket: PathBuf,
        /// The type the plugin reported.
        plugin_type: String,
    },

    /// The handler refused the plugin in [`PluginHandler::validate`](kpm_cache::PluginHandler::validate).
    #[error("register {}: validate plugin {name:?}: {source}", socket.display())]
    Validate {
        /// The registration socket.
        socket: PathBuf,
        /// The plugin's name.
        name: String,
        /// The handler's error, as the plugin is told.
        #[source]
        source: HandlerError,
    },

    /// The handler failed in [`PluginHandler::register`](kpm_cache::PluginHandler::register).
    #[error("register {}: register plugin {name:?} with its handler: {source}", socket.display())]
    Register {
        /// The registration socket.
        socket: PathBuf,
        /// The plugin's name.
        name: String,
        /// The handler's error, as the plugin is told.
        #[source]
        source: HandlerError,
    },

    /// The handler found the plugin's own service failing when it inspected
    /// it ([`PluginHandler::inspect`](kpm_cache::PluginHandler::inspect));
    /// inspections only.
    #[error("inspect {}: the service of plugin {name:?}: {source}", socket.display())]
    InspectService {
        /// The registration socket.
        socket: PathBuf,
        /// The plugin's name.
        name: String,
        /// The handler's error.
        #[source]
        source: HandlerError,
    },

    /// The plugin answered `NotifyRegistrationStatus` with an error; the
    /// handler's registration is undone.
    #[error("register {}: NotifyRegistrationStatus: {source}", socket.display())]
    Notify {
        /// The registration socket.
        socket: PathBuf,
        /// The status the plugin returned.
        #[source]
        source: tonic::Status,
    },

    /// The plugin did not answer `NotifyRegistrationStatus` in time; the
    /// handler's registration is undone.
    #[error("register {}: NotifyRegistrationStatus timed out after {timeout:?}", socket.display())]
    NotifyTimeout {
        /// The registration socket.
        socket: PathBuf,
        /// The deadline that passed.
        timeout: Duration,
    },

    /// The registered plugin could not be recorded in the
    /// [`ActualState`](kpm_cache::ActualState).
    #[error("register {}: add to actual state: {source}", socket.display())]
    ActualState {
        /// The registration socket.
        socket: PathBuf,
        /// The cache's error.
        #[source]
        source: CacheError,
    },

    // === Anything ===
    /// The operation's task panicked (in a handler, most likely); the panic
    /// is contained to this socket.
    #[error("operation for {} panicked: {message}", socket.display())]
    Panicked {
        /// The registration socket.
        socket: PathBuf,
        /// The panic's message.
        message: String,
    },

    // === Config ===
    /// The [`ExponentialBackoff`](crate::ExponentialBackoff) was refused
    /// where it was made (its first wait zero or above its longest, a
    /// factor or jitter out of range); the error names the field.
    #[error("invalid backoff: {0}")]
    InvalidBackoff(#[from] kpm_api::backoff::BackoffError),

    /// A duration of the [`ExecutorConfig`](crate::ExecutorConfig) or the
    /// backoff is out of range; see
    /// [`ExecutorConfig::validate`](crate::ExecutorConfig::validate) and
    /// [`OperationExecutor::try_new`](crate::OperationExecutor::try_new),
    /// which refuses such a config.
    #[error("invalid executor config: {0}")]
    InvalidConfig(#[from] kpm_api::config::DurationOutOfRange),
}

impl ExecutorError {
    /// Why the operation failed, as one line for a person: the cause (the
    /// handler's or the transport's error, the plugin's status) where this
    /// error wraps one, this error otherwise. `kpm doctor`, `kpm probe` and
    /// `kpm check` say it so.
    pub fn reason(&self) -> String {
        match std::error::Error::source(self) {
            Some(cause) => kpm_api::gotext::error_chain(cause),
            None => self.to_string(),
        }
    }

    /// Whether retrying the same socket incarnation cannot help. Such a socket
    /// is not retried with backoff (no endless log spam for a driver socket
    /// in the registry directory); a new incarnation starts afresh.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::NotARegistrationSocket { .. }
                | Self::InvalidInfo { .. }
                | Self::UnknownPluginType { .. }
        )
    }
}
