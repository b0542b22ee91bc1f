//! The one error type of the executor crate. Every variant names the socket
//! and the step that failed.

use std::path::PathBuf;
use std::time::Duration;

use kpm_api::uds::TransportError;
use kpm_cache::{CacheError, HandlerError};
use tokio::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    // === Refusals to start an operation ===
    /// An operation on this socket is still running.
    #[error("operation for {} is already running", socket.display())]
    AlreadyRunning { socket: PathBuf },

    /// The last operation on this socket failed and its backoff has not expired.
    #[error(
        "operation for {} failed; no retries permitted for {:?} (backoff {wait:?}); last error: {last_error}",
        socket.display(), until.saturating_duration_since(Instant::now())
    )]
    Backoff { socket: PathBuf, until: Instant, wait: Duration, last_error: String },

    /// The last operation on this socket failed in a way retrying cannot fix;
    /// only a new incarnation of the socket (or a new handler) is tried again.
    #[error("operation for {} failed permanently; last error: {last_error}", socket.display())]
    FailedPermanently { socket: PathBuf, last_error: String },

    // === Steps of the register operation ===
    /// Dialing the registration socket failed (for the first call or for the
    /// final notification).
    #[error("register {}: dial: {source}", socket.display())]
    Dial {
        socket: PathBuf,
        #[source]
        source: TransportError,
    },

    #[error("register {}: GetInfo: {source}", socket.display())]
    GetInfo {
        socket: PathBuf,
        #[source]
        source: tonic::Status,
    },

    #[error("register {}: GetInfo timed out after {timeout:?}", socket.display())]
    GetInfoTimeout { socket: PathBuf, timeout: Duration },

    /// The socket answers gRPC but not the registration service: most likely a
    /// driver's service socket placed in the registry directory.
    #[error(
        "register {}: not a registration socket (pluginregistration.Registration/GetInfo is unimplemented): {message}",
        socket.display()
    )]
    NotARegistrationSocket { socket: PathBuf, message: String },

    /// The `GetInfo` answer is malformed or out of bounds; see
    /// [`check_info`](crate::check_info).
    #[error("register {}: check GetInfo answer: {reason}", socket.display())]
    InvalidInfo { socket: PathBuf, reason: String },

    #[error("register {}: no handler registered for plugin type: {plugin_type}", socket.display())]
    UnknownPluginType { socket: PathBuf, plugin_type: String },

    #[error("register {}: validate plugin {name:?}: {source}", socket.display())]
    Validate {
        socket: PathBuf,
        name: String,
        #[source]
        source: HandlerError,
    },

    #[error("register {}: register plugin {name:?} with its handler: {source}", socket.display())]
    Register {
        socket: PathBuf,
        name: String,
        #[source]
        source: HandlerError,
    },

    #[error("register {}: NotifyRegistrationStatus: {source}", socket.display())]
    Notify {
        socket: PathBuf,
        #[source]
        source: tonic::Status,
    },

    #[error("register {}: NotifyRegistrationStatus timed out after {timeout:?}", socket.display())]
    NotifyTimeout { socket: PathBuf, timeout: Duration },

    #[error("register {}: add to actual state: {source}", socket.display())]
    ActualState {
        socket: PathBuf,
        #[source]
        source: CacheError,
    },

    // === Anything ===
    #[error("operation for {} panicked: {message}", socket.display())]
    Panicked { socket: PathBuf, message: String },

    // === Config ===
    #[error("invalid backoff: initial {initial:?} must be non-zero and at most max {max:?}")]
    InvalidBackoff { initial: Duration, max: Duration },

    /// A duration of the [`ExecutorConfig`](crate::ExecutorConfig) or the
    /// backoff is out of range; see
    /// [`ExecutorConfig::validate`](crate::ExecutorConfig::validate).
    #[error("invalid executor config: {0}")]
    InvalidConfig(#[from] kpm_api::config::DurationOutOfRange),
}

impl ExecutorError {
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
