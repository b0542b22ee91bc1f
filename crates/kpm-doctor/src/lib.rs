//! Why each kubelet plugin of a node is or is not registered, judged
//! read-only beside the real kubelet: the diagnosis of `kpm doctor`, as a
//! library a node agent can embed.
//!
//! - [`Doctor`] finds the kubelet's root (a running kubelet's `--root-dir`,
//!   also inside `MicroK8s`' kubelite or k3s, else the default; of several
//!   kubelets on one host, the one of the node asked about, else the first
//!   whose registry can be read, the others named) and
//!   [`examine`](Doctor::examine)s the node: every entry of its registry and
//!   every socket of `device-plugins/` is judged with the inspection `kpm
//!   run` would register with (the kubelet's rules and its 1 s `GetInfo`),
//!   the process serving it is named, and the sockets still listening whose
//!   file is gone, the kubelet device manager's checkpoint and the
//!   registries of other roots nobody watches are read. Given what the API
//!   server shows of the node ([`kpm::kube::observe_node`]), it holds the
//!   plugins against it. The outcome is a [`Diagnosis`], with serde, and
//!   [`render_table`] shows it as `kpm doctor` prints it.
//! - It never notifies a plugin, never creates, removes or renames a file,
//!   and holds no connection once a call is done.
//! - [`NodeWatch`] keeps the diagnosis current (`kpm doctor --watch`): it
//!   judges again on every change of the node, and its [`NodePublisher`]
//!   writes the Node condition [`CONDITION_TYPE`](kpm_report::CONDITION_TYPE) (server-side apply, only
//!   on change and at a heartbeat) and Events on the Node, aggregated and
//!   rate-limited; [`DoctorMetrics`] serve what the last pass found.
//! - What it publishes is the report crate's: the typed
//!   [`KubeletPluginReport`](kpm_report::KubeletPluginReport), the
//!   [`Verdict`]s and the condition's words (`kpm_report`). The fleet
//!   reader (`kpm-fleet`, `kpm doctor --cluster`) reads them back with the
//!   same types, and depends on nothing of this crate.
//! - [`Host`] is where this process sees the host's file system: `/`, or a
//!   prefix in a pod (`/host`). A kubelet's files are read as that kubelet
//!   sees them, its [`View`]: the host's, or `<host-root>/proc/PID/root`
//!   for one in a mount namespace of its own (kind, k3d, a kubelet in a
//!   container). Reports, conditions, Events and logs always name the paths
//!   as the kubelet does, and a path is resolved under a view's prefix only
//!   to be read (a [`Seen`], which cannot be shown).
//!
//! This crate leaves the choice of the k8s-openapi version feature to the
//! binary, as kube-rs advises.

#![deny(missing_docs)]

mod cause;
mod checkpoint;
mod choice;
mod condition;
mod config;
mod device_plugins;
mod dra_by_minor;
mod found;
mod host;
mod inspections;
mod judge;
mod kubelets;
mod log_lines;
mod metrics;
mod node_objects;
mod pending;
mod pods;
mod publish;
mod remembered;
mod render;
mod standing;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::choice::{Judged, cannot_list_registry, choose};
use crate::found::Found;

use kpm_report::{ConditionStatus, Verdict};

pub use crate::condition::{FIELD_MANAGER, PluginConditionType, PluginsCondition};
pub use crate::config::{ConfigError, DoctorConfig, DoctorConfigBuilder};

/// The ranges of the doctor's settings, each checked once by its config's
/// `build()`; public so that a command line bounds its flags with the same
/// figures.
pub mod bounds {
    pub use kpm::api::config::{Bounds, REQUEST_TIMEOUT};

