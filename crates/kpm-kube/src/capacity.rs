//! The device plugins' resources on the Node's status (spec B.6,
//! `GetCapacity`): capacity = all devices, allocatable = healthy ones. A
//! resource removed after its grace period is published as zero once, as
//! the kubelet does, and removed from the Node in the next patch.
//!
//! Changes are coalesced: the first change after a quiet period is
//! published at once, later ones at most once per
//! [`KubeConfig::capacity_interval`](crate::KubeConfig::capacity_interval),
//! each patch carrying the state as it is then. Failures are retried with
//! backoff and never touch a registration.
//!
//! The publisher starts out knowing the resources an earlier run published
//! (those kpm alone owns on the Node's status), with the counts the Node
//! shows: nothing is patched while they wait. One the device manager has
//! devices for within the device grace period (from the start) goes on with
//! its live counts; one it has not by then leaves as any resource whose
//! plugin went away does, zero then removed, so that a watcher of the Node
//! sees the same last word whichever run published the resource.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kpm_device::{DeviceView, ResourceStatus, is_extended_resource_name};
use kube::api::{Api, Patch};
use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::KubeError;
use crate::api::NodeApi;
use crate::backoff::KubeletBackoff;
use crate::leftovers;
use crate::managed_fields::{self, Owners};
use crate::status::ObjectKind;

/// A resource's (capacity, allocatable).
type Counts = (usize, usize);

/// A count on the Node that is not a plain number (the API server may
/// write 1000 as `1k`): it never equals a live count, so the plugin's are
/// published again.
const UNREADABLE: usize = usize::MAX;

/// Publishes `devices`' resources on the Node's status until the task is
/// dropped, and removes those an earlier run published that no plugin
/// registers within the device grace period.
pub(crate) async fn publish(api: Arc<NodeApi>, devices: DeviceView) {
    let grace = devices.config().grace_period;
    let grace_end = Instant::now() + grace;
    let mut changes = devices.changes();
    let read = || async { Ok(device_leftovers(&api.get_node_for_leftovers().await?)) };
    let mut published = leftovers::read(&api, "device resources", read).await.unwrap_or_default();
    // Leftovers kept as the Node shows them, then those past the grace.
    let mut waiting: BTreeSet<String> = published.keys().cloned().collect();
    let mut expired = BTreeSet::new();
    if !waiting.is_empty() {
        info!(node = api.node, resources = ?waiting, ?grace, "device resources an earlier run published; removing those no plugin registers within the grace period");
    }
    let mut failures: Option<KubeletBackoff> = None;
    let mut next_patch = Instant::now();
    loop {
        tokio::time::sleep_until(next_patch).await;
        changes.borrow_and_update();
        let mut desired: BTreeMap<String, Counts> =
            devices.resources().iter().map(counts).collect();
        // A plugin that has just registered has no devices until its first
        // list: that must not zero a leftover.
        waiting.retain(|resource| desired.get(resource).is_none_or(|(total, _)| *total == 0));
        if Instant::now() >= grace_end {
            expired.append(&mut waiting);
        }
        expired.retain(|resource| !desired.contains_key(resource));
        for resource in &waiting {
            if let Some(counts) = published.get(resource) {
                desired.insert(resource.clone(), *counts);
            }
        }
        let patch = diff(&published, &desired);
        if !patch.is_empty() {
            let result = send(&api, &patch).await;
            let result = if patch.keys().any(|resource| expired.contains(resource)) {
                api.record(ObjectKind::Leftovers, result)
            } else {
                result
            };
            match api.record(ObjectKind::NodeStatus, result) {
                Ok(()) => {
                    failures = None;
                    next_patch = Instant::now() + api.config.capacity_interval;
                    for (resource, counts) in patch {
                        if let Some(counts) = counts {
                            published.insert(resource, counts);
                        } else {
                            published.remove(&resource);
                            if expired.remove(&resource) {
                                info!(
                                    node = api.node,
                                    resource,
                                    "removed the device resource an earlier run published: no plugin registered it within the grace period"
                                );
                            }
                        }
                    }
                }
                Err(err) => {
                    let wait = failures
                        .get_or_insert(KubeletBackoff::CAPACITY)
                        .next()
                        .unwrap_or(api.config.capacity_interval);
                    warn!(node = api.node, error = %err, ?wait, "publishing device capacity failed; retrying");
                    next_patch = Instant::now() + wait;
                    continue;
                }
            }
            // A resource published as zero leaves in the next patch.
            if published.keys().any(|resource| !desired.contains_key(resource)) {
                continue;
            }
        }
        let grace_ends = async {
            if waiting.is_empty() {
                std::future::pending::<()>().await;
            } else {
                tokio::time::sleep_until(grace_end).await;
            }
        };
        tokio::select! {
            open = changes.changed() => if open.is_err() {
                return;
            },
            () = grace_ends => {}
        }
    }
}

