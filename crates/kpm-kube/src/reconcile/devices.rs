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

use super::{LoopState, Pass};
use crate::KubeError;
use crate::api::NodeApi;
use crate::desired::{Counts, Desired, DeviceGoal, Goal, State, Target};
use crate::status::{ObjectKind, PendingPublication};

/// A resource's count on the Node: `None` when not there, [`UNREADABLE`]
/// when not a plain number.
type Shown = (Option<usize>, Option<usize>);

/// A count on the Node that is not a plain number (the API server may
/// write 1000 as `1k`): it never equals a count kpm wants, so kpm's is
/// published again.
const UNREADABLE: usize = usize::MAX;

/// A device resource and its goal.
type Entry<'a> = (&'a String, &'a Goal<DeviceGoal>);

pub(super) async fn pass(
    api: &NodeApi,
    desired: &Desired,
    node: &Result<Node, Arc<KubeError>>,
    pass: &mut Pass,
    loop_state: &mut LoopState,
) {
    let node = match node {
        Ok(node) => node,
        Err(err) => {
            let _shown = api.record(ObjectKind::NodeStatus, Err::<(), _>(err.as_ref()));
            for entry in &desired.devices {
                failing(pass, loop_state, entry, err, true);
            }
            return;
        }
    };
    let patch = diff(desired, node);
    let (differ, same): (Vec<Entry<'_>>, _) =
        desired.devices.iter().partition(|(resource, _)| patch.contains_key(*resource));
    for entry in same {
        // A gone resource the Node no longer shows is done.
        let state = if entry.1.value == DeviceGoal::Gone { State::Done } else { State::Agreed };
        finish(pass, entry, state);
    }
    if patch.is_empty() {
        return;
    }
    let now = Instant::now();
    if let Some(not_before) = loop_state.status_not_before.filter(|not_before| *not_before > now) {
        pass.status_wait = Some(not_before);
        for entry in differ {
            finish(pass, entry, State::Writing);
        }
        return;
    }
    match api.record(ObjectKind::NodeStatus, send(api, &patch).await) {
        Ok(()) => {
            let not_before = now + api.config.capacity_interval;
            loop_state.status_not_before = Some(not_before);
            // A gone resource patched to zero leaves in the next patch.
            if patch.values().any(|counts| *counts == Some((0, 0))) {
                pass.status_wait = Some(not_before);
            }
            // The API server holds what was written; a gone resource is
            // done once a read finds it no more.
            for entry in differ {
                finish(pass, entry, State::Agreed);
            }
        }
        Err(err) => {
            let err = Arc::new(err);
            for entry in differ {
                failing(pass, loop_state, entry, &err, false);
            }
        }
    }
}

/// Records a failed pass for the resource of `entry`.
fn failing(
    pass: &mut Pass,
    loop_state: &mut LoopState,
    entry: Entry<'_>,
    error: &Arc<KubeError>,
    unread: bool,
) {
    let target = Target::Device(entry.0.clone());
    let attempts = loop_state.failed(&target, entry.1.revision);
    let object = ObjectKind::NodeStatus;
    finish(pass, entry, State::Failing { attempts, object, error: Arc::clone(error), unread });
}

/// Records how the pass left the resource of `entry`.
fn finish(pass: &mut Pass, (resource, goal): Entry<'_>, state: State) {
    let pending = || {
        let want = match goal.value {
            DeviceGoal::Counts((capacity, allocatable)) => {
                format!("capacity {capacity}, allocatable {allocatable}")
            }
            DeviceGoal::Gone => "removed".to_owned(),
        };
        let removes = goal.value == DeviceGoal::Gone;
        PendingPublication::new(ObjectKind::NodeStatus, resource, want, removes, goal.since)
    };
    pass.outcome(Target::Device(resource.clone()), goal.revision, state, pending);
}

/// What to patch: each resource whose counts on the Node differ from its
/// goal, with the counts to write (`None` removes it).
fn diff(desired: &Desired, node: &Node) -> BTreeMap<String, Option<Counts>> {
    let status = node.status.as_ref();
    let count = |quantities: Option<&BTreeMap<String, Quantity>>, resource: &str| {
        let quantity = quantities.and_then(|quantities| quantities.get(resource))?;
        Some(quantity.0.parse().unwrap_or(UNREADABLE))
    };
    let mut patch = BTreeMap::new();
    for (resource, goal) in &desired.devices {
        let shown: Shown = (
            count(status.and_then(|status| status.capacity.as_ref()), resource),
            count(status.and_then(|status| status.allocatable.as_ref()), resource),
        );
        let write = match goal.value {
            DeviceGoal::Counts(counts) => {
                (shown != (Some(counts.0), Some(counts.1))).then_some(Some(counts))
            }
            DeviceGoal::Gone => match shown {
                (None, None) => None,
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
        desired.set_device("example.com/same", DeviceGoal::Counts((2, 1)));
        desired.set_device("example.com/new", DeviceGoal::Counts((1, 1)));
        desired.set_device("example.com/many", DeviceGoal::Counts((1000, 1000)));
        desired.set_device("example.com/counted", DeviceGoal::Gone);
        desired.set_device("example.com/zeroed", DeviceGoal::Gone);
        desired.set_device("example.com/removed", DeviceGoal::Gone);
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
        let patch = diff(&desired, &node);
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
