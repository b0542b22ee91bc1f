//! `device-plugin` and `kubelet-restart`: a device plugin pod on
//! `kubelet.sock` that loses its socket, and the kubelet itself restarted,
//! seen by the doctor's DaemonSet of `doctor`.

use std::time::{Instant, SystemTime};

use super::super::node::Node;
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::doctor::{CONDITION, node_condition};
use super::secs;
use crate::command::Result;
use crate::scenario::wait_for;

/// generic-device-plugin's resource, as `manifests/generic-device-plugin.yaml` configures it.
const RESOURCE: &str = "squat.ai/null";
/// The kubelet's device plugins dir: hard-coded, whatever its root.
pub(super) const DEVICE_PLUGINS: &str = "/var/lib/kubelet/device-plugins";

/// generic-device-plugin deployed: its 3 devices become the Node's
/// allocatable and the doctor stays healthy. Then its socket is removed
/// from the host, as a wiped `device-plugins/` does. generic-device-plugin
/// notices, serves a new socket and registers again 5 s later; what the
/// kubelet then makes of it varies from run to run (seen: its 3 devices
/// allocatable again, or none while its ListAndWatch stream restarts
/// several times a second). Either way the doctor must say what is: `True`
/// when the Node has the plugin's 3 devices, `False` with
/// `ClusterMismatch` when it has not.
pub(super) fn device_plugin_socket_lost(_env: &Env, node: &mut Node) -> Result<String> {
    let applied = Instant::now();
    node.apply(include_str!("../manifests/generic-device-plugin.yaml"))?;
    let listed = wait_for(&format!("{RESOURCE}: 3 on Node {NODE_NAME}"), START_TIMEOUT, || {
        Ok((allocatable_count(node)?.as_deref() == Some("3")).then(Instant::now))
    })?;
    wait_for(&format!("{CONDITION} True with the device plugin"), START_TIMEOUT, || {
        Ok(node_condition(node)?.filter(|(status, _)| status == "True"))
    })?;

    let socket = plugin_socket()?;
    std::fs::remove_file(&socket)?;
    let removed = Instant::now();
    let served = wait_for("the device plugin serving a new socket", START_TIMEOUT, || {
        Ok(plugin_socket().ok().map(|_| Instant::now()))
    })?;
    // Settled: the doctor's condition agrees with the Node twice, 3 s
    // (its confirmation) apart.
    let mut agreed_at: Option<(Instant, String)> = None;
    let (settled, outcome) =
        wait_for("the doctor's condition agreeing with the Node", START_TIMEOUT, || {
            let allocatable = allocatable_count(node)?;
            let agrees = match node_condition(node)? {
                Some((status, _)) if status == "True" && allocatable.as_deref() == Some("3") => {
                    Some(format!("the kubelet took it back ({RESOURCE} allocatable 3): True"))
                }
                Some((status, reason))
                    if status == "False"
                        && reason == "ClusterMismatch"
                        && allocatable.as_deref() != Some("3") =>
                {
                    Some(format!(
                        "the kubelet holds {} allocatable: False/{reason}",
                        allocatable.as_deref().unwrap_or("none")
                    ))
                }
                _ => None,
            };
            Ok(match (agrees, &agreed_at) {
                (Some(outcome), Some((since, before)))
                    if *before == outcome
                        && since.elapsed() >= std::time::Duration::from_secs(3) =>
                {
                    Some((Instant::now(), outcome))
                }
                (Some(outcome), Some((_, before))) if *before == outcome => None,
                (Some(outcome), _) => {
                    agreed_at = Some((Instant::now(), outcome));
                    None
                }
                (None, _) => {
                    agreed_at = None;
                    None
                }
            })
        })?;
    Ok(format!(
        "{RESOURCE}: 3 on the Node {} after apply; its socket removed: a new one served {} later; \
         settled {} after the removal: {outcome}",
        secs(listed - applied),
        secs(served - removed),
        secs(settled - removed)
    ))
}

