//! The operation executor of the plugin manager.
//!
//! - [`OperationMap`]: one operation per socket path at a time, exponential
//!   backoff after failures (the kubelet's goroutinemap, without its leaks).
//! - [`OperationExecutor`]: the register and unregister operations: dial the
//!   registration socket, `GetInfo`, hand the plugin to the handler of its
//!   type, `NotifyRegistrationStatus`, update [`kpm_cache::ActualState`].
//!   Its config is checked once, by [`OperationExecutor::try_new`]; the
//!   steps of one registration are in the `attempt` module.
//! - [`check_info`]: the bounds every `GetInfo` answer must keep.
//! - [`OperationExecutor::inspect`]: the register operation's steps on a
//!   socket, timed, registering nothing: an [`Inspection`].
//!
//! Operations run as tokio tasks; every wait is a tokio timer, so tests run on
//! paused time.

#![deny(missing_docs)]

mod error;
mod inspection;
mod isolation;
mod operation_executor;
mod operation_map;
mod plugin_info;

pub use error::ExecutorError;
pub use inspection::{InspectedStep, Inspection, Step};
/// The one backoff of kpm, which lives in `kpm-api` so that every crate
/// (kpm-kube, kpm-doctor) shares it.
pub use kpm_api::backoff::{Backoff, BackoffError, ExponentialBackoff};
pub use operation_executor::{ExecutorConfig, Handlers, OperationExecutor};
pub use operation_map::{OperationMap, OperationStatus};
pub use plugin_info::{check_info, plugin_endpoint};
