//! What was registered before the node's last event, and is not again.
//!
//! The field's worst failures come right after a node event: the kubelet
//! restarted, or the node rebooted. A new kubelet removes every socket of
//! `device-plugins/` but its own, so a device plugin that does not register
//! again on the new `kubelet.sock` leaves no socket to judge, and its
//! resource stays at 0 on the Node for good; a registrar stopped at a
//! graceful shutdown removed its socket too. What is no longer on the node
//! cannot fail a look at the node, so the doctor remembers.
//!
//! [`Remembered`] holds each plugin seen registered, by kind and name, with
//! when and by whom: this doctor's own passes, the report it published
//! before (read back at its start, so that its own restart or a reboot
//! loses nothing), and the kubelet's device-manager checkpoint, which
//! outlives the kubelet (a starting kubelet keeps each resource of it,
//! with no device, until its plugin registers again: `readCheckpoint`).
//! A plugin seen registered before the judged kubelet started, and
//! registered by none of the node's sockets now, is
//! [`NotRegisteredAgain`](Verdict::NotRegisteredAgain), with the evidence:
//! the sighting, the kubelet's start, the Node's capacity of its resource,
//! the pods holding its devices and the process still listening on its
//! deleted socket. It is carried so until a plugin registers under that
//! name again.
//!
//! A plugin that went while the kubelet ran is not remembered: the kubelet
//! deregistered it as it went, which is an uninstall as much as a failure,
//! and the rest of the doctor judges what it left. So the doctor's own
//! restart, in a rollout, is no node event: only the kubelet's start time
//! and the node's boot time are.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kpm::PluginKind;
use kpm::kube::NodeResources;
use kpm_report::{KubeletPluginReportStatus, ReportedVerdict, Verdict};

use self::unregistered::{Unregistered, made, unregistered};
use crate::Doctor;
use crate::checkpoint::Checkpoint;
use crate::choice::Choice;
use crate::found::Found;
use crate::host::View;
use crate::judge::{Row, served_by};

mod unregistered;

/// Who saw a plugin registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Witness {
    /// One of this doctor's passes, under the kubelet that started at
    /// `under` (none ran). A kubelet's start is read from /proc to the boot
    /// time's whole second, so a sighting a moment before a restart may
    /// read later than the new kubelet's start; but two readings of one
    /// kubelet are equal, so this says exactly which kubelet it was.
    Pass { under: Option<SystemTime> },
    /// The report this doctor, or the one before it, published.
    Published,
    /// The kubelet's device-manager checkpoint, written by a kubelet that
    /// ran before the one judged.
    Checkpoint,
    /// The judged kubelet itself, which keeps a resource of the checkpoint
    /// it read at its start, with no device, until its plugin registers
    /// again.
    RestoredByKubelet,
}

/// What is known of a plugin registered before.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Trace {
    /// Its socket, a path on the host, when it is known.
    socket: Option<PathBuf>,
    /// When it was last seen registered, and by whom, when that is known:
    /// a plugin a report calls missing says only that.
    seen: Option<(SystemTime, Witness)>,
    /// It was found missing after a node event, and is carried so until
    /// it is back.
    missing: bool,
}

/// The node events a pass is judged after: the judged kubelet's start and
/// the node's boot, by the wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NodeEvents {
    /// When the judged kubelet started; none when none runs.
    pub(crate) kubelet_started: Option<SystemTime>,
    /// When the node booted.
    pub(crate) booted: Option<SystemTime>,
}

/// What a pass has besides its rows to judge the remembered plugins by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Evidence<'a> {
    pub(crate) events: NodeEvents,
    pub(crate) now: SystemTime,
    /// The judged kubelet's view, where its files are read.
    pub(crate) view: &'a View,
    /// The device manager's checkpoint, when it could be read.
    pub(crate) checkpoint: Option<&'a Checkpoint>,
    /// The Node's capacity and allocatable, when it was read.
    pub(crate) node: Option<(&'a str, &'a NodeResources)>,
}

/// The plugins seen registered, by kind and name, and whether the report
/// published before could be read when it was asked for.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Remembered {
    traces: BTreeMap<(PluginKind, String), Trace>,
    /// Why the report published before could not be read, until it is.
    unread: Option<String>,
}

impl Remembered {
    /// Adds what the report published before says at its heartbeat, when
    /// there is one: each plugin found registered then, and each found
    /// missing after an earlier event. What is known already and newer is
    /// kept.
    pub(crate) fn add_report(&mut self, report: Option<&KubeletPluginReportStatus>) {
        self.unread = None;
        let Some(status) = report else { return };
        let Some(Time(heartbeat)) = &status.heartbeat_time else { return };
        let at = SystemTime::from(*heartbeat);
        for entry in &status.plugins {
            let (Some(kind), Some(name)) = (entry.kind, entry.name.clone()) else { continue };
            let (seen, missing) = if entry.verdict == Verdict::NotRegisteredAgain {
                (None, true)
            } else if matches!(entry.verdict, ReportedVerdict::Known(verdict) if verdict.registers())
            {
                (Some((at, Witness::Published)), false)
            } else {
                continue;
            };
            // A row of a plugin remembered without its socket is keyed by
            // its type and name, which is no socket.
            let socket = Some(PathBuf::from(&entry.socket)).filter(|socket| socket.is_absolute());
            let trace = Trace { socket, seen, missing };
            self.keep_newer((kind, name), trace);
        }
    }

    /// Says that the report published before was asked for and could not
    /// be read, `why`: until it is, nothing can be told of what a node
    /// event lost ([`blind`](Self::blind)). A report that is not there is
    /// read: nothing was published to remember.
    pub(crate) fn unread(&mut self, why: String) {
        self.unread = Some(why);
    }

