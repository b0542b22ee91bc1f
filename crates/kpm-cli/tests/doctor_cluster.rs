//! `kpm doctor --cluster`, the fleet view, against the shared stand-in API
//! server (kpm-test-support's, on 127.0.0.1) holding the fleet's
//! collections, which it pages as kube-apiserver does (`limit`,
//! `continue`), serves as a server-side `Table` when asked (`as=Table`, the
//! CRD's printer columns; kube-e2e's `fleet` checks the real one), gets one
//! object by name and selects by label and by node; and `kpm` run as the
//! kubectl plugin `kubectl-kpm`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::process::{Command, Output, Stdio};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime};

use kpm_test_support::api_server::{self, Collection, Shared, State};
use serde_json::{Value, json};
use support::KPM;

/// The reports' collection, with the CRD's printer columns.
fn reports() -> Collection {
    use kpm_report::CustomResourceExt as _;
    let crd = kpm_report::KubeletPluginReport::crd();
    let columns = crd.spec.versions[0].additional_printer_columns.clone().unwrap();
    Collection::new(REPORTS.as_str(), "KubeletPluginReport", "doctor.kpm.io/v1alpha1")
        .with_columns(columns.into_iter().map(|c| (c.name, c.json_path, c.type_)))
}

/// The shared stand-in API server serving a fleet's collections on a
/// runtime of its own; it records every read as `path?query`.
struct ApiServer {
    url: String,
    state: Shared,
    _rt: tokio::runtime::Runtime,
}

impl ApiServer {
    fn serve(collections: Vec<Collection>) -> Self {
        Self::of(State { collections, ..State::default() })
    }

    fn of(state: State) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let state = Arc::new(parking_lot::Mutex::new(state));
        let addr = api_server::serve(&rt, 0, Arc::clone(&state));
        Self { url: format!("http://{addr}"), state, _rt: rt }
    }

    fn requests(&self) -> Vec<String> {
        self.state.lock().reads.clone()
    }

    /// A kubeconfig for it, in `dir`.
    fn kubeconfig(&self, dir: &tempfile::TempDir) -> String {
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, api_server::kubeconfig(&self.url)).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

/// `kpm ARGS` with no API server in its environment but what it is given.
fn kpm(args: &[&str]) -> Output {
    Command::new(KPM)
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap()
}

fn ago(minutes: u64) -> String {
    humantime::format_rfc3339_seconds(SystemTime::now() - Duration::from_secs(60 * minutes))
        .to_string()
}

fn node(name: &str, pool: &str, condition: Option<Value>, capacity: &Value) -> Value {
    let mut conditions = vec![json!({
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "lastHeartbeatTime": ago(0), "lastTransitionTime": ago(600),
    })];
    conditions.extend(condition);
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"pool": pool, "kubernetes.io/hostname": name}},
        "status": {"capacity": capacity, "conditions": conditions,
                   "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320_368}]},
    })
}

fn plugins_condition(status: &str, reason: &str, message: &str, heartbeat: &str) -> Value {
    json!({
        "type": "KubeletPluginsHealthy", "status": status, "reason": reason, "message": message,
        "lastHeartbeatTime": heartbeat, "lastTransitionTime": ago(300),
    })
}

const STALE_MESSAGE: &str = "1 failing: csi.example.com-reg.sock (stale): dial \
     /var/lib/kubelet/plugins_registry/csi.example.com-reg.sock: Connection refused (os error 111)";

/// The reports' collection, as the custom resource names it.
static REPORTS: LazyLock<String> = LazyLock::new(|| {
    use kpm_report::{KubeletPluginReport, Resource as _};
    KubeletPluginReport::url_path(&(), None)
});

/// Node `name`'s `KubeletPluginReport`, as its doctor writes it: `health`,
/// `reason`, `plugins`, each `(socket, name, verdict, reason)`, and what
/// the node's objects show `registered` (none: a doctor before the field).
fn report(
    name: &str,
    (health, reason): (&str, &str),
    plugins: &[(&str, Option<&str>, &str, &str)],
    registered: Option<&str>,
    heartbeat: &str,
) -> Value {
    let entries: Vec<Value> = plugins
        .iter()
        .map(|(socket, name, verdict, reason)| {
            json!({"socket": socket, "name": name, "verdict": verdict, "reason": reason,
                   "since": ago(300)})
        })
        .collect();
    let failing = plugins.iter().filter(|(_, _, verdict, _)| *verdict != "ok").count();
    json!({
        "apiVersion": "doctor.kpm.io/v1alpha1", "kind": "KubeletPluginReport",
        "metadata": {"name": name}, "spec": {"nodeName": name},
        "status": {
            "health": health, "reason": reason,
            "kubelet": {"rootDir": "/var/lib/kubelet", "foundBy": "the default", "version": "v1.36.2"},
            "counts": {"plugins": plugins.len(), "failing": failing, "omitted": 0},
            "plugins": entries, "findings": [], "heartbeatTime": heartbeat, "doctorVersion": "0.1.0",
            "registered": registered,
        },
    })
}

