//! The timeline of a node event: a thread that reads the Node (and the pods
//! of a namespace) every [`EVERY`] and keeps each change of what it is told
//! to follow, with when it was seen, for the scenario to wait on, check and
//! print. The node events' scenarios follow with it the doctor's
//! conditions, the Node's allocatable and taints, CSINodes' drivers and
//! pods' phases.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::super::NODE_NAME;
use crate::command::Result;
use crate::kube_e2e::api::Api;
use crate::scenario::wait_for;

/// How often the Node is read.
const EVERY: Duration = Duration::from_millis(250);

/// One change seen: `what` (`condition TYPE`, `capacity RES`,
/// `allocatable RES`, `taint KEY`, `pod NAME`, `csinode NAME`) became `value` (`False/NotRegisteredAgain`, `3`,
/// `NoSchedule`, `Pending`; `-` when absent) at `at`.
#[derive(Debug, Clone)]
pub(super) struct Change {
    pub(super) at: SystemTime,
    pub(super) what: String,
    pub(super) value: String,
}

/// What to follow.
#[derive(Debug, Clone, Default)]
pub(super) struct Follow {
    /// Node condition types: `STATUS/REASON` each.
    pub(super) conditions: Vec<String>,
    /// Resources of the Node: their capacity and allocatable each.
    pub(super) resources: Vec<String>,
    /// Taint keys: the effect each.
    pub(super) taints: Vec<String>,
    /// The pods of this namespace: their phase each (and why they wait).
    pub(super) pods: Option<String>,
    /// CSINodes by name: the drivers each lists (what the kubelet, or
    /// `kpm run` for its Node, registered).
    pub(super) csinodes: Vec<String>,
}

/// The watching thread and what it saw; stopped when dropped, and then
/// printed if it never was (a scenario that failed).
pub(super) struct Timeline {
    seen: Arc<Mutex<Vec<Change>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// When it started, the origin of [`print`](Self::print).
    pub(super) origin: SystemTime,
    /// What it is the timeline of, and of its origin.
    title: String,
    printed: AtomicBool,
}

impl Timeline {
    /// Starts watching with `api`, times printed from `origin`; `title`
    /// says what of, and what the origin is.
    pub(super) fn start(api: &Api, follow: Follow, origin: SystemTime, title: &str) -> Self {
        let (seen, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let (api, thread_seen, thread_stop) = (api.clone(), seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut last: Vec<(String, String)> = Vec::new();
            while !thread_stop.load(Ordering::Relaxed) {
                // A read that fails (the API server busy) is tried again.
                if let Ok(now) = look(&api, &follow) {
                    let at = SystemTime::now();
                    let mut seen =
                        thread_seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    for (what, value) in &now {
                        let before = last.iter().find(|(w, _)| w == what).map(|(_, v)| v);
                        if before != Some(value) {
                            seen.push(Change { at, what: what.clone(), value: value.clone() });
                        }
                    }
                    last = now;
                }
                std::thread::sleep(EVERY);
            }
        });
        Self {
            seen,
            stop,
            thread: Some(thread),
            origin,
            title: title.to_owned(),
            printed: AtomicBool::new(false),
        }
    }