    /// Why the pass cannot be judged, when the report published before was
    /// asked for and could not be read.
    pub(crate) fn blind(&self) -> Option<crate::Blind> {
        self.unread.as_ref().map(|why| crate::Blind {
            why: format!("the doctor's last report of this node could not be read: {why}"),
            hint: "it says which plugins were registered before the kubelet's last start; check \
                   that the API server is reachable and the doctor may get kubeletpluginreports"
                .to_owned(),
        })
    }

    /// Keeps `trace` for `key` unless what is known is newer: a plugin
    /// already missing, or a later sighting. The socket known stays known,
    /// and so does a sighting.
    fn keep_newer(&mut self, key: (PluginKind, String), trace: Trace) {
        let Some(known) = self.traces.get_mut(&key) else {
            self.traces.insert(key, trace);
            return;
        };
        let newer = !known.missing
            && (trace.missing || trace.seen.map(|(at, _)| at) > known.seen.map(|(at, _)| at));
        let socket = trace.socket.clone().or_else(|| known.socket.take());
        // A plugin found missing, whose sighting its report did not keep,
        // takes another witness's.
        let seen = known.seen.or(trace.seen);
        if newer {
            *known = trace;
        } else {
            known.seen = seen;
        }
        known.socket = socket;
    }

    /// The resources the checkpoint shows registered under a kubelet that
    /// ran before the judged one: all of them when the file is older than
    /// the kubelet's start; else those the judged kubelet kept from it with
    /// no device, told from a plugin that stopped since (whose devices the
    /// Node counts, unhealthy) by the Node's capacity of 0 or none.
    fn add_checkpoint(&mut self, evidence: &Evidence<'_>) {
        let (Some(checkpoint), Some(started)) =
            (evidence.checkpoint, evidence.events.kubelet_started)
        else {
            return;
        };
        for (resource, devices) in checkpoint.registered.iter() {
            let seen = match checkpoint.written {
                Some(written) if written < started => (written, Witness::Checkpoint),
                _ if devices.is_empty() && counts_no_device(evidence.node, resource) => {
                    (started, Witness::RestoredByKubelet)
                }
                _ => continue,
            };
            let key = (PluginKind::Device, resource.to_owned());
            if let (Witness::RestoredByKubelet, Some(known)) = (seen.1, self.traces.get_mut(&key)) {
                // Proof that it was registered before this kubelet, whatever
                // the clocks say: a pass that saw it registered a moment
                // before the kubelet's start may read later than that start
                // (taken from /proc, to the boot time's whole second).
                known.seen = Some(seen);
                continue;
            }
            let trace = Trace { socket: None, seen: Some(seen), missing: false };
            self.keep_newer(key, trace);
        }
    }

    /// Judges the remembered plugins against a pass's `rows`: each seen
    /// registered before the judged kubelet started and registered by no
    /// row now is `not-registered-again` (its deleted socket's row, when
    /// that is known, else a row of its own); a DRA driver published before
    /// and not since says so. Then remembers what the pass found
    /// registered, and what it found missing.
    pub(crate) fn judge(&mut self, rows: &mut Vec<Row>, evidence: &Evidence<'_>) {
        self.add_checkpoint(evidence);
        let started = evidence.events.kubelet_started;
        let mut next = Self { traces: BTreeMap::new(), unread: self.unread.take() };
        for (key, trace) in std::mem::take(&mut self.traces) {
            let (kind, name) = (key.0, key.1.as_str());
            let present = rows.iter().position(|row| {
                row.kind == Some(kind)
                    && row.name.as_deref() == Some(name)
                    && row.verdict != Verdict::DeletedButListening
            });
            let lost = trace.missing || trace.seen.is_some_and(|seen| lost_since(seen, started));
            match present {
                // Its socket answers, but no kubelet has it: none runs, or
                // this one has not yet removed the socket it found.
                Some(index) if lost && unregistered(&rows[index], evidence).is_some() => {
                    not_registered_again(rows, Some(index), (kind, name), &trace, evidence);
                    next.traces.insert(key, Trace { missing: true, ..trace });
                }
                Some(index) => {
                    let row = &mut rows[index];
                    if !row.verdict.registers() {
                        if let Some(seen) = trace.seen.filter(|_| lost) {
                            not_published_again(row, seen, evidence);
                        }
                        // Still failing: what was seen before stays known.
                        next.traces.insert(key, trace);
                    }
                }
                // Gone while this kubelet ran: not a node event's.
                None if !lost => {}
                None => {
                    not_registered_again(rows, None, (kind, name), &trace, evidence);
                    next.traces.insert(key, Trace { missing: true, ..trace });
                }
            }
        }
        next.remember_registered(rows, evidence);
        *self = next;
    }

    /// Remembers every plugin `rows` find registered, seen now under the
    /// kubelet the pass judged.
    fn remember_registered(&mut self, rows: &[Row], evidence: &Evidence<'_>) {
        let under = evidence.events.kubelet_started;
        for row in rows.iter().filter(|row| row.verdict.registers()) {
            let (Some(kind), Some(name)) = (row.kind, row.name.clone()) else { continue };
            let socket = (row.found_in != REMEMBERED).then(|| row.path.clone());
            let seen = Some((evidence.now, Witness::Pass { under }));
            self.traces.insert((kind, name), Trace { socket, seen, missing: false });
        }
    }
}

/// Whether a plugin `seen` registered is lost to a node event, the judged
/// kubelet `started` then (none running: `None`): seen by a pass under
/// another kubelet (one that stopped, when none runs), kept by the judged
/// kubelet from its checkpoint (which it read at its start, so the
/// sighting is as old as that), or seen before its start. What was seen
/// with no kubelet running (a host without one) is not judged.
fn lost_since((at, witness): (SystemTime, Witness), started: Option<SystemTime>) -> bool {
    match (witness, started) {
        (Witness::Pass { under: Some(under) }, _) => Some(under) != started,
        (Witness::RestoredByKubelet, Some(_)) => true,
        (_, Some(started)) => at < started,
        (_, None) => false,
    }
}

/// Where a row the doctor makes of a remembered plugin was found.
pub(crate) const REMEMBERED: &str = "remembered";

