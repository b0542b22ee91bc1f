//! The device plugins' resources as targets of the desired state (spec
//! B.6, `GetCapacity`): capacity = all devices, allocatable = healthy ones;
//! a resource whose plugin went away is gone (zero, then removed). The
//! reconcile loop writes them (`reconcile::devices`); a failure never
//! touches a registration.
//!
//! The publisher starts out knowing the resources an earlier run published
//! (those kpm alone owns on the Node's status), and sets no goal for
//! them while they wait: the Node keeps the counts it shows. One the
//! device manager has devices for within the device grace period (from the
//! start) goes on with its live counts; one it has not by then is gone, as
//! any resource whose plugin went away, so that a watcher of the Node sees
//! the same last word whichever run published the resource.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kpm_device::{DeviceView, ResourceStatus, is_extended_resource_name};
use tokio::time::Instant;
use tracing::info;

use crate::api::NodeApi;
use crate::desired::{Books, Counts, DeviceGoal};
use crate::leftovers;
use crate::managed_fields::{self, Owners};

/// Keeps the desired state's device resources those of `devices` until the
/// task is dropped, and lets those an earlier run published go once the
/// device grace period has passed without a plugin for them.
pub(crate) async fn publish(api: Arc<NodeApi>, books: Arc<Books>, devices: DeviceView) {
    let grace = devices.config().grace_period;
    let grace_end = Instant::now() + grace;
    let mut changes = devices.changes();
    let read = || async { Ok(device_leftovers(&api.get_node_for_leftovers().await?)) };
    let found = leftovers::read(&api, "device resources", read).await.unwrap_or_default();
    // Leftovers left as the Node shows them.
    let mut waiting: BTreeSet<String> = found;
    if !waiting.is_empty() {
        info!(node = api.node, resources = ?waiting, ?grace, "device resources an earlier run published; removing those no plugin registers within the grace period");
    }
    // The resources whose goal is their live counts.
    let mut live_targets = BTreeSet::new();
    loop {
        changes.borrow_and_update();
        let live: BTreeMap<String, Counts> = devices.resources().iter().map(counts).collect();
        // A plugin that has just registered has no devices until its first
        // list: that must not zero a leftover.
        waiting.retain(|resource| live.get(resource).is_none_or(|(total, _)| *total == 0));
        let expired = if Instant::now() >= grace_end {
            std::mem::take(&mut waiting)
        } else {
            BTreeSet::<String>::new()
        };
        books.change(|desired| {
            for (resource, counts) in live.iter().filter(|(resource, _)| !waiting.contains(*resource)) {
                desired.set_device(resource, DeviceGoal::Counts(*counts));
                live_targets.insert(resource.clone());
            }
            live_targets.retain(|resource| {
                let still = live.contains_key(resource);
                if !still {
                    desired.set_device(resource, DeviceGoal::Gone);
                }
                still
            });
            for resource in expired.iter().filter(|resource| !live.contains_key(*resource)) {
                info!(node = api.node, resource, "the device resource an earlier run published has no plugin after the grace period; removing it");
                desired.set_device(resource, DeviceGoal::Gone);
            }
        });
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
/// allocatable; no other manager in either) that the Node shows.
fn device_leftovers(node: &Node) -> BTreeSet<String> {
    let fields = managed_fields::of_node(node);
    let owned = Owners::at(fields, &["f:status", "f:capacity"])
        .and(Owners::at(fields, &["f:status", "f:allocatable"]))
        .kpm_fields();
    let status = node.status.as_ref();
    let shown = |quantities: Option<&BTreeMap<String, Quantity>>, resource: &str| {
        quantities.is_some_and(|quantities| quantities.contains_key(resource))
    };
    owned
        .into_iter()
        // kpm publishes extended resources only.
        .filter(|resource| is_extended_resource_name(resource))
        .filter(|resource| {
            shown(status.and_then(|status| status.capacity.as_ref()), resource)
                || shown(status.and_then(|status| status.allocatable.as_ref()), resource)
        })
        .collect()
}

fn counts(resource: &ResourceStatus) -> (String, Counts) {
    (resource.resource.clone(), (resource.healthy + resource.unhealthy, resource.healthy))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_earlier_runs_resources_are_the_extended_ones_kpm_alone_owns_that_the_node_shows() {
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
            ["example.com/many", "vendor.com/gpu"].map(str::to_owned).into()
        );
        assert!(device_leftovers(&Node::default()).is_empty());
    }
}
