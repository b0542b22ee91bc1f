//! The `fleet` scenario: `kpm doctor --watch` on 20 simulated nodes against
//! the real kube-apiserver, then `kpm doctor --cluster` over them.
//!
//! Each node has a root of its own, a `kpm run` as its kubelet (it fills
//! the node's CSINode), a CSI driver and a doctor publishing with the
//! doctor's service account (`deploy/doctor/daemonset.yaml`'s RBAC).
//! Checked through the API server, as admin, and its audit log:
//! 1. failures show with the right verdict within 5 s: a stale socket (a
//!    driver killed), a rejected version, a driver missing from CSINode (its
//!    kubelet down);
//! 2. each recovers within 5 s of its fix;
//! 3. over an idle minute the doctors write nothing but their heartbeats;
//! 4. a kubelet-style status patch between two doctor writes leaves both
//!    conditions;
//! 5. the API server killed and started again: a failure that began
//!    meanwhile is published, its Event included;
//! 6. `kpm doctor --cluster` shows the fleet, read from the doctors'
//!    `KubeletPluginReports`: each written beside its condition, owned by
//!    its Node, with the failing plugin's verdict, and shown by the API
//!    server's own printer columns (`kubectl get kubeletpluginreports`);
//! 7. as the fleet reader, a driver missing on a tainted node is traced to
//!    its DaemonSet and the taint named (`fleet_daemon_set.rs`).

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Cluster;
use crate::command::Result;
use crate::kube_e2e::api::{Api, REPORTS, report};
use crate::kube_e2e::{ADMIN_TOKEN, DOCTOR_TOKEN, DOCTOR_USER, Env, KPM_TOKEN, STEP_TIMEOUT};
use crate::scenario::{Process, RunningKpm, wait_for, wait_until};

/// Nodes of the fleet.
const NODES: usize = 20;
/// The doctors' heartbeat, short so that an idle minute holds some.
const HEARTBEAT_SECS: u32 = 20;
const HEARTBEAT: Duration = Duration::from_secs(HEARTBEAT_SECS as u64);
/// How long after a change a failure or a recovery must show on the Node.
const WITHIN: Duration = Duration::from_secs(5);
/// The condition the doctors publish.
const CONDITION: &str = "KubeletPluginsHealthy";
/// The driver every node runs.
const DRIVER: &str = "csi.example.com";

/// One simulated node.
struct Node {
    name: String,
    root: PathBuf,
    kubelet: Option<RunningKpm>,
    plugins: BTreeMap<&'static str, Process>,
    doctor: Process,
}

pub(super) fn fleet(env: &Env, cluster: &mut Cluster) -> Result {
    let kpm_config = cluster.kubeconfig("kubeconfig", KPM_TOKEN)?;
    let doctor_config = cluster.kubeconfig("doctor-kubeconfig", DOCTOR_TOKEN)?;
    let mut nodes = Vec::new();
    for n in 1..=NODES {
        let name = format!("fleet-{n:02}");
        cluster.create_node(&name)?;
        let root = cluster.dir.path().join(&name);
        fs::create_dir_all(root.join("plugins_registry"))?;
        let kubelet = start_kubelet(env, &root, &name, &kpm_config)?;
        let mut node = Node {
            doctor: start_doctor(env, cluster, &root, &name, &doctor_config, HEARTBEAT, &[])?,
            name,
            root,
            kubelet: Some(kubelet),
            plugins: BTreeMap::new(),
        };
        node.plugin(env, DRIVER, &[])?;
        nodes.push(node);
    }
    let api = &cluster.api;
    wait_until("every Node's condition True", Duration::from_secs(90), || {
        Ok(nodes.iter().all(|node| condition(api, &node.name).is_ok_and(|c| c["status"] == "True")))
    })?;
    eprintln!("{NODES} nodes, each with kpm run, {DRIVER} and kpm doctor --watch: all True");
    reports_owned_and_healthy(cluster, &nodes)?;
    fail_and_recover(env, cluster, &mut nodes, &kpm_config)?;
    idle_minute(cluster)?;
    kubelet_between_writes(cluster, &nodes[0].name)?;
    apiserver_restart(env, cluster, &mut nodes[8])?;
    fleet_view(env, cluster, &nodes[8].name)?;
    super::fleet_daemon_set::daemon_set_named(env, cluster)
}

