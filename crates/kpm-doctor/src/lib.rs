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
//!   plugins against it. The outcome is a [`Report`], with serde, and
//!   [`render_table`] shows it as `kpm doctor` prints it.
//! - It never notifies a plugin, never creates, removes or renames a file,
//!   and holds no connection once a call is done.
//! - [`NodeWatch`] keeps the diagnosis current (`kpm doctor --watch`): it
//!   judges again on every change of the node, and its [`NodePublisher`]
//!   writes the Node condition [`CONDITION_TYPE`] (server-side apply, only
//!   on change and at a heartbeat) and Events on the Node, aggregated and
//!   rate-limited; [`DoctorMetrics`] serve what the last pass found.
//! - For the whole cluster, [`read_fleet`] reads back the condition each
//!   node's doctor publishes, with the CSIDrivers, CSINodes, extended
//!   resources and ResourceSlices, read-only and page by page;
//!   [`judge_fleet`] makes a [`Fleet`] of it: each node's doctor state, and
//!   each driver's nodes (`47/50`) with why it is not on the others;
//!   [`render_fleet_table`] prints it as `kpm doctor --cluster` does.
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

mod checkpoint;
mod cluster;
mod condition;
mod device_plugins;
mod fleet;
mod host;
mod judge;
mod metrics;
pub mod publish;
mod publishing;
mod render;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kpm::{ExecutorConfig, Kubelet, PluginKind};
use serde::Serialize;

pub use crate::condition::{
    CANNOT_JUDGE_REASON, CONDITION_TYPE, ConditionStatus, FIELD_MANAGER, HEALTHY_REASON,
    MAX_MESSAGE_BYTES, PluginsCondition,
};
pub use crate::fleet::{
    DEFAULT_PAGE_SIZE, DEFAULT_REQUEST_TIMEOUT, DEFAULT_STALE_AFTER, DoctorState, DriverKind,
    DriverView, FailingPlugin, Fleet, FleetConfig, FleetError, FleetObjects, NodeCondition,
    NodeObject, NodeView, NotOn, judge_fleet, read_fleet, render_fleet_table,
};
pub use crate::host::{Host, KubeletProcess, NodeNameFrom, ProcessInfo, ReadThrough, Seen, View};
pub use crate::judge::{Row, StepTaken, Verdict, served_by};
pub use crate::metrics::DoctorMetrics;
pub use crate::publish::{NodePublisher, PublishConfig, PublishError, PublishStats};
pub use crate::publishing::PendingReader;
pub use crate::render::render_table;
pub use crate::watch::{ClusterLink, NodeWatch, WatchConfig, WatchError};

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
    #[error("set up the judging kubelet for {}: {source}", root.display())]
    BuildKubelet {
        /// The kubelet root, on the host.
        root: PathBuf,
        /// What the builder refused.
        #[source]
        source: Box<kpm::Error>,
    },
}

/// What a [`Doctor`] judges and how. Build it from [`Default`] with the
/// setters; the fields are public to read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DoctorConfig {
    /// The kubelet's root on the host; `None`: the running kubelet's, else
    /// `/var/lib/kubelet`.
    pub root_dir: Option<PathBuf>,
    /// The name of the node judged, when known (`--node-name`, a
    /// kubeconfig's node): of several kubelets on the host, the one that
    /// is this node is judged. `None`: see [`Doctor`] for the rule.
    pub node_name: Option<String>,
    /// Where this process sees the host. Default: the host's own view.
    pub host: Host,
    /// Other roots whose registries are looked at for sockets no kubelet
    /// watches. Default: [`WELL_KNOWN_ROOTS`].
    pub other_roots: Vec<PathBuf>,
    /// Plugin types the kubelet runs without a handler.
    pub disabled: Vec<PluginKind>,
    /// How long dialing and each call may take (`GetInfo` gets the
    /// kubelet's 1 s). Default [`DEFAULT_TIMEOUT`], 5 s.
    pub timeout: Duration,
}

