//! What kpm-kube reports about itself: per kind of object the last
//! successful sync and the last error, and the API requests it made by verb,
//! resource and outcome.

use std::collections::BTreeMap;
use std::fmt;
use std::time::SystemTime;

use kpm_api::{ApiObject, PluginKind};
use parking_lot::Mutex;

/// The kinds of objects kpm writes, and the CSIDrivers it follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum ObjectKind {
    /// The Node's CSI node-id annotation and topology labels.
    Node,
    /// The node's CSINode object.
    CsiNode,
    /// The Node's `status.capacity` and `status.allocatable` of device-plugin resources.
    NodeStatus,
    /// The node's ResourceSlices of DRA drivers that went away.
    ResourceSlice,
    /// The cluster's CSIDriver objects, read for their allocatable update
    /// period; a success is a list or watch event received.
    CsiDriver,
    /// What an earlier run published (device resources, CSI drivers):
    /// reading kpm's fields at start, and removing those no plugin claimed
    /// within the grace period.
    Leftovers,
}

impl ObjectKind {
    /// Every kind, in display order.
    pub const ALL: [Self; 6] = [
        Self::Node,
        Self::CsiNode,
        Self::NodeStatus,
        Self::ResourceSlice,
        Self::CsiDriver,
        Self::Leftovers,
    ];

    /// The kind [`as_str`](Self::as_str) names, as the status API shows it.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }

    /// The objects kpm publishes a plugin of `kind` in, named after the
    /// plugin (its pending publications): those that show its kind
    /// ([`PluginKind::shown_in`]). What the doctor excuses a difference
    /// with the cluster by while it is pending.
    pub fn of_plugins(kind: PluginKind) -> impl Iterator<Item = Self> {
        kind.shown_in().iter().map(|&object| Self::from(object))
    }

    /// The name shown by `kpm list`: the Kubernetes kind, `Node status` for
    /// the subresource, `Leftovers` for the clean-up of an earlier run's.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "Node",
            Self::CsiNode => "CSINode",
            Self::NodeStatus => "Node status",
            Self::ResourceSlice => "ResourceSlice",
            Self::CsiDriver => "CSIDriver",
            Self::Leftovers => "Leftovers",
        }
    }
}

impl From<ApiObject> for ObjectKind {
    fn from(object: ApiObject) -> Self {
        match object {
            ApiObject::Node => Self::Node,
            ApiObject::CsiNode => Self::CsiNode,
            ApiObject::NodeStatus => Self::NodeStatus,
            ApiObject::ResourceSlice => Self::ResourceSlice,
        }
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// As its [`as_str`](ObjectKind::as_str) name, the one the status API shows.
#[cfg(feature = "serde")]
impl serde::Serialize for ObjectKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// From its [`as_str`](ObjectKind::as_str) name.
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for ObjectKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::from_name(&name).ok_or_else(|| {
            let names = Self::ALL.map(Self::as_str);
            serde::de::Error::custom(format!("unknown kind {name:?}, expected one of {names:?}"))
        })
    }
}

/// How publishing one kind of object went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ObjectSync {
    /// When kpm last wrote (or found up to date) an object of this kind.
    #[cfg_attr(feature = "serde", serde(serialize_with = "kpm_api::json::rfc3339_opt"))]
    pub last_success: Option<SystemTime>,
    /// The last failure, kept after later successes; compare the times.
    pub last_error: Option<SyncError>,
}

/// A failed sync.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct SyncError {
    /// When it failed.
    #[cfg_attr(feature = "serde", serde(serialize_with = "kpm_api::json::rfc3339"))]
    pub at: SystemTime,
    /// The error, with its causes.
    pub message: String,
}

impl SyncError {
    /// A sync that failed `at` with `message`.
    pub fn new(at: SystemTime, message: impl Into<String>) -> Self {
        Self { at, message: message.into() }
    }
}

