//! `cluster` and `footprint`: the fleet view from outside the node, and
//! what the doctor's pod costs the node while nothing happens.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::super::node::Node;
use super::super::{Env, NODE_NAME};
use super::doctor::{DOCTOR_SELECTOR, NAMESPACE};
use crate::command::Result;

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
    #[allow(clippy::cast_precision_loss)] // 30 samples.
    let cpu_mean = cpu.iter().sum::<f64>() / cpu.len() as f64;
    let (cpu_request, memory_request) =
        (requests["cpu"].as_str().unwrap_or("none"), requests["memory"].as_str().unwrap_or("none"));
    let measured = format!(
        "{} samples over {} min: CPU {cpu_min:.2}–{cpu_max:.2} millicores, {cpu_mean:.2} on \
         average (request {cpu_request}), working set {mem_min:.1}–{mem_max:.1} MiB (request \
         {memory_request})",
        cpu.len(),
        IDLE.as_secs() / 60,
    );
    // A request is what the scheduler sets aside: the CPU is held to it on
    // average (a pass of the doctor is a short peak), the memory at most.
    let within = millicores(cpu_request).is_some_and(|request| cpu_mean <= request)
        && mebibytes(memory_request).is_some_and(|request| mem_max <= request);
    if within { Ok(measured) } else { Err(format!("beyond the requests: {measured}").into()) }
}

/// A CPU quantity in millicores (`5m`, `1`, `0.5`), as the doctor's
/// DaemonSet writes its request.
fn millicores(quantity: &str) -> Option<f64> {
    match quantity.strip_suffix('m') {
        Some(milli) => milli.parse().ok(),
        None => quantity.parse::<f64>().ok().map(|cores| cores * 1000.0),
    }
}

/// A memory quantity in MiB (`16Mi`, `512Ki`, `1Gi`).
fn mebibytes(quantity: &str) -> Option<f64> {
    [("Ki", 1.0 / 1024.0), ("Mi", 1.0), ("Gi", 1024.0)].iter().find_map(|(unit, factor)| {
        quantity.strip_suffix(unit).and_then(|n| n.parse::<f64>().ok()).map(|n| n * factor)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_in_the_units_they_are_written_in() {
        assert_eq!(millicores("5m"), Some(5.0));
        assert_eq!(millicores("0.5"), Some(500.0));
        assert_eq!(millicores("none"), None);
        assert_eq!(mebibytes("16Mi"), Some(16.0));
        assert_eq!(mebibytes("512Ki"), Some(0.5));
        assert_eq!(mebibytes("1Gi"), Some(1024.0));
        assert_eq!(mebibytes("16"), None);
    }
}
