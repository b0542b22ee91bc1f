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
use kpm_api::PluginKind;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use crate::PodContainer;

use crate::{ReportedVerdict, ShownRegistered};

/// The API group of [`KubeletPluginReport`].
pub const REPORT_GROUP: &str = "doctor.kpm.io";

/// The longest reason an entry keeps, in bytes: the table's column, not the
/// whole error chain (`kpm doctor` on the node shows that).
pub const MAX_REASON_BYTES: usize = 256;

/// The most entries a report lists, sockets and findings each: failing ones
/// first, the rest counted in [`Counts::omitted`]. A node has a handful; the
/// bound keeps a pathological one far below etcd's 1.5 MiB object limit.
pub const MAX_ENTRIES: usize = 256;

// The report's types are not `#[non_exhaustive]`, on purpose: they are the
// schema, and the doctor writes every field, so a new field is a compile
// error where the report is written. Readers are kept whole the other way,
// by serde: unknown fields are skipped, unknown names kept.

/// The node a report is about; the object bears its name too.
#[derive(
    CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    crates(kube_core = "::kube_core"),
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
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Registered","type":"string","priority":1,"jsonPath":".status.registered"}"#,
    // The heartbeat as written: the `date` column above is an age, rounded.
    printcolumn = r#"{"name":"Heartbeat Time","type":"string","priority":1,"jsonPath":".status.heartbeatTime"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KubeletPluginReportSpec {
    /// The Node reported on.
    pub node_name: String,
}

/// What the node's doctor found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
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
    /// The plugins the node's API objects show registered, as the doctor
    /// read them (`CSIPlugin:csi.example.com,DevicePlugin:vendor.com/gpu`):
    /// the column the fleet view reads instead of the objects. Absent when
    /// the doctor could not read them all, and from doctors before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered: Option<ShownRegistered>,
    /// When the doctor last wrote the report: it writes on every change
    /// and at least once a heartbeat period (30 min).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_time: Option<Time>,
    /// The version of the kpm doctor that wrote it.
    pub doctor_version: String,
}

/// What the report comes to, as the Node condition's status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Health {
    /// Every plugin of the node is ok.
    #[default]
    Healthy,
    /// A plugin or finding fails.
    Failing,
    /// The doctor could not look where the kubelet's plugins live.
    CannotJudge,
    /// A health a newer doctor wrote that this version does not know:
    /// never read as healthy. No doctor writes it.
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

/// Why the doctor could not look.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BlindStatus {
    /// What could not be read, in one line.
    pub why: String,
    /// What to try.
    pub hint: String,
}

/// The kubelet a report is about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
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
pub struct PluginEntry {
    /// Its path on the host.
    pub socket: String,
    /// The plugin's kind, by the type it told (`CSIPlugin`, `DevicePlugin`,
    /// `DRAPlugin`); none for a type the kubelet has no handler for.
    #[serde(
        rename = "type",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "known_kind"
    )]
    #[schemars(with = "Option<String>")]
    pub kind: Option<PluginKind>,
    /// Its name (a CSI or DRA driver, a device plugin's resource), when it
    /// told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its verdict, by name: `ok`, `stale`, `not-registered`, …
    #[schemars(with = "String")]
    pub verdict: ReportedVerdict,
    /// Why, at most [`MAX_REASON_BYTES`] long.
    pub reason: String,
    /// Since when the doctor has seen this verdict.
    pub since: Time,
    /// The pod container serving its socket, or that last served it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodContainer>,
}

/// A failing finding about the node or an API object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FindingEntry {
    /// The directory on the host or the API object (`csinodes/NAME`) it is
    /// about.
    pub object: String,
    /// The driver or resource it is about, when it is about one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its verdict, by name: `stale-csi-node-entry`, `orphaned-slices`, …
    #[schemars(with = "String")]
    pub verdict: ReportedVerdict,
    /// Why, at most [`MAX_REASON_BYTES`] long.
    pub reason: String,
    /// The failing socket that explains it, when one does: it is counted
    /// with that socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// Since when the doctor has seen it.
    pub since: Time,
}

/// A plugin type as a report gives it: a kind this version knows, else
/// none (a newer doctor's kind is not an error).
fn known_kind<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<PluginKind>, D::Error> {
    let plugin_type = Option::<String>::deserialize(deserializer)?;
    Ok(plugin_type.as_deref().and_then(PluginKind::from_plugin_type))
}

