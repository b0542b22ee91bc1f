//! `registrar-killed`: breakage as it happens in the field, seen by the
//! doctor's DaemonSet of `doctor`: the CSI driver's registrar container
//! killed once (the kubelet restarts it at once: not reported), then a
//! second time (the kubelet backs off: reported, then recovered). Two
//! crashes within the doctor's flap window make the driver `Flapping`,
//! whose recovery is published once it has held still for the flap hold.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::super::node::Node;
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::csi::{CSI_NAMESPACE, CSI_SELECTOR};
use super::doctor::{CONDITION, node_condition, node_events};
use super::secs;
use crate::command::Result;
use crate::scenario::wait_for;

/// How long the doctor may take to publish a failure or a recovery: its
/// `--confirm-ms` (3 s) and a pass.
const PUBLISH_WITHIN: Duration = Duration::from_secs(5);
/// How long a flapping plugin must hold still before its recovery is
/// published: the doctor's `--flap-hold` default.
pub(super) const FLAP_HOLD: Duration = Duration::from_secs(60);
/// How long a single kill is watched for a report that must not come.
const QUIET_FOR: Duration = Duration::from_secs(8);

/// Kills the registrar once, then again once it is back, checking the
/// doctor's condition and Events on the Node each time.
pub(super) fn registrar_killed(_env: &Env, node: &mut Node) -> Result<String> {
    let restarts = registrar_restarts(node)?;
    let killed = Instant::now();
    kill_program("node-driver-registrar")?;
    let healed = wait_for("the registrar restarted", START_TIMEOUT, || {
        Ok((registrar_restarts(node)? > restarts && registrar_ready(node)?).then(Instant::now))
    })?;
    // Healed within a second: the doctor must not have said otherwise.
    let quiet_until = Instant::now() + QUIET_FOR;
    while Instant::now() < quiet_until {
        if let Some(status) = node_condition(node)?.filter(|(status, _)| status != "True") {
            return Err(format!(
                "a registrar the kubelet healed in {} was reported: {status:?}",
                secs(healed - killed)
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // Killed a second time: the kubelet now waits 10 s before it restarts
    // the container (its back-off), which the doctor must report.
    let restarts = registrar_restarts(node)?;
    let second_kill = Instant::now();
    kill_program("node-driver-registrar")?;
    let (reported, reason) = wait_for(&format!("{CONDITION} False"), START_TIMEOUT, || {
        Ok(node_condition(node)?
            .filter(|(status, _)| status == "False")
            .map(|(_, reason)| (Instant::now(), reason)))
    })?;
    let report_time = reported - second_kill;
    if report_time > PUBLISH_WITHIN {
        return Err(format!(
            "the registrar's back-off was reported {} after the kill",
            secs(report_time)
        )
        .into());
    }
    let event_note =
        wait_for(&format!("an Event {reason} on Node {NODE_NAME}"), START_TIMEOUT, || {
            Ok(node_events(node)?
                .into_iter()
                .find(|event| event["reason"] == reason.as_str())
                .map(|event| event["note"].as_str().unwrap_or_default().to_owned()))
        })?;
    if event_note.contains("/host/") {
        return Err(format!("the Event names a path under /host: {event_note}").into());
    }
    // Ready again only once restarted: until the kubelet sees the kill, the
    // killed container still reads as ready.
    let back = wait_for("the registrar back after its back-off", START_TIMEOUT, || {
        Ok((registrar_restarts(node)? > restarts && registrar_ready(node)?).then(Instant::now))
    })?;
    // Two crashes in a few seconds: the driver may be flapping by now,
    // which holds its recovery back for the hold.
    let mut flapping = false;
    let recovered =
        wait_for(&format!("{CONDITION} True again"), START_TIMEOUT + FLAP_HOLD, || {
            let condition = node_condition(node)?;
            flapping |= condition.as_ref().is_some_and(|(_, reason)| reason == "Flapping");
            Ok(condition.filter(|(status, _)| status == "True").map(|_| Instant::now()))
        })?;
    let recovery_time = recovered.saturating_duration_since(back);
    let allowed = if flapping { FLAP_HOLD + PUBLISH_WITHIN } else { PUBLISH_WITHIN };
    if recovery_time > allowed {
        return Err(format!(
            "the recovery was published {} after the registrar was back{}",
            secs(recovery_time),
            if flapping { ", past the flap hold" } else { "" }
        )
        .into());
    }
    if flapping {
        wait_for(&format!("an Event PluginStable on Node {NODE_NAME}"), START_TIMEOUT, || {
            Ok(node_events(node)?
                .iter()
                .any(|event| event["reason"] == "PluginStable")
                .then_some(()))
        })?;
    }
    Ok(format!(
        "one kill healed in {} and not reported; killed again: False/{reason} {} after, Event {:?}; \
         back after {} of back-off, True {} later{}",
        secs(healed - killed),
        secs(report_time),
        event_note,
        secs(back - second_kill),
        secs(recovery_time),
        if flapping { " (Flapping, held still for the hold, then PluginStable)" } else { "" },
    ))
}

/// The registrar container's status in the CSI driver's pod.
fn registrar_status(node: &Node) -> Result<Value> {
    let pod = node.pod(CSI_NAMESPACE, CSI_SELECTOR)?;
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|statuses| statuses.iter().find(|s| s["name"] == "node-driver-registrar"))
        .cloned()
        .ok_or_else(|| "the CSI driver's pod has no registrar container".into())
}

pub(super) fn registrar_restarts(node: &Node) -> Result<u64> {
    Ok(registrar_status(node)?["restartCount"].as_u64().unwrap_or_default())
}

fn registrar_ready(node: &Node) -> Result<bool> {
    Ok(registrar_status(node)?["ready"] == true)
}

/// SIGKILL to every process of the node running `program` (containers'
/// processes are the host's too: no PID namespace hides them from here).
pub(super) fn kill_program(program: &str) -> Result {
    signal_program(program, "", "-KILL")
}

/// Sends `signal` (`-STOP`, `-KILL`) to every process of the node running
/// `program` whose arguments hold `argument` (any, when it is empty); an
/// error when there is none.
pub(super) fn signal_program(program: &str, argument: &str, signal: &str) -> Result {
    let mut signalled = 0;
    for entry in std::fs::read_dir("/proc")? {
        let path = entry?.path();
        let Ok(exe) = std::fs::read_link(path.join("exe")) else { continue };
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else { continue };
        let args = String::from_utf8_lossy(&cmdline);
        if exe.file_name().is_some_and(|name| name == program) && args.contains(argument) {
            let pid = path.file_name().and_then(|pid| pid.to_str()).unwrap_or_default();
            if super::super::host::run("kill", &[signal, pid]).is_ok() {
                // To set beside the doctor's log, whose times are the same clock's.
                let now = humantime::format_rfc3339_millis(std::time::SystemTime::now());
                eprintln!("{now} kill {signal} {program} (pid {pid})");
                signalled += 1;
            }
        }
    }
    if signalled == 0 { Err(format!("no {program} process to signal").into()) } else { Ok(()) }
}

/// The CSI driver's pod deleted, as `kubectl delete pod` or a drain does:
/// the registrar is stopped (it removes its socket), the DaemonSet's new
/// pod registers the driver again, CSINode lists it, and the doctor's
/// condition ends `True`; what it said in between is reported.
pub(super) fn driver_pod_deleted(_env: &Env, node: &mut Node) -> Result<String> {
    let old = node.pod(CSI_NAMESPACE, CSI_SELECTOR)?;
    let old_name =
        old["metadata"]["name"].as_str().ok_or("the CSI driver's pod has no name")?.to_owned();
    let deleted = Instant::now();
    node.kubectl(&["delete", "pod", "-n", CSI_NAMESPACE, &old_name, "--wait=true"])?;
    let gone = deleted.elapsed();
    let mut said = vec!["True".to_owned()];
    let mut remember = |condition: Option<(String, String)>| {
        let now = match condition {
            Some((status, reason)) if status != "True" => format!("{status}/{reason}"),
            Some(_) => "True".to_owned(),
            None => "none".to_owned(),
        };
        if said.last() != Some(&now) {
            said.push(now);
        }
    };
    let ready = wait_for("the DaemonSet's new CSI driver pod ready", START_TIMEOUT, || {
        remember(node_condition(node)?);
        let pods = node.pods(CSI_NAMESPACE, CSI_SELECTOR)?;
        let ready = pods.iter().any(|pod| {
            pod["metadata"]["name"] != old_name.as_str()
                && pod["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|statuses| statuses.iter().all(|s| s["ready"] == true))
        });
        Ok(ready.then(Instant::now))
    })?;
    let healthy = wait_for(&format!("{CONDITION} True with the new pod"), START_TIMEOUT, || {
        let condition = node_condition(node)?;
        let healthy = condition.as_ref().is_some_and(|(status, _)| status == "True");
        remember(condition);
        Ok(healthy.then(Instant::now))
    })?;
    Ok(format!(
        "old pod gone {} after the delete, new pod ready {} after it; {CONDITION} {} (True {} after the new pod was ready)",
        secs(gone),
        secs(ready - deleted),
        said.join(" → "),
        secs(healthy.saturating_duration_since(ready))
    ))
}