/// Seven nodes: four healthy (node-7 in pool b), node-4 failing with a stale
/// registration socket of `csi.example.com`, node-5 without a doctor,
/// node-6 with a doctor silent for two hours. Every doctor writes a report
/// but node-3's, an older doctor that publishes its condition only. `csi.example.com` (a
/// CSIDriver object) is on nodes 1-3 and 7; `unused.example.com` (an object
/// too) on none; `vendor.com/gpu` has capacity on nodes 1 and 2 and 0 on
/// node 4; `gpu.example.com` published slices for nodes 1 and 3; one slice
/// of a network-attached device names no node.
fn fleet_of_seven() -> ApiServer {
    let healthy = || {
        Some(plugins_condition(
            "True",
            "PluginsHealthy",
            "all 4 plugin sockets of the node are ok",
            &ago(5),
        ))
    };
    let gpus = |n: &str| json!({"cpu": "8", "memory": "32Gi", "vendor.com/gpu": n});
    let cpus = json!({"cpu": "8", "memory": "32Gi", "hugepages-2Mi": "0"});
    let stale = plugins_condition("False", "Stale", STALE_MESSAGE, &ago(2));
    let silent = plugins_condition("True", "PluginsHealthy", "all ok", &ago(120));
    let mut nodes = Collection::new("/api/v1/nodes", "Node", "v1");
    for node in [
        node("node-1", "a", healthy(), &gpus("2")),
        node("node-2", "a", healthy(), &gpus("2")),
        node("node-3", "a", healthy(), &cpus),
        node("node-4", "a", Some(stale), &gpus("0")),
        node("node-5", "a", None, &cpus),
        node("node-6", "a", Some(silent), &cpus),
        node("node-7", "b", healthy(), &cpus),
    ] {
        nodes.push(&node);
    }
    let mut drivers =
        Collection::new("/apis/storage.k8s.io/v1/csidrivers", "CSIDriver", "storage.k8s.io/v1");
    for name in ["csi.example.com", "unused.example.com"] {
        drivers.push(&json!({"metadata": {"name": name}, "spec": {"attachRequired": false}}));
    }
    let mut csinodes =
        Collection::new("/apis/storage.k8s.io/v1/csinodes", "CSINode", "storage.k8s.io/v1");
    for i in 1..=7 {
        let listed: &[&str] = if [1, 2, 3, 7].contains(&i) { &["csi.example.com"] } else { &[] };
        let drivers: Vec<Value> = listed
            .iter()
            .map(|name| json!({"name": name, "nodeID": format!("node-{i}"), "topologyKeys": null}))
            .collect();
        csinodes.push(
            &json!({"metadata": {"name": format!("node-{i}")}, "spec": {"drivers": drivers}}),
        );
    }
    let mut slices = Collection::new(
        "/apis/resource.k8s.io/v1/resourceslices",
        "ResourceSlice",
        "resource.k8s.io/v1",
    );
    for (name, node) in
        [("a", Some("node-1")), ("b", Some("node-1")), ("c", Some("node-3")), ("net", None)]
    {
        let mut spec = json!({
            "driver": "gpu.example.com", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"model": {"string": "x"}}}],
        });
        match node {
            Some(node) => spec["nodeName"] = node.into(),
            None => spec["allNodes"] = true.into(),
        }
        slices.push(&json!({"metadata": {"name": format!("slice-{name}")}, "spec": spec}));
    }
    let mut reports = reports();
    let ok = |socket| (socket, Some("csi.example.com"), "ok", "registered");
    let healthy = ("Healthy", "PluginsHealthy");
    for (name, registered) in [
        (
            "node-1",
            "CSIPlugin:csi.example.com,DevicePlugin:vendor.com/gpu,DRAPlugin:gpu.example.com",
        ),
        ("node-2", "CSIPlugin:csi.example.com,DevicePlugin:vendor.com/gpu"),
        ("node-7", "CSIPlugin:csi.example.com"),
    ] {
        let plugins = [ok("/var/lib/kubelet/plugins_registry/csi.example.com-reg.sock")];
        reports.push(&report(name, healthy, &plugins, Some(registered), &ago(5)));
    }
    let stale = (
        "/var/lib/kubelet/plugins_registry/csi.example.com-reg.sock",
        None,
        "stale",
        "dial /var/lib/kubelet/plugins_registry/csi.example.com-reg.sock: Connection refused \
         (os error 111)",
    );
    reports.push(&report("node-4", ("Failing", "Stale"), &[stale], Some(""), &ago(2)));
    reports.push(&report("node-6", healthy, &[], Some(""), &ago(120)));
    ApiServer::serve(vec![reports, nodes, drivers, csinodes, slices])
}

fn driver<'a>(fleet: &'a Value, kind: &str, name: &str) -> &'a Value {
    fleet["drivers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|driver| driver["kind"] == kind && driver["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {fleet:#}"))
}

fn not_on(driver: &Value) -> Vec<(String, String)> {
    driver["not_on"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["node"].as_str().unwrap().to_owned(), n["why"].as_str().unwrap().to_owned()))
        .collect()
}

/// What a read from the API server's watch cache asks.
const WATCH_CACHE: &str = "resourceVersion=0&resourceVersionMatch=NotOlderThan";

