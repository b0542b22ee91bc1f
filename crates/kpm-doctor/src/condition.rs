//! What a node's doctor writes of its condition: as whom, and what it says
//! (the condition's words are the report crate's: [`kpm_report::CONDITION_TYPE`]).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kpm_report::ConditionStatus;

use crate::ConfigError;

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

/// The conditions a doctor owns on its Node, by type, each with its
/// `lastTransitionTime`: the node's own, then one per plugin condition. They
/// are written together, in one server-side apply: a condition the apply
/// leaves out is one the field manager gives up, which the API server
/// removes.
pub(crate) type Conditions = BTreeMap<String, (PluginsCondition, Timestamp)>;

/// The server-side apply of the doctor's conditions: these entries of
/// `status.conditions`, the list map's key being their type.
pub(crate) fn condition_apply(
    node: &str,
    conditions: &Conditions,
    heartbeat: Timestamp,
) -> serde_json::Value {
    let conditions: Vec<serde_json::Value> = conditions
        .iter()
        .map(|(condition_type, (condition, transition))| {
            serde_json::json!({
                "type": condition_type,
                "status": condition.status.as_str(),
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": Time(*transition),
                "lastHeartbeatTime": Time(heartbeat),
            })
        })
        .collect();
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": node },
        "status": { "conditions": conditions },
    })
}

/// A Node condition of one plugin's own, beside the node's
/// [`CONDITION_TYPE`](kpm_report::CONDITION_TYPE): `True` while a plugin
/// of that name (a CSI or DRA driver, a device plugin's resource) is
/// registered with the kubelet, `False` while it is not (failing, missing,
/// or lost to a node event), `Unknown` while the doctor cannot judge. What
/// a gate on that one plugin reads, such as a `NodeReadinessRule` of the
/// Node Readiness Controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginConditionType {
    plugin: String,
    condition_type: String,
}

/// The suffix of a plugin condition's default type.
const REGISTERED_SUFFIX: &str = "PluginRegistered";

impl PluginConditionType {
    /// The condition `spec` names: `NAME` (its type `NAME/PluginRegistered`,
    /// or `DOMAIN/RESOURCE-PluginRegistered` for a device resource's
    /// `DOMAIN/RESOURCE`), or `NAME=TYPE`. The type must be a qualified
    /// name, as the conditions' gates take them, and not the doctor's own.
    pub fn parse(spec: &str) -> Result<Self, ConfigError> {
        let refused = |why: String| ConfigError::PluginCondition { spec: spec.to_owned(), why };
        let (plugin, condition_type) = match spec.split_once('=') {
            Some((plugin, condition_type)) => (plugin, condition_type.to_owned()),
            None if spec.contains('/') => (spec, format!("{spec}-{REGISTERED_SUFFIX}")),
            None => (spec, format!("{spec}/{REGISTERED_SUFFIX}")),
        };
        if plugin.is_empty() {
            return Err(refused("no plugin name".to_owned()));
        }
        qualified_name(&condition_type)
            .map_err(|why| refused(format!("condition type {condition_type}: {why}")))?;
        if condition_type == kpm_report::CONDITION_TYPE {
            return Err(refused(format!("{condition_type} is the doctor's own condition")));
        }
        Ok(Self { plugin: plugin.to_owned(), condition_type })
    }

    /// The plugin's name: a driver's, or a device plugin's resource.
    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    /// The condition's type.
    pub fn condition_type(&self) -> &str {
        &self.condition_type
    }
}

/// Whether `text` is a Kubernetes qualified name: an optional DNS
/// subdomain prefix and `/`, then 1 to 63 alphanumerics, `-`, `_` or `.`,
/// starting and ending alphanumeric; why not, else.
fn qualified_name(text: &str) -> Result<(), &'static str> {
    let (prefix, name) = match text.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, text),
    };
    let alphanumeric_ends = |part: &str| {
        part.starts_with(|c: char| c.is_ascii_alphanumeric())
            && part.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    if name.is_empty() || name.len() > 63 {
        return Err("its name part must be 1 to 63 characters");
    }
    if !alphanumeric_ends(name)
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err("its name part must be alphanumerics, '-', '_' or '.', between alphanumerics");
    }
    if let Some(prefix) = prefix {
        let label_ok = |label: &str| {
            !label.is_empty()
                && label.len() <= 63
                && alphanumeric_ends(label)
                && label.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if prefix.len() > 253 || !prefix.split('.').all(label_ok) {
            return Err("its prefix must be a DNS subdomain (lower-case), and only one '/'");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_condition_is_named_by_its_plugin_or_given_a_type() {
        let cases = [
            ("csi.example.com", "csi.example.com", "csi.example.com/PluginRegistered"),
            ("nvidia.com/gpu", "nvidia.com/gpu", "nvidia.com/gpu-PluginRegistered"),
            (
                "csi.example.com=csi.example.com/NodePluginRegistered",
                "csi.example.com",
                "csi.example.com/NodePluginRegistered",
            ),
        ];
        for (spec, plugin, condition_type) in cases {
            let parsed = PluginConditionType::parse(spec).unwrap();
            assert_eq!((parsed.plugin(), parsed.condition_type()), (plugin, condition_type));
        }
        for (spec, why) in [
            ("=x.io/Y", "no plugin name"),
            ("a=x.io/b/c", "condition type x.io/b/c: its name part must be alphanumerics"),
            ("a=X.io/Ready", "condition type X.io/Ready: its prefix must be a DNS subdomain"),
            ("a=KubeletPluginsHealthy", "KubeletPluginsHealthy is the doctor's own condition"),
            ("a=x.io/", "condition type x.io/: its name part must be 1 to 63 characters"),
        ] {
            let err = PluginConditionType::parse(spec).unwrap_err().to_string();
            assert!(err.contains(why), "{spec}: {err}");
            assert!(err.starts_with(&format!("plugin condition {spec}: ")), "{err}");
        }
    }
}