/// Three ways to fail, on three nodes, each fixed.
fn fail_and_recover(
    env: &Env,
    cluster: &Cluster,
    nodes: &mut [Node],
    kpm_config: &std::path::Path,
) -> Result {
    let api = &cluster.api;
    let started = Instant::now();
    nodes[2].plugins.get_mut(DRIVER).ok_or("no driver")?.kill();
    let stale = expect_reason(api, &nodes[2].name, "Stale", started)?;
    let started = Instant::now();
    nodes[4].plugin(env, "old.example.com", &["--version", "0.3.0"])?;
    let rejected = expect_reason(api, &nodes[4].name, "Rejected", started)?;
    nodes[6].kubelet.take().ok_or("no kubelet")?.stop()?;
    let started = Instant::now();
    nodes[6].plugin(env, "late.example.com", &[])?;
    let missing = expect_reason(api, &nodes[6].name, "NotRegistered", started)?;
    eprintln!(
        "failures published: stale after {stale:?}, rejected after {rejected:?}, not-registered after {missing:?}"
    );
    for (node, reason) in [(2, "Stale"), (4, "Rejected"), (6, "NotRegistered")] {
        wait_for(&format!("a {reason} Event on {}", nodes[node].name), STEP_TIMEOUT, || {
            Ok(events(api, &nodes[node].name)?.into_iter().find(|e| e["reason"] == reason))
        })?;
    }
    // The reports say the same, typed.
    let failing = [
        (2, "stale", None),
        (4, "rejected", Some("old.example.com")),
        (6, "not-registered", Some("late.example.com")),
    ];
    for (node, verdict, name) in failing {
        let node = &nodes[node].name;
        wait_for(&format!("{node}'s report lists a {verdict} plugin"), STEP_TIMEOUT, || {
            let Some(report) = report(api, node)? else { return Ok(None) };
            let status = &report["status"];
            let entry = status["plugins"].as_array().into_iter().flatten().find(|entry| {
                entry["verdict"] == verdict && name.is_none_or(|name| entry["name"] == name)
            });
            Ok(entry.filter(|_| status["health"] == "Failing").cloned())
        })?;
    }
    eprintln!(
        "kubectl get kubeletpluginreports, as the API server prints it:\n{}",
        api.get_table(&REPORTS)?
    );

    // 2. Each fixed.
    let started = Instant::now();
    fs::remove_file(nodes[2].root.join(format!("plugins_registry/{DRIVER}-reg.sock")))?;
    nodes[2].plugin(env, DRIVER, &[])?;
    let fixed_stale = expect_status(api, &nodes[2].name, "True", started)?;
    let started = Instant::now();
    nodes[4].plugins.remove("old.example.com").ok_or("no old driver")?.stop(STEP_TIMEOUT)?;
    let fixed_rejected = expect_status(api, &nodes[4].name, "True", started)?;
    let started = Instant::now();
    nodes[6].kubelet = Some(start_kubelet(env, &nodes[6].root, &nodes[6].name, kpm_config)?);
    let fixed_missing = expect_status(api, &nodes[6].name, "True", started)?;
    eprintln!(
        "recovered: stale after {fixed_stale:?}, rejected after {fixed_rejected:?}, not-registered after {fixed_missing:?}"
    );
    wait_for(&format!("a PluginRecovered Event on {}", nodes[2].name), STEP_TIMEOUT, || {
        Ok(events(api, &nodes[2].name)?.into_iter().find(|e| e["reason"] == "PluginRecovered"))
    })?;
    Ok(())
}

