//! Point-in-time, read-only views of the manager's sockets and plugins.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use kpm_cache::{
    ActualState, DesiredPlugin, DesiredState, Generation, PluginDetails, Registration,
};
use kpm_executor::{OperationMap, OperationStatus};

/// Where a socket is in its registration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PluginState {
    /// Registered with its handler, in its current incarnation.
    Registered,
    /// Being registered, or waiting for its first attempt.
    #[default]
    Pending,
    /// The last attempt failed (see `last_error`); the next one starts at
    /// `retry_at`, or when the socket is re-created, whichever comes first.
    BackingOff {
        /// When the backoff ends.
        retry_at: SystemTime,
    },
    /// The last attempt failed in a way retrying cannot fix (see
    /// `last_error`): nothing more is tried until the socket is re-created.
    Failed,
    /// Still registered, but its socket is gone: being deregistered.
    Deregistering,
    /// Held back from registration while the endpoint its plugin reported
    /// is gone (`last_error` says which): deregistered, and registered
    /// again as soon as the endpoint is back. Shown as `held`.
    EndpointGone,
}

impl PluginState {
    /// The snake-case name used in logs and the status API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Registered => "registered",
            Self::Pending => "pending",
            Self::BackingOff { .. } => "backing_off",
            Self::Failed => "failed",
            Self::Deregistering => "deregistering",
            Self::EndpointGone => "held",
        }
    }

    /// When the next attempt starts, for [`PluginState::BackingOff`].
    pub fn retry_at(self) -> Option<SystemTime> {
        match self {
            Self::BackingOff { retry_at } => Some(retry_at),
            _ => None,
        }
    }
}

/// One registration socket as the manager sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PluginStatus {
    /// The registration socket.
    pub socket_path: PathBuf,
    /// Where it is in its registration.
    pub state: PluginState,
    /// The incarnation: the desired one, or the registered one while the
    /// socket is leaving.
    pub generation: Generation,
    /// Why the last attempt failed, while backing off or failed.
    pub last_error: Option<String>,
    /// What is registered from the socket: `None` until it is registered.
    pub registration: Option<Registration>,
}

impl PluginStatus {
    /// A socket in `state`, incarnation `generation`, with nothing
    /// registered and no error: for consumers to build statuses in their
    /// tests (with [`Generation::for_tests`], feature `testing`).
    pub fn new(
        socket_path: impl Into<PathBuf>,
        state: PluginState,
        generation: Generation,
    ) -> Self {
        Self {
            socket_path: socket_path.into(),
            state,
            generation,
            last_error: None,
            registration: None,
        }
    }

    /// The registered plugin's name, endpoint and versions, once it is
    /// registered.
    pub fn plugin(&self) -> Option<&PluginDetails> {
        self.registration.as_ref().map(|registered| &registered.plugin)
    }
}

/// `{"socket_path", "type", "name", "endpoint", "versions", "state",
/// "generation", "last_error", "registered_at", "retry_at", "server_pid"}`,
/// in that order (`kpm list -o json` prints the keys as they come): `state`
/// as [`PluginState::as_str`], `retry_at` from a [`PluginState::BackingOff`],
/// times in RFC 3339. Until the socket is registered, the plugin's strings
/// are empty and its versions `[]`, as scripts written against the first
/// status API expect; other absent values are `null`.
#[cfg(feature = "serde")]
impl serde::Serialize for PluginStatus {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use kpm_api::json::Rfc3339;

        #[derive(serde::Serialize)]
        struct Document<'a> {
            socket_path: String,
            #[serde(rename = "type")]
            plugin_type: &'a str,
            name: &'a str,
            endpoint: std::borrow::Cow<'a, str>,
            versions: &'a [String],
            state: &'static str,
            generation: Generation,
            last_error: Option<&'a str>,
            registered_at: Option<Rfc3339>,
            retry_at: Option<Rfc3339>,
            server_pid: Option<u32>,
        }

        let registration = self.registration.as_ref();
        let plugin = registration.map(|registered| &registered.plugin);
        Document {
            socket_path: self.socket_path.display().to_string(),
            plugin_type: registration.map_or("", |registered| &registered.plugin_type),
            name: plugin.map_or("", |plugin| &plugin.name),
            endpoint: plugin.map_or("".into(), |plugin| plugin.endpoint.target()),
            versions: plugin.map_or(&[], |plugin| &plugin.versions),
            state: self.state.as_str(),
            generation: self.generation,
            last_error: self.last_error.as_deref(),
            registered_at: registration.map(|registered| Rfc3339(registered.registered_at)),
            retry_at: self.state.retry_at().map(Rfc3339),
            server_pid: registration.and_then(|registered| registered.server_pid),
        }
        .serialize(serializer)
    }
}

