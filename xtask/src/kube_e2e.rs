//! `cargo xtask kube-e2e --apiserver BIN --etcd BIN [--manifest FILE] [--only
//! SCENARIO]`: `kpm run` against a real kube-apiserver and etcd on loopback.
//! Without either program it says what it skipped and succeeds; a check that
//! fails names its step, and the logs of every process are in
//! `target/kube-e2e`.
//!
//! Each scenario gets a cluster of its own in `/tmp/kpm-kube-XXXX`: etcd,
//! kube-apiserver with certificates made here (CA, serving certificate for
//! 127.0.0.1 and localhost, service-account key), a static token file with an
//! admin (`system:masters`) and kpm's service account, and RBAC authorization.
//! The `ServiceAccount`, `ClusterRole` and `ClusterRoleBinding` of the manifest
//! (`deploy/daemonset.yaml`) are applied; Nodes `node1` and `node2` are
//! created. `kpm run --node-name node1` talks to the API server as its
//! service account through a kubeconfig, so its RBAC is checked too. Every
//! check reads the API server (as admin), never kpm, except the request
//! count that kpm reports.
//!
//! | scenario | checked through the API server |
//! |---|---|
//! | `cluster` | without kpm: kpm's token may do what kpm needs and nothing else; kube-apiserver restarts on the same etcd with every object kept |
//! | `csi` | a CSI driver's registration fills CSINode `node1` (owned by the Node), the Node's node-id annotation and topology label; its exit empties both but leaves the label |
//! | `device-plugin` | a device plugin's 3 devices become capacity and allocatable of Node `node1`; one unhealthy device lowers allocatable only; prints kpm's request count |
//! | `dra` | a DRA driver killed without deregistering loses its ResourceSlices on `node1` once the grace period passes; other drivers' and other nodes' stay |
//! | `apiserver-down` | plugins register locally while the API server is down (CSI reports the failed Node update), and everything converges once it is back |
//! | `fleet-scale` | `kpm doctor --cluster` over 5000 Nodes, 5000 CSINodes and 20,000 ResourceSlices: its time and peak RSS, printed (`fleet_scale.rs`) |
//! | `fleet` | `kpm doctor --watch` on 20 nodes (`fleet.rs`): failures and recoveries published within 5 s, an idle minute of heartbeats only (the audit log), the kubelet's Ready kept beside the doctor's condition, publishing resumed after an API server restart, `kpm doctor --cluster` |

use std::collections::BTreeSet;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize as _;
use serde_json::{Value, json};

use crate::Result;
use crate::scenario::{self, Process, RunningKpm, find, wait_for, wait_until};

mod fleet;
mod fleet_scale;

/// How long any one step may take: kpm writes to the API server within
/// milliseconds, but a 2-core machine shared with builds is slow at times.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long etcd and kube-apiserver may take to become ready (about 2.5 s
/// on an idle machine).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a process may take to exit on SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// After the API server is back: kpm's retries back off, up to its cap.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(90);
/// `kpm run --dra-cleanup-grace`, in seconds: how long a DRA driver that
/// stopped keeps its ResourceSlices.
const DRA_GRACE_SECS: u64 = 3;
/// `kpm run --device-cleanup-grace`, in seconds.
const DEVICE_GRACE_SECS: u64 = 10;
/// How long the slices that must stay are watched after the others went.
const DRA_STAY_CHECK: Duration = Duration::from_secs(DRA_GRACE_SECS + 2);

/// The tokens of the static token file; loopback-only, gone with the run.
const ADMIN_TOKEN: &str = "kpm-e2e-admin-token";
const KPM_TOKEN: &str = "kpm-e2e-kpm-token";
const KPM_USER: &str = "system:serviceaccount:kube-system:kpm";
const DOCTOR_TOKEN: &str = "kpm-e2e-doctor-token";
const DOCTOR_USER: &str = "system:serviceaccount:kube-system:kpm-doctor";
const KPM_GROUPS: &str =
    "system:serviceaccounts,system:serviceaccounts:kube-system,system:authenticated";

/// The Node annotation of CSI node ids, by driver.
const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

struct Scenario {
    name: &'static str,
    /// Whether it runs `kpm`: the `cluster` scenario checks the cluster alone.
    needs_kpm: bool,
    run: fn(&Env, &mut Cluster) -> Result,
}

const SCENARIOS: &[Scenario] = &[
    Scenario { name: "cluster", needs_kpm: false, run: cluster },
    Scenario { name: "csi", needs_kpm: true, run: csi },
    Scenario { name: "csi-allocatable", needs_kpm: true, run: csi_allocatable },
    Scenario { name: "device-plugin", needs_kpm: true, run: device_plugin },
    Scenario { name: "device-leftovers", needs_kpm: true, run: device_leftovers },
    Scenario { name: "dra", needs_kpm: true, run: dra },
    Scenario { name: "dra-test-driver", needs_kpm: true, run: dra_test_driver },
    Scenario { name: "apiserver-down", needs_kpm: true, run: apiserver_down },
    Scenario { name: "doctor", needs_kpm: true, run: doctor },
    Scenario { name: "fleet", needs_kpm: true, run: fleet::fleet },
    Scenario { name: "fleet-scale", needs_kpm: true, run: fleet_scale::fleet_scale },
];

/// The programs, the manifest and where the logs go.
struct Env {
    kpm: PathBuf,
    example_plugin: PathBuf,
    apiserver: PathBuf,
    etcd: PathBuf,
    /// Kubernetes' e2e DRA test driver, if given.
    dra_test_driver: Option<PathBuf>,
    manifest: PathBuf,
    /// `deploy/doctor-daemonset.yaml`, whose RBAC the doctors run with.
    doctor_manifest: PathBuf,
    out: PathBuf,
}