/// `fleet_of_seven`'s read at page size 2: reports and Nodes as tables
/// without their objects, whole from the watch cache; the CSIDrivers
/// paged; the failing node's report in full; the objects of the two nodes
/// no report speaks for (node-3's doctor writes none, node-5 has no
/// doctor), all from the watch cache.
fn read_at_the_reports_weight(server: &ApiServer, fleet: &Value) {
    let mut requests = server.requests();
    let mut first: Vec<String> = requests.drain(..3).collect();
    first.sort();
    assert_eq!(
        first,
        [
            format!("/api/v1/nodes?&{WATCH_CACHE}&includeObject=None"),
            format!("{}?&{WATCH_CACHE}&includeObject=None", *REPORTS),
            "/apis/storage.k8s.io/v1/csidrivers?&limit=2".to_owned(),
        ]
    );
    let mut singles = requests;
    singles.sort();
    let slices = "/apis/resource.k8s.io/v1/resourceslices?&fieldSelector=spec.nodeName%3D";
    assert_eq!(
        singles,
        [
            "/api/v1/nodes/node-3?&resourceVersion=0".to_owned(),
            "/api/v1/nodes/node-5?&resourceVersion=0".to_owned(),
            // A node where the drivers missing elsewhere are registered, in
            // full: its doctor would name the pods serving them.
            format!("{}/node-1?&resourceVersion=0", *REPORTS),
            format!("{}/node-4?&resourceVersion=0", *REPORTS),
            format!("{slices}node-3&{WATCH_CACHE}"),
            format!("{slices}node-5&{WATCH_CACHE}"),
            "/apis/storage.k8s.io/v1/csinodes/node-3?&resourceVersion=0".to_owned(),
            "/apis/storage.k8s.io/v1/csinodes/node-5?&resourceVersion=0".to_owned(),
        ]
    );
    assert_eq!(fleet["read"]["requests"], 3 + 8, "{:#}", fleet["read"]);
    assert_eq!(fleet["read"]["cross_check"], false);
}

