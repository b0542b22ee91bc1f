//! `kpm doctor --watch`: the node's diagnosis kept current, and published.
//!
//! [`NodeWatch::run`] judges the node again
//! - right after a change in the registry (its whole tree), in
//!   `device-plugins/` (its sockets, the device manager's checkpoint) or in
//!   the root that holds them, seen through inotify;
//! - right after a process serving one of the node's sockets exits (a
//!   pidfd for each), since a crashed plugin leaves its socket behind and
//!   the file system says nothing; and right after the judged kubelet
//!   exits, when what it had is registered no more;
//! - right after a socket found ok does not answer a PING on a
//!   connection of its own, sent every [`WatchConfig::look`] (30 s): a
//!   plugin alive but hung is named within a minute ([`looks`]);
//! - every [`WatchConfig::period`] (5 min), which also catches what
//!   changed in the cluster alone; while something
//!   fails, sooner: [`WatchConfig::confirm`] after a change of the
//!   failures, a second after a file-system change, then twice as long
//!   each time nothing changed, up to the period.
//!
//! A new failure (a socket that fails, or fails otherwise), and a node the
//! doctor cannot judge, is published only once a second pass,
//! [`WatchConfig::confirm`] (3 s) later, agrees: a plugin that restarts, or
//! a driver the kubelet registers a second after its socket appears, makes
//! no Event. What the kubelet clears by itself after a grace (a gone DRA
//! driver's ResourceSlices, wiped 30 s later) is held back until that
//! grace is over ([`graces`]). Recoveries are published at once. Then the condition is set,
//! by the builder a single `kpm doctor` is judged with
//! ([`PluginsCondition::of`](crate::PluginsCondition::of)), and one Event
//! goes out per plugin that entered a failing verdict (`Warning`, the
//! verdict's reason) or left it (`Normal`, `PluginRecovered`); a finding
//! caused by a failing row has its own Event, though the condition counts
//! it with that row. A node the doctor cannot judge is `Unknown`, with a
//! `Warning` `CannotJudge` when it goes blind and a `Normal` `CanJudge`
//! when it sees again; a blind pass calls nothing recovered. Between
//! changes nothing is written but the publisher's heartbeat.
//!
//! It keeps every guarantee of [`Doctor::examine`]: it notifies no plugin,
//! changes no file and holds no connection once a call is done (a pidfd is
//! no connection).

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use kpm::ExponentialBackoff;

use kpm::api::config::Bounds;

use crate::config::PERIOD;
use crate::metrics::DoctorMetrics;
use crate::publish::{EventType, NodePublisher};
use crate::standing::Standing;
use crate::{ConfigError, Diagnosis, Doctor, Seen};

mod flaps;
mod graces;
mod looks;
mod pacing;
#[cfg(test)]
mod tests;

pub use self::flaps::{FlapConfig, FlapConfigBuilder};
use self::looks::Looks;
use self::pacing::{Pacing, Ran};

/// The first wait before a failing node is judged again, doubled each time
/// nothing changed.
const RECHECK: Duration = Duration::from_secs(1);

/// The default [`WatchConfig::period`].
const DEFAULT_PERIOD: Duration = Duration::from_secs(5 * 60);

/// The range of [`WatchConfig::confirm`]: none to a minute.
pub const CONFIRM: Bounds<Duration> =
    Bounds::new(Duration::ZERO, Duration::from_secs(60), "between 0s and 1m");

/// The range of [`WatchConfig::settle`]: none to 10 s.
pub const SETTLE: Bounds<Duration> =
    Bounds::new(Duration::ZERO, Duration::from_secs(10), "between 0s and 10s");

/// The rechecks of a failing node under the default period: kpm's one
/// backoff, from [`RECHECK`] doubling up to the period.
// Unchecked, as a constant is made: config.rs's
// `the_defaults_are_what_their_builders_build` checks it.
const DEFAULT_RECHECKS: ExponentialBackoff =
    ExponentialBackoff::new_unchecked(RECHECK, DEFAULT_PERIOD, 2, 0);

/// When a node's doctor judges it again. [`Default`], else made by
/// [`builder`](Self::builder), whose [`build`](WatchConfigBuilder::build)
/// checks each field once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatchConfig {
    period: Duration,
    confirm: Duration,
    settle: Duration,
    flaps: FlapConfig,
    /// The waits before a failing node is judged again while nothing
    /// changes: from [`RECHECK`], doubling, up to the period.
    rechecks: ExponentialBackoff,
    /// How often, between passes, each socket found ok is sent a PING on a
    /// connection of its own; `None`: never.
    look: Option<Duration>,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            period: DEFAULT_PERIOD,
            confirm: Duration::from_secs(3),
            settle: Duration::from_millis(200),
            flaps: FlapConfig::default(),
            rechecks: DEFAULT_RECHECKS,
            look: Some(Duration::from_secs(30)),
        }
    }
}