    pub use crate::config::PERIOD;
    pub use crate::publish::config::RETRY;
    pub use crate::publish::events::{BURST, REFILL};
    pub use crate::watch::{CONFIRM, SETTLE};
}
pub use crate::cause::Cause;
pub use crate::host::{Host, ProcessInfo, Seen, View};
pub use crate::judge::{Row, StepTaken, served_by};
pub use crate::kubelets::{KubeletProcess, NodeNameFrom, ReadThrough};
pub use crate::log_lines::{
    Explained, GRPC_WORDS, KNOWN_LINES, KnownBy, KnownLine, Reading, Subject, Unplaced, explain,
    read_line,
};
pub use crate::metrics::DoctorMetrics;
pub use crate::publish::events;
pub use crate::publish::events::{EventConfig, EventConfigBuilder};
pub use crate::publish::{
    NodePublisher, PublishConfig, PublishConfigBuilder, PublishError, PublishStats, last_report,
};
pub use crate::render::render_table;
pub use crate::watch::{
    ApiLink, FlapConfig, FlapConfigBuilder, NodeWatch, WatchConfig, WatchConfigBuilder, WatchError,
};

/// The roots other distributions give the kubelet, checked for registries
/// that no running kubelet watches (the `DaemonSet` then mounts the wrong one).
pub const WELL_KNOWN_ROOTS: &[&str] =
    &["/var/lib/kubelet", "/var/lib/k0s/kubelet", "/var/snap/microk8s/common/var/lib/kubelet"];

/// How long dialing and each call but `GetInfo` may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a [`Doctor`] could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DoctorError {
    /// The kubelet the plugins are judged with could not be built (a
    /// setting out of range).
    #[error("set up the referee (kpm's kubelet that inspects sockets) for {}: {source}", root.display())]
    BuildReferee {
        /// The kubelet root, on the host.
        root: PathBuf,
        /// What the builder refused.
        #[source]
        source: Box<kpm::Error>,
    },
}

/// Judges one node's plugins. Set up once (the root found, the judging
/// kubelet built), then [`examine`](Self::examine)d as often as wanted.
///
/// Which kubelet it judges, of those running on the host
/// ([`Diagnosis::kubelets`]), is chosen again at every examination, so that a
/// kubelet that restarts (a new pid) or starts late is followed:
/// - with [`DoctorConfig::root_dir`], that root, read as the running
///   kubelet with that root sees it (of several, as below), else at its
///   path on the host;
/// - with [`DoctorConfig::node_name`], the kubelet that is that node: by
///   its `--hostname-override` or its config file's `hostnameOverride`,
///   else by its hostname;
/// - else, or when none is that node, the first (by pid) whose registry
///   can be read, else the first; none running: `/var/lib/kubelet`.
///
/// A kubelet's files are read as it sees them: at their host paths when it
/// shares the host's mount namespace, else through `/proc/PID/root` (kind,
/// k3d, a kubelet in a container); what is shown names them as it does.
/// When several run, [`Diagnosis::choice`] says which was judged and names
/// the others.
#[derive(Debug)]
pub struct Doctor {
    config: DoctorConfig,
    /// The kubelet judged, as last chosen.
    judged: parking_lot::Mutex<Arc<Judged>>,
    /// The plugins seen registered, to tell those a node event lost.
    remembered: parking_lot::Mutex<remembered::Remembered>,
}

impl Doctor {
    /// A doctor for the node `config` describes: finds the kubelet's root
    /// unless given.
    pub fn new(config: DoctorConfig) -> Result<Self, DoctorError> {
        let choice = choose(&config, &config.host.kubelets());
        let judged = Judged::new(&config, choice)?;
        Ok(Self {
            config,
            judged: parking_lot::Mutex::new(Arc::new(judged)),
            remembered: parking_lot::Mutex::default(),
        })
    }

    /// The kubelet root judged, as the kubelet sees it (a path on the host).
    pub fn root_dir(&self) -> PathBuf {
        self.judged.lock().choice.root_dir.clone()
    }

    /// The kubelet root judged, and where it is read.
    pub fn root(&self) -> Seen {
        let judged = Arc::clone(&self.judged.lock());
        judged.choice.view.path(&judged.choice.root_dir)
    }

    /// `path`, a path as the judged kubelet names it, and where this
    /// process reads it.
    pub fn seen(&self, path: &Path) -> Seen {
        self.judged.lock().choice.view.path(path)
    }

    /// What this doctor was set up with.
    pub fn config(&self) -> &DoctorConfig {
        &self.config
    }