pub(crate) fn run(root: &Path, options: &[&str]) -> Result {
    let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    let usage = || {
        format!(
            "usage: cargo xtask kube-e2e --apiserver BIN --etcd BIN [--dra-test-driver BIN] [--manifest FILE] [--only {}]",
            names.join("|")
        )
    };
    let (mut apiserver, mut etcd, mut manifest, mut only) = (None, None, None, None);
    let mut dra_test_driver = None;
    let mut options = options.iter();
    while let Some(option) = options.next() {
        match (*option, options.next()) {
            ("--apiserver", Some(bin)) => apiserver = Some(std::path::absolute(bin)?),
            ("--etcd", Some(bin)) => etcd = Some(std::path::absolute(bin)?),
            ("--dra-test-driver", Some(bin)) => dra_test_driver = Some(std::path::absolute(bin)?),
            ("--manifest", Some(file)) => manifest = Some(std::path::absolute(file)?),
            ("--only", Some(name)) if names.contains(name) => only = Some(*name),
            _ => return Err(usage().into()),
        }
    }
    let (apiserver, etcd) = (apiserver.ok_or_else(usage)?, etcd.ok_or_else(usage)?);
    let selected: Vec<&Scenario> =
        SCENARIOS.iter().filter(|s| only.is_none_or(|only| only == s.name)).collect();
    let missing: Vec<String> = [&apiserver, &etcd]
        .iter()
        .filter(|bin| !bin.is_file())
        .map(|bin| bin.display().to_string())
        .collect();
    if !missing.is_empty() {
        println!("\nkube-e2e: {} missing", missing.join(", "));
        for scenario in &selected {
            println!("  {:<16} skipped", scenario.name);
        }
        return Ok(());
    }

    if selected.iter().any(|s| s.needs_kpm) {
        scenario::build(root)?;
    }
    let binaries = scenario::Binaries::locate(root, "kube-e2e")?;
    let env = Env {
        kpm: binaries.kpm,
        example_plugin: binaries.example_plugin,
        apiserver,
        etcd,
        dra_test_driver,
        manifest: manifest.unwrap_or_else(|| root.join("deploy/daemonset.yaml")),
        doctor_manifest: root.join("deploy/doctor-daemonset.yaml"),
        out: binaries.out,
    };

    let mut outcomes = Vec::new();
    for scenario in selected {
        if scenario.name == "dra-test-driver"
            && !env.dra_test_driver.as_ref().is_some_and(|bin| bin.is_file())
        {
            outcomes.push((scenario.name, "skipped (no --dra-test-driver)".to_owned()));
            continue;
        }
        eprintln!("\n== {}", scenario.name);
        let outcome = match Cluster::start(&env, scenario.name)
            .and_then(|mut cluster| (scenario.run)(&env, &mut cluster))
        {
            Ok(()) => "passed".to_owned(),
            Err(err) => format!("FAILED: {err}"),
        };
        outcomes.push((scenario.name, outcome));
    }

    println!("\nkube-e2e against {}:", env.apiserver.display());
    for (name, outcome) in &outcomes {
        println!("  {name:<16} {outcome}");
    }
    println!("logs: {}", env.out.display());
    let failed = outcomes.iter().filter(|(_, outcome)| outcome.starts_with("FAILED")).count();
    if failed > 0 {
        return Err(format!("{failed} kube-e2e scenario(s) failed").into());
    }
    Ok(())
}

// === Scenarios ===

/// kpm's token may do exactly what kpm needs, checked call by call; a
/// restarted kube-apiserver serves the same objects (`apiserver-down` relies
/// on it).
fn cluster(env: &Env, cluster: &mut Cluster) -> Result {
    let kpm = cluster.api.as_token(KPM_TOKEN);
    let csinode = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": "node1"}, "spec": {"drivers": []},
    });
    let label = json!({"metadata": {"labels": {"kube-e2e": "cluster"}}});
    let status = json!({"status": {"capacity": {"example.com/e2e": "1"}}});
    create_slice(&cluster.api, "node2-a-0", "a.example.com", "node2", 1)?;
    let allowed: [(&str, Result<(u16, Value)>); 11] = [
        ("get nodes", kpm.request("GET", "/api/v1/nodes/node1", None)),
        ("patch nodes", kpm.request("PATCH", "/api/v1/nodes/node1", Some(&label))),
        ("patch nodes/status", kpm.request("PATCH", "/api/v1/nodes/node1/status", Some(&status))),
        (
            "create csinodes",
            kpm.request("POST", "/apis/storage.k8s.io/v1/csinodes", Some(&csinode)),
        ),
        ("get csinodes", kpm.request("GET", "/apis/storage.k8s.io/v1/csinodes/node1", None)),
        ("update csinodes", {
            let current = cluster.api.get("/apis/storage.k8s.io/v1/csinodes/node1")?;
            kpm.request("PUT", "/apis/storage.k8s.io/v1/csinodes/node1", Some(&current))
        }),
        (
            "patch csinodes",
            kpm.request("PATCH", "/apis/storage.k8s.io/v1/csinodes/node1", Some(&json!({}))),
        ),
        ("list csidrivers", kpm.request("GET", CSIDRIVERS, None)),
        (
            "watch csidrivers",
            kpm.request("GET", &format!("{CSIDRIVERS}?watch=true&timeoutSeconds=1"), None),
        ),
        ("list resourceslices", kpm.request("GET", SLICES, None)),
        (
            "deletecollection resourceslices",
            kpm.request("DELETE", &format!("{SLICES}?fieldSelector=spec.nodeName%3Dnode2"), None),
        ),
    ];
    let denied: [(&str, Result<(u16, Value)>); 4] = [
        ("list secrets", kpm.request("GET", "/api/v1/namespaces/kube-system/secrets", None)),
        ("delete nodes", kpm.request("DELETE", "/api/v1/nodes/node2", None)),
        ("list pods", kpm.request("GET", "/api/v1/pods", None)),
        (
            "create resourceslices",
            kpm.request("POST", SLICES, Some(&slice("x", "a.example.com", "node1", 1))),
        ),
    ];
    let mut wrong = Vec::new();
    for (what, answer) in allowed {
        let (code, body) = answer?;
        if !(200..300).contains(&code) {
            wrong.push(format!("{what}: {code} {}", body["message"]));
        }
    }
    for (what, answer) in denied {
        let (code, _) = answer?;
        if code != 403 {
            wrong.push(format!("{what}: {code}, not 403"));
        }
    }
    if !wrong.is_empty() {
        return Err(format!("kpm's token: {}", wrong.join("; ")).into());
    }
    if !slices(&cluster.api)?.is_empty() {
        return Err("deletecollection left node2's slice".into());
    }
    eprintln!("kpm's token: 11 calls kpm needs allowed, 4 others denied");

    cluster.stop_apiserver()?;
    if cluster.api.request("GET", "/readyz", None).is_ok() {
        return Err("kube-apiserver still answers once stopped".into());
    }
    cluster.start_apiserver(env)?;
    let node = kpm.get("/api/v1/nodes/node1")?;
    if node["metadata"]["labels"]["kube-e2e"] != "cluster" {
        return Err(format!("Node node1 after the restart: {}", node["metadata"]).into());
    }
    eprintln!("kube-apiserver restarted: Node node1 kept its label");
    Ok(())
}

