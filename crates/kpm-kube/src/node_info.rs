//! [`KubeNodeInfo`]: the CSI handler's [`NodeInfoSink`] on the Node and
//! CSINode objects, with the kubelet's `nodeinfomanager` rules (spec A.8).
//!
//! Each step reads the object, applies the same pure rules as the in-memory
//! sink (`kpm_csi::set_node_id_annotation` and friends) and writes back only
//! if something changed, with the `resourceVersion` it read: a concurrent
//! writer (another kpm, the kubelet, an operator) makes the write fail with
//! 409 and the step starts again from a fresh read, so nobody's entries are
//! lost. Steps are retried on the kubelet's schedule (4 attempts, 10 ms ×5);
//! a rule violation (topology collision, unparsable annotation) is not
//! retried.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use backon::Retryable;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kpm_csi::{
    CsiDrivers, CsiError, CsiNode, CsiNodeDriver as DriverEntry, DriverNodeInfo,
    NODE_ID_ANNOTATION, NodeInfoError, NodeInfoSink, add_topology_labels,
    remove_node_id_annotation, set_node_id_annotation,
};
use kube::api::{Api, Patch};
use serde_json::json;
use tracing::{debug, warn};

use crate::KubeError;
use crate::api::NodeApi;
use crate::backoff::KubeletBackoff;
use crate::status::ObjectKind;

/// Publishes CSI drivers' node information on the Node (node-id annotation,
/// topology labels) and the CSINode of the node, like the kubelet. Failures
/// fail the registration: the driver is told why and retried with backoff.
#[derive(Debug)]
pub struct KubeNodeInfo {
    api: Arc<NodeApi>,
    /// The kubelet serialises every update of the node info.
    serial: tokio::sync::Mutex<()>,
}

/// One attempt's failure: the API's (retried) or a rule's (final).
#[derive(Debug)]
enum Attempt {
    Api(KubeError),
    Rule(CsiError),
}

impl From<KubeError> for Attempt {
    fn from(err: KubeError) -> Self {
        Self::Api(err)
    }
}

impl From<CsiError> for Attempt {
    fn from(err: CsiError) -> Self {
        Self::Rule(err)
    }
}

/// Runs `step` until it succeeds, a rule fails, or the kubelet's attempts
/// are used up; records the outcome for `kind`; wraps an API error with
/// `wrap`.
async fn retried<T, Fut>(
    api: &NodeApi,
    kind: ObjectKind,
    step: impl FnMut() -> Fut,
    wrap: fn(kpm_csi::BoxError) -> CsiError,
) -> Result<T, CsiError>
where
    Fut: Future<Output = Result<T, Attempt>>,
{
    let result = step
        .retry(KubeletBackoff::NODE_INFO)
        .when(|err| matches!(err, Attempt::Api(_)))
        .notify(|err, wait| debug!(kind = %kind, error = ?err, ?wait, "retrying"))
        .await;
    let result = result.map_err(|err| match err {
        Attempt::Api(err) => wrap(Box::new(err)),
        Attempt::Rule(err) => err,
    });
    api.record(kind, result)
}

