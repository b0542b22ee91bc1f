//! `kpm doctor --watch` as a process, publishing to kpm-test-support's
//! stand-in API server over TCP; and `kpm doctor --host-root` on a host
//! seen under a prefix. Real sockets, real plugins, the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Metric samples are counts, exact as floats.
#![allow(clippy::float_cmp)]

mod support;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use kpm_registrar::Registrar;
use kpm_test_support::api_server::{self, State, kubeconfig};
use kpm_test_support::blocking::wait_until;
use kpm_test_support::prometheus;
use kpm_test_support::{free_local_addr, free_port};
use parking_lot::Mutex;
use serde_json::Value;
use support::kpm;

const CONDITION: &str = "KubeletPluginsHealthy";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
}

/// `kpm doctor --watch` on `root` for Node `node1` through the API server on
/// `api_port`, its metrics on `metrics`; stderr to `root/doctor.log`.
fn watch(root: &Path, api_port: u16, metrics: &str) -> Child {
    watch_with(root, api_port, metrics, &root_args(root))
}

/// `--root-dir root`, and no other root looked at.
fn root_args(root: &Path) -> [OsString; 4] {
    ["--root-dir".into(), root.into(), "--other-root".into(), root.join("no-other-root").into()]
}

/// `kpm doctor --watch ARGS` for Node `node1` through the API server on
/// `api_port`, its metrics on `metrics`; its kubeconfig in `dir`, stderr to
/// `dir/doctor.log`.
fn watch_with(dir: &Path, api_port: u16, metrics: &str, args: &[OsString]) -> Child {
    let config = dir.join("kubeconfig");
    std::fs::write(&config, kubeconfig(&format!("http://127.0.0.1:{api_port}"))).unwrap();
    Command::new(env!("CARGO_BIN_EXE_kpm"))
        .args(["doctor", "--watch"])
        .args(args)
        .arg("--kubeconfig")
        .arg(&config)
        .args(["--node-name", "node1", "--confirm-ms", "200", "--timeout", "2"])
        .args(["--metrics-addr", metrics])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("doctor.log")).unwrap())
        .spawn()
        .unwrap()
}

fn stop(mut child: Child) {
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert!(child.wait().unwrap().success());
}

/// The doctor's metrics; none while its server does not listen yet.
fn metrics(addr: &str) -> std::collections::HashMap<String, f64> {
    if std::net::TcpStream::connect(addr).is_err() {
        return std::collections::HashMap::new();
    }
    prometheus::scrape(addr)
}

