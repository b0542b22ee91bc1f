//! What the API server shows of one node, read-only: its CSINode's drivers,
//! the Node's CSI node-id annotation, capacity and allocatable, and the
//! drivers that published ResourceSlices for it. `kpm doctor` holds a
//! node's plugins against it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, GetParams, ListParams};

use crate::api::NodeApi;
use crate::{KubeConfig, KubeError};

/// What the API server shows of one node; each part is what was read, or
/// why it could not be (a missing permission, a timeout). A missing object
/// is `Ok(None)`.
#[derive(Debug)]
#[non_exhaustive]
pub struct NodeObjects {
    /// The node's name.
    pub node: String,
    /// The CSINode's drivers: name → node id.
    pub csi_drivers: Result<Option<BTreeMap<String, String>>, KubeError>,
    /// The Node's resources and CSI annotation.
    pub resources: Result<Option<NodeResources>, KubeError>,
    /// The drivers with ResourceSlices of this node, and how many each.
    pub slice_drivers: Result<BTreeMap<String, usize>, KubeError>,
}

/// What the Node object says of the node's plugins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeResources {
    /// The `csi.volume.kubernetes.io/nodeid` annotation: driver → node id.
    pub csi_node_ids: BTreeMap<String, String>,
    /// `status.capacity`, as quantities.
    pub capacity: BTreeMap<String, String>,
    /// `status.allocatable`, as quantities.
    pub allocatable: BTreeMap<String, String>,
    /// `status.nodeInfo.kubeletVersion`, as the kubelet reports itself
    /// (`v1.36.2`).
    pub kubelet_version: Option<String>,
}

/// Reads what the API server shows of `node` through `client`, each
/// request bounded by `config`'s request timeout; the three reads run at
/// once. Each is served from the API server's watch cache
/// (`resourceVersion=0`), as the kubelet reads its own Node: a doctor on
/// every node reads every few minutes, and a read a moment old judges as
/// well as one from etcd, at no cost to etcd.
pub async fn observe_node(client: kube::Client, node: &str, config: KubeConfig) -> NodeObjects {
    let api = NodeApi::new(client, node.to_owned(), config);
    let (csi_drivers, resources, slice_drivers) =
        tokio::join!(csi_drivers(&api), node_resources(&api), slice_drivers(&api));
    NodeObjects { node: node.to_owned(), csi_drivers, resources, slice_drivers }
}

async fn csi_drivers(api: &Arc<NodeApi>) -> Result<Option<BTreeMap<String, String>>, KubeError> {
    let csinodes: Api<CSINode> = Api::all(api.client.clone());
    let csinode = api.call("get", "csinodes", &api.node, cached(&csinodes, &api.node)).await?;
    Ok(csinode.map(|csinode| {
        csinode.spec.drivers.into_iter().map(|driver| (driver.name, driver.node_id)).collect()
    }))
}

async fn node_resources(api: &Arc<NodeApi>) -> Result<Option<NodeResources>, KubeError> {
    let nodes: Api<Node> = Api::all(api.client.clone());
    let Some(node) = api.call("get", "nodes", &api.node, cached(&nodes, &api.node)).await? else {
        return Ok(None);
    };
    let csi_node_ids = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(kpm_csi::NODE_ID_ANNOTATION))
        .and_then(|ids| serde_json::from_str(ids).ok())
        .unwrap_or_default();
    let quantities =
        |map: Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            map.unwrap_or_default().into_iter().map(|(name, quantity)| (name, quantity.0)).collect()
        };
    let status = node.status.unwrap_or_default();
    Ok(Some(NodeResources {
        csi_node_ids,
        capacity: quantities(status.capacity),
        allocatable: quantities(status.allocatable),
        kubelet_version: status
            .node_info
            .map(|info| info.kubelet_version)
            .filter(|version| !version.is_empty()),
    }))
}

/// `name` from the watch cache; none when it does not exist.
async fn cached<K: Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug>(
    api: &Api<K>,
    name: &str,
) -> kube::Result<Option<K>> {
    match api.get_with(name, &GetParams::any()).await {
        Ok(object) => Ok(Some(object)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(err) => Err(err),
    }
}

async fn slice_drivers(api: &Arc<NodeApi>) -> Result<BTreeMap<String, usize>, KubeError> {
    let slices = api.resource_slices();
    let selector = format!("spec.nodeName={}", api.node);
    let params = ListParams::default().fields(&selector).match_any();
    let listed = api.call("list", "resourceslices", &selector, slices.list(&params)).await?;
    let mut drivers = BTreeMap::new();
    for slice in &listed.items {
        if let Some(driver) = slice.data["spec"]["driver"].as_str() {
            *drivers.entry(driver.to_owned()).or_default() += 1;
        }
    }
    Ok(drivers)
}
