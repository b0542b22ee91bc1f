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
//!
//! What holds across the crate:
//!
//! - [`kpm_cache::ActualState`] holds only plugins their handler accepted
//!   and that were told so: if the final `NotifyRegistrationStatus` fails,
//!   the handler's registration is undone and the operation backs off.
//! - Each registration is deregistered exactly once: an unregistration
//!   removes the plugin from ActualState first, and only the call that
//!   removed that incarnation tells the handler.
//! - No plugin input reaches a handler unchecked ([`check_info`]), and every
//!   handler call (validate, register, deregister, inspect) runs in a task of
//!   its own under `handler_timeout`, logging where its caller logs: a
//!   handler that panics or hangs fails that call, with a reason the plugin
//!   is told, a register cut off that way is undone with a deregister, and a
//!   deregister that fails still counts as done.
//! - A rejection reaches the plugin as `NotifyRegistrationStatus(false)`
//!   with the kubelet's texts; an error that retrying cannot fix (not a
//!   registration socket, an answer out of bounds, an unknown type) blocks
//!   the socket until a new incarnation instead of retrying forever.
//! - No registration fails, and no plugin is told `false`, for kpm's own
//!   lack of file descriptors: dials wait for their permit, and
//!   registrations wait for a slot sized from the budget.
//! - Every error names the socket and the step ([`ExecutorError`]).
//! - `kpm probe`, `kpm check` and `kpm doctor` judge sockets only through
//!   [`OperationExecutor::inspect`], the register operation's own steps, so
//!   no second copy of the register path exists to drift.

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
