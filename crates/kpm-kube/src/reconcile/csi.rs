//! A pass over the CSI drivers' targets, by the kubelet's nodeinfomanager
//! rules (spec A.8) applied to what the API server holds: the Node's
//! node-id annotation and topology labels first, then the CSINode, owned by
//! the Node. A withdrawn driver goes the other way round, its CSINode entry
//! before its annotation entry, as `UninstallCSIDriver` does it.
//!
//! Objects shared with other writers are written back with the
//! `resourceVersion` read: a concurrent write fails with 409, and the next
//! pass starts again from a fresh read, so nobody's entries are lost.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kpm_csi::{
    CsiError, CsiNode, CsiNodeDriver as DriverEntry, NODE_ID_ANNOTATION, add_topology_labels,
    remove_node_id_annotation, set_node_id_annotation,
};
use kube::api::{Api, Patch};
use serde_json::{Map, Value, json};
use tracing::warn;

use super::{LoopState, Pass};
use crate::KubeError;
use crate::api::NodeApi;
use crate::desired::{CsiGoal, Desired, State, Target};
use crate::status::{ObjectKind, PendingPublication};

/// How far one driver got in this pass.
enum Step {
    /// Its part of the Node is right (or, withdrawn, waits for its
    /// CSINode entry to go first).
    Going,
    Failed(ObjectKind, Arc<KubeError>),
    /// The objects could not be read.
    Unread(ObjectKind, Arc<KubeError>),
    Refused(Arc<CsiError>),
}

pub(super) async fn pass(
    api: &NodeApi,
    desired: &Desired,
    node: &Result<Node, Arc<KubeError>>,
    pass: &mut Pass,
    loop_state: &mut LoopState,
) {
    let mut steps: BTreeMap<&str, Step> =
        desired.csi.keys().map(|driver| (driver.as_str(), Step::Going)).collect();
    let node = match node {
        Ok(node) => Some(node),
        // A missing Node holds no annotation: a withdrawal is its CSINode
        // entry alone; an installation waits for the Node.
        Err(missing) if matches!(missing.as_ref(), KubeError::NodeNotFound { .. }) => {
            let _shown = api.record(ObjectKind::Node, Err::<(), _>(missing.as_ref()));
            for (driver, step) in &mut steps {
                if matches!(desired.csi[*driver].value, CsiGoal::Installed(_)) {
                    *step = Step::Failed(ObjectKind::Node, Arc::clone(missing));
                }
            }
            if !steps.values().any(|step| matches!(step, Step::Going)) {
                return finish(desired, pass, loop_state, steps, |_| false);
            }
            None
        }
        Err(err) => {
            fail_all(api, &mut steps, ObjectKind::Node, err);
            return finish(desired, pass, loop_state, steps, |_| false);
        }
    };
    let csinodes: Api<CSINode> = Api::all(api.client.clone());
    let csinode = match api.call("get", "csinodes", &api.node, csinodes.get_opt(&api.node)).await {
        Ok(csinode) => csinode,
        Err(err) => {
            fail_all(api, &mut steps, ObjectKind::CsiNode, &Arc::new(err));
            return finish(desired, pass, loop_state, steps, |_| false);
        }
    };
    let listed = csinode.as_ref().map(model).unwrap_or_default();
    if let Some(node) = node {
        update_node(api, desired, node, &listed, &mut steps).await;
    }
    let written = update_csinode(api, desired, node, csinode, &mut steps).await;
    let entry_went = |driver: &str| {
        listed.driver(driver).is_some()
            && written.as_ref().is_some_and(|drivers| drivers.driver(driver).is_none())
    };
    finish(desired, pass, loop_state, steps, entry_went);
}

fn fail_all(
    api: &NodeApi,
    steps: &mut BTreeMap<&str, Step>,
    object: ObjectKind,
    err: &Arc<KubeError>,
) {
    let _shown = api.record(object, Err::<(), _>(err.as_ref()));
    for step in steps.values_mut() {
        *step = Step::Unread(object, Arc::clone(err));
    }
}

