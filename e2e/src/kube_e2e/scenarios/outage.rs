//! The API server away: `apiserver-down`, plugins register while it is
//! stopped and everything converges once it is back; `outage` (issue 43),
//! plugins of every kind come and go while it is killed, and within 10 s of
//! its return every object is what the kubelet's rules say, then an idle
//! minute without a write.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Cluster, plugin};
use crate::command::Result;
use crate::kube_e2e::api::{Api, create_slice, csinode_driver, node_ids, slices};
use crate::kube_e2e::{
    CONVERGE_TIMEOUT, DRA_GRACE_SECS, Env, KPM_USER, STEP_TIMEOUT, STOP_TIMEOUT,
};
use crate::scenario::{Process, RunningKpm, wait_for, wait_until};

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

/// How long the API server stays killed.
const OUTAGE: Duration = Duration::from_secs(20);
/// How long after `/readyz` answers again every object must be right.
const CONVERGE_WITHIN: Duration = Duration::from_secs(10);
/// When in the outage the GPU device plugin stops: late, so that its grace
/// runs on past the API server's return.
const GPU_STOPS_AFTER: Duration = Duration::from_secs(10);
/// `--device-cleanup-grace` of this scenario's kpm: the GPUs stopped
/// [`GPU_STOPS_AFTER`] into the outage are kept, none allocatable, until
/// well after the [`CONVERGE_WITHIN`] window, so that the window checks one
/// state, and the grace's end is checked on its own.
const GPU_GRACE_SECS: u64 = 30;
/// The idle minute, counted in the audit log.
const IDLE: Duration = Duration::from_secs(60);

/// A CSI driver of the scenario and what it reports on `NodeGetInfo`.
#[derive(Debug)]
struct Csi {
    /// Its name for the logs.
    plugin: &'static str,
    name: &'static str,
    node_id: &'static str,
    /// Its one topology segment.
    topology: (&'static str, &'static str),
    max_volumes: i64,
}

/// Registered before the outage, leaves during it.
const CSI_A: Csi = Csi {
    plugin: "outage-csi-a",
    name: "csi-a.example.com",
    node_id: "node1-a",
    topology: ("topology.example.com/zone", "z1"),
    max_volumes: 3,
};
/// Registered before the outage, stays.
const CSI_B: Csi = Csi {
    plugin: "outage-csi-b",
    name: "csi-b.example.com",
    node_id: "node1-b",
    topology: ("topology.example.com/rack", "r1"),
    max_volumes: 5,
};
/// Registers during the outage: rejected, retried by the executor.
const CSI_C: Csi = Csi {
    plugin: "outage-csi-c",
    name: "csi-c.example.com",
    node_id: "node1-c",
    topology: ("topology.example.com/row", "w1"),
    max_volumes: 7,
};

impl Csi {
    fn start(&self, kpm: &RunningKpm, env: &Env) -> Result<Process> {
        let topology = format!("{}={}", self.topology.0, self.topology.1);
        let max_volumes = self.max_volumes.to_string();
        let args = [
            "--type",
            "CSIPlugin",
            "--name",
            self.name,
            "--node-id",
            self.node_id,
            "--topology",
            &topology,
            "--max-volumes",
            &max_volumes,
        ];
        plugin(kpm, env, self.plugin, &args)
    }

    /// Its CSINode entry, as the kubelet writes it.
    fn entry(&self) -> Value {
        json!({
            "name": self.name,
            "nodeID": self.node_id,
            "topologyKeys": [self.topology.0],
            "allocatable": {"count": self.max_volumes},
        })
    }
}

fn device_plugin(kpm: &RunningKpm, env: &Env, resource: &str, devices: &str) -> Result<Process> {
    let name = format!("outage-{}", resource.rsplit('/').next().unwrap_or(resource));
    plugin(kpm, env, &name, &["--type", "DevicePlugin", "--name", resource, "--devices", devices])
}

fn dra_plugin(kpm: &RunningKpm, env: &Env, driver: &str) -> Result<Process> {
    let name = format!("outage-dra-{}", driver.split('.').next().unwrap_or(driver));
    plugin(kpm, env, &name, &["--type", "DRAPlugin", "--name", driver])
}

