//! The `apiserver-down` scenario: plugins register while the API server is
//! down, and everything converges once it is back.

use super::{Cluster, plugin};
use crate::Result;
use crate::kube_e2e::api::csinode_driver;
use crate::kube_e2e::{CONVERGE_TIMEOUT, Env, STEP_TIMEOUT};
use crate::scenario::{wait_for, wait_until};

pub(super) fn apiserver_down(env: &Env, cluster: &mut Cluster) -> Result {
    let kpm = cluster.start_kpm(env, "apiserver-down")?;
    cluster.stop_apiserver()?;
    eprintln!("kube-apiserver stopped");
    let nic = plugin(
        &kpm,
        env,
        "apiserver-down-nic",
        &["--type", "DevicePlugin", "--name", "example.com/nic", "--devices", "2"],
    )?;
    nic.wait_for_line("registered locally", STEP_TIMEOUT, |line| line == "registered: true")?;
    let csi = plugin(
        &kpm,
        env,
        "apiserver-down-csi2",
        &[
            "--type",
            "CSIPlugin",
            "--name",
            "csi2.example.com",
            "--node-id",
            "node1-csi2",
            "--topology",
            "topology.example.com/rack=r1",
            "--max-volumes",
            "3",
        ],
    )?;
    let reason = wait_for("csi2.example.com rejected", STEP_TIMEOUT, || {
        Ok(csi
            .lines()?
            .iter()
            .find_map(|line| line.strip_prefix("registered: false: ").map(str::to_owned)))
    })?;
    if !reason.to_lowercase().contains("node") {
        return Err(format!("the rejection does not name the Node update: {reason}").into());
    }
    eprintln!("example.com/nic registered; csi2.example.com rejected: {reason}");

    cluster.start_apiserver(env)?;
    eprintln!("kube-apiserver restarted");
    let api = &cluster.api;
    wait_until("example.com/nic capacity 2 on node1", CONVERGE_TIMEOUT, || {
        let node = api.get("/api/v1/nodes/node1")?;
        Ok(node["status"]["capacity"]["example.com/nic"] == "2")
    })?;
    let entry = wait_for("CSINode node1 lists csi2.example.com", CONVERGE_TIMEOUT, || {
        csinode_driver(api, "csi2.example.com")
    })?;
    wait_until("csi2.example.com told registered", CONVERGE_TIMEOUT, || {
        Ok(csi.lines()?.iter().any(|line| line == "registered: true"))
    })?;
    eprintln!(
        "converged: example.com/nic capacity 2, CSINode entry {entry}, csi2.example.com registered"
    );
    drop((nic, csi));
    kpm.stop()
}