fn csi(env: &Env, cluster: &mut Cluster) -> Result {
    let kpm = cluster.start_kpm(env, "csi")?;
    let mut plugin = plugin(
        &kpm,
        env,
        "csi",
        &[
            "--type",
            "CSIPlugin",
            "--name",
            "csi.example.com",
            "--node-id",
            "node1-id",
            "--topology",
            "topology.example.com/zone=z1",
            "--max-volumes",
            "7",
        ],
    )?;
    let api = &cluster.api;
    let node_uid = api.get("/api/v1/nodes/node1")?["metadata"]["uid"].clone();
    let entry = wait_for("CSINode node1 lists csi.example.com", STEP_TIMEOUT, || {
        csinode_driver(api, "csi.example.com")
    })?;
    let expected = json!({
        "name": "csi.example.com",
        "nodeID": "node1-id",
        "topologyKeys": ["topology.example.com/zone"],
        "allocatable": {"count": 7},
    });
    if entry != expected {
        return Err(format!("CSINode entry {entry}, expected {expected}").into());
    }
    let csinode = api.get("/apis/storage.k8s.io/v1/csinodes/node1")?;
    let owned = csinode["metadata"]["ownerReferences"].as_array().is_some_and(|owners| {
        owners.iter().any(|o| {
            o["apiVersion"] == "v1"
                && o["kind"] == "Node"
                && o["name"] == "node1"
                && o["uid"] == node_uid
        })
    });
    if !owned {
        return Err(format!(
            "CSINode node1 is not owned by Node node1 (uid {node_uid}): {}",
            csinode["metadata"]["ownerReferences"]
        )
        .into());
    }
    let node = wait_for("the node-id annotation and topology label", STEP_TIMEOUT, || {
        let node = api.get("/api/v1/nodes/node1")?;
        let ids = node_ids(&node)?;
        let labelled = node["metadata"]["labels"]["topology.example.com/zone"] == "z1";
        Ok((ids == json!({"csi.example.com": "node1-id"}) && labelled).then_some(node))
    })?;
    eprintln!(
        "registered: CSINode entry {entry}, owner Node uid {node_uid}, annotation {}, label zone=z1",
        node["metadata"]["annotations"][NODE_ID_ANNOTATION]
    );

    plugin.stop(STOP_TIMEOUT)?;
    wait_until("the CSINode entry and the annotation removed", STEP_TIMEOUT, || {
        let node = api.get("/api/v1/nodes/node1")?;
        Ok(csinode_driver(api, "csi.example.com")?.is_none()
            && node_ids(&node)?.get("csi.example.com").is_none())
    })?;
    let node = api.get("/api/v1/nodes/node1")?;
    if node["metadata"]["labels"]["topology.example.com/zone"] != "z1" {
        return Err(format!("the topology label went: {}", node["metadata"]["labels"]).into());
    }
    eprintln!("deregistered: CSINode entry and annotation removed, the label stays");
    kpm.stop()
}