/// What a row of a plugin remembered without its socket (the checkpoint
/// names a resource, not a socket) is keyed by in place of a path on the
/// host: `DevicePlugin/vendor.com/gpu`, one per plugin.
fn unknown_socket(kind: PluginKind, name: &str) -> PathBuf {
    PathBuf::from(format!("{}/{name}", kind.plugin_type()))
}

/// Whether the Node counts no device of `resource`: a capacity of 0, or
/// none. Unknown without the Node.
fn counts_no_device(node: Option<(&str, &NodeResources)>, resource: &str) -> bool {
    node.is_some_and(|(_, node)| node.capacity.get(resource).is_none_or(|count| count == "0"))
}

/// `2026-11-29T05:00:00Z (3m 2s ago)`.
fn when(at: SystemTime, now: SystemTime) -> String {
    let shown = humantime::format_rfc3339_seconds(at).to_string();
    match now.duration_since(at) {
        Ok(ago) => {
            let ago = std::time::Duration::from_secs(ago.as_secs());
            format!("{shown} ({} ago)", humantime::format_duration(ago))
        }
        Err(_) => shown,
    }
}

/// The node event a plugin seen at `at` was registered before: the boot,
/// when it came after, else the kubelet's start.
fn event_after(at: SystemTime, events: &NodeEvents, now: SystemTime) -> String {
    match (events.booted, events.kubelet_started) {
        (Some(booted), _) if at < booted => format!("the node's boot at {}", when(booted, now)),
        (_, Some(started)) => format!("the kubelet's start at {}", when(started, now)),
        _ => "the kubelet's start".to_owned(),
    }
}

/// Who saw it, in words.
fn witnessed(at: SystemTime, witness: Witness, now: SystemTime) -> String {
    match witness {
        Witness::Pass { .. } => format!("this doctor saw it registered at {}", when(at, now)),
        Witness::Published => {
            format!("this node's last report, at {}, showed it registered", when(at, now))
        }
        Witness::Checkpoint => format!(
            "the kubelet's device-manager checkpoint, written at {}, holds it",
            when(at, now)
        ),
        Witness::RestoredByKubelet => "the kubelet kept it from its checkpoint at its start, with \
                                       no device, waiting for its plugin"
            .to_owned(),
    }
}

/// Marks a live DRA driver with no slice (`not-published`) that was
/// registered as it should be before the node event: its slices were
/// wiped, and it has not published them again.
fn not_published_again(
    row: &mut Row,
    (at, witness): (SystemTime, Witness),
    evidence: &Evidence<'_>,
) {
    if row.verdict != Verdict::NotPublished {
        return;
    }
    let now = evidence.now;
    row.reason = format!(
        "{}; it had published them before {} ({}): they were wiped, and the driver has not \
         published them again",
        row.reason,
        event_after(at, &evidence.events, now),
        witnessed(at, witness, now),
    );
    "a DRA driver must publish its ResourceSlices again when they are deleted (the kubelet wipes \
     a driver's slices at its start until the driver registers again): restart the driver's \
     kubelet plugin, and make it watch its slices (kubernetes-sigs/dra-example-driver#330)"
        .clone_into(&mut row.hint);
}

/// The row of a plugin `trace` says was registered before the node event
/// and no row registers now: `its_row`, the plugin's own row whose socket
/// answers though no kubelet has it, else its deleted socket's row, when
/// the trace knows that socket, else a new one.
fn not_registered_again(
    rows: &mut Vec<Row>,
    its_row: Option<usize>,
    (kind, name): (PluginKind, &str),
    trace: &Trace,
    evidence: &Evidence<'_>,
) {
    let now = evidence.now;
    let socket = trace.socket.as_deref();
    let kubelet_runs = evidence.events.kubelet_started.is_some();
    let mut said = match trace.seen {
        Some((at, witness)) if !kubelet_runs => vec![format!(
            "registered with a kubelet that is not running now ({}): nothing is registered \
             until a kubelet runs again",
            witnessed(at, witness, now)
        )],
        Some((at, witness)) => vec![format!(
            "registered before {} ({}), and not since",
            event_after(at, &evidence.events, now),
            witnessed(at, witness, now)
        )],
        None => vec![
            "registered before a node event this doctor saw, and not since (found missing then)"
                .to_owned(),
        ],
    };
    if kind == PluginKind::Device {
        said.extend(device_evidence(name, evidence));
    }
    let at_socket = its_row
        .or_else(|| socket.and_then(|socket| rows.iter().position(|row| row.path == socket)));
    let index = match at_socket {
        Some(index) if rows[index].name.as_deref().is_none_or(|named| named == name) => {
            if let Some(why) = unregistered(&rows[index], evidence).and_then(Unregistered::said) {
                said.push(why.to_owned());
            }
            index
        }
        _ => {
            let path = socket.map_or_else(|| unknown_socket(kind, name), Path::to_path_buf);
            rows.push(Row::new(Verdict::NotRegisteredAgain, &path, REMEMBERED, String::new()));
            rows.len() - 1
        }
    };
    let row = &mut rows[index];
    if let Some(process) = &row.served_by {
        said.push(format!(
            "its process still listens on its socket, deleted: {}",
            served_by(process)
        ));
    }
    let is_leftover = row.verdict == Verdict::Stale;
    if !is_leftover {
        row.verdict = Verdict::NotRegisteredAgain;
    }
    row.kind = Some(kind);
    row.name = Some(name.to_owned());
    row.reason =
        if is_leftover { format!("{}; {}", row.reason, said.join("; ")) } else { said.join("; ") };
    row.hint = match kind {
        _ if !kubelet_runs => "the kubelet is not running: see its service (systemctl status \
            kubelet) and its log; CSI and DRA drivers are registered again once it runs, device \
            plugins once they call Register on its new kubelet.sock"
            .to_owned(),
        PluginKind::Device => "the device plugin must call Register on the new kubelet.sock: \
            restart its pod (kubectl delete pod) so that it does; a plugin that does not watch \
            device-plugins/ for a new kubelet.sock never comes back by itself, and pods asking \
            for its resource fail admission (UnexpectedAdmissionError) meanwhile"
            .to_owned(),
        PluginKind::Csi | PluginKind::Dra => "its plugin's pod is not serving its registration \
            socket: see the pod (kubectl get pods -o wide on this node) and its logs; it \
            registers again once its socket is back"
            .to_owned(),
    };
}