/// The kubelet restarted (SIGTERM, then started again): the Node's status
/// posted anew, the device plugin registered again on the new
/// `kubelet.sock` (the kubelet removes every socket of `device-plugins/` at
/// its start: a plugin that is back has served a new one), and the doctor's
/// condition True.
pub(super) fn kubelet_restart(_env: &Env, node: &mut Node) -> Result<String> {
    let status_before = LastStatus::read(node)?;
    let restarted = Instant::now();
    node.restart_kubelet()?;
    node.wait_ready()?;
    status_before.wait_anew(node)?;
    let posted = Instant::now();
    let served = wait_for("the device plugin's socket served anew", START_TIMEOUT, || {
        Ok(plugin_socket().ok().map(|_| Instant::now()))
    })?;
    let healthy = wait_for(&format!("{CONDITION} True after the restart"), START_TIMEOUT, || {
        Ok(node_condition(node)?.filter(|(status, _)| status == "True").map(|_| Instant::now()))
    })?;
    Ok(format!(
        "Node status posted {} after the restart, the device plugin registered again {}, {CONDITION} True {}",
        secs(posted - restarted),
        secs(served - restarted),
        secs(healthy - restarted)
    ))
}

/// The Node's status as the kubelet running now last posted it (its `Ready`
/// condition's heartbeat), read before that kubelet stops: the next
/// kubelet's first status is the first that differs. The API's times have
/// whole seconds, so a heartbeat compared with a clock takes the old
/// kubelet's last status, posted in the second the new one started, for
/// the new one's.
pub(super) struct LastStatus(Option<String>);

impl LastStatus {
    /// Reads it, once the second of its heartbeat is over: a new kubelet's
    /// heartbeat, later, is then another.
    pub(super) fn read(node: &Node) -> Result<Self> {
        let heartbeat = ready_heartbeat(node)?;
        let at = heartbeat.as_deref().and_then(|time| humantime::parse_rfc3339_weak(time).ok());
        if let Some(over) = at.map(|at| at + std::time::Duration::from_secs(1)) {
            std::thread::sleep(over.duration_since(SystemTime::now()).unwrap_or_default());
        }
        Ok(Self(heartbeat))
    }

    /// Whether a kubelet posted the Node's status since it was read.
    pub(super) fn posted_anew(&self, node: &Node) -> Result<bool> {
        Ok(ready_heartbeat(node)?.is_some_and(|heartbeat| Some(&heartbeat) != self.0.as_ref()))
    }

    /// Waits for a kubelet's first Node status since it was read: when it
    /// was seen.
    pub(super) fn wait_anew(&self, node: &Node) -> Result<SystemTime> {
        wait_for("the kubelet's first Node status", START_TIMEOUT, || {
            Ok(self.posted_anew(node)?.then(SystemTime::now))
        })
    }
}

/// The Node's `Ready` heartbeat, as the API gives it.
fn ready_heartbeat(node: &Node) -> Result<Option<String>> {
    let object = node.api.get(&format!("/api/v1/nodes/{NODE_NAME}"))?;
    Ok(object["status"]["conditions"]
        .as_array()
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == "Ready"))
        .and_then(|ready| ready["lastHeartbeatTime"].as_str())
        .map(str::to_owned))
}

/// The Node's allocatable count of [`RESOURCE`].
fn allocatable_count(node: &Node) -> Result<Option<String>> {
    let object = node.api.get(&format!("/api/v1/nodes/{NODE_NAME}"))?;
    Ok(object["status"]["allocatable"][RESOURCE].as_str().map(str::to_owned))
}

/// The socket generic-device-plugin serves in the device plugins dir.
fn plugin_socket() -> Result<std::path::PathBuf> {
    std::fs::read_dir(DEVICE_PLUGINS)?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .find(|path| {
            path.extension().is_some_and(|ext| ext == "sock")
                && path.file_name().is_some_and(|name| name != "kubelet.sock")
        })
        .ok_or_else(|| format!("no device plugin socket in {DEVICE_PLUGINS}").into())
}
