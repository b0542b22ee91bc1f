//! A pass over the device resources' targets (spec B.6, `GetCapacity`):
//! capacity = all devices, allocatable = healthy ones, on the Node's status,
//! in one merge patch of `nodes/status` that names only the resources that
//! differ. A gone resource is patched to zero first, as the kubelet leaves
//! it, and removed by the next patch.
//!
//! Patches are at least [`KubeConfig::capacity_interval`] apart: changes in
//! between are published together by the next one.
//!
//! [`KubeConfig::capacity_interval`]: crate::KubeConfig::capacity_interval

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, Patch};
use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tracing::debug;

use super::{LoopState, Pass, pending};
use crate::KubeError;
use crate::api::NodeApi;
use crate::desired::{Counts, Desired, DeviceTarget};
use crate::status::ObjectKind;

/// A resource's count on the Node: `None` when not there, [`UNREADABLE`]
/// when not a plain number.
type Shown = (Option<usize>, Option<usize>);

/// A count on the Node that is not a plain number (the API server may
/// write 1000 as `1k`): it never equals a count kpm wants, so kpm's is
/// published again.
const UNREADABLE: usize = usize::MAX;

pub(super) async fn pass(
    api: &NodeApi,
    desired: &Desired,
    node: &Result<Node, Arc<KubeError>>,
    pass: &mut Pass,
    loop_state: &mut LoopState,
) {
    let failed = |pass: &mut Pass, error: &KubeError| {
        pass.failed = true;
        let _shown = api.record(ObjectKind::NodeStatus, Err::<(), _>(error));
        Some(kpm_api::gotext::error_chain(error))
    };
    let (patch, error) = match node {
        Ok(node) => {
            let patch = diff(desired, node, &mut pass.gone);
            for (resource, target) in &desired.devices {
                if !patch.contains_key(resource) {
                    loop_state.agree(ObjectKind::NodeStatus, resource, target.revision);
                }
            }
            if patch.is_empty() {
                return;
            }
            let now = Instant::now();
            match loop_state.status_not_before.filter(|not_before| *not_before > now) {
                Some(not_before) => {
                    pass.status_wait = Some(not_before);
                    (patch, None)
                }
                None => match send(api, &patch).await {
                    Ok(()) => {
                        let _shown = api.record(ObjectKind::NodeStatus, Ok::<(), KubeError>(()));
                        for resource in patch.keys() {
                            let revision = desired.devices[resource].revision;
                            loop_state.agree(ObjectKind::NodeStatus, resource, revision);
                        }
                        let not_before = now + api.config.capacity_interval;
                        loop_state.status_not_before = Some(not_before);
                        // A gone resource patched to zero leaves in the next patch.
                        if patch.values().any(|counts| *counts == Some((0, 0))) {
                            pass.status_wait = Some(not_before);
                        }
                        return;
                    }
                    Err(err) => {
                        let error = failed(pass, &err);
                        (patch, error)
                    }
                },
            }
        }
        // What the API server agreed with last is not called pending
        // while it cannot be asked.
        Err(err) => {
            let error = failed(pass, err);
            let unseen = desired
                .devices
                .iter()
                .filter(|(resource, target)| {
                    !loop_state.agreed_at(ObjectKind::NodeStatus, resource, target.revision)
                })
                .map(|(resource, _)| (resource.clone(), None))
                .collect();
            (unseen, error)
        }
    };
    for resource in patch.keys() {
        let target = &desired.devices[resource];
        let want = match target.value {
            DeviceTarget::Counts((capacity, allocatable)) => {
                format!("capacity {capacity}, allocatable {allocatable}")
            }
            DeviceTarget::Gone => "removed".to_owned(),
        };
        let removes = target.value == DeviceTarget::Gone;
        let mut publication =
            pending(ObjectKind::NodeStatus, resource, want, removes, target.since);
        publication.last_error.clone_from(&error);
        pass.progress.pending.push(publication);
    }
}

