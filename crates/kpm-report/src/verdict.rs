//! Verdicts: what a socket or an API object is to the kubelet, by name,
//! and how grave; the words a node's doctor and the fleet reader share.

use kpm_api::ApiObject;
use serde::{Deserialize, Serialize};

/// What a socket is to the kubelet. Its name (`not-registered`) is its
/// variant's in kebab case, its reason (`NotRegistered`) in CamelCase, and
/// its [`severity`](Self::severity) chooses a Node condition's reason.
/// The derived order is the declaration's, for maps only.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[non_exhaustive]
pub enum Verdict {
    /// It registers (or is registered) as it is.
    Ok,
    /// The kubelet ignores it (a hidden name, not a socket).
    Ignored,
    /// Nothing listens on it.
    Stale,
    /// Its verdict or its presence changed more often than the watch's
    /// bound within its window (`kpm doctor --watch` only).
    Flapping,
    /// It answers gRPC, but not the registration service.
    NotARegistrationServer,
    /// `GetInfo` takes longer than the kubelet waits.
    SlowGetInfo,
    /// `GetInfo` fails.
    GetInfoFailed,
    /// The handler of its type refuses it.
    Rejected,
    /// Its endpoint is missing or refuses connections.
    EndpointUnreachable,
    /// Its own service fails.
    ServiceFailing,
    /// Its file is gone while its process still listens.
    DeletedButListening,
    /// It could not be reached for another reason (permissions, a hang).
    Unreachable,
    /// A directory or entry that could not be read.
    Unreadable,
    /// A registry no running kubelet watches holds sockets.
    UnwatchedRegistry,
    /// A pod on the node that should serve a plugin socket (it mounts the
    /// registry, `device-plugins/` or the kubelet's root) serves none: it
    /// is waiting, crash-looping, or its plugin cannot start.
    PodWithoutSocket,
    /// Fine on the node, but the kubelet's device manager or the cluster
    /// shows no registration of it.
    NotRegistered,
    /// Registered before a node event (the kubelet's start, the node's
    /// boot) and not registered again since: the kubelet's checkpoint, the
    /// doctor's own last report or the cluster remember it, and nothing of
    /// the node registers it now.
    NotRegisteredAgain,
    /// The kubelet's device manager holds other healthy devices of its
    /// resource than the plugin lists.
    KubeletMismatch,
    /// The cluster shows it otherwise than the plugin says.
    ClusterMismatch,
    /// CSINode lists a driver no live plugin serves.
    StaleCsiNodeEntry,
    /// A live DRA driver with no ResourceSlice of the node.
    NotPublished,
    /// ResourceSlices of the node from a driver no live plugin serves.
    OrphanedSlices,
    /// Device capacity of the node, none allocatable, that no live device
    /// plugin serves.
    OrphanedCapacity,
    /// The cluster lags what `kpm run`, the node's plugin manager, has
    /// registered, and kpm run is still publishing it: not a failure.
    Publishing,
}

impl Verdict {
    /// Every verdict.
    pub fn all() -> impl Iterator<Item = Self> {
        <Self as strum::IntoEnumIterator>::iter()
    }