/// Says of each socket nothing listens on whose file is older than the
/// node's last event (its boot, else the judged kubelet's start) that it is
/// a leftover of that event: its plugin has not served it since (its pod
/// not back yet, or gone). A reboot whose clock /proc cannot show (a node
/// restored from a snapshot, a reboot simulated by stopping every process)
/// is still the kubelet's start.
pub(crate) fn leftovers_of_node_events(rows: &mut [Row], evidence: &Evidence<'_>) {
    let NodeEvents { booted, kubelet_started } = evidence.events;
    for row in rows.iter_mut().filter(|row| row.verdict == Verdict::Stale) {
        let Some(made) = made(&row.path, evidence.view) else { continue };
        let (event, at) = match (booted, kubelet_started) {
            (Some(booted), _) if made < booted => ("the node's boot", booted),
            (_, Some(started)) if made < started => ("the kubelet's start", started),
            _ => continue,
        };
        row.reason = format!(
            "a leftover of {event} at {}: its file is older than that, and no process has served \
             it since; {}",
            when(at, evidence.now),
            row.reason
        );
    }
}

/// What the node shows of a device resource that is not back: the Node's
/// capacity and allocatable of it, and the pod containers holding its
/// devices, as the checkpoint names them.
fn device_evidence(resource: &str, evidence: &Evidence<'_>) -> Vec<String> {
    let mut said = Vec::new();
    if let Some((node, resources)) = evidence.node {
        let capacity = resources.capacity.get(resource).map_or("none", String::as_str);
        let allocatable = resources.allocatable.get(resource).map_or("none", String::as_str);
        said.push(format!(
            "Node {node} counts capacity {capacity}, allocatable {allocatable} of it"
        ));
    }
    if let Some(holders) = evidence.checkpoint.and_then(|c| c.holders.get(resource)) {
        let shown: Vec<&str> = holders.iter().map(String::as_str).collect();
        said.push(format!(
            "pod containers holding its devices (uid/container): {}",
            shown.join(", ")
        ));
    }
    said
}

impl Doctor {
    /// Remembers what the report this node's doctor published before says
    /// was registered at its heartbeat, and what it found missing after a
    /// node event (`None`: there is no such report): a plugin registered
    /// before the judged kubelet started and not since is then
    /// [`Verdict::NotRegisteredAgain`], though the kubelet removed its
    /// socket. A doctor that starts (after a reboot, in a rollout of its
    /// own) reads its last report with [`last_report`](crate::last_report) and gives it here
    /// before it examines the node.
    pub fn remember(&self, report: Option<&kpm_report::KubeletPluginReportStatus>) {
        self.remembered.lock().add_report(report);
    }

    /// Says that the report this node's doctor published before could not
    /// be read, `why`: until [`remember`](Self::remember) is given it, each
    /// examination is blind, since a plugin a node event lost may be
    /// remembered only there.
    pub fn cannot_remember(&self, why: String) {
        self.remembered.lock().unread(why);
    }

