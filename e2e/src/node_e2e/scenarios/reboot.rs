//! `reboot`: a reboot, simulated ([`Node::shut_down`], [`Node::boot`]):
//! the kubelet and containerd stopped, every process of the pods ended
//! (SIGTERM, then SIGKILL), `/run` emptied, the sockets left in
//! `/var/lib/kubelet`, then containerd and the kubelet started again. The
//! kernel keeps its boot time, so the doctor sees the kubelet's start, not
//! a boot (`docs/operations.md`, "After a node event").
//!
//! On the node: two CSI plugins held back after the reboot until released
//! (`manifests/reboot.yaml`: one the kubelet's, one `kpm run`'s on its
//! second root), squat/generic-device-plugin, the DRA test driver and a pod
//! holding a claim of its devices, with the doctor of `doctor` and `kpm
//! run` of `kpm-run`. The doctor, stopped with its node, leaves its
//! condition `Unknown/DoctorStopped`, which is what the kubelet finds on
//! its return; it names the held plugin's socket a leftover until the
//! plugin is back, and shows no `True` until every plugin registered
//! before is registered again (the kubelet's log says when). The claim is
//! prepared again, its CDI spec back in the emptied `/run/cdi`, and `kpm
//! run` registers its plugin again once it returns.

use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::super::kubelets;
use super::super::node::Node;
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::Skipped;
use super::device::LastStatus;
use super::doctor::{CONDITION, NAMESPACE as KPM_NAMESPACE};
use super::doctor::{doctor_report, one_doctor_pod};
use super::node_events::{
    Plugin, describe_back, registered_plugins, wait_registered, wrong_all_clears,
};
use super::run::{SECOND_NODE, SECOND_ROOT};
use super::timeline::{Follow, Timeline, offset};
use crate::command::Result;
use crate::scenario::wait_for;

const NAMESPACE: &str = "reboot";
/// The files the held plugins' pods mount, on the node's `/run`.
const HOLD: &str = "/run/kpm-e2e-hold";
/// The held plugins: the kubelet's, and `kpm run`'s.
const HELD_CSI: &str = "csi.held.example.com";
const HELD_SECOND: &str = "csi.second-held.example.com";
/// Where the DRA test driver writes its CDI specs (its `--cdi-dir`).
const CDI_DIR: &str = "/run/cdi";
/// How long the pods' processes have between SIGTERM and SIGKILL: the
/// doctor writes its conditions as it stops.
const GRACE: Duration = Duration::from_secs(10);
/// How long the held plugins stay held after the kubelet's return.
const HELD_FOR: Duration = Duration::from_secs(20);
/// How long the node may take to be back, its pods and plugins.
const WINDOW: Duration = Duration::from_secs(180);
/// `kpm run`'s pods.
const RUN_SELECTOR: &str = "app.kubernetes.io/name=kpm";

