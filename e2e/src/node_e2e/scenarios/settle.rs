//! Before a scenario, the node settled from the ones before it: the
//! doctor's condition `True` on the Node, and `kpm doctor` in the doctor's
//! pod finding nothing failing. A scenario that breaks a plugin leaves the
//! kubelet backing off: after `alert` killed the registrar five times, the
//! kubelet's per-socket backoff kept hostpath.csi.k8s.io unregistered for
//! up to 2m2s, and `device-plugin`, next, took that for its own failure.
//! Without the doctor's pod (the scenarios before `doctor`, the node of
//! another kubelet root) nothing judges the node, and nothing is waited for.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::super::node::Node;
use super::super::{NODE_NAME, START_TIMEOUT};
use super::breakage::FLAP_HOLD;
use super::doctor::{CONDITION, DOCTOR_SELECTOR, NAMESPACE, doctor_in_pod, node_condition};
use super::secs;
use crate::command::Result;

/// The kubelet's cap on its per-socket registration backoff (its operation
/// executor's `maxDurationBeforeRetry`, 2m2s).
const KUBELET_BACKOFF_CAP: Duration = Duration::from_secs(122);
/// How long the node may take to settle: a registration retried at the
/// kubelet's cap, the doctor's flap hold for a plugin that flapped before,
/// and a pod's start on a loaded machine as slack.
const SETTLE_TIMEOUT: Duration =
    KUBELET_BACKOFF_CAP.saturating_add(FLAP_HOLD).saturating_add(START_TIMEOUT);
/// How often the node is looked at: `kpm doctor` in the pod takes a
/// `kubectl exec`.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The verdicts of `kpm doctor` that are no failure (kpm-doctor's
/// `Verdict::fails`).
const NOT_FAILING: &[&str] = &["ok", "ignored", "publishing"];

/// Waits until the node is settled, at most [`SETTLE_TIMEOUT`]; says in a
/// line what it waited for and after how long it saw it.
pub(in super::super) fn settle(node: &Node) -> Result<String> {
    if node.pods(NAMESPACE, DOCTOR_SELECTOR)?.is_empty() {
        return Ok("settle: no doctor's pod on the node to judge it, none waited for".to_owned());
    }
    let started = Instant::now();
    loop {
        let seen = look(node)?;
        if seen.settled {
            return Ok(format!("settled after {}: {}", secs(started.elapsed()), seen.what));
        }
        if started.elapsed() > SETTLE_TIMEOUT {
            return Err(format!(
                "the node did not settle from the scenarios before within {SETTLE_TIMEOUT:?} \
                 (waited for {CONDITION} True on Node {NODE_NAME} and kpm doctor in its pod \
                 finding nothing failing); last seen: {}",
                seen.what
            )
            .into());
        }
        std::thread::sleep(LOOK_EVERY);
    }
}

/// What a look at the node saw, in a line, and whether it is settled.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    settled: bool,
    what: String,
}

/// The doctor's condition on the Node, then, once it is `True`, `kpm
/// doctor` in the doctor's pod.
fn look(node: &Node) -> Result<Seen> {
    let condition = condition_seen(node_condition(node)?);
    if !condition.settled {
        return Ok(condition);
    }
    // A pod the DaemonSet is replacing is one more reason to wait.
    let pod = node.pod(NAMESPACE, DOCTOR_SELECTOR).ok();
    let Some(pod) = pod.as_ref().and_then(|pod| pod["metadata"]["name"].as_str()) else {
        return Ok(Seen { settled: false, what: "no doctor's pod on the node".to_owned() });
    };
    // Exit 1 (a plugin failing) still prints the report.
    let report = report_seen(&node.kubectl_stdout(&doctor_in_pod(pod))?);
    Ok(Seen {
        settled: report.settled,
        what: format!("{}, kpm doctor in its pod: {}", condition.what, report.what),
    })
}

