//! The monitor's loop: which plugins it follows, which processes it watches,
//! when each plugin is probed next, and what it makes of the answers.

use std::collections::{HashMap, HashSet};
use std::future::{Future, poll_fn};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use kpm_api::FileId;
use kpm_api::constants::CSI_PLUGIN;
use kpm_cache::{ActualState, DesiredState, EventBus, Generation, PluginEvent, Registration};
use kpm_transport::fd::FdBudget;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::endpoints::{EndpointWatch, socket_at, watched_path};
use crate::exits::{Exit, OpenPidfd, pidfd_open, wait_for_exit};
use crate::probe::{Ask, Call, Checked, Connections, Reachability, Target, accepts, check, reach};
use crate::{HeldConnections, LivenessConfig, LivenessError, ProbeFailure};

/// Counters of what the monitor does, for metrics and the status API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LivenessStats {
    /// Registered plugins followed now.
    pub followed: usize,
    /// Plugin processes watched for exit now.
    pub watched_processes: usize,
    /// Plugin processes seen exiting.
    pub exits: u64,
    /// Sockets checked because their process exited or a connection to
    /// their plugin dropped.
    pub socket_checks: u64,
    /// Probes made (of each plugin, once per period).
    pub probes: u64,
    /// HTTP/2 PINGs those probes sent.
    pub pings: u64,
    /// gRPC calls those probes made (`GetInfo`, a CSI driver's
    /// `Identity/Probe`): where a PING is not enough.
    pub probe_calls: u64,
    /// Connections kept open between probes now, for plugins no handler
    /// holds a connection to.
    pub probe_connections: usize,
    /// Connections dialled for probes: one per kept connection, unless a
    /// plugin closes them (a gRPC server closes one that gets more PINGs
    /// than it takes) or more than can be kept are needed.
    pub probe_dials: u64,
    /// Probes that failed.
    pub failed_probes: u64,
    /// Plugins registered anew because they exited or stopped answering.
    pub renewals: u64,
    /// Plugin endpoints watched on the filesystem now.
    pub watched_endpoints: usize,
    /// Plugins deregistered because their endpoint was removed or
    /// replaced (held until it is back, or registered anew).
    pub endpoints_gone: u64,
    /// Whether the kernel can tell kpm that a process exited (pidfds).
    pub exit_watch_supported: bool,
}

#[derive(Debug, Default)]
struct Counters {
    followed: AtomicUsize,
    watched_processes: AtomicUsize,
    exits: AtomicU64,
    socket_checks: AtomicU64,
    probes: AtomicU64,
    pings: AtomicU64,
    probe_calls: AtomicU64,
    /// Counted by the slots of the kept connections (see `probe::Slot`).
    probe_connections: Arc<AtomicUsize>,
    /// Counted by the probes (see `probe::check`).
    probe_dials: Arc<AtomicU64>,
    failed_probes: AtomicU64,
    renewals: AtomicU64,
    watched_endpoints: AtomicUsize,
    endpoints_gone: AtomicU64,
    /// Set once `pidfd_open` says the kernel has no pidfds.
    no_pidfd: AtomicBool,
}

/// Watches registered plugins' processes and probes the plugins; renews the
/// ones that exited or stopped answering (see the crate docs).
#[derive(Debug)]
pub struct LivenessMonitor {
    desired: Arc<DesiredState>,
    actual: Arc<ActualState>,
    events: EventBus,
    config: LivenessConfig,
    open_pidfd: OpenPidfd,
    held: Option<Arc<dyn HeldConnections>>,
    budget: FdBudget,
    counters: Counters,
    /// Endpoints whose connection dropped, not yet looked at.
    suspects: Mutex<HashSet<PathBuf>>,
    suspected: Notify,
}