impl WatchConfig {
    /// A builder from the defaults.
    pub fn builder() -> WatchConfigBuilder {
        WatchConfigBuilder(Self::default())
    }

    /// A full pass at least this often: 1 s (a zero period would judge
    /// without pause) to a day. Default 5 min.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// How long after a pass that saw the failures change a second pass
    /// checks them before they are published: 0 (at once) to 1 min.
    /// Default 3 s.
    pub fn confirm(&self) -> Duration {
        self.confirm
    }

    /// How long after a file-system change the pass waits, so that a burst
    /// of changes makes one pass: 0 to 10 s. Default 200 ms.
    pub fn settle(&self) -> Duration {
        self.settle
    }

    /// When a plugin that comes and goes is flapping, and for how long.
    pub fn flaps(&self) -> FlapConfig {
        self.flaps
    }

    /// How often, between passes, each socket found ok is sent a PING on a
    /// connection of its own: a plugin alive but
    /// hung is judged within this and the doctor's timeout, not the period.
    /// `None`: never. 1 s to a day; default 30 s.
    pub fn look(&self) -> Option<Duration> {
        self.look
    }
}

/// A [`WatchConfig`] being set; [`build`](Self::build) checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchConfigBuilder(WatchConfig);

impl WatchConfigBuilder {
    /// Sets [`WatchConfig::period`] (default 5 min).
    #[must_use]
    pub fn period(mut self, period: Duration) -> Self {
        self.0.period = period;
        self
    }

    /// Sets [`WatchConfig::confirm`] (default 3 s).
    #[must_use]
    pub fn confirm(mut self, confirm: Duration) -> Self {
        self.0.confirm = confirm;
        self
    }

    /// Sets [`WatchConfig::settle`] (default 200 ms).
    #[must_use]
    pub fn settle(mut self, settle: Duration) -> Self {
        self.0.settle = settle;
        self
    }

    /// Sets [`WatchConfig::look`] (default 30 s; `None`: no looks).
    #[must_use]
    pub fn look(mut self, look: Option<Duration>) -> Self {
        self.0.look = look;
        self
    }

    /// Sets [`WatchConfig::flaps`] (default [`FlapConfig::default`]),
    /// checked when it was made.
    #[must_use]
    pub fn flaps(mut self, flaps: FlapConfig) -> Self {
        self.0.flaps = flaps;
        self
    }

    /// The config, once each field is in its range; the error names the
    /// first that is not.
    pub fn build(self) -> Result<WatchConfig, ConfigError> {
        let WatchConfig { period, confirm, settle, flaps, look, .. } = self.0;
        let period = PERIOD.check("watch.period", period)?;
        let confirm = CONFIRM.check("watch.confirm", confirm)?;
        let settle = SETTLE.check("watch.settle", settle)?;
        let rechecks = ExponentialBackoff::try_new(RECHECK, period)
            .map_err(|source| ConfigError::Backoff { field: "watch.period", source })?;
        let look = look.map(|look| PERIOD.check("watch.look", look)).transpose()?;
        Ok(WatchConfig { period, confirm, settle, flaps, rechecks, look })
    }
}

/// Where a node's doctor reads its Node's API objects and publishes.
pub struct ApiLink {
    client: kube::Client,
    node: String,
    request_timeout: Duration,
    publisher: NodePublisher,
    /// The report published before has been read, and given to the doctor
    /// to remember ([`Doctor::remember`]).
    recalled: bool,
    /// The doctor's own pod, `namespace/name`, when it runs in one: at its
    /// stop, whether it is being replaced.
    own_pod: Option<(String, String)>,
}

impl std::fmt::Debug for ApiLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiLink")
            .field("node", &self.node)
            .field("request_timeout", &self.request_timeout)
            .field("publisher", &self.publisher)
            .finish_non_exhaustive()
    }
}

impl ApiLink {
    /// Reads Node `node` and its objects through `client` and publishes
    /// through `publisher`; each read is bounded by the publisher's
    /// [`PublishConfig::request_timeout`](crate::PublishConfig::request_timeout),
    /// checked when its config was built.
    pub fn new(client: kube::Client, node: impl Into<String>, publisher: NodePublisher) -> Self {
        let request_timeout = publisher.config().request_timeout();
        Self {
            client,
            node: node.into(),
            request_timeout,
            publisher,
            recalled: false,
            own_pod: None,
        }
    }

    /// Names the pod the doctor runs in. When the doctor stops, a pod being
    /// deleted (a rollout, `kubectl delete`) is a doctor being replaced,
    /// which leaves its conditions to the next one; a pod that is not (the
    /// node shutting down, its processes killed) leaves them `Unknown`.
    /// Without it, every stop leaves them `Unknown`.
    #[must_use]
    pub fn own_pod(mut self, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        self.own_pod = Some((namespace.into(), name.into()));
        self
    }

