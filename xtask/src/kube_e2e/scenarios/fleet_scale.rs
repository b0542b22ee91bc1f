//! The `fleet-scale` scenario: `kpm doctor --cluster` over 5000 Nodes with
//! the doctor's condition, 5000 `CSINodes` and 20,000 `ResourceSlices` on the
//! real kube-apiserver; its wall time and peak RSS are printed (a timed
//! scenario, not a test: the targets are 3 s and 150 MB).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Cluster;
use crate::Result;
use crate::kube_e2e::api::{Api, CSIDRIVERS, SLICES, slice};
use crate::kube_e2e::{ADMIN_TOKEN, Env};

const NODES: usize = 5000;
const SLICES_PER_NODE: usize = 4;
/// Threads creating the objects.
const WRITERS: usize = 4;

pub(super) fn fleet_scale(env: &Env, cluster: &mut Cluster) -> Result {
    let started = Instant::now();
    cluster.api.post(
        CSIDRIVERS,
        &json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": "csi.example.com"}, "spec": {}}),
    )?;
    let api = &cluster.api;
    std::thread::scope(|scope| -> Result {
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let api = api.as_token(ADMIN_TOKEN);
                scope.spawn(move || -> std::result::Result<(), String> {
                    for n in (writer..NODES).step_by(WRITERS) {
                        create_node_objects(&api, n).map_err(|err| err.to_string())?;
                    }
                    Ok(())
                })
            })
            .collect();
        for writer in writers {
            writer.join().map_err(|_| "a writer panicked")??;
        }
        Ok(())
    })?;
    eprintln!(
        "created {NODES} Nodes with the doctor's condition, {NODES} CSINodes and {} ResourceSlices in {:?}",
        NODES * SLICES_PER_NODE,
        started.elapsed()
    );

    let admin = cluster.kubeconfig("admin-kubeconfig", ADMIN_TOKEN)?;
    for run in 1..=3 {
        let started = Instant::now();
        let mut child = Command::new(&env.kpm)
            .args(["doctor", "--cluster", "-o", "json", "--kubeconfig"])
            .arg(&admin)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let status = format!("/proc/{}/status", child.id());
        let mut peak_kib = 0_u64;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let reader = std::thread::spawn(move || std::io::read_to_string(stdout));
        // VmHWM is the peak resident size so far; read until the process ends.
        while child.try_wait()?.is_none() {
            if let Some(kib) = std::fs::read_to_string(&status).ok().as_deref().and_then(hwm_kib) {
                peak_kib = peak_kib.max(kib);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let took = started.elapsed();
        let output = reader.join().map_err(|_| "the reader panicked")??;
        let fleet: Value = serde_json::from_str(&output)
            .map_err(|err| format!("kpm doctor --cluster -o json: {err}"))?;
        // The cluster's own node1 and node2 come too.
        let nodes = fleet["nodes"].as_array().map_or(0, Vec::len);
        eprintln!(
            "kpm doctor --cluster, run {run}: {nodes} nodes judged in {took:?}, peak RSS {:.1} MB",
            f64::from(u32::try_from(peak_kib).unwrap_or(u32::MAX)) / 1024.0
        );
        if nodes < NODES {
            return Err(format!("kpm doctor --cluster saw {nodes} nodes, not {NODES}").into());
        }
    }
    Ok(())
}

/// Node `fleet-scale-N` with a condition (1 in 10 failing, 1 in 50 without
/// a doctor), its CSINode (1 in 100 without the driver) and its slices.
fn create_node_objects(api: &Api, n: usize) -> Result {
    let name = format!("fleet-scale-{n:04}");
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let condition = match n % 10 {
        _ if n % 50 == 7 => None,
        3 => Some(json!({"type": "KubeletPluginsHealthy", "status": "False", "reason": "Stale",
            "message": "1 failing: csi.example.com-reg.sock (stale): dial: Connection refused",
            "lastHeartbeatTime": now, "lastTransitionTime": now})),
        _ => Some(
            json!({"type": "KubeletPluginsHealthy", "status": "True", "reason": "PluginsHealthy",
            "message": "all 2 plugin sockets of the node are ok",
            "lastHeartbeatTime": now, "lastTransitionTime": now}),
        ),
    };
    api.post(
        "/api/v1/nodes",
        &json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110", "vendor.com/gpu": "2"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", "vendor.com/gpu": "2"},
            "conditions": condition.into_iter().collect::<Vec<_>>(),
        }}),
    )?;
    let drivers = if n % 100 == 5 {
        json!([])
    } else {
        json!([{"name": "csi.example.com", "nodeID": format!("{name}-id"), "topologyKeys": null}])
    };
    api.post(
        "/apis/storage.k8s.io/v1/csinodes",
        &json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": name}, "spec": {"drivers": drivers}}),
    )?;
    for index in 0..SLICES_PER_NODE {
        api.post(SLICES, &slice(&format!("{name}-{index}"), "gpu.example.com", &name, 4))?;
    }
    Ok(())
}

/// `VmHWM` of a `/proc/PID/status`, in KiB.
fn hwm_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
