//! What an earlier run of kpm published and no plugin claims now: the
//! kubelet restores its device resources from its checkpoint and leaves a
//! CSINode entry with no driver behind it for good (kubernetes #94388);
//! kpm reads what its field manager owns at start (`managed_fields`) and
//! removes what no plugin registers within a grace period.
//!
//! This module reads at start (the device resources, the CSI drivers, the
//! DRA drivers' slices) and withdraws the CSI drivers; the device resources
//! are the capacity publisher's (`capacity`), which starts out knowing
//! them, and the slices the DRA manager's.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use backon::Retryable;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kpm_csi::{CsiDrivers, NODE_ID_ANNOTATION, parse_node_id_annotation};
use kube::api::Api;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::KubeError;
use crate::api::NodeApi;
use crate::backoff::Backoff;
use crate::managed_fields::{self, Owners};
use crate::node_info::KubeNodeInfo;
use crate::status::ObjectKind;

/// Reads `what` an earlier run left with `read`, retrying failures with
/// [`Backoff::RETRY`] for as long as it takes (each shows in the status),
/// but two: a missing Node holds nothing (empty), and without the
/// permission there is nothing kpm may clean up, which is logged once
/// (`None`).
pub(crate) async fn read<T, Fut>(
    api: &NodeApi,
    what: &'static str,
    read: impl FnMut() -> Fut,
) -> Option<T>
where
    T: Default,
    Fut: Future<Output = Result<T, KubeError>>,
{
    let result = read
        .retry(Backoff::RETRY)
        .when(|err| !err.is_forbidden() && !matches!(err, KubeError::NodeNotFound { .. }))
        .notify(|err, wait| {
            let _shown = api.record(ObjectKind::Leftovers, Err::<(), _>(err));
            warn!(node = api.node, what, error = %err, ?wait, "reading what an earlier run published failed; retrying");
        })
        .await;
    if let Err(KubeError::NodeNotFound { .. }) = result {
        debug!(node = api.node, what, "no Node: nothing an earlier run published is left");
        return Some(T::default());
    }
    match api.record(ObjectKind::Leftovers, result) {
        Ok(found) => Some(found),
        Err(err) => {
            warn!(node = api.node, what, error = %err, "not allowed to read what an earlier run published; leaving it alone");
            None
        }
    }
}

/// Withdraws the CSI drivers an earlier run published that have not
/// registered once [`csi_cleanup_grace`](crate::KubeConfig::csi_cleanup_grace)
/// has passed since it started, each as its deregistration would.
pub(crate) async fn clean_up_csi(
    api: Arc<NodeApi>,
    sink: Arc<KubeNodeInfo>,
    drivers: Arc<CsiDrivers>,
) {
    let grace = api.config.csi_cleanup_grace;
    let end = Instant::now() + grace;
    let Some(leftovers) = read(&api, "CSI drivers", || read_csi_drivers(&api)).await else {
        return;
    };
    if leftovers.is_empty() {
        return;
    }
    info!(node = api.node, drivers = ?leftovers, ?grace, "CSI drivers an earlier run published; withdrawing those not registered within the grace period");
    tokio::time::sleep_until(end).await;
    for driver in &leftovers {
        // Waits until the API server agrees, however long it is away.
        let result = sink.uninstall_unregistered(driver, &drivers).await;
        match api.record(ObjectKind::Leftovers, result) {
            Ok(true) => info!(
                node = api.node,
                plugin = driver,
                "withdrew the CSI driver an earlier run published: no driver of that name registered within the grace period"
            ),
            Ok(false) => {
                debug!(
                    node = api.node,
                    plugin = driver,
                    "the CSI driver an earlier run published is registered; kept"
                );
            }
            Err(err) => warn!(
                node = api.node,
                plugin = driver,
                error = %err,
                "withdrawing a CSI driver an earlier run published is refused; leaving it"
            ),
        }
    }
}

async fn read_csi_drivers(api: &NodeApi) -> Result<BTreeSet<String>, KubeError> {
    let csinodes: Api<CSINode> = Api::all(api.client.clone());
    let csinode = api.call("get", "csinodes", &api.node, csinodes.get_opt(&api.node)).await?;
    let node = api.get_node_for_leftovers().await?;
    Ok(csi_drivers(&node, csinode.as_ref()))
}