/// `reboot`: see the module.
pub(super) fn reboot(_env: &Env, node: &mut Node) -> Result<String> {
    if kubelets::dra_api_version(node.kubelet_minor) != "v1" {
        return Err(Skipped(
            "the claim is written in resource.k8s.io/v1 (kubelets from 1.34)".to_owned(),
        )
        .into());
    }
    let (timeline, plugins, claim) = deploy(node)?;

    // The shutdown, and what it leaves on the Node and the disk.
    let status_before = LastStatus::read(node)?;
    let down = SystemTime::now();
    node.shut_down(GRACE)?;
    let aggregate = format!("condition {CONDITION}");
    let stopped =
        timeline.wait(&aggregate, down, START_TIMEOUT, |v| v == "Unknown/DoctorStopped")?;
    let held_socket = socket_of(&node.kubelet_root.join("plugins_registry"), HELD_CSI)?
        .ok_or("the held plugin's socket did not outlive the shutdown")?;
    if std::fs::read_dir(CDI_DIR).is_ok() {
        return Err(format!("{CDI_DIR} outlived the shutdown").into());
    }

    // The boot.
    let booted = SystemTime::now();
    node.boot()?;
    node.wait_ready()?;
    let returned = status_before.wait_anew(node)?;
    let found_at_return = timeline.current(&aggregate).unwrap_or_default();
    one_doctor_pod(node)?;
    let leftover =
        wait_for("the doctor naming the held plugin's socket a leftover", WINDOW, || {
            let (code, report) = doctor_report(node)?;
            let row = row_at(&report, &held_socket);
            let said = row
                .filter(|row| row["verdict"] == "stale" && reason(row).contains("a leftover of"));
            Ok(said.map(|row| (code, reason(row).to_owned(), SystemTime::now())))
        })?;
    if leftover.0 != 1 {
        return Err(format!("kpm doctor exits {} with a leftover socket", leftover.0).into());
    }
    // Held a while longer: the rest of the node is back meanwhile.
    let release_after = returned + HELD_FOR;
    std::thread::sleep(release_after.duration_since(SystemTime::now()).unwrap_or_default());
    let released = SystemTime::now();
    release_held()?;

    let back = wait_registered(node, &plugins, booted, WINDOW)?;
    let all_back = back.iter().map(|(_, at)| *at).max().unwrap_or(released);
    let second_back = wait_for("kpm run registering its plugin again", WINDOW, || {
        Ok(kpm_run_registered(node, HELD_SECOND, booted))
    })?;
    // What of that wait was the kubelet's: when it started the plugin.
    let second_started = wait_for("kpm run's plugin running", WINDOW, || {
        started_since(node, "held-second", booted)
    })?;
    let healthy = timeline.wait(&aggregate, all_back, WINDOW, |v| v.starts_with("True"))?;
    let consumer = wait_for("the claim's pod running again", WINDOW, || {
        started_since(node, "consumer", booted)
    })?;
    let cdi = wait_for("the claim's CDI spec written again", WINDOW, || cdi_spec_of(&claim))?;
    eprintln!("{}", timeline.print());
    eprintln!(
        "reboot: shutdown {:+.1} s, {CONDITION} Unknown/DoctorStopped {:+.1} s, boot {:+.1} s, \
         the kubelet's first Node status {:+.1} s, leftover named {:+.1} s, plugins released \
         {:+.1} s, back: {}; kpm run's {HELD_SECOND} {:+.1} s",
        offset(timeline.origin, down),
        offset(timeline.origin, stopped),
        offset(timeline.origin, booted),
        offset(timeline.origin, returned),
        offset(timeline.origin, leftover.2),
        offset(timeline.origin, released),
        describe_back(&back, timeline.origin),
        offset(timeline.origin, second_back),
    );
    eprintln!("reboot: kpm doctor on the held socket: {}", leftover.1);

    let wrong = wrong_all_clears(&timeline.changes(), returned, all_back);
    if !wrong.is_empty() {
        return Err(format!(
            "{CONDITION} True after the kubelet's return while a plugin was not back: {wrong:?}"
        )
        .into());
    }
    if found_at_return.starts_with("True") {
        return Err(format!("the kubelet returned to {CONDITION} {found_at_return}").into());
    }
    uninstall(node)?;
    Ok(format!(
        "{} plugins registered before; shut down: {CONDITION} Unknown/DoctorStopped {:.1} s \
         after, the held plugin's socket and no {CDI_DIR} left; the kubelet's first Node status \
         {:.1} s after the boot found {found_at_return}; kpm doctor named the held socket a \
         leftover {:.1} s after it (exit 1); released {:.1} s after it, back {} from the boot; \
         kpm run registered {HELD_SECOND} again {:.1} s after the boot ({:.1} s after the kubelet \
         started its container); {CONDITION} True {:.1} s \
         after the last was back, never before; the claim's pod Running {:.1} s after the boot \
         with its CDI spec {cdi} written again",
        plugins.len(),
        offset(down, stopped),
        offset(booted, returned),
        offset(returned, leftover.2),
        offset(returned, released),
        describe_back(&back, booted),
        offset(booted, second_back),
        offset(second_started, second_back),
        offset(all_back, healthy),
        offset(booted, consumer),
    ))
}

/// The plugins, the claim and its pod deployed and the node healthy: the
/// timeline from then, the plugins the doctor finds registered, and the
/// claim's UID.
fn deploy(node: &Node) -> Result<(Timeline, Vec<Plugin>, String)> {
    release_held()?;
    node.apply(include_str!("../manifests/generic-device-plugin.yaml"))?;
    node.apply(include_str!("../manifests/dra-test-driver.yaml"))?;
    node.apply(
        &include_str!("../manifests/reboot.yaml")
            .replace("@NODE@", NODE_NAME)
            .replace("@SECOND_NODE@", SECOND_NODE)
            .replace("@SECOND_ROOT@", SECOND_ROOT)
            .replace("@KUBELET_ROOT@", &node.kubelet_root.display().to_string())
            .replace("@HOLD@", HOLD)
            .replace("@HELD_CSI@", HELD_CSI)
            .replace("@HELD_SECOND@", HELD_SECOND),
    )?;
    let follow = Follow {
        conditions: vec![CONDITION.to_owned(), "Ready".to_owned()],
        resources: vec!["squat.ai/null".to_owned()],
        csinodes: vec![NODE_NAME.to_owned(), SECOND_NODE.to_owned()],
        pods: Some(NAMESPACE.to_owned()),
        ..Follow::default()
    };
    let timeline = Timeline::start(
        &node.api,
        follow,
        SystemTime::now(),
        "reboot (origin: the plugins applied)",
    );
    let since = timeline.origin - Duration::from_secs(1);
    timeline.wait("pod consumer", since, START_TIMEOUT, |v| v.starts_with("Running"))?;
    one_doctor_pod(node)?;
    let wanted = [HELD_CSI, "squat.ai/null", "test-driver.cdi.k8s.io"];
    let plugins = wait_for("kpm doctor ok with the plugins", START_TIMEOUT, || {
        let (plugins, _) = registered_plugins(node).unwrap_or_default();
        Ok(wanted.iter().all(|name| plugins.iter().any(|p| p.name == *name)).then_some(plugins))
    })?;
    wait_for("kpm run registering its plugin", START_TIMEOUT, || {
        Ok(kpm_run_registered(node, HELD_SECOND, since))
    })?;
    timeline
        .wait(&format!("condition {CONDITION}"), since, START_TIMEOUT, |v| v.starts_with("True"))?;
    let claim = node.get(&["resourceclaim", "-n", NAMESPACE, "reboot-claim"])?;
    let uid = claim["metadata"]["uid"].as_str().ok_or("the claim has no UID")?.to_owned();
    cdi_spec_of(&uid)?.ok_or_else(|| format!("no CDI spec of claim {uid} in {CDI_DIR}"))?;
    Ok((timeline, plugins, uid))
}

