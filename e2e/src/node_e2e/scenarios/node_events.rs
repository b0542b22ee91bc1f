//! What the node events' scenarios (`containerd-restart`, `reboot`,
//! `kubelet-upgrade`) share: the plugins registered before the event, as
//! the doctor's report names them; when each registered again, as the
//! kubelet's own log says (the driver's, for a DRA driver, whose
//! registration the kubelet logs only at `-v=3`); and the check that no
//! `True` condition was seen on the Node while one of them was not back.

use std::time::SystemTime;

use serde_json::Value;

use super::super::node::Node;
use super::doctor::CONDITION;
use super::doctor::doctor_report;
use super::timeline::{Change, offset};
use crate::command::Result;

/// A plugin the doctor found registered: its report's `type` and `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Plugin {
    pub(super) kind: String,
    pub(super) name: String,
}

impl std::fmt::Display for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind, self.name)
    }
}

/// `kpm doctor` in the doctor's pod, which must exit 0: the plugins it
/// finds registered (`ok` or `publishing`), and the report.
pub(super) fn registered_plugins(node: &Node) -> Result<(Vec<Plugin>, Value)> {
    let (code, report) = doctor_report(node)?;
    if code != 0 {
        return Err(format!("kpm doctor exits {code} before the event: {report}").into());
    }
    let plugins = report["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|row| matches!(row["verdict"].as_str(), Some("ok" | "publishing")))
        .filter_map(|row| {
            Some(Plugin {
                kind: row["type"].as_str()?.to_owned(),
                name: row["name"].as_str()?.to_owned(),
            })
        })
        .collect();
    Ok((plugins, report))
}

/// The DRA driver whose log says when the kubelet registered it
/// (`manifests/dra-test-driver.yaml`): its name, namespace and pod.
const DRA_DRIVER: (&str, &str, &str) =
    ("test-driver.cdi.k8s.io", "dra-test-driver", "dra-test-driver");

/// When `plugin` was registered at `since` or later, by the kubelet
/// running now: its log's line for the registration (`kubelet-N.log`, this
/// start's), or the DRA test driver's for the kubelet's
/// `NotifyRegistrationStatus`; `None` until then.
pub(super) fn registered_since(
    node: &Node,
    plugin: &Plugin,
    since: SystemTime,
) -> Result<Option<SystemTime>> {
    let name = plugin.name.as_str();
    let (log, needle) = match plugin.kind.as_str() {
        // The device manager's registration server, at -v=0.
        "DevicePlugin" => (
            std::fs::read_to_string(node.kubelet_log())?,
            format!(
                "Got registration request from device plugin with resource\" resourceName=\"{name}\""
            ),
        ),
        // The CSI plugin's registration handler, at -v=0.
        "CSIPlugin" => (
            std::fs::read_to_string(node.kubelet_log())?,
            format!("Register new plugin with name: {name} at endpoint"),
        ),
        "DRAPlugin" if name == DRA_DRIVER.0 => (
            // No log before its container starts.
            node.kubectl(&["logs", "-n", DRA_DRIVER.1, DRA_DRIVER.2]).unwrap_or_default(),
            "NotifyRegistrationStatus\" request=\"plugin_registered:true\"".to_owned(),
        ),
        _ => return Err(format!("no log says when {plugin} registers").into()),
    };
    Ok(log
        .lines()
        .filter(|line| line.contains(&needle))
        .filter_map(klog_time)
        .find(|at| *at >= since))
}

/// The time of a klog line (`I1129 09:22:03.123456 ...`), of this year, in
/// UTC as the node logs.
fn klog_time(line: &str) -> Option<SystemTime> {
    let header = line.get(1..21)?;
    let (date, time) = header.split_once(' ')?;
    let (month, day) = (date.get(..2)?, date.get(2..)?);
    let now = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let year = now.get(..4)?;
    humantime::parse_rfc3339_weak(&format!("{year}-{month}-{day}T{time}Z")).ok()
}

/// Waits, at most `timeout`, until each of `plugins` is registered at
/// `since` or later ([`registered_since`]); when each was.
pub(super) fn wait_registered(
    node: &Node,
    plugins: &[Plugin],
    since: SystemTime,
    timeout: std::time::Duration,
) -> Result<Vec<(Plugin, SystemTime)>> {
    let mut back = Vec::new();
    for plugin in plugins {
        let at = crate::scenario::wait_for(&format!("{plugin} registered again"), timeout, || {
            registered_since(node, plugin, since)
        })?;
        back.push((plugin.clone(), at));
    }
    Ok(back)
}

/// The `True` conditions of the doctor ([`CONDITION`]) among a timeline's
/// `changes` from `from` (the kubelet's return) until `until` (the last
/// plugin back), the one in force at `from` among them, each as
/// `True/REASON at +1.2 s`: each a wrong all-clear.
pub(super) fn wrong_all_clears(
    changes: &[Change],
    from: SystemTime,
    until: SystemTime,
) -> Vec<String> {
    let aggregate = format!("condition {CONDITION}");
    let mine: Vec<_> = changes.iter().filter(|c| c.what == aggregate).collect();
    let in_force = mine.iter().rev().find(|c| c.at <= from);
    let later = mine.iter().filter(|c| c.at > from && c.at < until);
    in_force
        .into_iter()
        .chain(later)
        .filter(|c| c.value.starts_with("True"))
        .map(|c| format!("{} at {:+.1} s", c.value, offset(from, c.at.max(from))))
        .collect()
}

/// Each plugin's time back, as `DevicePlugin squat.ai/null +3.2 s`, from
/// `origin`.
pub(super) fn describe_back(back: &[(Plugin, SystemTime)], origin: SystemTime) -> String {
    let each: Vec<String> =
        back.iter().map(|(plugin, at)| format!("{plugin} {:+.1} s", offset(origin, *at))).collect();
    each.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_klog_lines_time_is_read_from_its_header() {
        let line = r#"I1129 09:22:03.123456   12345 server.go:161] "Got registration request from device plugin with resource" resourceName="squat.ai/null""#;
        let at = klog_time(line).unwrap();
        let shown = humantime::format_rfc3339_micros(at).to_string();
        assert!(shown.ends_with("-11-29T09:22:03.123456Z"), "{shown}");
        assert_eq!(klog_time("not a klog line"), None);
    }

    #[test]
    fn a_true_in_force_at_the_return_or_seen_before_the_last_plugin_is_back_is_wrong() {
        let t = |secs: u64| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        let change = |at: u64, value: &str| Change {
            at: t(at),
            what: format!("condition {CONDITION}"),
            value: value.to_owned(),
        };
        let other =
            Change { at: t(12), what: "condition Ready".to_owned(), value: "True/x".to_owned() };
        // The return at 10, the last plugin back at 20.
        let changes = [change(5, "True/PluginsHealthy"), change(11, "False/NotRegisteredAgain")];
        assert_eq!(wrong_all_clears(&changes, t(10), t(20)), ["True/PluginsHealthy at +0.0 s"]);
        let changes = [
            change(5, "Unknown/DoctorStopped"),
            other.clone(),
            change(15, "True/PluginsHealthy"),
            change(16, "False/NotRegisteredAgain"),
        ];
        assert_eq!(wrong_all_clears(&changes, t(10), t(20)), ["True/PluginsHealthy at +5.0 s"]);
        let changes =
            [change(5, "Unknown/DoctorStopped"), other, change(21, "True/PluginsHealthy")];
        assert!(wrong_all_clears(&changes, t(10), t(20)).is_empty());
    }
}