#[test]
fn the_fleet_view_pages_through_the_lists_and_names_each_node_a_driver_is_missing_on() {
    let server = fleet_of_seven();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig(&dir);
    let out = kpm(&[
        "doctor",
        "--cluster",
        "-o",
        "json",
        "--kubeconfig",
        &kubeconfig,
        "--page-size",
        "2",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let fleet: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|err| panic!("{err}: {}\n{stderr}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(out.status.code(), Some(1), "node-4 fails, node-6 is silent: {fleet:#}\n{stderr}");
    assert_eq!(fleet["ok"], false);

    read_at_the_reports_weight(&server, &fleet);

    let states: Vec<(&str, &str)> = fleet["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap(), n["doctor"]["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        [
            ("node-1", "healthy"),
            ("node-2", "healthy"),
            ("node-3", "healthy"),
            ("node-4", "failing"),
            ("node-5", "no-doctor"),
            ("node-6", "silent"),
            ("node-7", "healthy"),
        ]
    );
    let node4 = &fleet["nodes"][3];
    assert_eq!(node4["doctor"]["reason"], "Stale");
    assert_eq!(node4["source"], "report");
    assert_eq!(node4["kubelet_version"], "v1.36.2");
    assert_eq!(node4["failing_plugins"][0]["subject"], "csi.example.com-reg.sock");
    assert_eq!(node4["failing_plugins"][0]["verdict"], "stale");
    assert_eq!(fleet["nodes"][2]["source"], "condition", "node-3's doctor writes no report");

    let csi = driver(&fleet, "CSIPlugin", "csi.example.com");
    assert_eq!(
        (&csi["registered"], &csi["nodes"], &csi["has_object"]),
        (&4.into(), &7.into(), &true.into())
    );
    let missing = not_on(csi);
    assert_eq!(missing.len(), 3, "{missing:?}");
    assert_eq!(missing[0].0, "node-4");
    assert!(
        missing[0].1.starts_with(
            "csi.example.com-reg.sock (stale), a failing socket that cannot tell its name: \
             dial "
        ),
        "{missing:?}"
    );
    assert_eq!(missing[1], ("node-5".into(), "no doctor there".into()));
    assert_eq!(missing[2].0, "node-6");
    assert!(missing[2].1.starts_with("its doctor is silent since "), "{missing:?}");
    let unused = driver(&fleet, "CSIPlugin", "unused.example.com");
    assert_eq!(
        (&unused["registered"], not_on(unused).len()),
        (&0.into(), 7),
        "an object on no node"
    );
    let gpu = driver(&fleet, "DevicePlugin", "vendor.com/gpu");
    assert_eq!(gpu["registered"], 2);
    assert_eq!(
        not_on(gpu)[0],
        ("node-3".into(), "its doctor: all plugins ok, none of this name".into())
    );
    assert!(not_on(gpu)[1].1.contains(", a failing socket that cannot tell"), "{:?}", not_on(gpu));
    let dra = driver(&fleet, "DRAPlugin", "gpu.example.com");
    assert_eq!((&dra["registered"], not_on(dra).len()), (&2.into(), 5));
    assert_eq!(
        fleet["drivers"].as_array().unwrap().len(),
        4,
        "no hugepages, cpu or memory: {fleet:#}"
    );
}

#[test]
fn a_label_selector_narrows_the_nodes_and_a_healthy_fleet_exits_0() {
    let server = fleet_of_seven();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig(&dir);
    let out =
        kpm(&["doctor", "--cluster", "-o", "json", "--kubeconfig", &kubeconfig, "-l", "pool=b"]);
    let fleet: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{fleet:#}");
    assert_eq!(fleet["ok"], true);
    assert_eq!(fleet["nodes"].as_array().unwrap().len(), 1);
    assert_eq!(fleet["nodes"][0]["name"], "node-7");
    let csi = driver(&fleet, "CSIPlugin", "csi.example.com");
    assert_eq!((&csi["registered"], &csi["nodes"]), (&1.into(), &1.into()));
    assert!(
        fleet["drivers"].as_array().unwrap().iter().all(|d| d["kind"] == "CSIPlugin"),
        "node-7 has no gpu and no slice: {fleet:#}"
    );
    let requests = server.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("/api/v1/nodes?") && r.contains("labelSelector=pool%3Db")),
        "{requests:#?}"
    );
    let paged = requests.iter().filter(|r| !r.contains(WATCH_CACHE));
    assert!(paged.clone().all(|r| r.contains("limit=500")), "the default page: {requests:#?}");
}

#[test]
fn the_fleet_table_shows_drivers_then_nodes() {
    let server = fleet_of_seven();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig(&dir);
    let out = kpm(&["doctor", "--cluster", "--kubeconfig", &kubeconfig]);
    assert_eq!(out.status.code(), Some(1));
    let table = String::from_utf8(out.stdout).unwrap();
    let words = |line: &str| line.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(words(lines[0]), ["KIND", "DRIVER", "/", "RESOURCE", "REGISTERED", "NOT", "ON"]);
    assert_eq!(words(lines[1])[..4], ["csi", "csi.example.com", "4/7", "node-4:"]);
    // The socket and its verdict come first: the table cuts a long reason.
    assert!(
        lines[1].contains("node-4: csi.example.com-reg.sock (stale), a failing socket"),
        "{table}"
    );
    assert!(lines[2].trim() == "node-5: no doctor there", "{table}");
    assert!(lines[3].trim().starts_with("node-6: its doctor is silent since"), "{table}");
    let row = |first: &str, second: &str| {
        lines
            .iter()
            .find(|line| {
                words(line).first().map(String::as_str) == Some(first) && words(line)[1] == second
            })
            .unwrap_or_else(|| panic!("no row {first} {second} in\n{table}"))
    };
    assert_eq!(words(row("csi", "unused.example.com"))[2], "0/7");
    assert!(row("csi", "unused.example.com").contains("node-1: its doctor finds no plugin"));
    assert_eq!(words(row("device", "vendor.com/gpu"))[2], "2/7");
    assert_eq!(words(row("dra", "gpu.example.com"))[2], "2/7");
    let header = lines
        .iter()
        .position(|line| words(line).first().map(String::as_str) == Some("NODE"))
        .unwrap();
    assert_eq!(words(lines[header]), ["NODE", "DOCTOR", "KUBELET", "REASON", "FAILING", "PLUGINS"]);
    assert_eq!(words(lines[header + 1]), ["node-1", "healthy", "v1.36.2", "-", "-"]);
    assert_eq!(words(lines[header + 3]), ["node-3", "healthy", "-", "-", "-"]);
    assert_eq!(
        words(lines[header + 4]),
        ["node-4", "failing", "v1.36.2", "Stale", "csi.example.com-reg.sock", "(stale)"]
    );
    assert_eq!(words(lines[header + 5]), ["node-5", "no", "doctor", "-", "-", "-"]);
    assert_eq!(words(lines[header + 6])[..5], ["node-6", "silent", "-", "no", "heartbeat"]);
    assert!(
        table.ends_with(
            "\n7 nodes: 4 healthy, 1 failing, 0 cannot judge, 1 silent, 1 without a doctor\n"
        ),
        "{table}"
    );
}

#[test]
fn without_an_api_server_or_when_a_list_fails_one_line_names_the_step() {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(KPM)
        .args(["doctor", "--cluster"])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "nothing could be judged");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("kpm: error: find the API server: no --kubeconfig"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(out.stdout.is_empty());

    // An API server that serves no Node list (every request a 404).
    let server = ApiServer::of(State { fail: Some(404), ..State::default() });
    let kubeconfig = server.kubeconfig(&home);
    let out = kpm(&["doctor", "--cluster", "--kubeconfig", &kubeconfig]);
    assert_eq!(out.status.code(), Some(2), "nothing could be judged");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("kpm: error: read the fleet: list "), "{stderr}");
    assert!(stderr.contains("(page 1): refused by the test (404 NotFound)\n"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    // Nobody listening: the refused connection is named.
    let closed = format!("http://{}", kpm_test_support::free_local_addr());
    std::fs::write(&kubeconfig, api_server::kubeconfig(&closed)).unwrap();
    let out = kpm(&["doctor", "--cluster", "--kubeconfig", &kubeconfig]);
    assert_eq!(out.status.code(), Some(2), "nothing could be judged");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("kpm: error: read the fleet: list "), "{stderr}");
    assert!(stderr.contains("Connection refused"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    // The cluster-only flags need --cluster.
    let out = kpm(&["doctor", "--page-size", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cluster"));
}

#[test]
fn as_kubectl_kpm_it_is_a_kubectl_plugin() {
    let bin = tempfile::tempdir().unwrap();
    let plugin = bin.path().join("kubectl-kpm");
    std::os::unix::fs::symlink(KPM, &plugin).unwrap();
    let out = Command::new(&plugin).args(["doctor", "--help"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("Usage: kubectl kpm doctor [OPTIONS]"), "{help}");
    assert!(help.contains("--cluster"), "{help}");
    // Found on the PATH, as kubectl finds it, and working, not only helping.
    let server = fleet_of_seven();
    let kubeconfig = server.kubeconfig(&bin);
    let out = Command::new("kubectl-kpm")
        .env("PATH", bin.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", &kubeconfig)
        .args(["doctor", "--cluster", "-o", "json", "-l", "pool=b"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let fleet: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(fleet["nodes"][0]["name"], "node-7");
    // As `kpm`, its help names `kpm`.
    let help = String::from_utf8(kpm(&["doctor", "--help"]).stdout).unwrap();
    assert!(help.contains("Usage: kpm doctor [OPTIONS]"), "{help}");
}

// === At scale ===

/// A Node as big as real ones are (labels, annotations, managed fields,
/// 40 images), with a doctor's condition and a GPU.
fn big_node(i: usize, heartbeat: &str) -> Value {
    let images: Vec<Value> = (0..40)
        .map(|n| {
            json!({"names": [format!("registry.example.com/team-{n}/service-{n}@sha256:{:064x}", n * i), format!("registry.example.com/team-{n}/service-{n}:v1.{n}.{i}")], "sizeBytes": 123_456_789})
        })
        .collect();
    let labels: serde_json::Map<String, Value> = (0..15)
        .map(|n| (format!("example.com/label-{n}"), format!("value-{n}-{i}").into()))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": format!("node-{i:05}"), "uid": format!("{i:032x}"), "resourceVersion": "12345",
            "labels": labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true", "csi.volume.kubernetes.io/nodeid": format!("{{\"csi.example.com\":\"node-{i}\"}}")},
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:lastHeartbeatTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}}}, "f:images": {}, "f:nodeInfo": {"f:bootID": {}}}}}],
        },
        "spec": {"podCIDR": "10.0.0.0/24", "providerID": format!("aws:///us-east-1a/i-{i:017x}")},
        "status": {
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti", "hugepages-2Mi": "0", "vendor.com/gpu": if i.is_multiple_of(10) { "0" } else { "8" }},
            "allocatable": {"cpu": "63", "memory": "250Gi", "pods": "110", "vendor.com/gpu": "8"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "message": "kubelet has sufficient memory available", "lastHeartbeatTime": heartbeat, "lastTransitionTime": heartbeat},
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure", "message": "kubelet has no disk pressure", "lastHeartbeatTime": heartbeat, "lastTransitionTime": heartbeat},
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status", "lastHeartbeatTime": heartbeat, "lastTransitionTime": heartbeat},
                if i.is_multiple_of(10) {
                    json!({"type": "KubeletPluginsHealthy", "status": "False", "reason": "NotRegistered", "message": "1 failing: vendor.com/gpu (not-registered): the kubelet holds none of its 8 healthy devices", "lastHeartbeatTime": heartbeat, "lastTransitionTime": heartbeat})
                } else {
                    json!({"type": "KubeletPluginsHealthy", "status": "True", "reason": "PluginsHealthy", "message": "all 5 plugin sockets of the node are ok", "lastHeartbeatTime": heartbeat, "lastTransitionTime": heartbeat})
                },
            ],
            "nodeInfo": {"machineID": format!("{i:032x}"), "kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04", "containerRuntimeVersion": "containerd://2.0.0", "kubeletVersion": "v1.34.0", "architecture": "amd64", "operatingSystem": "linux"},
            "images": images,
        },
    })
}

