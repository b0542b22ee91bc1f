//! Reading the fleet, read-only: Nodes, CSIDrivers, CSINodes and
//! ResourceSlices, each listed page by page (`limit`, `continue`), the four
//! lists at once. Each page is parsed into types that hold only what is
//! judged (serde skips the rest: a Node's images, a slice's devices), folded
//! into [`FleetObjects`] and dropped before the next is asked for, so that
//! 5000 Nodes and 20,000 ResourceSlices take a few megabytes, not the
//! gigabyte their full objects would.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::ListParams;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tracing::debug;

use super::{FleetConfig, FleetError, FleetObjects, NodeCondition, NodeObject};
use crate::condition::CONDITION_TYPE;

const NODES: Resource = Resource { name: "nodes", path: "/api/v1/nodes", optional: false };
const CSI_DRIVERS: Resource =
    Resource { name: "csidrivers", path: "/apis/storage.k8s.io/v1/csidrivers", optional: false };
const CSI_NODES: Resource =
    Resource { name: "csinodes", path: "/apis/storage.k8s.io/v1/csinodes", optional: false };
const RESOURCE_SLICES: Resource = Resource {
    name: "resourceslices",
    path: "/apis/resource.k8s.io/v1/resourceslices",
    optional: true,
};

/// A collection of the API server.
#[derive(Debug, Clone, Copy)]
struct Resource {
    /// Its plural, as errors name it.
    name: &'static str,
    /// The collection's path.
    path: &'static str,
    /// A cluster may not serve it (a 404 on the first page): it is then
    /// empty, not a failure.
    optional: bool,
}

/// Reads the fleet through `client`: the Nodes `config` selects, every
/// CSIDriver, CSINode and ResourceSlice, each list paged by
/// `config.page_size` and every request bounded by
/// `config.request_timeout`. It never writes. An API server without
/// `resource.k8s.io/v1` (DRA off, or older than 1.34) shows no slices, and
/// says so in [`FleetObjects::unseen`]; any other failure ends the read.
pub async fn read_fleet(
    client: &kube::Client,
    config: &FleetConfig,
) -> Result<FleetObjects, FleetError> {
    let (nodes, csi_drivers, csi_nodes, slices) = tokio::try_join!(
        read_nodes(client, config),
        read_csi_drivers(client, config),
        read_csi_nodes(client, config),
        read_slices(client, config),
    )?;
    let mut objects = FleetObjects {
        requests: nodes.1 + csi_drivers.1 + csi_nodes.1 + slices.1,
        nodes: nodes.0,
        csi_drivers: csi_drivers.0,
        csi_nodes: csi_nodes.0,
        ..FleetObjects::default()
    };
    match slices.0 {
        Some(slices) => objects.slices = slices,
        None => objects.unseen.push(
            "resourceslices: the API server does not serve resource.k8s.io/v1 \
             (DRA is off, or Kubernetes is older than 1.34): no DRA driver is judged"
                .to_owned(),
        ),
    }
    Ok(objects)
}

/// Lists `resource` page by page, handing each page's items to `fold`;
/// returns how many requests it made. `Ok(None)`: the collection is
/// optional and not served (404 on the first page).
async fn list_pages<T: DeserializeOwned>(
    client: &kube::Client,
    resource: Resource,
    config: &FleetConfig,
    label_selector: Option<&str>,
    mut fold: impl FnMut(Vec<T>),
) -> Result<Option<usize>, FleetError> {
    let request = kube::core::Request::new(resource.path);
    let mut params = ListParams::default().limit(config.page_size);
    if let Some(selector) = label_selector {
        params = params.labels(selector);
    }
    let mut page = 0;
    loop {
        page += 1;
        let http = request
            .list(&params)
            .map_err(|source| FleetError::Request { resource: resource.name, source })?;
        let listed: List<T> =
            match tokio::time::timeout(config.request_timeout, client.request(http)).await {
                Ok(Ok(listed)) => listed,
                Ok(Err(kube::Error::Api(status)))
                    if resource.optional && page == 1 && status.code == 404 =>
                {
                    debug!(resource = resource.name, "not served");
                    return Ok(None);
                }
                Ok(Err(source)) => {
                    return Err(FleetError::List { resource: resource.name, page, source });
                }
                Err(_) => {
                    return Err(FleetError::Timeout {
                        resource: resource.name,
                        page,
                        timeout: config.request_timeout,
                    });
                }
            };
        debug!(resource = resource.name, page, items = listed.items.len(), "listed a page");
        fold(listed.items);
        match listed.metadata.continue_token.filter(|token| !token.is_empty()) {
            None => return Ok(Some(page)),
            Some(token) if params.continue_token.as_ref() == Some(&token) => {
                return Err(FleetError::Paging { resource: resource.name, page });
            }
            Some(token) => params.continue_token = Some(token),
        }
    }
}

/// A page of a list: its items, and where the next page starts.
#[derive(Debug, Deserialize)]
struct List<T> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default = "Vec::new")]
    items: Vec<T>,
}