    /// Its name in reports: `not-registered`.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The verdict named `name` ([`name`](Self::name)), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        name.parse().ok()
    }

    /// How grave it is, 0 for none: a Node condition's reason is its most
    /// severe failure. A socket nothing serves comes first, then one that
    /// serves but not as the kubelet needs, then what the kubelet and the
    /// cluster show; a finding about other objects last.
    pub fn severity(self) -> u8 {
        match self {
            Self::Ok | Self::Ignored | Self::Publishing => 0,
            Self::OrphanedCapacity => 1,
            Self::OrphanedSlices => 2,
            Self::NotPublished => 3,
            Self::StaleCsiNodeEntry => 4,
            Self::ClusterMismatch => 5,
            Self::KubeletMismatch => 6,
            Self::NotRegistered => 7,
            Self::NotRegisteredAgain => 8,
            Self::UnwatchedRegistry => 9,
            Self::PodWithoutSocket => 10,
            Self::Unreadable => 11,
            Self::Unreachable => 12,
            Self::DeletedButListening => 13,
            Self::ServiceFailing => 14,
            Self::EndpointUnreachable => 15,
            Self::Rejected => 16,
            Self::GetInfoFailed => 17,
            Self::SlowGetInfo => 18,
            Self::NotARegistrationServer => 19,
            Self::Flapping => 20,
            Self::Stale => 21,
        }
    }

    /// The API object a finding of this verdict is about, when it is one
    /// that shows a kind's plugins ([`PluginKind::shown_in`](kpm_api::PluginKind::shown_in)):
    /// a stale CSINode entry, capacity or slices no live plugin serves.
    pub const fn object(self) -> Option<ApiObject> {
        match self {
            Self::StaleCsiNodeEntry => Some(ApiObject::CsiNode),
            Self::OrphanedCapacity => Some(ApiObject::NodeStatus),
            Self::OrphanedSlices => Some(ApiObject::ResourceSlice),
            _ => None,
        }
    }

    /// Whether a plugin with this verdict registers with the kubelet as it
    /// is: `ok`, or `publishing` (the cluster lags `kpm run`, which has it
    /// registered).
    pub fn registers(self) -> bool {
        matches!(self, Self::Ok | Self::Publishing)
    }

    /// Whether it makes the doctor exit 1: all but `ok`, `ignored` and
    /// `publishing`.
    pub fn fails(self) -> bool {
        self.severity() > 0
    }

    /// Its name in CamelCase, as a Kubernetes condition's or Event's
    /// `reason`: `NotRegistered`.
    pub fn reason(self) -> String {
        self.name()
            .split('-')
            .map(|word| {
                let mut chars = word.chars();
                chars
                    .next()
                    .map(|first| first.to_ascii_uppercase())
                    .into_iter()
                    .chain(chars)
                    .collect::<String>()
            })
            .collect()
    }
}

/// A verdict as a report names it: one this crate knows, or the name a
/// newer doctor wrote. Reports are read across versions, so a name this
/// reader does not know is kept as written, and counts as failing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ReportedVerdict {
    /// A verdict of this version.
    Known(Verdict),
    /// A name this version does not know.
    Unknown(String),
}

impl ReportedVerdict {
    /// The verdict named `name`, as a report reader takes it: known, or
    /// kept by name.
    pub fn named(name: &str) -> Self {
        Verdict::from_name(name).map_or_else(|| Self::Unknown(name.to_owned()), Self::Known)
    }

    /// Its name, as the report writes it.
    pub fn name(&self) -> &str {
        match self {
            Self::Known(verdict) => verdict.name(),
            Self::Unknown(name) => name,
        }
    }

    /// Whether it fails: a known verdict as it says, an unknown one always
    /// (it is not `ok`, and a reader must not call a node healthy on a word
    /// it cannot read).
    pub fn fails(&self) -> bool {
        match self {
            Self::Known(verdict) => verdict.fails(),
            Self::Unknown(_) => true,
        }
    }
}

impl std::fmt::Display for ReportedVerdict {
    /// Its name.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<Verdict> for ReportedVerdict {
    fn from(verdict: Verdict) -> Self {
        Self::Known(verdict)
    }
}

impl PartialEq<Verdict> for ReportedVerdict {
    fn eq(&self, other: &Verdict) -> bool {
        matches!(self, Self::Known(verdict) if verdict == other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_go_both_ways() {
        for verdict in Verdict::all() {
            assert_eq!(Verdict::from_name(verdict.name()), Some(verdict));
            let json = serde_json::to_value(verdict).unwrap();
            assert_eq!(json, verdict.name());
            assert_eq!(serde_json::from_value::<Verdict>(json).unwrap(), verdict);
        }
        assert_eq!(Verdict::NotRegistered.name(), "not-registered");
        assert_eq!(Verdict::NotRegistered.reason(), "NotRegistered");
        assert_eq!(Verdict::StaleCsiNodeEntry.reason(), "StaleCsiNodeEntry");
    }

    #[test]
    fn an_unknown_name_is_kept_and_fails() {
        let known: ReportedVerdict = serde_json::from_str(r#""ok""#).unwrap();
        assert_eq!(known, Verdict::Ok);
        assert!(!known.fails());
        let newer: ReportedVerdict = serde_json::from_str(r#""some-future-verdict""#).unwrap();
        assert_eq!(newer, ReportedVerdict::Unknown("some-future-verdict".to_owned()));
        assert_eq!(newer.name(), "some-future-verdict");
        assert!(newer.fails());
        assert_eq!(serde_json::to_string(&newer).unwrap(), r#""some-future-verdict""#);
    }

    #[test]
    fn only_ok_ignored_and_publishing_do_not_fail() {
        let passing: Vec<Verdict> = Verdict::all().filter(|verdict| !verdict.fails()).collect();
        assert_eq!(passing, [Verdict::Ok, Verdict::Ignored, Verdict::Publishing]);
    }
}
