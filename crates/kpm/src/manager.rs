//! `PluginManager`: the watcher, the reconciler and the executor, wired together.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kpm_api::config::check_durations;
use kpm_cache::{ActualState, DesiredState, EventBus, EventCounts, PluginEvent, PluginHandler};
use kpm_executor::{ExecutorConfig, Inspection, OperationExecutor};
use kpm_liveness::{LivenessConfig, LivenessMonitor, LivenessStats, SharedConnections};
use kpm_reconciler::{Reconciler, ReconcilerConfig};
use kpm_transport::fd::FdBudget;
use kpm_transport::{HostRoot, Reach};
use kpm_watcher::{Watcher, WatcherConfig, WatcherStats};
use tokio::sync::broadcast;

use crate::status::{self, ActualStateView, DesiredStateView, PluginStatus};
use crate::{Error, Result};

/// The most events [`PluginManagerBuilder::event_capacity`] accepts: a
/// subscriber that falls further behind is better told it lagged.
pub const MAX_EVENT_CAPACITY: usize = 1 << 20;

/// Configures a [`PluginManager`]. Every setting has the kubelet's default.
#[derive(Debug)]
#[must_use]
pub struct PluginManagerBuilder {
    registry_dir: PathBuf,
    handlers: Vec<(String, Arc<dyn PluginHandler>)>,
    executor: ExecutorConfig,
    reconciler: ReconcilerConfig,
    watcher: WatcherConfig,
    liveness: Option<LivenessConfig>,
    shared_connections: Option<Arc<dyn SharedConnections>>,
    host: HostRoot,
    shutdown_grace: Duration,
    event_capacity: usize,
    fd_budget: FdBudget,
}

impl Default for PluginManagerBuilder {
    fn default() -> Self {
        Self {
            registry_dir: PathBuf::from(kpm_api::constants::DEFAULT_ROOT_DIR)
                .join(kpm_api::constants::PLUGINS_REGISTRY_DIR_NAME),
            handlers: Vec::new(),
            executor: ExecutorConfig::default(),
            reconciler: ReconcilerConfig::default(),
            watcher: WatcherConfig::default(),
            liveness: Some(LivenessConfig::default()),
            shared_connections: None,
            host: HostRoot::default(),
            shutdown_grace: Duration::from_secs(10),
            event_capacity: EventBus::DEFAULT_CAPACITY,
            fd_budget: kpm_transport::fd::budget().clone(),
        }
    }
}

