//! `containerd-restart`: containerd stopped under running plugins (the CSI
//! driver of `csi-driver`, squat/generic-device-plugin, `kpm run` of
//! `kpm-run` with its plugin) until the kubelet calls the node `NotReady`,
//! then started again, as its service manager restarts it. The pods run
//! on: every container keeps its ID and restart count, every plugin socket
//! its inode, CSINodes their drivers, the Node its allocatable. The doctor
//! shows no `True` while a plugin is not registered, and afterwards `kpm
//! doctor` finds every plugin of before `ok` and nothing stale.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::super::node::Node;
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::device::DEVICE_PLUGINS;
use super::doctor::CONDITION;
use super::doctor::{doctor_report, one_doctor_pod, verdict};
use super::node_events::registered_plugins;
use super::run::SECOND_NODE;
use super::secs;
use super::timeline::{Follow, Timeline, offset};
use crate::command::Result;
use crate::scenario::wait_for;

/// generic-device-plugin's resource and its count
/// (`manifests/generic-device-plugin.yaml`).
const GENERIC: (&str, &str) = ("squat.ai/null", "3");
/// How long the kubelet may take to call the node `NotReady` with
/// containerd gone (its runtime check every 5 s, its status every 10 s),
/// and to call it Ready again.
const NOTICED: Duration = Duration::from_secs(90);

/// `containerd-restart`: see the module.
pub(super) fn containerd_restart(_env: &Env, node: &mut Node) -> Result<String> {
    node.apply(include_str!("../manifests/generic-device-plugin.yaml"))?;
    let follow = Follow {
        conditions: vec![CONDITION.to_owned(), "Ready".to_owned()],
        resources: vec![GENERIC.0.to_owned()],
        csinodes: vec![NODE_NAME.to_owned(), SECOND_NODE.to_owned()],
        ..Follow::default()
    };
    let timeline = Timeline::start(
        &node.api,
        follow,
        SystemTime::now(),
        "containerd-restart (origin: the device plugin applied)",
    );
    let since = timeline.origin - Duration::from_secs(1);
    let allocatable = format!("allocatable {}", GENERIC.0);
    timeline.wait(&allocatable, since, START_TIMEOUT, |v| v == GENERIC.1)?;
    one_doctor_pod(node)?;
    let plugins = wait_for("kpm doctor ok, with the device plugin", START_TIMEOUT, || {
        let (plugins, _) = registered_plugins(node)?;
        Ok(plugins.iter().any(|p| p.name == GENERIC.0).then_some(plugins))
    })?;
    let before = Snapshot::take(node)?;

    let stopped = SystemTime::now();
    node.stop_containerd()?;
    let not_ready =
        timeline.wait("condition Ready", stopped, NOTICED, |v| v.starts_with("False"))?;
    let started = SystemTime::now();
    node.start_containerd()?;
    let ready = timeline.wait("condition Ready", started, NOTICED, |v| v.starts_with("True"))?;

    // Every plugin of before ok again in kpm doctor, and nothing else
    // failing: the node as it was.
    let (after_report, settled) =
        wait_for("kpm doctor ok after the restart", START_TIMEOUT, || {
            let (code, report) = doctor_report(node)?;
            let all_ok = plugins.iter().all(|p| verdict(&report, &p.name).as_deref() == Some("ok"));
            Ok((code == 0 && all_ok).then(|| (report, SystemTime::now())))
        })?;
    let after = Snapshot::take(node)?;
    let aggregate = format!("condition {CONDITION}");
    timeline.wait(&aggregate, started, START_TIMEOUT, |v| v.starts_with("True"))?;
    eprintln!("{}", timeline.print());
    eprintln!(
        "containerd-restart: containerd SIGTERM {:+.1} s, Ready False {:+.1} s, containerd \
         started {:+.1} s, Ready True {:+.1} s, kpm doctor ok {:+.1} s",
        offset(timeline.origin, stopped),
        offset(timeline.origin, not_ready),
        offset(timeline.origin, started),
        offset(timeline.origin, ready),
        offset(timeline.origin, settled),
    );

    let mut wrong = before.differences(&after);
    wrong.extend(stale_rows(&after_report));
    // The plugins stayed registered, so the one wrong all-clear would be a
    // True while the kubelet had lost one: the Node's allocatable or the
    // CSINode's drivers other than before.
    for (what, was) in [
        (allocatable.clone(), GENERIC.1.to_owned()),
        (
            format!("csinode {NODE_NAME}"),
            timeline.current(&format!("csinode {NODE_NAME}")).unwrap_or_default(),
        ),
    ] {
        for change in timeline.changes().iter().filter(|c| c.what == what && c.at >= stopped) {
            if change.value != was {
                wrong.push(format!(
                    "{what} = {} at {:+.1} s",
                    change.value,
                    offset(stopped, change.at)
                ));
            }
        }
    }
    let falses: Vec<String> = timeline
        .changes()
        .iter()
        .filter(|c| c.what == aggregate && c.at >= stopped && !c.value.starts_with("True"))
        .map(|c| format!("{} {:+.1} s", c.value, offset(stopped, c.at)))
        .collect();
    if !wrong.is_empty() {
        return Err(format!("containerd's restart changed the node: {}", wrong.join("; ")).into());
    }
    Ok(format!(
        "containerd down {} (Ready False {:.1} s after its SIGTERM, True {:.1} s after its \
         start); {} containers kept their IDs and restart counts, {} sockets their inodes, \
         {} plugins ok in kpm doctor {:.1} s after containerd's start, nothing stale; \
         {CONDITION} {}",
        secs(started.duration_since(stopped).unwrap_or_default()),
        offset(stopped, not_ready),
        offset(started, ready),
        before.containers.len(),
        before.sockets.len(),
        plugins.len(),
        offset(started, settled),
        if falses.is_empty() {
            "True throughout".to_owned()
        } else {
            format!("went {}", falses.join(", "))
        },
    ))
}

