//! What a node's doctor writes of its condition: as whom, and what it says
//! (the condition's words are the report crate's: [`kpm_report::CONDITION_TYPE`]).

use kpm_report::ConditionStatus;

/// The field manager of every write of a node's doctor: its own, so that it
/// owns its condition and nothing else.
pub const FIELD_MANAGER: &str = "kpm-doctor";

/// What the condition says, timestamps aside: a write is due when this
/// changes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PluginsCondition {
    /// `True` when every plugin is ok.
    pub status: ConditionStatus,
    /// [`HEALTHY_REASON`](kpm_report::HEALTHY_REASON), or the first failing verdict in CamelCase.
    pub reason: String,
    /// Which plugins fail and why, bounded.
    pub message: String,
}