/// The report of `big_node(i)`'s doctor: four plugins, the GPU's failing on
/// every tenth node.
fn big_report(i: usize, heartbeat: &str) -> Value {
    let registry = "/var/lib/kubelet/plugins_registry";
    let csi = format!("{registry}/csi.example.com-reg.sock");
    let nfs = format!("{registry}/nfs.csi.k8s.io-reg.sock");
    let dra = format!("{registry}/gpu.example.com-reg.sock");
    let failing = i.is_multiple_of(10);
    let gpu = if failing {
        ("not-registered", "the kubelet holds none of its 8 healthy devices")
    } else {
        ("ok", "8 healthy")
    };
    let plugins = [
        (csi.as_str(), Some("csi.example.com"), "ok", "registered"),
        (nfs.as_str(), Some("nfs.csi.k8s.io"), "ok", "registered"),
        (dra.as_str(), Some("gpu.example.com"), "ok", "registered"),
        ("/var/lib/kubelet/device-plugins/gpu.sock", Some("vendor.com/gpu"), gpu.0, gpu.1),
    ];
    let health = if failing { ("Failing", "NotRegistered") } else { ("Healthy", "PluginsHealthy") };
    // What big_node(i)'s objects show.
    let mut registered = Vec::new();
    if !i.is_multiple_of(50) {
        registered.extend(["CSIPlugin:csi.example.com", "CSIPlugin:nfs.csi.k8s.io"]);
    }
    if !failing {
        registered.push("DevicePlugin:vendor.com/gpu");
    }
    registered.push("DRAPlugin:gpu.example.com");
    let registered = registered.join(",");
    report(&format!("node-{i:05}"), health, &plugins, Some(&registered), heartbeat)
}