/// KEP-4876: a CSIDriver with `nodeAllocatableUpdatePeriodSeconds: 10` and
/// a driver whose volume limit changes: the CSINode entry's count follows
/// within one period.
fn csi_allocatable(env: &Env, cluster: &mut Cluster) -> Result {
    let api = &cluster.api;
    let csidriver = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": "csi.example.com"},
        "spec": {"nodeAllocatableUpdatePeriodSeconds": 10},
    });
    api.post(CSIDRIVERS, &csidriver)?;
    let kpm = cluster.start_kpm(env, "csi-allocatable")?;
    let limit = env.out.join("csi-allocatable-max-volumes");
    fs::write(&limit, "7")?;
    let limit_arg = limit.display().to_string();
    let args = ["--type", "CSIPlugin", "--name", "csi.example.com", "--node-id", "node1-id"];
    let mut plugin = plugin(
        &kpm,
        env,
        "csi-allocatable",
        &[&args[..], &["--max-volumes-file", &limit_arg]].concat(),
    )?;
    let count = || -> Result<Option<i64>> {
        Ok(csinode_driver(api, "csi.example.com")?
            .and_then(|entry| entry["allocatable"]["count"].as_i64()))
    };
    wait_until("CSINode node1 lists csi.example.com with count 7", STEP_TIMEOUT, || {
        Ok(count()? == Some(7))
    })?;
    let listed = wait_for("kpm list shows the period", STEP_TIMEOUT, || {
        let driver = kpm.list()?["csi_drivers"][0].clone();
        Ok((driver["allocatable_update_period_s"] == 10).then_some(driver))
    })?;
    eprintln!(
        "registered with count 7, refreshed every {}s",
        listed["allocatable_update_period_s"]
    );

    fs::write(&limit, "12")?;
    let changed = Instant::now();
    wait_until("the CSINode count follows to 12", STEP_TIMEOUT, || Ok(count()? == Some(12)))?;
    let took = changed.elapsed();
    if took > Duration::from_secs(12) {
        return Err(format!("the count followed after {took:?}, more than one period").into());
    }
    let patches = kpm.list()?["kubernetes"]["requests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["verb"] == "patch" && r["resource"] == "csinodes")
        .map(|r| r["count"].as_u64().unwrap_or_default())
        .sum::<u64>();
    if patches != 1 {
        return Err(format!("{patches} CSINode patches for one change").into());
    }
    eprintln!(
        "count 7 → 12 on the CSINode {} ms after the driver changed, in 1 patch",
        took.as_millis()
    );
    plugin.stop(STOP_TIMEOUT)?;
    kpm.stop()
}

fn device_plugin(env: &Env, cluster: &mut Cluster) -> Result {
    let kpm = cluster.start_kpm(env, "device-plugin")?;
    let before = requests(&kpm)?;
    let plugin = plugin(
        &kpm,
        env,
        "device-plugin",
        &["--type", "DevicePlugin", "--name", "example.com/gpu", "--devices", "3"],
    )?;
    let api = &cluster.api;
    let gpus = |node: &Value| {
        (
            node["status"]["capacity"]["example.com/gpu"].clone(),
            node["status"]["allocatable"]["example.com/gpu"].clone(),
        )
    };
    wait_until("Node node1 with 3 example.com/gpu, all allocatable", STEP_TIMEOUT, || {
        Ok(gpus(&api.get("/api/v1/nodes/node1")?) == (json!("3"), json!("3")))
    })?;
    eprintln!("example.com/gpu: capacity 3, allocatable 3");
    plugin.signal("USR1")?;
    plugin.wait_for_line("a device turned unhealthy", STEP_TIMEOUT, |line| {
        line.starts_with("unhealthy: ")
    })?;
    wait_until("allocatable 2 of capacity 3", STEP_TIMEOUT, || {
        Ok(gpus(&api.get("/api/v1/nodes/node1")?) == (json!("3"), json!("2")))
    })?;
    eprintln!("example.com/gpu: one unhealthy device, capacity 3, allocatable 2");
    let after = requests(&kpm)?;
    println!(
        "device-plugin: kpm made {} API request(s) ({before} before the plugin, {after} after)",
        after - before
    );
    drop(plugin);
    kpm.stop()
}

fn dra(env: &Env, cluster: &mut Cluster) -> Result {
    let kpm = cluster.start_kpm(env, "dra")?;
    let api = &cluster.api;
    let mut a = plugin(&kpm, env, "dra-a", &["--type", "DRAPlugin", "--name", "a.example.com"])?;
    let b = plugin(&kpm, env, "dra-b", &["--type", "DRAPlugin", "--name", "b.example.com"])?;
    for plugin in [&a, &b] {
        plugin.wait_for_line("registered", STEP_TIMEOUT, |line| line == "registered: true")?;
    }
    // Created once both drivers are registered, as their own controllers
    // would, so that however kpm treats slices at its start they count here.
    create_slice(api, "node1-a-0", "a.example.com", "node1", 2)?;
    create_slice(api, "node1-a-1", "a.example.com", "node1", 2)?;
    create_slice(api, "node1-b-0", "b.example.com", "node1", 1)?;
    create_slice(api, "node2-a-0", "a.example.com", "node2", 1)?;
    eprintln!("a.example.com and b.example.com registered, 4 ResourceSlices created");

    a.kill();
    let killed = Instant::now();
    let stay: BTreeSet<String> = ["node1-b-0", "node2-a-0"].map(str::to_owned).into();
    wait_until("the node1 slices of a.example.com deleted", STEP_TIMEOUT + DRA_STAY_CHECK, || {
        Ok(slices(api)? == stay)
    })?;
    let gone = killed.elapsed();
    if gone < Duration::from_secs(DRA_GRACE_SECS) {
        return Err(format!(
            "a.example.com's slices went {gone:?} after the kill, within the grace period"
        )
        .into());
    }
    eprintln!("a.example.com killed: its node1 slices deleted after {gone:?}");
    // Nothing to wait for: the check is that nothing else happens.
    std::thread::sleep(DRA_STAY_CHECK);
    let left = slices(api)?;
    if left != stay {
        return Err(format!("{DRA_STAY_CHECK:?} later, slices {left:?}, expected {stay:?}").into());
    }
    eprintln!("{DRA_STAY_CHECK:?} later: {left:?} stay");
    drop(b);
    kpm.stop()
}