impl PluginManagerBuilder {
    /// The directory plugins create registration sockets in
    /// (default `/var/lib/kubelet/plugins_registry`); created if missing.
    pub fn registry_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.registry_dir = dir.into();
        self
    }

    /// The handler for plugins of `plugin_type`. More can be added with
    /// [`ManagerHandle::add_handler`], also while running. A type given
    /// twice makes [`build`](Self::build) fail with [`Error::AddHandler`].
    pub fn handler(
        mut self,
        plugin_type: impl Into<String>,
        handler: Arc<dyn PluginHandler>,
    ) -> Self {
        self.handlers.push((plugin_type.into(), handler));
        self
    }

    /// Dial, `GetInfo` and notify timeouts, and the backoff.
    pub fn executor_config(mut self, config: ExecutorConfig) -> Self {
        self.executor = config;
        self
    }

    /// The reconciler's settings; see also [`Self::reconcile_period`].
    pub fn reconciler_config(mut self, config: ReconcilerConfig) -> Self {
        self.reconciler = config;
        self
    }

    /// Period of the reconciler's safety-net pass (default 10 s).
    pub fn reconcile_period(mut self, period: Duration) -> Self {
        self.reconciler = self.reconciler.reconcile_period(period);
        self
    }

    /// The watcher's settings; see also [`Self::resync_period`].
    pub fn watcher_config(mut self, config: WatcherConfig) -> Self {
        self.watcher = config;
        self
    }

    /// Period of the full re-listing of the registry directory (default
    /// 60 s; zero: only when events were lost).
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.watcher = self.watcher.resync_period(period);
        self
    }

    /// Liveness of registered plugins: the process serving each registration
    /// socket is watched, and a plugin whose process exited and whose socket
    /// refuses connections is deregistered and registered anew at once; a
    /// `GetInfo` probe every 30 s catches plugins that hang (3 failures in a
    /// row). `None` turns both off, as the kubelet has it.
    pub fn liveness(mut self, config: Option<LivenessConfig>) -> Self {
        self.liveness = config;
        self
    }

    /// Connections to plugins that handlers hold anyway, which liveness
    /// probes share instead of dialling (see [`SharedConnections`]).
    /// [`Kubelet`](crate::Kubelet) hands over the device plugins'.
    pub fn shared_connections(mut self, shared: Arc<dyn SharedConnections>) -> Self {
        self.shared_connections = Some(shared);
        self
    }

    /// Where this process sees the host's `/` (see
    /// [`KubeletBuilder::inspect_only`](crate::KubeletBuilder::inspect_only)):
    /// the executor dials the sockets it is given, paths on the host,
    /// there. [`Kubelet`](crate::Kubelet) hands over its own.
    pub(crate) fn host(mut self, host: HostRoot) -> Self {
        self.host = host;
        self
    }

    /// How long [`PluginManager::run`] waits for running operations after
    /// shutdown is requested (default 10 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// How many events a subscriber may fall behind before it is told it
    /// lagged (default 1024, at most [`MAX_EVENT_CAPACITY`]).
    pub fn event_capacity(mut self, capacity: usize) -> Self {
        self.event_capacity = capacity;
        self
    }

    /// The file descriptors the executor's and liveness' connections to
    /// plugins pay from (default: the process-wide
    /// [`fd::budget`](crate::transport::fd::budget)). Give each manager of a
    /// process its own to keep one from starving the others.
    pub fn fd_budget(mut self, budget: FdBudget) -> Self {
        self.fd_budget = budget;
        self
    }

    /// Checks every setting and builds the manager; nothing runs yet.
    pub fn build(self) -> Result<PluginManager> {
        let events = self.event_bus()?;
        self.build_with_events(events)
    }

    /// The bus the manager will publish its events on, of the capacity set
    /// (checked here), for a handler that publishes on it too (the DRA
    /// manager's device health changes); then
    /// [`build_with_events`](Self::build_with_events).
    pub(crate) fn event_bus(&self) -> Result<EventBus> {
        if !(1..=MAX_EVENT_CAPACITY).contains(&self.event_capacity) {
            let reason =
                format!("{} is out of range (1 to {MAX_EVENT_CAPACITY})", self.event_capacity);
            return Err(Error::InvalidConfig { setting: "event_capacity", reason });
        }
        Ok(EventBus::new(self.event_capacity))
    }

    /// [`build`](Self::build), publishing on `events`, from
    /// [`event_bus`](Self::event_bus).
    pub(crate) fn build_with_events(self, events: EventBus) -> Result<PluginManager> {
        invalid_if(
            "shutdown_grace",
            check_durations(&[], &[("shutdown_grace", self.shutdown_grace)]),
        )?;
        // In the order the settings were always checked: the first invalid
        // one is the one reported.
        let reach = Reach::new(self.fd_budget.clone(), self.host);
        let executor =
            OperationExecutor::try_new(self.executor, reach, events.clone()).map_err(|err| {
                Error::InvalidConfig { setting: "executor_config", reason: err.to_string() }
            })?;
        let desired = Arc::new(DesiredState::new());
        let actual = Arc::new(ActualState::new());
        let reconciler = Reconciler::try_new(
            self.reconciler,
            Arc::clone(&desired),
            Arc::clone(&actual),
            executor,
            events.clone(),
        )
        .map_err(|err| Error::InvalidConfig {
            setting: "reconciler_config",
            reason: err.to_string(),
        })?;
        let reconciler = Arc::new(reconciler);
        invalid_if("watcher_config", self.watcher.validate())?;

        let shared = self.shared_connections;
        let liveness = self
            .liveness
            .map(|config| {
                let mut monitor = LivenessMonitor::try_new(
                    config,
                    self.fd_budget.clone(),
                    Arc::clone(&desired),
                    Arc::clone(&actual),
                    events.clone(),
                )?;
                if let Some(shared) = shared {
                    monitor = monitor.with_shared_connections(shared);
                }
                Ok::<_, kpm_liveness::LivenessError>(Arc::new(monitor))
            })
            .transpose()
            .map_err(|err| Error::InvalidConfig { setting: "liveness", reason: err.to_string() })?;
        for (plugin_type, handler) in self.handlers {
            add_handler(&reconciler, plugin_type, handler)?;
        }
        let handle = ManagerHandle {
            registry_dir: self.registry_dir,
            desired: DesiredStateView(desired),
            actual: ActualStateView(actual),
            reconciler,
            events,
            watcher_stats: Arc::default(),
            liveness,
            fd_budget: self.fd_budget,
        };
        Ok(PluginManager { handle, watcher: self.watcher, shutdown_grace: self.shutdown_grace })
    }
}