/// Peak resident memory of a process so far, in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

#[test]
fn five_thousand_nodes_and_twenty_thousand_slices_are_read_in_bounded_memory() {
    const NODES: usize = 5000;
    let heartbeat = ago(1);
    let mut nodes = Collection::new("/api/v1/nodes", "Node", "v1");
    let mut csinodes =
        Collection::new("/apis/storage.k8s.io/v1/csinodes", "CSINode", "storage.k8s.io/v1");
    let mut slices = Collection::new(
        "/apis/resource.k8s.io/v1/resourceslices",
        "ResourceSlice",
        "resource.k8s.io/v1",
    );
    for i in 0..NODES {
        let node = big_node(i, &heartbeat);
        assert!(node.to_string().len() > 8000, "as big as a real Node");
        nodes.push(&node);
        let drivers: Vec<Value> = ["csi.example.com", "nfs.csi.k8s.io"]
            .iter()
            .filter(|_| i % 50 != 0)
            .map(|name| json!({"name": name, "nodeID": format!("node-{i:05}"), "topologyKeys": ["topology.example.com/zone"], "allocatable": {"count": 39}}))
            .collect();
        csinodes.push(
            &json!({"metadata": {"name": format!("node-{i:05}")}, "spec": {"drivers": drivers}}),
        );
        for s in 0..4 {
            let devices: Vec<Value> = (0..8)
                .map(|d| json!({"name": format!("gpu-{d}"), "attributes": {"model": {"string": "A100"}, "uuid": {"string": format!("GPU-{i:08x}-{s}-{d}")}}, "capacity": {"memory": {"value": "80Gi"}}}))
                .collect();
            slices.push(&json!({
                "metadata": {"name": format!("node-{i:05}-gpu.example.com-{s}")},
                "spec": {"driver": "gpu.example.com", "nodeName": format!("node-{i:05}"),
                         "pool": {"name": format!("node-{i:05}"), "generation": 1, "resourceSliceCount": 4},
                         "devices": devices},
            }));
        }
    }
    let mut reports = reports();
    for i in 0..NODES {
        reports.push(&big_report(i, &heartbeat));
    }
    let mut drivers =
        Collection::new("/apis/storage.k8s.io/v1/csidrivers", "CSIDriver", "storage.k8s.io/v1");
    drivers.push(&json!({"metadata": {"name": "csi.example.com"}}));
    let server = ApiServer::serve(vec![reports, nodes, drivers, csinodes, slices]);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig(&dir);

    let started = Instant::now();
    let mut child = Command::new(KPM)
        .args(["doctor", "--cluster", "-o", "json", "--kubeconfig", &kubeconfig, "--timeout", "60"])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut out).unwrap();
        out
    });
    // VmHWM only grows: the last reading before the exit is the peak but
    // for what the process does after it, which is printing and exiting.
    let mut peak = 0;
    let deadline = Instant::now() + kpm_test_support::DEADLINE * 4;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "kpm doctor --cluster did not end");
        peak = peak_rss(pid).unwrap_or(peak).max(peak);
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = started.elapsed();
    let status = child.wait().unwrap();
    let out = reader.join().unwrap();
    let fleet: Value = serde_json::from_slice(&out).unwrap_or_else(|err| {
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        panic!("{err}: {stderr}")
    });
    eprintln!("{NODES} nodes read and judged in {took:?}, peak RSS {} MiB", peak >> 20);
    assert_eq!(status.code(), Some(1), "every tenth node fails");
    assert_eq!(fleet["nodes"].as_array().unwrap().len(), NODES);
    let gpu = driver(&fleet, "DevicePlugin", "vendor.com/gpu");
    assert_eq!((&gpu["registered"], not_on(gpu).len()), (&4500.into(), 500));
    assert!(
        not_on(gpu)[0].1.starts_with("vendor.com/gpu (not-registered)"),
        "{:?}",
        not_on(gpu)[0]
    );
    assert_eq!(driver(&fleet, "CSIPlugin", "csi.example.com")["registered"], 4900);
    assert_eq!(driver(&fleet, "DRAPlugin", "gpu.example.com")["registered"], NODES);
    // The reports speak for every node: no Node, CSINode or slice is read
    // but the Nodes' names, and the 500 failing nodes' reports in full, and
    // one healthy node's, for the pods serving the drivers missing elsewhere.
    let requests = server.requests();
    let asked = |prefix: &str| requests.iter().filter(|r| r.starts_with(prefix)).count();
    assert_eq!(asked("/api/v1/nodes?"), 1, "one table, from the watch cache");
    assert_eq!(asked("/api/v1/nodes/"), 0);
    assert_eq!(asked("/apis/storage.k8s.io/v1/csinodes"), 0);
    assert_eq!(asked("/apis/resource.k8s.io/v1/resourceslices"), 0);
    assert_eq!(asked(&format!("{}?", *REPORTS)), 1);
    assert_eq!(asked(&format!("{}/", *REPORTS)), NODES / 10 + 1);
    let read = &fleet["read"];
    assert_eq!(read["requests"], 2 + 1 + NODES / 10 + 1, "{read}");
    eprintln!("{} bytes read in {} requests", read["bytes"], read["requests"]);
    assert!(peak > 0, "VmHWM was read");
    assert!(peak <= 150 << 20, "peak RSS {} MiB, over 150 MiB", peak >> 20);
}