/// What to patch: each resource whose counts on the Node differ from its
/// target, with the counts to write (`None` removes it). A gone resource
/// the Node no longer shows is added to `gone`.
fn diff(
    desired: &Desired,
    node: &Node,
    gone: &mut Vec<String>,
) -> BTreeMap<String, Option<Counts>> {
    let status = node.status.as_ref();
    let count = |quantities: Option<&BTreeMap<String, Quantity>>, resource: &str| {
        let quantity = quantities.and_then(|quantities| quantities.get(resource))?;
        Some(quantity.0.parse().unwrap_or(UNREADABLE))
    };
    let mut patch = BTreeMap::new();
    for (resource, target) in &desired.devices {
        let shown: Shown = (
            count(status.and_then(|status| status.capacity.as_ref()), resource),
            count(status.and_then(|status| status.allocatable.as_ref()), resource),
        );
        let write = match target.value {
            DeviceTarget::Counts(counts) => {
                (shown != (Some(counts.0), Some(counts.1))).then_some(Some(counts))
            }
            DeviceTarget::Gone => match shown {
                (None, None) => {
                    gone.push(resource.clone());
                    None
                }
                (Some(0) | None, Some(0) | None) => Some(None),
                _ => Some(Some((0, 0))),
            },
        };
        if let Some(write) = write {
            patch.insert(resource.clone(), write);
        }
    }
    patch
}

/// The merge patch of `nodes/status`: only kpm's resources, `null` removes one.
fn body(patch: &BTreeMap<String, Option<Counts>>) -> Value {
    let (mut capacity, mut allocatable) = (Map::new(), Map::new());
    for (resource, counts) in patch {
        let (total, healthy) = match counts {
            Some((total, healthy)) => (json!(total.to_string()), json!(healthy.to_string())),
            None => (Value::Null, Value::Null),
        };
        capacity.insert(resource.clone(), total);
        allocatable.insert(resource.clone(), healthy);
    }
    json!({ "status": { "capacity": capacity, "allocatable": allocatable } })
}

async fn send(api: &NodeApi, patch: &BTreeMap<String, Option<Counts>>) -> Result<(), KubeError> {
    let body = body(patch);
    debug!(node = api.node, patch = %body, "publishing device capacity");
    let nodes: Api<Node> = Api::all(api.client.clone());
    let params = NodeApi::patch_params();
    let sent = api
        .call(
            "patch",
            "nodes/status",
            &api.node,
            nodes.patch_status(&api.node, &params, &Patch::Merge(&body)),
        )
        .await;
    sent.map(drop).map_err(|err| api.on_node(err))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::Desired;

    fn node(capacity: &[(&str, &str)], allocatable: &[(&str, &str)]) -> Node {
        let map = |entries: &[(&str, &str)]| -> Value {
            entries.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect::<Map<_, _>>().into()
        };
        serde_json::from_value(
            json!({"status": {"capacity": map(capacity), "allocatable": map(allocatable)}}),
        )
        .unwrap_or_default()
    }

    #[test]
    fn only_what_differs_is_patched_and_a_gone_resource_is_zeroed_then_removed() {
        let mut desired = Desired::default();
        desired.set_device("example.com/same", DeviceTarget::Counts((2, 1)));
        desired.set_device("example.com/new", DeviceTarget::Counts((1, 1)));
        desired.set_device("example.com/many", DeviceTarget::Counts((1000, 1000)));
        desired.set_device("example.com/counted", DeviceTarget::Gone);
        desired.set_device("example.com/zeroed", DeviceTarget::Gone);
        desired.set_device("example.com/removed", DeviceTarget::Gone);
        let node = node(
            &[
                ("example.com/same", "2"),
                ("example.com/many", "1k"),
                ("example.com/counted", "3"),
                ("example.com/zeroed", "0"),
            ],
            &[
                ("example.com/same", "1"),
                ("example.com/many", "1k"),
                ("example.com/counted", "0"),
                ("example.com/zeroed", "0"),
            ],
        );
        let mut gone = Vec::new();
        let patch = diff(&desired, &node, &mut gone);
        let expected: BTreeMap<String, Option<Counts>> = [
            ("example.com/counted", Some((0, 0))),
            ("example.com/many", Some((1000, 1000))),
            ("example.com/new", Some((1, 1))),
            ("example.com/zeroed", None),
        ]
        .into_iter()
        .map(|(resource, counts)| (resource.to_owned(), counts))
        .collect();
        assert_eq!(patch, expected);
        assert_eq!(gone, ["example.com/removed"]);
    }

    #[test]
    fn the_patch_names_only_kpms_resources_and_null_removes() {
        let patch: BTreeMap<String, Option<Counts>> =
            [("example.com/gpu".to_owned(), Some((3, 2))), ("example.com/nic".to_owned(), None)]
                .into();
        assert_eq!(
            body(&patch),
            json!({"status": {
                "capacity": {"example.com/gpu": "3", "example.com/nic": null},
                "allocatable": {"example.com/gpu": "2", "example.com/nic": null},
            }})
        );
    }
}