/// The device resources kpm alone owns on `node`'s status (in capacity or
/// allocatable; no other manager in either), with the counts it shows (0
/// where one of the two is missing).
fn device_leftovers(node: &Node) -> BTreeMap<String, Counts> {
    let fields = managed_fields::of_node(node);
    let owned = Owners::at(fields, &["f:status", "f:capacity"])
        .and(Owners::at(fields, &["f:status", "f:allocatable"]))
        .kpm_fields();
    let status = node.status.as_ref();
    let count = |quantities: Option<&BTreeMap<String, Quantity>>, resource: &str| {
        let quantity = quantities.and_then(|quantities| quantities.get(resource))?;
        Some(quantity.0.parse().unwrap_or(UNREADABLE))
    };
    owned
        .into_iter()
        // kpm publishes extended resources only.
        .filter(|resource| is_extended_resource_name(resource))
        .filter_map(|resource| {
            let capacity = count(status.and_then(|status| status.capacity.as_ref()), &resource);
            let allocatable =
                count(status.and_then(|status| status.allocatable.as_ref()), &resource);
            if capacity.is_none() && allocatable.is_none() {
                return None;
            }
            Some((resource, (capacity.unwrap_or_default(), allocatable.unwrap_or_default())))
        })
        .collect()
}

fn counts(resource: &ResourceStatus) -> (String, Counts) {
    (resource.resource.clone(), (resource.healthy + resource.unhealthy, resource.healthy))
}

/// What to patch: new or changed resources with their counts; a resource
/// gone from the device manager first as zero, then (`None`) removed.
fn diff(
    published: &BTreeMap<String, Counts>,
    desired: &BTreeMap<String, Counts>,
) -> BTreeMap<String, Option<Counts>> {
    let changed = desired
        .iter()
        .filter(|(resource, counts)| published.get(*resource) != Some(counts))
        .map(|(resource, counts)| (resource.clone(), Some(*counts)));
    let gone = published
        .iter()
        .filter(|(resource, _)| !desired.contains_key(*resource))
        .map(|(resource, counts)| (resource.clone(), (*counts != (0, 0)).then_some((0, 0))));
    changed.chain(gone).collect()
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

    fn map<V: Copy>(entries: &[(&str, V)]) -> BTreeMap<String, V> {
        entries.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    #[test]
    fn a_resource_that_goes_away_is_zeroed_then_removed() {
        let published = map(&[("example.com/gpu", (3, 2)), ("example.com/nic", (0, 0))]);
        let desired = map(&[("example.com/fpga", (1, 1))]);
        assert_eq!(
            diff(&published, &desired),
            map(&[
                ("example.com/fpga", Some((1, 1))),
                ("example.com/gpu", Some((0, 0))),
                ("example.com/nic", None)
            ])
        );
        assert!(diff(&desired, &desired).is_empty());
    }

    #[test]
    fn an_earlier_runs_resources_are_the_extended_ones_kpm_alone_owns_with_their_counts() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "node1", "managedFields": [
                {"manager": "kubelet", "operation": "Update", "subresource": "status",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {
                    "f:capacity": {"f:cpu": {}, "f:example.com/shared": {}},
                    "f:allocatable": {"f:cpu": {}}}}},
                {"manager": "kpm", "operation": "Update", "subresource": "status",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {
                    "f:capacity": {"f:vendor.com/gpu": {}, "f:example.com/shared": {},
                        "f:example.com/many": {}, "f:example.com/gone": {}, "f:memory": {}},
                    "f:allocatable": {"f:vendor.com/gpu": {}, "f:example.com/many": {}}}}}]},
            "status": {
                "capacity": {"cpu": "4", "memory": "1Gi", "vendor.com/gpu": "4",
                    "example.com/shared": "1", "example.com/many": "2k"},
                "allocatable": {"cpu": "4", "vendor.com/gpu": "3"}}}))
        .unwrap();
        assert_eq!(
            device_leftovers(&node),
            map(&[("example.com/many", (UNREADABLE, 0)), ("vendor.com/gpu", (4, 3))])
        );
        assert!(device_leftovers(&Node::default()).is_empty());
    }

    #[test]
    fn the_patch_names_only_kpms_resources_and_null_removes() {
        let patch = map(&[("example.com/gpu", Some((3, 2))), ("example.com/nic", None)]);
        assert_eq!(
            body(&patch),
            json!({"status": {
                "capacity": {"example.com/gpu": "3", "example.com/nic": null},
                "allocatable": {"example.com/gpu": "2", "example.com/nic": null},
            }})
        );
    }
}