impl LivenessMonitor {
    /// A monitor of the plugins registered in `actual` (it follows the
    /// `Registered` and `Deregistered` events on `events`); refuses a config
    /// that does not pass [`LivenessConfig::validate`].
    pub fn new(
        desired: Arc<DesiredState>,
        actual: Arc<ActualState>,
        events: EventBus,
        config: LivenessConfig,
    ) -> Result<Self, LivenessError> {
        config.validate()?;
        Ok(Self {
            desired,
            actual,
            events,
            config,
            open_pidfd: pidfd_open,
            held: None,
            budget: kpm_transport::fd::budget().clone(),
            counters: Counters::default(),
            suspects: Mutex::default(),
            suspected: Notify::new(),
        })
    }

    /// Probes go over the connections `held` has where it has one (see
    /// [`HeldConnections`]).
    #[must_use]
    pub fn with_held_connections(mut self, held: Arc<dyn HeldConnections>) -> Self {
        self.held = Some(held);
        self
    }

    /// Probe connections and pidfds take permits of `budget` instead of the
    /// process-wide [fd budget](kpm_transport::fd::budget).
    #[must_use]
    pub fn with_fd_budget(mut self, budget: FdBudget) -> Self {
        self.budget = budget;
        self
    }

    /// The settings the monitor runs with.
    pub fn config(&self) -> &LivenessConfig {
        &self.config
    }

    /// A connection to a plugin's socket dropped (a device plugin's
    /// `ListAndWatch` stream, a DRA driver's connection): the plugin may be
    /// gone. The registration sockets of the plugins served at `endpoint` are
    /// checked at once, as after an exit.
    pub fn suspect(&self, endpoint: &Path) {
        self.suspects.lock().insert(endpoint.to_path_buf());
        self.suspected.notify_one();
    }

    /// What the monitor did so far.
    pub fn stats(&self) -> LivenessStats {
        let c = &self.counters;
        LivenessStats {
            followed: c.followed.load(Ordering::Relaxed),
            watched_processes: c.watched_processes.load(Ordering::Relaxed),
            exits: c.exits.load(Ordering::Relaxed),
            socket_checks: c.socket_checks.load(Ordering::Relaxed),
            probes: c.probes.load(Ordering::Relaxed),
            pings: c.pings.load(Ordering::Relaxed),
            probe_calls: c.probe_calls.load(Ordering::Relaxed),
            probe_connections: c.probe_connections.load(Ordering::Relaxed),
            probe_dials: c.probe_dials.load(Ordering::Relaxed),
            failed_probes: c.failed_probes.load(Ordering::Relaxed),
            renewals: c.renewals.load(Ordering::Relaxed),
            watched_endpoints: c.watched_endpoints.load(Ordering::Relaxed),
            endpoints_gone: c.endpoints_gone.load(Ordering::Relaxed),
            exit_watch_supported: !c.no_pidfd.load(Ordering::Relaxed),
        }
    }

    /// Follows the registered plugins until `shutdown`.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        // Subscribed before the first look at ActualState: no registration
        // falls between the two.
        let mut events = self.events.subscribe();
        let mut state = State::new(self);
        state.resync();
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                event = events.recv() => match event {
                    Ok(PluginEvent::Registered { socket, generation, .. }) => {
                        state.follow(socket, generation);
                    }
                    Ok(PluginEvent::Deregistered { socket, generation, .. }) => {
                        state.forget(&socket, Some(generation));
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => state.resync(),
                    // The monitor holds a sender itself.
                    Err(RecvError::Closed) => break,
                },
                Some(due) = poll_fn(|cx| state.schedule.poll_expired(cx)) => {
                    let at = due.deadline();
                    state.probe_due(due.into_inner(), at);
                }
                () = self.suspected.notified() => {
                    let suspects = std::mem::take(&mut *self.suspects.lock());
                    for endpoint in suspects {
                        state.suspect(&endpoint);
                    }
                }
                endpoints = state.endpoints.changed() => {
                    for endpoint in endpoints {
                        state.look_at_endpoint(&endpoint);
                    }
                }
                Some(done) = state.probes.next() => state.finish(done),
                Some(done) = state.tasks.join_next() => {
                    // Aborted watches of processes nobody follows any more.
                    if let Ok(done) = done {
                        state.finish(done);
                    }
                }
            }
        }
        state.tasks.shutdown().await;
        self.counters.followed.store(0, Ordering::Relaxed);
        self.counters.watched_processes.store(0, Ordering::Relaxed);
        self.counters.watched_endpoints.store(0, Ordering::Relaxed);
        tracing::debug!("liveness monitor stopped");
    }
}