impl KubeNodeInfo {
    pub(crate) fn new(api: Arc<NodeApi>) -> Self {
        Self { api, serial: tokio::sync::Mutex::new(()) }
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.api.client.clone())
    }

    fn csinodes(&self) -> Api<CSINode> {
        Api::all(self.api.client.clone())
    }

    /// Merge-patches the Node's metadata, failing with 409 if it changed
    /// since `resource_version` was read.
    async fn patch_node(
        &self,
        resource_version: Option<&String>,
        metadata: serde_json::Value,
    ) -> Result<(), KubeError> {
        let mut patch = json!({ "metadata": metadata });
        patch["metadata"]["resourceVersion"] = json!(resource_version);
        let node = &self.api.node;
        let nodes = self.nodes();
        let params = NodeApi::patch_params();
        self.api
            .call("patch", "nodes", node, nodes.patch(node, &params, &Patch::Merge(&patch)))
            .await?;
        Ok(())
    }

    /// `updateNodeIDInNode` and `updateTopologyLabels` on the Node; returns
    /// its owner reference for the CSINode.
    async fn install_on_node(
        &self,
        driver: &str,
        info: &DriverNodeInfo,
    ) -> Result<OwnerReference, Attempt> {
        let node = self.api.get_node().await?;
        let mut annotations = node.metadata.annotations.clone().unwrap_or_default();
        let mut labels = node.metadata.labels.clone().unwrap_or_default();
        let annotation_changed = set_node_id_annotation(&mut annotations, driver, &info.node_id)?;
        let labels_changed = add_topology_labels(&mut labels, &info.topology)?;
        if annotation_changed || labels_changed {
            // Only the keys kpm sets: a merge patch leaves the others alone.
            let metadata = json!({
                "annotations": { NODE_ID_ANNOTATION: annotations.get(NODE_ID_ANNOTATION) },
                "labels": info.topology,
            });
            self.patch_node(node.metadata.resource_version.as_ref(), metadata).await?;
        }
        Ok(owner(&node))
    }

    /// `installDriverToCSINode`: creates the CSINode if missing, otherwise
    /// rebuilds the driver's entry unless it is up to date. A CSINode owned
    /// by an older Node of the same name starts afresh.
    async fn install_on_csinode(
        &self,
        driver: &str,
        info: &DriverNodeInfo,
        node: &OwnerReference,
    ) -> Result<(), KubeError> {
        let name = &self.api.node;
        let csinodes = self.csinodes();
        let Some(mut csinode) =
            self.api.call("get", "csinodes", name, csinodes.get_opt(name)).await?
        else {
            let mut drivers = CsiNode::default();
            drivers.install_driver(driver, info);
            let csinode = CSINode {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    owner_references: Some(vec![node.clone()]),
                    ..ObjectMeta::default()
                },
                spec: spec(&drivers),
            };
            let params = NodeApi::post_params();
            self.api.call("create", "csinodes", name, csinodes.create(&params, &csinode)).await?;
            return Ok(());
        };
        let stale = csinode
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|owners| owners.iter().any(|o| o.kind == "Node" && o.uid != node.uid));
        let mut drivers = if stale {
            warn!(node = name, "CSINode belongs to an earlier Node of this name; starting afresh");
            csinode.metadata.owner_references = Some(vec![node.clone()]);
            CsiNode::default()
        } else {
            model(&csinode)
        };
        if !drivers.install_driver(driver, info) && !stale {
            return Ok(());
        }
        csinode.spec = spec(&drivers);
        self.replace_csinode(&csinode).await
    }

    /// Writes `csinode` back; 409 if it changed since it was read.
    async fn replace_csinode(&self, csinode: &CSINode) -> Result<(), KubeError> {
        let name = &self.api.node;
        let csinodes = self.csinodes();
        let params = NodeApi::post_params();
        self.api.call("update", "csinodes", name, csinodes.replace(name, &params, csinode)).await?;
        Ok(())
    }

    /// Sets the driver's CSINode entry's `allocatable.count` (`null`
    /// removes it) in one strategic merge patch: the entry is found by its
    /// name (the list's merge key) and nothing else in it or beside it is
    /// written, so no read is needed and no concurrent writer is overruled.
    async fn patch_allocatable(&self, driver: &str, count: Option<i32>) -> Result<(), KubeError> {
        let name = &self.api.node;
        let patch = json!({"spec": {"drivers": [
            {"name": driver, "allocatable": count.map(|count| json!({"count": count}))}
        ]}});
        let csinodes = self.csinodes();
        let params = NodeApi::patch_params();
        self.api
            .call(
                "patch",
                "csinodes",
                name,
                csinodes.patch(name, &params, &Patch::Strategic(&patch)),
            )
            .await?;
        Ok(())
    }

    /// Removes the driver's CSINode entry; a missing CSINode has none.
    async fn uninstall_from_csinode(&self, driver: &str) -> Result<(), KubeError> {
        let name = &self.api.node;
        let csinodes = self.csinodes();
        let Some(mut csinode) =
            self.api.call("get", "csinodes", name, csinodes.get_opt(name)).await?
        else {
            return Ok(());
        };
        let mut drivers = model(&csinode);
        if !drivers.uninstall_driver(driver) {
            return Ok(());
        }
        csinode.spec = spec(&drivers);
        self.replace_csinode(&csinode).await
    }

    /// `removeNodeIDFromNode`; a missing Node has nothing to remove.
    async fn uninstall_from_node(&self, driver: &str) -> Result<(), Attempt> {
        let node = match self.api.get_node().await {
            Ok(node) => node,
            Err(KubeError::NodeNotFound { .. }) => return Ok(()),
            Err(err) => return Err(err.into()),
        };
        let mut annotations = node.metadata.annotations.clone().unwrap_or_default();
        if remove_node_id_annotation(&mut annotations, driver)? {
            let metadata = json!({ "annotations": { NODE_ID_ANNOTATION: annotations.get(NODE_ID_ANNOTATION) } });
            self.patch_node(node.metadata.resource_version.as_ref(), metadata).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl NodeInfoSink for KubeNodeInfo {
    async fn install_driver(
        &self,
        driver: &str,
        info: &DriverNodeInfo,
    ) -> Result<(), NodeInfoError> {
        if info.node_id.is_empty() {
            return Err(CsiError::EmptyNodeId);
        }
        let _serial = self.serial.lock().await;
        let owner = retried(
            &self.api,
            ObjectKind::Node,
            || self.install_on_node(driver, info),
            |source| CsiError::UpdateNode { source },
        )
        .await?;
        retried(
            &self.api,
            ObjectKind::CsiNode,
            || async { Ok(self.install_on_csinode(driver, info, &owner).await?) },
            |source| CsiError::UpdateCsiNode { source },
        )
        .await?;
        debug!(plugin = driver, node = self.api.node, "published CSI driver node info");
        Ok(())
    }

    /// The refreshed count alone, in one request (the kubelet reads the
    /// CSINode and writes it whole every period).
    async fn update_allocatable(
        &self,
        driver: &str,
        info: &DriverNodeInfo,
    ) -> Result<(), NodeInfoError> {
        let count = DriverEntry::new(driver, info).allocatable_count;
        let _serial = self.serial.lock().await;
        retried(
            &self.api,
            ObjectKind::CsiNode,
            || async { Ok(self.patch_allocatable(driver, count).await?) },
            |source| CsiError::UpdateCsiNode { source },
        )
        .await?;
        debug!(plugin = driver, node = self.api.node, ?count, "updated the allocatable count");
        Ok(())
    }

    async fn uninstall_driver(&self, driver: &str) -> Result<(), NodeInfoError> {
        let _serial = self.serial.lock().await;
        self.uninstall(driver).await
    }
}

impl KubeNodeInfo {
    /// Withdraws `driver` as its deregistration would, unless `drivers`
    /// has it. The CSI handler stores a driver before it publishes it, and
    /// this checks under the lock every publication takes: a registration
    /// that comes meanwhile publishes after this, so nothing of it is lost.
    /// Returns whether it withdrew.
    pub(crate) async fn uninstall_unregistered(
        &self,
        driver: &str,
        drivers: &CsiDrivers,
    ) -> Result<bool, NodeInfoError> {
        let _serial = self.serial.lock().await;
        if drivers.get(driver).is_some() {
            return Ok(false);
        }
        self.uninstall(driver).await?;
        Ok(true)
    }

    /// `UninstallCSIDriver`, under the caller's lock: the CSINode entry,
    /// then the annotation entry.
    async fn uninstall(&self, driver: &str) -> Result<(), NodeInfoError> {
        retried(
            &self.api,
            ObjectKind::CsiNode,
            || async { Ok(self.uninstall_from_csinode(driver).await?) },
            |source| CsiError::UninstallFromCsiNode { source },
        )
        .await?;
        retried(
            &self.api,
            ObjectKind::Node,
            || self.uninstall_from_node(driver),
            |source| CsiError::UninstallFromNode { source },
        )
        .await?;
        debug!(plugin = driver, node = self.api.node, "withdrew CSI driver node info");
        Ok(())
    }
}

/// The owner reference of a CSINode to its Node, as the kubelet sets it.
fn owner(node: &Node) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: node.metadata.name.clone().unwrap_or_default(),
        uid: node.metadata.uid.clone().unwrap_or_default(),
        ..OwnerReference::default()
    }
}

/// The driver entries of a CSINode, as the rules see them.
fn model(csinode: &CSINode) -> CsiNode {
    CsiNode {
        drivers: csinode
            .spec
            .drivers
            .iter()
            .map(|entry| DriverEntry {
                name: entry.name.clone(),
                node_id: entry.node_id.clone(),
                topology_keys: entry.topology_keys.clone().unwrap_or_default(),
                allocatable_count: entry.allocatable.as_ref().and_then(|a| a.count),
            })
            .collect(),
    }
}

/// The CSINode spec of the rules' entries: no topology keys is `null`, as
/// the kubelet writes it.
fn spec(csinode: &CsiNode) -> CSINodeSpec {
    CSINodeSpec {
        drivers: csinode
            .drivers
            .iter()
            .map(|entry| CSINodeDriver {
                name: entry.name.clone(),
                node_id: entry.node_id.clone(),
                topology_keys: (!entry.topology_keys.is_empty())
                    .then(|| entry.topology_keys.clone()),
                allocatable: entry
                    .allocatable_count
                    .map(|count| VolumeNodeResources { count: Some(count) }),
            })
            .collect(),
    }
}