impl Default for DoctorConfig {
    fn default() -> Self {
        Self {
            root_dir: None,
            node_name: None,
            host: Host::default(),
            other_roots: WELL_KNOWN_ROOTS.iter().map(PathBuf::from).collect(),
            disabled: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl DoctorConfig {
    /// Sets [`root_dir`](Self::root_dir) (default: found).
    #[must_use]
    pub fn root_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root_dir = Some(dir.into());
        self
    }

    /// Sets [`node_name`](Self::node_name) (default: not known).
    #[must_use]
    pub fn node_name(mut self, name: impl Into<String>) -> Self {
        self.node_name = Some(name.into());
        self
    }

    /// Sets [`host`](Self::host) (default: the host's own view).
    #[must_use]
    pub fn host(mut self, host: Host) -> Self {
        self.host = host;
        self
    }

    /// Sets [`other_roots`](Self::other_roots) (default [`WELL_KNOWN_ROOTS`]).
    #[must_use]
    pub fn other_roots(mut self, roots: Vec<PathBuf>) -> Self {
        self.other_roots = roots;
        self
    }

    /// Sets [`disabled`](Self::disabled) (default none).
    #[must_use]
    pub fn disabled(mut self, kinds: Vec<PluginKind>) -> Self {
        self.disabled = kinds;
        self
    }

    /// Sets [`timeout`](Self::timeout) (default [`DEFAULT_TIMEOUT`], 5 s).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// Judges one node's plugins. Set up once (the root found, the judging
/// kubelet built), then [`examine`](Self::examine)d as often as wanted.
///
/// Which kubelet it judges, of those running on the host
/// ([`Report::kubelets`]), is chosen again at every examination, so that a
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
/// When several run, [`Report::choice`] says which was judged and names
/// the others.
#[derive(Debug)]
pub struct Doctor {
    config: DoctorConfig,
    /// The kubelet judged, as last chosen.
    judged: parking_lot::Mutex<Arc<Judged>>,
    /// The `kpm run` of the node, when it is the node's plugin manager.
    kpm_run: Option<PendingReader>,
}

/// The kubelet a pass judges, and the one `kpm run` would run on its root.
#[derive(Debug)]
struct Judged {
    choice: Choice,
    /// The kubelet `kpm run` would run on that root, not running: its
    /// manager's inspection judges the registry's sockets.
    kubelet: Arc<Kubelet>,
}

/// Which kubelet is judged, and how it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Choice {
    /// The kubelet root, as the kubelet sees it.
    root_dir: PathBuf,
    /// How the root was found.
    root_from: String,
    /// The running kubelet judged, when one has that root.
    kubelet: Option<KubeletProcess>,
    /// Where the root is read.
    view: View,
    /// Which was judged among several, the others, and how to pick one.
    note: Option<String>,
}

impl Doctor {
    /// A doctor for the node `config` describes: finds the kubelet's root
    /// unless given.
    pub fn new(config: DoctorConfig) -> Result<Self, DoctorError> {
        let choice = choose(&config, &config.host.kubelets());
        let judged = Judged::new(&config, choice)?;
        Ok(Self { config, judged: parking_lot::Mutex::new(Arc::new(judged)), kpm_run: None })
    }

    /// Reads, at each examination with a cluster, what `kpm run` has not
    /// got to the API server yet: what the cluster lags for that reason is
    /// [`Verdict::Publishing`], not a failure.
    #[must_use]
    pub fn beside_kpm_run(mut self, pending: PendingReader) -> Self {
        self.kpm_run = Some(pending);
        self
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
            // judging kubelet reads them as before.
            let kubelet = Arc::clone(&judged.kubelet);
            *judged = Arc::new(Judged { choice, kubelet });
            return Arc::clone(&judged);
        }
        tracing::info!(
            root = %choice.root_dir.display(),
            from = %choice.root_from,
            "judging another kubelet"
        );
        // Its words name the paths it was given, under the new view.
        let view = choice.view.clone();
        match Judged::new(&self.config, choice) {
            Ok(chosen) => *judged = Arc::new(chosen),
            Err(err) => unseen.push(format!(
                "{}; the kubelet judged before is judged",
                view.as_on_host(&err.to_string())
            )),
        }
        Arc::clone(&judged)
    }

    /// Judges the node now; with `cluster`, what the API server showed of
    /// it, the plugins are held against it too.
    pub async fn examine(&self, cluster: Option<&kpm::kube::NodeObjects>) -> Report {
        let host = &self.config.host;
        let kubelets = host.kubelets();
        let mut unseen = Vec::new();
        let judged = self.judged_now(&kubelets, &mut unseen);
        let choice = &judged.choice;
        let view = &choice.view;
        if let Some(why) = choice.kubelet.as_ref().and_then(KubeletProcess::unreadable) {
            unseen.push(format!(
                "{why}: the kubelet's files are read at their paths on the host, which are its \
                 own only if it shares the host's mount namespace"
            ));
        }
        let root = view.path(&choice.root_dir);
        let registry = root.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME);
        let (mut plugins, mut blind) =
            match judge::registry(&judged.kubelet, host, view, &registry, &mut unseen).await {
                Ok(rows) => (rows, None),
                Err(err) => (
                    Vec::new(),
                    Some(cannot_list_registry(choice, registry.on_host(), &err, &kubelets)),
                ),
            };
        let beside_kubelet_sock =
            device_plugins::judge(&judged.kubelet, host, view, &root, &plugins, &mut unseen).await;
        plugins.extend(beside_kubelet_sock);
        match host.listening_unix_paths(choice.kubelet.as_ref()) {
            Ok(listening) => {
                plugins.extend(judge::deleted(view, &choice.root_dir, &listening));
            }
            Err(table) => unseen.push(format!(
                "{}: cannot be read; deleted sockets not looked for",
                table.display()
            )),
        }
        judge::mark_duplicates(&mut plugins);

        let mut findings = Vec::new();
        if let Some(objects) = cluster {
            let publishing = match &self.kpm_run {
                Some(reader) => reader.read().await,
                None => publishing::Publishing::default(),
            };
            cluster::compare(objects, &publishing, &mut plugins, &mut findings, &mut unseen);
            blind = blind.or_else(|| cluster::unread(objects));
        }
        findings.extend(unwatched_registries(
            view,
            &choice.root_dir,
            &self.config.other_roots,
            &kubelets,
        ));
        Report {
            root_dir: choice.root_dir.clone(),
            root_from: choice.root_from.clone(),
            judged_pid: choice.kubelet.as_ref().map(|kubelet| kubelet.pid),
            choice: choice.note.clone(),
            kubelets,
            node: cluster.map(|objects| objects.node.clone()),
            plugins,
            findings,
            unseen,
            blind,
            ok: false,
        }
        .judged()
    }
}

