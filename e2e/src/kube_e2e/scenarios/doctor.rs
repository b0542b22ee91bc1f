//! The `doctor` scenario: `kpm doctor --kubeconfig` with kpm's token against
//! the real API server.

use std::fs;

use serde_json::{Value, json};

use super::{Cluster, plugin};
use crate::command::Result;
use crate::kube_e2e::api::{Api, csinode_driver};
use crate::kube_e2e::{DOCTOR_TOKEN, Env, STEP_TIMEOUT};
use crate::scenario;
use crate::scenario::{Process, wait_for, wait_until};

/// `kpm doctor --kubeconfig` against the real API server, with kpm's own
/// token: a CSI driver kpm registered is ok; once kpm (the node's kubelet)
/// is gone, a driver whose registrar started meanwhile is missing from
/// CSINode, the entry of a driver that went with its socket is stale, the
/// entry of one killed with its socket left names that socket, and the
/// devices of a device plugin that stopped within the grace are orphaned
/// capacity. Exit 1; pointed at a root that does not exist, exit 2.
pub(super) fn doctor(env: &Env, cluster: &mut Cluster) -> Result {
    fn csi(name: &str) -> [&str; 6] {
        ["--type", "CSIPlugin", "--name", name, "--node-id", "node1-id"]
    }
    let kpm = cluster.start_kpm(env, "doctor")?;
    let root = kpm.root.clone();
    let _registered = plugin(&kpm, env, "doctor-registered", &csi("csi.example.com"))?;
    let mut gone = plugin(&kpm, env, "doctor-gone", &csi("gone.example.com"))?;
    let mut killed = plugin(&kpm, env, "doctor-killed", &csi("killed.example.com"))?;
    let fpga = ["--type", "DevicePlugin", "--name", "example.com/fpga", "--devices", "2"];
    let devices = plugin(&kpm, env, "doctor-fpga", &fpga)?;
    let api = &cluster.api;
    for driver in ["csi.example.com", "gone.example.com", "killed.example.com"] {
        wait_for(&format!("CSINode node1 lists {driver}"), STEP_TIMEOUT, || {
            csinode_driver(api, driver)
        })?;
    }
    stop_within_the_grace(api, devices)?;
    kpm.stop()?;
    // Then one driver goes with its socket (a deleted pod), one is killed
    // and leaves its socket, and another one's registrar starts with none
    // to see it.
    gone.kill();
    killed.kill();
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
        1,
    )?;
    scenario::expect_verdict(&report, &registry.join("csi.example.com-reg.sock"), "ok")?;
    scenario::expect_verdict(
        &report,
        &registry.join("missing.example.com-reg.sock"),
        "not-registered",
    )?;
    let stale = find_finding(&report, "stale-csi-node-entry", "gone.example.com")?;
    if stale.get("cause").is_some() {
        return Err(format!("the entry of gone.example.com names a cause: {stale}").into());
    }
    let killed = registry.join("killed.example.com-reg.sock");
    scenario::expect_verdict(&report, &killed, "stale")?;
    let kept = find_finding(&report, "stale-csi-node-entry", "killed.example.com")?;
    if kept["cause"] != killed.display().to_string() {
        return Err(
            format!("the entry of killed.example.com does not name its socket: {kept}").into()
        );
    }
    let orphaned = find_finding(&report, "orphaned-capacity", "example.com/fpga")?;
    if !report["unseen"].as_array().is_some_and(Vec::is_empty) {
        return Err(format!(
            "kpm doctor could not see everything with kpm's token: {}",
            report["unseen"]
        )
        .into());
    }
    eprintln!(
        "doctor: csi.example.com ok, missing.example.com not-registered, {}; {}; {}",
        stale["reason"], kept["hint"], orphaned["reason"]
    );

    wrong_root_is_blind(env, cluster, &kubeconfig)
}

