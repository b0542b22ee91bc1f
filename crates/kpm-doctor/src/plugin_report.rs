//! `KubeletPluginReport`: what a node's doctor found, typed, one object per
//! node, for the fleet to read without parsing a message.
//!
//! The object is cluster-scoped and named after its Node, which owns it
//! (the garbage collector removes it with the Node). Its `status` holds the
//! kubelet judged (root, version), one entry per socket of the node and one
//! per failing finding, each with its verdict, a bounded reason and since
//! when it holds, the counts, and the doctor's heartbeat. `--watch` writes
//! it beside the Node condition, from the same outcome, so that the two
//! cannot disagree ([`publish`](crate::publish)); `--cluster` reads it back
//! ([`read_fleet`](crate::read_fleet)).
//!
//! Verdicts are written by name (`stale`) and read back by name, not as an
//! enumeration of the schema: a doctor newer than the CRD, or a fleet view
//! older than the doctors, still reads and writes every report.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of [`KubeletPluginReport`].
pub const REPORT_GROUP: &str = "doctor.kpm.io";

/// The longest reason an entry keeps, in bytes: the table's column, not the
/// whole error chain (`kpm doctor` on the node shows that).
pub const MAX_REASON_BYTES: usize = 256;

/// The most entries a report lists, sockets and findings each: failing ones
/// first, the rest counted in [`Counts::omitted`]. A node has a handful; the
/// bound keeps a pathological one far below etcd's 1.5 MiB object limit.
pub const MAX_ENTRIES: usize = 256;

/// The node a report is about; the object bears its name too.
#[derive(
    CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "doctor.kpm.io",
    version = "v1alpha1",
    kind = "KubeletPluginReport",
    plural = "kubeletpluginreports",
    shortname = "kpr",
    status = "KubeletPluginReportStatus",
    derive = "PartialEq",
    doc = "What the kpm doctor of a node found of its kubelet plugins: one per node, named after it.",
    printcolumn = r#"{"name":"Health","type":"string","jsonPath":".status.health"}"#,
    printcolumn = r#"{"name":"Failing","type":"integer","jsonPath":".status.counts.failing"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.reason"}"#,
    printcolumn = r#"{"name":"Kubelet","type":"string","jsonPath":".status.kubelet.version"}"#,
    printcolumn = r#"{"name":"Heartbeat","type":"date","jsonPath":".status.heartbeatTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct KubeletPluginReportSpec {
    /// The Node reported on.
    pub node_name: String,
}

/// What the node's doctor found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct KubeletPluginReportStatus {
    /// `Healthy`, `Failing` or `CannotJudge`: the Node condition's `True`,
    /// `False` or `Unknown`.
    pub health: Health,
    /// The condition's reason: `PluginsHealthy`, `CannotJudge`, or the
    /// first failing verdict in CamelCase (`Stale`).
    pub reason: String,
    /// Why the doctor could not look, and what to try.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blind: Option<BlindStatus>,
    /// The kubelet judged.
    pub kubelet: KubeletStatus,
    /// How many entries, and how many fail.
    pub counts: Counts,
    /// One entry per socket of the node (its registry, `device-plugins/`,
    /// sockets deleted but listening), failing ones first.
    #[serde(default)]
    pub plugins: Vec<PluginEntry>,
    /// One entry per failing finding about the node or an API object
    /// rather than one socket (a CSINode entry no plugin serves).
    #[serde(default)]
    pub findings: Vec<FindingEntry>,
    /// When the doctor last wrote the report: it writes on every change
    /// and at least once a heartbeat period (30 min).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_time: Option<Time>,
    /// The version of the kpm doctor that wrote it.
    pub doctor_version: String,
}

/// What the report comes to, as the Node condition's status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub enum Health {
    /// Every plugin of the node is ok.
    #[default]
    Healthy,
    /// A plugin or finding fails.
    Failing,
    /// The doctor could not look where the kubelet's plugins live.
    CannotJudge,
}

/// Why the doctor could not look.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct BlindStatus {
    /// What could not be read, in one line.
    pub why: String,
    /// What to try.
    pub hint: String,
}

/// The kubelet a report is about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct KubeletStatus {
    /// Its root directory on the host.
    pub root_dir: String,
    /// How the doctor found the root: `--root-dir`, `the running kubelet,
    /// pid 42`, `the default`.
    pub found_by: String,
    /// Its version, as its Node reports it (`v1.36.2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The report's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Counts {
    /// Sockets judged.
    pub plugins: u32,
    /// Failures, as the condition counts them: failing sockets, and
    /// findings no failing socket explains.
    pub failing: u32,
    /// Entries left out by the bound ([`MAX_ENTRIES`]).
    #[serde(default)]
    pub omitted: u32,
}

/// One socket of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct PluginEntry {
    /// Its path on the host.
    pub socket: String,
    /// The plugin type it told (`CSIPlugin`, `DevicePlugin`, `DRAPlugin`).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub plugin_type: Option<String>,
    /// Its name (a CSI or DRA driver, a device plugin's resource), when it
    /// told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its verdict's name: `ok`, `stale`, `not-registered`, …
    pub verdict: String,
    /// Why, at most [`MAX_REASON_BYTES`] long.
    pub reason: String,
    /// Since when the doctor has seen this verdict.
    pub since: Time,
}

/// A failing finding about the node or an API object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct FindingEntry {
    /// The directory on the host or the API object (`csinodes/NAME`) it is
    /// about.
    pub object: String,
    /// The driver or resource it is about, when it is about one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its verdict's name: `stale-csi-node-entry`, `orphaned-slices`, …
    pub verdict: String,
    /// Why, at most [`MAX_REASON_BYTES`] long.
    pub reason: String,
    /// The failing socket that explains it, when one does: it is counted
    /// with that socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// Since when the doctor has seen it.
    pub since: Time,
}

impl KubeletPluginReportStatus {
    /// Each entry's `since` taken from `before` where `before` has the
    /// same socket or object with the same verdict: the verdict has held
    /// since then.
    pub(crate) fn keep_since(&mut self, before: &Self) {
        let since: BTreeMap<(&str, &str), &Time> = before
            .plugins
            .iter()
            .map(|entry| ((entry.socket.as_str(), entry.verdict.as_str()), &entry.since))
            .chain(
                before
                    .findings
                    .iter()
                    .map(|entry| ((entry.object.as_str(), entry.verdict.as_str()), &entry.since)),
            )
            .collect();
        for entry in &mut self.plugins {
            if let Some(at) = since.get(&(entry.socket.as_str(), entry.verdict.as_str())) {
                entry.since = (*at).clone();
            }
        }
        for entry in &mut self.findings {
            if let Some(at) = since.get(&(entry.object.as_str(), entry.verdict.as_str())) {
                entry.since = (*at).clone();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use kube::CustomResourceExt as _;

    use super::*;

    /// What `deploy/doctor/crd.yaml` starts with, before the generated CRD.
    const HEADER: &str = "\
# The KubeletPluginReport CRD: one report per node, written by its kpm doctor
# (--watch) and read by `kpm doctor --cluster` and `kubectl get kpr`.
# Generated from kpm-doctor's plugin_report.rs: do not edit; run
# `UPDATE_EXPECT=1 cargo test -p kpm-doctor crd` after changing the types.
";

    #[test]
    fn the_crd_in_deploy_is_the_one_the_code_defines() {
        let crd = serde_norway::to_string(&KubeletPluginReport::crd()).unwrap();
        expect_test::expect_file!["../../../deploy/doctor/crd.yaml"]
            .assert_eq(&format!("{HEADER}{crd}"));
    }
}
