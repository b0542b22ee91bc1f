//! The monitor: its public face ([`LivenessMonitor`], [`LivenessStats`]),
//! its loop, and the state the loop keeps of the plugins it follows. What
//! the loop does with each kind of news is in a child module of its own:
//!
//! - `probes`: when each plugin is probed next, and what the answers say;
//! - `exits`: plugin processes watched for exit, and the sockets checked
//!   when one exits or a connection to its plugin drops;
//! - `gone_endpoints`: plugins whose endpoint socket went away, deregistered
//!   until it is back.

use std::collections::{HashMap, HashSet};
use std::future::{Future, poll_fn};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use kpm_api::FileId;
use kpm_cache::{ActualState, DesiredState, EventBus, Generation, PluginEvent};
use kpm_transport::fd::FdBudget;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::endpoints::{EndpointWatch, socket_at, watched};
use crate::exits::{Exit, OpenPidfd, open_pidfd};
use crate::probe::{Checked, Connections, Reachability, Target};
use crate::{LivenessConfig, LivenessError, SharedConnections};

mod exits;
mod gone_endpoints;
mod probes;

use exits::Watched;
use probes::targets;

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
    /// replaced (deregistered until it is back, or registered anew).
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
    /// Handlers' connections that probes share, if any (see [`SharedConnections`]).
    shared: Option<Arc<dyn SharedConnections>>,
    budget: FdBudget,
    counters: Counters,
    /// Endpoints whose connection dropped, not yet looked at.
    suspects: Mutex<HashSet<PathBuf>>,
    suspected: Notify,
}

impl LivenessMonitor {
    /// A monitor of the plugins registered in `actual` (it follows the
    /// `Registered` and `Deregistered` events on `events`), whose probe
    /// connections and pidfds take permits of `budget` (the process-wide one
    /// is [`kpm_transport::fd::budget`]); refuses a config that does not pass
    /// [`LivenessConfig::validate`], once, here.
    pub fn try_new(
        config: LivenessConfig,
        budget: FdBudget,
        desired: Arc<DesiredState>,
        actual: Arc<ActualState>,
        events: EventBus,
    ) -> Result<Self, LivenessError> {
        config.validate()?;
        Ok(Self {
            desired,
            actual,
            events,
            config,
            open_pidfd,
            shared: None,
            budget,
            counters: Counters::default(),
            suspects: Mutex::default(),
            suspected: Notify::new(),
        })
    }

    /// Probes go over the connections `shared` has where it has one (see
    /// [`SharedConnections`]).
    #[must_use]
    pub fn with_shared_connections(mut self, shared: Arc<dyn SharedConnections>) -> Self {
        self.shared = Some(shared);
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
    /// A socket file appeared at `endpoint`, where plugins whose endpoint
    /// was gone wait; it accepted a connection, or not within
    /// `gone_endpoints::LISTEN_WINDOW`.
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
    /// Sockets deregistered because their endpoint is gone, by endpoint,
    /// awaiting it: each released when a socket appears there.
    awaiting_endpoint: HashMap<PathBuf, HashMap<PathBuf, Generation>>,
    /// Awaited endpoints where a socket appeared, being tried.
    reappeared: HashSet<PathBuf>,
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
            awaiting_endpoint: HashMap::new(),
            reappeared: HashSet::new(),
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
        self.stop_awaiting_endpoint(&socket);
        let endpoint = info.plugin.endpoint.socket_path().to_path_buf();
        let endpoint_watched = watched(&endpoint, &socket);
        self.served_at.entry(endpoint.clone()).or_default().insert(socket.clone());
        // Armed before the file is read: a change after the read is an event.
        if endpoint_watched {
            self.arm(&endpoint);
        }
        let endpoint_file = endpoint_watched.then(|| socket_at(&endpoint)).flatten();
        let targets = targets(&socket, &info, &endpoint);
        let followed = Followed {
            generation,
            next_probe,
            probing: false,
            failures: 0,
            pid,
            endpoint: endpoint.clone(),
            endpoint_watched,
            endpoint_file,
            targets,
        };
        self.followed.insert(socket, followed);
        self.count_followed();
        // Gone between its registration and now: no event will say so.
        if endpoint_watched && endpoint_file.is_none() {
            self.look_at_endpoint(&endpoint);
        }
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

    fn count_followed(&self) {
        self.monitor.counters.followed.store(self.followed.len(), Ordering::Relaxed);
    }

    fn finish(&mut self, done: Done) {
        match done {
            Done::Probed { socket, generation, checked } => {
                self.judge(&socket, generation, checked);
            }
            Done::Exited { pid, exit } => self.exited(pid, exit),
            Done::EndpointBack { endpoint, accepts } => self.endpoint_back(&endpoint, accepts),
            Done::Reached { socket, generation, cause, reachability, again } => {
                self.reached(socket, generation, cause, reachability, again);
            }
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
