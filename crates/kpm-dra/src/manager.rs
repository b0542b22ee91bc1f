//! [`DraManager`]: the kubelet's `DRAPluginManager` (spec C.3-C.6). The
//! registered instances of each driver, one monitored connection per
//! instance, the cleanup timers, the health streams, and the consumer API
//! (`prepare` / `unprepare`) on the serving instance.

use kpm_api::config::check_durations;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use kpm_api::dra::{v1, v1beta1};
use kpm_api::gotext::error_chain;
use kpm_cache::{EventBus, HandlerError, Hangups, PluginDetails, PluginHandler, ServiceReport};
use kpm_transport::fd::FdBudget;
use parking_lot::Mutex;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tracing::{debug, info, trace};

use crate::cleanup::{CleanupTimers, SliceCleanup};
use crate::connection::{Connection, RECONNECT_INTERVAL};
use crate::convert;
use crate::error::{DraError, deadline_exceeded};
use crate::health::{
    self, DeviceHealthSink, DeviceHealthStatus, DeviceHealthTable, Report, TimerCount,
};
use crate::validate::{DraService, HealthService, choose_service, validate_plugin};

/// The kubelet's `defaultClientCallTimeout`: how long `NodePrepareResources`
/// and `NodeUnprepareResources` may take.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(45);

/// The kubelet's `defaultWipingDelay`: how long a driver may have no
/// connected instance before its resources are cleaned up.
pub const DEFAULT_CLEANUP_GRACE: Duration = Duration::from_secs(30);

/// Settings of the [`DraManager`]. Both durations are at most
/// [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION) (365 days), the call timeout non-zero; see
/// [`validate`](Self::validate). Build it from [`Default`] with the setters;
/// the fields are public to read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DraConfig {
    /// The deadline of each `prepare` / `unprepare` call. Default
    /// [`DEFAULT_CALL_TIMEOUT`] (45 s), as in the kubelet.
    pub call_timeout: Duration,
    /// How long a driver may have no connected instance before
    /// [`SliceCleanup::wipe_driver`] runs. Default [`DEFAULT_CLEANUP_GRACE`]
    /// (30 s), as in the kubelet.
    pub cleanup_grace: Duration,
    /// When set, endpoints must clean (lexically) to a path inside this
    /// directory, the node agent's root (`kpm run` passes its `--root-dir`).
    /// `None` accepts any absolute endpoint.
    pub root_dir: Option<PathBuf>,
}

impl Default for DraConfig {
    fn default() -> Self {
        Self {
            call_timeout: DEFAULT_CALL_TIMEOUT,
            cleanup_grace: DEFAULT_CLEANUP_GRACE,
            root_dir: None,
        }
    }
}

impl DraConfig {
    /// Sets [`call_timeout`](Self::call_timeout) (default
    /// [`DEFAULT_CALL_TIMEOUT`], 45 s).
    #[must_use]
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets [`cleanup_grace`](Self::cleanup_grace) (default
    /// [`DEFAULT_CLEANUP_GRACE`], 30 s).
    #[must_use]
    pub fn cleanup_grace(mut self, grace: Duration) -> Self {
        self.cleanup_grace = grace;
        self
    }

    /// Sets [`root_dir`](Self::root_dir) (default `None`: any absolute
    /// endpoint).
    #[must_use]
    pub fn root_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.root_dir = dir;
        self
    }

    /// Checks the durations: `call_timeout` non-zero (a zero deadline fails
    /// every call) and at most [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION), `cleanup_grace` at
    /// most that (zero: a driver's resources are cleaned up as soon as its
    /// last instance goes).
    ///
    /// Registering a plugin checks it too: with a config that does
    /// not pass, no driver is registered, so no call or timer ever uses it.
    pub fn validate(&self) -> Result<(), DraError> {
        let timeouts = [("call_timeout", self.call_timeout)];
        Ok(check_durations(&timeouts, &[("cleanup_grace", self.cleanup_grace)])?)
    }
}