impl Judged {
    /// The judging kubelet for `choice`.
    fn new(config: &DoctorConfig, choice: Choice) -> Result<Self, DoctorError> {
        // The judging kubelet reads the root where this process sees it as
        // the kubelet does, and reaches the endpoints plugins advertise
        // (paths as the kubelet sees them) under the same prefix.
        let seen = choice.view.path(&choice.root_dir);
        let get_info = ExecutorConfig::default().get_info_timeout;
        let kubelet = judging_kubelet(
            seen.as_ref(),
            &config.disabled,
            config.timeout,
            get_info,
            Some(choice.view.root()),
        )
        .map_err(|source| DoctorError::BuildKubelet {
            root: choice.root_dir.clone(),
            source: Box::new(source),
        })?;
        Ok(Self { choice, kubelet: Arc::new(kubelet) })
    }
}

/// The kubelet `config` asks to judge among `kubelets` (the rule is
/// [`Doctor`]'s), a registry readable when it can be listed.
fn choose(config: &DoctorConfig, kubelets: &[KubeletProcess]) -> Choice {
    choose_among(config, kubelets, |kubelet| {
        let registry = kubelet.root_dir.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME);
        std::fs::read_dir(kubelet.view().path(&registry)).is_ok()
    })
}

/// [`choose`], with `readable` telling whether a kubelet's registry can be
/// listed.
fn choose_among(
    config: &DoctorConfig,
    kubelets: &[KubeletProcess],
    readable: impl Fn(&KubeletProcess) -> bool,
) -> Choice {
    let given = config.root_dir.as_deref();
    let candidates: Vec<&KubeletProcess> = kubelets
        .iter()
        .filter(|kubelet| given.is_none_or(|root| kubelet.root_dir == root))
        .collect();
    let asked = config.node_name.as_deref().map(|name| name.trim().to_lowercase());
    // The node's own kubelet: by what its settings name it, else by its
    // hostname, the name a kubelet without an override takes.
    let of_node = |by_hostname: bool| -> Vec<&KubeletProcess> {
        let Some(asked) = &asked else { return Vec::new() };
        candidates
            .iter()
            .copied()
            .filter(|kubelet| {
                kubelet.node_name.as_ref() == Some(asked)
                    && (kubelet.node_name_from == Some(NodeNameFrom::Hostname)) == by_hostname
            })
            .collect()
    };
    let named = [of_node(false), of_node(true)].into_iter().find(|found| !found.is_empty());
    let pool = named.as_ref().unwrap_or(&candidates);
    let chosen = pool.iter().copied().find(|kubelet| readable(kubelet)).or(pool.first().copied());
    let Some(chosen) = chosen else {
        let (root_dir, root_from) = match given {
            Some(root) => (root.to_path_buf(), "--root-dir".to_owned()),
            None => (PathBuf::from(host::DEFAULT_ROOT), "the default".to_owned()),
        };
        return Choice {
            root_dir,
            root_from,
            kubelet: None,
            view: config.host.view().clone(),
            note: None,
        };
    };
    let others: Vec<String> = kubelets
        .iter()
        .filter(|kubelet| kubelet.pid != chosen.pid)
        .map(KubeletProcess::summary)
        .collect();
    let by_node = named.is_some();
    let unknown_node = match (&asked, by_node) {
        (Some(node), false) => Some(format!("no kubelet on this host is node {node}: ")),
        _ => None,
    };
    let choice_note = (!others.is_empty() || unknown_node.is_some()).then(|| {
        let how = match (&asked, by_node, given.is_some()) {
            (Some(node), true, _) => format!("judged as node {node}"),
            (_, _, true) => "judged as the kubelet with that root".to_owned(),
            _ if readable(chosen) => "judged as the first whose registry can be read".to_owned(),
            _ => "judged as the first (no registry can be read)".to_owned(),
        };
        let mut text = format!("{}{how}: {}", unknown_node.unwrap_or_default(), chosen.summary());
        if !others.is_empty() {
            text.push_str("; other kubelets on this host: ");
            text.push_str(&others.join(", "));
            text.push_str("; pick one with --node-name or --root-dir");
        }
        text
    });
    Choice {
        root_dir: chosen.root_dir.clone(),
        root_from: if given.is_some() { "--root-dir".to_owned() } else { chosen.describe() },
        kubelet: Some(chosen.clone()),
        view: chosen.view().clone(),
        note: choice_note,
    }
}