/// What an earlier run published, after kpm restarts: the device resource
/// of a plugin that is still there goes on with no flap (never zero, never
/// missing); one whose plugin is gone stays until the device grace, then
/// goes.
fn device_leftovers(env: &Env, cluster: &mut Cluster) -> Result {
    let api = &cluster.api;
    let gpus = || -> Result<Value> {
        Ok(api.get("/api/v1/nodes/node1")?["status"]["capacity"]["example.com/gpu"].clone())
    };
    let kpm = cluster.start_kpm(env, "device-leftovers-1")?;
    let args = ["--type", "DevicePlugin", "--name", "example.com/gpu", "--devices", "2"];
    let plugin = plugin(&kpm, env, "device-leftovers", &args)?;
    wait_until("Node node1 with 2 example.com/gpu", STEP_TIMEOUT, || Ok(gpus()? == json!("2")))?;
    kpm.stop()?;

    // The plugin stays: the restarted kpm registers it again.
    let kpm = cluster.start_kpm(env, "device-leftovers-2")?;
    let watched = Instant::now();
    let mut seen = BTreeSet::new();
    while watched.elapsed() < Duration::from_secs(DEVICE_GRACE_SECS + 2) {
        seen.insert(gpus()?.to_string());
        std::thread::sleep(Duration::from_millis(100));
    }
    if seen.len() != 1 || !seen.contains("\"2\"") {
        return Err(format!("with its plugin back, the capacity was {seen:?}").into());
    }
    eprintln!(
        "kpm restarted with the plugin: capacity always 2 over {}s (the grace and more)",
        DEVICE_GRACE_SECS + 2
    );
    kpm.stop()?;
    drop(plugin);

    // The plugin is gone: its capacity stays for the grace, then goes.
    let kpm = cluster.start_kpm(env, "device-leftovers-3")?;
    let started = Instant::now();
    wait_until("the leftover capacity removed", STEP_TIMEOUT + DRA_STAY_CHECK, || {
        if started.elapsed() < Duration::from_secs(DEVICE_GRACE_SECS - 1) && gpus()? != json!("2") {
            return Err("the leftover capacity changed within the grace".into());
        }
        Ok(gpus()?.is_null())
    })?;
    eprintln!(
        "kpm restarted without the plugin: capacity 2 kept, then removed {:?} after the start (grace {DEVICE_GRACE_SECS}s)",
        started.elapsed()
    );
    kpm.stop()
}

/// Kubernetes' own e2e DRA test driver (`dra-test-driver kubelet-plugin`,
/// `test/e2e/dra/test-driver`) against `kpm run --kubeconfig`: it
/// registers, publishes its ResourceSlices itself (as cluster admin: kpm's
/// token may not create slices), streams device health, and once it is
/// killed kpm deletes its slices of the node after the grace period.
fn dra_test_driver(env: &Env, cluster: &mut Cluster) -> Result {
    const DRIVER: &str = "test-driver.cdi.k8s.io";
    let bin = env.dra_test_driver.as_ref().ok_or("no --dra-test-driver")?;
    let kpm = cluster.start_kpm(env, "dra-test-driver")?;
    let admin = cluster.kubeconfig("admin-kubeconfig", ADMIN_TOKEN)?.display().to_string();
    let registry = kpm.root.join("plugins_registry").display().to_string();
    // The helper binds its socket in <datadir>/<driver>, which the kubelet's
    // pod spec mounts: it must exist.
    fs::create_dir_all(kpm.root.join("plugins").join(DRIVER))?;
    let datadir = kpm.root.join("plugins").display().to_string();
    let cdi = cluster.dir.path().join("cdi").display().to_string();
    let log = |suffix: &str| env.out.join(format!("dra-test-driver-driver.{suffix}"));
    let args = [
        "--kubeconfig",
        &admin,
        "--drivername",
        DRIVER,
        "kubelet-plugin",
        "--node-name",
        "node1",
        "--plugin-registration-path",
        &registry,
        "--datadir",
        &datadir,
        "--cdi-dir",
        &cdi,
        "--num-devices",
        "2",
    ];
    let mut driver = Process::spawn("dra-test-driver", bin, &args, &log("out"), &log("err"))?;
    let api = &cluster.api;
    let listed = wait_for("kpm lists the driver connected", STEP_TIMEOUT, || {
        let list = kpm.list()?;
        let driver = find(&list["dra_drivers"], "name", DRIVER).cloned();
        Ok(driver.filter(|d| d["instances"][0]["connected"] == true))
    })?;
    let published = wait_for("the driver's slices of node1", STEP_TIMEOUT, || {
        let ours: BTreeSet<String> = slices_of(api, DRIVER, "node1")?;
        Ok((!ours.is_empty()).then_some(ours))
    })?;
    eprintln!("registered ({}); it published {published:?}", listed["instances"][0]["version"]);

    driver.kill();
    let killed = Instant::now();
    wait_until("kpm deletes the driver's slices of node1", STEP_TIMEOUT + DRA_STAY_CHECK, || {
        Ok(slices_of(api, DRIVER, "node1")?.is_empty())
    })?;
    let gone = killed.elapsed();
    if gone < Duration::from_secs(DRA_GRACE_SECS) {
        return Err(format!("its slices went {gone:?} after the kill, within the grace").into());
    }
    eprintln!("killed: its slices deleted by kpm {gone:?} later (grace {DRA_GRACE_SECS}s)");
    kpm.stop()
}

