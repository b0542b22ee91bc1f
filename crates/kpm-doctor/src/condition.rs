//! The Node condition a node's doctor publishes: what its plugins come to,
//! in one line of `kubectl describe node`.
//!
//! Its type is [`CONDITION_TYPE`], `KubeletPluginsHealthy`, positive like
//! the kubelet's `Ready`: `True` when every plugin of the node is ok,
//! `False` when one fails. Its `reason` is then the first failing verdict,
//! in the order of [`Verdict`], in CamelCase (`Stale`, `NotRegistered`),
//! and its `message` names each failing plugin and why, at most
//! [`MAX_MESSAGE_BYTES`] long.

use std::fmt::Write as _;

use crate::judge::Verdict;
use crate::{Failure, Report};

/// The condition's type on the Node.
pub const CONDITION_TYPE: &str = "KubeletPluginsHealthy";

/// The field manager of every write of a node's doctor: its own, so that it
/// owns its condition and nothing else.
pub const FIELD_MANAGER: &str = "kpm-doctor";

/// The reason of the condition when every plugin is ok.
pub const HEALTHY_REASON: &str = "PluginsHealthy";

/// The reason of the condition when the doctor could not look where the
/// kubelet's plugins live (its registry unreadable, the API server not read).
pub const CANNOT_JUDGE_REASON: &str = "CannotJudge";

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
    /// As the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// What the condition says, timestamps aside: a write is due when this
/// changes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PluginsCondition {
    /// `True` when every plugin is ok.
    pub status: ConditionStatus,
    /// [`HEALTHY_REASON`], or the first failing verdict in CamelCase.
    pub reason: String,
    /// Which plugins fail and why, bounded.
    pub message: String,
}

impl PluginsCondition {
    /// The condition `report` comes to: `Unknown` when the doctor could
    /// not look ([`CANNOT_JUDGE_REASON`]).
    pub fn of(report: &Report) -> Self {
        match &report.blind {
            Some(blind) => Self {
                status: ConditionStatus::Unknown,
                reason: CANNOT_JUDGE_REASON.to_owned(),
                message: truncated(&blind.why, MAX_MESSAGE_BYTES).to_owned(),
            },
            None => Self::of_failures(report.plugins.len(), report.failures()),
        }
    }

    /// The condition of a node with `entries` entries judged, of which
    /// `failures` fail.
    pub fn of_failures<'a>(entries: usize, failures: impl Iterator<Item = Failure<'a>>) -> Self {
        let mut failures: Vec<Failure<'a>> = failures.collect();
        if failures.is_empty() {
            return Self {
                status: ConditionStatus::True,
                reason: HEALTHY_REASON.to_owned(),
                message: format!("all {entries} plugin sockets of the node are ok"),
            };
        }
        failures.sort_by_key(|failure| failure.verdict);
        let reason = failures.first().map_or(Verdict::Unreachable, |first| first.verdict).reason();
        let mut message = format!("{} failing: ", failures.len());
        for (i, failure) in failures.iter().enumerate() {
            let item = format!(
                "{}{} ({}): {}",
                if i == 0 { "" } else { "; " },
                failure.subject(),
                failure.verdict.name(),
                failure.reason
            );
            let more = format!("; and {} more", failures.len() - i);
            // Room is kept for the "and N more" that would follow.
            if message.len() + item.len() + more.len() > MAX_MESSAGE_BYTES {
                if i == 0 {
                    let room = MAX_MESSAGE_BYTES.saturating_sub(message.len() + more.len() + 1);
                    message.push_str(truncated(&item, room));
                    message.push('…');
                    if failures.len() > 1 {
                        let _ = write!(message, "; and {} more", failures.len() - 1);
                    }
                } else {
                    message.push_str(&more);
                }
                break;
            }
            message.push_str(&item);
        }
        Self { status: ConditionStatus::False, reason, message }
    }
}