/// A report that says a CSI driver is registered where its CSINode does
/// not list it: the default read believes it; the cross-check reads every
/// node's objects and names the node.
#[test]
fn the_cross_check_finds_a_report_that_lies_and_names_its_node() {
    let healthy =
        || Some(plugins_condition("True", "PluginsHealthy", "all 1 plugin sockets ok", &ago(5)));
    let cpus = json!({"cpu": "8"});
    let mut nodes = Collection::new("/api/v1/nodes", "Node", "v1");
    let mut csinodes =
        Collection::new("/apis/storage.k8s.io/v1/csinodes", "CSINode", "storage.k8s.io/v1");
    let mut reports = reports();
    let ok = [(
        "/var/lib/kubelet/plugins_registry/csi.example.com-reg.sock",
        Some("csi.example.com"),
        "ok",
        "registered",
    )];
    for (name, lists) in [("honest", true), ("liar", false)] {
        nodes.push(&node(name, "a", healthy(), &cpus));
        let drivers =
            if lists { json!([{"name": "csi.example.com", "nodeID": name}]) } else { json!([]) };
        csinodes.push(&json!({"metadata": {"name": name}, "spec": {"drivers": drivers}}));
        let registered = Some("CSIPlugin:csi.example.com");
        reports.push(&report(name, ("Healthy", "PluginsHealthy"), &ok, registered, &ago(5)));
    }
    let drivers =
        Collection::new("/apis/storage.k8s.io/v1/csidrivers", "CSIDriver", "storage.k8s.io/v1");
    let slices = Collection::new(
        "/apis/resource.k8s.io/v1/resourceslices",
        "ResourceSlice",
        "resource.k8s.io/v1",
    );
    let server = ApiServer::serve(vec![reports, nodes, drivers, csinodes, slices]);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig(&dir);

    let believed = kpm(&["doctor", "--cluster", "-o", "json", "--kubeconfig", &kubeconfig]);
    assert_eq!(believed.status.code(), Some(0), "{}", String::from_utf8_lossy(&believed.stderr));
    assert!(!server.requests().iter().any(|r| r.contains("csinodes")), "{:#?}", server.requests());

    // A page a node: the whole lists are paged to their end.
    let json = ["-o", "json", "--cross-check", "--page-size", "1"];
    let checked = kpm(&[&["doctor", "--cluster", "--kubeconfig", &kubeconfig][..], &json].concat());
    let fleet: Value = serde_json::from_slice(&checked.stdout).unwrap();
    assert_eq!(checked.status.code(), Some(1), "{fleet:#}");
    assert_eq!(
        fleet["disagreements"],
        json!([{"node": "liar", "kind": "CSIPlugin", "name": "csi.example.com",
                "report_shows": true}])
    );
    assert_eq!(fleet["read"]["cross_check"], true);
    let requests = server.requests();
    for list in ["/api/v1/nodes?", "/apis/storage.k8s.io/v1/csinodes?"] {
        assert!(
            requests
                .iter()
                .any(|r| r.starts_with(list) && r.ends_with("&limit=1&continue=offset-1")),
            "the second page from the first's token: {requests:#?}"
        );
    }
    assert_eq!(driver(&fleet, "CSIPlugin", "csi.example.com")["registered"], 1, "the objects win");

    let table = kpm(&["doctor", "--cluster", "--kubeconfig", &kubeconfig, "--cross-check"]);
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.contains(
            "cross-check: 1 report(s) disagree with their node's objects\n  liar: its report \
             shows CSIPlugin csi.example.com registered, but its CSINode does not list it\n"
        ),
        "{table}"
    );
}