    /// Judges what a node event lost: the plugins seen
    /// registered before the judged kubelet's start and registered by no
    /// row `found` now, and the sockets older than the node's boot;
    /// then remembers what is registered. Blind while the report published
    /// before was asked for and could not be read.
    pub(crate) fn judge_by_memory(
        &self,
        choice: &Choice,
        objects: Option<&kpm::kube::NodeObjects>,
        checkpoint: Result<Option<Checkpoint>, String>,
        found: &mut Found,
    ) {
        let Found { plugins, unseen, blind, .. } = found;
        let host = &self.config.host;
        let view = &choice.view;
        let checkpoint = checkpoint.unwrap_or_else(|err| {
            // Said once, should the device plugins' judging have said it.
            if !unseen.contains(&err) {
                unseen.push(err);
            }
            None
        });
        let evidence = Evidence {
            events: NodeEvents {
                kubelet_started: choice.kubelet.as_ref().and_then(|k| host.started_at(k.pid)),
                booted: host.boot_time(),
            },
            now: std::time::SystemTime::now(),
            view,
            checkpoint: checkpoint.as_ref(),
            node: objects.and_then(|objects| {
                let resources = objects.resources.as_ref().ok()?.as_ref()?;
                Some((objects.node.as_str(), resources))
            }),
        };
        leftovers_of_node_events(plugins, &evidence);
        let mut remembered = self.remembered.lock();
        remembered.judge(plugins, &evidence);
        if blind.is_none() {
            *blind = remembered.blind();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use kpm_report::{Counts, Health, KubeletStatus, PluginEntry};

    use super::*;
    use crate::host::ProcessInfo;

    const GPU: &str = "vendor.com/gpu";
    const NULL: &str = "squat.ai/null";

    /// The times of a kubelet restart: a pass before it, the start, a pass after.
    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn row(verdict: Verdict, path: &str, kind: PluginKind, name: Option<&str>) -> Row {
        let mut row = Row::new(verdict, Path::new(path), "device-plugins", "seen".to_owned());
        row.kind = Some(kind);
        row.name = name.map(str::to_owned);
        row
    }

    struct Node {
        view: View,
        events: NodeEvents,
        checkpoint: Option<Checkpoint>,
        resources: Option<NodeResources>,
    }

    impl Node {
        /// A node whose kubelet started at `at(100)`, booted at `at(0)`.
        fn restarted() -> Self {
            Self {
                view: View::at("/"),
                events: NodeEvents { kubelet_started: Some(at(100)), booted: Some(at(0)) },
                checkpoint: None,
                resources: None,
            }
        }

        fn evidence(&self, now: SystemTime) -> Evidence<'_> {
            Evidence {
                events: self.events,
                now,
                view: &self.view,
                checkpoint: self.checkpoint.as_ref(),
                node: self.resources.as_ref().map(|resources| ("node-1", resources)),
            }
        }
    }

    /// A memory of one pass at `at(50)`, before the restart, that saw both
    /// device plugins registered.
    fn before_the_restart() -> Remembered {
        let mut remembered = Remembered::default();
        let mut rows = vec![
            row(Verdict::Ok, "/r/device-plugins/gpu.sock", PluginKind::Device, Some(GPU)),
            row(Verdict::Ok, "/r/device-plugins/null.sock", PluginKind::Device, Some(NULL)),
        ];
        // The kubelet before the restart started at `at(10)`.
        let node = Node {
            events: NodeEvents { kubelet_started: Some(at(10)), booted: Some(at(0)) },
            ..Node::restarted()
        };
        remembered.judge(&mut rows, &node.evidence(at(50)));
        assert!(rows.iter().all(|row| row.verdict == Verdict::Ok));
        remembered
    }

    fn verdicts(rows: &[Row]) -> Vec<(Verdict, Option<&str>, &str)> {
        rows.iter()
            .map(|row| (row.verdict, row.name.as_deref(), row.path.to_str().unwrap()))
            .collect()
    }

    #[test]
    fn a_device_plugin_registered_before_the_kubelets_start_and_not_since_is_not_registered_again()
    {
        let mut remembered = before_the_restart();
        let node = Node::restarted();
        // After the restart: the null plugin registered again on a socket of
        // its own; the gpu plugin still listens on its socket, which the
        // kubelet removed.
        let mut deleted = Row::new(
            Verdict::DeletedButListening,
            Path::new("/r/device-plugins/gpu.sock"),
            "deleted",
            "its file was removed".to_owned(),
        );
        deleted.served_by = Some(ProcessInfo {
            pid: 42,
            command: Some("/usr/bin/gpu-plugin".to_owned()),
            container_id: None,
            running_secs: Some(600),
        });
        let mut rows = vec![
            row(Verdict::Ok, "/r/device-plugins/null-2.sock", PluginKind::Device, Some(NULL)),
            deleted,
        ];
        remembered.judge(&mut rows, &node.evidence(at(160)));
        assert_eq!(
            verdicts(&rows),
            [
                (Verdict::Ok, Some(NULL), "/r/device-plugins/null-2.sock"),
                (Verdict::NotRegisteredAgain, Some(GPU), "/r/device-plugins/gpu.sock"),
            ]
        );
        let reason = &rows[1].reason;
        assert!(reason.starts_with("registered before the kubelet's start at 2027-01-15T08:01:40Z (1m ago) (this doctor saw it registered at 2027-01-15T08:00:50Z (1m 50s ago)), and not since"), "{reason}");
        assert!(
            reason.contains(
                "its process still listens on its socket, deleted: pid 42 gpu-plugin (up 10m)"
            ),
            "{reason}"
        );
        assert!(rows[1].hint.contains("kubelet.sock"), "{}", rows[1].hint);

        // The next pass: its process gone too, nothing of it on the node.
        // It is carried, at its socket, found by memory.
        let mut rows =
            vec![row(Verdict::Ok, "/r/device-plugins/null-2.sock", PluginKind::Device, Some(NULL))];
        remembered.judge(&mut rows, &node.evidence(at(170)));
        assert_eq!(
            verdicts(&rows)[1],
            (Verdict::NotRegisteredAgain, Some(GPU), "/r/device-plugins/gpu.sock")
        );
        assert_eq!(rows[1].found_in, REMEMBERED);
        assert!(rows[1].reason.starts_with("registered before the kubelet's start at 2027-01-15T08:01:40Z (1m 10s ago) (this doctor saw it registered at 2027-01-15T08:00:50Z (2m ago)), and not since"), "every pass says what the first did: {}", rows[1].reason);

        // Back: ok, and no longer remembered as missing.
        let mut rows = vec![
            row(Verdict::Ok, "/r/device-plugins/null-2.sock", PluginKind::Device, Some(NULL)),
            row(Verdict::Ok, "/r/device-plugins/gpu-2.sock", PluginKind::Device, Some(GPU)),
        ];
        remembered.judge(&mut rows, &node.evidence(at(180)));
        assert!(rows.iter().all(|row| row.verdict == Verdict::Ok));

        // Gone again while the same kubelet runs: not a node event's.
        let mut rows =
            vec![row(Verdict::Ok, "/r/device-plugins/null-2.sock", PluginKind::Device, Some(NULL))];
        remembered.judge(&mut rows, &node.evidence(at(190)));
        assert_eq!(rows.len(), 1);
    }

    #[test]
    fn the_checkpoint_of_an_earlier_kubelet_names_its_resources_with_the_node_and_the_pods() {
        let mut node = Node::restarted();
        let mut checkpoint = Checkpoint { written: Some(at(90)), ..Checkpoint::default() };
        checkpoint.registered = crate::checkpoint::tests_support::registered(&[(GPU, &["gpu-0"])]);
        checkpoint.holders.insert(GPU.to_owned(), ["uid-1/app".to_owned()].into());
        node.checkpoint = Some(checkpoint);
        let mut resources = NodeResources::default();
        resources.capacity.insert(GPU.to_owned(), "0".to_owned());
        resources.allocatable.insert(GPU.to_owned(), "0".to_owned());
        node.resources = Some(resources);
        let mut rows = Vec::new();
        Remembered::default().judge(&mut rows, &node.evidence(at(160)));
        assert_eq!(
            verdicts(&rows),
            [(Verdict::NotRegisteredAgain, Some(GPU), "DevicePlugin/vendor.com/gpu")]
        );
        let reason = &rows[0].reason;
        for said in [
            "the kubelet's device-manager checkpoint, written at 2027-01-15T08:01:30Z (1m 10s ago), holds it",
            "Node node-1 counts capacity 0, allocatable 0 of it",
            "pod containers holding its devices (uid/container): uid-1/app",
        ] {
            assert!(reason.contains(said), "{said}: {reason}");
        }
    }

    #[test]
    fn a_later_sighting_keeps_the_socket_an_earlier_one_knew() {
        // Seen at `at(50)` on its socket; the checkpoint, written at
        // `at(90)` by the kubelet before the restart, names its resource only.
        let mut remembered = before_the_restart();
        let mut node = Node::restarted();
        let mut checkpoint = Checkpoint { written: Some(at(90)), ..Checkpoint::default() };
        checkpoint.registered = crate::checkpoint::tests_support::registered(&[(GPU, &["gpu-0"])]);
        node.checkpoint = Some(checkpoint);
        let mut rows =
            vec![row(Verdict::Ok, "/r/device-plugins/null-2.sock", PluginKind::Device, Some(NULL))];
        remembered.judge(&mut rows, &node.evidence(at(160)));
        assert_eq!(
            verdicts(&rows)[1],
            (Verdict::NotRegisteredAgain, Some(GPU), "/r/device-plugins/gpu.sock")
        );
        assert!(
            rows[1].reason.contains("checkpoint, written at 2027-01-15T08:01:30Z"),
            "{}",
            rows[1].reason
        );
        // Carried with what was seen.
        let mut rows = Vec::new();
        remembered.judge(&mut rows, &node.evidence(at(170)));
        assert!(rows[0].reason.contains("checkpoint, written at"), "{}", rows[0].reason);
    }

    #[test]
    fn a_resource_the_kubelet_kept_from_its_checkpoint_is_told_from_one_that_stopped_by_the_node() {
        let mut node = Node::restarted();
        // Written since the kubelet's start, the resource with no device.
        let mut checkpoint = Checkpoint { written: Some(at(120)), ..Checkpoint::default() };
        checkpoint.registered = crate::checkpoint::tests_support::registered(&[(GPU, &[])]);
        node.checkpoint = Some(checkpoint);
        let cases = [
            // Kept by the kubelet: no device counted.
            (Some("0"), 1),
            (None, 1),
            // A plugin that stopped since: its devices counted, unhealthy.
            (Some("2"), 0),
        ];
        for (capacity, expected) in cases {
            let mut resources = NodeResources::default();
            if let Some(capacity) = capacity {
                resources.capacity.insert(GPU.to_owned(), capacity.to_owned());
            }
            node.resources = Some(resources);
            let mut rows = Vec::new();
            Remembered::default().judge(&mut rows, &node.evidence(at(160)));
            assert_eq!(rows.len(), expected, "{capacity:?}");
        }
        // Without the Node it cannot be told: nothing is said.
        node.resources = None;
        let mut rows = Vec::new();
        Remembered::default().judge(&mut rows, &node.evidence(at(160)));
        assert!(rows.is_empty());
    }

    fn report(
        heartbeat: SystemTime,
        entries: &[(&str, PluginKind, &str, Verdict)],
    ) -> KubeletPluginReportStatus {
        let time = |at: SystemTime| Time(k8s_openapi::jiff::Timestamp::try_from(at).unwrap());
        KubeletPluginReportStatus {
            health: Health::Healthy,
            reason: String::new(),
            blind: None,
            kubelet: KubeletStatus::default(),
            counts: Counts::default(),
            plugins: entries
                .iter()
                .map(|(socket, kind, name, verdict)| PluginEntry {
                    socket: (*socket).to_owned(),
                    kind: Some(*kind),
                    name: Some((*name).to_owned()),
                    verdict: (*verdict).into(),
                    reason: String::new(),
                    since: time(heartbeat),
                    pod: None,
                })
                .collect(),
            findings: Vec::new(),
            registered: None,
            heartbeat_time: Some(time(heartbeat)),
            doctor_version: String::new(),
        }
    }

    #[test]
    fn a_plugin_seen_a_moment_after_the_kubelets_start_as_read_is_still_lost_if_the_kubelet_kept_it()
     {
        // The kubelet's start is read to the second: a pass that saw the
        // plugin registered just before the restart can read later.
        let mut remembered = Remembered::default();
        let mut rows =
            vec![row(Verdict::Ok, "/r/device-plugins/gpu.sock", PluginKind::Device, Some(GPU))];
        let mut node = Node::restarted();
        remembered.judge(
            &mut rows,
            &Node { events: NodeEvents::default(), ..Node::restarted() }
                .evidence(at(100) + Duration::from_millis(500)),
        );
        let mut checkpoint = Checkpoint { written: Some(at(101)), ..Checkpoint::default() };
        checkpoint.registered = crate::checkpoint::tests_support::registered(&[(GPU, &[])]);
        node.checkpoint = Some(checkpoint);
        node.resources = Some(NodeResources::default());
        let mut rows = Vec::new();
        remembered.judge(&mut rows, &node.evidence(at(110)));
        assert_eq!(
            verdicts(&rows),
            [(Verdict::NotRegisteredAgain, Some(GPU), "/r/device-plugins/gpu.sock")]
        );
        assert!(
            rows[0].reason.contains("the kubelet kept it from its checkpoint"),
            "{}",
            rows[0].reason
        );
    }

    #[test]
    fn a_plugin_seen_under_the_kubelet_before_is_lost_though_the_sighting_reads_after_the_new_start()
     {
        // The pass saw it registered under the kubelet started at `at(10)`,
        // half a second after the new kubelet's start as /proc reads it
        // (to btime's whole second): the new kubelet removed its socket, it
        // did not register again, and no checkpoint tells of it.
        let mut remembered = Remembered::default();
        let mut rows =
            vec![row(Verdict::Ok, "/r/device-plugins/gpu.sock", PluginKind::Device, Some(GPU))];
        let old = Node {
            events: NodeEvents { kubelet_started: Some(at(10)), booted: Some(at(0)) },
            ..Node::restarted()
        };
        remembered.judge(&mut rows, &old.evidence(at(100) + Duration::from_millis(500)));
        let mut rows = Vec::new();
        remembered.judge(&mut rows, &Node::restarted().evidence(at(101)));
        assert_eq!(
            verdicts(&rows),
            [(Verdict::NotRegisteredAgain, Some(GPU), "/r/device-plugins/gpu.sock")]
        );
    }

    #[test]
    fn the_last_report_remembers_across_the_doctors_own_restart_but_no_rollout_is_a_node_event() {
        let node = Node::restarted();
        let entries = [
            ("/r/plugins_registry/csi-reg.sock", PluginKind::Csi, "csi.example.com", Verdict::Ok),
            ("/r/device-plugins/gpu.sock", PluginKind::Device, GPU, Verdict::NotRegisteredAgain),
        ];
        // Written before the kubelet's start: both were lost by it.
        let mut remembered = Remembered::default();
        remembered.add_report(Some(&report(at(60), &entries)));
        let mut rows = Vec::new();
        remembered.judge(&mut rows, &node.evidence(at(160)));
        assert_eq!(
            verdicts(&rows),
            [
                (
                    Verdict::NotRegisteredAgain,
                    Some("csi.example.com"),
                    "/r/plugins_registry/csi-reg.sock"
                ),
                (Verdict::NotRegisteredAgain, Some(GPU), "/r/device-plugins/gpu.sock"),
            ]
        );
        assert!(rows[0].reason.contains("this node's last report, at 2027-01-15T08:01:00Z (1m 40s ago), showed it registered"), "{}", rows[0].reason);
        assert!(rows[1].reason.contains("found missing then"), "{}", rows[1].reason);

        // A one-shot look beside that report: the checkpoint the kubelet
        // kept at its start dates the plugin the report says is missing.
        let mut checkpoint = Checkpoint { written: Some(at(120)), ..Checkpoint::default() };
        checkpoint.registered = crate::checkpoint::tests_support::registered(&[(GPU, &[])]);
        let mut with_checkpoint = Node::restarted();
        with_checkpoint.checkpoint = Some(checkpoint);
        with_checkpoint.resources = Some(NodeResources::default());
        let mut remembered = Remembered::default();
        remembered.add_report(Some(&report(at(60), &entries)));
        let mut rows = Vec::new();
        remembered.judge(&mut rows, &with_checkpoint.evidence(at(160)));
        assert_eq!(rows[1].verdict, Verdict::NotRegisteredAgain);
        assert!(rows[1].reason.starts_with("registered before the kubelet's start at 2027-01-15T08:01:40Z (1m ago) (the kubelet kept it from its checkpoint at its start"), "{}", rows[1].reason);

        // Written since the kubelet's start (a doctor rolled out): what was
        // registered then and is gone went while this kubelet ran; what was
        // missing still is.
        let mut remembered = Remembered::default();
        remembered.add_report(Some(&report(at(130), &entries)));
        let mut rows = Vec::new();
        remembered.judge(&mut rows, &node.evidence(at(160)));
        assert_eq!(
            verdicts(&rows),
            [(Verdict::NotRegisteredAgain, Some(GPU), "/r/device-plugins/gpu.sock")]
        );
    }

    #[test]
    fn a_dra_driver_published_before_the_restart_and_not_since_says_its_slices_were_wiped() {
        let mut remembered = Remembered::default();
        let entries =
            [("/r/plugins_registry/dra.sock", PluginKind::Dra, "dra.example.com", Verdict::Ok)];
        remembered.add_report(Some(&report(at(60), &entries)));
        let mut rows = vec![row(
            Verdict::NotPublished,
            "/r/plugins_registry/dra.sock",
            PluginKind::Dra,
            Some("dra.example.com"),
        )];
        rows[0].reason =
            "the driver is live, but no ResourceSlice of node node-1 names it".to_owned();
        let node = Node::restarted();
        remembered.judge(&mut rows, &node.evidence(at(160)));
        assert_eq!(rows[0].verdict, Verdict::NotPublished);
        assert!(rows[0].reason.ends_with("it had published them before the kubelet's start at 2027-01-15T08:01:40Z (1m ago) (this node's last report, at 2027-01-15T08:01:00Z (1m 40s ago), showed it registered): they were wiped, and the driver has not published them again"), "{}", rows[0].reason);
        // Still so at the next pass: what was seen before is kept while it fails.
        rows[0].reason = "no slice".to_owned();
        remembered.judge(&mut rows, &node.evidence(at(170)));
        assert!(rows[0].reason.contains("they were wiped"), "{}", rows[0].reason);
    }

    #[test]
    fn a_report_that_could_not_be_read_blinds_until_one_is() {
        let mut remembered = Remembered::default();
        assert_eq!(remembered.blind(), None);
        remembered.unread("connection refused".to_owned());
        let blind = remembered.blind().unwrap();
        assert_eq!(
            blind.why,
            "the doctor's last report of this node could not be read: connection refused"
        );
        // Passes, with a kubelet running or not, do not make it read.
        for started in [None, Some(at(100))] {
            let node = Node {
                events: NodeEvents { kubelet_started: started, booted: Some(at(0)) },
                ..Node::restarted()
            };
            remembered.judge(&mut Vec::new(), &node.evidence(at(160)));
            assert!(remembered.blind().is_some(), "{started:?}");
        }
        remembered.add_report(None);
        assert_eq!(remembered.blind(), None);
    }

    #[test]
    fn while_the_kubelet_it_judged_is_stopped_nothing_it_had_is_registered() {
        let mut remembered = before_the_restart();
        let stopped = Node {
            events: NodeEvents { kubelet_started: None, booted: Some(at(0)) },
            ..Node::restarted()
        };
        // The gpu plugin's socket still answers: no kubelet has it.
        let mut rows =
            vec![row(Verdict::Ok, "/r/device-plugins/gpu.sock", PluginKind::Device, Some(GPU))];
        remembered.judge(&mut rows, &stopped.evidence(at(60)));
        assert_eq!(
            verdicts(&rows),
            [
                (Verdict::NotRegisteredAgain, Some(GPU), "/r/device-plugins/gpu.sock"),
                (Verdict::NotRegisteredAgain, Some(NULL), "/r/device-plugins/null.sock"),
            ]
        );
        assert!(
            rows[0].reason.starts_with("registered with a kubelet that is not running now (this doctor saw it registered at 2027-01-15T08:00:50Z (10s ago))"),
            "{}",
            rows[0].reason
        );
        assert!(rows[0].hint.starts_with("the kubelet is not running"), "{}", rows[0].hint);

        // A kubelet again: still lost until each registers with it.
        let mut rows = Vec::new();
        remembered.judge(&mut rows, &Node::restarted().evidence(at(170)));
        assert_eq!(rows.len(), 2);
    }

    #[test]
    fn on_a_host_with_no_kubelet_what_its_passes_saw_is_not_judged() {
        let no_kubelet = Node {
            events: NodeEvents { kubelet_started: None, booted: Some(at(0)) },
            ..Node::restarted()
        };
        let mut remembered = Remembered::default();
        let mut rows =
            vec![row(Verdict::Ok, "/r/device-plugins/gpu.sock", PluginKind::Device, Some(GPU))];
        remembered.judge(&mut rows, &no_kubelet.evidence(at(50)));
        let mut rows =
            vec![row(Verdict::Ok, "/r/device-plugins/gpu.sock", PluginKind::Device, Some(GPU))];
        remembered.judge(&mut rows, &no_kubelet.evidence(at(60)));
        assert_eq!(verdicts(&rows), [(Verdict::Ok, Some(GPU), "/r/device-plugins/gpu.sock")]);
        let mut rows = Vec::new();
        remembered.judge(&mut rows, &no_kubelet.evidence(at(70)));
        assert!(rows.is_empty());
    }

    #[test]
    fn a_device_plugins_socket_older_than_the_kubelets_start_is_not_registered_with_it() {
        // The new kubelet has not yet removed the sockets of before its
        // start; the gpu plugin's still answers, the null plugin's is new.
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("gpu.sock"), dir.path().join("null-2.sock"));
        for (path, made) in [(&old, at(20)), (&new, at(101))] {
            std::fs::write(path, "").unwrap();
            std::fs::File::options().write(true).open(path).unwrap().set_modified(made).unwrap();
        }
        let mut remembered = Remembered::default();
        let mut rows = vec![
            row(Verdict::Ok, old.to_str().unwrap(), PluginKind::Device, Some(GPU)),
            row(
                Verdict::Ok,
                dir.path().join("null.sock").to_str().unwrap(),
                PluginKind::Device,
                Some(NULL),
            ),
        ];
        let old_kubelet = Node {
            events: NodeEvents { kubelet_started: Some(at(10)), booted: Some(at(0)) },
            ..Node::restarted()
        };
        remembered.judge(&mut rows, &old_kubelet.evidence(at(50)));
        let fresh = || {
            vec![
                row(Verdict::Ok, old.to_str().unwrap(), PluginKind::Device, Some(GPU)),
                row(Verdict::Ok, new.to_str().unwrap(), PluginKind::Device, Some(NULL)),
            ]
        };
        let mut rows = fresh();
        remembered.judge(&mut rows, &Node::restarted().evidence(at(102)));
        let verdicts = |rows: &[Row]| -> Vec<(Verdict, Option<String>)> {
            rows.iter().map(|row| (row.verdict, row.name.clone())).collect()
        };
        let (gpu, null) = (Some(GPU.to_owned()), Some(NULL.to_owned()));
        // The null plugin's socket is a second old: the kubelet may not
        // have registered it yet.
        assert_eq!(
            verdicts(&rows),
            [
                (Verdict::NotRegisteredAgain, gpu.clone()),
                (Verdict::NotRegisteredAgain, null.clone())
            ]
        );
        assert!(rows[0].reason.contains("older than the kubelet's start"), "{}", rows[0].reason);
        assert!(rows[1].reason.contains("made less than 2s ago"), "{}", rows[1].reason);
        let mut rows = fresh();
        remembered.judge(&mut rows, &Node::restarted().evidence(at(104)));
        assert_eq!(verdicts(&rows), [(Verdict::NotRegisteredAgain, gpu), (Verdict::Ok, null)]);
    }

