//! The field guide's failures that need pods (`docs/field-guide.md`),
//! each made as users made it, on the real node, with the doctor's
//! DaemonSet of `doctor` watching: what it publishes, what `kpm doctor`
//! says in its pod, and what `kpm doctor explain` makes of the kubelet's
//! own log line.

use std::time::Instant;

use serde_json::Value;

use super::super::node::Node;
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::doctor::{DOCTOR_SELECTOR, NAMESPACE, doctor_in_pod};
use super::secs;
use crate::Result;
use crate::scenario::wait_for;

/// The driver the broken DaemonSet deploys, and where.
const DRIVER: &str = "wrongpath.csi.k8s.io";
const DRIVER_NAMESPACE: &str = "csi-wrongpath";
const REGISTRAR: &str = "node-driver-registrar";

/// `wrong-registration-path`: hostpathplugin and node-driver-registrar
/// deployed with a `--kubelet-registration-path` one directory off the
/// driver's socket, a values mistake of driver charts. The kubelet refuses
/// the driver, the registrar exits and crash-loops with its socket left
/// behind. The doctor must name the pod, the container and its restarts,
/// the endpoint that does not exist and the flag to fix, in its report and
/// in a look of its own; `kpm doctor explain` must say the same of the
/// kubelet's log line.
pub(super) fn wrong_registration_path(_env: &Env, node: &mut Node) -> Result<String> {
    let root = node.kubelet_root.display().to_string();
    let wrong = format!("{root}/plugins/csi-wrongpath-typo/csi.sock");
    let manifest = include_str!("../manifests/csi-hostpath.yaml")
        .replace("hostpath.csi.k8s.io", DRIVER)
        .replace("csi-hostpath", DRIVER_NAMESPACE)
        .replace("@ROOT@/plugins/csi-wrongpath/csi.sock", &wrong)
        .replace("@ROOT@", &root);
    if !manifest.contains(&wrong) {
        return Err("the manifest's --kubelet-registration-path was not replaced".into());
    }
    let socket = format!("{root}/plugins_registry/{DRIVER}-reg.sock");
    let applied = Instant::now();
    node.apply(&manifest)?;

    // The report the doctor's DaemonSet publishes.
    let what = format!("the KubeletPluginReport names {socket} endpoint-unreachable with its pod");
    let (reported, entry) = wait_for(&what, START_TIMEOUT * 2, || {
        let report = crate::kube_e2e::api::report(&node.api, NODE_NAME)?;
        let entry = report.as_ref().and_then(|report| entry_of(report, &socket));
        // As of the pass that published it: its restarts are not written
        // again at each restart, its pod and its last exit are there.
        Ok(entry
            .filter(|entry| {
                entry["verdict"] == "endpoint-unreachable"
                    && entry["pod"]["container"] == REGISTRAR
                    && entry["pod"]["lastTermination"]["exitCode"] == 1
            })
            .map(|entry| (Instant::now(), entry)))
    })?;
    let pod = &entry["pod"];
    if pod["namespace"] != DRIVER_NAMESPACE {
        return Err(format!("the report names another pod: {entry}").into());
    }
    let reason = entry["reason"].as_str().unwrap_or_default();
    if !reason.contains(&wrong) {
        return Err(format!("the report's reason does not name {wrong}: {reason}").into());
    }
    let pod_name = pod["pod"].as_str().ok_or("a pod without a name")?.to_owned();

    // The doctor's own look, in its pod, as an operator runs it.
    let doctor = node.pod(NAMESPACE, DOCTOR_SELECTOR)?;
    let doctor = doctor["metadata"]["name"].as_str().ok_or("doctor pod without a name")?;
    let row = wait_for("kpm doctor in its pod names the pod and the fix", START_TIMEOUT, || {
        // Exit 1: a plugin fails, the report is printed all the same.
        let text = node.kubectl_stdout(&doctor_in_pod(doctor))?;
        let report: Value = serde_json::from_str(&text)?;
        let row = report["plugins"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|row| row["path"] == socket.as_str())
            .cloned();
        Ok(row.filter(|row| {
            row["pod"]["pod"] == pod_name.as_str()
                && row["pod"]["restarts"].as_u64().is_some_and(|restarts| restarts >= 1)
                && row["hint"]
                    .as_str()
                    .is_some_and(|hint| hint.contains("--kubelet-registration-path"))
        }))
    })?;

    // The kubelet's own line about it, explained.
    let kubelet_log = std::fs::read_to_string(node.kubelet_log())?;
    let line = kubelet_log
        .lines()
        .find(|line| line.contains("RegisterPlugin error") && line.contains(&socket))
        .ok_or_else(|| format!("the kubelet logged no RegisterPlugin error for {socket}"))?;
    let explained = node.kubectl_stdout(&[
        "exec", "-n", NAMESPACE, doctor, "--", "kpm", "doctor", "explain", line,
    ])?;
    if !explained.contains("verdict:    endpoint-unreachable") {
        return Err(
            format!("kpm doctor explain on the kubelet's line:\n{line}\n{explained}").into()
        );
    }

    // Gone as an operator removes it: the DaemonSet, then the socket the
    // registrar left (nothing removes it otherwise).
    node.kubectl(&["delete", "namespace", DRIVER_NAMESPACE, "--wait=true"])?;
    wait_for("the broken driver's pods gone", START_TIMEOUT, || {
        Ok(node
            .pods(DRIVER_NAMESPACE, "app.kubernetes.io/name=csi-wrongpathplugin")?
            .is_empty()
            .then_some(()))
    })?;
    for leftover in [socket.clone(), format!("{root}/plugins/csi-wrongpath")] {
        let _ = std::fs::remove_dir_all(&leftover).or_else(|_| std::fs::remove_file(&leftover));
    }
    wait_for("the driver's entry gone from the report", START_TIMEOUT, || {
        let report = crate::kube_e2e::api::report(&node.api, NODE_NAME)?;
        Ok(report.is_some_and(|report| entry_of(&report, &socket).is_none()).then_some(()))
    })?;

    let said = row["said"].as_str().unwrap_or("(no line quoted)");
    eprintln!("kpm doctor in its pod, on {socket}:\n  {}\n  it said: {said}", row["reason"]);
    Ok(format!(
        "endpoint-unreachable naming {REGISTRAR} of {}/{pod_name} published {} after apply; the \
         one-shot doctor names it with {} restarts and the flag; explain on the kubelet's line: \
         endpoint-unreachable",
        DRIVER_NAMESPACE,
        secs(reported - applied),
        row["pod"]["restarts"],
    ))
}

/// The report's entry for `socket`.
fn entry_of(report: &Value, socket: &str) -> Option<Value> {
    report["status"]["plugins"].as_array()?.iter().find(|entry| entry["socket"] == socket).cloned()
}
