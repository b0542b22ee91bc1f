//! The two caches of the plugin manager and the contract with plugin handlers.
//!
//! - [`DesiredState`]: the registration sockets that exist, each with the
//!   [`Generation`] of its current incarnation. Written by the watcher
//!   (sockets added and removed, on events and rescans) and by the liveness
//!   monitor ([`DesiredState::renew`]: a new generation for the same socket
//!   file, when its plugin died or hangs; [`DesiredState::hold`] and
//!   [`release`](DesiredState::release) while the endpoint it advertised is
//!   gone). A generation comes from a per-cache counter, never the clock.
//! - [`ActualState`]: the plugins that are registered, each a [`Registered`]:
//!   the [`Registration`] and the handler that accepted it. Written by the
//!   operation executor.
//! - [`PluginHandler`]: what a plugin type (CSI, device plugin, DRA) does on
//!   validation, registration and deregistration.
//! - [`ChangeSignal`]: lets a reconciler sleep until a cache changes.
//! - [`EventBus`]: a broadcast of [`PluginEvent`]s for status APIs, which
//!   counts what it publishes ([`EventCounts`]) for metrics: what happens to
//!   registration sockets, and (published by kpm-dra) the changes of a DRA
//!   device's health.
//! - [`Hangups`]: where the device and DRA handlers report a connection to a
//!   plugin that ended by itself, for liveness to check.
//!
//! Both caches are keyed by socket path with O(1) lookups, return sorted
//! snapshots so that every consumer sees a deterministic order (`paths()`
//! lists the keys unsorted, for a caller that orders its own work). The
//! crate does no IO and has no tasks and no timers: the layers above bring
//! those. DesiredState also journals the paths that changed, for the
//! reconciler alone to drain ([`DesiredState::take_changed`]); the journal
//! is written before the [`ChangeSignal`] wakes anyone, so no subscriber
//! misses a change.

#![deny(missing_docs)]

mod actual_state;
mod change;
mod desired_state;
mod events;
mod handler;
mod hangups;
mod registration;

pub use actual_state::{ActualState, Registered};
pub use change::{ChangeSignal, Changes};
pub use desired_state::{DesiredPlugin, DesiredState, Generation};
pub use events::{EventBus, EventCounts, PluginEvent};
pub use handler::{HandlerError, PluginHandler, ServiceReport};
pub use hangups::Hangups;
pub use registration::{PluginDetails, PluginEndpoint, Registration};

/// Errors of the cache crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// A cache entry was added with an empty socket path (the kubelet's text).
    #[error("socket path is empty")]
    EmptySocketPath,
}