    /// Why the doctor stops, when its conditions must not outlive it: not
    /// when its own pod is being deleted (another doctor replaces it), nor
    /// when that cannot be told because the API server does not answer
    /// (nothing could be written either).
    async fn stopping_for_good(&self) -> Option<String> {
        let Some((namespace, name)) = &self.own_pod else {
            return Some("it was told to".to_owned());
        };
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(self.client.clone(), namespace);
        let read = tokio::time::timeout(self.request_timeout, pods.get_opt(name)).await;
        match read {
            Ok(Ok(Some(pod))) if pod.metadata.deletion_timestamp.is_none() => Some(format!(
                "its pod {namespace}/{name} was stopped without being deleted: the node is going down"
            )),
            Ok(Ok(_)) => {
                info!(pod = %name, "the doctor's pod is being deleted: its conditions are left to the doctor that replaces it");
                None
            }
            Ok(Err(err)) => {
                warn!(pod = %name, error = %kpm::api::error_chain(&err), "cannot read the doctor's own pod at its stop: its conditions are left as they are");
                None
            }
            Err(_) => None,
        }
    }
}

/// A node's doctor, judging it as it changes.
#[derive(Debug)]
pub struct NodeWatch {
    doctor: Doctor,
    api: Option<ApiLink>,
    config: WatchConfig,
    metrics: DoctorMetrics,
}

/// Why watching could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WatchError {
    /// The inotify watcher could not be created.
    #[error("watch the kubelet root for changes: {0}")]
    Inotify(#[source] notify::Error),
}

impl NodeWatch {
    /// Watches the node `doctor` judges; with `api`, compares with what the
    /// API server shows of the node and publishes there; each pass feeds `metrics`.
    pub fn new(
        doctor: Doctor,
        api: Option<ApiLink>,
        config: WatchConfig,
        metrics: DoctorMetrics,
    ) -> Self {
        if let Some(link) = &api {
            metrics.publisher(link.publisher.stats());
        }
        Self { doctor, api, config, metrics }
    }

    /// Judges and publishes until `shutdown` completes.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), WatchError> {
        let (wake_up, mut wake_ups) = mpsc::channel::<()>(1);
        let on_change = wake_up.clone();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                // Opening and reading (the doctor's own) change nothing.
                if event.is_ok_and(|event| !matches!(event.kind, EventKind::Access(_))) {
                    let _ = on_change.try_send(());
                }
            })
            .map_err(WatchError::Inotify)?;
        let mut armed = Armed::default();
        let mut exits = Exits::new(wake_up);
        let mut pacing = Pacing::new(self.config);
        let mut looks = Looks::new(self.doctor.config().timeout());
        let mut ran = Ran::Due;
        tokio::pin!(shutdown);
        loop {
            self.recall().await;
            let report = self.pass().await;
            armed.arm(&mut watcher, &self.doctor);
            exits.follow(&report);
            looks.follow(&report, &self.doctor);
            let next = pacing.after_pass(&Standing::of(&report), ran);
            if let Some((standing, before)) = next.publish {
                self.publish(&standing, &before);
            }
            self.sync().await;
            let judge_at = next.judge_at;
            let mut look_at =
                self.config.look.filter(|_| looks.any()).map(|look| Instant::now() + look);
            // Until the next reason to judge, the publisher's own work, and
            // the looks.
            ran = loop {
                let due = self.api.as_ref().and_then(|link| link.publisher.next_due());
                let next = [due, look_at].into_iter().flatten().fold(judge_at, Instant::min);
                tokio::select! {
                    () = &mut shutdown => {
                        self.stop().await;
                        return Ok(());
                    }
                    Some(()) = wake_ups.recv() => {
                        tokio::time::sleep(self.config.settle).await;
                        while wake_ups.try_recv().is_ok() {}
                        break Ran::WokenUp;
                    }
                    () = tokio::time::sleep_until(next) => {
                        let now = Instant::now();
                        if now >= judge_at {
                            break Ran::Due;
                        }
                        if look_at.is_some_and(|at| now >= at) {
                            if !looks.all_answer().await {
                                debug!("a look found the node changed: judging now");
                                break Ran::WokenUp;
                            }
                            look_at = self.config.look.map(|look| Instant::now() + look);
                        }
                        self.sync().await;
                    }
                }
            };
        }
    }

    /// At the doctor's stop: its conditions `Unknown`, unless another
    /// doctor replaces it ([`ApiLink::own_pod`]).
    async fn stop(&mut self) {
        let Some(link) = &mut self.api else { return };
        if let Some(why) = link.stopping_for_good().await {
            info!(%why, "the doctor stops: its conditions are left Unknown");
            link.publisher.stop(&why).await;
        }
    }

    async fn sync(&mut self) {
        if let Some(link) = &mut self.api {
            link.publisher.sync().await;
        }
    }

    /// Reads the report published before, until it is read once: what
    /// was registered before a node event (the kubelet's start, a reboot)
    /// is remembered there. Until then, passes are blind.
    async fn recall(&mut self) {
        let Some(link) = self.api.as_mut().filter(|link| !link.recalled) else { return };
        match crate::last_report(link.client.clone(), &link.node, link.request_timeout).await {
            Ok(report) => {
                self.doctor.remember(report.as_ref());
                link.recalled = true;
            }
            Err(err) => self.doctor.cannot_remember(kpm::api::error_chain(&err)),
        }
    }

    /// One pass: the API server's view of the node, then the node.
    async fn pass(&self) -> Diagnosis {
        let objects = match &self.api {
            Some(link) => {
                let config = kpm::kube::KubeConfig::default().request_timeout(link.request_timeout);
                Some(kpm::kube::observe_node(link.client.clone(), &link.node, config).await)
            }
            None => None,
        };
        let report = self.doctor.examine(objects.as_ref()).await;
        self.metrics.observe(&report);
        debug!(entries = report.plugins.len(), ok = report.ok, "node judged");
        report
    }

    /// Sets the condition `standing` comes to, and the Events from `before`.
    fn publish(&mut self, standing: &Standing, before: &Standing) {
        let transitions = crate::publish::events::transitions(standing, before);
        for occurrence in &transitions {
            match occurrence.event_type {
                EventType::Warning => {
                    warn!(about = %occurrence.about, reason = %occurrence.reason, "{}", occurrence.note);
                }
                EventType::Normal => {
                    info!(about = %occurrence.about, reason = %occurrence.reason, "{}", occurrence.note);
                }
            }
        }
        let Some(link) = &mut self.api else { return };
        link.publisher.set(standing);
        for occurrence in transitions {
            link.publisher.record(occurrence);
        }
    }
}

