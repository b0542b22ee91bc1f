//! [`DraManager`]: the kubelet's `DRAPluginManager` (spec C.3-C.6), split
//! by job. This module holds the manager's data (the registered instances of
//! each driver, their connections and the drivers' health streams, under
//! one lock), its creation, the kubelet's `sync` of a driver, and shutdown;
//! each job has its own child:
//!
//! - [`config`]: [`DraConfig`], checked once by [`DraManager::try_new`];
//! - [`registry`]: validate, register and deregister instances, choose the
//!   serving instance, queue the cleanup of leftovers;
//! - [`calls`]: `prepare` / `unprepare` and endpoint inspection, both
//!   service versions through one `dispatch`;
//! - [`monitor`]: the task that watches and redials an instance's
//!   connection;
//! - [`health_stream`]: which instance streams a driver's device health,
//!   and where its task puts what it receives;
//! - [`status`]: what the status API shows.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use kpm_cache::{EventBus, HandlerError, Hangups, PluginDetails, PluginHandler, ServiceReport};
use kpm_transport::Reach;
use parking_lot::Mutex;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tracing::info;

use crate::cleanup::{CleanupTimers, SliceCleanup};
use crate::connection::Connection;
use crate::error::DraConfigError;
use crate::health::{DeviceHealthTable, TimerCount};
use crate::validate::{DraService, HealthService};

mod calls;
mod config;
mod health_stream;
mod monitor;
mod registry;
mod status;

pub use calls::DraEndpointReport;
pub use config::{DEFAULT_CALL_TIMEOUT, DEFAULT_CLEANUP_GRACE, DraConfig};
pub use status::{DraDriverStatus, DraInstanceStatus};

/// The handler for `DRAPlugin` plugins and the access to DRA drivers for a
/// node agent. See the [crate docs](crate).
///
/// Create it with [`DraManager::try_new`]; its owner hands the `Arc` to the
/// plugin manager as the `DRAPlugin` handler (registrations and
/// deregistrations go only through that path), follows
/// [`hangups`](Self::hangups), calls [`clean_up_leftovers`](Self::clean_up_leftovers)
/// once at start and [`shutdown`](Self::shutdown) when done; dropping the
/// last `Arc` also stops the background tasks. Everyone else gets a
/// [`DraView`](crate::DraView) ([`view`](Self::view)): the drivers,
/// `prepare` and `unprepare`, nothing that registers. Its methods run inside
/// a tokio runtime, where its background tasks (one monitor per instance,
/// one health stream per driver, with the expiry timer of its devices'
/// health, one timer per pending cleanup) are spawned.
#[derive(Debug)]
pub struct DraManager {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    config: DraConfig,
    timers: CleanupTimers,
    state: Mutex<State>,
    /// Endpoints whose connection dropped (see [`DraManager::hangups`]).
    hangups: Hangups,
    /// What the connections to drivers pay from.
    reach: Reach,
    /// Where device health changes are published.
    events: EventBus,
    /// The armed expiry timers of the health streams.
    health_timers: TimerCount,
}

#[derive(Debug, Default)]
struct State {
    shut_down: bool,
    next_id: u64,
    /// Driver name → instances in registration order; no empty lists.
    drivers: BTreeMap<String, Vec<Arc<Instance>>>,
    /// Driver name → the health stream of its newest instance.
    health: HashMap<String, HealthStream>,
}

/// One registered instance: a (driver, endpoint) pair and its connection.
#[derive(Debug)]
struct Instance {
    id: u64,
    driver: String,
    endpoint: String,
    service: DraService,
    health_service: Option<HealthService>,
    registered_at: SystemTime,
    connection: Arc<Connection>,
    monitor: Mutex<Option<JoinHandle<()>>>,
}

/// The health stream of a driver, owned by its newest instance. A new owner
/// gets a new generation; updates of an older generation are dropped. Its
/// task also expires the devices' health.
#[derive(Debug)]
struct HealthStream {
    owner: u64,
    generation: u64,
    task: Option<JoinHandle<()>>,
    devices: DeviceHealthTable,
}