/// Why a registry that cannot be listed leaves nothing to judge, and where
/// to look instead.
fn cannot_list_registry(
    choice: &Choice,
    registry: &Path,
    err: &std::io::Error,
    kubelets: &[KubeletProcess],
) -> Blind {
    let why = format!("{}: cannot be listed: {err}", registry.display());
    let elsewhere = kubelets.iter().find(|kubelet| kubelet.root_dir != choice.root_dir);
    let hint = match (err.kind(), &choice.kubelet, elsewhere) {
        (std::io::ErrorKind::PermissionDenied, _, _) => {
            "run kpm doctor as the user the kubelet runs as (root)".to_owned()
        }
        (_, Some(kubelet), _) if kubelet.files == ReadThrough::HostFallback => format!(
            "{} runs where its files cannot be read (its /proc/{}/root): run kpm doctor as \
             root, in a pod with hostPID",
            kubelet.describe(),
            kubelet.pid
        ),
        (_, None, Some(kubelet)) => format!(
            "{} has root {}: give that to --root-dir, or leave --root-dir out",
            kubelet.describe(),
            kubelet.root_dir.display()
        ),
        (_, Some(_), _) => "the kubelet creates it when it starts: is it running, and does kpm \
                         doctor see the host's file system (--host-root)?"
            .to_owned(),
        (_, None, None) => "no running kubelet was found to take its root from: pass the \
                      kubelet's --root-dir as --root-dir; in a pod that mounts the host's / \
                      elsewhere, pass --host-root too (kubectl debug node/NAME mounts it at \
                      /host)"
            .to_owned(),
    };
    Blind { why, hint }
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
pub struct Report {
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
    /// The node the cluster was asked about, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
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
}

impl Report {
    /// The failures of the report, rows then findings: its verdict, path
    /// on the host, the plugin's type and name where known, and why. A
    /// finding caused by a failing row ([`cause_of`](Self::cause_of)) is
    /// part of that row's failure, not one of its own, and is left out.
    pub fn failures(&self) -> impl Iterator<Item = Failure<'_>> {
        let rows = self.plugins.iter().filter(|row| row.verdict.fails()).map(|row| Failure {
            verdict: row.verdict,
            path: &row.path,
            plugin_type: row.plugin_type.as_deref(),
            name: row.name.as_deref(),
            reason: &row.reason,
        });
        let findings = self
            .findings_of_their_own()
            .filter(|finding| finding.verdict.fails())
            .map(Finding::failure);
        rows.chain(findings)
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
impl Report {
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
            plugins,
            findings,
            unseen: Vec::new(),
            blind,
            ok: false,
        }
        .judged()
    }
}

