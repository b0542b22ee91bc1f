//! `restart-window`: the window after a kubelet restart, with two device
//! plugins that never register again (kpm-registrar's example plugin with
//! `--no-reregister`, and devplayer0/k8s-hostdev-plugin, a real public one)
//! beside squat/generic-device-plugin, which does, and the doctor's
//! DaemonSet with a condition of each plugin (`--plugin-condition`, through
//! an overlay's `KPM_PLUGIN_CONDITIONS`). Before the restart all are `ok`
//! and each condition `True`. After it, `kpm doctor` in the doctor's pod
//! exits 1 naming the two `not-registered-again` with the kubelet's start,
//! the Node's allocatable and the device manager's checkpoint as evidence; the
//! aggregate and their conditions go `False` while generic-device-plugin's
//! is `True` once it registers again. Their pods deleted, their DaemonSets'
//! new pods register and everything is `True` again. From the kubelet's
//! return until then, no `True` aggregate is seen on the Node.

use std::time::{Duration, Instant, SystemTime};

use super::super::node::Node;
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::device::{DEVICE_PLUGINS, LastStatus};
use super::doctor::{
    CONDITION, DOCTOR_SELECTOR, NAMESPACE, doctor_report, one_doctor_pod, row, verdict,
};
use super::node_events::wrong_all_clears;
use super::timeline::{Follow, Timeline, offset};
use super::{doctor_with_plugin_conditions, secs};
use crate::command::Result;
use crate::scenario::wait_for;

const PLUGINS_NAMESPACE: &str = "restart-window";
/// The plugins that never register again, their pods' labels, and their
/// devices.
const ONCE: (&str, &str, &str) = ("example.com/once", "example-once", "2");
const HOSTDEV: (&str, &str, &str) = ("hostdev.k8s.io/dev_null", "hostdev", "3");
/// generic-device-plugin's resource (`manifests/generic-device-plugin.yaml`).
const GENERIC: &str = "squat.ai/null";
/// How long the kubelet keeps a gone plugin's devices (its
/// `endpointStopGracePeriod`, 5 min), and slack.
const ORPHANED_FOR: Duration = Duration::from_secs(6 * 60);
/// How long a restart may take to show, and the plugins to come back.
const WINDOW: Duration = Duration::from_secs(120);

/// A device resource's condition type, as the doctor names it by default.
pub(super) fn condition_of(resource: &str) -> String {
    format!("condition {resource}-PluginRegistered")
}

/// `restart-window`: see the module.
pub(super) fn restart_window(env: &Env, node: &mut Node) -> Result<String> {
    let applied = Instant::now();
    let timeline = deploy(env, node)?;
    let ready_before = applied.elapsed();

    // The restart.
    let status_before = LastStatus::read(node)?;
    let restarted = SystemTime::now();
    let restarted_at = Instant::now();
    node.restart_kubelet()?;
    let started = SystemTime::now();
    node.wait_ready()?;
    let returned = status_before.wait_anew(node)?;
    let aggregate = format!("condition {CONDITION}");
    let failed = timeline.wait(&aggregate, started, WINDOW, |v| v == "False/NotRegisteredAgain")?;
    let mut lost = Vec::new();
    for (resource, ..) in [ONCE, HOSTDEV] {
        let at = timeline
            .wait(&condition_of(resource), started, WINDOW, |v| v == "False/NotRegisteredAgain")?;
        lost.push(format!("{resource} False {:.1} s", offset(started, at)));
    }
    // True again once it went False with the others: the True of before
    // is still in force at the kubelet's start.
    let generic_lost =
        timeline.wait(&condition_of(GENERIC), started, WINDOW, |v| v.starts_with("False"))?;
    let generic_back =
        timeline.wait(&condition_of(GENERIC), generic_lost, WINDOW, |v| v.starts_with("True"))?;
    let evidence = named_with_evidence(node)?;

    // The plugins' pods deleted: their DaemonSets' new pods register.
    let deleted = SystemTime::now();
    node.kubectl(&[
        "delete",
        "pod",
        "-n",
        PLUGINS_NAMESPACE,
        "-l",
        &format!("app.kubernetes.io/name in ({},{})", ONCE.1, HOSTDEV.1),
        "--wait=false",
    ])?;
    let mut back = Vec::new();
    for (resource, ..) in [ONCE, HOSTDEV] {
        back.push(
            timeline.wait(&condition_of(resource), deleted, WINDOW, |v| v.starts_with("True"))?,
        );
    }
    let healthy = timeline.wait(&aggregate, deleted, WINDOW, |v| v.starts_with("True"))?;
    let all_back = back.iter().max().copied().unwrap_or(healthy);

    // No True aggregate from the kubelet's return until both were back.
    let wrong = wrong_all_clears(&timeline.changes(), returned, all_back);
    eprintln!("{}", timeline.print());
    eprintln!(
        "restart-window: kubelet SIGTERM at {:+.1} s, started {:+.1} s, its Node status {:+.1} s",
        offset(timeline.origin, restarted),
        offset(timeline.origin, started),
        offset(timeline.origin, returned)
    );
    if !wrong.is_empty() {
        return Err(format!(
            "{CONDITION} True after the kubelet's return while a plugin was not back: {wrong:?}"
        )
        .into());
    }

    // Gone before the next scenario, which waits for the node to settle:
    // the kubelet keeps a gone plugin's devices, unhealthy, for 5 min
    // (`orphaned-capacity` until then).
    let uninstalled = Instant::now();
    let since = SystemTime::now();
    node.kubectl(&["delete", "namespace", PLUGINS_NAMESPACE, "--wait=true"])?;
    // The Node without their devices (the kubelet keeps the resources,
    // at 0), then the doctor's True: a True before that is the doctor's
    // look before the kubelet's Node status.
    let mut dropped = since;
    for (resource, ..) in [ONCE, HOSTDEV] {
        let gone = timeline
            .wait(&format!("capacity {resource}"), since, ORPHANED_FOR, |v| v == "-" || v == "0")?;
        dropped = dropped.max(gone);
    }
    let aggregate_true = |v: &str| v.starts_with("True");
    timeline.wait(&aggregate, dropped, START_TIMEOUT, aggregate_true)?;
    eprintln!(
        "restart-window: {CONDITION} True {} after the uninstall",
        secs(uninstalled.elapsed())
    );
    let doctor_pods = node.pods(NAMESPACE, DOCTOR_SELECTOR)?.len();
    Ok(format!(
        "all ok and True {} after apply; kubelet restarted: {CONDITION} False/NotRegisteredAgain \
         {:.1} s after the kubelet's start ({:.1} s after its first Node status), {}; \
         {GENERIC} True again {:.1} s after the start; kpm doctor exit 1 naming {} with the \
         kubelet's start, the Node's capacity and allocatable and the checkpoint; their \
         pods deleted: both True {:.1} s, {CONDITION} True {:.1} s after; no True from the \
         kubelet's return until then ({doctor_pods} doctor pod; restart to healthy {})",
        secs(ready_before),
        offset(started, failed),
        offset(returned, failed),
        lost.join(", "),
        offset(started, generic_back),
        evidence.join(" and "),
        offset(deleted, all_back),
        offset(deleted, healthy),
        secs(restarted_at.elapsed()),
    ))
}