#[derive(Debug, Default, Deserialize)]
struct ListMeta {
    #[serde(rename = "continue")]
    continue_token: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Meta {
    name: String,
}

#[derive(Debug, Deserialize)]
struct Named {
    metadata: Meta,
}

#[derive(Debug, Deserialize)]
struct Node {
    metadata: Meta,
    status: Option<NodeStatus>,
}

#[derive(Debug, Deserialize)]
struct NodeStatus {
    capacity: Option<BTreeMap<String, String>>,
    conditions: Option<Vec<Condition>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Condition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
    reason: Option<String>,
    message: Option<String>,
    last_heartbeat_time: Option<String>,
    last_transition_time: Option<String>,
}

#[derive(Debug, Deserialize)]
struct CsiNode {
    metadata: Meta,
    spec: Option<CsiNodeSpec>,
}

#[derive(Debug, Deserialize)]
struct CsiNodeSpec {
    drivers: Option<Vec<Entry>>,
}

/// A list entry named by a `name` field of its own.
#[derive(Debug, Deserialize)]
struct Entry {
    name: String,
}

#[derive(Debug, Deserialize)]
struct Slice {
    spec: Option<SliceSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SliceSpec {
    driver: String,
    node_name: Option<String>,
}

type Read<T> = Result<(T, usize), FleetError>;

async fn read_nodes(client: &kube::Client, config: &FleetConfig) -> Read<Vec<NodeObject>> {
    let mut nodes = Vec::new();
    let selector = config.label_selector.as_deref();
    let requests = list_pages(client, NODES, config, selector, |page: Vec<Node>| {
        nodes.extend(page.into_iter().map(reduce_node));
    })
    .await?;
    Ok((nodes, requests.unwrap_or_default()))
}

/// What is judged of a Node: its name, its doctor's condition and its
/// extended resources' capacity.
fn reduce_node(node: Node) -> NodeObject {
    let status = node.status.unwrap_or(NodeStatus { capacity: None, conditions: None });
    let condition = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|condition| condition.kind == CONDITION_TYPE)
        .map(|condition| NodeCondition {
            status: condition.status,
            reason: condition.reason.unwrap_or_default(),
            message: condition.message.unwrap_or_default(),
            last_heartbeat_time: condition.last_heartbeat_time,
            last_transition_time: condition.last_transition_time,
        });
    let extended_resources = status
        .capacity
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, _)| kpm::device::is_extended_resource_name(name))
        .collect();
    NodeObject { name: node.metadata.name, condition, extended_resources }
}

async fn read_csi_drivers(client: &kube::Client, config: &FleetConfig) -> Read<BTreeSet<String>> {
    let mut drivers = BTreeSet::new();
    let requests = list_pages(client, CSI_DRIVERS, config, None, |page: Vec<Named>| {
        drivers.extend(page.into_iter().map(|driver| driver.metadata.name));
    })
    .await?;
    Ok((drivers, requests.unwrap_or_default()))
}

async fn read_csi_nodes(
    client: &kube::Client,
    config: &FleetConfig,
) -> Read<BTreeMap<String, BTreeSet<String>>> {
    let mut nodes = BTreeMap::new();
    let requests = list_pages(client, CSI_NODES, config, None, |page: Vec<CsiNode>| {
        for csinode in page {
            let drivers = csinode.spec.and_then(|spec| spec.drivers).unwrap_or_default();
            nodes.insert(
                csinode.metadata.name,
                drivers.into_iter().map(|driver| driver.name).collect(),
            );
        }
    })
    .await?;
    Ok((nodes, requests.unwrap_or_default()))
}

async fn read_slices(
    client: &kube::Client,
    config: &FleetConfig,
) -> Read<Option<BTreeMap<String, BTreeMap<String, usize>>>> {
    let mut counts: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    let requests = list_pages(client, RESOURCE_SLICES, config, None, |page: Vec<Slice>| {
        for spec in page.into_iter().filter_map(|slice| slice.spec) {
            // Slices of a node selector or of all nodes (network-attached
            // devices) belong to no one node's driver.
            if let Some(node) = spec.node_name {
                *counts.entry(node).or_default().entry(spec.driver).or_default() += 1;
            }
        }
    })
    .await?;
    Ok(match requests {
        Some(requests) => (Some(counts), requests),
        None => (None, 1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_page_keeps_the_doctors_condition_and_extended_resources_only() {
        let page: List<Node> = serde_json::from_value(serde_json::json!({
            "kind": "NodeList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "7", "continue": "next"},
            "items": [{
                "metadata": {"name": "n1", "labels": {"a": "b"}},
                "spec": {"podCIDR": "10.0.0.0/24"},
                "status": {
                    "capacity": {"cpu": "4", "vendor.com/gpu": "2", "example.com/nic": "0"},
                    "images": [{"names": ["busybox"], "sizeBytes": 1}],
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                        {"type": "KubeletPluginsHealthy", "status": "False", "reason": "Stale",
                         "message": "1 failing: a-reg.sock (stale): refused",
                         "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                         "lastTransitionTime": "2025-12-31T00:00:00Z"},
                    ],
                },
            }, {"metadata": {"name": "bare"}}],
        }))
        .unwrap();
        assert_eq!(page.metadata.continue_token.as_deref(), Some("next"));
        let nodes: Vec<NodeObject> = page.items.into_iter().map(reduce_node).collect();
        let condition = nodes[0].condition.as_ref().unwrap();
        assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "Stale"));
        assert_eq!(condition.message, "1 failing: a-reg.sock (stale): refused");
        assert_eq!(condition.last_heartbeat_time.as_deref(), Some("2026-01-01T00:00:00Z"));
        assert_eq!(condition.last_transition_time.as_deref(), Some("2025-12-31T00:00:00Z"));
        let resources: Vec<(&str, &str)> = nodes[0]
            .extended_resources
            .iter()
            .map(|(name, quantity)| (name.as_str(), quantity.as_str()))
            .collect();
        assert_eq!(resources, [("example.com/nic", "0"), ("vendor.com/gpu", "2")]);
        assert_eq!(nodes[1], NodeObject::new("bare"));
    }
}