/// One failing row or finding of a [`Report`].
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Failure<'a> {
    /// The verdict.
    pub verdict: Verdict,
    /// The socket or object, a path on the host or `csinodes/NAME`.
    pub path: &'a Path,
    /// The plugin's type, when it told.
    pub plugin_type: Option<&'a str>,
    /// The plugin's name, when it told.
    pub name: Option<&'a str>,
    /// Why it fails.
    pub reason: &'a str,
}

impl Failure<'_> {
    /// How a message names the plugin: its name, else its file name.
    pub fn subject(&self) -> String {
        match self.name {
            Some(name) => name.to_owned(),
            None => self.path.file_name().map_or_else(
                || self.path.display().to_string(),
                |name| name.to_string_lossy().into_owned(),
            ),
        }
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
    /// ([`Report::cause_of`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<PathBuf>,
}

impl Finding {
    /// The finding as a [`Failure`]: it names no plugin.
    pub(crate) fn failure(&self) -> Failure<'_> {
        Failure {
            verdict: self.verdict,
            path: &self.path,
            plugin_type: None,
            name: None,
            reason: &self.reason,
        }
    }
}

/// The kubelet `kpm run --root-dir root_dir` would run with `disabled` off,
/// not running, to judge plugins with: `GetInfo` bounded by `get_info`,
/// every other call by `timeout`; under `host_root` (where this process sees
/// the host's `/`), the endpoints plugins advertise are reached there.
pub fn judging_kubelet(
    root_dir: &Path,
    disabled: &[PluginKind],
    timeout: Duration,
    get_info: Duration,
    host_root: Option<&Path>,
) -> Result<Kubelet, kpm::Error> {
    let executor = ExecutorConfig::default()
        .dial_timeout(timeout)
        .get_info_timeout(get_info)
        .handler_timeout(timeout);
    let mut builder = disabled
        .iter()
        .fold(Kubelet::builder().root_dir(root_dir), |builder, kind| builder.disable(*kind))
        .manager(|manager| manager.liveness(None).executor_config(executor))
        .csi_config(kpm::csi::CsiConfig::default().node_get_info_timeout(timeout))
        .device_config(
            kpm::device::DeviceConfig::default().dial_timeout(timeout).call_timeout(timeout),
        )
        .dra_config(kpm::dra::DraConfig::default().call_timeout(timeout));
    if let Some(host_root) = host_root {
        builder = builder.host_root(host_root);
    }
    builder.build()
}

