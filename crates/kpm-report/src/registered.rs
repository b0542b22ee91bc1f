//! [`ShownRegistered`]: the plugins a node's API objects show registered, in
//! one short string a server-side table can carry.
//!
//! The fleet view needs, of every node, which CSI drivers, device-plugin
//! resources and DRA drivers are registered there. Reading that from the
//! objects themselves (every CSINode, every Node with its images and
//! labels, every ResourceSlice) costs what the cluster weighs; the node's
//! doctor reads those objects anyway. So the report carries what they show
//! as one string, `CSIPlugin:csi.example.com,DevicePlugin:vendor.com/gpu`,
//! and the CRD prints it as a column: `kpm doctor --cluster` reads a table
//! of the reports, tens of bytes a node, not the reports in full.
//!
//! A string, not a list: the API server prints a column's list the way Go
//! prints a slice, which no reader should parse. `:` and `,` appear in none
//! of the names (DNS subdomains, and `domain/name` for resources).

use std::collections::BTreeSet;
use std::fmt;

use kpm_api::PluginKind;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The plugins a node's API objects show registered, by kind and name: a
/// CSI driver its CSINode lists, a device-plugin resource with a nonzero
/// capacity on its Node, a DRA driver with ResourceSlices of the node
/// ([`PluginKind::registered_in`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShownRegistered(BTreeSet<(PluginKind, String)>);

impl ShownRegistered {
    /// What a node's API objects show registered, kind by kind
    /// ([`PluginKind::registered_in`]): each CSI driver its CSINode lists,
    /// each extended resource with a nonzero capacity on its Node (the
    /// kubelet zeroes the capacity of a resource whose plugin is gone), each
    /// DRA driver with ResourceSlices of the node. The one rule the doctor
    /// writes its report by and the fleet reader checks it with.
    pub fn shown_by<'a>(
        csi_node: impl IntoIterator<Item = &'a str>,
        capacity: impl IntoIterator<Item = (&'a str, &'a str)>,
        slices: impl IntoIterator<Item = (&'a str, usize)>,
    ) -> Self {
        let csi = csi_node.into_iter().map(|driver| (PluginKind::Csi, driver));
        let devices = capacity
            .into_iter()
            .filter(|(resource, quantity)| {
                kpm_api::is_extended_resource_name(resource)
                    && kpm_api::is_nonzero_quantity(quantity)
            })
            .map(|(resource, _)| (PluginKind::Device, resource));
        let dra = slices.into_iter().filter(|(_, count)| *count > 0);
        csi.chain(devices).chain(dra.map(|(driver, _)| (PluginKind::Dra, driver))).collect()
    }

    /// Whether `kind`'s plugin `name` is registered.
    pub fn contains(&self, kind: PluginKind, name: &str) -> bool {
        self.0.iter().any(|(k, n)| *k == kind && n == name)
    }

    /// Each registered plugin, by kind then name.
    pub fn iter(&self) -> impl Iterator<Item = (PluginKind, &str)> {
        self.0.iter().map(|(kind, name)| (*kind, name.as_str()))
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Read leniently, as a reader of a newer doctor's report must: a kind
    /// this version does not know, or a piece without a kind, is skipped.
    fn parse(text: &str) -> Self {
        let pieces = text.split(',').filter_map(|piece| piece.split_once(':'));
        Self(
            pieces
                .filter_map(|(kind, name)| {
                    let kind = PluginKind::from_plugin_type(kind)?;
                    (!name.is_empty()).then(|| (kind, name.to_owned()))
                })
                .collect(),
        )
    }
}

impl<'a> FromIterator<(PluginKind, &'a str)> for ShownRegistered {
    fn from_iter<I: IntoIterator<Item = (PluginKind, &'a str)>>(plugins: I) -> Self {
        Self(plugins.into_iter().map(|(kind, name)| (kind, name.to_owned())).collect())
    }
}

impl fmt::Display for ShownRegistered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, (kind, name)) in self.0.iter().enumerate() {
            let comma = if n == 0 { "" } else { "," };
            write!(f, "{comma}{}:{name}", kind.plugin_type())?;
        }
        Ok(())
    }
}

impl Serialize for ShownRegistered {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ShownRegistered {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self::parse(&String::deserialize(deserializer)?))
    }
}

impl JsonSchema for ShownRegistered {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Registered".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string"})
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn it_is_one_string_by_kind_then_name_and_reads_back_the_same() {
        let registered: ShownRegistered = [
            (PluginKind::Dra, "gpu.example.com"),
            (PluginKind::Device, "vendor.com/gpu"),
            (PluginKind::Csi, "csi.example.com"),
        ]
        .into_iter()
        .collect();
        let text =
            "CSIPlugin:csi.example.com,DevicePlugin:vendor.com/gpu,DRAPlugin:gpu.example.com";
        assert_eq!(serde_json::to_value(&registered).unwrap(), text);
        assert_eq!(serde_json::from_value::<ShownRegistered>(text.into()).unwrap(), registered);
        assert!(registered.contains(PluginKind::Device, "vendor.com/gpu"));
        assert!(!registered.contains(PluginKind::Csi, "vendor.com/gpu"));
        assert_eq!(ShownRegistered::default().to_string(), "");
        assert!(serde_json::from_value::<ShownRegistered>("".into()).unwrap().is_empty());
    }

    #[test]
    fn the_objects_show_csinode_entries_nonzero_extended_capacity_and_slices() {
        let shown = ShownRegistered::shown_by(
            ["csi.example.com"],
            [("cpu", "8"), ("vendor.com/gpu", "2"), ("vendor.com/gone", "0"), ("a.com/b", "100m")],
            [("gpu.example.com", 4), ("none.example.com", 0)],
        );
        assert_eq!(
            shown.to_string(),
            "CSIPlugin:csi.example.com,DevicePlugin:a.com/b,DevicePlugin:vendor.com/gpu,\
             DRAPlugin:gpu.example.com"
        );
    }

    #[test]
    fn a_newer_doctors_kinds_and_stray_pieces_are_skipped() {
        let read: ShownRegistered =
            serde_json::from_value("FuturePlugin:x,CSIPlugin:a,junk,DRAPlugin:,CSIPlugin:b".into())
                .unwrap();
        let names: Vec<_> = read.iter().collect();
        assert_eq!(names, [(PluginKind::Csi, "a"), (PluginKind::Csi, "b")]);
    }
}