fn apiserver_down(env: &Env, cluster: &mut Cluster) -> Result {
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

// === Cluster ===

/// `kpm doctor --kubeconfig` against the real API server, with kpm's own
/// token: a CSI driver kpm registered is ok; once kpm (the node's kubelet)
/// is gone, a driver whose registrar started meanwhile is missing from
/// CSINode, and the entry of a driver that went with it is stale.
fn doctor(env: &Env, cluster: &mut Cluster) -> Result {
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

/// The static tokens: admin, kpm's service account, the doctor's.
fn tokens_csv() -> String {
    format!(
        "{ADMIN_TOKEN},admin,admin,\"system:masters\"\n{KPM_TOKEN},{KPM_USER},kpm,\"{KPM_GROUPS}\"\n\
         {DOCTOR_TOKEN},{DOCTOR_USER},kpm-doctor,\"{KPM_GROUPS}\"\n"
    )
}

/// Every write, by whom and when, in the audit log: the fleet scenario
/// counts the doctors'.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n\
    - level: Metadata\n  verbs: [create, update, patch, delete, deletecollection]\n- level: None\n";

/// etcd and kube-apiserver of one scenario, in a temp dir under `/tmp`.
// Fields drop in order: kube-apiserver, then etcd, then the dir.
struct Cluster {
    apiserver: Option<Process>,
    /// How many times kube-apiserver was started: each start logs to files of its own.
    apiserver_starts: u32,
    etcd: Process,
    scenario: &'static str,
    apiserver_args: Vec<String>,
    ca_pem: String,
    api: Api,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start(env: &Env, scenario: &'static str) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("kpm-kube-").tempdir_in("/tmp")?;
        let pki = Pki::generate()?;
        let path = |name: &str| dir.path().join(name).display().to_string();
        for (name, contents) in [
            ("ca.crt", &pki.ca),
            ("apiserver.crt", &pki.serving_cert),
            ("apiserver.key", &pki.serving_key),
            ("sa.key", &pki.sa_key),
            ("sa.pub", &pki.sa_public_key),
            ("tokens.csv", &tokens_csv()),
            ("audit-policy.yaml", &AUDIT_POLICY.to_owned()),
        ] {
            fs::write(path(name), contents)?;
        }

        let [client_port, peer_port, secure_port] = free_ports()?;
        let etcd_log = env.out.join(format!("{scenario}-etcd.log"));
        let etcd = Process::spawn(
            "etcd",
            &env.etcd,
            &[
                "--data-dir",
                &path("etcd"),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client_port}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client_port}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
            ],
            &env.out.join(format!("{scenario}-etcd.out")),
            &etcd_log,
        )?;
        // Ready when its health endpoint says so, as a stock etcd tells.
        let health = format!("http://127.0.0.1:{client_port}/health");
        wait_until("etcd ready", START_TIMEOUT, || {
            let body = ureq::get(&health)
                .call()
                .ok()
                .and_then(|mut response| response.body_mut().read_to_string().ok());
            Ok(body.is_some_and(|body| body.contains(r#""health":"true""#)))
        })?;

        let apiserver_args = [
            "--etcd-servers",
            &format!("http://127.0.0.1:{client_port}"),
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &secure_port.to_string(),
            "--tls-cert-file",
            &path("apiserver.crt"),
            "--tls-private-key-file",
            &path("apiserver.key"),
            "--token-auth-file",
            &path("tokens.csv"),
            "--authorization-mode",
            "RBAC",
            "--service-account-issuer",
            "https://kubernetes.default.svc",
            "--service-account-key-file",
            &path("sa.pub"),
            "--service-account-signing-key-file",
            &path("sa.key"),
            "--service-cluster-ip-range",
            "10.0.0.0/24",
            "--endpoint-reconciler-type",
            "none",
            "--disable-admission-plugins",
            "ServiceAccount",
            "--audit-policy-file",
            &path("audit-policy.yaml"),
            "--audit-log-path",
            &path("audit.log"),
        ]
        .map(str::to_owned)
        .to_vec();
        let api = Api::new(&format!("https://127.0.0.1:{secure_port}"), &pki.ca, ADMIN_TOKEN)?;
        let mut cluster = Self {
            apiserver: None,
            apiserver_starts: 0,
            etcd,
            scenario,
            apiserver_args,
            ca_pem: pki.ca,
            api,
            dir,
        };
        cluster.start_apiserver(env)?;
        cluster.apply_rbac(&env.manifest)?;
        cluster.apply_rbac(&env.doctor_manifest)?;
        for node in ["node1", "node2"] {
            cluster.create_node(node)?;
        }
        eprintln!("cluster ready: {} (etcd pid {})", cluster.api.server, cluster.etcd.child.id());
        Ok(cluster)
    }

    /// Creates Node `node` as the kubelet creates its Node, with labels: the
    /// API server tracks field owners from a create that sets some field,
    /// and never from updates to an object it tracks none on.
    fn create_node(&self, node: &str) -> Result {
        self.api.post(
            "/api/v1/nodes?fieldManager=kubelet",
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {
                "kubernetes.io/hostname": node, "kubernetes.io/os": "linux"}}}),
        )?;
        Ok(())
    }

    /// The API server's audit log: the writes made, by whom.
    fn audit_log(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    /// Starts kube-apiserver (again) and waits for `/readyz`; a restart logs
    /// to `<scenario>-kube-apiserver-2.log` and so on.
    fn start_apiserver(&mut self, env: &Env) -> Result {
        let started = Instant::now();
        let args: Vec<&str> = self.apiserver_args.iter().map(String::as_str).collect();
        self.apiserver_starts += 1;
        let run = match self.apiserver_starts {
            1 => String::new(),
            n => format!("-{n}"),
        };
        let log =
            |suffix: &str| env.out.join(format!("{}-kube-apiserver{run}.{suffix}", self.scenario));
        let mut apiserver =
            Process::spawn("kube-apiserver", &env.apiserver, &args, &log("out"), &log("log"))?;
        wait_until("kube-apiserver /readyz", START_TIMEOUT, || {
            if let Some(status) = apiserver.child.try_wait()? {
                return Err(format!(
                    "kube-apiserver exited ({status}), see {}",
                    log("log").display()
                )
                .into());
            }
            Ok(self.api.request("GET", "/readyz", None).is_ok_and(|(code, _)| code == 200))
        })?;
        eprintln!("kube-apiserver ready in {:?}", started.elapsed());
        self.apiserver = Some(apiserver);
        Ok(())
    }

    /// SIGKILL to kube-apiserver: a crash, and an end that does not wait
    /// for its many clients' watches to drain.
    fn kill_apiserver(&mut self) -> Result {
        self.apiserver.take().ok_or("kube-apiserver is not running")?.kill();
        Ok(())
    }

    /// SIGTERM to kube-apiserver, and waits for it to exit.
    fn stop_apiserver(&mut self) -> Result {
        self.apiserver.take().ok_or("kube-apiserver is not running")?.stop(STOP_TIMEOUT)
    }

    /// POSTs the `ServiceAccount`, `ClusterRole` and `ClusterRoleBinding` documents
    /// of `manifest` as admin; other kinds are left out.
    fn apply_rbac(&self, manifest: &Path) -> Result {
        let text = fs::read_to_string(manifest)
            .map_err(|err| format!("cannot read {}: {err}", manifest.display()))?;
        let mut applied = BTreeSet::new();
        for document in serde_norway::Deserializer::from_str(&text) {
            let object = Value::deserialize(document)
                .map_err(|err| format!("{}: {err}", manifest.display()))?;
            let kind = object["kind"].as_str().unwrap_or_default().to_owned();
            let collection = match kind.as_str() {
                "ServiceAccount" => "serviceaccounts",
                "ClusterRole" => "clusterroles",
                "ClusterRoleBinding" => "clusterrolebindings",
                _ => continue,
            };
            let group = match object["apiVersion"].as_str() {
                Some("v1") => "/api/v1".to_owned(),
                Some(version) => format!("/apis/{version}"),
                None => {
                    return Err(
                        format!("{kind} without apiVersion in {}", manifest.display()).into()
                    );
                }
            };
            let path = match object["metadata"]["namespace"].as_str() {
                Some(namespace) => format!("{group}/namespaces/{namespace}/{collection}"),
                None => format!("{group}/{collection}"),
            };
            // kube-system is created by the API server itself, soon after /readyz.
            wait_until(
                &format!("{kind} {} applied", object["metadata"]["name"]),
                STEP_TIMEOUT,
                || {
                    let (code, body) = self.api.request("POST", &path, Some(&object))?;
                    match code {
                        200..300 => Ok(true),
                        404 => Ok(false),
                        _ => Err(format!("POST {path}: {code} {}", body["message"]).into()),
                    }
                },
            )?;
            applied.insert(kind);
        }
        for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
            if !applied.contains(kind) {
                return Err(format!("{} has no {kind} for kpm", manifest.display()).into());
            }
        }
        Ok(())
    }

    /// Writes a kubeconfig for `token` to `file` in the cluster's dir.
    fn kubeconfig(&self, file: &str, token: &str) -> Result<PathBuf> {
        let kubeconfig = self.dir.path().join(file);
        let ca_data = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        // JSON is YAML: any kubeconfig reader takes it.
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kube-e2e", "cluster": {"server": self.api.server, "certificate-authority-data": ca_data}}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "kube-e2e", "context": {"cluster": "kube-e2e", "user": "user"}}],
            "current-context": "kube-e2e",
        });
        fs::write(&kubeconfig, serde_json::to_string_pretty(&config)?)?;
        Ok(kubeconfig)
    }

    /// Writes the kubeconfig for kpm's token and starts `kpm run` on a root
    /// in the cluster's dir.
    fn start_kpm(&self, env: &Env, scenario: &str) -> Result<RunningKpm> {
        let kubeconfig = self.kubeconfig("kubeconfig", KPM_TOKEN)?;
        let root = self.dir.path().join("kpm");
        fs::create_dir_all(root.join("plugins_registry"))?;
        let log = env.out.join(format!("{scenario}-kpm.log"));
        RunningKpm::start(
            &env.kpm,
            &root,
            &[
                "--kubeconfig",
                &kubeconfig.display().to_string(),
                "--node-name",
                "node1",
                "--dra-cleanup-grace",
                &DRA_GRACE_SECS.to_string(),
                "--device-cleanup-grace",
                &DEVICE_GRACE_SECS.to_string(),
                // A killed plugin's socket refuses the next probe: it is
                // noticed within a second, not within the default 10.
                "--liveness-period",
                "1",
            ],
            &log,
        )
    }
}