/// A CSI driver's DaemonSet (`csi/csi-node`, pods `app=csi-node` on Linux
/// nodes) registered on node-1 only: node-2 has a taint its pods do not
/// tolerate, node-3 runs its pod with the registrar crash-looping, node-4
/// lacks the label its nodeSelector asks for. Every node's doctor is
/// healthy, and node-1's names the pod serving the driver.
fn fleet_with_a_daemon_set() -> ApiServer {
    let mut nodes = Collection::new("/api/v1/nodes", "Node", "v1");
    for (name, linux, taint) in [
        ("node-1", true, None),
        ("node-2", true, Some(json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}))),
        ("node-3", true, None),
        ("node-4", false, None),
    ] {
        let mut object = node(name, "a", None, &json!({"cpu": "8"}));
        if linux {
            object["metadata"]["labels"]["kubernetes.io/os"] = "linux".into();
        }
        if let Some(taint) = taint {
            object["spec"] = json!({"taints": [taint]});
        }
        nodes.push(&object);
    }
    let mut reports = reports();
    let mut serving = report(
        "node-1",
        ("Healthy", "PluginsHealthy"),
        &[(
            "/var/lib/kubelet/plugins_registry/csi.example.com-reg.sock",
            Some("csi.example.com"),
            "ok",
            "registered",
        )],
        Some("CSIPlugin:csi.example.com"),
        &ago(5),
    );
    serving["status"]["plugins"][0]["pod"] = json!({
        "namespace": "csi", "pod": "csi-node-1", "uid": "u1", "container": "node-driver-registrar",
        "restarts": 0, "state": "Running",
    });
    reports.push(&serving);
    for name in ["node-2", "node-3", "node-4"] {
        reports.push(&report(name, ("Healthy", "PluginsHealthy"), &[], Some(""), &ago(5)));
    }
    let owner = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "csi-node", "uid": "ds", "controller": true}]);
    let mut pods = Collection::new("/api/v1/namespaces/csi/pods", "Pod", "v1");
    pods.push(&json!({
        "metadata": {"name": "csi-node-1", "namespace": "csi", "labels": {"app": "csi-node"}, "ownerReferences": owner},
        "spec": {"nodeName": "node-1", "containers": []},
        "status": {"phase": "Running"},
    }));
    pods.push(&json!({
        "metadata": {"name": "csi-node-3", "namespace": "csi", "labels": {"app": "csi-node"}, "ownerReferences": owner},
        "spec": {"nodeName": "node-3", "containers": []},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": "driver", "ready": true, "restartCount": 0, "image": "d", "imageID": "d",
             "state": {"running": {}}},
            {"name": "node-driver-registrar", "ready": false, "restartCount": 7, "image": "r", "imageID": "r",
             "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
        ]},
    }));
    let mut daemon_sets =
        Collection::new("/apis/apps/v1/namespaces/csi/daemonsets", "DaemonSet", "apps/v1");
    daemon_sets.push(&json!({
        "metadata": {"name": "csi-node", "namespace": "csi"},
        "spec": {
            "selector": {"matchLabels": {"app": "csi-node"}},
            "template": {"metadata": {"labels": {"app": "csi-node"}}, "spec": {
                "nodeSelector": {"kubernetes.io/os": "linux"}, "containers": [],
            }},
        },
    }));
    let mut drivers =
        Collection::new("/apis/storage.k8s.io/v1/csidrivers", "CSIDriver", "storage.k8s.io/v1");
    drivers.push(&json!({"metadata": {"name": "csi.example.com"}, "spec": {}}));
    let csinodes =
        Collection::new("/apis/storage.k8s.io/v1/csinodes", "CSINode", "storage.k8s.io/v1");
    let collections = vec![reports, nodes, drivers, csinodes, pods, daemon_sets];
    // No ResourceSlices: a cluster without DRA.
    let refused = vec![("resourceslices".to_owned(), 404)];
    ApiServer::of(State { collections, refused, ..State::default() })
}

#[test]
fn a_driver_missing_on_a_node_is_traced_to_its_daemon_set_and_why_its_pod_is_not_working_there() {
    let server = fleet_with_a_daemon_set();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig(&dir);
    let out = kpm(&["doctor", "--cluster", "-o", "json", "--kubeconfig", &kubeconfig]);
    let fleet: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|err| panic!("{err}: {}", String::from_utf8_lossy(&out.stderr)));
    let csi = driver(&fleet, "CSIPlugin", "csi.example.com");
    assert_eq!(csi["daemon_set"], "csi/csi-node", "{csi:#}");
    let pod_on = |node: &str| {
        csi["not_on"].as_array().unwrap().iter().find(|n| n["node"] == node).unwrap()["pod"].clone()
    };
    let tainted = pod_on("node-2");
    assert_eq!(tainted["state"], "not-scheduled");
    assert!(
        tainted["why"].as_str().unwrap().contains("taint dedicated=gpu:NoSchedule"),
        "{tainted}"
    );
    let looping = pod_on("node-3");
    assert_eq!((&looping["state"], &looping["pod"]), (&"not-ready".into(), &"csi-node-3".into()));
    assert!(
        looping["why"]
            .as_str()
            .unwrap()
            .contains("node-driver-registrar CrashLoopBackOff, 7 restarts"),
        "{looping}"
    );
    let unselected = pod_on("node-4");
    assert!(
        unselected["why"].as_str().unwrap().contains("nodeSelector kubernetes.io/os=linux"),
        "{unselected}"
    );

    let table = kpm(&["doctor", "--cluster", "--kubeconfig", &kubeconfig]);
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.contains("(DaemonSet csi/csi-node)"), "{table}");
    assert!(
        table.contains("node-2: no pod there: the node's taint dedicated=gpu:NoSchedule"),
        "{table}"
    );
}