impl KubeletPluginReportStatus {
    /// Each entry's `since` taken from `before` where `before` has the
    /// same socket or object with the same verdict: the verdict has held
    /// since then.
    pub fn keep_since(&mut self, before: &Self) {
        let since: BTreeMap<(&str, &str), &Time> = before
            .plugins
            .iter()
            .map(|entry| ((entry.socket.as_str(), entry.verdict.name()), &entry.since))
            .chain(
                before
                    .findings
                    .iter()
                    .map(|entry| ((entry.object.as_str(), entry.verdict.name()), &entry.since)),
            )
            .collect();
        for entry in &mut self.plugins {
            if let Some(at) = since.get(&(entry.socket.as_str(), entry.verdict.name())) {
                entry.since = (*at).clone();
            }
        }
        for entry in &mut self.findings {
            if let Some(at) = since.get(&(entry.object.as_str(), entry.verdict.name())) {
                entry.since = (*at).clone();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use kube_core::CustomResourceExt as _;

    use super::*;

    /// What `deploy/doctor/crd.yaml` starts with, before the generated CRD.
    const HEADER: &str = "\
# The KubeletPluginReport CRD: one report per node, written by its kpm doctor
# (--watch) and read by `kpm doctor --cluster` and `kubectl get kpr`.
# Generated from kpm-report's report.rs: do not edit; run
# `UPDATE_EXPECT=1 cargo test -p kpm-report crd` after changing the types.
";

    /// A report as the doctor wrote it with the schema's first version
    /// (kpm at 6ee568a, on a real node): read typed, and written back the
    /// same.
    #[test]
    fn a_report_of_the_first_schema_is_read_typed_and_written_back_the_same() {
        let written: serde_json::Value =
            serde_json::from_str(include_str!("../tests/first_schema.json")).unwrap();
        let report: KubeletPluginReport = serde_json::from_value(written.clone()).unwrap();
        let status = report.status.as_ref().unwrap();
        assert_eq!(report.spec.node_name, "kpm-node");
        assert_eq!((status.health, status.counts.failing), (Health::Failing, 1));
        assert_eq!(status.plugins[0].verdict, crate::Verdict::Stale);
        assert_eq!(status.plugins[0].kind, None, "a stale socket tells no type");
        assert_eq!(status.plugins[1].kind, Some(PluginKind::Device));
        assert_eq!(status.plugins[2].kind, Some(PluginKind::Dra));
        assert_eq!(status.findings[0].verdict, crate::Verdict::StaleCsiNodeEntry);
        assert_eq!(status.kubelet.version.as_deref(), Some("v1.36.2"));
        assert_eq!(serde_json::to_value(&report).unwrap(), written);
    }

    /// What a newer doctor may write: fields, a health, a verdict and a
    /// plugin type this version does not know.
    #[test]
    fn a_report_of_a_newer_doctor_is_read_all_the_same() {
        let newer = serde_json::json!({
            "apiVersion": "doctor.kpm.io/v1alpha1", "kind": "KubeletPluginReport",
            "metadata": {"name": "n"}, "spec": {"nodeName": "n", "zone": "a"},
            "status": {
                "health": "Wobbly", "reason": "SomethingNew", "future": [1],
                "kubelet": {"rootDir": "/r", "foundBy": "--root-dir", "cgroupDriver": "systemd"},
                "counts": {"plugins": 1, "failing": 1},
                "plugins": [{"socket": "/r/a.sock", "type": "FuturePlugin", "verdict": "wobbling",
                             "reason": "new", "since": "2026-01-01T00:00:00Z", "sandbox": "ns/a"}],
                "doctorVersion": "9.0.0",
            },
        });
        let report: KubeletPluginReport = serde_json::from_value(newer).unwrap();
        let status = report.status.unwrap();
        assert_eq!(status.health, Health::Unknown);
        assert_eq!(status.plugins[0].kind, None);
        assert_eq!(status.plugins[0].verdict, ReportedVerdict::Unknown("wobbling".to_owned()));
        assert!(status.plugins[0].verdict.fails());
    }

    #[test]
    fn the_crd_in_deploy_is_the_one_the_code_defines() {
        let crd = serde_norway::to_string(&KubeletPluginReport::crd()).unwrap();
        expect_test::expect_file!["../../../deploy/doctor/crd.yaml"]
            .assert_eq(&format!("{HEADER}{crd}"));
    }
}