    #[test]
    fn a_stale_socket_older_than_the_boot_or_the_kubelets_start_is_a_leftover_of_it() {
        let dir = tempfile::tempdir().unwrap();
        // Made before the boot at `at(0)`, before the kubelet's start at
        // `at(100)`, and after it.
        let made = [at(0) - Duration::from_secs(5), at(5), at(120)];
        let mut rows = Vec::new();
        for (i, made) in made.into_iter().enumerate() {
            let path = dir.path().join(format!("{i}-reg.sock"));
            std::fs::write(&path, "").unwrap();
            std::fs::File::options().write(true).open(&path).unwrap().set_modified(made).unwrap();
            rows.push(Row::new(Verdict::Stale, &path, "registry", "nothing listens".to_owned()));
        }
        let node = Node::restarted();
        leftovers_of_node_events(&mut rows, &node.evidence(at(160)));
        let reasons: Vec<&str> = rows.iter().map(|row| row.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "a leftover of the node's boot at 2027-01-15T08:00:00Z (2m 40s ago): its file is older than that, and no process has served it since; nothing listens",
                "a leftover of the kubelet's start at 2027-01-15T08:01:40Z (1m ago): its file is older than that, and no process has served it since; nothing listens",
                "nothing listens",
            ]
        );
    }
}