/// One registered DRA driver, for the status API.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DraDriverStatus {
    /// The driver name.
    pub name: String,
    /// Its registered instances, in registration order (the last one is the
    /// newest). Empty while a cleanup is pending after the last instance
    /// was deregistered.
    pub instances: Vec<DraInstanceStatus>,
    /// When the driver's resources are cleaned up if no instance connects
    /// before; `None` while an instance is connected.
    #[cfg_attr(feature = "serde", serde(serialize_with = "kpm_api::json::rfc3339_opt"))]
    pub cleanup_pending_until: Option<SystemTime>,
    /// The device health last streamed by the newest instance, sorted by
    /// pool and device, `Unknown` where a report expired; empty if it has
    /// no health service.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Vec::is_empty"))]
    pub devices: Vec<DeviceHealthStatus>,
}

/// One registered instance of a DRA driver, for the status API.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DraInstanceStatus {
    /// The instance's service socket.
    pub endpoint: String,
    /// The DRA service it is called on: `v1.DRAPlugin` or `v1beta1.DRAPlugin`.
    pub version: String,
    /// Whether its connection is up.
    pub connected: bool,
    /// When it was registered.
    #[cfg_attr(feature = "serde", serde(serialize_with = "kpm_api::json::rfc3339"))]
    pub registered_at: SystemTime,
    /// The health service it advertised, if any: `v1.DRAResourceHealth` or
    /// `v1alpha1.DRAResourceHealth`. Not in the status API.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub health_service: Option<String>,
}