/// The step of the grid probes fall on (see `State::first_probe`), or the
/// period if shorter.
const PROBE_TICK: Duration = Duration::from_secs(2);

/// When a dropped connection's socket still answered, how long before it is
/// looked at once more: a process being killed drops its connections first
/// and may close its listener a while later on a loaded machine.
const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// How long a socket file that appeared at a held plugin's endpoint may
/// refuse connections before the plugin is registered anyway (and told
/// why it fails): a server binds its file a moment before it listens.
const LISTEN_WINDOW: Duration = Duration::from_secs(5);

/// A plugin incarnation the monitor follows.
#[derive(Debug)]
struct Followed {
    generation: Generation,
    /// Its next probe, if probing is on.
    next_probe: Option<delay_queue::Key>,
    /// A probe is running.
    probing: bool,
    /// Failed probes in a row.
    failures: u32,
    /// The watched process serving its socket.
    pid: Option<u32>,
    /// The endpoint it reported in `GetInfo`, as a path (see `State::served_at`).
    endpoint: PathBuf,
    /// Whether its endpoint is watched (see `endpoints`), and the socket
    /// file there when it was followed, or first seen after.
    endpoint_watched: bool,
    endpoint_file: Option<FileId>,
    /// The sockets it is probed on: its registration socket, and a CSI
    /// driver's endpoint (its registration socket is node-driver-registrar's).
    targets: Vec<Target>,
}

/// The sockets a plugin is probed on: its registration socket, asked
/// `GetInfo` when a PING is not enough; for a CSI driver also its endpoint,
/// asked `Identity/Probe` (the registration socket is node-driver-registrar's,
/// which answers while the driver hangs). A driver serving both on one
/// socket is one server, asked `GetInfo`.
fn targets(socket: &Path, info: &Registration) -> Vec<Target> {
    let driver = kpm_transport::endpoint_path(&info.plugin.endpoint);
    if info.plugin_type != CSI_PLUGIN || driver.as_os_str().is_empty() || driver == socket {
        return vec![Target::new(socket.to_path_buf(), Call::GetInfo)];
    }
    vec![
        Target::new(socket.to_path_buf(), Call::GetInfo),
        Target::new(driver.to_path_buf(), Call::CsiProbe),
    ]
}

/// A watched process and the sockets it serves.
#[derive(Debug)]
struct Watched {
    sockets: HashSet<PathBuf>,
    watch: AbortHandle,
}

/// What a probe or a task of the monitor found.
#[derive(Debug)]
enum Done {
    Probed {
        socket: PathBuf,
        generation: Generation,
        /// One per target, in order.
        checked: Vec<Checked>,
    },
    Exited {
        pid: u32,
        exit: Exit,
    },
    /// A socket file appeared at `endpoint`, where held plugins wait; it
    /// accepted a connection, or not within [`LISTEN_WINDOW`].
    EndpointBack {
        endpoint: PathBuf,
        accepts: bool,
    },
    /// `socket` was checked because of `cause` (its process exited, a
    /// connection to its plugin dropped).
    Reached {
        socket: PathBuf,
        generation: Generation,
        cause: String,
        reachability: Reachability,
        /// Whether a socket still served is looked at once more.
        again: bool,
    },
}

struct State<'a> {
    monitor: &'a LivenessMonitor,
    followed: HashMap<PathBuf, Followed>,
    watched: HashMap<u32, Watched>,
    schedule: DelayQueue<PathBuf>,
    /// The followed sockets by the endpoint their plugin reported, so that a
    /// dropped connection to an endpoint finds its plugins without a scan: a
    /// thousand device plugins stopping at once drop a thousand.
    served_at: HashMap<PathBuf, HashSet<PathBuf>>,
    /// The origin of the grid of probe ticks.
    origin: Instant,
    /// The probes running, polled by the monitor's own task: a probe is a
    /// PING and its acknowledgement, too little work for a task of its own.
    probes: FuturesUnordered<BoxFuture<'static, Done>>,
    tasks: JoinSet<Done>,
    endpoints: EndpointWatch,
    /// Sockets held back because their endpoint is gone, by endpoint: each
    /// released when a socket appears there.
    held: HashMap<PathBuf, HashMap<PathBuf, Generation>>,
    /// Held plugins' endpoints where a socket appeared, being tried.
    awaited: HashSet<PathBuf>,
    /// What every probe's connections are counted in and paid from.
    connections: Arc<Connections>,
}