/// An idle minute (3): the doctors' writes are their heartbeats, no less
/// apart than the heartbeat, and nothing else.
fn idle_minute(cluster: &Cluster) -> Result {
    let from = cluster.audit_offset();
    std::thread::sleep(Duration::from_secs(60));
    let writes = cluster.writes_by(DOCTOR_USER, from)?;
    let mut per_node: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for write in &writes {
        let (what, node) = (&write.what, &write.name);
        if what != "patch nodes/status" && what != "patch kubeletpluginreports/status" {
            return Err(format!("a doctor wrote {what} on {node} during the idle minute").into());
        }
        per_node.entry(format!("{node} {what}")).or_default().push(write.at);
    }
    for (node, times) in &per_node {
        if times.windows(2).any(|pair| pair[1] - pair[0] < f64::from(HEARTBEAT_SECS) - 1.0) {
            return Err(
                format!("{node}'s doctor wrote faster than its heartbeat: {times:?}").into()
            );
        }
    }
    let most = usize::try_from(60 / HEARTBEAT_SECS + 1)?;
    // Each node's condition and report, each at its heartbeat.
    if per_node.len() != 2 * NODES || per_node.values().any(|times| times.len() > most) {
        return Err(format!("heartbeats over the idle minute: {per_node:?}").into());
    }
    eprintln!(
        "idle minute: {} writes by the doctors, all heartbeats (patch nodes/status and kubeletpluginreports/status, {}-{} each a node, >= {HEARTBEAT_SECS}s apart), no Event",
        writes.len(),
        per_node.values().map(Vec::len).min().unwrap_or(0),
        per_node.values().map(Vec::len).max().unwrap_or(0),
    );
    Ok(())
}

/// The kubelet (4) writes Ready between two doctor writes.
fn kubelet_between_writes(cluster: &Cluster, first: &str) -> Result {
    let api = &cluster.api;
    let before = condition(api, first)?["lastHeartbeatTime"].clone();
    kubelet_ready(cluster, first)?;
    wait_until(
        &format!("{first}'s doctor heartbeat after Ready"),
        Duration::from_secs(u64::from(HEARTBEAT_SECS) + 10),
        || Ok(condition(api, first)?["lastHeartbeatTime"] != before),
    )?;
    let conditions = api.get(&format!("/api/v1/nodes/{first}"))?["status"]["conditions"].clone();
    let types: Vec<&str> =
        conditions.as_array().into_iter().flatten().filter_map(|c| c["type"].as_str()).collect();
    if !(types.contains(&"Ready") && types.contains(&CONDITION)) {
        return Err(format!("{first}'s conditions after both wrote: {types:?}").into());
    }
    kubelet_ready(cluster, first)?;
    if condition(api, first)?["status"] != "True" {
        return Err(format!("{first}: the kubelet's patch changed the doctor's condition").into());
    }
    eprintln!(
        "{first}: Ready (kubelet) and {CONDITION} (doctor) both kept across each other's writes"
    );

    Ok(())
}

/// The API server goes (5); a driver fails meanwhile.
fn apiserver_restart(env: &Env, cluster: &mut Cluster, node: &mut Node) -> Result {
    // Killed: with forty clients' watches open, a SIGTERM takes minutes.
    cluster.kill_apiserver()?;
    node.plugins.get_mut(DRIVER).ok_or("no driver")?.kill();
    std::thread::sleep(WITHIN);
    cluster.start_apiserver(env)?;
    let api = &cluster.api;
    let restarted = Instant::now();
    let name = &node.name;
    wait_until(
        &format!("{name}'s Stale published after the restart"),
        Duration::from_secs(150),
        || Ok(condition(api, name).is_ok_and(|c| c["reason"] == "Stale")),
    )?;
    let resumed = restarted.elapsed();
    wait_for(&format!("the Stale Event of {name}"), STEP_TIMEOUT, || {
        Ok(events(api, name)?.into_iter().find(|e| e["reason"] == "Stale"))
    })?;
    eprintln!(
        "kube-apiserver restarted: {name}'s failure published {resumed:?} later, its Event too"
    );
    Ok(())
}

