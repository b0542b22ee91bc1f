//! The field guide's failures that need pods (`docs/field-guide.md`),
//! each made as users made it, on the real node, with the doctor's
//! DaemonSet of `doctor` watching: what it publishes, what `kpm doctor`
//! says in its pod, and what `kpm doctor explain` makes of the kubelet's
//! or the registrar's own log line. Each deploys hostpathplugin with
//! node-driver-registrar (`manifests/csi-hostpath.yaml`) under a name of
//! its own, broken one way, and removes it as an operator would.

use std::time::Instant;

use serde_json::Value;

use super::super::node::Node;
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::breakage::signal_program;
use super::doctor::{DOCTOR_SELECTOR, NAMESPACE, doctor_in_pod};
use super::secs;
use crate::command::Result;
use crate::scenario::wait_for;

const REGISTRAR: &str = "node-driver-registrar";

/// A copy of the hostpath driver's DaemonSet under its own name: driver
/// `NAME.csi.k8s.io` in namespace `csi-NAME`, its socket directory
/// `plugins/csi-NAME`.
struct Driver {
    name: &'static str,
    root: String,
}

impl Driver {
    fn new(node: &Node, name: &'static str) -> Self {
        Self { name, root: node.kubelet_root.display().to_string() }
    }

    fn namespace(&self) -> String {
        format!("csi-{}", self.name)
    }

    fn driver(&self) -> String {
        format!("{}.csi.k8s.io", self.name)
    }

    /// Its registration socket, on the node.
    fn registration_socket(&self) -> String {
        format!("{}/plugins_registry/{}-reg.sock", self.root, self.driver())
    }

    /// The manifest, after `breaks` (its text, `@ROOT@` not yet replaced).
    fn manifest(&self, breaks: &[(&str, &str)]) -> Result<String> {
        let mut manifest = include_str!("../manifests/csi-hostpath.yaml")
            .replace("hostpath.csi.k8s.io", &self.driver())
            .replace("csi-hostpath", &self.namespace());
        for (what, with) in breaks {
            if !manifest.contains(what) {
                return Err(format!("the manifest has no {what:?} to break").into());
            }
            manifest = manifest.replace(what, with);
        }
        Ok(manifest.replace("@ROOT@", &self.root))
    }

    /// Gone as an operator removes it: its namespace, then what it left on
    /// the node (nothing removes a registrar's socket once it is killed).
    fn remove(&self, node: &Node, left: &[String]) -> Result {
        node.kubectl(&[
            "delete",
            "namespace",
            &self.namespace(),
            "--wait=true",
            "--ignore-not-found",
        ])?;
        let selector = format!("app.kubernetes.io/name={}plugin", self.namespace());
        wait_for(&format!("the pods of {} gone", self.namespace()), START_TIMEOUT, || {
            Ok(node.pods(&self.namespace(), &selector)?.is_empty().then_some(()))
        })?;
        let plugins = format!("{}/plugins/{}", self.root, self.namespace());
        for path in left.iter().chain([&self.registration_socket(), &plugins]) {
            let _ = std::fs::remove_dir_all(path).or_else(|_| std::fs::remove_file(path));
        }
        wait_for("the report without the broken driver", START_TIMEOUT, || {
            let report = crate::kube_e2e::api::report(&node.api, NODE_NAME)?;
            Ok(report
                .filter(|report| {
                    left.iter()
                        .chain([&self.registration_socket()])
                        .all(|socket| entry_of(report, socket).is_none())
                        && finding_of(report, &self.namespace()).is_none()
                })
                .map(|_| ()))
        })
    }
}