impl<'a> State<'a> {
    fn new(monitor: &'a LivenessMonitor) -> Self {
        Self {
            monitor,
            followed: HashMap::new(),
            watched: HashMap::new(),
            schedule: DelayQueue::new(),
            served_at: HashMap::new(),
            origin: Instant::now(),
            probes: FuturesUnordered::new(),
            tasks: JoinSet::new(),
            endpoints: EndpointWatch::new(),
            held: HashMap::new(),
            awaited: HashSet::new(),
            connections: Arc::new(Connections {
                kept: Arc::clone(&monitor.counters.probe_connections),
                dials: Arc::clone(&monitor.counters.probe_dials),
                budget: monitor.budget.clone(),
            }),
        }
    }

    /// Follows exactly the plugins registered now: after a start, or after
    /// events were missed.
    fn resync(&mut self) {
        let registered: HashMap<PathBuf, Generation> = self
            .monitor
            .actual
            .paths()
            .into_iter()
            .filter_map(|socket| {
                let generation = self.monitor.actual.generation(&socket)?;
                Some((socket, generation))
            })
            .collect();
        let stale: Vec<PathBuf> = self
            .followed
            .iter()
            .filter(|(socket, f)| registered.get(*socket) != Some(&f.generation))
            .map(|(socket, _)| socket.clone())
            .collect();
        for socket in stale {
            self.forget(&socket, None);
        }
        for (socket, generation) in registered {
            self.follow(socket, generation);
        }
    }

    /// Starts following a registered incarnation: its first probe at a
    /// random point of the period, so that plugins registered together are
    /// not probed together, and a watch on its process.
    fn follow(&mut self, socket: PathBuf, generation: Generation) {
        if self.followed.get(&socket).is_some_and(|f| f.generation == generation) {
            return;
        }
        self.forget(&socket, None);
        // Deregistered again already: its Deregistered event is on its way.
        let Some(info) = self.monitor.actual.get(&socket) else { return };
        if info.generation != generation {
            return;
        }
        let next_probe = self
            .monitor
            .config
            .period
            .map(|period| self.schedule.insert_at(socket.clone(), self.first_probe(period)));
        let pid = info.server_pid.filter(|_| self.exits_watchable());
        if let Some(pid) = pid {
            self.watch(pid, &socket);
        }
        self.unhold(&socket);
        let watched = watched_path(&info.plugin.endpoint, &socket);
        let endpoint = kpm_transport::endpoint_path(&info.plugin.endpoint).to_path_buf();
        self.served_at.entry(endpoint.clone()).or_default().insert(socket.clone());
        // Armed before the file is read: a change after the read is an event.
        if watched.is_some() {
            self.arm(&endpoint);
        }
        let endpoint_file = watched.as_deref().and_then(socket_at);
        let targets = targets(&socket, &info);
        let followed = Followed {
            generation,
            next_probe,
            probing: false,
            failures: 0,
            pid,
            endpoint: endpoint.clone(),
            endpoint_watched: watched.is_some(),
            endpoint_file,
            targets,
        };
        self.followed.insert(socket, followed);
        self.count_followed();
        // Gone between its registration and now: no event will say so.
        if watched.is_some() && endpoint_file.is_none() {
            self.look_at_endpoint(&endpoint);
        }
    }

