//! The `fleet-scale` scenario: `kpm doctor --cluster` over 20,000 Nodes
//! (as many as a large managed cluster), each with its doctor's condition
//! and `KubeletPluginReport` but for a few without a doctor and a few whose
//! doctor writes its condition only, 20,000 `CSINodes` and 80,000
//! `ResourceSlices` on the real kube-apiserver; its wall time and peak RSS
//! are printed (a timed scenario, not a test: the targets are 3 s and
//! 150 MB).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Cluster;
use crate::Result;
use crate::kube_e2e::api::{Api, CSIDRIVERS, CSINODES, REPORTS, SLICES, slice};
use crate::kube_e2e::{ADMIN_TOKEN, Env};

const NODES: usize = 20_000;
const SLICES_PER_NODE: usize = 4;
/// Threads creating the objects.
const WRITERS: usize = 8;

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
        "created {NODES} Nodes with their doctors' conditions and reports, {NODES} CSINodes and {} ResourceSlices in {:?}",
        NODES * SLICES_PER_NODE,
        started.elapsed()
    );

    let admin = cluster.kubeconfig("admin-kubeconfig", ADMIN_TOKEN)?;
    for run in 1..=3 {
        let (took, pages, bytes) = serve_lists(&cluster.api.as_token(ADMIN_TOKEN))?;
        eprintln!(
            "the API server alone, run {run}: the same five lists, {pages} pages of {PAGE_SIZE}, \
             {:.1} MB read and scanned in {took:?}",
            f64::from(u32::try_from(bytes).unwrap_or(u32::MAX)) / 1e6
        );
    }
    for run in 1..=3 {
        let started = Instant::now();
        let mut child = Command::new(&env.kpm)
            .args(["doctor", "--cluster", "-o", "json", "--kubeconfig"])
            .arg(&admin)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let status = format!("/proc/{}/status", child.id());
        let schedstat = format!("/proc/{}/schedstat", child.id());
        let (mut peak_kib, mut cpu_ns) = (0_u64, 0_u64);
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let reader = std::thread::spawn(move || std::io::read_to_string(stdout));
        // VmHWM is the peak resident size so far; read until the process ends.
        while child.try_wait()?.is_none() {
            if let Some(kib) = std::fs::read_to_string(&status).ok().as_deref().and_then(hwm_kib) {
                peak_kib = peak_kib.max(kib);
            }
            // The first field of schedstat is the time on a CPU, in ns.
            if let Some(ns) = std::fs::read_to_string(&schedstat)
                .ok()
                .and_then(|text| text.split_whitespace().next()?.parse().ok())
            {
                cpu_ns = cpu_ns.max(ns);
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
            "kpm doctor --cluster, run {run}: {nodes} nodes judged in {took:?} ({:?} of it on a \
             CPU), peak RSS {:.1} MB",
            Duration::from_nanos(cpu_ns),
            f64::from(u32::try_from(peak_kib).unwrap_or(u32::MAX)) / 1024.0
        );
        if nodes < NODES {
            return Err(format!("kpm doctor --cluster saw {nodes} nodes, not {NODES}").into());
        }
        let from = |source: &str| {
            fleet["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| n["source"] == source)
                .count()
        };
        // 1 in 50 without a doctor, 1 in 50 whose doctor writes no report.
        let (reports, conditions) = (from("report"), from("condition"));
        if reports != NODES - 2 * NODES / 50 || conditions != NODES / 50 {
            return Err(format!(
                "{reports} nodes read from their reports and {conditions} from their conditions"
            )
            .into());
        }
    }
    Ok(())
}

/// Node `fleet-scale-N` with a condition (1 in 10 failing, 1 in 50 without
/// a doctor) and its doctor's report (but 1 in 50 whose doctor writes none),
/// its CSINode (1 in 100 without the driver) and its slices.
fn create_node_objects(api: &Api, n: usize) -> Result {
    let name = format!("fleet-scale-{n:05}");
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
        CSINODES,
        &json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": name}, "spec": {"drivers": drivers}}),
    )?;
    for index in 0..SLICES_PER_NODE {
        api.post(SLICES, &slice(&format!("{name}-{index}"), "gpu.example.com", &name, 4))?;
    }
    if n % 50 != 7 && n % 50 != 9 {
        create_report(api, &name, n % 10 == 3, &now)?;
    }
    Ok(())
}

