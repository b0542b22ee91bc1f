//! Why a DaemonSet runs no pod on a node, as its controller decides it:
//! the node's taints against the pod's tolerations (with those the
//! controller adds to every DaemonSet pod), its `nodeSelector`, and its
//! required node affinity. No IO: the objects are read in `workloads.rs`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration,
};

/// The tolerations the DaemonSet controller adds to every pod it makes
/// (`util.AddOrUpdateDaemonPodTolerations`), and, with `hostNetwork`,
/// `network-unavailable`.
const DAEMON_TOLERATED: &[(&str, &str)] = &[
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
];
const NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";

/// Why the pods of `template` are kept off `node`, in words: the first
/// rule that keeps them off; `None` when none does.
pub(crate) fn kept_off(template: &PodSpec, node: &Node) -> Option<String> {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let taints = node.spec.as_ref().and_then(|spec| spec.taints.as_deref()).unwrap_or_default();
    let tolerations = template.tolerations.as_deref().unwrap_or_default();
    let host_network = template.host_network.unwrap_or(false);
    if let Some(taint) = taints.iter().find(|taint| !tolerated(taint, tolerations, host_network)) {
        return Some(format!(
            "the node's taint {} is not tolerated by its pods",
            taint_text(taint)
        ));
    }
    let selector = template.node_selector.clone().unwrap_or_default();
    if let Some((key, value)) =
        selector.iter().find(|(key, value)| labels.get(*key) != Some(*value))
    {
        let has =
            labels.get(key).map_or_else(|| "no such label".to_owned(), |v| format!("{key}={v}"));
        return Some(format!("its nodeSelector {key}={value} does not select the node ({has})"));
    }
    let required =
        template.affinity.as_ref().and_then(|affinity| affinity.node_affinity.as_ref()).and_then(
            |affinity| affinity.required_during_scheduling_ignored_during_execution.as_ref(),
        );
    if let Some(required) = required
        && !required.node_selector_terms.iter().any(|term| term_matches(term, &labels, name))
    {
        return Some(
            "its required node affinity (nodeSelectorTerms) does not select the node".to_owned(),
        );
    }
    None
}

/// `key=value:Effect`, as `kubectl taint` writes one.
fn taint_text(taint: &Taint) -> String {
    match taint.value.as_deref().filter(|value| !value.is_empty()) {
        Some(value) => format!("{}={value}:{}", taint.key, taint.effect),
        None => format!("{}:{}", taint.key, taint.effect),
    }
}

/// Whether a taint lets the pod be scheduled or stay: `PreferNoSchedule`
/// always does; the others need a toleration.
fn tolerated(taint: &Taint, tolerations: &[Toleration], host_network: bool) -> bool {
    if taint.effect == "PreferNoSchedule" {
        return true;
    }
    let added = DAEMON_TOLERATED
        .iter()
        .chain(host_network.then_some(&(NETWORK_UNAVAILABLE, "NoSchedule")))
        .any(|(key, effect)| taint.key == *key && taint.effect == *effect);
    added || tolerations.iter().any(|toleration| tolerates(toleration, taint))
}

/// `ToleratesTaint`: the effect (none is any), then the key (none with
/// `Exists` is any) and, with `Equal` (the default), the value.
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// A term selects a node when all its expressions and fields match; an
/// empty term selects none.
fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>, name: &str) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    let field_value = |key: &str| (key == "metadata.name").then(|| name.to_owned());
    expressions.iter().all(|r| requirement_matches(r, labels.get(&r.key).cloned()))
        && fields.iter().all(|r| requirement_matches(r, field_value(&r.key)))
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<String>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |text: &str| text.parse::<i64>().ok();
    match (requirement.operator.as_str(), value) {
        ("In", Some(value)) => values.contains(&value),
        ("NotIn", value) => value.is_none_or(|value| !values.contains(&value)),
        ("Exists", value) => value.is_some(),
        ("DoesNotExist", value) => value.is_none(),
        ("Gt", Some(value)) => {
            matches!((number(&value), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a > b)
        }
        ("Lt", Some(value)) => {
            matches!((number(&value), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: &[(&str, &str)], taints: &[(&str, Option<&str>, &str)]) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "gpu-7",
                "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
            },
            "spec": {"taints": taints.iter().map(|(key, value, effect)| {
                serde_json::json!({"key": key, "value": value, "effect": effect})
            }).collect::<Vec<_>>()},
        }))
        .unwrap()
    }

    fn spec(json: serde_json::Value) -> PodSpec {
        let mut json = json;
        json["containers"] = serde_json::json!([]);
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_taint_the_pods_do_not_tolerate_keeps_them_off_and_is_named() {
        let tainted = node(&[], &[("dedicated", Some("gpu"), "NoSchedule")]);
        let none = spec(serde_json::json!({}));
        assert_eq!(
            kept_off(&none, &tainted).unwrap(),
            "the node's taint dedicated=gpu:NoSchedule is not tolerated by its pods"
        );
        for toleration in [
            serde_json::json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}),
            serde_json::json!({"key": "dedicated", "operator": "Exists"}),
            serde_json::json!({"operator": "Exists"}),
        ] {
            let tolerates = spec(serde_json::json!({"tolerations": [toleration]}));
            assert_eq!(kept_off(&tolerates, &tainted), None, "{toleration}");
        }
        let other_value = spec(serde_json::json!({"tolerations": [
            {"key": "dedicated", "value": "cpu", "effect": "NoSchedule"}]}));
        assert!(kept_off(&other_value, &tainted).is_some());
        // What the DaemonSet controller tolerates by itself, and a mere preference.
        let by_itself = node(
            &[],
            &[
                ("node.kubernetes.io/unschedulable", None, "NoSchedule"),
                ("spot", Some("true"), "PreferNoSchedule"),
            ],
        );
        assert_eq!(kept_off(&none, &by_itself), None);
        let network = node(&[], &[(NETWORK_UNAVAILABLE, None, "NoSchedule")]);
        assert!(kept_off(&none, &network).is_some());
        assert_eq!(kept_off(&spec(serde_json::json!({"hostNetwork": true})), &network), None);
    }

    #[test]
    fn a_node_selector_or_a_required_affinity_that_does_not_select_the_node_is_named() {
        let plain = node(&[("kubernetes.io/os", "linux")], &[]);
        let selector = spec(serde_json::json!({"nodeSelector": {"gpu": "true"}}));
        assert_eq!(
            kept_off(&selector, &plain).unwrap(),
            "its nodeSelector gpu=true does not select the node (no such label)"
        );
        let affinity = |operator: &str, values: &[&str]| {
            spec(serde_json::json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/os", "operator": operator, "values": values}]}
            ]}}}}))
        };
        assert_eq!(kept_off(&affinity("In", &["linux"]), &plain), None);
        assert!(kept_off(&affinity("In", &["windows"]), &plain).is_some());
        assert_eq!(kept_off(&affinity("NotIn", &["windows"]), &plain), None);
        assert_eq!(kept_off(&affinity("Exists", &[]), &plain), None);
        assert!(kept_off(&affinity("DoesNotExist", &[]), &plain).is_some());
        let by_name = spec(serde_json::json!({"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}]}
        ]}}}}));
        assert_eq!(kept_off(&by_name, &plain), None, "the DaemonSet controller pins pods so");
    }
}
