//! The `fleet-scale` scenario: `kpm doctor --cluster` over 2000 then
//! 20,000 Nodes shaped like a managed cluster's (each over 15 KB: images,
//! labels, annotations, addresses, conditions, `nodeInfo`), each with its
//! doctor's condition and a `KubeletPluginReport` of ten entries (1 in 50
//! failing; 1 in 250 without a doctor, 1 in 250 whose doctor writes its
//! condition only), a CSINode and four ResourceSlices, on the real
//! kube-apiserver. For each size it prints, per run, kpm's wall time, CPU
//! time, peak RSS, and the bytes and requests it read (counted at its
//! client); beside them the anchors on the same cluster, asked as kubectl
//! asks (`kubectl get nodes` and `kubectl get kpr` as tables, `kubectl get
//! kpr -o json`) and the cross-check (`--cross-check`, the full read). A
//! timed scenario, not a test: the targets (3 s and 150 MB at 20,000; 1.5 s
//! at 2000) are printed, not asserted. What it asserts: every node judged,
//! every failing node named, no report disagreeing with its objects, and
//! the default read never more than the full reports plus the Nodes' names.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Cluster;
use crate::command::Result;
use crate::kube_e2e::api::{Api, CSIDRIVERS, CSINODES, REPORTS, SLICES, slice};
use crate::kube_e2e::{ADMIN_TOKEN, Env};

/// The fleet is measured at these sizes, grown in place.
const SIZES: [usize; 2] = [2000, 20_000];
const SLICES_PER_NODE: usize = 4;
/// Threads creating the objects.
const WRITERS: usize = 8;
/// `kubectl get`'s page.
const PAGE_SIZE: usize = 500;
/// What kubectl asks a list's table with.
const KUBECTL_TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// The CSI drivers, device resources and DRA driver of every node: with
/// `csi.example.com`'s registration socket, ten entries a report.
const CSI: [&str; 5] = [
    "csi.example.com",
    "nfs.csi.k8s.io",
    "ebs.csi.aws.com",
    "secrets-store.csi.k8s.io",
    "smb.csi.k8s.io",
];
const DEVICES: [&str; 4] =
    ["vendor.com/gpu", "example.com/nic", "example.com/fpga", "example.com/ssd"];
const DRA: &str = "gpu.example.com";

pub(super) fn fleet_scale(env: &Env, cluster: &mut Cluster) -> Result {
    cluster.api.post(
        CSIDRIVERS,
        &json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": "csi.example.com"}, "spec": {}}),
    )?;
    let admin = cluster.kubeconfig("admin-kubeconfig", ADMIN_TOKEN)?;
    let mut created = 0;
    for size in SIZES {
        let started = Instant::now();
        create_fleet(&cluster.api, created..size)?;
        eprintln!(
            "{size} Nodes (over 15 KB each) with their doctors' conditions and reports, {size} \
             CSINodes and {} ResourceSlices; the {} new ones created in {:?}",
            size * SLICES_PER_NODE,
            size - created,
            started.elapsed()
        );
        created = size;
        let api = cluster.api.as_token(ADMIN_TOKEN);
        measure(env, &api, &admin, size)?;
        if size == SIZES[0] {
            a_lie_is_found(env, &api, &admin)?;
        }
    }
    Ok(())
}

/// A report that lies (it shows a CSI driver registered that its CSINode
/// does not list): the default read believes it, the cross-check names the
/// node. Then the report tells the truth again.
fn a_lie_is_found(env: &Env, api: &Api, admin: &std::path::Path) -> Result {
    let liar = "fleet-scale-00042";
    let path = format!("{}/{liar}/status", *REPORTS);
    let report = api.get(&format!("{}/{liar}", *REPORTS))?;
    let honest = report["status"]["registered"].as_str().ok_or("no registered")?.to_owned();
    let set = |registered: &str| -> Result {
        let status = json!({"status": {"registered": registered}});
        let (code, body) = api.request("PATCH", &path, Some(&status))?;
        if (200..300).contains(&code) {
            Ok(())
        } else {
            Err(format!("PATCH {path}: {code} {body}").into())
        }
    };
    set(&format!("{honest},CSIPlugin:lying.example.com"))?;
    let believed = run_doctor(env, admin, &[])?;
    let checked = run_doctor(env, admin, &["--cross-check"])?;
    set(&honest)?;
    if !believed.fleet["disagreements"].as_array().is_some_and(Vec::is_empty) {
        return Err(format!(
            "the default read judged objects: {}",
            believed.fleet["disagreements"]
        )
        .into());
    }
    let expected = json!([{"node": liar, "kind": "CSIPlugin", "name": "lying.example.com",
                           "report_shows": true}]);
    if checked.fleet["disagreements"] != expected {
        return Err(format!("the cross-check found {}", checked.fleet["disagreements"]).into());
    }
    eprintln!("  a report that lies: {liar}'s, named by the cross-check only");
    Ok(())
}