/// `wrong-registration-path`: node-driver-registrar deployed with a
/// `--kubelet-registration-path` one directory off the driver's socket, a
/// values mistake of driver charts. The kubelet refuses the driver, the
/// registrar exits and crash-loops with its socket left behind. The doctor
/// must name the pod, the container and its restarts, the endpoint that
/// does not exist and the flag to fix, in its report and in a look of its
/// own; `kpm doctor explain` must say the same of the kubelet's line.
pub(super) fn wrong_registration_path(_env: &Env, node: &mut Node) -> Result<String> {
    let driver = Driver::new(node, "wrongpath");
    let wrong = format!("{}/plugins/csi-wrongpath-typo/csi.sock", driver.root);
    let manifest = driver.manifest(&[("@ROOT@/plugins/csi-wrongpath/csi.sock", &wrong)])?;
    let socket = driver.registration_socket();
    let applied = Instant::now();
    node.apply(&manifest)?;
    // As of the pass that published it: its restarts are not written again
    // at each restart; its pod and its last exit are there.
    let (reported, entry) = published(node, &socket, "endpoint-unreachable", |entry| {
        entry["pod"]["container"] == REGISTRAR && entry["pod"]["lastTermination"]["exitCode"] == 1
    })?;
    let pod = &entry["pod"];
    let reason = entry["reason"].as_str().unwrap_or_default();
    if pod["namespace"] != driver.namespace().as_str() || !reason.contains(&wrong) {
        return Err(format!("the report names another pod, or not {wrong}: {entry}").into());
    }
    let pod_name = pod["pod"].as_str().ok_or("a pod without a name")?.to_owned();
    let row = one_shot_row(node, &socket, |row| {
        row["pod"]["pod"] == pod_name.as_str()
            && row["pod"]["restarts"].as_u64().is_some_and(|restarts| restarts >= 1)
            && row["hint"].as_str().is_some_and(|hint| hint.contains("--kubelet-registration-path"))
    })?;
    let line = kubelet_line(node, &["RegisterPlugin error", &socket])?;
    explained(node, &line, "endpoint-unreachable")?;
    driver.remove(node, &[])?;
    eprintln!(
        "kpm doctor in its pod, on {socket}:\n  {}\n  it said: {}",
        row["reason"], row["said"]
    );
    Ok(format!(
        "endpoint-unreachable naming {REGISTRAR} of {}/{pod_name} published {} after apply; the \
         one-shot doctor names it with {} restarts and the flag; explain on the kubelet's line: \
         endpoint-unreachable",
        driver.namespace(),
        secs(reported - applied),
        row["pod"]["restarts"],
    ))
}

/// `csi-socket-in-registry`: the driver's socket directory is the
/// registry itself (vsphere-csi-driver #220, longhorn #899): its
/// `csi.sock` sits beside the registrar's socket, and the kubelet asks it
/// for `GetInfo` forever. The doctor must say `not-a-registration-server`
/// and name the driver's container, and `kpm doctor explain` the same of
/// the kubelet's `unknown service` line.
pub(super) fn csi_socket_in_registry(_env: &Env, node: &mut Node) -> Result<String> {
    let driver = Driver::new(node, "inregistry");
    let manifest = driver.manifest(&[
        ("path: @ROOT@/plugins/csi-inregistry\n", "path: @ROOT@/plugins_registry\n"),
        ("@ROOT@/plugins/csi-inregistry/csi.sock", "@ROOT@/plugins_registry/csi.sock"),
    ])?;
    let socket = format!("{}/plugins_registry/csi.sock", driver.root);
    let applied = Instant::now();
    node.apply(&manifest)?;
    let (reported, entry) = published(node, &socket, "not-a-registration-server", |entry| {
        entry["pod"]["container"] == "hostpath"
    })?;
    let line = kubelet_line(node, &["unknown service pluginregistration.Registration", &socket])?;
    explained(node, &line, "not-a-registration-server")?;
    driver.remove(node, std::slice::from_ref(&socket))?;
    Ok(format!(
        "not-a-registration-server naming container hostpath of {}/{} published {} after apply; \
         explain on the kubelet's line: not-a-registration-server",
        driver.namespace(),
        entry["pod"]["pod"].as_str().unwrap_or_default(),
        secs(reported - applied),
    ))
}