/// A registry with a socket nobody listens on: a plugin that crashed.
fn stale_socket(registry: &Path) -> PathBuf {
    std::fs::create_dir_all(registry).unwrap();
    let socket = registry.join("crashed-reg.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    socket
}

#[test]
fn a_failure_and_its_recovery_are_published_as_the_condition_and_events() {
    let rt = runtime();
    let root = tempfile::tempdir().unwrap();
    let registry = root.path().join("plugins_registry");
    let healthy = rt
        .block_on(
            Registrar::builder(kpm::api::DEVICE_PLUGIN, "vendor.com/gpu")
                .socket_dir(&registry)
                .routes(support::device_plugin(&[("gpu-0", "Healthy")]))
                .serve(),
        )
        .unwrap();
    // The Node shows the plugin's device, as the kubelet published it.
    let mut node = State::with_node("node1");
    let status = &mut node.node.as_mut().unwrap()["status"];
    status["capacity"] = serde_json::json!({"vendor.com/gpu": "1"});
    status["allocatable"] = serde_json::json!({"vendor.com/gpu": "1"});
    let state = Arc::new(Mutex::new(node));
    let api_port = free_port();
    api_server::serve(&rt, api_port, Arc::clone(&state));
    let metrics_addr = free_local_addr();
    let doctor = watch(root.path(), api_port, &metrics_addr);

    wait_until("the condition True", || {
        state.lock().condition(CONDITION).is_some_and(|c| c["status"] == "True")
    });
    // A plugin crashes, leaving its socket: Stale, and a Warning Event.
    let crashed = stale_socket(&registry);
    wait_until("the condition Stale", || {
        state.lock().condition(CONDITION).is_some_and(|c| c["reason"] == "Stale")
    });
    let condition = state.lock().condition(CONDITION).unwrap();
    assert_eq!(condition["status"], "False");
    assert!(condition["message"].as_str().unwrap().contains("crashed-reg.sock"), "{condition}");
    let warning = event(&state, "Stale");
    assert_eq!(warning["type"], "Warning");
    assert_eq!(warning["regarding"]["name"], "node1");
    assert_eq!(warning["regarding"]["uid"], "uid-1");
    assert!(warning["note"].as_str().unwrap().contains(crashed.to_str().unwrap()), "{warning}");

    // Its socket removed: True again, and a Normal Event.
    std::fs::remove_file(&crashed).unwrap();
    wait_until("the condition True again", || {
        state.lock().condition(CONDITION).is_some_and(|c| c["status"] == "True")
    });
    assert_eq!(event(&state, "PluginRecovered")["type"], "Normal");
    // Every write was the doctor's own condition (server-side apply) or an
    // Event: three condition writes, two Events.
    let writes: Vec<String> =
        state.lock().requests.iter().filter(|r| !r.starts_with("GET ")).cloned().collect();
    assert_eq!(
        writes.iter().filter(|w| w.ends_with("/nodes/node1/status")).count(),
        3,
        "{writes:?}"
    );
    assert_eq!(state.lock().owners[CONDITION], "kpm-doctor");
    // The metrics count a write once its answer is back.
    wait_until("the metrics' write counts", || {
        let samples = metrics(&metrics_addr);
        samples.get("kpm_doctor_api_writes_total{kind=\"condition\"}") == Some(&3.0)
            && samples.get("kpm_doctor_api_writes_total{kind=\"event\"}") == Some(&2.0)
    });
    let samples = metrics(&metrics_addr);
    let ok = "kpm_doctor_plugins{verdict=\"ok\",type=\"DevicePlugin\"}";
    assert_eq!(samples.get(ok), Some(&1.0), "{samples:?}");
    assert!(samples["kpm_doctor_passes_total"] >= 3.0);
    stop(doctor);
    drop(healthy);
}

/// The Event of `reason`, once the stand-in has it: the condition is
/// written first, its Events right after.
fn event(state: &Mutex<State>, reason: &str) -> Value {
    let found = || state.lock().events.values().find(|e| e["reason"] == reason).cloned();
    wait_until(format!("a {reason} Event"), || found().is_some());
    found().unwrap()
}

#[test]
fn with_no_api_server_it_judges_on_says_so_once_and_publishes_once_it_can() {
    let rt = runtime();
    let root = tempfile::tempdir().unwrap();
    stale_socket(&root.path().join("plugins_registry"));
    let state = Arc::new(Mutex::new(State::with_node("node1")));
    let api_port = free_port();
    let metrics_addr = free_local_addr();
    let doctor = watch(root.path(), api_port, &metrics_addr);

    // Nothing listens on the API server's port: it keeps judging, counts
    // the failed writes, and warns once.
    wait_until("three failed writes", || {
        let samples = metrics(&metrics_addr);
        samples.get("kpm_doctor_api_write_failures_total").is_some_and(|n| *n >= 3.0)
            && samples.get("kpm_doctor_api_failing") == Some(&1.0)
            && samples.get("kpm_doctor_plugins{verdict=\"stale\",type=\"none\"}") == Some(&1.0)
    });
    let log = std::fs::read_to_string(root.path().join("doctor.log")).unwrap();
    assert_eq!(log.matches("cannot publish to the API server").count(), 1, "{log}");

    // The API server comes: the current state goes out, the Event too.
    api_server::serve(&rt, api_port, Arc::clone(&state));
    wait_until("the condition Stale published", || {
        state.lock().condition(CONDITION).is_some_and(|c| c["reason"] == "Stale")
    });
    event(&state, "Stale");
    wait_until("the failure cleared", || {
        metrics(&metrics_addr).get("kpm_doctor_api_failing") == Some(&0.0)
    });
    stop(doctor);
}

#[test]
fn a_403_is_said_once_and_judging_goes_on() {
    let rt = runtime();
    let root = tempfile::tempdir().unwrap();
    stale_socket(&root.path().join("plugins_registry"));
    let state = Arc::new(Mutex::new(State { fail: Some(403), ..State::with_node("node1") }));
    let api_port = free_port();
    api_server::serve(&rt, api_port, Arc::clone(&state));
    let metrics_addr = free_local_addr();
    let doctor = watch(root.path(), api_port, &metrics_addr);
    let log = || std::fs::read_to_string(root.path().join("doctor.log")).unwrap();
    wait_until("three refused writes", || {
        metrics(&metrics_addr).get("kpm_doctor_api_write_failures_total").is_some_and(|n| *n >= 3.0)
    });
    let log = log();
    assert_eq!(log.matches("cannot publish to the API server").count(), 1, "{log}");
    assert!(log.contains("403"), "{log}");
    assert_eq!(metrics(&metrics_addr)["kpm_doctor_api_failing"], 1.0);
    // Allowed at last.
    state.lock().fail = None;
    wait_until("the condition published", || state.lock().condition(CONDITION).is_some());
    stop(doctor);
}

#[test]
fn under_a_host_root_the_kubelet_its_root_and_the_endpoints_are_read_there() {
    let rt = runtime();
    let host = tempfile::tempdir().unwrap();
    let seen = |path: &str| host.path().join(path.trim_start_matches('/'));
    // The host's /proc names a kubelet with another root than the default.
    std::fs::create_dir_all(seen("/proc/4242")).unwrap();
    std::fs::write(seen("/proc/4242/cmdline"), "/usr/bin/kubelet\0--root-dir=/data/kubelet\0")
        .unwrap();
    // A device plugin registered in that root, advertising its endpoint as
    // a path on the host.
    let endpoint = "/data/kubelet/plugins/gpu/gpu.sock";
    std::fs::create_dir_all(seen("/data/kubelet/plugins/gpu")).unwrap();
    let _served = support::serve(&seen(endpoint), support::device_plugin(&[("gpu-0", "Healthy")]));
    let plugin = rt
        .block_on(
            Registrar::builder(kpm::api::DEVICE_PLUGIN, "vendor.com/gpu")
                .socket_dir(seen("/data/kubelet/plugins_registry"))
                .endpoint(endpoint)
                .serve(),
        )
        .unwrap();
    let out = kpm(&[
        "doctor",
        "-o",
        "json",
        "--host-root",
        host.path().to_str().unwrap(),
        "--other-root",
        "/nowhere",
    ]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["root_dir"], "/data/kubelet", "{report:#}");
    assert_eq!(report["root_from"], "the running kubelet, pid 4242");
    let row = &report["plugins"][0];
    let registration = plugin.socket_path().strip_prefix(host.path()).unwrap();
    assert_eq!(row["path"], Path::new("/").join(registration).to_str().unwrap(), "{report:#}");
    assert_eq!(row["verdict"], "ok", "{report:#}");
    assert_eq!(row["endpoint"], endpoint);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
}

/// Every path in `text` is the host's: the prefix the doctor reads the host
/// under (`host`) appears nowhere in it.
fn assert_host_paths(what: &str, text: &str, host: &Path) {
    let prefix = host.to_str().unwrap();
    assert!(!text.contains(prefix), "{what} names {prefix}, not the host's paths:\n{text}");
}

#[test]
fn under_a_host_root_every_message_names_the_hosts_paths() {
    // The DaemonSet's view: the host under --host-root, a kubelet on the
    // default root, and what goes wrong on a node.
    let rt = runtime();
    let host = tempfile::tempdir().unwrap();
    let seen = |path: &str| host.path().join(path.trim_start_matches('/'));
    std::fs::create_dir_all(seen("/proc/4242")).unwrap();
    std::fs::write(seen("/proc/4242/cmdline"), "/usr/bin/kubelet\0--v=2\0").unwrap();
    // A registrar that crashed; a CSI driver whose endpoint is gone; a
    // device plugin serving on its registration socket (no endpoint).
    let registry = "/var/lib/kubelet/plugins_registry";
    stale_socket(&seen(registry));
    let csi = rt
        .block_on(
            Registrar::builder(kpm::api::CSI_PLUGIN, "csi.example.com")
                .versions(["1.0.0"])
                .socket_dir(seen(registry))
                .endpoint("/var/lib/kubelet/plugins/csi.example.com/csi.sock")
                .serve(),
        )
        .unwrap();
    let device = rt
        .block_on(
            Registrar::builder(kpm::api::DEVICE_PLUGIN, "vendor.com/gpu")
                .socket_dir(seen(registry))
                .routes(support::device_plugin(&[("gpu-0", "Healthy")]))
                .serve(),
        )
        .unwrap();
    // Beside kubelet.sock: a live device plugin (and no device manager
    // checkpoint to name it) and one that is gone.
    std::fs::create_dir_all(seen("/var/lib/kubelet/device-plugins")).unwrap();
    let _served = support::serve(
        &seen("/var/lib/kubelet/device-plugins/fpga.sock"),
        support::device_plugin(&[("fpga-0", "Healthy")]),
    );
    drop(std::os::unix::net::UnixListener::bind(seen("/var/lib/kubelet/device-plugins/old.sock")));
    let on_host = |socket: &Path| Path::new("/").join(socket.strip_prefix(host.path()).unwrap());
    let dial_crashed = "dial /var/lib/kubelet/plugins_registry/crashed-reg.sock";
    let flags = ["--host-root", host.path().to_str().unwrap(), "--other-root", "/nowhere"];

    let out = kpm(&[&["doctor", "-o", "json", "--timeout", "2"][..], &flags].concat());
    let json = String::from_utf8(out.stdout).unwrap();
    assert_host_paths("the JSON report", &json, host.path());
    let report: Value = serde_json::from_str(&json).unwrap();
    let row = |path: &str| {
        report["plugins"].as_array().unwrap().iter().find(|row| row["path"] == path).cloned()
    };
    let crashed = row("/var/lib/kubelet/plugins_registry/crashed-reg.sock").unwrap();
    assert_eq!(crashed["verdict"], "stale", "{report:#}");
    let reason = crashed["reason"].as_str().unwrap();
    assert!(reason.starts_with(dial_crashed), "{reason}");
    let unreachable = row(on_host(csi.socket_path()).to_str().unwrap()).unwrap();
    assert_eq!(unreachable["verdict"], "endpoint-unreachable", "{report:#}");
    let reason = unreachable["reason"].as_str().unwrap();
    assert!(reason.contains("/var/lib/kubelet/plugins/csi.example.com/csi.sock"), "{reason}");
    let serving = row(on_host(device.socket_path()).to_str().unwrap()).unwrap();
    assert_eq!(serving["verdict"], "ok", "{report:#}");
    assert_eq!(serving["endpoint"], on_host(device.socket_path()).to_str().unwrap());
    let old = row("/var/lib/kubelet/device-plugins/old.sock").unwrap();
    assert!(old["reason"].as_str().unwrap().contains(" /var/lib/kubelet/device-plugins/old.sock"));
    let unseen = report["unseen"].to_string();
    assert!(
        unseen.contains("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"),
        "{unseen}"
    );

    let out = kpm(&[&["doctor", "--timeout", "2"][..], &flags].concat());
    let table = String::from_utf8(out.stdout).unwrap();
    assert_host_paths("the table", &table, host.path());
    assert!(table.contains(dial_crashed), "{table}");

    let state = Arc::new(Mutex::new(State::with_node("node1")));
    let api_port = free_port();
    api_server::serve(&rt, api_port, Arc::clone(&state));
    let logs = tempfile::tempdir().unwrap();
    let args: Vec<OsString> = flags.iter().map(OsString::from).collect();
    let doctor = watch_with(logs.path(), api_port, &free_local_addr(), &args);
    let condition = published(&state, "False");
    let message = condition["message"].as_str().unwrap();
    assert_host_paths("the condition's message", message, host.path());
    assert!(message.contains(dial_crashed), "{message}");
    wait_until("the crashed registrar's Event", || {
        state.lock().events.values().any(|e| e["note"].as_str().unwrap().contains(dial_crashed))
    });
    stop(doctor);
    let events = serde_json::to_string(&state.lock().events).unwrap();
    assert_host_paths("the Events", &events, host.path());
    let log = std::fs::read_to_string(logs.path().join("doctor.log")).unwrap();
    assert_host_paths("the log", &log, host.path());
}

// === A doctor that cannot look ===

/// The condition, once the doctor has published it as `status`.
fn published(state: &Mutex<State>, status: &str) -> Value {
    wait_until(format!("the condition {status}"), || {
        state.lock().condition(CONDITION).is_some_and(|c| c["status"] == status)
    });
    state.lock().condition(CONDITION).unwrap()
}

#[test]
fn a_root_without_a_registry_is_published_unknown_not_healthy() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("nonexistent");
    let state = Arc::new(Mutex::new(State::with_node("node1")));
    let api_port = free_port();
    api_server::serve(&rt, api_port, Arc::clone(&state));
    let metrics_addr = free_local_addr();
    let doctor = watch_with(dir.path(), api_port, &metrics_addr, &root_args(&root));

    // What a single `kpm doctor` exits 2 for.
    let condition = published(&state, "Unknown");
    assert_eq!(condition["reason"], "CannotJudge", "{condition}");
    let registry = root.join("plugins_registry");
    let message = condition["message"].as_str().unwrap();
    assert!(message.starts_with(&format!("{}: cannot be listed", registry.display())), "{message}");
    let warning = event(&state, "CannotJudge");
    assert_eq!(warning["type"], "Warning");
    let note = warning["note"].as_str().unwrap();
    assert!(note.starts_with("cannot judge this node: ") && note.contains("; try: "), "{note}");
    wait_until("the metric of a doctor that cannot judge", || {
        metrics(&metrics_addr).get("kpm_doctor_cannot_judge") == Some(&1.0)
    });
    let nowhere = dir.path().join("no-other-root");
    let once = support::kpm(&[
        "doctor",
        "--root-dir",
        root.to_str().unwrap(),
        "--other-root",
        nowhere.to_str().unwrap(),
    ]);
    assert_eq!(once.status.code(), Some(2), "the one-shot doctor agrees");

    // The kubelet creates its registry: judged again, and healthy.
    std::fs::create_dir_all(&registry).unwrap();
    let condition = published(&state, "True");
    assert_eq!(condition["reason"], "PluginsHealthy");
    assert_eq!(event(&state, "CanJudge")["type"], "Normal");
    assert!(event_reasons(&state).iter().all(|r| r != "PluginRecovered"), "nothing had failed");
    wait_until("the metric cleared", || {
        metrics(&metrics_addr).get("kpm_doctor_cannot_judge") == Some(&0.0)
    });
    stop(doctor);
}