/// The report's finding of `verdict` whose reason names `what`.
fn find_finding<'a>(report: &'a Value, verdict: &str, what: &str) -> Result<&'a Value> {
    report["findings"]
        .as_array()
        .and_then(|findings| {
            findings.iter().find(|finding| {
                finding["verdict"] == verdict
                    && finding["reason"].as_str().is_some_and(|reason| reason.contains(what))
            })
        })
        .ok_or_else(|| format!("no {verdict} finding about {what}: {report}").into())
}

/// The devices of `plugin`, a device plugin kpm registered (2
/// `example.com/fpga`), once it is killed: kept, none allocatable, for the
/// grace.
fn stop_within_the_grace(api: &Api, mut plugin: Process) -> Result {
    let fpgas = || -> Result<(Value, Value)> {
        let status = api.get("/api/v1/nodes/node1")?["status"].clone();
        Ok((
            status["capacity"]["example.com/fpga"].clone(),
            status["allocatable"]["example.com/fpga"].clone(),
        ))
    };
    wait_until("Node node1 with 2 example.com/fpga", STEP_TIMEOUT, || {
        Ok(fpgas()? == (json!("2"), json!("2")))
    })?;
    // The device plugin dies: its devices stay, none allocatable, for the
    // grace; the node's kubelet stops within it.
    plugin.kill();
    wait_until("2 example.com/fpga, none allocatable", STEP_TIMEOUT, || {
        Ok(fpgas()? == (json!("2"), json!("0")))
    })?;
    Ok(())
}

/// `kpm doctor` pointed at a root with no kubelet: nothing to judge, so it
/// says why and exits 2; `--watch`, with the doctor's own token, publishes
/// `Unknown`/`CannotJudge`, never an all-clear.
fn wrong_root_is_blind(env: &Env, cluster: &Cluster, kubeconfig: &str) -> Result {
    let wrong = cluster.dir.path().join("no-kubelet-here").display().to_string();
    let blind = scenario::doctor(
        &env.kpm,
        &["--root-dir", &wrong, "--kubeconfig", kubeconfig, "--node-name", "node1"],
        2,
    )?;
    if !blind["blind"]["why"].as_str().is_some_and(|why| why.contains(&wrong)) {
        return Err(format!("with a wrong root, the report is not blind: {blind}").into());
    }
    eprintln!("doctor --root-dir {wrong}: exit 2, {}", blind["blind"]["why"]);

    let doctor_config = cluster.kubeconfig("doctor-kubeconfig", DOCTOR_TOKEN)?;
    let nowhere = cluster.dir.path().join("no-other-root").display().to_string();
    let args = [
        "doctor",
        "--watch",
        "--root-dir",
        &wrong,
        "--other-root",
        &nowhere,
        "--kubeconfig",
        &doctor_config.display().to_string(),
        "--node-name",
        "node1",
    ];
    let log = |suffix: &str| env.out.join(format!("doctor-blind-watch.{suffix}"));
    let mut watch = Process::spawn("doctor --watch", &env.kpm, &args, &log("out"), &log("err"))?;
    let started = std::time::Instant::now();
    let condition = wait_for("KubeletPluginsHealthy Unknown on node1", STEP_TIMEOUT, || {
        let node = cluster.api.get("/api/v1/nodes/node1")?;
        let conditions = node["status"]["conditions"].as_array().cloned().unwrap_or_default();
        Ok(conditions
            .into_iter()
            .find(|c| c["type"] == "KubeletPluginsHealthy" && c["status"] == "Unknown"))
    })?;
    watch.kill();
    if condition["reason"] != "CannotJudge" {
        return Err(format!("doctor --watch with a wrong root published {condition}").into());
    }
    eprintln!(
        "doctor --watch --root-dir {wrong}: {} {} after {:.1?}: {}",
        condition["status"],
        condition["reason"],
        started.elapsed(),
        condition["message"]
    );
    Ok(())
}
