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

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kpm_device::{DeviceView, ResourceStatus};
use kube::api::{Api, Patch};
use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::KubeError;
use crate::api::NodeApi;
use crate::backoff::KubeletBackoff;
use crate::status::ObjectKind;

/// A resource's (capacity, allocatable).
type Counts = (usize, usize);

/// Publishes `devices`' resources on the Node's status until the task is
/// dropped.
pub(crate) async fn publish(api: Arc<NodeApi>, devices: DeviceView) {
    let mut changes = devices.changes();
    let mut published: BTreeMap<String, Counts> = BTreeMap::new();
    let mut failures: Option<KubeletBackoff> = None;
    let mut next_patch = Instant::now();
    loop {
        tokio::time::sleep_until(next_patch).await;
        changes.borrow_and_update();
        let desired: BTreeMap<String, Counts> = devices.resources().iter().map(counts).collect();
        let patch = diff(&published, &desired);
        if !patch.is_empty() {
            let result = send(&api, &patch).await;
            match api.record(ObjectKind::NodeStatus, result) {
                Ok(()) => {
                    failures = None;
                    next_patch = Instant::now() + api.config.capacity_interval;
                    for (resource, counts) in patch {
                        match counts {
                            Some(counts) => published.insert(resource, counts),
                            None => published.remove(&resource),
                        };
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
        if changes.changed().await.is_err() {
            return;
        }
    }
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
