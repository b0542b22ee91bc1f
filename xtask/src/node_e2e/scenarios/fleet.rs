//! `cluster` and `footprint`: the fleet view from outside the node, and
//! what the doctor's pod costs the node while nothing happens.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::super::node::Node;
use super::super::{Env, NODE_NAME};
use super::doctor::{DOCTOR_SELECTOR, NAMESPACE};
use crate::Result;

/// How long the doctor's pod is watched idle, and how often sampled.
const IDLE: Duration = Duration::from_secs(5 * 60);
const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// `kpm doctor --cluster` with the admin's kubeconfig, as an operator runs
/// it from their own machine: the node is healthy, exit 0.
pub(super) fn doctor_cluster(env: &Env, node: &mut Node) -> Result<String> {
    let kpm = env.target.join("release/kpm");
    let started = Instant::now();
    let output = std::process::Command::new(&kpm)
        .args(["doctor", "--cluster", "-o", "json", "--kubeconfig"])
        .arg(&node.admin_kubeconfig)
        .output()?;
    let took = started.elapsed();
    let report: Value = serde_json::from_slice(&output.stdout).map_err(|err| {
        format!(
            "kpm doctor --cluster printed no JSON ({err}): {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    if output.status.code() != Some(0) {
        return Err(format!("kpm doctor --cluster exited with {}: {report}", output.status).into());
    }
    if !report.to_string().contains(NODE_NAME) {
        return Err(format!("kpm doctor --cluster does not name {NODE_NAME}: {report}").into());
    }
    Ok(format!("exit 0, {NODE_NAME} healthy, in {:.2} s", took.as_secs_f64()))
}

/// The doctor's pod over five idle minutes, from the kubelet's
/// `/stats/summary` (through the API server): its CPU and working set,
/// against the DaemonSet's requests.
pub(super) fn doctor_footprint(_env: &Env, node: &mut Node) -> Result<String> {
    let doctor = node.pod(NAMESPACE, DOCTOR_SELECTOR)?;
    let pod = doctor["metadata"]["name"].as_str().ok_or("no doctor pod")?.to_owned();
    let requests = &doctor["spec"]["containers"][0]["resources"]["requests"];
    let (mut cpu, mut memory) = (Vec::new(), Vec::new());
    let end = Instant::now() + IDLE;
    while Instant::now() < end {
        std::thread::sleep(SAMPLE_EVERY);
        let summary = node.api.get(&format!("/api/v1/nodes/{NODE_NAME}/proxy/stats/summary"))?;
        let Some(stats) = summary["pods"]
            .as_array()
            .and_then(|pods| pods.iter().find(|p| p["podRef"]["name"] == pod.as_str()))
        else {
            continue;
        };
        if let Some(nanocores) = stats["cpu"]["usageNanoCores"].as_f64() {
            cpu.push(nanocores / 1e6);
        }
        if let Some(bytes) = stats["memory"]["workingSetBytes"].as_f64() {
            memory.push(bytes / f64::from(1 << 20));
        }
    }
    if cpu.is_empty() || memory.is_empty() {
        return Err(format!("/stats/summary never had pod {pod}").into());
    }
    let range = |values: &[f64]| {
        let max = values.iter().copied().fold(f64::MIN, f64::max);
        let min = values.iter().copied().fold(f64::MAX, f64::min);
        (min, max)
    };
    let ((cpu_min, cpu_max), (mem_min, mem_max)) = (range(&cpu), range(&memory));
    Ok(format!(
        "{} samples over {} min: CPU {cpu_min:.2}–{cpu_max:.2} millicores (request {}), working set {mem_min:.1}–{mem_max:.1} MiB (request {})",
        cpu.len(),
        IDLE.as_secs() / 60,
        requests["cpu"].as_str().unwrap_or("none"),
        requests["memory"].as_str().unwrap_or("none"),
    ))
}
