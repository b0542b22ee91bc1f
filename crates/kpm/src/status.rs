//! A point-in-time view of every known registration socket.

use std::path::PathBuf;
use std::time::SystemTime;

use kpm_cache::{ActualState, DesiredState};
use kpm_executor::OperationMap;

/// Where a socket is in its registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PluginState {
    /// Registered with its handler, in its current incarnation.
    Registered,
    /// Being registered or deregistered, or waiting for its first attempt.
    Pending,
    /// The last attempt failed; see `last_error`. Retried after a backoff,
    /// or never for this incarnation if the failure is permanent.
    Failed,
}

impl PluginState {
    /// The lowercase name used in logs and the status API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Registered => "registered",
            Self::Pending => "pending",
            Self::Failed => "failed",
        }
    }
}

/// One registration socket as the manager sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginStatus {
    pub socket_path: PathBuf,
    pub state: PluginState,
    /// The incarnation: the desired one, or the registered one while the
    /// socket is leaving.
    pub generation: u64,
    /// What the plugin reported; empty until it is registered.
    pub plugin_type: String,
    pub name: String,
    pub endpoint: String,
    pub versions: Vec<String>,
    pub last_error: Option<String>,
    pub registered_at: Option<SystemTime>,
}

/// Builds the sorted status of every socket that is desired or registered.
pub(crate) fn snapshot(
    desired: &DesiredState,
    actual: &ActualState,
    operations: &OperationMap,
) -> Vec<PluginStatus> {
    let mut statuses: Vec<PluginStatus> = desired
        .snapshot()
        .into_iter()
        .map(|plugin| {
            let registered =
                actual.get(&plugin.socket_path).filter(|info| info.generation == plugin.generation);
            let operation = operations.status(&plugin.socket_path);
            let pending = operation.as_ref().is_some_and(|op| op.pending);
            let last_error = operation.and_then(|op| op.last_error);
            let state = match (&registered, &last_error) {
                (Some(_), _) => PluginState::Registered,
                (None, Some(_)) if !pending => PluginState::Failed,
                (None, _) => PluginState::Pending,
            };
            let mut status = PluginStatus {
                socket_path: plugin.socket_path,
                state,
                generation: plugin.generation.get(),
                plugin_type: String::new(),
                name: String::new(),
                endpoint: String::new(),
                versions: Vec::new(),
                last_error,
                registered_at: None,
            };
            if let Some(info) = registered {
                status.plugin_type = info.plugin_type;
                status.name = info.name;
                status.endpoint = info.endpoint;
                status.versions = info.versions;
                status.registered_at = Some(info.registered_at);
            }
            status
        })
        .collect();
    // Registered plugins whose socket is gone are being deregistered.
    for info in actual.snapshot() {
        if !desired.contains(&info.socket_path) {
            statuses.push(PluginStatus {
                socket_path: info.socket_path,
                state: PluginState::Pending,
                generation: info.generation.get(),
                plugin_type: info.plugin_type,
                name: info.name,
                endpoint: info.endpoint,
                versions: info.versions,
                last_error: None,
                registered_at: Some(info.registered_at),
            });
        }
    }
    statuses.sort_by(|a, b| a.socket_path.cmp(&b.socket_path));
    statuses
}