/// The longest prefix of `text` of at most `bytes` bytes that ends on a
/// character boundary.
fn truncated(text: &str, bytes: usize) -> &str {
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    fn failure<'a>(
        verdict: Verdict,
        path: &'a Path,
        name: Option<&'a str>,
        reason: &'a str,
    ) -> Failure<'a> {
        Failure { verdict, path, plugin_type: None, name, reason }
    }

    #[test]
    fn a_node_the_doctor_could_not_look_at_is_unknown() {
        let report = Report {
            root_dir: PathBuf::from("/nonexistent"),
            root_from: "--root-dir".to_owned(),
            kubelets: Vec::new(),
            node: None,
            plugins: Vec::new(),
            findings: Vec::new(),
            unseen: Vec::new(),
            blind: Some(crate::Blind {
                why: "/nonexistent/plugins_registry: cannot be listed".to_owned(),
                hint: "--root-dir".to_owned(),
            }),
            ok: false,
        };
        let condition = PluginsCondition::of(&report);
        assert_eq!(condition.status, ConditionStatus::Unknown);
        assert_eq!(condition.reason, "CannotJudge");
        assert_eq!(condition.message, "/nonexistent/plugins_registry: cannot be listed");
    }

    #[test]
    fn a_healthy_node_is_true() {
        let condition = PluginsCondition::of_failures(3, std::iter::empty());
        assert_eq!(condition.status, ConditionStatus::True);
        assert_eq!(condition.reason, "PluginsHealthy");
        assert_eq!(condition.message, "all 3 plugin sockets of the node are ok");
    }

    #[test]
    fn the_reason_is_the_first_failing_verdict_and_the_message_names_each_plugin() {
        let (stale, gpu) =
            (PathBuf::from("/r/plugins_registry/a-reg.sock"), PathBuf::from("/r/x.sock"));
        let failures = [
            failure(Verdict::NotRegistered, &gpu, Some("vendor.com/gpu"), "the kubelet holds none"),
            failure(Verdict::Stale, &stale, None, "connection refused"),
        ];
        let condition = PluginsCondition::of_failures(5, failures.into_iter());
        assert_eq!(condition.status, ConditionStatus::False);
        assert_eq!(condition.reason, "Stale");
        assert_eq!(
            condition.message,
            "2 failing: a-reg.sock (stale): connection refused; \
             vendor.com/gpu (not-registered): the kubelet holds none"
        );
    }

    #[test]
    fn the_message_is_bounded_and_says_how_many_more() {
        let path = PathBuf::from("/r/plugins_registry/x.sock");
        let long = "é".repeat(2000);
        let many: Vec<Failure<'_>> = (0..50)
            .map(|_| failure(Verdict::Rejected, &path, Some("csi.example.com"), "too old"))
            .collect();
        let condition = PluginsCondition::of_failures(50, many.into_iter());
        assert!(condition.message.len() <= MAX_MESSAGE_BYTES, "{}", condition.message.len());
        assert!(condition.message.starts_with("50 failing: csi.example.com (rejected): too old; "));
        assert!(condition.message.ends_with(" more"), "{}", condition.message);
        // One failure longer than the bound alone is cut on a character.
        let one = [failure(Verdict::Rejected, &path, None, &long)];
        let condition = PluginsCondition::of_failures(1, one.into_iter());
        assert!(condition.message.len() <= MAX_MESSAGE_BYTES);
        assert!(condition.message.ends_with('…'));
    }

    #[test]
    fn every_verdict_has_a_camel_case_reason() {
        assert_eq!(Verdict::NotARegistrationServer.reason(), "NotARegistrationServer");
        assert_eq!(Verdict::StaleCsiNodeEntry.reason(), "StaleCsiNodeEntry");
        for verdict in Verdict::ALL {
            let reason = verdict.reason();
            assert!(reason.chars().all(|c| c.is_ascii_alphanumeric()), "{reason}");
            assert!(reason.starts_with(|c: char| c.is_ascii_uppercase()), "{reason}");
        }
    }
}