    /// The directories whose changes can change a verdict: the registry
    /// (its whole tree) and `device-plugins/` (its sockets and the device
    /// manager's checkpoint).
    pub fn watched_dirs(&self) -> [Seen; 2] {
        let root = self.root();
        [
            root.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME),
            root.join(kpm::api::DEVICE_PLUGINS_DIR_NAME),
        ]
    }

    /// The kubelet to judge now, chosen again among `kubelets`: the one
    /// judged before unless the choice changed (a kubelet restarted, one
    /// started); `unseen` says why a new choice could not be taken.
    fn judged_now(&self, kubelets: &[KubeletProcess], unseen: &mut Vec<String>) -> Arc<Judged> {
        let choice = choose(&self.config, kubelets);
        let mut judged = self.judged.lock();
        if judged.choice == choice {
            return Arc::clone(&judged);
        }
        if judged.choice.root_dir == choice.root_dir && judged.choice.view == choice.view {
            // The same files (another pid, other kubelets beside): the
            // referee reads them as before.
            let referee = Arc::clone(&judged.referee);
            *judged = Arc::new(Judged { choice, referee });
            return Arc::clone(&judged);
        }
        tracing::info!(
            root = %choice.root_dir.display(),
            from = %choice.root_from,
            "judging another kubelet"
        );
        match Judged::new(&self.config, choice) {
            Ok(chosen) => *judged = Arc::new(chosen),
            Err(err) => unseen.push(format!("{err}; the kubelet judged before is judged")),
        }
        Arc::clone(&judged)
    }

    /// Judges the node now; with `objects`, what the API server showed of
    /// it, the plugins are held against it too.
    pub async fn examine(&self, objects: Option<&kpm::kube::NodeObjects>) -> Diagnosis {
        let host = &self.config.host;
        let kubelets = host.kubelets();
        let mut found = Found::default();
        let judged = self.judged_now(&kubelets, &mut found.unseen);
        let choice = &judged.choice;
        let view = &choice.view;
        if let Some(why) = choice.kubelet.as_ref().and_then(KubeletProcess::unreadable) {
            found.unseen.push(format!(
                "{why}: the kubelet's files are read at their paths on the host, which are its \
                 own only if it shares the host's mount namespace"
            ));
        }
        let root = view.path(&choice.root_dir);
        let registry = root.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME);
        let bound = inspection_bound(self.config.timeout);
        // The judged kubelet's version, from its Node: where its minor does
        // otherwise than the referee, the rows say what it does.
        let kubelet_version = objects.and_then(node_objects::kubelet_version).map(str::to_owned);
        let kubelet = kubelet_version.as_deref().and_then(kpm_minors::minor).map(|minor| {
            dra_by_minor::JudgedKubelet {
                minor,
                dra_gate: choice.kubelet.as_ref().map(|kubelet| {
                    kubelet.feature_gates.get(kpm_minors::DRA_GATE).copied().unwrap_or(false)
                }),
            }
        });
        let differs = |row: &mut Row, outcome: &Result<(), kpm::ExecutorError>| {
            if let Some(kubelet) = kubelet {
                dra_by_minor::judge(row, outcome, kubelet);
            }
        };
        match judge::registry(&judged.referee, host, &registry, bound, &differs).await {
            Ok(rows) => found.plugins = rows,
            Err(err) => {
                found.blind =
                    Some(cannot_list_registry(choice, registry.on_host(), &err, &kubelets));
            }
        }
        let checkpoint =
            device_plugins::judge(&judged.referee, host, &root, bound, &mut found).await;
        let own_namespace = choice.kubelet.as_ref().filter(|k| k.files == ReadThrough::ProcRoot);
        match host.listening_unix_sockets(own_namespace.map(|kubelet| kubelet.pid)) {
            Ok(listening) => {
                found.plugins.extend(judge::deleted(host, view, &choice.root_dir, &listening));
            }
            Err(table) => found.unseen.push(format!(
                "{}: cannot be read; deleted sockets not looked for",
                table.display()
            )),
        }
        judge::mark_duplicates(&mut found.plugins);
        // The pods are asked of the judged kubelet's runtime: without a
        // running kubelet there is none to ask.
        let mut runtime = None;
        if let Some(kubelet) = &choice.kubelet {
            let (endpoint, timeout) = (&kubelet.runtime_endpoint, self.config.timeout);
            let on_node = (view, choice.root_dir.as_path());
            runtime = pods::name(&mut found, on_node, endpoint, timeout).await;
        }
        if let Some(objects) = objects {
            let publishing = pending::Publishing::read(&root, self.config.timeout).await;
            node_objects::compare(objects, &publishing, &mut found);
            found.blind = found.blind.or_else(|| node_objects::unread(objects));
        }
        self.judge_by_memory(choice, objects, checkpoint, &mut found);
        found.findings.extend(judge::unwatched_registries(
            view,
            &choice.root_dir,
            &self.config.other_roots,
            &kubelets,
        ));
        Diagnosis {
            kubelet_unchecked: kubelet_version.as_deref().and_then(kpm_report::unchecked_note),
            kubelet_version,
            root_dir: choice.root_dir.clone(),
            root_from: choice.root_from.clone(),
            judged_pid: choice.kubelet.as_ref().map(|kubelet| kubelet.pid),
            choice: choice.note.clone(),
            kubelets,
            node: objects.map(|objects| objects.node.clone()),
            registered: objects.and_then(node_objects::shown),
            plugins: found.plugins,
            findings: found.findings,
            unseen: found.unseen,
            blind: found.blind,
            ok: false,
            runtime,
        }
        .judged()
    }
}