/// Why an inspection failed, as one line: the cause (the handler's or the
/// transport's error, the plugin's status) where the executor's error wraps
/// one, the executor's error otherwise.
pub fn reason(err: &kpm::ExecutorError) -> String {
    match std::error::Error::source(err) {
        Some(cause) => kpm::api::error_chain(cause),
        None => err.to_string(),
    }
}

/// The registries of `roots` (but the one judged) that hold sockets while
/// no running kubelet has that root.
fn unwatched_registries(
    view: &View,
    root_dir: &Path,
    roots: &[PathBuf],
    kubelets: &[KubeletProcess],
) -> Vec<Finding> {
    roots
        .iter()
        .filter(|root| *root != root_dir && kubelets.iter().all(|k| &k.root_dir != *root))
        .filter_map(|root| {
            let registry = root.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME);
            let entries = kpm::registry::survey(view.path(&registry).as_ref()).ok()?;
            let sockets = entries
                .iter()
                .filter(|(_, entry)| matches!(entry, kpm::registry::RegistryEntry::Socket))
                .count();
            (sockets > 0).then(|| Finding {
                name: None,
                verdict: Verdict::UnwatchedRegistry,
                reason: format!(
                    "{sockets} socket(s) in a registry no running kubelet watches (the kubelet's root is {})",
                    root_dir.display()
                ),
                hint: format!(
                    "the plugins' DaemonSets mount {} as the kubelet root: mount {} instead \
                     (node-driver-registrar's --kubelet-registration-path too)",
                    root.display(),
                    root_dir.display()
                ),
                path: registry,
                cause: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::FakeHost;

    /// A host with two kubelets on the default root: pid 10 in the host's
    /// mount namespace, node `node-a`, whose registry is not there; pid 20
    /// in a container (kind), node `kind-worker` by its hostname, whose
    /// registry is there, under its `/proc/20/root` only.
    fn two_kubelets() -> (FakeHost, tempfile::TempDir) {
        let fake = FakeHost::new();
        fake.process(10, &["/usr/bin/kubelet", "--hostname-override=node-a"], None);
        let kind = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(kind.path().join("var/lib/kubelet/plugins_registry")).unwrap();
        std::fs::create_dir_all(kind.path().join("etc")).unwrap();
        std::fs::write(kind.path().join("etc/hostname"), "kind-worker\n").unwrap();
        fake.process(20, &["/usr/bin/kubelet"], Some(kind.path()));
        (fake, kind)
    }

    fn chosen(config: &DoctorConfig) -> Choice {
        choose(config, &config.host.kubelets())
    }

    #[test]
    fn without_a_node_name_the_kubelet_whose_registry_can_be_read_is_judged() {
        let (fake, _kind) = two_kubelets();
        let choice = chosen(&DoctorConfig::default().host(fake.host()));
        assert_eq!(choice.kubelet.as_ref().map(|k| k.pid), Some(20));
        assert_eq!(choice.root_from, "the running kubelet, pid 20");
        assert_eq!(choice.view.root(), fake.at("/proc/20/root"));
        let note = choice.note.unwrap();
        assert!(
            note.starts_with("judged as the first whose registry can be read: pid 20"),
            "{note}"
        );
        assert!(
            note.contains(
                "other kubelets on this host: pid 10 (kubelet) root /var/lib/kubelet node node-a"
            ),
            "{note}"
        );
        assert!(note.ends_with("pick one with --node-name or --root-dir"), "{note}");
    }

    #[test]
    fn with_a_node_name_that_nodes_kubelet_is_judged() {
        let (fake, _kind) = two_kubelets();
        let config = DoctorConfig::default().host(fake.host());
        // By its override, even though its registry cannot be read: it is
        // the node asked about.
        let choice = chosen(&config.clone().node_name("Node-A"));
        assert_eq!(choice.kubelet.as_ref().map(|k| k.pid), Some(10));
        assert_eq!(choice.view.root(), fake.dir.path());
        assert!(choice.note.unwrap().starts_with("judged as node node-a: pid 10"));
        // By its hostname.
        let choice = chosen(&config.clone().node_name("kind-worker"));
        assert_eq!(choice.kubelet.as_ref().map(|k| k.pid), Some(20));
        // No such node here: as without a name, and said.
        let choice = chosen(&config.node_name("elsewhere"));
        assert_eq!(choice.kubelet.as_ref().map(|k| k.pid), Some(20));
        let note = choice.note.unwrap();
        assert!(note.starts_with("no kubelet on this host is node elsewhere: judged as"), "{note}");
    }

    #[test]
    fn a_root_dir_given_is_read_as_the_kubelet_with_that_root_sees_it() {
        let (fake, _kind) = two_kubelets();
        let config = DoctorConfig::default().host(fake.host());
        let choice = chosen(&config.clone().root_dir("/var/lib/kubelet"));
        assert_eq!(
            (choice.root_from.as_str(), choice.kubelet.map(|k| k.pid)),
            ("--root-dir", Some(20))
        );
        // A root no kubelet has: at its path on the host, no other named.
        let choice = chosen(&config.root_dir("/data/kubelet"));
        assert_eq!(choice.kubelet, None);
        assert_eq!(choice.view.root(), fake.dir.path());
        assert_eq!(choice.note, None);
    }

    #[tokio::test]
    async fn a_kubelet_that_restarts_in_a_new_container_is_followed() {
        let (fake, _kind) = two_kubelets();
        let config = DoctorConfig::default().host(fake.host()).node_name("kind-worker");
        let doctor = Doctor::new(config).unwrap();
        assert_eq!(doctor.root().as_ref(), fake.at("/proc/20/root/var/lib/kubelet"));
        // Its container restarted: another pid, another `/`.
        std::fs::remove_dir_all(fake.at("/proc/20")).unwrap();
        let restarted = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(restarted.path().join("var/lib/kubelet/plugins_registry")).unwrap();
        std::fs::create_dir_all(restarted.path().join("etc")).unwrap();
        std::fs::write(restarted.path().join("etc/hostname"), "kind-worker\n").unwrap();
        fake.process(21, &["kubelet"], Some(restarted.path()));
        let report = doctor.examine(None).await;
        assert_eq!(report.judged_pid, Some(21));
        assert_eq!(report.root_from, "the running kubelet, pid 21");
        assert!(report.blind.is_none(), "{:?}", report.blind);
        assert_eq!(doctor.root().as_ref(), fake.at("/proc/21/root/var/lib/kubelet"));
    }

    #[test]
    fn no_kubelet_running_is_the_default_root_on_the_host() {
        let fake = FakeHost::new();
        let choice = chosen(&DoctorConfig::default().host(fake.host()).node_name("n"));
        assert_eq!(
            (choice.root_dir.as_path(), choice.root_from.as_str()),
            (Path::new(host::DEFAULT_ROOT), "the default")
        );
        assert_eq!(choice.note, None);
    }
}