/// `updateNodeIDInNode` and `updateTopologyLabels` of every installed
/// driver, and `removeNodeIDFromNode` of every withdrawn one whose CSINode
/// entry is gone, in one merge patch of what changed.
async fn update_node<'a>(
    api: &NodeApi,
    desired: &'a Desired,
    node: &Node,
    listed: &CsiNode,
    steps: &mut BTreeMap<&'a str, Step>,
) {
    let mut annotations = node.metadata.annotations.clone().unwrap_or_default();
    let mut labels = node.metadata.labels.clone().unwrap_or_default();
    let mut changed_by = Vec::new();
    for (driver, goal) in &desired.csi {
        let (mut next_annotations, mut next_labels) = (annotations.clone(), labels.clone());
        let applied = match &goal.value {
            CsiGoal::Installed(info) => {
                set_node_id_annotation(&mut next_annotations, driver, &info.node_id).and_then(
                    |annotated| {
                        Ok(add_topology_labels(&mut next_labels, &info.topology)? || annotated)
                    },
                )
            }
            CsiGoal::Withdrawn if listed.driver(driver).is_none() => {
                remove_node_id_annotation(&mut next_annotations, driver)
            }
            CsiGoal::Withdrawn => Ok(false),
        };
        match applied {
            Ok(changed) => {
                if changed {
                    changed_by.push(driver.as_str());
                }
                (annotations, labels) = (next_annotations, next_labels);
            }
            Err(refused) => {
                steps.insert(driver, Step::Refused(Arc::new(refused)));
            }
        }
    }
    if changed_by.is_empty() {
        let _shown = api.record(ObjectKind::Node, Ok::<(), KubeError>(()));
        return;
    }
    // Only the keys kpm sets: a merge patch leaves the others alone.
    let old_labels = node.metadata.labels.clone().unwrap_or_default();
    let new_labels: Map<String, Value> = labels
        .into_iter()
        .filter(|(key, value)| old_labels.get(key) != Some(value))
        .map(|(key, value)| (key, Value::String(value)))
        .collect();
    let mut patch = json!({"metadata": {
        "resourceVersion": node.metadata.resource_version,
        "annotations": { NODE_ID_ANNOTATION: annotations.get(NODE_ID_ANNOTATION) },
    }});
    if !new_labels.is_empty() {
        patch["metadata"]["labels"] = Value::Object(new_labels);
    }
    let nodes: Api<Node> = Api::all(api.client.clone());
    let params = NodeApi::patch_params();
    let sent = api
        .call("patch", "nodes", &api.node, nodes.patch(&api.node, &params, &Patch::Merge(&patch)))
        .await;
    if let Err(err) = api.record(ObjectKind::Node, sent.map_err(|err| api.on_node(err))) {
        let err = Arc::new(err);
        for driver in changed_by {
            steps.insert(driver, Step::Failed(ObjectKind::Node, Arc::clone(&err)));
        }
    }
}