    /// Every change so far.
    pub(super) fn changes(&self) -> Vec<Change> {
        self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The value of `what` last seen.
    pub(super) fn current(&self, what: &str) -> Option<String> {
        self.changes().into_iter().rev().find(|c| c.what == what).map(|c| c.value)
    }

    /// When `what` was first seen to `hold` at `after` or later.
    pub(super) fn first(
        &self,
        what: &str,
        after: SystemTime,
        hold: impl Fn(&str) -> bool,
    ) -> Option<SystemTime> {
        // The value in force at `after` counts, seen at `after`, whatever
        // follows it.
        let changes = self.changes();
        let mine: Vec<_> = changes.iter().filter(|c| c.what == what).collect();
        let split = mine.partition_point(|c| c.at <= after);
        if mine[..split].last().is_some_and(|c| hold(&c.value)) {
            return Some(after);
        }
        mine[split..].iter().find(|c| hold(&c.value)).map(|c| c.at)
    }

    /// Waits at most `timeout` until `what` holds `hold`, at `after` or
    /// later; when it first did.
    pub(super) fn wait(
        &self,
        what: &str,
        after: SystemTime,
        timeout: Duration,
        hold: impl Fn(&str) -> bool,
    ) -> Result<SystemTime> {
        wait_for(&format!("{what} as awaited (last: {:?})", self.current(what)), timeout, || {
            Ok(self.first(what, after, &hold))
        })
        .map_err(|err| format!("{err}; last seen: {:?}", self.current(what)).into())
    }

    /// The changes as lines, `+12.3 s  what = value`, from the origin.
    pub(super) fn print(&self) -> String {
        self.printed.store(true, Ordering::Relaxed);
        let mut text = format!("timeline of {} (seconds from the origin):\n", self.title);
        for change in self.changes() {
            let _ = writeln!(
                text,
                "  {:>+7.1} s  {} = {}",
                offset(self.origin, change.at),
                change.what,
                change.value
            );
        }
        text
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if !self.printed.load(Ordering::Relaxed) {
            eprintln!("{}", self.print());
        }
    }
}

/// `at` in seconds from `origin`, negative before it.
pub(super) fn offset(origin: SystemTime, at: SystemTime) -> f64 {
    match at.duration_since(origin) {
        Ok(after) => after.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    }
}

/// What the Node and the pods show now of what `follow` names.
fn look(api: &Api, follow: &Follow) -> Result<Vec<(String, String)>> {
    let node = api.get(&format!("/api/v1/nodes/{NODE_NAME}"))?;
    let mut now = Vec::new();
    for kind in &follow.conditions {
        let condition = node["status"]["conditions"]
            .as_array()
            .and_then(|all| all.iter().find(|c| c["type"] == kind.as_str()));
        let value = condition.map_or_else(
            || "-".to_owned(),
            |c| format!("{}/{}", text(&c["status"]), text(&c["reason"])),
        );
        now.push((format!("condition {kind}"), value));
    }
    for resource in &follow.resources {
        for field in ["capacity", "allocatable"] {
            let count = node["status"][field][resource].as_str().unwrap_or("-");
            now.push((format!("{field} {resource}"), count.to_owned()));
        }
    }
    let taints = node["spec"]["taints"].as_array().cloned().unwrap_or_default();
    for key in &follow.taints {
        let taint = taints.iter().find(|t| t["key"] == key.as_str());
        now.push((
            format!("taint {key}"),
            taint.map_or_else(|| "-".to_owned(), |t| text(&t["effect"])),
        ));
    }
    for name in &follow.csinodes {
        let (code, csinode) =
            api.request("GET", &format!("/apis/storage.k8s.io/v1/csinodes/{name}"), None)?;
        let mut drivers: Vec<String> = csinode["spec"]["drivers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|driver| text(&driver["name"]))
            .collect();
        drivers.sort();
        let listed = if code == 200 { drivers.join(",") } else { "-".to_owned() };
        now.push((format!("csinode {name}"), listed));
    }
    if let Some(namespace) = &follow.pods {
        let pods = api.get(&format!("/api/v1/namespaces/{namespace}/pods"))?;
        for pod in pods["items"].as_array().into_iter().flatten() {
            now.push((format!("pod {}", text(&pod["metadata"]["name"])), pod_state(pod)));
        }
    }
    Ok(now)
}

/// A pod's phase, its node, and its reason when it has one (a failed
/// admission) or a container waits.
fn pod_state(pod: &Value) -> String {
    let mut state = text(&pod["status"]["phase"]);
    if let Some(node) = pod["spec"]["nodeName"].as_str() {
        let _ = write!(state, " on {node}");
    }
    if let Some(reason) = pod["status"]["reason"].as_str() {
        let _ = write!(state, " ({reason})");
    }
    let waiting = pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|c| c["state"]["waiting"]["reason"].as_str());
    if let Some(waiting) = waiting {
        let _ = write!(state, " (waiting: {waiting})");
    }
    state
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}