/// How many API requests of one verb on one resource ended one way.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RequestCount {
    /// The Kubernetes verb: `get`, `create`, `update`, `patch`, `list`, `deletecollection`.
    pub verb: &'static str,
    /// The resource, e.g. `nodes/status`.
    pub resource: &'static str,
    /// `success`, the HTTP status code of an error answer (`404`, `409`, …),
    /// `error` when there was no answer, `timeout` when it came too late.
    pub outcome: String,
    /// The number of requests.
    pub count: u64,
}

impl RequestCount {
    /// The outcome of a request the API server answered with success.
    pub const SUCCESS: &'static str = "success";

    /// `count` requests of `verb` on `resource` that ended with `outcome`.
    pub fn new(
        verb: &'static str,
        resource: &'static str,
        outcome: impl Into<String>,
        count: u64,
    ) -> Self {
        Self { verb, resource, outcome: outcome.into(), count }
    }
}

/// Something kpm wants the API server to hold and it does not yet: a
/// difference the reconcile loop is working on. With feature `serde`, it
/// reads back what it writes (`kpm doctor` reads `kpm run`'s).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct PendingPublication {
    /// The object it is pending on.
    pub kind: ObjectKind,
    /// The CSI driver, device resource or DRA driver.
    pub name: String,
    /// What kpm wants there, e.g. `capacity 4, allocatable 3`.
    pub want: String,
    /// Whether kpm wants it gone: a withdrawn CSI driver, a device resource
    /// whose plugin went away, a DRA driver's slices.
    pub removes: bool,
    /// When kpm started to want it.
    #[cfg_attr(
        feature = "serde",
        serde(
            serialize_with = "kpm_api::json::rfc3339",
            deserialize_with = "kpm_api::json::from_rfc3339"
        )
    )]
    pub since: SystemTime,
    /// Why the last attempt failed; none while the next step is under way.
    pub last_error: Option<String>,
}

impl PendingPublication {
    /// `name` of `kind`, wanted as `want` (gone, when it `removes`) since
    /// `since`.
    pub fn new(
        kind: ObjectKind,
        name: impl Into<String>,
        want: impl Into<String>,
        removes: bool,
        since: SystemTime,
    ) -> Self {
        Self { kind, name: name.into(), want: want.into(), removes, since, last_error: None }
    }
}

/// A snapshot of what the publishers did, for the status API and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct KubeStatus {
    /// The Node kpm publishes for.
    pub node: String,
    /// One entry per [`ObjectKind`], in [`ObjectKind::ALL`] order;
    /// serialized as `[{"kind", "last_success", "last_error"}]`.
    #[cfg_attr(feature = "serde", serde(serialize_with = "objects"))]
    pub objects: Vec<(ObjectKind, ObjectSync)>,
    /// Every (verb, resource, outcome) seen, sorted.
    pub requests: Vec<RequestCount>,
    /// What the API server does not hold yet, oldest first: empty when it
    /// holds all kpm publishes.
    pub pending: Vec<PendingPublication>,
}

/// `objects` as a list of `{"kind", "last_success", "last_error"}`.
#[cfg(feature = "serde")]
fn objects<S: serde::Serializer>(
    objects: &[(ObjectKind, ObjectSync)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    #[derive(serde::Serialize)]
    struct Object<'a> {
        kind: ObjectKind,
        #[serde(flatten)]
        sync: &'a ObjectSync,
    }
    serializer.collect_seq(objects.iter().map(|(kind, sync)| Object { kind: *kind, sync }))
}

/// The shared counters behind [`KubeStatus`].
#[derive(Debug, Default)]
pub(crate) struct Stats {
    objects: Mutex<BTreeMap<ObjectKind, ObjectSync>>,
    requests: Mutex<BTreeMap<(&'static str, &'static str, String), u64>>,
}

impl Stats {
    pub(crate) fn count(&self, verb: &'static str, resource: &'static str, outcome: String) {
        *self.requests.lock().entry((verb, resource, outcome)).or_default() += 1;
    }