/// The certificates and keys of a cluster, PEM-encoded.
struct Pki {
    ca: String,
    serving_cert: String,
    serving_key: String,
    sa_key: String,
    sa_public_key: String,
}

impl Pki {
    fn generate() -> Result<Self> {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair, KeyUsagePurpose,
        };
        let mut ca = CertificateParams::new(Vec::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "kpm kube-e2e CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
        // An IP address among the names becomes an IP SAN.
        let mut serving =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
        serving.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_key = KeyPair::generate()?;
        let serving = serving.signed_by(&serving_key, &ca)?;
        let sa_key = KeyPair::generate()?;
        Ok(Self {
            ca: ca.pem(),
            serving_cert: serving.pem(),
            serving_key: serving_key.serialize_pem(),
            sa_key: sa_key.serialize_pem(),
            sa_public_key: sa_key.public_key_pem(),
        })
    }
}

/// Three free loopback ports: bound at once so that they differ, then freed.
fn free_ports() -> Result<[u16; 3]> {
    let listeners = [
        TcpListener::bind("127.0.0.1:0")?,
        TcpListener::bind("127.0.0.1:0")?,
        TcpListener::bind("127.0.0.1:0")?,
    ];
    let mut ports = [0; 3];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

// === API ===

/// A blocking client of the API server with one bearer token.
struct Api {
    agent: ureq::Agent,
    server: String,
    token: String,
}

impl Api {
    /// Trusts only `ca_pem`.
    fn new(server: &str, ca_pem: &str, token: &str) -> Result<Self> {
        let ca = ureq::tls::Certificate::from_pem(ca_pem.as_bytes())?;
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::new_with_certs(&[ca]))
            .build();
        let agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        Ok(Self { agent, server: server.to_owned(), token: token.to_owned() })
    }

    /// The same server with another token.
    fn as_token(&self, token: &str) -> Self {
        Self { agent: self.agent.clone(), server: self.server.clone(), token: token.to_owned() }
    }

    /// `method path` with `body` as JSON (a merge patch for PATCH): the
    /// status code and the body (`null` when it is not JSON).
    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let content_type =
            if method == "PATCH" { "application/merge-patch+json" } else { "application/json" };
        self.request_as(method, path, content_type, body)
    }

    /// [`request`](Self::request) with the body's content type given.
    fn request_as(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value)> {
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.server))
            .header("Authorization", format!("Bearer {}", self.token))
            .header("Content-Type", content_type)
            .body(body.map(Value::to_string).unwrap_or_default())?;
        let mut response = self.agent.run(request)?;
        let text = response.body_mut().read_to_string()?;
        Ok((response.status().as_u16(), serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    fn get(&self, path: &str) -> Result<Value> {
        self.expect_ok("GET", path, None)
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.expect_ok("POST", path, Some(body))
    }

    /// GET, with `None` for 404.
    fn get_optional(&self, path: &str) -> Result<Option<Value>> {
        match self.request("GET", path, None)? {
            (404, _) => Ok(None),
            (200, body) => Ok(Some(body)),
            (code, body) => Err(format!("GET {path}: {code} {}", body["message"]).into()),
        }
    }

    fn expect_ok(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        match self.request(method, path, body)? {
            (200..300, body) => Ok(body),
            (code, body) => Err(format!("{method} {path}: {code} {}", body["message"]).into()),
        }
    }
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
const CSIDRIVERS: &str = "/apis/storage.k8s.io/v1/csidrivers";

/// A `ResourceSlice` of `driver` on `node`, one device, its pool named after
/// the node with `pool_slices` slices.
fn slice(name: &str, driver: &str, node: &str, pool_slices: u32) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": pool_slices},
            "devices": [{"name": format!("{name}-dev")}],
        },
    })
}