/// The directories inotify watches, armed as they appear.
#[derive(Debug, Default)]
struct Armed(Vec<Seen>);

impl Armed {
    /// Watches the registry's tree, `device-plugins/` and the root that
    /// holds them (to see either appear), those that exist and are not
    /// watched yet.
    fn arm(&mut self, watcher: &mut RecommendedWatcher, doctor: &Doctor) {
        let [registry, device_plugins] = doctor.watched_dirs();
        let root = doctor.root();
        let wanted = [
            (registry, RecursiveMode::Recursive),
            (device_plugins, RecursiveMode::NonRecursive),
            (root, RecursiveMode::NonRecursive),
        ];
        for (dir, mode) in wanted {
            if self.0.contains(&dir) || !dir.as_ref().is_dir() {
                continue;
            }
            match watcher.watch(dir.as_ref(), mode) {
                Ok(()) => self.0.push(dir),
                Err(err) => {
                    debug!(dir = %dir.on_host().display(), error = %err, "cannot watch yet");
                }
            }
        }
    }
}

/// A pidfd wait per process serving a socket of the node, and for the
/// judged kubelet: an exit wakes the loop. The kubelet's, so that what it
/// had is called lost as it stops, before a new one posts its Node's
/// status.
#[derive(Debug)]
struct Exits {
    wake: mpsc::Sender<()>,
    waiting: HashMap<u32, AbortHandle>,
}

impl Exits {
    fn new(wake: mpsc::Sender<()>) -> Self {
        Self { wake, waiting: HashMap::new() }
    }

    /// Waits for the exits of the processes `report` names, and no others.
    fn follow(&mut self, report: &Diagnosis) {
        let serving: Vec<u32> = report
            .plugins
            .iter()
            .filter_map(|row| row.served_by.as_ref())
            .map(|p| p.pid)
            .chain(report.judged_pid)
            .collect();
        self.waiting.retain(|pid, task| {
            let keep = serving.contains(pid) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        for pid in serving {
            if self.waiting.contains_key(&pid) {
                continue;
            }
            // No pidfd (the kernel has none, or the process is gone): the
            // next pass sees it.
            let Ok(pidfd) = kpm::liveness::open_pidfd(pid) else { continue };
            let wake = self.wake.clone();
            let task = tokio::spawn(async move {
                if pidfd.readable().await.is_ok() {
                    debug!(pid, "a plugin's process, or the kubelet, exited");
                    let _ = wake.try_send(());
                }
            });
            self.waiting.insert(pid, task.abort_handle());
        }
    }
}

impl Drop for Exits {
    fn drop(&mut self) {
        for task in self.waiting.values() {
            task.abort();
        }
    }
}