/// Why the doctor could not look where it was asked to: nothing of the
/// report can be read as healthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Blind {
    /// What could not be read, in one line.
    pub why: String,
    /// What to try.
    pub hint: String,
}

/// What the doctor saw on the node.
#[derive(Debug, Serialize)]
#[non_exhaustive]
pub struct Diagnosis {
    /// The kubelet root judged, on the host.
    pub root_dir: PathBuf,
    /// How the root was found: `--root-dir`, `the running kubelet, pid 42`,
    /// `the default`.
    pub root_from: String,
    /// The running kubelet judged, by pid, when the root is one's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judged_pid: Option<u32>,
    /// With several kubelets on the host (or none that is the node asked
    /// about): which was judged and how, the others, and how to pick one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choice: Option<String>,
    /// The kubelets running on this host.
    pub kubelets: Vec<KubeletProcess>,
    /// The node the API server was asked about, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The kubelet's version, as its Node reports it, when the API server
    /// was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_version: Option<String>,
    /// When that version is not one the doctor was checked against
    /// ([`CHECKED_MINORS`](kpm_report::CHECKED_MINORS)): that its verdicts say what the checked
    /// kubelets do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_unchecked: Option<String>,
    /// What the node's API objects show registered
    /// (`CSIPlugin:csi.example.com,…`), when the API server was asked and
    /// each of them read: what the report tells the fleet view.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registered: Option<kpm_report::ShownRegistered>,
    /// One row per registry entry, device-plugin socket and deleted socket.
    pub plugins: Vec<Row>,
    /// Findings about the node rather than one socket.
    pub findings: Vec<Finding>,
    /// What could not be looked at, and why.
    pub unseen: Vec<String>,
    /// Set when the doctor could not look where a kubelet's plugins live
    /// (the registry cannot be listed), or at a part it was asked to hold
    /// them against (the API server, not read at all).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blind: Option<Blind>,
    /// It could look, and no plugin and no finding fails: the condition is
    /// `True`.
    pub ok: bool,
    /// The container runtime as the pass saw it, for the watch's looks.
    #[serde(skip)]
    pub(crate) runtime: Option<pods::RuntimeSeen>,
}