/// What must outlive containerd's restart: each container of the node's
/// pods not being deleted (`namespace/pod/container` → its ID and restart
/// count) and each plugin socket (its path → its inode).
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    containers: BTreeMap<String, String>,
    sockets: BTreeMap<String, u64>,
}

impl Snapshot {
    fn take(node: &Node) -> Result<Self> {
        let on_node = format!("spec.nodeName={NODE_NAME}");
        let pods = node.get(&["pods", "--all-namespaces", "--field-selector", &on_node])?;
        let mut containers = BTreeMap::new();
        // Not a pod being deleted: an earlier scenario's, going anyway.
        let staying = |pod: &&Value| pod["metadata"]["deletionTimestamp"].is_null();
        for pod in pods["items"].as_array().into_iter().flatten().filter(staying) {
            let pod_name = format!(
                "{}/{}",
                pod["metadata"]["namespace"].as_str().unwrap_or("?"),
                pod["metadata"]["name"].as_str().unwrap_or("?")
            );
            for status in pod["status"]["containerStatuses"].as_array().into_iter().flatten() {
                containers.insert(
                    format!("{pod_name}/{}", status["name"].as_str().unwrap_or("?")),
                    format!(
                        "{} restarts {}",
                        status["containerID"].as_str().unwrap_or("none"),
                        status["restartCount"]
                    ),
                );
            }
        }
        let mut sockets = BTreeMap::new();
        let registry = node.kubelet_root.join("plugins_registry");
        for dir in [registry.as_path(), Path::new(DEVICE_PLUGINS)] {
            for entry in std::fs::read_dir(dir)? {
                let entry = entry?;
                // Not the device manager's checkpoint, rewritten at will.
                if entry.file_type()?.is_socket() {
                    sockets.insert(entry.path().display().to_string(), entry.metadata()?.ino());
                }
            }
        }
        Ok(Self { containers, sockets })
    }

    /// What changed from `self` to `after`, in words.
    fn differences(&self, after: &Self) -> Vec<String> {
        let mut said = Vec::new();
        for (name, was) in &self.containers {
            match after.containers.get(name) {
                Some(now) if now == was => {}
                now => said.push(format!("container {name}: {was} then {now:?}")),
            }
        }
        for (path, inode) in &self.sockets {
            match after.sockets.get(path) {
                Some(now) if now == inode => {}
                now => said.push(format!("socket {path}: inode {inode} then {now:?}")),
            }
        }
        said
    }
}

/// The rows of a report of what no plugin serves: stale sockets and
/// CSINode entries, deleted sockets.
fn stale_rows(report: &Value) -> Vec<String> {
    report["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|row| {
            matches!(
                row["verdict"].as_str(),
                Some("stale" | "stale-csi-node-entry" | "deleted-but-listening")
            )
        })
        .map(|row| format!("{} {}", row["verdict"], row["path"]))
        .collect()
}