/// Makes the files the held plugins' pods mount: before they are
/// deployed, and to release them after the reboot emptied `/run`.
fn release_held() -> Result {
    std::fs::create_dir_all(HOLD)?;
    for name in ["held-csi", "held-second"] {
        std::fs::write(Path::new(HOLD).join(name), "")?;
    }
    Ok(())
}

/// The socket in `dir` of the plugin named `name`, if there is one.
fn socket_of(dir: &Path, name: &str) -> Result<Option<std::path::PathBuf>> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.file_name().is_some_and(|file| file.to_string_lossy().contains(name)) {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// The name of the CDI spec of claim `uid` in [`CDI_DIR`], if there is
/// one (the test driver names it `DRIVER-UID-REQUEST.json`).
fn cdi_spec_of(uid: &str) -> Result<Option<String>> {
    let Ok(entries) = std::fs::read_dir(CDI_DIR) else { return Ok(None) };
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let json = Path::new(&name).extension().is_some_and(|ext| ext == "json");
        if name.contains(uid) && json {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// When `kpm run` logged the registration of plugin `name` at `since` or
/// later (its pod's log, with the runtime's timestamps).
fn kpm_run_registered(node: &Node, name: &str, since: SystemTime) -> Option<SystemTime> {
    // No log before its container starts.
    let log = node
        .kubectl(&["logs", "-n", KPM_NAMESPACE, "-l", RUN_SELECTOR, "--timestamps", "--tail=-1"])
        .unwrap_or_default();
    log.lines()
        .filter(|line| line.contains("plugin registered") && line.contains(name))
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|time| humantime::parse_rfc3339_weak(time).ok())
        .find(|at| *at >= since)
}

/// When the container of pod `name` (of the scenario's namespace) started,
/// if it runs and started at `since` or later (the API's times have whole
/// seconds): a pod's status says Running from before a reboot until the
/// kubelet syncs it.
fn started_since(node: &Node, name: &str, since: SystemTime) -> Result<Option<SystemTime>> {
    let pod = node.get(&["pod", "-n", NAMESPACE, name])?;
    let started = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
        .as_str()
        .and_then(|time| humantime::parse_rfc3339_weak(time).ok());
    Ok(started.filter(|at| *at + Duration::from_secs(1) >= since))
}

/// The report's row of socket `path`.
fn row_at<'a>(report: &'a Value, path: &Path) -> Option<&'a Value> {
    report["plugins"].as_array()?.iter().find(|row| row["path"] == path.display().to_string())
}

fn reason(row: &Value) -> &str {
    row["reason"].as_str().unwrap_or_default()
}

/// Everything of the scenario deleted, the sockets the held plugins left
/// with it (they leave them on SIGTERM), and the node healthy again.
fn uninstall(node: &Node) -> Result {
    node.kubectl(&["delete", "namespace", NAMESPACE, "--wait=true"])?;
    node.kubectl(&["delete", "deviceclass", "reboot.example.com", "--wait=true"])?;
    for (dir, name) in [
        (node.kubelet_root.join("plugins_registry"), HELD_CSI),
        (Path::new(SECOND_ROOT).join("plugins_registry"), HELD_SECOND),
    ] {
        if let Some(socket) = socket_of(&dir, name)? {
            std::fs::remove_file(socket)?;
        }
    }
    std::fs::remove_dir_all(HOLD)?;
    Ok(())
}