/// The fleet (6) from anywhere with a kubeconfig: cross-checked against
/// every node's objects until the reports agree with them (a report is as
/// of its doctor's last pass: the failing node's kpm deregisters its driver
/// after the pass that found the socket stale, and its doctor's recheck, a
/// second later, doubling, reads the CSINode again), then read from the
/// reports (the real API server's tables).
fn fleet_view(env: &Env, cluster: &Cluster, failing: &str) -> Result {
    let admin = cluster.kubeconfig("admin-kubeconfig", ADMIN_TOKEN)?;
    let run = |extra: &[&str]| {
        let mut command = std::process::Command::new(&env.kpm);
        command.args(["doctor", "--cluster", "--kubeconfig"]).arg(&admin).args(extra);
        command.output()
    };
    let started = Instant::now();
    let mut first_seen = None;
    let checked = wait_for("the reports agreeing with their objects", STEP_TIMEOUT, || {
        let checked: Value =
            serde_json::from_slice(&run(&["-o", "json", "--cross-check"])?.stdout)?;
        let found = checked["disagreements"].as_array().ok_or("no disagreements in the JSON")?;
        if found.is_empty() {
            return Ok(Some(checked));
        }
        first_seen.get_or_insert_with(|| checked["disagreements"].to_string());
        Ok(None)
    })?;
    eprintln!(
        "the cross-check agreed {:?} after {failing}'s failure was published{}",
        started.elapsed(),
        first_seen.map_or_else(String::new, |seen| format!(" (before, one pass old: {seen})"))
    );
    let output = run(&[])?;
    let table = String::from_utf8_lossy(&output.stdout);
    eprintln!("kpm doctor --cluster (exit {}):\n{table}", output.status.code().unwrap_or(-1));
    if output.status.code() != Some(1) || !table.contains(failing) {
        return Err(format!("kpm doctor --cluster does not show {failing}'s failure").into());
    }
    let fleet: Value = serde_json::from_slice(&run(&["-o", "json"])?.stdout)?;
    let node = fleet["nodes"].as_array().into_iter().flatten().find(|n| n["name"] == failing);
    let node = node.ok_or_else(|| format!("{failing} is not in the fleet's JSON"))?;
    let typed = node["source"] == "report"
        && node["failing_plugins"][0]["verdict"] == "stale"
        && node["failing_plugins"][0]["subject"] == format!("{DRIVER}-reg.sock");
    if !typed {
        return Err(format!("{failing} is not read from its report: {node}").into());
    }
    eprintln!(
        "kpm doctor --cluster -o json: {failing} read from its report: {}",
        node["failing_plugins"]
    );
    eprintln!(
        "kubectl get kubeletpluginreports, as the API server prints it:\n{}",
        cluster.api.get_table(&REPORTS)?
    );
    let csi = fleet["drivers"].as_array().into_iter().flatten().find(|d| d["name"] == DRIVER);
    let on = csi.map(|csi| (csi["registered"].clone(), csi["nodes"].clone()));
    if on != Some((NODES.saturating_sub(1).into(), (NODES + 2).into())) {
        return Err(
            format!("{DRIVER} is not registered on all nodes but {failing}: {csi:?}").into()
        );
    }
    let cost = |fleet: &Value| {
        format!("{} requests, {} bytes", fleet["read"]["requests"], fleet["read"]["bytes"])
    };
    eprintln!(
        "kpm doctor --cluster read {}; with --cross-check {}, no report disagreeing with its objects",
        cost(&fleet),
        cost(&checked)
    );
    Ok(())
}

/// (1, 6) Each doctor's report is there once its condition is True,
/// `Healthy`, and owned by its Node, so that the garbage collector removes
/// it with the Node.
fn reports_owned_and_healthy(cluster: &Cluster, nodes: &[Node]) -> Result {
    let api = &cluster.api;
    for node in nodes {
        let name = &node.name;
        let report = wait_for(&format!("{name}'s report Healthy"), STEP_TIMEOUT, || {
            Ok(report(api, name)?.filter(|r| r["status"]["health"] == "Healthy"))
        })?;
        let uid = api.get(&format!("/api/v1/nodes/{name}"))?["metadata"]["uid"].clone();
        let owner = &report["metadata"]["ownerReferences"][0];
        if owner["kind"] != "Node" || owner["name"] != name.as_str() || owner["uid"] != uid {
            return Err(format!("{name}'s report is not owned by its Node: {owner}").into());
        }
    }
    eprintln!("{NODES} KubeletPluginReports, each Healthy and owned by its Node");
    Ok(())
}

impl Node {
    /// Starts the example CSI plugin `name` in this node's registry.
    fn plugin(&mut self, env: &Env, name: &'static str, extra: &[&str]) -> Result {
        let registry = self.root.join("plugins_registry").display().to_string();
        let node_id = format!("{}-id", self.name);
        let mut args =
            vec!["--dir", &registry, "--type", "CSIPlugin", "--name", name, "--node-id", &node_id];
        args.extend_from_slice(extra);
        let log = |suffix: &str| env.out.join(format!("fleet-{}-{name}.{suffix}", self.name));
        let process = Process::spawn(name, &env.example_plugin, &args, &log("out"), &log("err"))?;
        process.wait_for_line("its socket served", STEP_TIMEOUT, |line| {
            line.starts_with("serving ")
        })?;
        self.plugins.insert(name, process);
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.doctor.stop(STEP_TIMEOUT);
    }
}