/// The doctor's condition (status and reason), as `node_condition` reads it.
fn condition_seen(condition: Option<(String, String)>) -> Seen {
    match condition {
        Some((status, _)) if status == "True" => {
            Seen { settled: true, what: format!("{CONDITION} True") }
        }
        Some((status, reason)) => {
            Seen { settled: false, what: format!("{CONDITION} {status}/{reason}") }
        }
        None => Seen { settled: false, what: format!("no {CONDITION} on Node {NODE_NAME}") },
    }
}

/// What `kpm doctor -o json` printed: settled when its report is `ok`;
/// otherwise why not, each failing plugin and finding by name (or path)
/// and verdict.
fn report_seen(stdout: &str) -> Seen {
    let Ok(report) = serde_json::from_str::<Value>(stdout) else {
        let start: String = stdout.chars().take(200).collect();
        return Seen { settled: false, what: format!("no report, but {start:?}") };
    };
    let plugins = report["plugins"].as_array().map_or(0, Vec::len);
    if report["ok"] == true {
        return Seen { settled: true, what: format!("ok, {plugins} plugin socket(s)") };
    }
    if let Some(why) = report["blind"]["why"].as_str() {
        return Seen { settled: false, what: format!("could not look: {why}") };
    }
    let failing: Vec<String> = ["plugins", "findings"]
        .iter()
        .filter_map(|list| report[list].as_array())
        .flatten()
        .filter(|entry| !entry["verdict"].as_str().is_some_and(|v| NOT_FAILING.contains(&v)))
        .map(|entry| {
            let name = entry["name"].as_str().or_else(|| entry["path"].as_str()).unwrap_or("?");
            format!("{name} {}", entry["verdict"].as_str().unwrap_or("?"))
        })
        .collect();
    let what = if failing.is_empty() { "not ok".to_owned() } else { failing.join(", ") };
    Seen { settled: false, what }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_doctors_condition_settles_the_node_when_true() {
        let cases = [
            (Some(("True", "Healthy")), true, "KubeletPluginsHealthy True"),
            (Some(("False", "NotRegistered")), false, "KubeletPluginsHealthy False/NotRegistered"),
            (Some(("Unknown", "")), false, "KubeletPluginsHealthy Unknown/"),
            (None, false, "no KubeletPluginsHealthy on Node kpm-node"),
        ];
        for (condition, settled, what) in cases {
            let condition = condition.map(|(status, reason)| (status.into(), reason.into()));
            assert_eq!(condition_seen(condition), Seen { settled, what: what.to_owned() });
        }
    }

    #[test]
    fn the_doctors_report_settles_the_node_when_ok_and_names_what_fails() {
        let cases = [
            (
                r#"{"plugins": [{"verdict": "ok", "name": "a"}, {"verdict": "ignored"}], "findings": [], "ok": true}"#,
                true,
                "ok, 2 plugin socket(s)",
            ),
            (
                r#"{"plugins": [{"verdict": "ok", "name": "a"},
                                {"verdict": "not-registered", "name": "hostpath.csi.k8s.io"},
                                {"verdict": "stale", "path": "/var/lib/kubelet/plugins_registry/x.sock"}],
                    "findings": [{"verdict": "stale-csi-node-entry", "name": "b"}], "ok": false}"#,
                false,
                "hostpath.csi.k8s.io not-registered, /var/lib/kubelet/plugins_registry/x.sock stale, \
                 b stale-csi-node-entry",
            ),
            (
                r#"{"plugins": [], "findings": [], "blind": {"why": "cannot list the registry"}, "ok": false}"#,
                false,
                "could not look: cannot list the registry",
            ),
            (r#"{"plugins": [], "findings": [], "ok": false}"#, false, "not ok"),
            (
                "error: unable to upgrade connection: container not found",
                false,
                r#"no report, but "error: unable to upgrade connection: container not found""#,
            ),
        ];
        for (stdout, settled, what) in cases {
            assert_eq!(report_seen(stdout), Seen { settled, what: what.to_owned() }, "{stdout}");
        }
    }
}