/// Adds a handler to `reconciler`, which refuses a type that has one.
fn add_handler(
    reconciler: &Reconciler,
    plugin_type: String,
    handler: Arc<dyn PluginHandler>,
) -> Result<()> {
    reconciler
        .add_handler(plugin_type.clone(), handler)
        .map_err(|source| Error::AddHandler { plugin_type, source })
}

/// `Err(InvalidConfig)` for `setting` if `checked` says it is invalid (a
/// `validate()`, or a `try_new` that validates), else what it made.
pub(crate) fn invalid_if<T, E: std::fmt::Display>(
    setting: &'static str,
    checked: std::result::Result<T, E>,
) -> Result<T> {
    checked.map_err(|err| Error::InvalidConfig { setting, reason: err.to_string() })
}

/// Counters of a [`PluginManager`], see [`ManagerHandle::stats`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ManagerStats {
    /// Registrations, rejections, deregistrations, retries and renewals of
    /// unresponsive plugins, counted as they happen: exact, whatever a
    /// subscriber of [`ManagerHandle::subscribe`] missed.
    pub events: EventCounts,
    /// Full re-listings of the registry directory (overflow, periodic, requested).
    pub rescans: u64,
    /// Operations not started because their socket was backing off.
    pub backoff_skips: u64,
    /// Sockets the operation executor keeps an entry for (running, backing
    /// off, or failed permanently; a success leaves none). Once things
    /// settle, at most the number of sockets not registered: more is a leak.
    pub operations: usize,
    /// What liveness did (processes watched, exits seen, probes), if it is on.
    pub liveness: Option<LivenessStats>,
}

/// The plugin manager: keeps the plugins registered whose sockets exist.
///
/// Built by [`PluginManager::builder`]; [`PluginManager::run`] consumes it.
/// Take a [`ManagerHandle`] first to watch it while it runs.
#[derive(Debug)]
pub struct PluginManager {
    handle: ManagerHandle,
    watcher: WatcherConfig,
    shutdown_grace: Duration,
}

impl PluginManager {
    /// A builder with the kubelet's defaults.
    pub fn builder() -> PluginManagerBuilder {
        PluginManagerBuilder::default()
    }

    /// A handle to watch the manager and add handlers, valid while it runs
    /// and after.
    pub fn handle(&self) -> ManagerHandle {
        self.handle.clone()
    }