    /// Forgets a held `socket`: registered again, in whichever incarnation.
    fn unhold(&mut self, socket: &Path) {
        let emptied: Vec<PathBuf> = self
            .held
            .iter_mut()
            .filter_map(|(endpoint, sockets)| {
                (sockets.remove(socket).is_some() && sockets.is_empty()).then(|| endpoint.clone())
            })
            .collect();
        for endpoint in emptied {
            self.held.remove(&endpoint);
            self.disarm_if_unused(&endpoint);
        }
    }

    fn arm(&mut self, endpoint: &Path) {
        if let Err(error) = self.endpoints.arm(endpoint) {
            tracing::warn!(
                endpoint = %endpoint.display(), %error,
                "cannot watch a plugin's endpoint; its removal is left to the probes"
            );
        }
        self.count_endpoints();
    }

    /// Stops watching `endpoint` once no followed or held plugin uses it.
    fn disarm_if_unused(&mut self, endpoint: &Path) {
        // Through the index of who is served where: a thousand plugins
        // leaving at once must not scan every followed one each.
        let watched =
            |socket: &PathBuf| self.followed.get(socket).is_some_and(|f| f.endpoint_watched);
        let mut served = self.served_at.get(endpoint).into_iter().flatten();
        if self.held.contains_key(endpoint) || served.any(watched) {
            return;
        }
        self.endpoints.disarm(endpoint);
        self.count_endpoints();
    }

    fn count_endpoints(&self) {
        let armed = self.endpoints.len();
        self.monitor.counters.watched_endpoints.store(armed, Ordering::Relaxed);
    }

    /// Something changed where `endpoint` is: a plugin whose endpoint
    /// socket is gone is held back until one is there again, one whose
    /// socket was replaced by another file is registered anew, held ones
    /// are released when a socket is there.
    fn look_at_endpoint(&mut self, endpoint: &Path) {
        // Moves the watch down to the endpoint's directory once it exists.
        self.arm(endpoint);
        let now = socket_at(endpoint);
        let served: Vec<(PathBuf, Generation, Option<FileId>)> = self
            .served_at
            .get(endpoint)
            .into_iter()
            .flatten()
            .filter_map(|socket| {
                let followed = self.followed.get(socket).filter(|f| f.endpoint_watched)?;
                Some((socket.clone(), followed.generation, followed.endpoint_file))
            })
            .collect();
        for (socket, generation, was) in served {
            match (was, now) {
                (Some(was), Some(now)) if was != now => {
                    self.monitor.counters.endpoints_gone.fetch_add(1, Ordering::Relaxed);
                    let reason = format!("its endpoint {} was replaced", endpoint.display());
                    self.renew(&socket, generation, 0, reason);
                }
                (_, None) => self.hold(&socket, generation, endpoint),
                // Served again before it was followed: that file is its own.
                (None, Some(now)) => {
                    if let Some(followed) = self.followed.get_mut(&socket) {
                        followed.endpoint_file = Some(now);
                    }
                }
                (Some(_), Some(_)) => {}
            }
        }
        if now.is_some() && self.held.contains_key(endpoint) && self.awaited.insert(endpoint.into())
        {
            let (endpoint, budget) = (endpoint.to_path_buf(), self.monitor.budget.clone());
            self.tasks.spawn(async move {
                let accepts = accepts(&endpoint, LISTEN_WINDOW, &budget).await;
                Done::EndpointBack { endpoint, accepts }
            });
        }
        self.disarm_if_unused(endpoint);
    }

    /// A socket is at `endpoint` again: its held plugins are registered.
    fn endpoint_back(&mut self, endpoint: &Path, accepts: bool) {
        self.awaited.remove(endpoint);
        // Gone again meanwhile: its removal was an event of its own.
        if socket_at(endpoint).is_none() {
            return;
        }
        let Some(held) = self.held.remove(endpoint) else { return };
        for (socket, generation) in held {
            if self.monitor.desired.release(&socket, generation).is_some() {
                tracing::info!(
                    socket = %socket.display(), endpoint = %endpoint.display(), accepts,
                    "the plugin's endpoint is back; registering it again"
                );
            }
        }
        self.disarm_if_unused(endpoint);
    }