/// Read-only view of the sockets present: the desired state of the world.
#[derive(Debug, Clone)]
pub struct DesiredStateView(pub(crate) Arc<DesiredState>);

impl DesiredStateView {
    /// Whether a socket is present at `socket_path`.
    pub fn contains(&self, socket_path: &Path) -> bool {
        self.0.contains(socket_path)
    }

    /// The current incarnation of the socket at `socket_path`.
    pub fn generation(&self, socket_path: &Path) -> Option<Generation> {
        self.0.generation(socket_path)
    }

    /// The number of sockets present.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no socket is present.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every socket present, with its incarnation.
    pub fn snapshot(&self) -> Vec<DesiredPlugin> {
        self.0.snapshot()
    }
}

/// Read-only view of the registered plugins: the actual state of the world.
#[derive(Debug, Clone)]
pub struct ActualStateView(pub(crate) Arc<ActualState>);

impl ActualStateView {
    /// Whether a plugin is registered from `socket_path`.
    pub fn contains(&self, socket_path: &Path) -> bool {
        self.0.contains(socket_path)
    }

    /// The plugin registered from `socket_path`.
    pub fn get(&self, socket_path: &Path) -> Option<Registration> {
        self.0.get(socket_path)
    }

    /// The number of registered plugins.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no plugin is registered.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every registered plugin.
    pub fn snapshot(&self) -> Vec<Registration> {
        self.0.snapshot()
    }
}

/// Where a desired socket is, given its operation and whether its current
/// incarnation is registered.
fn state_of(registered: bool, operation: Option<&OperationStatus>) -> PluginState {
    if registered {
        return PluginState::Registered;
    }
    match operation {
        Some(op) if !op.pending && op.last_error.is_some() => match op.retry_at {
            Some(at) => PluginState::BackingOff { retry_at: wall_clock(at) },
            None => PluginState::Failed,
        },
        _ => PluginState::Pending,
    }
}

/// The wall-clock time of a tokio instant, for display.
fn wall_clock(at: tokio::time::Instant) -> SystemTime {
    let wait = at.saturating_duration_since(tokio::time::Instant::now());
    SystemTime::now().checked_add(wait).unwrap_or(SystemTime::UNIX_EPOCH)
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
            let (state, last_error) = match plugin.held {
                Some(reason) if registered.is_some() => (PluginState::Deregistering, Some(reason)),
                Some(reason) => (PluginState::EndpointGone, Some(reason)),
                None => (
                    state_of(registered.is_some(), operation.as_ref()),
                    operation.and_then(|op| op.last_error),
                ),
            };
            PluginStatus {
                socket_path: plugin.socket_path,
                state,
                generation: plugin.generation,
                last_error,
                registration: registered,
            }
        })
        .collect();
    statuses.extend(
        actual
            .snapshot()
            .into_iter()
            .filter(|info| !desired.contains(&info.socket_path))
            .map(leaving),
    );
    statuses.sort_by(|a, b| a.socket_path.cmp(&b.socket_path));
    statuses
}

/// The status of `registration`, its socket gone: deregistering.
fn leaving(registration: Registration) -> PluginStatus {
    PluginStatus {
        socket_path: registration.socket_path.clone(),
        state: PluginState::Deregistering,
        generation: registration.generation,
        last_error: None,
        registration: Some(registration),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn operation(pending: bool, error: bool, retry_in: Option<Duration>) -> OperationStatus {
        OperationStatus {
            pending,
            last_error: error.then(|| "GetInfo: connection refused".to_owned()),
            retry_at: retry_in.map(|wait| tokio::time::Instant::now() + wait),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_that_will_be_retried_is_backing_off_with_its_retry_time() {
        let before = SystemTime::now();
        let state = state_of(false, Some(&operation(false, true, Some(Duration::from_secs(8)))));
        let retry_at = state.retry_at().unwrap();
        assert_eq!(state.as_str(), "backing_off");
        assert!(retry_at >= before + Duration::from_secs(8), "{retry_at:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn states_follow_the_operation() {
        let cases = [
            (true, None, PluginState::Registered),
            (true, Some(operation(false, true, None)), PluginState::Registered),
            (false, None, PluginState::Pending),
            (false, Some(operation(true, false, None)), PluginState::Pending),
            // A retry running after a failure is pending again.
            (false, Some(operation(true, true, Some(Duration::ZERO))), PluginState::Pending),
            (false, Some(operation(false, true, None)), PluginState::Failed),
        ];
        for (registered, op, expected) in cases {
            assert_eq!(state_of(registered, op.as_ref()), expected, "{registered} {op:?}");
        }
    }
}
