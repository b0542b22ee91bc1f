//! The `doctor` scenario: `kpm doctor --kubeconfig` with kpm's token against
//! the real API server.

use std::fs;

use super::{Cluster, plugin};
use crate::Result;
use crate::kube_e2e::api::csinode_driver;
use crate::kube_e2e::{Env, STEP_TIMEOUT};
use crate::scenario;
use crate::scenario::{Process, find, wait_for};

/// `kpm doctor --kubeconfig` against the real API server, with kpm's own
/// token: a CSI driver kpm registered is ok; once kpm (the node's kubelet)
/// is gone, a driver whose registrar started meanwhile is missing from
/// CSINode, and the entry of a driver that went with it is stale.
pub(super) fn doctor(env: &Env, cluster: &mut Cluster) -> Result {
    fn csi(name: &str) -> [&str; 6] {
        ["--type", "CSIPlugin", "--name", name, "--node-id", "node1-id"]
    }
    let kpm = cluster.start_kpm(env, "doctor")?;
    let root = kpm.root.clone();
    let _registered = plugin(&kpm, env, "doctor-registered", &csi("csi.example.com"))?;
    let mut gone = plugin(&kpm, env, "doctor-gone", &csi("gone.example.com"))?;
    let api = &cluster.api;
    for driver in ["csi.example.com", "gone.example.com"] {
        wait_for(&format!("CSINode node1 lists {driver}"), STEP_TIMEOUT, || {
            csinode_driver(api, driver)
        })?;
    }
    // The node's kubelet stops; then one driver goes with its socket (a
    // deleted pod), and another one's registrar starts with none to see it.
    kpm.stop()?;
    gone.kill();
    let registry = root.join("plugins_registry");
    fs::remove_file(registry.join("gone.example.com-reg.sock"))?;
    let missing = Process::spawn(
        "doctor-missing",
        &env.example_plugin,
        &[
            "--dir",
            &registry.display().to_string(),
            "--type",
            "CSIPlugin",
            "--name",
            "missing.example.com",
            "--node-id",
            "node1-id",
        ],
        &env.out.join("doctor-missing-plugin.out"),
        &env.out.join("doctor-missing-plugin.err"),
    )?;
    missing
        .wait_for_line("its socket served", STEP_TIMEOUT, |line| line.starts_with("serving "))?;

    let kubeconfig = cluster.dir.path().join("kubeconfig").display().to_string();
    let nowhere = cluster.dir.path().join("no-other-root").display().to_string();
    let root_dir = root.display().to_string();
    let report = scenario::doctor(
        &env.kpm,
        &[
            "--root-dir",
            &root_dir,
            "--kubeconfig",
            &kubeconfig,
            "--node-name",
            "node1",
            "--other-root",
            &nowhere,
        ],
    )?;
    scenario::expect_verdict(&report, &registry.join("csi.example.com-reg.sock"), "ok")?;
    scenario::expect_verdict(
        &report,
        &registry.join("missing.example.com-reg.sock"),
        "not-registered",
    )?;
    let stale = find(&report["findings"], "verdict", "stale-csi-node-entry")
        .filter(|finding| {
            finding["reason"].as_str().is_some_and(|r| r.contains("gone.example.com"))
        })
        .ok_or_else(|| format!("no stale CSINode entry for gone.example.com: {report}"))?;
    if !report["unseen"].as_array().is_some_and(Vec::is_empty) {
        return Err(format!(
            "kpm doctor could not see everything with kpm's token: {}",
            report["unseen"]
        )
        .into());
    }
    eprintln!(
        "doctor: csi.example.com ok, missing.example.com not-registered, {}",
        stale["reason"]
    );
    Ok(())
}
