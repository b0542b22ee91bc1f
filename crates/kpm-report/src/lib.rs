//! The contract between a node's kpm doctor and everyone who reads what it
//! found: the [`KubeletPluginReport`] custom resource (one per node, named
//! after it; its CRD is generated from these types), the [`Verdict`]s by
//! name and severity, and the words of the Node condition the doctor writes
//! beside it ([`CONDITION_TYPE`], [`ConditionStatus`], the reasons that are
//! not verdicts).
//!
//! The node doctor (`kpm-doctor`) writes reports with these types and the
//! fleet reader (`kpm-fleet`, `kpm doctor --cluster`) reads them back with
//! the same ones: there is no second schema. Readers tolerate what a newer
//! doctor writes ([`ReportedVerdict`], [`Health::Unknown`], unknown fields
//! skipped), and the tests read a report written by the schema's first
//! version.
//!
//! [`CHECKED_MINORS`] are the kubelet minors the doctor's verdicts were
//! checked against, which both sides show beside a report's kubelet.
//!
//! This crate does no IO: it has no client, no runtime and no file access.
//! Like any library on k8s-openapi it leaves the Kubernetes version feature
//! to the binary.

#![deny(missing_docs)]

mod condition;
mod kubelet_version;
mod pod;
mod registered;
mod report;
mod verdict;

pub use crate::condition::{
    CANNOT_JUDGE_REASON, CONDITION_TYPE, ConditionStatus, DOCTOR_STOPPED_REASON, HEALTHY_REASON,
    MAX_MESSAGE_BYTES, PLUGIN_NOT_FOUND_REASON, PLUGIN_REGISTERED_REASON,
};
pub use crate::kubelet_version::{CHECKED_MINORS, checked, minor, unchecked_note};
pub use crate::pod::{ContainerState, PodContainer, Termination};
pub use crate::registered::ShownRegistered;
pub use crate::report::{
    BlindStatus, Counts, FindingEntry, Health, KubeletPluginReport, KubeletPluginReportSpec,
    KubeletPluginReportStatus, KubeletStatus, MAX_ENTRIES, MAX_REASON_BYTES, PluginEntry,
    REPORT_GROUP,
};
pub use crate::verdict::{ReportedVerdict, Verdict};
/// What the custom resource's derive implements: its API group, version,
/// plural and path (`KubeletPluginReport::url_path`), and its CRD with the
/// printer columns (`KubeletPluginReport::crd`), for readers and test
/// servers that name them without writing them by hand.
pub use kube_core::{CustomResourceExt, Resource};
