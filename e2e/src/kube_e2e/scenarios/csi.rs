//! The CSI scenarios: a driver's registration in CSINode and on the Node
//! (`csi`), and its volume limit followed (`csi-allocatable`, KEP-4876).

use std::fs;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Cluster, plugin};
use crate::command::Result;
use crate::kube_e2e::api::{CSIDRIVERS, csinode_driver, node_ids};
use crate::kube_e2e::{Env, KPM_USER, NODE_ID_ANNOTATION, STEP_TIMEOUT, STOP_TIMEOUT};
use crate::scenario::{wait_for, wait_until};

pub(super) fn csi(env: &Env, cluster: &mut Cluster) -> Result {
    let kpm = cluster.start_kpm(env, "csi")?;
    let mut plugin = plugin(
        &kpm,
        env,
        "csi",
        &[
            "--type",
            "CSIPlugin",
            "--name",
            "csi.example.com",
            "--node-id",
            "node1-id",
            "--topology",
            "topology.example.com/zone=z1",
            "--max-volumes",
            "7",
        ],
    )?;
    let api = &cluster.api;
    let node_uid = api.get("/api/v1/nodes/node1")?["metadata"]["uid"].clone();
    let entry = wait_for("CSINode node1 lists csi.example.com", STEP_TIMEOUT, || {
        csinode_driver(api, "csi.example.com")
    })?;
    let expected = json!({
        "name": "csi.example.com",
        "nodeID": "node1-id",
        "topologyKeys": ["topology.example.com/zone"],
        "allocatable": {"count": 7},
    });
    if entry != expected {
        return Err(format!("CSINode entry {entry}, expected {expected}").into());
    }
    let csinode = api.get("/apis/storage.k8s.io/v1/csinodes/node1")?;
    let owned = csinode["metadata"]["ownerReferences"].as_array().is_some_and(|owners| {
        owners.iter().any(|o| {
            o["apiVersion"] == "v1"
                && o["kind"] == "Node"
                && o["name"] == "node1"
                && o["uid"] == node_uid
        })
    });
    if !owned {
        return Err(format!(
            "CSINode node1 is not owned by Node node1 (uid {node_uid}): {}",
            csinode["metadata"]["ownerReferences"]
        )
        .into());
    }
    let node = wait_for("the node-id annotation and topology label", STEP_TIMEOUT, || {
        let node = api.get("/api/v1/nodes/node1")?;
        let ids = node_ids(&node)?;
        let labelled = node["metadata"]["labels"]["topology.example.com/zone"] == "z1";
        Ok((ids == json!({"csi.example.com": "node1-id"}) && labelled).then_some(node))
    })?;
    eprintln!(
        "registered: CSINode entry {entry}, owner Node uid {node_uid}, annotation {}, label zone=z1",
        node["metadata"]["annotations"][NODE_ID_ANNOTATION]
    );

    plugin.stop(STOP_TIMEOUT)?;
    wait_until("the CSINode entry and the annotation removed", STEP_TIMEOUT, || {
        let node = api.get("/api/v1/nodes/node1")?;
        Ok(csinode_driver(api, "csi.example.com")?.is_none()
            && node_ids(&node)?.get("csi.example.com").is_none())
    })?;
    let node = api.get("/api/v1/nodes/node1")?;
    if node["metadata"]["labels"]["topology.example.com/zone"] != "z1" {
        return Err(format!("the topology label went: {}", node["metadata"]["labels"]).into());
    }
    eprintln!("deregistered: CSINode entry and annotation removed, the label stays");
    kpm.stop()
}

/// KEP-4876: a CSIDriver with `nodeAllocatableUpdatePeriodSeconds: 10` and
/// a driver whose volume limit changes: the CSINode entry's count follows
/// within one period.
pub(super) fn csi_allocatable(env: &Env, cluster: &mut Cluster) -> Result {
    let api = &cluster.api;
    let csidriver = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": "csi.example.com"},
        "spec": {"nodeAllocatableUpdatePeriodSeconds": 10},
    });
    api.post(CSIDRIVERS, &csidriver)?;
    let kpm = cluster.start_kpm(env, "csi-allocatable")?;
    let limit = env.out.join("csi-allocatable-max-volumes");
    fs::write(&limit, "7")?;
    let limit_arg = limit.display().to_string();
    let args = ["--type", "CSIPlugin", "--name", "csi.example.com", "--node-id", "node1-id"];
    let mut plugin = plugin(
        &kpm,
        env,
        "csi-allocatable",
        &[&args[..], &["--max-volumes-file", &limit_arg]].concat(),
    )?;
    let count = || -> Result<Option<i64>> {
        Ok(csinode_driver(api, "csi.example.com")?
            .and_then(|entry| entry["allocatable"]["count"].as_i64()))
    };
    wait_until("CSINode node1 lists csi.example.com with count 7", STEP_TIMEOUT, || {
        Ok(count()? == Some(7))
    })?;
    let listed = wait_for("kpm list shows the period", STEP_TIMEOUT, || {
        let driver = kpm.list()?["csi_drivers"][0].clone();
        Ok((driver["allocatable_update_period_s"] == 10).then_some(driver))
    })?;
    eprintln!(
        "registered with count 7, refreshed every {}s",
        listed["allocatable_update_period_s"]
    );

    let from = cluster.audit_offset();
    fs::write(&limit, "12")?;
    let changed = Instant::now();
    wait_until("the CSINode count follows to 12", STEP_TIMEOUT, || Ok(count()? == Some(12)))?;
    let took = changed.elapsed();
    if took > Duration::from_secs(12) {
        return Err(format!("the count followed after {took:?}, more than one period").into());
    }
    // kpm's RBAC has no patch on CSINodes: the kubelet updates the object
    // it read, with its resourceVersion.
    let writes: Vec<String> = cluster
        .writes_by(KPM_USER, from)?
        .into_iter()
        .filter(|write| write.what.ends_with(" csinodes"))
        .map(|write| format!("{} {}", write.what, write.code))
        .collect();
    if writes != ["update csinodes 200"] {
        return Err(format!("CSINode writes for one change: {writes:?}").into());
    }
    eprintln!(
        "count 7 → 12 on the CSINode {} ms after the driver changed, in 1 update",
        took.as_millis()
    );
    plugin.stop(STOP_TIMEOUT)?;
    kpm.stop()
}
