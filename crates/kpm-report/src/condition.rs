//! The Node condition a node's doctor publishes beside its report: its
//! type, its status and the reasons that are not verdicts.
//!
//! Its type is [`CONDITION_TYPE`], `KubeletPluginsHealthy`, positive like
//! the kubelet's `Ready`: `True` when every plugin of the node is ok,
//! `False` when one fails, `Unknown` ([`CANNOT_JUDGE_REASON`]) when the
//! doctor could not look. When `False`, its `reason` is the most severe
//! failing verdict ([`Verdict::severity`](crate::Verdict::severity)), in
//! CamelCase (`Stale`, `NotRegistered`), and its `message` names each
//! failing plugin and why, at most [`MAX_MESSAGE_BYTES`] long.

use crate::Health;

/// The condition's type on the Node.
pub const CONDITION_TYPE: &str = "KubeletPluginsHealthy";

/// The reason of the condition when every plugin is ok.
pub const HEALTHY_REASON: &str = "PluginsHealthy";

/// The reason of the condition when the doctor could not look where the
/// kubelet's plugins live (its registry unreadable, the API server not read).
pub const CANNOT_JUDGE_REASON: &str = "CannotJudge";

/// The reason of a plugin's own condition (`kpm doctor --watch
/// --plugin-condition`) while a plugin of its name is registered.
pub const PLUGIN_REGISTERED_REASON: &str = "PluginRegistered";

/// The reason of a plugin's own condition when no socket of the node names
/// the plugin, and no node event is known to have lost it.
pub const PLUGIN_NOT_FOUND_REASON: &str = "PluginNotFound";

/// The reason of every condition a doctor leaves when it stops other than
/// for its own replacement (the node shutting down): `Unknown`, since
/// nothing judges the node until a doctor runs again.
pub const DOCTOR_STOPPED_REASON: &str = "DoctorStopped";

/// The longest `message`, in bytes: enough for a dozen failing plugins, far
/// below what the API server takes (32 KiB), so that a node with many
/// failures keeps its Node object small.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum ConditionStatus {
    /// Every plugin is ok.
    True,
    /// A plugin fails.
    False,
    /// Nobody could tell.
    Unknown,
}

impl ConditionStatus {
    /// A condition's `status` as the API server shows it: anything but
    /// `True` and `False` is `Unknown`, never read as healthy.
    pub fn from_api(status: &str) -> Self {
        match status {
            "True" => Self::True,
            "False" => Self::False,
            _ => Self::Unknown,
        }
    }

    /// As the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

impl From<ConditionStatus> for Health {
    fn from(status: ConditionStatus) -> Self {
        match status {
            ConditionStatus::True => Self::Healthy,
            ConditionStatus::False => Self::Failing,
            ConditionStatus::Unknown => Self::CannotJudge,
        }
    }
}