/// Whether the example plugin was told that its registration succeeded.
fn told_registered(plugin: &Process) -> Result<bool> {
    Ok(plugin.lines()?.iter().any(|line| line == "registered: true"))
}

/// What the kubelet's rules say Node `node1`, its CSINode and the
/// ResourceSlices hold.
#[derive(Debug, Clone)]
struct Expected {
    /// The registered CSI drivers: the CSINode entries and the node-id
    /// annotation.
    csi: Vec<&'static Csi>,
    /// A CSI driver whose registration may be under way: its entry,
    /// annotation entry and label are not looked at.
    unsure: Option<&'static Csi>,
    /// The Node's labels: those it was created with and every topology
    /// label a driver ever had (the kubelet never removes one).
    labels: BTreeMap<String, String>,
    /// Each device resource's (capacity, allocatable).
    resources: BTreeMap<&'static str, (&'static str, &'static str)>,
    /// The names of all ResourceSlices.
    slices: BTreeSet<String>,
}

impl Expected {
    fn label(&mut self, csi: &Csi) {
        self.labels.insert(csi.topology.0.to_owned(), csi.topology.1.to_owned());
    }

    /// This, and csi-c too if it is `registered`.
    fn with_c(&self, registered: bool) -> Self {
        let mut expected = self.clone();
        if registered {
            expected.csi.push(&CSI_C);
            expected.label(&CSI_C);
        }
        expected
    }

    /// How the API server differs from it; empty when it does not.
    fn differences(&self, api: &Api) -> Result<Vec<String>> {
        let mut differences = Vec::new();
        let node = api.get("/api/v1/nodes/node1")?;
        let unsure = |name: &str| self.unsure.is_some_and(|csi| csi.name == name);

        let (code, csinode) = api.request("GET", "/apis/storage.k8s.io/v1/csinodes/node1", None)?;
        let mut entries: Vec<Value> = match code {
            200 => csinode["spec"]["drivers"].as_array().cloned().unwrap_or_default(),
            404 => Vec::new(),
            _ => return Err(format!("GET CSINode node1: {code} {}", csinode["message"]).into()),
        };
        entries.retain(|entry| !entry["name"].as_str().is_some_and(unsure));
        entries.sort_by_key(|entry| entry["name"].to_string());
        let mut wanted: Vec<Value> = self.csi.iter().map(|csi| csi.entry()).collect();
        wanted.sort_by_key(|entry| entry["name"].to_string());
        if entries != wanted {
            differences.push(format!("CSINode drivers {entries:?}, want {wanted:?}"));
        }

        let mut ids = node_ids(&node)?;
        if let (Some(ids), Some(csi)) = (ids.as_object_mut(), self.unsure) {
            ids.remove(csi.name);
        }
        let wanted: serde_json::Map<String, Value> =
            self.csi.iter().map(|csi| (csi.name.to_owned(), json!(csi.node_id))).collect();
        if ids != Value::Object(wanted.clone()) {
            differences.push(format!("node-id annotation {ids}, want {}", Value::Object(wanted)));
        }

        let mut labels: BTreeMap<String, String> =
            serde_json::from_value(node["metadata"]["labels"].clone()).unwrap_or_default();
        let mut wanted = self.labels.clone();
        if let Some(csi) = self.unsure {
            labels.remove(csi.topology.0);
            wanted.remove(csi.topology.0);
        }
        if labels != wanted {
            differences.push(format!("labels {labels:?}, want {wanted:?}"));
        }

        for (field, index) in [("capacity", 0), ("allocatable", 1)] {
            let shown = node["status"][field].as_object().cloned().unwrap_or_default();
            let wanted: serde_json::Map<String, Value> = self
                .resources
                .iter()
                .map(|(resource, counts)| {
                    let count = if index == 0 { counts.0 } else { counts.1 };
                    ((*resource).to_owned(), json!(count))
                })
                .collect();
            if shown != wanted {
                differences.push(format!(
                    "{field} {}, want {}",
                    Value::Object(shown),
                    Value::Object(wanted)
                ));
            }
        }

        let shown = slices(api)?;
        if shown != self.slices {
            differences.push(format!("ResourceSlices {shown:?}, want {:?}", self.slices));
        }
        Ok(differences)
    }