    /// Watches the registry directory and keeps plugins registered until
    /// `shutdown` completes; then stops watching and lets running operations
    /// finish within the shutdown grace period. Fails at once, without
    /// starting anything, if the directory cannot be watched.
    ///
    /// Plugins stay registered with their handlers after `run` returns, as
    /// they do when the kubelet stops: they are not told to go away.
    ///
    /// It consumes the manager, so that two reconcilers can never share
    /// the states' journals (each has one consumer).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let Self { handle, watcher, shutdown_grace } = self;
        let watcher = Watcher::start(&handle.registry_dir, Arc::clone(&handle.desired.0), watcher)
            .map_err(Error::StartWatcher)?;
        // `run` consumes the manager: the watcher starts once.
        let _ = handle.watcher_stats.set(watcher.stats());
        tracing::info!(registry = %watcher.root().display(), "plugin manager started");
        // Liveness runs until the reconciler stops; it only renews sockets.
        let liveness = async {
            match &handle.liveness {
                Some(monitor) => monitor.run(std::future::pending()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = handle.reconciler.run(shutdown) => {}
            () = liveness => {}
        }
        watcher.stop().await;
        let operations = handle.reconciler.executor().operations();
        if tokio::time::timeout(shutdown_grace, operations.wait_for_completion()).await.is_err() {
            tracing::warn!(grace = ?shutdown_grace, "operations still running at shutdown");
        }
        tracing::info!("plugin manager stopped");
        Ok(())
    }
}

/// A cheap, cloneable handle on a [`PluginManager`]: what it knows, what
/// happens, and its handlers. It cannot change the states it reports on.
#[derive(Debug, Clone)]
pub struct ManagerHandle {
    registry_dir: PathBuf,
    desired: DesiredStateView,
    actual: ActualStateView,
    reconciler: Arc<Reconciler>,
    events: EventBus,
    /// The running watcher's counters, once [`PluginManager::run`] started it.
    watcher_stats: Arc<OnceLock<WatcherStats>>,
    liveness: Option<Arc<LivenessMonitor>>,
    fd_budget: FdBudget,
}

impl ManagerHandle {
    /// The directory the manager watches.
    pub fn registry_dir(&self) -> &Path {
        &self.registry_dir
    }

    /// Adds the handler for `plugin_type`, before or while running. Plugins
    /// of that type that were waiting are registered at once.
    ///
    /// A type that has a handler (given to the builder, added before, or
    /// one a [`Kubelet`](crate::Kubelet) serves) keeps it, and this is
    /// [`Error::AddHandler`]: a replacement would never have seen the
    /// plugins registered with the first, nor could the first's views
    /// follow the new registrations.
    pub fn add_handler(
        &self,
        plugin_type: impl Into<String>,
        handler: Arc<dyn PluginHandler>,
    ) -> Result<()> {
        add_handler(&self.reconciler, plugin_type.into(), handler)
    }

    /// What registering `socket` would find now, with this manager's
    /// handlers and settings: the register operation's steps up to the
    /// handler's validation, then the handler's look at the plugin's own
    /// service, each timed. Nothing is registered, the plugin is told
    /// nothing, and no connection outlives the call; `kpm probe`,
    /// `kpm doctor` and `kpm check` judge sockets with it.
    pub async fn inspect(&self, socket: &Path) -> Inspection {
        self.reconciler.inspect(socket).await
    }

    /// Every socket that is present or registered, sorted by path.
    pub fn status(&self) -> Vec<PluginStatus> {
        status::snapshot(&self.desired.0, &self.actual.0, self.reconciler.executor().operations())
    }

    /// What happens from now on: sockets seen, plugins registered, rejected
    /// (with the reason) and deregistered, retries scheduled, and, for a
    /// [`Kubelet`](crate::Kubelet), DRA devices' health changes.
    pub fn subscribe(&self) -> broadcast::Receiver<PluginEvent> {
        self.events.subscribe()
    }

    /// Counters for metrics: registrations, rejections, deregistrations and
    /// retries, rescans of the registry directory, operations skipped while
    /// their socket was backing off, executor entries, liveness.
    pub fn stats(&self) -> ManagerStats {
        ManagerStats {
            events: self.events.counts(),
            rescans: self.watcher_stats.get().map_or(0, WatcherStats::rescans),
            backoff_skips: self.reconciler.backoff_skips(),
            operations: self.reconciler.executor().operations().len(),
            liveness: self.liveness.as_ref().map(|monitor| monitor.stats()),
        }
    }

    /// The file descriptor budget the manager's connections pay from, for
    /// its levels and counters ([`FdBudget::stats`]) and for servers of
    /// the same process to pay from.
    pub fn fd_budget(&self) -> &FdBudget {
        &self.fd_budget
    }

    /// The liveness monitor, if liveness is on.
    #[cfg(any(feature = "device", feature = "dra"))]
    pub(crate) fn liveness_monitor(&self) -> Option<&Arc<LivenessMonitor>> {
        self.liveness.as_ref()
    }

    /// The sockets present (the desired state of the world).
    pub fn desired_state(&self) -> &DesiredStateView {
        &self.desired
    }

    /// The registered plugins (the actual state of the world).
    pub fn actual_state(&self) -> &ActualStateView {
        &self.actual
    }
}