/// Creates the objects of nodes `range`, in parallel.
fn create_fleet(api: &Api, range: std::ops::Range<usize>) -> Result {
    std::thread::scope(|scope| -> Result {
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let api = api.as_token(ADMIN_TOKEN);
                let range = range.clone();
                scope.spawn(move || -> std::result::Result<(), String> {
                    for n in range.skip(writer).step_by(WRITERS) {
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
    })
}

/// The anchors, then `kpm doctor --cluster` three times and with
/// `--cross-check` once, over a fleet of `size`.
fn measure(env: &Env, api: &Api, admin: &std::path::Path, size: usize) -> Result {
    let mb = |bytes: usize| f64::from(u32::try_from(bytes).unwrap_or(u32::MAX)) / 1e6;
    let nodes_table = read_list(api, "/api/v1/nodes", KUBECTL_TABLE)?;
    let reports_table = read_list(api, &REPORTS, KUBECTL_TABLE)?;
    let reports_json = read_list(api, &REPORTS, "application/json")?;
    for (what, (took, pages, bytes)) in [
        ("kubectl get nodes (a table)", nodes_table),
        ("kubectl get kpr (a table)", reports_table),
        ("kubectl get kpr -o json", reports_json),
    ] {
        eprintln!("  {size} nodes, as {what} asks: {:.1} MB in {pages} pages, {took:?}", mb(bytes));
    }
    let failing_nodes = (0..size).filter(|n| has_report(*n) && n % 50 == 3).count();
    for run in 1..=3 {
        let doctor = run_doctor(env, admin, &[])?;
        eprintln!(
            "  {size} nodes, kpm doctor --cluster run {run}: {:?} wall, {:?} on a CPU, peak RSS \
             {:.1} MB, {:.1} MB read in {} requests",
            doctor.wall,
            doctor.cpu,
            doctor.peak_mb,
            mb(doctor.bytes),
            doctor.requests
        );
        check(&doctor.fleet, size, failing_nodes)?;
        // The reports in full and the Nodes' names are the bound.
        if doctor.bytes > reports_json.2 + nodes_table.2 {
            return Err(format!(
                "kpm read {} bytes, more than the full reports ({}) and the Nodes' table ({})",
                doctor.bytes, reports_json.2, nodes_table.2
            )
            .into());
        }
    }
    let checked = run_doctor(env, admin, &["--cross-check"])?;
    eprintln!(
        "  {size} nodes, kpm doctor --cluster --cross-check: {:?} wall, {:?} on a CPU, peak RSS \
         {:.1} MB, {:.1} MB read in {} requests",
        checked.wall,
        checked.cpu,
        checked.peak_mb,
        mb(checked.bytes),
        checked.requests
    );
    check(&checked.fleet, size, failing_nodes)?;
    match checked.fleet["disagreements"].as_array() {
        Some(found) if found.is_empty() => Ok(()),
        _ => Err(format!("the cross-check disagrees: {}", checked.fleet["disagreements"]).into()),
    }
}

/// One run of `kpm doctor --cluster`, as seen from outside.
struct DoctorRun {
    wall: Duration,
    cpu: Duration,
    peak_mb: f64,
    bytes: usize,
    requests: u64,
    fleet: Value,
}

/// `kpm doctor --cluster -o json EXTRA`, its peak RSS and CPU time read
/// from `/proc` while it runs.
fn run_doctor(env: &Env, admin: &std::path::Path, extra: &[&str]) -> Result<DoctorRun> {
    let started = Instant::now();
    let mut child = Command::new(&env.kpm)
        .args(["doctor", "--cluster", "-o", "json", "--kubeconfig"])
        .arg(admin)
        .args(extra)
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
    let wall = started.elapsed();
    let output = reader.join().map_err(|_| "the reader panicked")??;
    let fleet: Value = serde_json::from_str(&output)
        .map_err(|err| format!("kpm doctor --cluster -o json: {err}"))?;
    let run = DoctorRun {
        wall,
        cpu: Duration::from_nanos(cpu_ns),
        peak_mb: f64::from(u32::try_from(peak_kib).unwrap_or(u32::MAX)) / 1024.0,
        bytes: fleet["read"]["bytes"].as_u64().and_then(|b| usize::try_from(b).ok()).unwrap_or(0),
        requests: fleet["read"]["requests"].as_u64().unwrap_or(0),
        fleet,
    };
    Ok(run)
}

/// Every node judged (the cluster's own two too), each from where it
/// should be, and every failing node named with its stale socket.
fn check(fleet: &Value, size: usize, failing_nodes: usize) -> Result {
    let nodes = fleet["nodes"].as_array().map_or(&[][..], Vec::as_slice);
    if nodes.len() < size {
        return Err(format!("kpm doctor --cluster saw {} nodes, not {size}", nodes.len()).into());
    }
    let scale = || {
        nodes.iter().filter(|n| n["name"].as_str().is_some_and(|n| n.starts_with("fleet-scale-")))
    };
    let from = |source: &str| scale().filter(|n| n["source"] == source).count();
    let (reports, conditions) = (from("report"), from("condition"));
    let expected = (0..size).filter(|n| has_report(*n)).count();
    let condition_only = (0..size).filter(|n| n % 250 == 9).count();
    if reports != expected || conditions != condition_only {
        return Err(format!(
            "{reports} nodes read from their reports (not {expected}) and {conditions} from their \
             conditions (not {condition_only})"
        )
        .into());
    }
    let named = scale()
        .filter(|n| {
            n["doctor"]["state"] == "failing"
                && n["failing_plugins"][0]["subject"] == "csi.example.com-reg.sock"
        })
        .count();
    if named != failing_nodes {
        return Err(format!("{named} failing nodes named, not {failing_nodes}").into());
    }
    Ok(())
}

/// A list read page by page as kubectl reads it, with `accept`: the time,
/// the pages and the bytes.
fn read_list(api: &Api, list: &str, accept: &str) -> Result<(Duration, usize, usize)> {
    #[derive(serde::Deserialize)]
    struct Page {
        metadata: PageMeta,
    }
    #[derive(serde::Deserialize)]
    struct PageMeta {
        #[serde(rename = "continue", default)]
        continue_token: Option<String>,
    }
    let started = Instant::now();
    let (mut pages, mut bytes, mut token) = (0, 0, None::<String>);
    loop {
        let path = match &token {
            None => format!("{list}?limit={PAGE_SIZE}"),
            Some(token) => format!("{list}?limit={PAGE_SIZE}&continue={token}"),
        };
        let (code, text) = api.get_text(&path, accept)?;
        if code != 200 {
            return Err(format!("GET {path}: {code}").into());
        }
        let page: Page = serde_json::from_str(&text).map_err(|err| format!("GET {path}: {err}"))?;
        pages += 1;
        bytes += text.len();
        match page.metadata.continue_token.filter(|token| !token.is_empty()) {
            Some(next) => token = Some(next),
            None => return Ok((started.elapsed(), pages, bytes)),
        }
    }
}

/// Whether node `n`'s doctor writes a report: 1 in 250 has no doctor, 1 in
/// 250 a doctor that writes its condition only.
fn has_report(n: usize) -> bool {
    n % 250 != 7 && n % 250 != 9
}

/// Node `fleet-scale-N`, shaped as a managed cluster's, with its doctor's
/// condition (1 in 50 failing: `csi.example.com`'s registration socket is
/// stale, and its CSINode does not list it; none on a node without a
/// doctor) and report (but where [`has_report`] says not), its CSINode and
/// its slices.
fn create_node_objects(api: &Api, n: usize) -> Result {
    let name = format!("fleet-scale-{n:05}");
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let failing = n % 50 == 3;
    let condition = match () {
        () if n % 250 == 7 => None,
        () if failing => Some(json!({"type": "KubeletPluginsHealthy", "status": "False",
            "reason": "Stale",
            "message": "1 failing: csi.example.com-reg.sock (stale): dial: Connection refused",
            "lastHeartbeatTime": now, "lastTransitionTime": now})),
        () => Some(json!({"type": "KubeletPluginsHealthy", "status": "True",
            "reason": "PluginsHealthy", "message": "all 10 plugin sockets of the node are ok",
            "lastHeartbeatTime": now, "lastTransitionTime": now})),
    };
    let node = real_node(&name, n, condition, &now);
    if node.to_string().len() < 15_000 {
        return Err(format!(
            "{name} is lighter than a real Node: {} bytes",
            node.to_string().len()
        )
        .into());
    }
    api.post("/api/v1/nodes", &node)?;
    let drivers: Vec<Value> = CSI
        .iter()
        .filter(|driver| !failing || **driver != "csi.example.com")
        .map(|driver| {
            json!({"name": driver, "nodeID": format!("{name}-id"),
                   "topologyKeys": ["topology.kubernetes.io/zone"], "allocatable": {"count": 25}})
        })
        .collect();
    api.post(
        CSINODES,
        &json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": name}, "spec": {"drivers": drivers}}),
    )?;
    for index in 0..SLICES_PER_NODE {
        api.post(SLICES, &slice(&format!("{name}-{index}"), DRA, &name, 4))?;
    }
    if has_report(n) {
        create_report(api, &name, failing, &now)?;
    }
    Ok(())
}

/// Where a managed cluster's images come from.
const REGISTRY: &str = "europe-west1-docker.pkg.dev/example-project/images";

/// A Node as a managed cluster's kubelet and cloud controller write it:
/// 50 images with their digests, 20-odd labels and annotations, addresses,
/// the five kubelet conditions and `condition`, `nodeInfo`, capacity with
/// [`DEVICES`].
fn real_node(name: &str, n: usize, condition: Option<Value>, now: &str) -> Value {
    let images: Vec<Value> = (0..50)
        .map(|i| {
            json!({"names": [
                format!("{REGISTRY}/team-{i}/service-{i}@sha256:{:064x}", n * 50 + i),
                format!("{REGISTRY}/team-{i}/service-{i}:v1.{i}.{}", n % 7),
            ], "sizeBytes": 50_000_000 + i * 1_000_003})
        })
        .collect();
    let kubelet_condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let mut conditions = vec![
        kubelet_condition(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        kubelet_condition(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
        ),
        kubelet_condition(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        kubelet_condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        kubelet_condition(
            "NetworkUnavailable",
            "False",
            "RouteCreated",
            "RouteController created a route",
        ),
    ];
    conditions.extend(condition);
    let mut capacity = json!({"cpu": "32", "memory": "131896440Ki", "pods": "110",
        "ephemeral-storage": "507944172Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0"});
    for device in DEVICES {
        capacity[device] = "4".into();
    }
    let zone = format!("europe-west1-{}", ["a", "b", "c"][n % 3]);
    json!({"apiVersion": "v1", "kind": "Node",
    "metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "n2-standard-32",
        "beta.kubernetes.io/instance-type": "n2-standard-32",
        "topology.kubernetes.io/region": "europe-west1", "topology.kubernetes.io/zone": zone,
        "failure-domain.beta.kubernetes.io/region": "europe-west1",
        "failure-domain.beta.kubernetes.io/zone": zone,
        "cloud.google.com/gke-nodepool": format!("pool-{}", n % 20),
        "cloud.google.com/gke-os-distribution": "cos", "cloud.google.com/machine-family": "n2",
        "cloud.google.com/gke-boot-disk": "pd-balanced", "cloud.google.com/gke-container-runtime": "containerd",
        "topology.gke.io/zone": zone, "node.kubernetes.io/masq-agent-ds-ready": "true",
        "iam.gke.io/gke-metadata-server-enabled": "true", "team.example.com/owner": format!("team-{}", n % 40),
    }, "annotations": {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "csi.volume.kubernetes.io/nodeid": format!(
            "{{\"csi.example.com\":\"{name}-id\",\"ebs.csi.aws.com\":\"i-{n:017x}\"}}"),
        "container.googleapis.com/instance_id": format!("{:019}", n * 7919),
        "node.gke.io/last-applied-node-labels": "cloud.google.com/gke-boot-disk=pd-balanced,cloud.google.com/gke-container-runtime=containerd,cloud.google.com/gke-nodepool=pool,cloud.google.com/gke-os-distribution=cos,cloud.google.com/machine-family=n2",
    }},
    "spec": {"podCIDR": format!("10.{}.{}.0/24", n / 256 % 256, n % 256),
             "providerID": format!("gce://project/europe-west1/{name}")},
    "status": {
        "capacity": capacity.clone(), "allocatable": capacity,
        "conditions": conditions,
        "addresses": [
            {"type": "InternalIP", "address": format!("10.132.{}.{}", n / 256 % 256, n % 256)},
            {"type": "ExternalIP", "address": format!("34.{}.{}.{}", n / 65536 % 256, n / 256 % 256, n % 256)},
            {"type": "InternalDNS", "address": format!("{name}.europe-west1-b.c.project.internal")},
            {"type": "Hostname", "address": format!("{name}.europe-west1-b.c.project.internal")},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": format!("{n:032x}"), "systemUUID": format!("{n:032x}"),
            "bootID": format!("{:032x}", n * 31), "kernelVersion": "6.6.56+",
            "osImage": "Container-Optimized OS from Google", "containerRuntimeVersion": "containerd://1.7.24",
            "kubeletVersion": "v1.36.2", "kubeProxyVersion": "v1.36.2",
            "operatingSystem": "linux", "architecture": "amd64"},
        "images": images,
    }})
}

/// Node `name`'s `KubeletPluginReport` as its doctor writes it, ten
/// entries: created, then its status (a subresource, which a create leaves
/// out).
fn create_report(api: &Api, name: &str, failing: bool, now: &str) -> Result {
    api.post(
        &REPORTS,
        &json!({"apiVersion": "doctor.kpm.io/v1alpha1", "kind": "KubeletPluginReport",
            "metadata": {"name": name}, "spec": {"nodeName": name}}),
    )?;
    let registry = "/var/lib/kubelet/plugins_registry";
    let entry = |kind: &str, socket: String, name: Option<&str>, verdict: &str, reason: &str| {
        json!({"socket": socket, "type": kind, "name": name, "verdict": verdict,
               "reason": reason, "since": now})
    };
    let mut plugins = Vec::new();
    let mut registered = Vec::new();
    for driver in CSI {
        let socket = format!("{registry}/{driver}-reg.sock");
        if failing && driver == "csi.example.com" {
            let refused = format!("dial {socket}: Connection refused (os error 111)");
            plugins.insert(0, entry("CSIPlugin", socket, None, "stale", &refused));
        } else {
            plugins.push(entry(
                "CSIPlugin",
                socket,
                Some(driver),
                "ok",
                "registered; CSINode lists it",
            ));
            registered.push(format!("CSIPlugin:{driver}"));
        }
    }
    for device in DEVICES {
        let socket = format!("/var/lib/kubelet/device-plugins/{}.sock", device.replace('/', "-"));
        plugins.push(entry(
            "DevicePlugin",
            socket,
            Some(device),
            "ok",
            "4 healthy devices, the Node's capacity 4",
        ));
        registered.push(format!("DevicePlugin:{device}"));
    }
    let socket = format!("{registry}/{DRA}-reg.sock");
    plugins.push(entry("DRAPlugin", socket, Some(DRA), "ok", "4 ResourceSlice(s) of this node"));
    registered.push(format!("DRAPlugin:{DRA}"));
    let (health, reason) =
        if failing { ("Failing", "Stale") } else { ("Healthy", "PluginsHealthy") };
    let status = json!({"status": {
        "health": health, "reason": reason,
        "kubelet": {"rootDir": "/var/lib/kubelet", "foundBy": "the running kubelet, pid 1042",
                    "version": "v1.36.2"},
        "counts": {"plugins": plugins.len(), "failing": u32::from(failing), "omitted": 0},
        "plugins": plugins, "findings": [], "registered": registered.join(","),
        "heartbeatTime": now, "doctorVersion": env!("CARGO_PKG_VERSION"),
    }});
    let (code, body) =
        api.request("PATCH", &format!("{}/{name}/status", *REPORTS), Some(&status))?;
    if !(200..300).contains(&code) {
        return Err(format!("PATCH {}/{name}/status: {code} {}", *REPORTS, body["message"]).into());
    }
    Ok(())
}

/// `VmHWM` of a `/proc/PID/status`, in KiB.
fn hwm_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
