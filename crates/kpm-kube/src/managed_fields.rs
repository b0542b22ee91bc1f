//! Who owns what in an object, from its `metadata.managedFields`: the API
//! server's record of which field manager set which field. Each entry's
//! `fieldsV1` is a JSON tree of the fields it owns: `f:<name>` for a field,
//! `k:<json key>` for a list entry by its key (CSINode's `spec.drivers` by
//! `name`), `.` for the entry itself. kpm's leftovers are what its own
//! manager, [`FIELD_MANAGER`], owns and nobody else does.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::Value;

use crate::FIELD_MANAGER;

/// The managedFields of `node` (none when the API server tracks no owners
/// on it: see [`NodeApi::get_node_for_leftovers`]).
///
/// [`NodeApi::get_node_for_leftovers`]: crate::api::NodeApi::get_node_for_leftovers
pub(crate) fn of_node(node: &Node) -> &[ManagedFieldsEntry] {
    node.metadata.managed_fields.as_deref().unwrap_or_default()
}

/// The members of one field set (raw `fieldsV1` keys), by owner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Owners {
    /// The members an entry of kpm's field manager names.
    kpm: BTreeSet<String>,
    /// The members an entry of any other manager names.
    others: BTreeSet<String>,
}

impl Owners {
    /// The members of the field set at `path` (e.g. `["f:status",
    /// "f:capacity"]`) in every entry of `entries`, by owner. An entry
    /// whose tree has no such set names none; kpm's entries may be several
    /// (one per subresource and operation), and are taken together.
    pub(crate) fn at(entries: &[ManagedFieldsEntry], path: &[&str]) -> Self {
        let mut owners = Self::default();
        for entry in entries {
            let Some(fields) = &entry.fields_v1 else { continue };
            let Some(Value::Object(set)) =
                path.iter().try_fold(&fields.0, |tree, key| tree.get(key))
            else {
                continue;
            };
            let names = if entry.manager.as_deref() == Some(FIELD_MANAGER) {
                &mut owners.kpm
            } else {
                &mut owners.others
            };
            names.extend(set.keys().filter(|member| *member != ".").cloned());
        }
        owners
    }

    /// Both sets' members: e.g. `status.capacity` and `status.allocatable`,
    /// which kpm writes together for a resource.
    pub(crate) fn and(mut self, other: Self) -> Self {
        self.kpm.extend(other.kpm);
        self.others.extend(other.others);
        self
    }

    /// The fields (`f:<name>`) kpm owns and no other manager does, by name.
    pub(crate) fn kpm_fields(&self) -> BTreeSet<String> {
        self.kpm_only().filter_map(|member| member.strip_prefix("f:")).map(str::to_owned).collect()
    }

    /// The list entries (`k:{"<key>": "<value>"}`) kpm owns, in whole or in
    /// part, and no other manager does, by the value of `key`.
    pub(crate) fn kpm_entries(&self, key: &str) -> BTreeSet<String> {
        self.kpm_only()
            .filter_map(|member| member.strip_prefix("k:"))
            .filter_map(|json| match serde_json::from_str::<Value>(json) {
                Ok(Value::Object(mut fields)) => match fields.remove(key) {
                    Some(Value::String(value)) => Some(value),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    fn kpm_only(&self) -> impl Iterator<Item = &str> {
        self.kpm.difference(&self.others).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
    use serde_json::json;

    use super::*;

    fn entry(manager: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.to_owned()),
            operation: Some("Update".to_owned()),
            fields_type: Some("FieldsV1".to_owned()),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        }
    }

    const CAPACITY: [&str; 2] = ["f:status", "f:capacity"];
    const ALLOCATABLE: [&str; 2] = ["f:status", "f:allocatable"];

    /// As the API server records a Node: the kubelet's own resources, kpm's
    /// device patch of `nodes/status`, a third writer sharing one resource.
    fn node_entries() -> Vec<ManagedFieldsEntry> {
        vec![
            entry(
                "kubelet",
                json!({"f:status": {
                    "f:capacity": {"f:cpu": {}, "f:memory": {}, "f:example.com/shared": {}},
                    "f:allocatable": {"f:cpu": {}, "f:memory": {}}}}),
            ),
            entry(
                "kpm",
                json!({"f:metadata": {"f:annotations": {
                    ".": {}, "f:csi.volume.kubernetes.io/nodeid": {}}}}),
            ),
            entry(
                "kpm",
                json!({"f:status": {
                    "f:capacity": {"f:vendor.com/gpu": {}, "f:example.com/shared": {}},
                    "f:allocatable": {"f:vendor.com/gpu": {}, "f:vendor.com/fpga": {}}}}),
            ),
        ]
    }

    #[test]
    fn kpms_fields_are_those_only_kpm_names_across_its_entries() {
        let entries = node_entries();
        let resources =
            Owners::at(&entries, &CAPACITY).and(Owners::at(&entries, &ALLOCATABLE)).kpm_fields();
        assert_eq!(resources, ["vendor.com/fpga", "vendor.com/gpu"].map(str::to_owned).into());
        let annotations = Owners::at(&entries, &["f:metadata", "f:annotations"]).kpm_fields();
        assert_eq!(annotations, ["csi.volume.kubernetes.io/nodeid".to_owned()].into());
    }

    #[test]
    fn list_entries_are_read_by_their_key_as_json() {
        let entries = vec![
            entry(
                "kpm",
                json!({"f:spec": {"f:drivers": {
                    r#"k:{"name":"csi.example.com"}"#: {".": {}, "f:name": {}, "f:nodeID": {}},
                    r#"k:{"name":"with \"quotes\""}"#: {".": {}},
                    r#"k:{"name":"shared.example.com"}"#: {".": {}},
                    r#"k:{"other":"x"}"#: {},
                    "k:not json": {}}}}),
            ),
            entry(
                "other",
                json!({"f:spec": {"f:drivers": {
                    r#"k:{"name":"other.example.com"}"#: {".": {}},
                    r#"k:{"name":"shared.example.com"}"#: {"f:allocatable": {}}}}}),
            ),
        ];
        let drivers = Owners::at(&entries, &["f:spec", "f:drivers"]).kpm_entries("name");
        assert_eq!(drivers, ["csi.example.com", "with \"quotes\""].map(str::to_owned).into());
    }

    #[test]
    fn missing_or_odd_trees_name_nothing() {
        let entries = vec![
            ManagedFieldsEntry { manager: Some("kpm".to_owned()), ..ManagedFieldsEntry::default() },
            entry("kpm", json!({"f:status": {"f:capacity": "not a set"}})),
            entry("kpm", json!({"f:status": {}})),
            entry("kpm", json!(null)),
            entry("kpm", json!({"f:status": {"f:capacity": {".": {}}}})),
        ];
        assert_eq!(Owners::at(&entries, &CAPACITY), Owners::default());
        assert_eq!(Owners::at(&[], &CAPACITY).kpm_fields(), BTreeSet::new());
    }
}