impl Diagnosis {
    /// The failures of the report, rows then findings: its verdict, path
    /// on the host, the plugin's type and name where known, and why. A
    /// finding caused by a failing row ([`cause_of`](Self::cause_of)) is
    /// part of that row's failure, not one of its own, and is left out.
    pub fn failures(&self) -> impl Iterator<Item = Failure<'_>> {
        let findings = self
            .findings_of_their_own()
            .filter(|finding| finding.verdict.fails())
            .map(Finding::failure);
        self.failing_rows().map(Row::failure).chain(findings)
    }

    /// The rows whose verdict fails.
    pub(crate) fn failing_rows(&self) -> impl Iterator<Item = &Row> {
        self.plugins.iter().filter(|row| row.verdict.fails())
    }

    /// The failing row `finding` is part of: the one its
    /// [`cause`](Finding::cause) names, a stale registration socket for
    /// which the kubelet keeps the driver's CSINode entry or ResourceSlices.
    /// One cause is one failure: the finding is shown under that row and
    /// not counted again, though `--watch` writes its Event.
    pub fn cause_of(&self, finding: &Finding) -> Option<&Row> {
        let cause = finding.cause.as_deref()?;
        self.plugins.iter().find(|row| row.path == cause && row.verdict.fails())
    }

    /// The findings no failing row causes ([`cause_of`](Self::cause_of)):
    /// each is a failure of its own.
    pub fn findings_of_their_own(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|finding| self.cause_of(finding).is_none())
    }

    /// The findings `row` causes, as [`cause_of`](Self::cause_of) tells.
    pub fn caused_by<'a>(&'a self, row: &'a Row) -> impl Iterator<Item = &'a Finding> {
        self.findings.iter().filter(move |finding| {
            self.cause_of(finding).is_some_and(|cause| std::ptr::eq(cause, row))
        })
    }

    /// The report with [`ok`](Self::ok) set as the condition `--watch`
    /// publishes says, so that `ok`, `kpm doctor`'s exit status and the
    /// condition cannot disagree.
    fn judged(mut self) -> Self {
        self.ok = PluginsCondition::of(&self).status == ConditionStatus::True;
        self
    }
}

#[cfg(test)]
impl Diagnosis {
    /// A report of `plugins` and `findings` on root `/r`, `ok` as
    /// [`Doctor::examine`] sets it.
    pub(crate) fn of_parts(
        plugins: Vec<Row>,
        findings: Vec<Finding>,
        blind: Option<Blind>,
    ) -> Self {
        Self {
            root_dir: PathBuf::from("/r"),
            root_from: "--root-dir".to_owned(),
            judged_pid: None,
            choice: None,
            kubelets: Vec::new(),
            node: None,
            kubelet_version: None,
            kubelet_unchecked: None,
            registered: None,
            plugins,
            findings,
            unseen: Vec::new(),
            blind,
            ok: false,
            runtime: None,
        }
        .judged()
    }
}

/// One failing row or finding of a [`Diagnosis`].
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Failure<'a> {
    /// The verdict.
    pub verdict: Verdict,
    /// The socket or object, a path on the host or `csinodes/NAME`.
    pub path: &'a Path,
    /// The plugin's kind, when it told one.
    pub kind: Option<kpm::PluginKind>,
    /// The plugin's name, when it told.
    pub name: Option<&'a str>,
    /// Why it fails.
    pub reason: &'a str,
}

impl Failure<'_> {
    /// How a message names the plugin: its name, else its file name.
    pub fn subject(&self) -> String {
        standing::subject(self.name, self.path)
    }
}

/// A finding about the node rather than one socket.
#[derive(Debug, Serialize)]
#[non_exhaustive]
pub struct Finding {
    /// What it is.
    pub verdict: Verdict,
    /// The directory or API object it is about (`csinodes/NAME`).
    pub path: PathBuf,
    /// The driver or resource it is about, when it is about one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What was seen.
    pub reason: String,
    /// What fixes it.
    pub hint: String,
    /// The row that explains it, a path on the host: a stale registration
    /// socket that keeps the kubelet's registration of the driver alive.
    /// The finding is then part of that row's failure
    /// ([`Diagnosis::cause_of`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<PathBuf>,
}

impl Finding {
    /// The finding as a [`Failure`]: it names no plugin.
    pub(crate) fn failure(&self) -> Failure<'_> {
        Failure {
            verdict: self.verdict,
            path: &self.path,
            kind: None,
            name: None,
            reason: &self.reason,
        }
    }
}

/// How long one socket's inspection may take in all: dialing, the
/// handler's calls and notifying it, each bounded by `timeout`, and
/// `GetInfo`'s second, with as much again to spare. A plugin that accepts
/// and never answers is caught by those bounds; this one catches what they
/// miss.
fn inspection_bound(timeout: Duration) -> Duration {
    timeout
        .saturating_mul(3)
        .saturating_add(kpm::ExecutorConfig::default().get_info_timeout)
        .saturating_mul(2)
}