/// The plugins, the consumer's pod and the doctor with a condition of
/// each plugin deployed, all `ok` and `True`: the timeline, from then.
fn deploy(env: &Env, node: &mut Node) -> Result<Timeline> {
    node.apply(include_str!("../manifests/generic-device-plugin.yaml"))?;
    node.apply(
        &include_str!("../manifests/restart-window.yaml")
            .replace("@DEVICE_PLUGINS@", DEVICE_PLUGINS)
            .replace("@NODE@", NODE_NAME),
    )?;
    let resources = [ONCE.0, HOSTDEV.0, GENERIC];
    let overlay = doctor_with_plugin_conditions(env, "restart-window", &resources.join(","))?;
    node.kubectl(&["apply", "-k", &overlay.display().to_string()])?;
    let mut follow = Follow {
        conditions: vec![CONDITION.to_owned()],
        resources: resources.iter().map(|r| (*r).to_owned()).collect(),
        pods: Some(PLUGINS_NAMESPACE.to_owned()),
        ..Follow::default()
    };
    follow.conditions.extend(resources.iter().map(|r| format!("{r}-PluginRegistered")));
    let timeline = Timeline::start(
        &node.api,
        follow,
        SystemTime::now(),
        "restart-window (origin: the plugins applied)",
    );

    // Before: every plugin registered and its condition True, the
    // consumer's pod running with a device of each, and kpm doctor ok.
    let since = SystemTime::now() - Duration::from_secs(1);
    for resource in resources {
        timeline.wait(&condition_of(resource), since, START_TIMEOUT, |v| v.starts_with("True"))?;
    }
    timeline
        .wait(&format!("condition {CONDITION}"), since, START_TIMEOUT, |v| v.starts_with("True"))?;
    timeline.wait("pod consumer", since, START_TIMEOUT, |v| v.starts_with("Running"))?;
    one_doctor_pod(node)?;
    let (code, report) = doctor_report(node)?;
    for resource in resources {
        if code != 0 || verdict(&report, resource).as_deref() != Some("ok") {
            return Err(format!(
                "before the restart, kpm doctor exits {code}, {resource} {:?}: {report}",
                verdict(&report, resource)
            )
            .into());
        }
    }
    Ok(timeline)
}

/// `kpm doctor` in the doctor's pod once it names both plugins
/// `not-registered-again` and generic-device-plugin `ok`: it must exit 1,
/// each row with the kubelet's start, the Node's allocatable and the
/// checkpoint as evidence; the plugins, as the summary names them.
fn named_with_evidence(node: &Node) -> Result<Vec<String>> {
    let (exit, rows) =
        wait_for("kpm doctor naming both, generic-device-plugin ok", WINDOW, || {
            let (code, report) = doctor_report(node)?;
            let named = [ONCE.0, HOSTDEV.0]
                .iter()
                .all(|r| verdict(&report, r).as_deref() == Some("not-registered-again"));
            let generic_ok = verdict(&report, GENERIC).as_deref() == Some("ok");
            Ok((named && generic_ok).then_some((code, report)))
        })?;
    if exit != 1 {
        return Err(format!("kpm doctor exits {exit} with both not-registered-again").into());
    }
    let mut evidence = Vec::new();
    for (resource, _, devices) in [ONCE, HOSTDEV] {
        let reason = row(&rows, resource)
            .and_then(|row| row["reason"].as_str())
            .unwrap_or_default()
            .to_owned();
        eprintln!("kpm doctor: {resource} not-registered-again: {reason}");
        let wanted = [
            "registered before the kubelet's start at".to_owned(),
            format!("Node {NODE_NAME} counts capacity"),
            "allocatable".to_owned(),
        ];
        let mut missing: Vec<&str> =
            wanted.iter().map(String::as_str).filter(|w| !reason.contains(w)).collect();
        // The checkpoint: as the witness, or for the pods holding devices.
        if !reason.contains("checkpoint") && !reason.contains("holding its devices") {
            missing.push("the checkpoint");
        }
        if !missing.is_empty() {
            return Err(format!("{resource}'s row lacks {missing:?}: {reason}").into());
        }
        evidence.push(format!("{resource} ({devices} devices before)"));
    }
    Ok(evidence)
}
