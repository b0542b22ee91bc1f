//! A registered CSI driver held to what the kubelet's registration and
//! node-info path needs of it, beyond volumes (csi-sanity's part): the same
//! node id on every call, topology that can become the Node's labels and
//! the CSINode's `topologyKeys`, `GetPluginInfo` naming the driver that
//! registered, and `NodeGetCapabilities` answering.

use std::collections::BTreeMap;
use std::time::Duration;

use kpm_api::csi::v1::identity_client::IdentityClient;
use kpm_api::csi::v1::node_client::NodeClient;
use kpm_api::csi::v1::node_service_capability::{Rpc, Type as Capability, rpc};
use kpm_api::csi::v1::{
    GetPluginInfoRequest, NodeGetCapabilitiesRequest, NodeGetInfoRequest, NodeGetInfoResponse,
};

use tonic::transport::Channel;

use crate::Check;
use crate::dial::dial;
use crate::outcome::{Evidence, Outcome};

/// How many times `NodeGetInfo` is asked: the kubelet asks at every
/// registration, and the node id must not move between them.
const NODE_GET_INFO_CALLS: usize = 3;

/// The conversation with the CSI driver registered as `name`, served at
/// `endpoint` (as it advertised it); also the node id it reported, for the
/// restart check to compare.
pub(super) async fn converse(
    name: &str,
    endpoint: &str,
    bound: Duration,
) -> (Vec<(Check, Outcome)>, Option<String>) {
    let channel = match dial(endpoint, bound).await {
        Ok(channel) => channel,
        Err(why) => {
            let checks = [
                Check::NodeIdStable,
                Check::TopologyKeys,
                Check::GetPluginInfoName,
                Check::NodeGetCapabilities,
            ]
            .map(|check| (check, Outcome::failed(why.clone())));
            return (checks.into(), None);
        }
    };
    let mut node = NodeClient::new(channel.clone());
    let mut infos = Vec::new();
    for _ in 0..NODE_GET_INFO_CALLS {
        infos
            .push(node.node_get_info(NodeGetInfoRequest {}).await.map(tonic::Response::into_inner));
    }
    let first = infos.first().and_then(|info| info.as_ref().ok()).cloned();
    let checks = vec![
        (Check::NodeIdStable, node_id_stable(&infos)),
        (Check::TopologyKeys, first.as_ref().map_or_else(no_node_info, topology)),
        (Check::GetPluginInfoName, plugin_name(name, IdentityClient::new(channel)).await),
        (Check::NodeGetCapabilities, capabilities(node).await),
    ];
    let node_id = first.map(|info| info.node_id).filter(|id| !id.is_empty());
    (checks, node_id)
}

/// The node id the driver at `endpoint` reports now, for the restart check.
pub(super) async fn node_id(endpoint: &str, bound: Duration) -> Result<String, String> {
    let channel = dial(endpoint, bound).await?;
    let info = NodeClient::new(channel).node_get_info(NodeGetInfoRequest {}).await;
    info.map(|info| info.into_inner().node_id)
        .map_err(|status| format!("NodeGetInfo: {}", status.message()))
}

fn no_node_info() -> Outcome {
    Outcome::failed("no NodeGetInfo answer: the kubelet refuses the registration")
}

/// The same non-empty node id on every call: the kubelet writes it into
/// the Node's `csi.volume.kubernetes.io/nodeid` annotation and the CSINode,
/// and attachers address volumes by it.
fn node_id_stable(infos: &[Result<NodeGetInfoResponse, tonic::Status>]) -> Outcome {
    let mut ids = Vec::new();
    for info in infos {
        match info {
            Ok(info) => ids.push(info.node_id.as_str()),
            Err(status) => {
                return Outcome::failed(format!(
                    "NodeGetInfo: {}: the kubelet refuses the registration",
                    status.message()
                ));
            }
        }
    }
    match ids.as_slice() {
        ["", ..] => Outcome::failed(
            "an empty node id: the kubelet refuses the registration (\"node ID is empty\")",
        ),
        [first, rest @ ..] if rest.iter().all(|id| id == first) => {
            Outcome::passed(format!("{first:?} on {} calls", ids.len()))
        }
        _ => Outcome::failed(format!(
            "{ids:?} on {} calls: the kubelet writes each into the Node's annotation and the \
             CSINode, and volumes attached under one id are lost to the next",
            ids.len()
        )),
    }
}

/// The accessible topology: its keys become the CSINode's `topologyKeys`
/// and, with the values, the Node's labels, which the API server refuses
/// unless they are valid label keys and values (and then the kubelet's
/// registration fails).
fn topology(info: &NodeGetInfoResponse) -> Outcome {
    let segments: BTreeMap<&String, &String> =
        info.accessible_topology.iter().flat_map(|topology| &topology.segments).collect();
    if segments.is_empty() {
        return Outcome::passed("no topology: the CSINode has no topologyKeys");
    }
    let mut findings = Evidence::default();
    let keys: Vec<&String> = segments.keys().copied().collect();
    findings.pass(format!("the CSINode's topologyKeys {keys:?}"));
    for (key, value) in &segments {
        if !kpm_api::is_label_key(key) {
            findings.fail(format!(
                "{key:?} is not a label key: the Node update is refused, and the registration fails"
            ));
        }
        if !kpm_api::is_label_value(value) {
            findings.fail(format!(
                "{key}={value:?} is not a label value: the Node update is refused, and the \
                 registration fails"
            ));
        }
    }
    findings.outcome("")
}

/// `GetPluginInfo` names the driver that registered: provisioners write
/// that name into each PersistentVolume, and the kubelet finds the driver
/// for a volume by it among the registered ones.
async fn plugin_name(registered: &str, mut identity: IdentityClient<Channel>) -> Outcome {
    match identity.get_plugin_info(GetPluginInfoRequest {}).await {
        Err(status) => Outcome::failed(format!(
            "GetPluginInfo: {}: provisioners and attachers cannot name the driver",
            status.message()
        )),
        Ok(info) => {
            let info = info.into_inner();
            if info.name == registered {
                Outcome::passed(format!(
                    "{:?} (vendor version {:?})",
                    info.name, info.vendor_version
                ))
            } else {
                Outcome::failed(format!(
                    "{:?}, registered as {registered:?}: volumes provisioned by {:?} fail to \
                     mount (\"driver name {} not found in the list of registered CSI drivers\")",
                    info.name, info.name, info.name
                ))
            }
        }
    }
}

/// `NodeGetCapabilities`, which the kubelet asks before staging, mounting
/// and reading a volume's stats.
async fn capabilities(mut node: NodeClient<Channel>) -> Outcome {
    match node.node_get_capabilities(NodeGetCapabilitiesRequest {}).await {
        Err(status) => Outcome::failed(format!(
            "{:?}: {}: the kubelet asks it before every volume is staged or mounted, which fail",
            status.code(),
            status.message()
        )),
        Ok(response) => {
            let names: Vec<&str> = response
                .into_inner()
                .capabilities
                .iter()
                .filter_map(|capability| match capability.r#type {
                    Some(Capability::Rpc(Rpc { r#type })) => {
                        rpc::Type::try_from(r#type).ok().map(|t| t.as_str_name())
                    }
                    _ => None,
                })
                .collect();
            if names.is_empty() {
                Outcome::passed("answered, no capability (no staging, no stats)")
            } else {
                Outcome::passed(format!("answered: {}", names.join(", ")))
            }
        }
    }
}