    /// The plugin's endpoint socket is gone: deregistered, through the
    /// executor, and not registered again until the endpoint is back (a
    /// registration now could only fail, and node-driver-registrar exits
    /// when told so).
    fn hold(&mut self, socket: &Path, generation: Generation, endpoint: &Path) {
        let info = self.monitor.actual.get(socket).filter(|info| info.generation == generation);
        let reason = format!("its endpoint {} was removed; waiting for it", endpoint.display());
        let held = info.filter(|_| self.monitor.desired.hold(socket, generation, reason.clone()));
        if held.is_some() {
            // Before `forget`, which stops watching an endpoint nobody needs.
            let sockets = self.held.entry(endpoint.to_path_buf()).or_default();
            sockets.insert(socket.to_path_buf(), generation);
        }
        self.forget(socket, Some(generation));
        let Some(info) = held else { return };
        self.monitor.counters.endpoints_gone.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            socket = %socket.display(), plugin = %info.plugin.name, plugin_type = %info.plugin_type,
            endpoint = %endpoint.display(), "the plugin's endpoint was removed; deregistering it"
        );
        self.monitor.events.publish(PluginEvent::Unresponsive {
            socket: socket.to_path_buf(),
            generation,
            plugin_type: info.plugin_type,
            name: info.plugin.name,
            failures: 0,
            reason,
        });
    }

    /// When a newly followed plugin is first probed: on a random tick of the
    /// next period. The ticks are a grid from the monitor's start, and each
    /// probe is a period after the last, so with a period that is a whole
    /// number of ticks (the default) every probe falls on the grid: the
    /// runtime wakes once per tick for that tick's share of the plugins,
    /// instead of once per probe. Waking was most of what a probe cost
    /// (docs/performance.md).
    fn first_probe(&self, period: Duration) -> Instant {
        let tick = PROBE_TICK.min(period).as_nanos();
        let next_tick = self.origin.elapsed().as_nanos().div_ceil(tick);
        let ticks_per_period = (period.as_nanos() / tick).max(1);
        let offset = (next_tick + fastrand::u128(0..ticks_per_period)) * tick;
        // Within a period of now: far from overflowing either type.
        self.origin + Duration::from_nanos(u64::try_from(offset).unwrap_or(u64::MAX))
    }

    /// Stops following `socket` (only if it is still that generation).
    fn forget(&mut self, socket: &Path, generation: Option<Generation>) {
        let Some(followed) = self.followed.get(socket) else { return };
        if generation.is_some_and(|g| g != followed.generation) {
            return;
        }
        let Some(followed) = self.followed.remove(socket) else { return };
        self.count_followed();
        if let Some(key) = followed.next_probe {
            self.schedule.remove(&key);
        }
        if let Some(pid) = followed.pid {
            self.unwatch(pid, socket);
        }
        if let Some(sockets) = self.served_at.get_mut(&followed.endpoint) {
            sockets.remove(socket);
            if sockets.is_empty() {
                self.served_at.remove(&followed.endpoint);
            }
        }
        if followed.endpoint_watched {
            self.disarm_if_unused(&followed.endpoint);
        }
    }

    fn exits_watchable(&self) -> bool {
        self.monitor.config.watch_exits && !self.monitor.counters.no_pidfd.load(Ordering::Relaxed)
    }

    /// Adds `socket` to the sockets of process `pid`, watching it if new.
    fn watch(&mut self, pid: u32, socket: &Path) {
        if let Some(watched) = self.watched.get_mut(&pid) {
            watched.sockets.insert(socket.to_path_buf());
            return;
        }
        let (open, checked) = (self.monitor.open_pidfd, socket.to_path_buf());
        let budget = self.monitor.budget.clone();
        let watch = self.tasks.spawn(async move {
            let exit = wait_for_exit(open, pid, &checked, &budget).await;
            Done::Exited { pid, exit }
        });
        let sockets = HashSet::from([socket.to_path_buf()]);
        self.watched.insert(pid, Watched { sockets, watch });
        self.count_watched();
    }

    fn unwatch(&mut self, pid: u32, socket: &Path) {
        let Some(watched) = self.watched.get_mut(&pid) else { return };
        watched.sockets.remove(socket);
        if watched.sockets.is_empty() {
            watched.watch.abort();
            self.watched.remove(&pid);
            self.count_watched();
        }
    }

    fn count_followed(&self) {
        self.monitor.counters.followed.store(self.followed.len(), Ordering::Relaxed);
    }

    fn count_watched(&self) {
        self.monitor.counters.watched_processes.store(self.watched.len(), Ordering::Relaxed);
    }

    /// A plugin's probe is due: start it, and schedule the next one a period
    /// later (on its own phase, whatever the probe takes).
    fn probe_due(&mut self, socket: PathBuf, due: Instant) {
        let (Some(period), Some(followed)) =
            (self.monitor.config.period, self.followed.get_mut(&socket))
        else {
            return;
        };
        let next = (due + period).max(Instant::now());
        followed.next_probe = Some(self.schedule.insert_at(socket.clone(), next));
        // A probe still running (a hung plugin's, within its timeout) is
        // judged first; this round is skipped.
        if followed.probing {
            return;
        }
        followed.probing = true;
        let (generation, timeout) = (followed.generation, self.monitor.config.timeout);
        let failing = followed.failures > 0;
        let mut held = self.monitor.held.as_ref().and_then(|held| {
            let info = self.monitor.actual.get(&socket)?;
            (info.generation == generation).then(|| held.connection(&info)).flatten()
        });
        let checks: Vec<_> = followed
            .targets
            .iter_mut()
            .map(|target| {
                let held = if target.socket == socket { held.take() } else { None };
                target.next_check(failing, held)
            })
            .collect();
        let connections = Arc::clone(&self.connections);
        self.probes.push(Box::pin(async move {
            let mut checked = Vec::with_capacity(checks.len());
            for one in checks {
                checked.push(check(one, timeout, &connections).await);
            }
            Done::Probed { socket, generation, checked }
        }));
    }

    fn finish(&mut self, done: Done) {
        match done {
            Done::Probed { socket, generation, checked } => {
                self.judge(&socket, generation, checked);
            }
            Done::Exited { pid, exit } => self.exited(pid, exit),
            Done::EndpointBack { endpoint, accepts } => self.endpoint_back(&endpoint, accepts),
            Done::Reached { socket, generation, cause, reachability, again } => {
                self.monitor.counters.socket_checks.fetch_add(1, Ordering::Relaxed);
                match reachability {
                    Reachability::Gone(why) => {
                        self.renew(&socket, generation, 0, format!("{cause}; {why}"));
                    }
                    Reachability::Served if again => {
                        self.check(socket, generation, cause, Some(RECHECK_AFTER));
                    }
                    Reachability::Served => tracing::info!(
                        socket = %socket.display(), %cause,
                        "the socket is still served; left to the probes"
                    ),
                }
            }
        }
    }

    /// Checks whether `socket` is still served, because of `cause`: at once,
    /// and, if it is and this is the first look, once more after
    /// [`RECHECK_AFTER`]; with `after`, only that once more.
    fn check(
        &mut self,
        socket: PathBuf,
        generation: Generation,
        cause: String,
        after: Option<Duration>,
    ) {
        let budget = self.monitor.budget.clone();
        self.tasks.spawn(async move {
            if let Some(after) = after {
                tokio::time::sleep(after).await;
            }
            let reachability = reach(&socket, &budget).await;
            Done::Reached { socket, generation, cause, reachability, again: after.is_none() }
        });
    }

    /// A connection to `endpoint` dropped: checks the registration socket of
    /// every plugin served there.
    fn suspect(&mut self, endpoint: &Path) {
        let served = self.served_at.get(endpoint).into_iter().flatten();
        let itself = self.followed.contains_key(endpoint).then(|| endpoint.to_path_buf());
        let suspects: HashSet<PathBuf> = served.cloned().chain(itself).collect();
        for socket in suspects {
            let Some(followed) = self.followed.get(&socket) else { continue };
            let generation = followed.generation;
            let cause = format!("its connection to {} dropped", endpoint.display());
            self.check(socket, generation, cause, None);
        }
    }

    fn judge(&mut self, socket: &Path, generation: Generation, checked: Vec<Checked>) {
        let counters = &self.monitor.counters;
        counters.probes.fetch_add(1, Ordering::Relaxed);
        for one in &checked {
            match one.asked() {
                Some(Ask::Ping) => counters.pings.fetch_add(1, Ordering::Relaxed),
                Some(Ask::Call(_)) => counters.probe_calls.fetch_add(1, Ordering::Relaxed),
                None => 0,
            };
        }
        let Some(followed) = self.followed.get_mut(socket) else { return };
        if followed.generation != generation {
            return;
        }
        followed.probing = false;
        // The first failure is the one told; every target takes back its
        // connection (a failed one's is closed now).
        let mut failure = None;
        for (target, checked) in followed.targets.iter_mut().zip(checked) {
            let outcome = target.checked(checked).map_err(|failed| {
                if target.socket.as_path() == socket {
                    return failed;
                }
                let reason =
                    format!("its driver at {}: {}", target.socket.display(), failed.reason);
                ProbeFailure { reason, ..failed }
            });
            failure = failure.or(outcome.err());
        }
        let Some(failure) = failure else {
            followed.failures = 0;
            return;
        };
        counters.failed_probes.fetch_add(1, Ordering::Relaxed);
        let threshold = self.monitor.config.failure_threshold;
        followed.failures = if failure.gone { threshold } else { followed.failures + 1 };
        let failures = followed.failures;
        if failures < threshold {
            tracing::debug!(
                socket = %socket.display(), failures, reason = %failure.reason,
                "liveness probe failed"
            );
            return;
        }
        self.renew(socket, generation, failures, failure.reason);
    }

    /// Process `pid` exited: check each of its sockets.
    fn exited(&mut self, pid: u32, exit: Exit) {
        let Some(watched) = self.watched.remove(&pid) else { return };
        self.count_watched();
        for socket in &watched.sockets {
            if let Some(followed) = self.followed.get_mut(socket) {
                followed.pid = None;
            }
        }
        match exit {
            Exit::Exited => {
                self.monitor.counters.exits.fetch_add(1, Ordering::Relaxed);
                for socket in watched.sockets {
                    let Some(followed) = self.followed.get(&socket) else { continue };
                    let generation = followed.generation;
                    self.check(socket, generation, format!("its process {pid} exited"), None);
                }
            }
            Exit::Unsupported => {
                if !self.monitor.counters.no_pidfd.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "this kernel has no pidfd_open (Linux 5.3): plugin exits are noticed \
                         by the liveness probes only"
                    );
                }
                // Every other watch ends the same way: stop them now.
                for (_, watched) in self.watched.drain() {
                    watched.watch.abort();
                }
                for followed in self.followed.values_mut() {
                    followed.pid = None;
                }
                self.count_watched();
            }
            Exit::Unwatchable(error) => tracing::info!(
                pid, sockets = watched.sockets.len(), %error,
                "cannot watch a plugin process; its plugins are left to the liveness probes"
            ),
        }
    }

    /// Registers the plugin anew, if the socket is still that incarnation: a
    /// socket re-created meanwhile is a new plugin and is left alone.
    fn renew(&mut self, socket: &Path, generation: Generation, failures: u32, reason: String) {
        self.forget(socket, Some(generation));
        let info = self.monitor.actual.get(socket).filter(|info| info.generation == generation);
        let Some(info) = info else { return };
        if self.monitor.desired.renew(socket, generation).is_none() {
            return;
        }
        self.monitor.counters.renewals.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            socket = %socket.display(), plugin = %info.plugin.name, plugin_type = %info.plugin_type,
            failures, %reason, "plugin is gone or stopped answering; registering it anew"
        );
        self.monitor.events.publish(PluginEvent::Unresponsive {
            socket: socket.to_path_buf(),
            generation,
            plugin_type: info.plugin_type,
            name: info.plugin.name,
            failures,
            reason,
        });
    }
}

#[cfg(test)]
mod tests;