    /// Polls until the API server holds it, at most until `deadline`;
    /// returns when it first did. A failure shows the last differences.
    fn reached_by(&self, api: &Api, what: &str, deadline: Instant) -> Result<Instant> {
        loop {
            let differences = self.differences(api)?;
            if differences.is_empty() {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                return Err(format!("{what}: not reached: {}", differences.join("; ")).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Issue 43, part 4: with kpm publishing to the real kube-apiserver, two
/// CSI drivers with topology, two device plugins and two DRA drivers
/// register. The API server is killed (SIGKILL); meanwhile a CSI driver
/// leaves and another registers (rejected: the Node update fails, after
/// the kubelet's four attempts), a device plugin stops and another
/// registers, a DRA driver stops and its slice wipe falls due. 20 s later
/// the API server is started again with the same command line; within
/// 10 s of `/readyz` every object is what the kubelet's rules say for the
/// plugins registered then, and stays so: the stopped device plugin's
/// capacity kept, none allocatable, for its grace, and removed after it;
/// the rejected CSI driver published once the executor's retry registers
/// it. Then an idle minute: kpm writes nothing (the audit log).
pub(super) fn outage(env: &Env, cluster: &mut Cluster) -> Result {
    let kpm = cluster.start_kpm_with_device_grace(env, "outage", GPU_GRACE_SECS)?;
    let mut plugins = Plugins {
        csi_a: CSI_A.start(&kpm, env)?,
        csi_b: CSI_B.start(&kpm, env)?,
        gpu: device_plugin(&kpm, env, "example.com/gpu", "3")?,
        nic: device_plugin(&kpm, env, "example.com/nic", "2")?,
        dra_a: dra_plugin(&kpm, env, "a.example.com")?,
        dra_b: dra_plugin(&kpm, env, "b.example.com")?,
    };
    let mut expected = before_the_outage(cluster, &plugins)?;
    let outage = during_the_outage(env, cluster, &kpm, &mut plugins)?;

    // What the kubelet's rules say now: csi-a withdrawn (its label stays),
    // csi-c only if registered, the GPUs within their grace (capacity
    // kept, none allocatable), the FPGAs there, a.example.com's slices of
    // node1 gone.
    expected.csi = vec![&CSI_B];
    expected.resources = [
        ("example.com/gpu", ("3", "0")),
        ("example.com/nic", ("2", "2")),
        ("example.com/fpga", ("2", "2")),
    ]
    .into();
    expected.slices = ["node1-b-0", "node2-a-0"].map(str::to_owned).into();
    after_the_return(&cluster.api, &expected, &outage)?;

    // The rejected driver registers at the executor's next retry.
    wait_until(&format!("{} told registered", CSI_C.name), CONVERGE_TIMEOUT, || {
        told_registered(&outage.csi_c)
    })?;
    let registered = outage.back.elapsed();
    expected.resources.remove("example.com/gpu");
    let last = expected.with_c(true);
    last.reached_by(&cluster.api, "the final state", Instant::now() + STEP_TIMEOUT)?;
    let pending = kpm.list()?["kubernetes"]["pending"].clone();
    if pending.as_array().is_none_or(|pending| !pending.is_empty()) {
        return Err(format!("all published, yet kpm list shows pending: {pending}").into());
    }
    let mut counted: BTreeMap<String, usize> = BTreeMap::new();
    let writes = cluster.writes_by(KPM_USER, outage.audit_from)?;
    for write in &writes {
        *counted.entry(format!("{} {}", write.what, write.code)).or_default() += 1;
    }
    println!(
        "outage: {} registered {} ms after /readyz (the executor's backoff); kpm's writes since the restart: {} {counted:?}",
        CSI_C.name,
        registered.as_millis(),
        writes.len()
    );

    idle_minute(cluster, &last)?;
    drop((plugins, outage));
    kpm.stop()
}

/// The plugins registered before the outage.
struct Plugins {
    csi_a: Process,
    csi_b: Process,
    gpu: Process,
    nic: Process,
    dra_a: Process,
    dra_b: Process,
}

/// Waits for the plugins' registrations, creates the DRA drivers'
/// ResourceSlices (as their controllers would, as admin) and waits until
/// the API server holds what kpm publishes for them.
fn before_the_outage(cluster: &Cluster, plugins: &Plugins) -> Result<Expected> {
    let Plugins { csi_a, csi_b, gpu, nic, dra_a, dra_b } = plugins;
    for plugin in [csi_a, csi_b, gpu, nic, dra_a, dra_b] {
        plugin.wait_for_line("registered", STEP_TIMEOUT, |line| line == "registered: true")?;
    }
    let api = &cluster.api;
    create_slice(api, "node1-a-0", "a.example.com", "node1", 2)?;
    create_slice(api, "node1-a-1", "a.example.com", "node1", 2)?;
    create_slice(api, "node1-b-0", "b.example.com", "node1", 1)?;
    create_slice(api, "node2-a-0", "a.example.com", "node2", 1)?;
    let mut expected = Expected {
        csi: vec![&CSI_A, &CSI_B],
        unsure: None,
        labels: [("kubernetes.io/hostname", "node1"), ("kubernetes.io/os", "linux")]
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .into(),
        resources: [("example.com/gpu", ("3", "3")), ("example.com/nic", ("2", "2"))].into(),
        slices: ["node1-a-0", "node1-a-1", "node1-b-0", "node2-a-0"].map(str::to_owned).into(),
    };
    expected.label(&CSI_A);
    expected.label(&CSI_B);
    expected.reached_by(api, "before the outage", Instant::now() + STEP_TIMEOUT)?;
    eprintln!(
        "before the outage: CSINode {} and {}, labels zone and rack, gpu 3/3, nic 2/2, 4 ResourceSlices",
        CSI_A.name, CSI_B.name
    );
    Ok(expected)
}

/// Within [`CONVERGE_WITHIN`] of `/readyz` the API server holds
/// `expected` (with csi-c if it is registered by then), and keeps it until
/// the GPUs' grace ends (csi-c may register meanwhile); then the GPUs go.
fn after_the_return(api: &Api, expected: &Expected, outage: &Outage) -> Result {
    let deadline = outage.back + CONVERGE_WITHIN;
    let converged = loop {
        // Read before the objects: a driver told it registered has its
        // entries written already.
        let now = expected.with_c(told_registered(&outage.csi_c)?);
        let differences = now.differences(api)?;
        if differences.is_empty() {
            break outage.back.elapsed();
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{CONVERGE_WITHIN:?} after /readyz, the API server differs: {}",
                differences.join("; ")
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let c_then = if told_registered(&outage.csi_c)? { "registered" } else { "not registered yet" };
    println!(
        "outage: every object converged {} ms after /readyz (within {CONVERGE_WITHIN:?}; {} {c_then})",
        converged.as_millis(),
        CSI_C.name
    );

    let grace_end = outage.gpu_stopped + Duration::from_secs(GPU_GRACE_SECS);
    let mut holding = expected.clone();
    holding.unsure = Some(&CSI_C);
    let mut checks = 0;
    while Instant::now() + Duration::from_secs(1) < grace_end {
        let differences = holding.differences(api)?;
        if !differences.is_empty() {
            return Err(format!(
                "within the GPUs' grace ({:?} before its end), the API server differs: {}",
                grace_end.saturating_duration_since(Instant::now()),
                differences.join("; ")
            )
            .into());
        }
        checks += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "the GPUs kept (capacity 3, allocatable 0) through their grace: {checks} reads, all right"
    );
    holding.resources.remove("example.com/gpu");
    let removed =
        holding.reached_by(api, "the GPUs removed after their grace", grace_end + STEP_TIMEOUT)?;
    println!(
        "outage: example.com/gpu removed {} ms after its grace ended ({GPU_GRACE_SECS}s from its plugin's stop)",
        removed.saturating_duration_since(grace_end).as_millis()
    );
    Ok(())
}

/// An idle minute: nothing changes, `last` stays, and kpm writes nothing.
fn idle_minute(cluster: &Cluster, last: &Expected) -> Result {
    let from = cluster.audit_offset();
    std::thread::sleep(IDLE);
    last.reached_by(&cluster.api, "after the idle minute", Instant::now())?;
    let idle: Vec<String> = cluster
        .writes_by(KPM_USER, from)?
        .iter()
        .map(|write| format!("{} {} ({})", write.what, write.name, write.code))
        .collect();
    println!("outage: idle minute: {} write(s) by {KPM_USER}", idle.len());
    if !idle.is_empty() {
        return Err(format!("kpm wrote during the idle minute: {idle:?}").into());
    }
    Ok(())
}

/// What happened during the outage.
struct Outage {
    /// The CSI driver that registered meanwhile.
    csi_c: Process,
    /// The device plugin that registered meanwhile, kept running.
    _fpga: Process,
    /// When the GPU device plugin stopped.
    gpu_stopped: Instant,
    /// When `/readyz` answered again.
    back: Instant,
    /// The audit log's length before the restart.
    audit_from: u64,
}

/// The outage: kube-apiserver killed, plugins come and go, started again
/// after [`OUTAGE`].
fn during_the_outage(
    env: &Env,
    cluster: &mut Cluster,
    kpm: &RunningKpm,
    plugins: &mut Plugins,
) -> Result<Outage> {
    let Plugins { csi_a, gpu, dra_a, .. } = plugins;
    cluster.kill_apiserver()?;
    let killed = Instant::now();
    eprintln!("kube-apiserver killed (SIGKILL)");
    dra_a.stop(STOP_TIMEOUT)?;
    csi_a.stop(STOP_TIMEOUT)?;
    let csi_c = CSI_C.start(kpm, env)?;
    let fpga = device_plugin(kpm, env, "example.com/fpga", "2")?;
    fpga.wait_for_line("registered", STEP_TIMEOUT, |line| line == "registered: true")?;
    let reason = wait_for(&format!("{} rejected", CSI_C.name), STEP_TIMEOUT, || {
        Ok(csi_c
            .lines()?
            .iter()
            .find_map(|line| line.strip_prefix("registered: false: ").map(str::to_owned)))
    })?;
    if !reason.to_lowercase().contains("node") {
        return Err(format!("the rejection does not name the Node update: {reason}").into());
    }
    eprintln!(
        "{} left, a.example.com stopped, example.com/fpga registered; {} rejected: {reason}",
        CSI_A.name, CSI_C.name
    );
    // The wipe falls due DRA_GRACE_SECS after a.example.com went.
    wait_until("kpm lists a.example.com's wipe pending", STEP_TIMEOUT, || {
        let pending = kpm.list()?["kubernetes"]["pending"].clone();
        Ok(pending.as_array().into_iter().flatten().any(|publication| {
            publication["kind"] == "ResourceSlice" && publication["name"] == "a.example.com"
        }))
    })?;
    eprintln!(
        "a.example.com's slice wipe due {:?} into the outage (grace {DRA_GRACE_SECS}s)",
        killed.elapsed()
    );
    std::thread::sleep(GPU_STOPS_AFTER.saturating_sub(killed.elapsed()));
    gpu.stop(STOP_TIMEOUT)?;
    let gpu_stopped = Instant::now();
    eprintln!("example.com/gpu's plugin stopped {:?} into the outage", killed.elapsed());
    std::thread::sleep(OUTAGE.saturating_sub(killed.elapsed()));
    let pending = kpm.list()?["kubernetes"]["pending"].clone();
    let shown: Vec<String> = pending
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| format!("{} {}: {}", p["kind"], p["name"], p["want"]))
        .collect();
    eprintln!("after {:?}, kpm list shows pending: {shown:#?}", killed.elapsed());
    let audit_from = cluster.audit_offset();
    let back = cluster.start_apiserver(env)?;
    eprintln!("kube-apiserver started again, {:?} after the kill", back - killed);
    Ok(Outage { csi_c, _fpga: fpga, gpu_stopped, back, audit_from })
}
