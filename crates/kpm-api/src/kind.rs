//! `PluginKind`: the plugin types the kubelet has handlers for, and what
//! every layer names them by.

use crate::constants::{
    CSI_PLUGIN, DEVICE_PLUGIN, DEVICE_PLUGIN_VERSION, DRA_PLUGIN, DRA_V1_SERVICE,
    DRA_V1BETA1_SERVICE,
};

/// A plugin type the kubelet has a handler for, and the facts every layer
/// takes from it: the wire type, the short name of the command line and of
/// the tables, the versions a plugin of the kind offers by default.
///
/// It lives here, in the lowest crate, so that the handlers, the facade,
/// the registrar, the doctor and the CLI all name the kinds through this
/// one enum. It is not `#[non_exhaustive]` on purpose: the matches on it
/// above this crate are exhaustive, so that a new kind is a compile error
/// at every place that must say something about it (the facade's handler
/// and the unit test that holds its features to [`ALL`](Self::ALL),
/// kpm-kube's objects of a kind, the doctor's judgement of it in the
/// cluster and its fleet view, the registrar's stub).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PluginKind {
    /// CSI drivers (`CSIPlugin`).
    Csi,
    /// Device plugins (`DevicePlugin`).
    Device,
    /// DRA drivers (`DRAPlugin`).
    Dra,
}

impl PluginKind {
    /// Every kind, in the order the kubelet's handlers are added and the
    /// doctor shows them.
    pub const ALL: [Self; 3] = [Self::Csi, Self::Device, Self::Dra];

    /// The plugin type a plugin of this kind reports in `GetInfo`
    /// (`PluginInfo.type`), which chooses its handler.
    pub const fn plugin_type(self) -> &'static str {
        match self {
            Self::Csi => CSI_PLUGIN,
            Self::Device => DEVICE_PLUGIN,
            Self::Dra => DRA_PLUGIN,
        }
    }

    /// The kind of a plugin that reports `plugin_type`, if it is one of
    /// the kubelet's (exactly: the kubelet compares the type as it is).
    pub fn from_plugin_type(plugin_type: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.plugin_type() == plugin_type)
    }

    /// Its short name: `csi`, `device`, `dra`. The value of `kpm run
    /// --disable` (and of `kpm probe` and `kpm doctor`) and the kind column
    /// of `kpm doctor --cluster`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Csi => "csi",
            Self::Device => "device",
            Self::Dra => "dra",
        }
    }

    /// The kind whose [`name`](Self::name) is `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// The `supported_versions` a plugin of this kind advertises unless
    /// told otherwise: `v1beta1` for device plugins, `1.0.0` for CSI
    /// drivers (as node-driver-registrar sends), `v1.DRAPlugin` and
    /// `v1beta1.DRAPlugin` for DRA drivers, in that order: kubelets 1.34 and
    /// later take the plugin's first service they speak, so v1; 1.32 and
    /// 1.33 know v1beta1 only, and fall back to an older API without it.
    pub const fn default_versions(self) -> &'static [&'static str] {
        match self {
            Self::Csi => &["1.0.0"],
            Self::Device => &[DEVICE_PLUGIN_VERSION],
            Self::Dra => &[DRA_V1_SERVICE, DRA_V1BETA1_SERVICE],
        }
    }
}

/// An API object that shows a node's plugins once the kubelet (or `kpm
/// run`) registered them: what [`PluginKind::shown_in`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApiObject {
    /// The Node's CSI node-id annotation and topology labels.
    Node,
    /// The node's CSINode: one entry per CSI driver.
    CsiNode,
    /// The Node's status: a device plugin's resource in its capacity and
    /// allocatable, zero once the plugin is gone.
    NodeStatus,
    /// The ResourceSlices of the node, by the DRA driver that published them.
    ResourceSlice,
}

impl ApiObject {
    /// The kind of plugin this object shows: every object shows one kind's.
    pub const fn kind(self) -> PluginKind {
        match self {
            Self::Node | Self::CsiNode => PluginKind::Csi,
            Self::NodeStatus => PluginKind::Device,
            Self::ResourceSlice => PluginKind::Dra,
        }
    }
}

impl PluginKind {
    /// The API objects that show a node's plugins of this kind, the one
    /// that says a plugin is registered first ([`registered_in`](Self::registered_in)):
    /// a CSI driver in the CSINode and the Node's annotation and labels, a
    /// device plugin's resource in the Node's status, a DRA driver in its
    /// ResourceSlices. What kpm publishes a plugin in, what the doctor holds
    /// a node's plugins against, and what the fleet reads.
    pub const fn shown_in(self) -> &'static [ApiObject] {
        match self {
            Self::Csi => &[ApiObject::CsiNode, ApiObject::Node],
            Self::Device => &[ApiObject::NodeStatus],
            Self::Dra => &[ApiObject::ResourceSlice],
        }
    }

    /// The object whose entry says a plugin of this kind is registered on
    /// a node: the CSINode's driver, the Node's nonzero capacity, a
    /// ResourceSlice of the node.
    pub const fn registered_in(self) -> ApiObject {
        self.shown_in()[0]
    }
}

/// In JSON (feature `serde`), a kind is the plugin type its plugins report
/// (`CSIPlugin`, `DevicePlugin`, `DRAPlugin`): one spelling in every
/// document kpm writes, the one the kubelet's own messages use.
#[cfg(feature = "serde")]
impl serde::Serialize for PluginKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.plugin_type())
    }
}

/// Reads what [`Serialize`](serde::Serialize) writes; any other type is
/// an error naming the three.
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for PluginKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let plugin_type = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::from_plugin_type(&plugin_type).ok_or_else(|| {
            serde::de::Error::unknown_variant(
                &plugin_type,
                &[CSI_PLUGIN, DEVICE_PLUGIN, DRA_PLUGIN],
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::PluginKind;

    #[cfg(feature = "serde")]
    #[test]
    fn in_json_a_kind_is_its_plugin_type() {
        for kind in PluginKind::ALL {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.plugin_type()));
            assert_eq!(serde_json::from_str::<PluginKind>(&json).unwrap(), kind);
        }
        let err = serde_json::from_str::<PluginKind>(r#""device-plugin""#).unwrap_err();
        assert!(err.to_string().contains("unknown variant `device-plugin`"), "{err}");
    }

    #[test]
    fn each_kind_is_shown_in_objects_of_its_own() {
        for kind in PluginKind::ALL {
            assert!(!kind.shown_in().is_empty(), "{kind:?}");
            assert!(kind.shown_in().iter().all(|object| object.kind() == kind), "{kind:?}");
            assert_eq!(kind.registered_in(), kind.shown_in()[0]);
        }
        assert_eq!(PluginKind::Csi.registered_in(), super::ApiObject::CsiNode);
    }

    #[test]
    fn names_and_types_go_both_ways() {
        for kind in PluginKind::ALL {
            assert_eq!(PluginKind::from_plugin_type(kind.plugin_type()), Some(kind));
            assert_eq!(PluginKind::from_name(kind.name()), Some(kind));
        }
        // The kubelet matches types exactly: no case folding, no short names.
        assert_eq!(PluginKind::from_plugin_type("csiplugin"), None);
        assert_eq!(PluginKind::from_plugin_type("csi"), None);
        assert_eq!(PluginKind::from_name("CSIPlugin"), None);
    }
}