/// The reasons of the Events the stand-in holds.
fn event_reasons(state: &Mutex<State>) -> Vec<String> {
    state.lock().events.values().map(|e| e["reason"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn a_registry_that_is_not_the_running_kubelets_is_published_unknown() {
    // As the DaemonSet runs it, the host under --host-root and no
    // --root-dir, beside a kubelet whose root is not /var/lib/kubelet, on a
    // host where an empty /var/lib/kubelet/plugins_registry exists.
    let rt = runtime();
    let host = tempfile::tempdir().unwrap();
    let seen = |path: &str| host.path().join(path.trim_start_matches('/'));
    std::fs::create_dir_all(seen("/proc/4242")).unwrap();
    std::fs::write(seen("/proc/4242/cmdline"), "/usr/bin/kubelet\0--root-dir=/data/kubelet\0")
        .unwrap();
    for dir in ["/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins"] {
        std::fs::create_dir_all(seen(dir)).unwrap();
    }
    let args: [OsString; 2] = ["--host-root".into(), host.path().into()];
    // A single `kpm doctor` judges the running kubelet's root, whose
    // registry it cannot see: it cannot judge the node.
    let once =
        support::kpm(&["doctor", "-o", "json", "--host-root", host.path().to_str().unwrap()]);
    assert_eq!(once.status.code(), Some(2));
    let report: Value = serde_json::from_slice(&once.stdout).unwrap();
    assert_eq!(report["root_dir"], "/data/kubelet", "{report:#}");
    let why = report["blind"]["why"].as_str().unwrap();
    // The host's path, which an operator can look at on the node.
    assert!(why.starts_with("/data/kubelet/plugins_registry: cannot be listed"), "{why}");

    let state = Arc::new(Mutex::new(State::with_node("node1")));
    let api_port = free_port();
    api_server::serve(&rt, api_port, Arc::clone(&state));
    let logs = tempfile::tempdir().unwrap();
    let doctor = watch_with(logs.path(), api_port, &free_local_addr(), &args);
    let condition = published(&state, "Unknown");
    assert_eq!(condition["reason"], "CannotJudge");
    assert_eq!(condition["message"], why, "the same words as the one-shot's");
    event(&state, "CannotJudge");
    stop(doctor);
}

// === One cause, one failure ===

#[test]
fn a_csinode_entry_kept_for_a_stale_socket_is_one_failure_with_two_events() {
    // A registrar killed with SIGKILL leaves its socket, and the kubelet
    // keeps its driver in CSINode.
    let rt = runtime();
    let root = tempfile::tempdir().unwrap();
    let registry = root.path().join("plugins_registry");
    std::fs::create_dir_all(&registry).unwrap();
    let socket = registry.join("stale.csi.example.com-reg.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let mut node = State::with_node("node1");
    node.csinode = Some(serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "node1"},
        "spec": {"drivers": [{"name": "stale.csi.example.com", "nodeID": "node1"}]},
    }));
    let state = Arc::new(Mutex::new(node));
    let api_port = free_port();
    api_server::serve(&rt, api_port, Arc::clone(&state));
    let doctor = watch(root.path(), api_port, &free_local_addr());

    let condition = published(&state, "False");
    assert_eq!(condition["reason"], "Stale");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.starts_with("1 failing: stale.csi.example.com-reg.sock (stale): "),
        "{message}"
    );
    assert!(!message.contains("stale-csi-node-entry"), "{message}");
    // The entry still has its Event, naming the socket that keeps it.
    assert_eq!(event(&state, "Stale")["type"], "Warning");
    let entry = event(&state, "StaleCsiNodeEntry");
    assert_eq!(entry["type"], "Warning");
    assert!(entry["note"].as_str().unwrap().contains(socket.to_str().unwrap()), "{entry}");
    stop(doctor);

    // A single `kpm doctor` counts it the same, and shows the entry under
    // the socket's row.
    let config = root.path().join("kubeconfig");
    let out = support::kpm(&[
        "doctor",
        "--root-dir",
        root.path().to_str().unwrap(),
        "--other-root",
        root.path().join("no-other-root").to_str().unwrap(),
        "--kubeconfig",
        config.to_str().unwrap(),
        "--node-name",
        "node1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.ends_with("\n1 entries: 0 ok, 1 failing\n"), "{table}");
    let row = format!("stale: {}\n", socket.display());
    let explained = table.split(&row).nth(1).and_then(|rest| rest.split("\n\n").next());
    let kept = "\n  kept for it: stale-csi-node-entry: csinodes/node1\n    CSINode node1 lists driver \
                stale.csi.example.com";
    assert!(explained.is_some_and(|block| block.contains(kept)), "{table}");
}

/// `kpm doctor` beside `kpm run`, the node's plugin manager, while the API
/// server takes no writes: the capacity kpm run has not got there yet is
/// `publishing`, not a failure of the plugin; once kpm run is gone, the same
/// lag is a failure again.
#[test]
fn what_kpm_run_is_still_publishing_is_not_a_failure_of_the_plugin() {
    let rt = runtime();
    let port = free_port();
    let state = Arc::new(Mutex::new(State::with_node("node1")));
    api_server::serve(&rt, port, Arc::clone(&state));
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("kubeconfig");
    std::fs::write(&config, kubeconfig(&format!("http://127.0.0.1:{port}"))).unwrap();
    let config = config.to_str().unwrap();
    let kpm_run =
        support::Kpm::start_with(root.path(), &["--kubeconfig", config, "--node-name", "node1"]);
    state.lock().read_only = true;
    let plugin = Registrar::builder(kpm_registrar::DEVICE_PLUGIN, "vendor.com/gpu")
        .socket_dir(kpm_run.registry())
        .routes(support::device_plugin(&[("dev-0", "Healthy")]));
    let plugin = rt.block_on(plugin.serve()).unwrap();
    assert!(
        rt.block_on(plugin.wait_for_status(kpm_test_support::DEADLINE)).unwrap().plugin_registered
    );
    kpm_run.wait_for("the capacity pending", |list| {
        list["kubernetes"]["pending"].as_array().is_some_and(|pending| !pending.is_empty())
    });

    let doctor = || {
        let mut args: Vec<OsString> = vec!["doctor".into(), "-o".into(), "json".into()];
        args.extend(root_args(root.path()));
        args.extend(["--kubeconfig".into(), config.into(), "--node-name".into(), "node1".into()]);
        let out = Command::new(env!("CARGO_BIN_EXE_kpm")).args(&args).output().unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let row = report["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["name"] == "vendor.com/gpu")
            .cloned()
            .unwrap_or_else(|| panic!("no row of vendor.com/gpu: {report}"));
        (out.status.code(), row)
    };
    let (code, row) = doctor();
    assert_eq!((code, row["verdict"].as_str()), (Some(0), Some("publishing")), "{row}");
    let reason = row["reason"].as_str().unwrap();
    assert!(reason.contains("kpm run has not got it to the API server yet"), "{reason}");
    assert!(reason.contains("capacity 1, allocatable 1") && reason.contains("500"), "{reason}");

    // Without kpm run, nothing explains the lag.
    let (status, log) = kpm_run.terminate();
    assert!(status.success(), "{log}");
    let (code, row) = doctor();
    assert_eq!((code, row["verdict"].as_str()), (Some(1), Some("not-registered")), "{row}");
    rt.block_on(plugin.shutdown()).unwrap();
}

/// A kubelet of pid `pid` in the fake host's `/proc` under `host`, started
/// `started` (by the wall clock) on a host booted at `booted`, as
/// `/proc/stat` and `/proc/PID/stat` tell it in clock ticks.
fn kubelet_started(host: &Path, pid: u32, booted: u64, started: u64) {
    let ticks: u64 =
        String::from_utf8(Command::new("getconf").arg("CLK_TCK").output().unwrap().stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    std::fs::write(host.join("proc/stat"), format!("cpu  1 2 3\nbtime {booted}\n")).unwrap();
    support::fake_process(host, pid, &["/usr/bin/kubelet"], &[], None);
    let stat = format!(
        "{pid} (kubelet) S 1 {pid} {pid} 0 -1 4 0 0 0 0 1 1 0 0 20 0 9 0 {} 1 1",
        (started - booted) * ticks
    );
    std::fs::write(host.join(format!("proc/{pid}/stat")), stat).unwrap();
}

/// The kubelet device manager's checkpoint in `dir`, with `registered` as
/// its resources' healthy devices.
fn checkpoint(dir: &Path, registered: &Value) {
    let data = serde_json::json!({
        "Data": {"PodDeviceEntries": null, "RegisteredDevices": registered},
        "Checksum": 1,
    });
    std::fs::write(dir.join("kubelet_internal_checkpoint"), data.to_string()).unwrap();
}

/// The conditions of the two device plugins of the restart test.
const GPU: &str = "vendor.com/gpu-PluginRegistered";
const BACK: &str = "example.com/back-PluginRegistered";

/// `kpm doctor` on the fake host, through the API server `kubeconfig`
/// names, after the restart: exit 1, the lost plugin `not-registered-again`
/// at its socket with the evidence, the one that came back ok.
fn assert_the_one_shot_names_the_lost_plugin(host: &Path, kubeconfig: &Path) {
    let (code, json) = support::doctor_on_host(
        host,
        &["-o", "json", "--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node1"],
    );
    assert_eq!(code, 1, "{json}");
    let report: Value = serde_json::from_str(&json).unwrap();
    let rows = report["plugins"].as_array().unwrap();
    let named = |name: &str| rows.iter().find(|row| row["name"] == name);
    let lost = named("vendor.com/gpu").unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(lost["verdict"], "not-registered-again", "{lost:#}");
    assert_eq!(lost["path"], "/var/lib/kubelet/device-plugins/gpu.sock", "{lost:#}");
    let reason = lost["reason"].as_str().unwrap();
    for said in [
        "registered before the kubelet's start at ",
        "Node node1 counts capacity 0, allocatable 0 of it",
    ] {
        assert!(reason.contains(said), "{said}: {reason}");
    }
    assert_eq!(named("example.com/back").unwrap()["verdict"], "ok", "{report:#}");
}

#[test]
fn a_device_plugin_that_does_not_register_again_after_the_kubelets_restart_is_named_and_fails_its_conditions()
 {
    let host = tempfile::tempdir().unwrap();
    let seen = |path: &str| host.path().join(path.trim_start_matches('/'));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let booted = now - 1000;
    // The host's init, whose mount namespace the kubelet shares.
    support::fake_process(host.path(), 1, &["/sbin/init"], &[], None);
    kubelet_started(host.path(), 4242, booted, booted + 10);
    std::fs::create_dir_all(seen("/var/lib/kubelet/plugins_registry")).unwrap();
    let dir = seen("/var/lib/kubelet/device-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let gpu =
        support::serve(&dir.join("gpu.sock"), support::device_plugin(&[("gpu-0", "Healthy")]));
    let back =
        support::serve(&dir.join("back.sock"), support::device_plugin(&[("back-0", "Healthy")]));
    checkpoint(
        &dir,
        &serde_json::json!({"vendor.com/gpu": ["gpu-0"], "example.com/back": ["back-0"]}),
    );
    let mut node = State::with_node("node1");
    let status = &mut node.node.as_mut().unwrap()["status"];
    // The KubeletPluginReport's CRD is installed: what the watching doctor
    // publishes, `kpm doctor` reads back.
    node.reports = Some(std::collections::BTreeMap::new());
    let counts = serde_json::json!({"vendor.com/gpu": "1", "example.com/back": "1"});
    status["capacity"] = counts.clone();
    status["allocatable"] = counts;
    let state = Arc::new(Mutex::new(node));
    let api_port = free_port();
    let rt = runtime();
    api_server::serve(&rt, api_port, Arc::clone(&state));
    let host_root = host.path().to_str().unwrap();
    let conditions = "vendor.com/gpu,example.com/back";
    let args =
        ["--host-root", host_root, "--other-root", "/nowhere", "--plugin-condition", conditions];
    let args: Vec<OsString> = args.map(OsString::from).into();
    let dir_of_doctor = tempfile::tempdir().unwrap();
    let doctor = watch_with(dir_of_doctor.path(), api_port, &free_local_addr(), &args);
    let status_of = |condition_type: &str| {
        state.lock().condition(condition_type).map(|c| (c["status"].clone(), c["reason"].clone()))
    };
    wait_until("every condition True", || {
        [CONDITION, GPU, BACK]
            .iter()
            .all(|c| status_of(c).is_some_and(|(status, _)| status == "True"))
    });

    // The kubelet restarts: a new process, every socket of device-plugins/
    // removed; one plugin serves a new socket and registers again (the
    // kubelet's checkpoint holds its device anew), the other does not (the
    // kubelet keeps its resource with no device, 0 on the Node).
    std::fs::remove_dir_all(seen("/proc/4242")).unwrap();
    // Started a second ago: the sockets made since are newer than it.
    kubelet_started(host.path(), 4343, booted, now - 1);
    gpu.stop();
    back.stop();
    std::fs::remove_file(dir.join("gpu.sock")).unwrap();
    std::fs::remove_file(dir.join("back.sock")).unwrap();
    let back =
        support::serve(&dir.join("back-2.sock"), support::device_plugin(&[("back-0", "Healthy")]));
    checkpoint(&dir, &serde_json::json!({"vendor.com/gpu": [], "example.com/back": ["back-0"]}));
    state.lock().change_node(|node| {
        node["status"]["capacity"]["vendor.com/gpu"] = "0".into();
        node["status"]["allocatable"]["vendor.com/gpu"] = "0".into();
    });
    // Once the plugin that came back is registered again, one is lost.
    wait_until("the condition NotRegisteredAgain of one plugin", || {
        state.lock().condition(CONDITION).is_some_and(|c| {
            c["reason"] == "NotRegisteredAgain"
                && c["message"].as_str().is_some_and(|m| m.starts_with("1 failing: vendor.com/gpu"))
        })
    });
    let condition = state.lock().condition(CONDITION).unwrap();
    assert_eq!(condition["status"], "False");
    assert_eq!(status_of(GPU).unwrap(), ("False".into(), "NotRegisteredAgain".into()));
    wait_until("the plugin that came back True", || {
        status_of(BACK).is_some_and(|(status, _)| status == "True")
    });

    // `kpm doctor` on the node says so too, from the report the watching
    // doctor published and the kubelet's checkpoint, with the evidence.
    assert_the_one_shot_names_the_lost_plugin(
        host.path(),
        &dir_of_doctor.path().join("kubeconfig"),
    );

    // It comes back, and the kubelet counts its device again: every
    // condition True again.
    let gpu =
        support::serve(&dir.join("gpu-2.sock"), support::device_plugin(&[("gpu-0", "Healthy")]));
    checkpoint(
        &dir,
        &serde_json::json!({"vendor.com/gpu": ["gpu-0"], "example.com/back": ["back-0"]}),
    );
    state.lock().change_node(|node| {
        node["status"]["capacity"]["vendor.com/gpu"] = "1".into();
        node["status"]["allocatable"]["vendor.com/gpu"] = "1".into();
    });
    wait_until("every condition True again", || {
        [CONDITION, GPU, BACK]
            .iter()
            .all(|c| status_of(c).is_some_and(|(status, _)| status == "True"))
    });

    // Stopped with no pod of its own being deleted: nothing vouches for the
    // node any more.
    stop(doctor);
    for condition_type in [CONDITION, GPU, BACK] {
        assert_eq!(
            status_of(condition_type).unwrap(),
            ("Unknown".into(), "DoctorStopped".into()),
            "{condition_type}"
        );
    }
    drop((gpu, back));
}