/// `driver-never-starts`: the driver serves its socket at another path
/// than the registrar's `--csi-address`, so the registrar never learns
/// the driver's name, never creates its registration socket, gives up and
/// crash-loops. The doctor must name the pod as one that serves no socket,
/// with the fix its last words point at.
pub(super) fn driver_never_starts(_env: &Env, node: &mut Node) -> Result<String> {
    let driver = Driver::new(node, "neverstarts");
    let manifest = driver
        .manifest(&[("--endpoint=unix:///csi/csi.sock", "--endpoint=unix:///csi/other.sock")])?;
    let applied = Instant::now();
    node.apply(&manifest)?;
    let what =
        format!("the KubeletPluginReport names pods/{}/… pod-without-socket", driver.namespace());
    let (reported, finding) = wait_for(&what, START_TIMEOUT * 2, || {
        let report = crate::kube_e2e::api::report(&node.api, NODE_NAME)?;
        Ok(report
            .and_then(|report| finding_of(&report, &driver.namespace()))
            .filter(|finding| finding["verdict"] == "pod-without-socket")
            .map(|finding| (Instant::now(), finding)))
    })?;
    let reason = finding["reason"].as_str().unwrap_or_default().to_owned();
    if !reason.contains(REGISTRAR) {
        return Err(format!("the finding does not name the registrar: {finding}").into());
    }
    let pod = finding["object"]
        .as_str()
        .unwrap_or_default()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    // The run that gave up: the one before while the registrar runs again
    // (its log then only says it is still connecting), else the latest
    // (the one before may be collected already).
    let namespace = driver.namespace();
    let runs = [true, false].map(|previous| {
        let mut args = vec!["logs", "-n", namespace.as_str(), pod.as_str(), "-c", REGISTRAR];
        if previous {
            args.push("--previous");
        }
        node.kubectl(&args).unwrap_or_default()
    });
    let line = runs
        .iter()
        .flat_map(|log| log.lines().rev())
        .find(|line| line.to_lowercase().contains("error connecting to csi driver"))
        .ok_or_else(|| {
            format!("the registrar's runs said nothing of its driver:\n{}", runs.join("\n"))
        })?
        .to_owned();
    explained(node, &line, "pod-without-socket")?;
    driver.remove(node, &[])?;
    Ok(format!(
        "pod-without-socket published {} after apply: {reason}; explain on the registrar's last \
         line: pod-without-socket",
        secs(reported - applied)
    ))
}

/// `leftover-after-uninstall`: a driver registered, then uninstalled
/// while its registrar could not clean up (stopped, as a node that loses
/// power or an OOM kill leaves it): its socket stays in the registry
/// (longhorn #1412). The doctor must call it stale and say to remove it,
/// and `kpm doctor explain` the same of the line the kubelet logs about it
/// once restarted.
pub(super) fn leftover_after_uninstall(_env: &Env, node: &mut Node) -> Result<String> {
    let driver = Driver::new(node, "leftover");
    // A short grace: the stopped registrar is killed 2 s after the delete.
    let quick = (
        "    spec:\n      containers:",
        "    spec:\n      terminationGracePeriodSeconds: 2\n      containers:",
    );
    node.apply(&driver.manifest(&[quick])?)?;
    let socket = driver.registration_socket();
    published(node, &socket, "ok", |_| true)?;
    let marker = format!("plugins/{}/csi.sock", driver.namespace());
    signal_program(REGISTRAR, &marker, "-STOP")?;
    let uninstalled = Instant::now();
    node.kubectl(&["delete", "namespace", &driver.namespace(), "--wait=true"])?;
    if !std::path::Path::new(&socket).exists() {
        return Err(format!("{socket} went with the driver: nothing was left").into());
    }
    let (reported, _) = published(node, &socket, "stale", |_| true)?;
    one_shot_row(node, &socket, |row| {
        row["hint"].as_str().is_some_and(|hint| hint.contains("Remove it"))
    })?;
    // The kubelet keeps a plugin it registered while its socket stays, and
    // says nothing; once restarted (a reboot, as users met it), it dials
    // the socket and logs its failure.
    node.restart_kubelet()?;
    node.wait_ready()?;
    let line = wait_for("the restarted kubelet's line about the leftover", START_TIMEOUT, || {
        Ok(kubelet_line(node, &["RegisterPlugin error", &socket]).ok())
    })?;
    explained(node, &line, "stale")?;
    // The restarted kubelet never registered the driver, so it never
    // deregisters it: its CSINode entry stays until removed, as the
    // doctor's fix says.
    remove_csinode_entry(node, &driver.driver())?;
    driver.remove(node, &[])?;
    Ok(format!(
        "stale published {} after the uninstall began; the one-shot doctor says to remove it; \
         explain on the restarted kubelet's line: stale",
        secs(reported - uninstalled),
    ))
}