/// `installDriverToCSINode` of every installed driver whose Node part is
/// right, `uninstallDriverFromCSINode` of every withdrawn one, in one
/// write: a create (owned by the Node) when there is none and some driver
/// is installed, else an update of what changed. A CSINode owned by an
/// older Node of the same name starts afresh. Returns the entries the
/// CSINode has after the pass, if it was read and written.
async fn update_csinode<'a>(
    api: &NodeApi,
    desired: &'a Desired,
    node: Option<&Node>,
    csinode: Option<CSINode>,
    steps: &mut BTreeMap<&'a str, Step>,
) -> Option<CsiNode> {
    let owner = node.map(owner);
    let stale = csinode.as_ref().zip(owner.as_ref()).is_some_and(|(csinode, node)| {
        let owners = csinode.metadata.owner_references.as_deref().unwrap_or_default();
        owners.iter().any(|o| o.kind == "Node" && o.uid != node.uid)
    });
    let mut drivers =
        if stale { CsiNode::default() } else { csinode.as_ref().map(model).unwrap_or_default() };
    let mut changed_by = Vec::new();
    for (driver, goal) in &desired.csi {
        if !matches!(steps.get(driver.as_str()), Some(Step::Going)) {
            continue;
        }
        let changed = match &goal.value {
            CsiGoal::Installed(info) => drivers.install_driver(driver, info),
            CsiGoal::Withdrawn => drivers.uninstall_driver(driver),
        };
        if changed || stale {
            changed_by.push(driver.as_str());
        }
    }
    if changed_by.is_empty() {
        let _shown = api.record(ObjectKind::CsiNode, Ok::<(), KubeError>(()));
        return Some(drivers);
    }
    let name = &api.node;
    let csinodes: Api<CSINode> = Api::all(api.client.clone());
    let params = NodeApi::post_params();
    let written = match (csinode, owner) {
        (Some(mut csinode), owner) => {
            if stale {
                warn!(
                    node = name,
                    "CSINode belongs to an earlier Node of this name; starting afresh"
                );
                csinode.metadata.owner_references = owner.map(|owner| vec![owner]);
            }
            csinode.spec = spec(&drivers);
            let update = csinodes.replace(name, &params, &csinode);
            api.call("update", "csinodes", name, update).await.map(drop)
        }
        // Only an installation changes a missing CSINode, and only with
        // the Node read.
        (None, Some(owner)) => {
            let csinode = CSINode {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    owner_references: Some(vec![owner]),
                    ..ObjectMeta::default()
                },
                spec: spec(&drivers),
            };
            api.call("create", "csinodes", name, csinodes.create(&params, &csinode)).await.map(drop)
        }
        (None, None) => Ok(()),
    };
    match api.record(ObjectKind::CsiNode, written) {
        Ok(()) => Some(drivers),
        Err(err) => {
            let err = Arc::new(err);
            for driver in changed_by {
                steps.insert(driver, Step::Failed(ObjectKind::CsiNode, Arc::clone(&err)));
            }
            None
        }
    }
}

/// Turns the drivers' steps into outcomes: a withdrawn driver whose CSINode
/// entry went in this pass (`entry_went`) may still have its annotation
/// entry, which the next pass, at once, removes; one whose entries are both
/// gone is done.
fn finish(
    desired: &Desired,
    pass: &mut Pass,
    loop_state: &mut LoopState,
    steps: BTreeMap<&str, Step>,
    entry_went: impl Fn(&str) -> bool,
) {
    for (driver, step) in steps {
        let goal = &desired.csi[driver];
        let target = Target::Csi(driver.to_owned());
        let withdrawn = matches!(goal.value, CsiGoal::Withdrawn);
        let mut failing = |object, error, unread| State::Failing {
            attempts: loop_state.failed(&target, goal.revision),
            object,
            error,
            unread,
        };
        let state = match step {
            Step::Failed(object, error) => failing(object, error, false),
            Step::Unread(object, error) => failing(object, error, true),
            Step::Refused(error) => State::Refused(error),
            Step::Going if withdrawn && entry_went(driver) => {
                pass.again = true;
                State::Writing
            }
            Step::Going if withdrawn => State::Done,
            Step::Going => State::Agreed,
        };
        // What is pending is pending on the object that failed, else on
        // the Node: a refusal's, and a withdrawal's next write.
        let object = match &state {
            State::Failing { object, .. } => *object,
            _ => ObjectKind::Node,
        };
        let want = match &goal.value {
            CsiGoal::Installed(info) => format!("installed: {info}"),
            CsiGoal::Withdrawn => "withdrawn: no CSINode entry, no node-id annotation entry".into(),
        };
        pass.outcome(target, goal.revision, state, || {
            PendingPublication::new(object, driver, want, withdrawn, goal.since)
        });
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