pub(super) fn start_kubelet(
    env: &Env,
    root: &std::path::Path,
    node: &str,
    kubeconfig: &std::path::Path,
) -> Result<RunningKpm> {
    let log = env.out.join(format!("fleet-{node}-kpm.log"));
    let kubeconfig = kubeconfig.display().to_string();
    RunningKpm::start(
        &env.kpm,
        root,
        &["--kubeconfig", &kubeconfig, "--node-name", node, "--liveness-period", "1"],
        &log,
    )
}

pub(super) fn start_doctor(
    env: &Env,
    cluster: &Cluster,
    root: &std::path::Path,
    node: &str,
    kubeconfig: &std::path::Path,
    heartbeat: Duration,
    extra: &[&str],
) -> Result<Process> {
    let nowhere = cluster.dir.path().join("no-other-root").display().to_string();
    let (root, kubeconfig) = (root.display().to_string(), kubeconfig.display().to_string());
    let heartbeat = heartbeat.as_secs().to_string();
    let args = [
        "doctor",
        "--watch",
        "--root-dir",
        &root,
        "--other-root",
        &nowhere,
        "--kubeconfig",
        &kubeconfig,
        "--node-name",
        node,
        "--heartbeat",
        &heartbeat,
        "--timeout",
        "2",
    ];
    let args: Vec<&str> = args.iter().chain(extra).copied().collect();
    let log = |suffix: &str| env.out.join(format!("fleet-{node}-doctor.{suffix}"));
    Process::spawn(&format!("doctor {node}"), &env.kpm, &args, &log("out"), &log("err"))
}

/// The doctor's condition on Node `node`.
pub(super) fn condition(api: &Api, node: &str) -> Result<Value> {
    let node_object = api.get(&format!("/api/v1/nodes/{node}"))?;
    node_object["status"]["conditions"]
        .as_array()
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == CONDITION))
        .cloned()
        .ok_or_else(|| format!("Node {node} has no {CONDITION}").into())
}

/// Waits until `node`'s condition has `reason`; how long after `started`.
fn expect_reason(api: &Api, node: &str, reason: &str, started: Instant) -> Result<Duration> {
    wait_until(&format!("{node}: {CONDITION} {reason}"), STEP_TIMEOUT, || {
        Ok(condition(api, node).is_ok_and(|c| c["reason"] == reason))
    })?;
    within(node, reason, started.elapsed())
}

fn expect_status(api: &Api, node: &str, status: &str, started: Instant) -> Result<Duration> {
    wait_until(&format!("{node}: {CONDITION} {status}"), STEP_TIMEOUT, || {
        Ok(condition(api, node).is_ok_and(|c| c["status"] == status))
    })?;
    within(node, status, started.elapsed())
}

fn within(node: &str, what: &str, took: Duration) -> Result<Duration> {
    if took > WITHIN {
        return Err(format!("{node}: {what} showed after {took:?}, not within {WITHIN:?}").into());
    }
    Ok(took)
}

/// The events.k8s.io Events regarding Node `node`.
pub(super) fn events(api: &Api, node: &str) -> Result<Vec<Value>> {
    let list = api.get("/apis/events.k8s.io/v1/namespaces/default/events")?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|event| event["regarding"]["name"] == node)
        .cloned()
        .collect())
}

/// A status patch as the kubelet sends it (strategic merge, field manager
/// `kubelet`): its Ready condition.
fn kubelet_ready(cluster: &Cluster, node: &str) -> Result {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let patch = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    }]}});
    let status = format!("/api/v1/nodes/{node}/status?fieldManager=kubelet");
    let content_type = "application/strategic-merge-patch+json";
    let (code, body) = cluster.api.request_as("PATCH", &status, content_type, Some(&patch))?;
    if !(200..300).contains(&code) {
        return Err(format!("kubelet-style patch of {node}: {code} {}", body["message"]).into());
    }
    Ok(())
}