/// Removes `driver` from the node's CSINode, as `kubectl edit csinode`.
fn remove_csinode_entry(node: &Node, driver: &str) -> Result {
    let path = format!("/apis/storage.k8s.io/v1/csinodes/{NODE_NAME}");
    let csinode = node.api.get(&path)?;
    let drivers: Vec<Value> = csinode["spec"]["drivers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|entry| entry["name"] != driver)
        .cloned()
        .collect();
    let (code, answer) = node.api.request(
        "PATCH",
        &path,
        Some(&serde_json::json!({"spec": {"drivers": drivers}})),
    )?;
    if !(200..300).contains(&code) {
        return Err(format!("PATCH {path}: {code} {}", answer["message"]).into());
    }
    Ok(())
}

/// Waits for the doctor's published report to have an entry for `socket`
/// with `verdict` that `also` accepts; when it did, and the entry.
fn published(
    node: &Node,
    socket: &str,
    verdict: &str,
    also: impl Fn(&Value) -> bool,
) -> Result<(Instant, Value)> {
    let what = format!("the KubeletPluginReport names {socket} {verdict}");
    wait_for(&what, START_TIMEOUT * 2, || {
        let report = crate::kube_e2e::api::report(&node.api, NODE_NAME)?;
        Ok(report
            .and_then(|report| entry_of(&report, socket))
            .filter(|entry| entry["verdict"] == verdict && also(entry))
            .map(|entry| (Instant::now(), entry)))
    })
}

/// Waits for `kpm doctor` run in the doctor's pod, as an operator runs it,
/// to show `socket` as `wanted` accepts; its row.
fn one_shot_row(node: &Node, socket: &str, wanted: impl Fn(&Value) -> bool) -> Result<Value> {
    let doctor = node.pod(NAMESPACE, DOCTOR_SELECTOR)?;
    let doctor = doctor["metadata"]["name"].as_str().ok_or("doctor pod without a name")?;
    wait_for(&format!("kpm doctor in its pod on {socket}"), START_TIMEOUT, || {
        // Exit 1: a plugin fails; the report is printed all the same.
        let report: Value = serde_json::from_str(&node.kubectl_stdout(&doctor_in_pod(doctor))?)?;
        Ok(report["plugins"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|row| row["path"] == socket)
            .filter(|row| wanted(row))
            .cloned())
    })
}

/// The kubelet's first log line holding every one of `words`.
fn kubelet_line(node: &Node, words: &[&str]) -> Result<String> {
    let log = std::fs::read_to_string(node.kubelet_log())?;
    log.lines()
        .find(|line| words.iter().all(|word| line.contains(word)))
        .map(str::to_owned)
        .ok_or_else(|| format!("the kubelet logged no line with {words:?}").into())
}

/// `kpm doctor explain LINE` in the doctor's pod must give `verdict`.
fn explained(node: &Node, line: &str, verdict: &str) -> Result {
    let doctor = node.pod(NAMESPACE, DOCTOR_SELECTOR)?;
    let doctor = doctor["metadata"]["name"].as_str().ok_or("doctor pod without a name")?;
    let said = node.kubectl_stdout(&[
        "exec", "-n", NAMESPACE, doctor, "--", "kpm", "doctor", "explain", line,
    ])?;
    if !said.contains(&format!("verdict:    {verdict}")) {
        return Err(format!("kpm doctor explain on\n{line}\nsaid\n{said}").into());
    }
    Ok(())
}

/// The report's entry for `socket`.
fn entry_of(report: &Value, socket: &str) -> Option<Value> {
    report["status"]["plugins"].as_array()?.iter().find(|entry| entry["socket"] == socket).cloned()
}

/// The report's finding about a pod of `namespace`.
fn finding_of(report: &Value, namespace: &str) -> Option<Value> {
    let prefix = format!("pods/{namespace}/");
    report["status"]["findings"]
        .as_array()?
        .iter()
        .find(|finding| {
            finding["object"].as_str().is_some_and(|object| object.starts_with(&prefix))
        })
        .cloned()
}