fn create_slice(api: &Api, name: &str, driver: &str, node: &str, pool_slices: u32) -> Result {
    api.post(SLICES, &slice(name, driver, node, pool_slices)).map(drop)
}

/// The names of all `ResourceSlice`s.
fn slices(api: &Api) -> Result<BTreeSet<String>> {
    let list = api.get(SLICES)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item["metadata"]["name"].as_str().map(str::to_owned))
        .collect())
}

/// The ResourceSlices of `driver` on `node`.
fn slices_of(api: &Api, driver: &str, node: &str) -> Result<BTreeSet<String>> {
    let list = api.get(SLICES)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["spec"]["driver"] == driver && item["spec"]["nodeName"] == node)
        .filter_map(|item| item["metadata"]["name"].as_str().map(str::to_owned))
        .collect())
}

/// The entry of `driver` in `CSINode` `node1`, if both exist.
fn csinode_driver(api: &Api, driver: &str) -> Result<Option<Value>> {
    let Some(csinode) = api.get_optional("/apis/storage.k8s.io/v1/csinodes/node1")? else {
        return Ok(None);
    };
    Ok(find(&csinode["spec"]["drivers"], "name", driver).cloned())
}

/// The node-id annotation of `node`, parsed; `{}` when absent.
fn node_ids(node: &Value) -> Result<Value> {
    match node["metadata"]["annotations"][NODE_ID_ANNOTATION].as_str() {
        Some(ids) => Ok(serde_json::from_str(ids)?),
        None => Ok(json!({})),
    }
}

// === kpm ===

/// The API requests kpm has made so far: the sum of `kubernetes.requests[].count`
/// in `kpm list -o json`.
fn requests(kpm: &RunningKpm) -> Result<u64> {
    let list = kpm.list()?;
    let requests = list["kubernetes"]["requests"]
        .as_array()
        .ok_or("kpm list -o json has no kubernetes.requests")?;
    requests
        .iter()
        .map(|r| {
            r["count"]
                .as_u64()
                .ok_or_else(|| format!("a request count that is not a number: {r}").into())
        })
        .sum()
}

/// An example plugin registering with `kpm`, `name` in its log files.
fn plugin(kpm: &RunningKpm, env: &Env, name: &str, args: &[&str]) -> Result<Process> {
    let registry = kpm.root.join("plugins_registry").display().to_string();
    let mut all = vec!["--dir", &registry];
    all.extend_from_slice(args);
    let log = |suffix: &str| env.out.join(format!("{name}-plugin.{suffix}"));
    Process::spawn(name, &env.example_plugin, &all, &log("out"), &log("err"))
}
