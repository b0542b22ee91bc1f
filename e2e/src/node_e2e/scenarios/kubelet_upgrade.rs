//! `kubelet-upgrade`: the kubelet upgraded in place from one minor to the
//! next, on a node of `--kubelet-dir 1.35=DIR` whose `--bin-dir` holds the
//! 1.36 kubelet ([`Node::upgrade_kubelet`]), with plugins running: the CSI
//! driver of `csi-driver`, squat/generic-device-plugin and the DRA test
//! driver. Each registers again on the new kubelet (its log says when); the
//! doctor shows no `True` from the new kubelet's return until all have,
//! and its report follows the new minor, the one its per-minor rules key
//! on, without a restart of its pod.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::super::kubelets::Programs;
use super::super::node::Node;
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::device::LastStatus;
use super::doctor::{CONDITION, DOCTOR_SELECTOR, NAMESPACE};
use super::doctor::{doctor_report, one_doctor_pod};
use super::node_events::{describe_back, registered_plugins, wait_registered, wrong_all_clears};
use super::timeline::{Follow, Timeline, offset};
use super::{Skipped, secs};
use crate::command::Result;
use crate::scenario::wait_for;

/// How long the plugins may take to register again, and the doctor to
/// follow.
const WINDOW: Duration = Duration::from_secs(120);

/// `kubelet-upgrade`: see the module.
pub(super) fn kubelet_upgrade(env: &Env, node: &mut Node) -> Result<String> {
    let newest = Programs { kubelet_dir: None, bin_dir: env.bin_dir.clone() };
    let (from, to) = (node.kubelet_minor, newest.minor("kubelet"));
    let (Some(from), Some(to)) = (from, to) else {
        return Err(Skipped(format!(
            "an upgrade needs the node's kubelet one minor older than --bin-dir's; the node's is \
             {from:?}, --bin-dir's {to:?} (run with --kubelet-dir 1.{}=DIR)",
            to.map_or(35, |to| to - 1)
        ))
        .into());
    };
    if to != from + 1 {
        return Err(Skipped(format!(
            "the node's kubelet is 1.{from} and --bin-dir's 1.{to}: an upgrade goes from one \
             minor to the next (run with --kubelet-dir 1.{}=DIR)",
            to - 1
        ))
        .into());
    }

    node.apply(include_str!("../manifests/generic-device-plugin.yaml"))?;
    node.apply(include_str!("../manifests/dra-test-driver.yaml"))?;
    let follow = Follow {
        conditions: vec![CONDITION.to_owned(), "Ready".to_owned()],
        resources: vec!["squat.ai/null".to_owned()],
        csinodes: vec![NODE_NAME.to_owned()],
        ..Follow::default()
    };
    let timeline = Timeline::start(
        &node.api,
        follow,
        SystemTime::now(),
        "kubelet-upgrade (origin: the plugins applied)",
    );
    one_doctor_pod(node)?;
    let wanted = ["squat.ai/null", "test-driver.cdi.k8s.io", "hostpath.csi.k8s.io"];
    let (plugins, report) = wait_for("kpm doctor ok with the plugins", START_TIMEOUT, || {
        let Ok((plugins, report)) = registered_plugins(node) else { return Ok(None) };
        let all = wanted.iter().all(|name| plugins.iter().any(|p| p.name == *name));
        Ok(all.then_some((plugins, report)))
    })?;
    let version_before = kubelet_version(&report);
    let doctor_before = doctor_pod(node)?;

    let status_before = LastStatus::read(node)?;
    let upgraded = SystemTime::now();
    node.upgrade_kubelet()?;
    node.wait_ready()?;
    let returned = status_before.wait_anew(node)?;
    let back = wait_registered(node, &plugins, upgraded, WINDOW)?;
    let all_back = back.iter().map(|(_, at)| *at).max().unwrap_or(returned);
    let (version_after, followed) = wait_for("kpm doctor ok on the new minor", WINDOW, || {
        let (code, report) = doctor_report(node)?;
        let version = kubelet_version(&report);
        let on_new = version.starts_with(&format!("v1.{to}."));
        Ok((code == 0 && on_new).then(|| (version, SystemTime::now())))
    })?;
    let aggregate = format!("condition {CONDITION}");
    let healthy = timeline.wait(&aggregate, all_back, WINDOW, |v| v.starts_with("True"))?;
    let doctor_after = doctor_pod(node)?;
    eprintln!("{}", timeline.print());
    eprintln!(
        "kubelet-upgrade: 1.{from} SIGTERM {:+.1} s, the 1.{to} kubelet's first Node status \
         {:+.1} s, back: {}; kpm doctor on {version_after} {:+.1} s",
        offset(timeline.origin, upgraded),
        offset(timeline.origin, returned),
        describe_back(&back, timeline.origin),
        offset(timeline.origin, followed),
    );

    let wrong = wrong_all_clears(&timeline.changes(), returned, all_back);
    if !wrong.is_empty() {
        return Err(format!(
            "{CONDITION} True after the new kubelet's return while a plugin was not back: {wrong:?}"
        )
        .into());
    }
    if doctor_after != doctor_before {
        return Err(format!(
            "the doctor's pod changed with the upgrade: {doctor_before} then {doctor_after}"
        )
        .into());
    }
    Ok(format!(
        "{version_before} → {version_after}: the new kubelet's first Node status {:.1} s after \
         the old one's SIGTERM; registered again: {}; kpm doctor on {version_after} {:.1} s \
         after, in the same pod ({doctor_after}); {CONDITION} True {:.1} s after the last was \
         back, never before (upgrade to healthy {})",
        offset(upgraded, returned),
        describe_back(&back, upgraded),
        offset(upgraded, followed),
        offset(all_back, healthy),
        secs(healthy.duration_since(upgraded).unwrap_or_default()),
    ))
}

/// The kubelet version a doctor's report judged by.
fn kubelet_version(report: &Value) -> String {
    report["kubelet_version"].as_str().unwrap_or("unknown").to_owned()
}

/// The doctor's pod, as `NAME (uid UID, N restarts)`.
fn doctor_pod(node: &Node) -> Result<String> {
    let pod = node.pod(NAMESPACE, DOCTOR_SELECTOR)?;
    Ok(format!(
        "{} (uid {}, {} restarts)",
        pod["metadata"]["name"].as_str().unwrap_or("?"),
        pod["metadata"]["uid"].as_str().unwrap_or("?"),
        pod["status"]["containerStatuses"][0]["restartCount"]
    ))
}