    pub(crate) fn synced(&self, kind: ObjectKind) {
        self.objects.lock().entry(kind).or_default().last_success = Some(SystemTime::now());
    }

    pub(crate) fn failed(&self, kind: ObjectKind, error: &dyn std::error::Error) {
        let message = kpm_api::gotext::error_chain(error);
        self.objects.lock().entry(kind).or_default().last_error =
            Some(SyncError { at: SystemTime::now(), message });
    }

    pub(crate) fn snapshot(&self, node: &str, pending: Vec<PendingPublication>) -> KubeStatus {
        let objects = self.objects.lock();
        KubeStatus {
            node: node.to_owned(),
            objects: ObjectKind::ALL
                .iter()
                .map(|kind| (*kind, objects.get(kind).cloned().unwrap_or_default()))
                .collect(),
            requests: self
                .requests
                .lock()
                .iter()
                .map(|((verb, resource, outcome), count)| RequestCount {
                    verb,
                    resource,
                    outcome: outcome.clone(),
                    count: *count,
                })
                .collect(),
            pending,
        }
    }
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use serde_json::json;

    use super::*;

    /// 2026-11-21T12:00:00 UTC and `millis`: the status API writes times to
    /// the millisecond.
    fn at(millis: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_795_262_400_000 + millis)
    }

    #[test]
    fn a_pending_publication_reads_back_what_it_writes() {
        let mut failing = PendingPublication::new(
            ObjectKind::NodeStatus,
            "vendor.com/gpu",
            "capacity 2, allocatable 1",
            false,
            at(3),
        );
        failing.last_error = Some("boom".into());
        let writing = PendingPublication::new(
            ObjectKind::CsiNode,
            "csi.example.com",
            "withdrawn: no CSINode entry, no node-id annotation entry",
            true,
            at(250),
        );
        for kind in ObjectKind::ALL {
            let publication = PendingPublication { kind, ..failing.clone() };
            let written = serde_json::to_value(&publication).unwrap();
            assert_eq!(written["kind"], kind.as_str());
            let read: PendingPublication = serde_json::from_value(written).unwrap();
            assert_eq!(read, publication);
        }
        let written = serde_json::to_string(&writing).unwrap();
        assert_eq!(serde_json::from_str::<PendingPublication>(&written).unwrap(), writing);
    }

    #[test]
    fn a_pending_publication_reads_as_kpm_runs_status_api_writes_it() {
        // `kubernetes.pending[0]` of the status API's plugins document, as
        // kpm-status's golden test pins it.
        let written = json!({"kind": "Node status", "name": "vendor.com/gpu",
            "want": "capacity 2, allocatable 1", "removes": false,
            "since": "2026-11-21T12:00:00.003Z", "last_error": "boom"});
        let mut expected = PendingPublication::new(
            ObjectKind::NodeStatus,
            "vendor.com/gpu",
            "capacity 2, allocatable 1",
            false,
            at(3),
        );
        expected.last_error = Some("boom".into());
        assert_eq!(serde_json::from_value::<PendingPublication>(written).unwrap(), expected);
        let under_way = json!({"kind": "ResourceSlice", "name": "dra.example.com",
            "want": "no ResourceSlice of node node1 from driver dra.example.com",
            "removes": true, "since": "2026-11-21T12:00:00.250Z", "last_error": null});
        let read: PendingPublication = serde_json::from_value(under_way).unwrap();
        assert_eq!(
            (read.kind, read.removes, read.since, read.last_error),
            (ObjectKind::ResourceSlice, true, at(250), None)
        );
        let unknown = json!({"kind": "Pod", "name": "a", "want": "b", "removes": false,
            "since": "2026-11-21T12:00:00.000Z", "last_error": null});
        let err = serde_json::from_value::<PendingPublication>(unknown).unwrap_err();
        assert!(err.to_string().contains(r#"unknown kind "Pod""#), "{err}");
    }
}