/// The CSI drivers kpm published on the node: those whose CSINode entry kpm
/// alone owns; and, when kpm alone owns the node-id annotation, those with
/// an entry there and none in the CSINode (a run that stopped between its
/// two writes). The annotation is one field holding every driver's entry,
/// which managedFields cannot tell apart: a driver's entry goes with its
/// CSINode entry, which the same registration wrote.
fn csi_drivers(node: &Node, csinode: Option<&CSINode>) -> BTreeSet<String> {
    let listed: BTreeSet<&str> = csinode
        .iter()
        .flat_map(|csinode| &csinode.spec.drivers)
        .map(|driver| driver.name.as_str())
        .collect();
    let mut drivers: BTreeSet<String> = csinode
        .map(|csinode| {
            let fields = csinode.metadata.managed_fields.as_deref().unwrap_or_default();
            Owners::at(fields, &["f:spec", "f:drivers"]).kpm_entries("name")
        })
        .unwrap_or_default()
        .into_iter()
        .filter(|driver| listed.contains(driver.as_str()))
        .collect();
    let fields = managed_fields::of_node(node);
    let annotation = node.metadata.annotations.as_ref().and_then(|a| a.get(NODE_ID_ANNOTATION));
    if let Some(value) = annotation
        && Owners::at(fields, &["f:metadata", "f:annotations"])
            .kpm_fields()
            .contains(NODE_ID_ANNOTATION)
        && let Ok(ids) = parse_node_id_annotation(value)
    {
        drivers.extend(ids.into_keys().filter(|driver| !listed.contains(driver.as_str())));
    }
    drivers
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn node(annotation: &str, annotation_manager: &str) -> Node {
        serde_json::from_value(json!({"metadata": {
            "name": "node1",
            "annotations": {NODE_ID_ANNOTATION: annotation},
            "managedFields": [{"manager": annotation_manager, "operation": "Update",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {
                    ".": {}, "f:csi.volume.kubernetes.io/nodeid": {}}}}}]}}))
        .unwrap()
    }

    fn csinode(drivers: &[&str], managed: &[Value]) -> CSINode {
        let drivers: Vec<Value> =
            drivers.iter().map(|name| json!({"name": name, "nodeID": "id"})).collect();
        serde_json::from_value(json!({"metadata": {"name": "node1", "managedFields": managed},
            "spec": {"drivers": drivers}}))
        .unwrap()
    }

    fn entry(manager: &str, drivers: &[&str]) -> Value {
        let entries: serde_json::Map<String, Value> = drivers
            .iter()
            .map(|name| (format!(r#"k:{{"name":"{name}"}}"#), json!({".": {}, "f:name": {}})))
            .collect();
        json!({"manager": manager, "operation": "Update", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:drivers": entries}}})
    }

    fn names(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn kpms_csinode_entries_are_its_drivers_and_others_are_not() {
        let ids = r#"{"a.example.com":"1","b.example.com":"2"}"#;
        let csinode = csinode(
            &["a.example.com", "b.example.com"],
            &[
                entry("kpm", &["a.example.com", "gone.example.com"]),
                entry("kubelet", &["b.example.com"]),
            ],
        );
        assert_eq!(csi_drivers(&node(ids, "kpm"), Some(&csinode)), names(&["a.example.com"]));
        assert_eq!(csi_drivers(&node(ids, "kubelet"), Some(&csinode)), names(&["a.example.com"]));
    }

    #[test]
    fn an_annotation_entry_without_a_csinode_entry_is_kpms_only_if_kpm_owns_the_annotation() {
        let ids = r#"{"a.example.com":"1","c.example.com":"3"}"#;
        let csinode = csinode(&["a.example.com"], &[entry("kubelet", &["a.example.com"])]);
        assert_eq!(csi_drivers(&node(ids, "kpm"), Some(&csinode)), names(&["c.example.com"]));
        assert_eq!(csi_drivers(&node(ids, "kubelet"), Some(&csinode)), names(&[]));
        assert_eq!(
            csi_drivers(&node(ids, "kpm"), None),
            names(&["a.example.com", "c.example.com"])
        );
        assert_eq!(csi_drivers(&node("not json", "kpm"), None), names(&[]));
    }
}