impl DraManager {
    /// A manager with no drivers, once `config` passes
    /// [`DraConfig::validate`] (then nothing checks it again). Its
    /// connections to drivers take permits of the budget of `reach`: pass
    /// the process-wide one, [`kpm_transport::fd::budget`], unless the
    /// manager must have its own (a budget alone: on the host itself).
    /// `cleanup` is called when a driver has had no
    /// connected instance for `config.cleanup_grace`. Every change of a
    /// device's health (a first report, another health, an expiry) is
    /// published on `events`, when given, as a
    /// [`PluginEvent::DraDeviceHealthChanged`](kpm_cache::PluginEvent::DraDeviceHealthChanged):
    /// kpm's facade gives it the plugin manager's bus; with `None` nobody
    /// hears of them.
    pub fn try_new(
        config: DraConfig,
        reach: impl Into<Reach>,
        cleanup: Arc<dyn SliceCleanup>,
        events: Option<EventBus>,
    ) -> Result<Arc<Self>, DraConfigError> {
        config.validate()?;
        let timers = CleanupTimers::new(config.cleanup_grace, cleanup);
        Ok(Arc::new(Self {
            shared: Arc::new(Shared {
                config,
                timers,
                state: Mutex::new(State::default()),
                hangups: Hangups::default(),
                reach: reach.into(),
                // Nobody listens: the changes are only counted.
                events: events.unwrap_or_else(|| EventBus::new(1)),
                health_timers: TimerCount::default(),
            }),
        }))
    }

    /// The manager's settings.
    pub fn config(&self) -> &DraConfig {
        &self.shared.config
    }

    /// How many drivers have their device health expiry timer armed (one
    /// at most each, while a device's health is due to expire): none for a
    /// driver without a health stream or without devices. A stream's timer
    /// counts until its task is dropped, soon after its owner changes.
    /// For tests only (feature `testing`).
    #[cfg(any(test, feature = "testing"))]
    pub fn health_timers(&self) -> usize {
        self.shared.health_timers.get()
    }

    /// The endpoints of registered instances whose connection dropped: hints
    /// for liveness (see [`Hangups`]).
    pub fn hangups(&self) -> broadcast::Receiver<PathBuf> {
        self.shared.hangups.subscribe()
    }

    /// Stops the monitors and health streams, cancels the pending cleanups
    /// (and one running) and closes the connections. Later
    /// registrations and calls fail with [`DraError::ShutDown`](crate::DraError::ShutDown).
    pub async fn shutdown(&self) {
        let (tasks, instances) = self.shared.stop();
        for task in tasks {
            // Aborted: the result is a cancellation error.
            let _ = task.await;
        }
        drop(instances);
        info!("DRA driver manager shut down");
    }
}

impl Drop for DraManager {
    fn drop(&mut self) {
        // Aborted tasks stop at their next await; nothing to wait for here.
        let _ = self.shared.stop();
    }
}

impl Shared {
    /// The kubelet's `sync(driver)`, plus the health stream's owner: with an
    /// instance connected any pending cleanup is cancelled, with none one is
    /// queued (a queued one keeps its time); the newest instance owns the
    /// health stream.
    fn sync(self: &Arc<Self>, state: &mut State, driver: &str) {
        let any_connected = state
            .drivers
            .get(driver)
            .is_some_and(|instances| instances.iter().any(|i| i.connection.is_connected()));
        self.timers.update(driver, any_connected);
        self.update_health(state, driver);
    }

    /// Marks the manager shut down and takes everything out: the tasks to
    /// wait for (already aborted) and the instances to drop.
    fn stop(&self) -> (Vec<JoinHandle<()>>, Vec<Arc<Instance>>) {
        let mut state = self.state.lock();
        state.shut_down = true;
        self.timers.cancel_all();
        let mut tasks = Vec::new();
        let instances: Vec<Arc<Instance>> =
            std::mem::take(&mut state.drivers).into_values().flatten().collect();
        for instance in &instances {
            tasks.extend(instance.monitor.lock().take());
        }
        for stream in std::mem::take(&mut state.health).into_values() {
            tasks.extend(stream.task);
        }
        for task in &tasks {
            task.abort();
        }
        (tasks, instances)
    }
}

#[async_trait]
impl PluginHandler for DraManager {
    async fn validate(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        Ok(self.validate_plugin(&plugin.name, &plugin.endpoint.target(), &plugin.versions)?)
    }

    async fn register(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let endpoint = plugin.endpoint.target();
        Ok(self.register_plugin(&plugin.name, &endpoint, &plugin.versions).await?)
    }

    async fn deregister(&self, plugin: &PluginDetails) {
        self.deregister_plugin(&plugin.name, &plugin.endpoint.target());
    }

    /// Its negotiated service answers ([`DraManager::inspect_endpoint`]).
    async fn inspect(
        &self,
        plugin: &PluginDetails,
    ) -> Result<Option<Box<dyn ServiceReport>>, HandlerError> {
        let endpoint = plugin.endpoint.target();
        let report = self.inspect_endpoint(&plugin.name, &endpoint, &plugin.versions);
        Ok(Some(Box::new(report.await?)))
    }
}