/// The handler for `DRAPlugin` plugins and the access to DRA drivers for a
/// node agent. See the [crate docs](crate).
///
/// Create it with [`DraManager::new`]; its owner hands the `Arc` to the
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
    budget: FdBudget,
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
    /// A manager with no drivers. `cleanup` is called when a driver has had
    /// no connected instance for `config.cleanup_grace`.
    pub fn new(config: DraConfig, cleanup: Arc<dyn SliceCleanup>) -> Arc<Self> {
        Self::with_fd_budget(config, cleanup, kpm_transport::fd::budget().clone())
    }

    /// Like [`new`](Self::new), the connections to drivers taking permits of
    /// `budget` instead of the process-wide
    /// [fd budget](kpm_transport::fd::budget).
    pub fn with_fd_budget(
        config: DraConfig,
        cleanup: Arc<dyn SliceCleanup>,
        budget: FdBudget,
    ) -> Arc<Self> {
        // Nobody listens: the changes are only counted.
        Self::with_events(config, cleanup, budget, EventBus::new(1))
    }

    /// Like [`with_fd_budget`](Self::with_fd_budget), publishing every change
    /// of a device's health (a first report, another health, an expiry) on
    /// `events` as a [`PluginEvent::DeviceHealthChanged`](kpm_cache::PluginEvent::DeviceHealthChanged):
    /// kpm's facade gives it the plugin manager's bus.
    pub fn with_events(
        config: DraConfig,
        cleanup: Arc<dyn SliceCleanup>,
        budget: FdBudget,
        events: EventBus,
    ) -> Arc<Self> {
        let timers = CleanupTimers::new(config.cleanup_grace, cleanup);
        Arc::new(Self {
            shared: Arc::new(Shared {
                config,
                timers,
                state: Mutex::new(State::default()),
                hangups: Hangups::default(),
                budget,
                events,
                health_timers: TimerCount::default(),
            }),
        })
    }

    /// The manager's settings.
    pub fn config(&self) -> &DraConfig {
        &self.shared.config
    }

    /// How many drivers have their device health expiry timer armed (one
    /// at most each, while a device's health is due to expire): none for a
    /// driver without a health stream or without devices. A stream's timer
    /// counts until its task is dropped, soon after its owner changes.
    pub fn health_timers(&self) -> usize {
        self.shared.health_timers.get()
    }

    /// The endpoints of registered instances whose connection dropped: hints
    /// for liveness (see [`Hangups`]).
    pub fn hangups(&self) -> broadcast::Receiver<PathBuf> {
        self.shared.hangups.subscribe()
    }

    /// `ValidatePlugin`: the driver name, the endpoint and the advertised
    /// services. No side effects.
    pub fn validate_plugin(
        &self,
        driver: &str,
        endpoint: &str,
        services: &[String],
    ) -> Result<(), DraError> {
        debug!(driver, endpoint, services = services.join(","), "validating DRA driver plugin");
        validate_plugin(driver, endpoint, services, self.root_dir())?;
        Ok(())
    }

    /// `RegisterPlugin`: validates again, dials the endpoint (a failure is
    /// not an error: the instance starts disconnected and its monitor keeps
    /// trying), adds the instance after the driver's others, starts its
    /// monitor and updates the driver's cleanup and health stream. Refused
    /// with [`DraError::InvalidConfig`] when the manager's config does not
    /// pass [`DraConfig::validate`].
    pub(crate) async fn register_plugin(
        &self,
        driver: &str,
        endpoint: &str,
        services: &[String],
    ) -> Result<(), DraError> {
        self.shared.config.validate()?;
        let (service, health_service) =
            validate_plugin(driver, endpoint, services, self.root_dir())?;
        self.shared.state.lock().check_can_add(driver, endpoint)?;

        let connection = Arc::new(Connection::new(Path::new(endpoint), self.shared.budget.clone()));
        match connection.reconnect().await {
            Ok(true) => {}
            Ok(false) => {
                info!(
                    driver,
                    endpoint, "the DRA driver plugin accepted the connection but sent nothing yet"
                );
            }
            Err(err) => {
                info!(
                    driver,
                    endpoint,
                    error = error_chain(&err),
                    "cannot connect to the DRA driver plugin yet; will keep trying"
                );
            }
        }

        let shared = &self.shared;
        let mut state = shared.state.lock();
        state.check_can_add(driver, endpoint)?;
        state.next_id += 1;
        let connected = connection.is_connected();
        let instance = Arc::new(Instance {
            id: state.next_id,
            driver: driver.to_owned(),
            endpoint: endpoint.to_owned(),
            service,
            health_service,
            registered_at: SystemTime::now(),
            connection,
            monitor: Mutex::new(None),
        });
        let instances = state.drivers.entry(driver.to_owned()).or_default();
        instances.push(Arc::clone(&instance));
        let count = instances.len();
        *instance.monitor.lock() =
            crate::spawn(monitor(Arc::downgrade(shared), Arc::clone(&instance), connected));
        info!(
            driver,
            endpoint,
            %service,
            health_service = health_service.map(HealthService::as_str),
            connected,
            instances = count,
            "registered DRA driver plugin"
        );
        shared.sync(&mut state, driver);
        Ok(())
    }

    /// `DeRegisterPlugin`: removes the instance at `endpoint` only (a no-op
    /// if there is none), stops its monitor and updates the driver's
    /// cleanup and health stream; its connection is closed.
    pub(crate) fn deregister_plugin(&self, driver: &str, endpoint: &str) {
        let removed = {
            let mut state = self.shared.state.lock();
            let Some(instances) = state.drivers.get_mut(driver) else {
                debug!(driver, endpoint, "DRA driver is not registered; nothing to deregister");
                return;
            };
            let Some(index) = instances.iter().position(|i| i.endpoint == endpoint) else {
                debug!(
                    driver,
                    endpoint,
                    "DRA driver is not registered at this endpoint; nothing to deregister"
                );
                return;
            };
            let removed = instances.remove(index);
            let remaining = instances.len();
            if remaining == 0 {
                state.drivers.remove(driver);
            }
            if let Some(monitor) = removed.monitor.lock().take() {
                monitor.abort();
            }
            info!(driver, endpoint, remaining, "deregistered DRA driver plugin");
            if !state.shut_down {
                self.shared.sync(&mut state, driver);
            }
            removed
        };
        // Closes the connection (once no call in flight uses it), outside the lock.
        drop(removed);
    }

    /// The registered drivers, sorted by name, including drivers without
    /// instances whose cleanup is still pending.
    pub fn drivers(&self) -> Vec<DraDriverStatus> {
        let state = self.shared.state.lock();
        let pending = self.shared.timers.pending_drivers();
        let names: BTreeSet<&str> = state
            .drivers
            .keys()
            .map(String::as_str)
            .chain(pending.iter().map(String::as_str))
            .collect();
        names
            .into_iter()
            .map(|name| DraDriverStatus {
                name: name.to_owned(),
                instances: state
                    .drivers
                    .get(name)
                    .map(|instances| instances.iter().map(|i| i.status()).collect())
                    .unwrap_or_default(),
                cleanup_pending_until: self.shared.timers.pending_until(name),
                devices: state
                    .health
                    .get(name)
                    .map(|stream| stream.devices.statuses())
                    .unwrap_or_default(),
            })
            .collect()
    }

    /// Calls `NodePrepareResources` on the serving instance of `driver` (the
    /// newest connected one, else the newest) with its negotiated service,
    /// within [`DraConfig::call_timeout`].
    pub async fn prepare(
        &self,
        driver: &str,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::NodePrepareResourcesResponse, DraError> {
        let instance = self.serving(driver)?;
        let (endpoint, service) = (instance.endpoint.clone(), instance.service);
        debug!(driver, endpoint, claims = claims.len(), "NodePrepareResources");
        self.node_prepare(driver, endpoint, service, instance.connection.channel(), claims).await
    }

    /// What registering the DRA driver `driver` at `endpoint` would see,
    /// read-only: the service it would be called with (negotiated from
    /// `services`) answers `NodePrepareResources` with no claims, which
    /// prepares nothing. The connection is closed afterwards.
    pub async fn inspect_endpoint(
        &self,
        driver: &str,
        endpoint: &str,
        services: &[String],
    ) -> Result<DraEndpointReport, DraError> {
        self.shared.config.validate()?;
        let service = choose_service(services)?;
        let connection = Connection::new(Path::new(endpoint), self.shared.budget.clone());
        connection.reconnect().await.map_err(|source| DraError::Connect {
            driver: driver.to_owned(),
            endpoint: endpoint.to_owned(),
            source,
        })?;
        let channel = connection.channel();
        self.node_prepare(driver, endpoint.to_owned(), service, channel, Vec::new()).await?;
        Ok(DraEndpointReport { service })
    }

    /// `NodePrepareResources` of `claims` on `channel` with `service`,
    /// within [`DraConfig::call_timeout`].
    async fn node_prepare(
        &self,
        driver: &str,
        endpoint: String,
        service: DraService,
        channel: Result<kpm_transport::UdsChannel, tonic::Status>,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::NodePrepareResourcesResponse, DraError> {
        let timeout = self.shared.config.call_timeout;
        let call = async move {
            let channel = channel?;
            match service {
                DraService::V1 => {
                    let request = kpm_transport::timed_request(
                        v1::NodePrepareResourcesRequest { claims },
                        timeout,
                    );
                    v1::dra_plugin_client::DraPluginClient::new(channel)
                        .max_decoding_message_size(kpm_api::constants::MAX_PLUGIN_MESSAGE_BYTES)
                        .node_prepare_resources(request)
                        .await
                        .map(tonic::Response::into_inner)
                }
                DraService::V1beta1 => {
                    let request =
                        kpm_transport::timed_request(convert::prepare_request(claims), timeout);
                    v1beta1::dra_plugin_client::DraPluginClient::new(channel)
                        .max_decoding_message_size(kpm_api::constants::MAX_PLUGIN_MESSAGE_BYTES)
                        .node_prepare_resources(request)
                        .await
                        .map(|response| convert::prepare_response(response.into_inner()))
                }
            }
        };
        call_with_deadline(call, timeout).await.map_err(|status| DraError::NodePrepareResources {
            driver: driver.to_owned(),
            endpoint,
            method: service.prepare_method(),
            status,
        })
    }

    /// Calls `NodeUnprepareResources` on the serving instance of `driver`,
    /// as [`DraManager::prepare`] does.
    pub async fn unprepare(
        &self,
        driver: &str,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::NodeUnprepareResourcesResponse, DraError> {
        let instance = self.serving(driver)?;
        let timeout = self.shared.config.call_timeout;
        let channel = instance.connection.channel();
        let (endpoint, service) = (instance.endpoint.clone(), instance.service);
        debug!(driver, endpoint, claims = claims.len(), "NodeUnprepareResources");
        let call = async move {
            let channel = channel?;
            match service {
                DraService::V1 => {
                    let request = kpm_transport::timed_request(
                        v1::NodeUnprepareResourcesRequest { claims },
                        timeout,
                    );
                    v1::dra_plugin_client::DraPluginClient::new(channel)
                        .max_decoding_message_size(kpm_api::constants::MAX_PLUGIN_MESSAGE_BYTES)
                        .node_unprepare_resources(request)
                        .await
                        .map(tonic::Response::into_inner)
                }
                DraService::V1beta1 => {
                    let request =
                        kpm_transport::timed_request(convert::unprepare_request(claims), timeout);
                    v1beta1::dra_plugin_client::DraPluginClient::new(channel)
                        .max_decoding_message_size(kpm_api::constants::MAX_PLUGIN_MESSAGE_BYTES)
                        .node_unprepare_resources(request)
                        .await
                        .map(|response| convert::unprepare_response(response.into_inner()))
                }
            }
        };
        call_with_deadline(call, timeout).await.map_err(|status| DraError::NodeUnprepareResources {
            driver: driver.to_owned(),
            endpoint,
            method: service.unprepare_method(),
            status,
        })
    }

    /// The kubelet wipes all of the node's ResourceSlices when it starts;
    /// kpm gives their drivers the grace period first: it asks the cleanup
    /// which drivers have published resources for this node and queues the
    /// cleanup of each one that has not registered, so that a driver
    /// registering within the grace period keeps its slices. Call it once,
    /// at start, within a tokio runtime (`Kubelet::run` does).
    pub async fn clean_up_leftovers(&self) {
        let drivers = self.shared.timers.cleanup().published_drivers().await;
        let state = self.shared.state.lock();
        if state.shut_down {
            return;
        }
        for driver in drivers.iter().filter(|driver| !state.drivers.contains_key(*driver)) {
            info!(driver, "the DRA driver has resources on this node but is not registered");
            self.shared.timers.update(driver, false);
        }
    }

    /// Stops the monitors and health streams, cancels the pending cleanups
    /// (and one running) and closes the connections. Later
    /// registrations and calls fail with [`DraError::ShutDown`].
    pub async fn shutdown(&self) {
        let (tasks, instances) = self.shared.stop();
        for task in tasks {
            // Aborted: the result is a cancellation error.
            let _ = task.await;
        }
        drop(instances);
        info!("DRA driver manager shut down");
    }

    /// `GetPlugin`: the instance calls go to.
    fn serving(&self, driver: &str) -> Result<Arc<Instance>, DraError> {
        if driver.is_empty() {
            return Err(DraError::EmptyDriverName);
        }
        let state = self.shared.state.lock();
        if state.shut_down {
            return Err(DraError::ShutDown);
        }
        let instances = state
            .drivers
            .get(driver)
            .ok_or_else(|| DraError::NotRegistered { driver: driver.to_owned() })?;
        // The newest connected instance, else the newest. After a restart of
        // the node agent the registration order is random; usually the
        // newest is the most recently started.
        let serving = instances
            .iter()
            .rev()
            .find(|instance| instance.connection.is_connected())
            .or_else(|| instances.last())
            .cloned()
            .ok_or_else(|| DraError::NotRegistered { driver: driver.to_owned() })?;
        trace!(driver, endpoint = serving.endpoint, "serving DRA driver instance");
        Ok(serving)
    }

    fn root_dir(&self) -> Option<&Path> {
        self.shared.config.root_dir.as_deref()
    }
}

impl Drop for DraManager {
    fn drop(&mut self) {
        // Aborted tasks stop at their next await; nothing to wait for here.
        let _ = self.shared.stop();
    }
}

impl State {
    /// The manager takes registrations and this (driver, endpoint) is new.
    fn check_can_add(&self, driver: &str, endpoint: &str) -> Result<(), DraError> {
        let state = self;
        if state.shut_down {
            return Err(DraError::ShutDown);
        }
        let taken = state
            .drivers
            .get(driver)
            .is_some_and(|instances| instances.iter().any(|i| i.endpoint == endpoint));
        if taken {
            return Err(DraError::AlreadyRegistered {
                driver: driver.to_owned(),
                endpoint: endpoint.to_owned(),
            });
        }
        Ok(())
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

    /// Hands the driver's health stream to its newest instance: a new
    /// generation streams from it if it has a health service (the devices
    /// seen so far stay until it reports, and expire as they would have);
    /// without one, or without instances, the devices are dropped, and
    /// with them their expiry timer. There is no fallback to an older
    /// instance's health service.
    fn update_health(self: &Arc<Self>, state: &mut State, driver: &str) {
        let newest = state.drivers.get(driver).and_then(|instances| instances.last()).cloned();
        let Some(newest) = newest else {
            if let Some(stream) = state.health.remove(driver)
                && let Some(task) = stream.task
            {
                task.abort();
            }
            return;
        };
        if state.health.get(driver).is_some_and(|stream| stream.owner == newest.id) {
            return;
        }
        let (generation, devices) = match state.health.remove(driver) {
            Some(old) => {
                if let Some(task) = old.task {
                    task.abort();
                }
                (old.generation + 1, old.devices)
            }
            None => (1, DeviceHealthTable::default()),
        };
        let stream = match newest.health_service {
            Some(service) => {
                debug!(driver, endpoint = newest.endpoint, %service, generation, "streaming device health");
                let sink = HealthSink {
                    shared: Arc::downgrade(self),
                    driver: driver.to_owned(),
                    generation,
                };
                let task = crate::spawn(health::watch(
                    newest.driver.clone(),
                    newest.endpoint.clone(),
                    service,
                    Arc::clone(&newest.connection),
                    sink,
                    self.health_timers.clone(),
                ));
                HealthStream { owner: newest.id, generation, task, devices }
            }
            None => HealthStream {
                owner: newest.id,
                generation,
                task: None,
                devices: DeviceHealthTable::default(),
            },
        };
        state.health.insert(driver.to_owned(), stream);
    }

    /// A monitor saw the instance's connection come or go.
    fn connection_changed(self: &Arc<Self>, instance: &Instance, connected: bool) {
        let mut state = self.state.lock();
        let registered = state
            .drivers
            .get(&instance.driver)
            .is_some_and(|instances| instances.iter().any(|i| i.id == instance.id));
        if state.shut_down || !registered {
            return;
        }
        let (driver, endpoint) = (instance.driver.as_str(), instance.endpoint.as_str());
        if connected {
            info!(driver, endpoint, "connected to DRA driver plugin");
        } else {
            info!(driver, endpoint, "lost the connection to DRA driver plugin");
            self.hangups.report(endpoint);
        }
        self.sync(&mut state, driver);
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

/// The devices of one generation of a driver's health stream, as its task
/// sees them: reports and expiries of an older generation change nothing.
#[derive(Debug)]
struct HealthSink {
    shared: Weak<Shared>,
    driver: String,
    generation: u64,
}

impl HealthSink {
    /// Applies `change` to the devices, if this generation still owns them,
    /// and publishes its events (under the lock, so in order); the earliest
    /// deadline afterwards.
    fn apply(
        &self,
        change: impl FnOnce(&mut DeviceHealthTable, &str) -> Vec<kpm_cache::PluginEvent>,
    ) -> Option<tokio::time::Instant> {
        let shared = self.shared.upgrade()?;
        let mut state = shared.state.lock();
        let stream = state
            .health
            .get_mut(&self.driver)
            .filter(|stream| stream.generation == self.generation)?;
        for event in change(&mut stream.devices, &self.driver) {
            shared.events.publish(event);
        }
        stream.devices.next_deadline()
    }
}

impl DeviceHealthSink for HealthSink {
    fn report(&self, devices: Vec<Report>) -> Option<tokio::time::Instant> {
        let (now, wall) = (tokio::time::Instant::now(), SystemTime::now());
        self.apply(|table, driver| table.report(driver, devices, now, wall))
    }

    fn expire(&self) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        self.apply(|table, driver| table.expire(driver, now))
    }

    fn next_deadline(&self) -> Option<tokio::time::Instant> {
        self.apply(|_, _| Vec::new())
    }
}

impl Instance {
    fn status(&self) -> DraInstanceStatus {
        DraInstanceStatus {
            endpoint: self.endpoint.clone(),
            version: self.service.as_str().to_owned(),
            connected: self.connection.is_connected(),
            registered_at: self.registered_at,
            health_service: self.health_service.map(|service| service.as_str().to_owned()),
        }
    }
}

/// Watches one instance's connection: reports every change to the manager
/// (which re-syncs the driver) and, while it is down, dials again every
/// [`RECONNECT_INTERVAL`]. `reported` is the state the registration synced.
async fn monitor(shared: Weak<Shared>, instance: Arc<Instance>, reported: bool) {
    let mut live = instance.connection.subscribe();
    let mut reported = reported;
    let mut failures: u64 = 0;
    loop {
        let connected = *live.borrow_and_update() > 0;
        if connected != reported {
            reported = connected;
            let Some(shared) = shared.upgrade() else { return };
            shared.connection_changed(&instance, connected);
        }
        if connected {
            failures = 0;
            if live.changed().await.is_err() {
                return;
            }
            continue;
        }
        let (driver, endpoint) = (instance.driver.as_str(), instance.endpoint.as_str());
        match instance.connection.reconnect().await {
            Ok(true) => continue,
            Ok(false) => {
                debug!(driver, endpoint, "reconnected, but the DRA driver plugin sent nothing");
            }
            Err(error) if failures == 0 => {
                debug!(
                    driver,
                    endpoint,
                    error = error_chain(&error),
                    "reconnecting failed; retrying"
                );
            }
            Err(error) => {
                trace!(
                    driver,
                    endpoint,
                    error = error_chain(&error),
                    "reconnecting failed; retrying"
                );
            }
        }
        failures += 1;
        tokio::time::sleep(RECONNECT_INTERVAL).await;
    }
}

/// Runs `call`, failing with `DeadlineExceeded` when it does not finish
/// within `timeout` (see [`kpm_transport::timed_call`]).
async fn call_with_deadline<T>(
    call: impl Future<Output = Result<T, tonic::Status>>,
    timeout: Duration,
) -> Result<T, tonic::Status> {
    kpm_transport::timed_call(timeout, call).await.map_err(|failed| match failed {
        kpm_transport::TimedCallError::Failed(status) => status,
        kpm_transport::TimedCallError::TimedOut => deadline_exceeded(timeout),
    })
}

#[async_trait]
impl PluginHandler for DraManager {
    async fn validate(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let (name, endpoint, versions) =
            (plugin.name.as_str(), plugin.endpoint.as_str(), plugin.versions.as_slice());
        Ok(self.validate_plugin(name, endpoint, versions)?)
    }

    async fn register(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let (name, endpoint, versions) =
            (plugin.name.as_str(), plugin.endpoint.as_str(), plugin.versions.as_slice());
        Ok(self.register_plugin(name, endpoint, versions).await?)
    }

    async fn deregister(&self, plugin: &PluginDetails) {
        let (name, endpoint) = (plugin.name.as_str(), plugin.endpoint.as_str());
        self.deregister_plugin(name, endpoint);
    }

    /// Its negotiated service answers ([`DraManager::inspect_endpoint`]).
    async fn inspect(
        &self,
        plugin: &PluginDetails,
    ) -> Result<Option<Box<dyn ServiceReport>>, HandlerError> {
        let (name, endpoint, versions) =
            (plugin.name.as_str(), plugin.endpoint.as_str(), plugin.versions.as_slice());
        Ok(Some(Box::new(self.inspect_endpoint(name, endpoint, versions).await?)))
    }
}

/// What a DRA driver's endpoint answered ([`DraManager::inspect_endpoint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DraEndpointReport {
    /// The service it is called with.
    pub service: DraService,
}

/// `SERVICE answers NodePrepareResources (no claims)`.
impl std::fmt::Display for DraEndpointReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} answers NodePrepareResources (no claims)", self.service)
    }
}