/// Node `name`'s `KubeletPluginReport` as its doctor writes it: created, then
/// its status (a subresource, which a create leaves out).
fn create_report(api: &Api, name: &str, failing: bool, now: &str) -> Result {
    api.post(
        &REPORTS,
        &json!({"apiVersion": "doctor.kpm.io/v1alpha1", "kind": "KubeletPluginReport",
            "metadata": {"name": name}, "spec": {"nodeName": name}}),
    )?;
    let registry = "/var/lib/kubelet/plugins_registry";
    let entry = |socket: &str, name: Option<&str>, verdict: &str, reason: &str| {
        json!({"socket": format!("{registry}/{socket}"), "type": "CSIPlugin", "name": name,
               "verdict": verdict, "reason": reason, "since": now})
    };
    let (health, reason, csi) = if failing {
        let refused = format!("dial {registry}/csi.example.com-reg.sock: Connection refused");
        ("Failing", "Stale", entry("csi.example.com-reg.sock", None, "stale", &refused))
    } else {
        let ok = entry("csi.example.com-reg.sock", Some("csi.example.com"), "ok", "registered");
        ("Healthy", "PluginsHealthy", ok)
    };
    let dra = entry("gpu.example.com-reg.sock", Some("gpu.example.com"), "ok", "registered");
    let status = json!({"status": {
        "health": health, "reason": reason,
        "kubelet": {"rootDir": "/var/lib/kubelet", "foundBy": "the running kubelet, pid 1042",
                    "version": "v1.36.2"},
        "counts": {"plugins": 2, "failing": u32::from(failing), "omitted": 0},
        "plugins": [csi, dra], "findings": [],
        "heartbeatTime": now, "doctorVersion": "0.1.0",
    }});
    let (code, body) =
        api.request("PATCH", &format!("{}/{name}/status", *REPORTS), Some(&status))?;
    if !(200..300).contains(&code) {
        return Err(format!("PATCH {}/{name}/status: {code} {}", *REPORTS, body["message"]).into());
    }
    Ok(())
}

/// The page size `kpm doctor --cluster` lists with by default.
const PAGE_SIZE: usize = 500;

/// The five lists `kpm doctor --cluster` reads, paged as it pages them by
/// default and each in a thread of its own, every body read and scanned
/// but nothing kept: what serving them costs the API server, beside what
/// the doctor's read costs. Returns the time, the pages and the bytes.
fn serve_lists(api: &Api) -> Result<(Duration, usize, usize)> {
    #[derive(serde::Deserialize)]
    struct Page {
        metadata: PageMeta,
        #[serde(rename = "items")]
        _items: serde::de::IgnoredAny,
    }
    #[derive(serde::Deserialize)]
    struct PageMeta {
        #[serde(rename = "continue", default)]
        continue_token: Option<String>,
    }
    let started = Instant::now();
    let lists = [REPORTS.as_str(), "/api/v1/nodes", CSIDRIVERS, CSINODES, SLICES];
    let counts = std::thread::scope(|scope| {
        let readers: Vec<_> = lists
            .iter()
            .map(|list| {
                scope.spawn(move || -> std::result::Result<(usize, usize), String> {
                    let (mut pages, mut bytes, mut token) = (0, 0, None::<String>);
                    loop {
                        let path = match &token {
                            None => format!("{list}?limit={PAGE_SIZE}"),
                            Some(token) => format!("{list}?limit={PAGE_SIZE}&continue={token}"),
                        };
                        let (code, text) = api
                            .get_text(&path, "application/json")
                            .map_err(|err| format!("GET {path}: {err}"))?;
                        if code != 200 {
                            return Err(format!("GET {path}: {code}"));
                        }
                        let page: Page = serde_json::from_str(&text)
                            .map_err(|err| format!("GET {path}: {err}"))?;
                        pages += 1;
                        bytes += text.len();
                        match page.metadata.continue_token.filter(|token| !token.is_empty()) {
                            Some(next) => token = Some(next),
                            None => return Ok((pages, bytes)),
                        }
                    }
                })
            })
            .collect();
        readers
            .into_iter()
            .map(|reader| reader.join().map_err(|_| "a reader panicked".to_owned())?)
            .collect::<std::result::Result<Vec<_>, String>>()
    })?;
    let took = started.elapsed();
    Ok((took, counts.iter().map(|c| c.0).sum(), counts.iter().map(|c| c.1).sum()))
}

/// `VmHWM` of a `/proc/PID/status`, in KiB.
fn hwm_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
