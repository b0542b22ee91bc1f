//! The device manager: one current endpoint per resource, the devices its
//! `ListAndWatch` stream reports, the grace period after it goes, and the
//! calls node agents make on it.
//!
//! Every endpoint connection gets an id. Everything that happens to an
//! endpoint later (a `ListAndWatch` update, the end of its stream, a grace
//! timer) carries that id and is dropped if the resource's current endpoint
//! has another: a late event of a replaced endpoint never touches its
//! successor. A deregistration carries what the plugin manager knows, the
//! (resource, socket) pair, and only acts if the current endpoint is that
//! socket.

use kpm_api::config::check_durations;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use kpm_api::constants::{DEVICE_HEALTHY, DEVICE_UNHEALTHY};
use kpm_api::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use kpm_api::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreferredAllocationRequest, PreferredAllocationResponse,
    RegisterRequest,
};
use kpm_cache::{HandlerError, Hangups, PluginHandler, ServiceReport};
use parking_lot::Mutex;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::error::{DeviceError, go_code_name};
use crate::validation::{validate_plugin, validate_register_request};
use kpm_api::FileId;
use kpm_transport as uds;
use kpm_transport::fd::FdBudget;
use kpm_transport::{Dialer, UdsChannel};

/// The gRPC path of `v1beta1.DevicePlugin/ListAndWatch`.
const LIST_AND_WATCH: &str = "/v1beta1.DevicePlugin/ListAndWatch";

/// The kubelet's dial timeout for device plugins.
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The kubelet's `endpointStopGracePeriod`: how long a resource whose
/// endpoint went away is kept (with unhealthy devices) before it is removed.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);
/// How long `GetDevicePluginOptions`, `Allocate` and
/// `GetPreferredAllocation` may take.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The kubelet's `KubeletPreStartContainerRPCTimeoutInSecs`.
pub const DEFAULT_PRE_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings of the [`DeviceManager`]. Every duration is at most
/// [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION) (365 days) and the timeouts are non-zero; see
/// [`validate`](Self::validate). Build it from [`Default`] with the setters;
/// the fields are public to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceConfig {
    /// How long connecting to a plugin's socket may take. Default 10 s.
    pub dial_timeout: Duration,
    /// How long a resource whose endpoint went away is kept, its devices
    /// unhealthy, before it is removed. Default 5 min, as in the kubelet.
    pub grace_period: Duration,
    /// How long `GetDevicePluginOptions` (at registration), `Allocate` and
    /// `GetPreferredAllocation` may take. Default 30 s.
    pub call_timeout: Duration,
    /// How long `PreStartContainer` may take. Default 30 s, as in the kubelet.
    pub pre_start_timeout: Duration,
    /// How long a client of `kubelet.sock` may take to send its HTTP/2
    /// preface before its connection is closed. Default 10 s.
    pub handshake_timeout: Duration,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            dial_timeout: DEFAULT_DIAL_TIMEOUT,
            grace_period: DEFAULT_GRACE_PERIOD,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            pre_start_timeout: DEFAULT_PRE_START_TIMEOUT,
            handshake_timeout: uds::DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

impl DeviceConfig {
    /// Sets [`dial_timeout`](Self::dial_timeout) (default
    /// [`DEFAULT_DIAL_TIMEOUT`], 10 s).
    #[must_use]
    pub fn dial_timeout(mut self, timeout: Duration) -> Self {
        self.dial_timeout = timeout;
        self
    }

    /// Sets [`grace_period`](Self::grace_period) (default
    /// [`DEFAULT_GRACE_PERIOD`], 5 min).
    #[must_use]
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.grace_period = grace;
        self
    }

    /// Sets [`call_timeout`](Self::call_timeout) (default
    /// [`DEFAULT_CALL_TIMEOUT`], 30 s).
    #[must_use]
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets [`pre_start_timeout`](Self::pre_start_timeout) (default
    /// [`DEFAULT_PRE_START_TIMEOUT`], 30 s).
    #[must_use]
    pub fn pre_start_timeout(mut self, timeout: Duration) -> Self {
        self.pre_start_timeout = timeout;
        self
    }

    /// Sets [`handshake_timeout`](Self::handshake_timeout) (default
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`](kpm_transport::DEFAULT_HANDSHAKE_TIMEOUT), 10 s).
    #[must_use]
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Checks the ranges: the four timeouts non-zero (a zero deadline fails
    /// every call) and at most [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION), `grace_period` at most
    /// that (zero: a resource is removed as soon as its endpoint goes).
    ///
    /// Connecting an endpoint checks it too: with a config that does not
    /// pass, no endpoint is connected, so no call or timer ever uses it.
    pub fn validate(&self) -> Result<(), DeviceError> {
        let timeouts = [
            ("dial_timeout", self.dial_timeout),
            ("call_timeout", self.call_timeout),
            ("pre_start_timeout", self.pre_start_timeout),
            ("handshake_timeout", self.handshake_timeout),
        ];
        Ok(check_durations(&timeouts, &[("grace_period", self.grace_period)])?)
    }
}

/// A resource as the device manager sees it: its current endpoint and its
/// devices. Capacity is `healthy + unhealthy`, allocatable is `healthy`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ResourceStatus {
    /// The extended resource name, e.g. `vendor.com/gpu`.
    pub resource: String,
    /// The socket path of the current endpoint; empty if its endpoint went
    /// away (then `removal_at` is set) or after shutdown.
    pub endpoint: String,
    /// Devices reported `Healthy`.
    pub healthy: usize,
    /// Every other device.
    pub unhealthy: usize,
    /// The devices, sorted by id.
    pub devices: Vec<DeviceStatus>,
    /// When the resource will be removed, while in the grace period after
    /// its endpoint went away.
    #[cfg_attr(
        feature = "serde",
        serde(
            skip_serializing_if = "Option::is_none",
            serialize_with = "kpm_api::json::rfc3339_opt"
        )
    )]
    pub removal_at: Option<SystemTime>,
}

/// One device of a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DeviceStatus {
    /// The device id the plugin reported.
    pub id: String,
    /// `Healthy`, `Unhealthy`, or whatever else the plugin reported (which
    /// counts as unhealthy). All devices become `Unhealthy` when the
    /// endpoint goes away.
    pub health: String,
    /// The NUMA nodes of the device's topology, sorted. Not in the status API.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub numa_nodes: Vec<i64>,
}

/// The device-plugin handler and manager. Shared as `Arc<DeviceManager>` by
/// its owner: the plugin-watcher path calls it as a [`PluginHandler`],
/// [`serve_registration`](Self::serve_registration) serves `kubelet.sock`,
/// [`shutdown`](Self::shutdown) closes the endpoints. Everyone else gets a
/// [`DeviceView`](crate::DeviceView) ([`view`](Self::view)): they read
/// [`resources`](Self::resources) and call [`allocate`](Self::allocate) and
/// friends, but cannot register or deregister. See the [crate docs](crate).
#[derive(Debug)]
pub struct DeviceManager {
    /// Handed to endpoint tasks and timers, which must not keep the manager alive.
    this: Weak<DeviceManager>,
    config: DeviceConfig,
    state: Mutex<State>,
    /// Source of endpoint ids and removal tokens.
    next_id: AtomicU64,
    changes: watch::Sender<u64>,
    /// Endpoint sockets whose stream ended while current (see [`DeviceManager::hangups`]).
    hangups: Hangups,
    /// What endpoint connections and `kubelet.sock`'s accepted ones pay from.
    pub(crate) budget: FdBudget,
}

#[derive(Debug, Default)]
struct State {
    resources: BTreeMap<String, Resource>,
    /// Set by `shutdown`: no new endpoints, no removal timers.
    closed: bool,
}

#[derive(Debug, Default)]
struct Resource {
    /// `None` after the endpoint went away, until one registers again.
    current: Option<Endpoint>,
    devices: BTreeMap<String, DeviceStatus>,
    /// The pending removal, while in the grace period.
    removal: Option<Removal>,
}

/// A connected endpoint.
#[derive(Debug)]
struct Endpoint {
    id: u64,
    socket: PathBuf,
    /// The socket file we connected to, to tell a restarted plugin's new
    /// socket at the same path from this one.
    file: Option<FileId>,
    options: DevicePluginOptions,
    /// The connection every call and the `ListAndWatch` stream go over.
    channel: UdsChannel,
    /// The `ListAndWatch` task; aborting it closes the stream.
    stream: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Removal {
    token: u64,
    at: Option<SystemTime>,
    timer: JoinHandle<()>,
}

/// What a call needs of the current endpoint, taken out of the lock.
struct Target {
    socket: PathBuf,
    options: DevicePluginOptions,
    client: DevicePluginClient<UdsChannel>,
}

// === DeviceManager ===

impl DeviceManager {
    /// A manager without endpoints.
    pub fn new(config: DeviceConfig) -> Arc<Self> {
        Self::with_fd_budget(config, kpm_transport::fd::budget().clone())
    }

    /// A manager without endpoints whose connections, dialled and accepted,
    /// take permits of `budget` instead of the process-wide
    /// [fd budget](kpm_transport::fd::budget).
    pub fn with_fd_budget(config: DeviceConfig, budget: FdBudget) -> Arc<Self> {
        Arc::new_cyclic(|this| Self {
            this: this.clone(),
            config,
            state: Mutex::default(),
            next_id: AtomicU64::new(1),
            changes: watch::Sender::new(0),
            hangups: Hangups::default(),
            budget,
        })
    }

    /// The manager's settings.
    pub fn config(&self) -> DeviceConfig {
        self.config
    }

    /// A counter that changes whenever [`resources`](Self::resources) may
    /// have: an endpoint connected or went away, devices were reported, a
    /// resource was removed. Wait on it instead of polling.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The endpoint sockets whose `ListAndWatch` stream ended by itself while
    /// they were current: hints for liveness (see [`Hangups`]).
    pub fn hangups(&self) -> broadcast::Receiver<PathBuf> {
        self.hangups.subscribe()
    }

    /// The open connection to `resource`'s current endpoint, if that is
    /// `socket`: liveness probes a device plugin whose registration socket
    /// is its endpoint over it, instead of dialling.
    pub fn connection(&self, resource: &str, socket: &Path) -> Option<UdsChannel> {
        let state = self.state.lock();
        let current = state.resources.get(resource)?.current.as_ref()?;
        (current.socket == socket && !current.channel.is_closed()).then(|| current.channel.clone())
    }

    /// Every resource, sorted by name.
    pub fn resources(&self) -> Vec<ResourceStatus> {
        let state = self.state.lock();
        state.resources.iter().map(|(name, resource)| resource.status(name)).collect()
    }

    /// One resource, if known.
    pub fn resource(&self, resource: &str) -> Option<ResourceStatus> {
        self.state.lock().resources.get(resource).map(|entry| entry.status(resource))
    }

    /// The options the current endpoint of `resource` reported in
    /// `GetDevicePluginOptions`, if it is connected.
    pub fn options(&self, resource: &str) -> Option<DevicePluginOptions> {
        let state = self.state.lock();
        state.resources.get(resource)?.current.as_ref().map(|endpoint| endpoint.options)
    }

    /// `ValidatePlugin` of the plugin-watcher path: one of `versions` is
    /// `v1beta1` and `name` is an extended resource name. No side effects.
    pub fn validate_plugin(&self, name: &str, versions: &[String]) -> Result<(), DeviceError> {
        validate_plugin(name, versions)
    }

    /// `RegisterPlugin` of the plugin-watcher path: validates, then connects
    /// to the plugin at `endpoint` (the socket path) for resource `name`.
    /// See [`connect`](Self::connect).
    pub(crate) async fn register_plugin(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), DeviceError> {
        validate_plugin(name, versions)?;
        self.connect(name, Path::new(endpoint)).await
    }

    /// `DeRegisterPlugin` of the plugin-watcher path: if `endpoint` is the
    /// current endpoint of resource `name`, closes its stream, marks its
    /// devices unhealthy and starts the grace period (a tokio timer: call it
    /// within a runtime). Otherwise (an older socket, an unknown resource)
    /// nothing happens. Returns whether it was the current endpoint.
    pub(crate) fn deregister_plugin(&self, name: &str, endpoint: &str) -> bool {
        self.disconnect(name, Path::new(endpoint))
    }

    /// `v1beta1.Registration/Register` for the device-plugins directory
    /// `dir`: validates the request (version, resource name, an endpoint
    /// that is a file name in `dir`), then connects to `dir/<endpoint>`.
    /// [`serve_registration`](Self::serve_registration) answers with this.
    pub(crate) async fn handle_register(
        &self,
        dir: &Path,
        request: &RegisterRequest,
    ) -> Result<(), DeviceError> {
        validate_register_request(
            &request.version,
            &request.resource_name,
            &request.endpoint,
            dir,
        )?;
        self.connect(&request.resource_name, &dir.join(&request.endpoint)).await
    }

    /// Connects to the device plugin on `socket` for `resource`: dials it,
    /// asks for its options, makes it the resource's current endpoint
    /// (closing the previous one's stream and cancelling a pending removal)
    /// and starts following its `ListAndWatch` stream in the background.
    /// Returns before the first device list arrives. Nothing is kept on error.
    ///
    /// If `socket` is already the resource's current endpoint, and still the
    /// same socket file, nothing is done: no second connection. Refused with
    /// [`DeviceError::InvalidConfig`] when the manager's config does not pass
    /// [`DeviceConfig::validate`].
    pub(crate) async fn connect(&self, resource: &str, socket: &Path) -> Result<(), DeviceError> {
        self.config.validate()?;
        let file = kpm_transport::file_id_at(socket);
        let shown = socket.display();
        if self.is_connected(resource, socket, file.as_ref()) {
            debug!(resource, socket = %shown, "device plugin is already connected");
            return Ok(());
        }
        if self.state.lock().closed {
            return Err(shut_down(resource, socket));
        }
        debug!(resource, socket = %shown, "connecting to device plugin");
        let (channel, options) = self.open(resource, socket).await?;
        let Some(id) = self.install(resource, socket, file, options, channel.clone())? else {
            debug!(resource, socket = %shown, "device plugin was connected meanwhile");
            return Ok(());
        };
        let task = tokio::spawn(watch_devices(
            self.this.clone(),
            resource.to_owned(),
            socket.to_path_buf(),
            id,
            channel,
        ));
        self.attach_stream(resource, id, task);
        info!(
            resource,
            socket = %shown,
            pre_start_required = options.pre_start_required,
            get_preferred_allocation_available = options.get_preferred_allocation_available,
            "device plugin connected"
        );
        Ok(())
    }

    /// What registering the device plugin serving `socket` as `resource`
    /// would see, read-only: its options and its first device list, each
    /// call within the configured timeout; the connection is closed
    /// afterwards. Refused like registration on an invalid config.
    pub async fn inspect_endpoint(
        &self,
        resource: &str,
        socket: &Path,
    ) -> Result<DevicePluginReport, DeviceError> {
        self.config.validate()?;
        let (channel, options) = self.open(resource, socket).await?;
        let server_pid = channel.peer_pid();
        let timeout = self.config.call_timeout;
        let first = async { list_and_watch(channel).await?.message().await };
        let failed = |reason: String| DeviceError::ListAndWatch {
            resource: resource.to_owned(),
            socket: socket.to_path_buf(),
            reason,
        };
        let list = match tokio::time::timeout(timeout, first).await {
            Err(_) => return Err(timed_out("ListAndWatch", resource, socket, timeout)),
            Ok(Err(status)) => return Err(failed(rpc_error(&status))),
            Ok(Ok(None)) => return Err(failed("the stream ended before the first list".into())),
            Ok(Ok(Some(list))) => list,
        };
        let healthy_ids: BTreeSet<String> = list
            .devices
            .iter()
            .filter(|device| device.health == DEVICE_HEALTHY)
            .map(|device| device.id.clone())
            .collect();
        Ok(DevicePluginReport {
            server_pid,
            pre_start_required: options.pre_start_required,
            get_preferred_allocation_available: options.get_preferred_allocation_available,
            devices: list.devices.len(),
            healthy: healthy_ids.len(),
            healthy_ids,
        })
    }

    /// Dials the device plugin at `socket` and asks its options.
    async fn open(
        &self,
        resource: &str,
        socket: &Path,
    ) -> Result<(UdsChannel, DevicePluginOptions), DeviceError> {
        // A connection of its own, without tonic's `Channel`: it is held for
        // as long as the plugin is registered, and its buffers are most of
        // kpm's memory with many plugins (docs/performance.md).
        let dialer = Dialer::new(self.budget.clone(), self.config.dial_timeout);
        let channel = dialer.kept(socket).await.map_err(|source| DeviceError::Dial {
            resource: resource.to_owned(),
            socket: socket.to_path_buf(),
            source,
        })?;
        let mut client = plugin_client(channel.clone());
        let timeout = self.config.call_timeout;
        let options = bounded(
            client.get_device_plugin_options(uds::timed_request(Empty {}, timeout)),
            timeout,
            || timed_out("GetDevicePluginOptions", resource, socket, timeout),
            |status| DeviceError::GetDevicePluginOptions {
                resource: resource.to_owned(),
                socket: socket.to_path_buf(),
                status,
            },
        )
        .await?;
        Ok((channel, options))
    }

    /// If `socket` is the current endpoint of `resource`: closes its stream,
    /// marks the devices unhealthy and starts the grace period. Returns
    /// whether it was.
    pub(crate) fn disconnect(&self, resource: &str, socket: &Path) -> bool {
        let mut state = self.state.lock();
        let closed = state.closed;
        let Some(entry) = state.resources.get_mut(resource) else {
            debug!(resource, socket = %socket.display(), "unknown resource; nothing to deregister");
            return false;
        };
        let Some(endpoint) = entry.current.take_if(|current| current.socket == socket) else {
            debug!(
                resource,
                socket = %socket.display(),
                current = ?entry.current.as_ref().map(|current| &current.socket),
                "not the current endpoint of the resource; nothing to deregister"
            );
            return false;
        };
        if let Some(stream) = endpoint.stream {
            stream.abort();
        }
        entry.mark_unhealthy();
        if !closed {
            self.schedule_removal(resource, entry);
        }
        drop(state);
        info!(
            resource,
            socket = %socket.display(),
            grace_period = ?self.config.grace_period,
            "device plugin deregistered; its devices are unhealthy until it registers again"
        );
        self.changed();
        true
    }

    /// `Allocate` on the current endpoint of `resource`, within the call timeout.
    pub async fn allocate(
        &self,
        resource: &str,
        request: AllocateRequest,
    ) -> Result<AllocateResponse, DeviceError> {
        let Target { socket, mut client, .. } = self.target(resource)?;
        let timeout = self.config.call_timeout;
        debug!(resource, socket = %socket.display(), "Allocate");
        bounded(
            client.allocate(uds::timed_request(request, timeout)),
            timeout,
            || timed_out("Allocate", resource, &socket, timeout),
            |status| DeviceError::Allocate {
                resource: resource.to_owned(),
                socket: socket.clone(),
                status,
            },
        )
        .await
    }

    /// `GetPreferredAllocation` on the current endpoint of `resource`, within
    /// the call timeout; an error if the plugin's options say it does not
    /// implement it.
    pub async fn get_preferred_allocation(
        &self,
        resource: &str,
        request: PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, DeviceError> {
        let Target { socket, options, mut client } = self.target(resource)?;
        if !options.get_preferred_allocation_available {
            return Err(DeviceError::PreferredAllocationUnavailable {
                resource: resource.to_owned(),
                socket,
            });
        }
        let timeout = self.config.call_timeout;
        debug!(resource, socket = %socket.display(), "GetPreferredAllocation");
        bounded(
            client.get_preferred_allocation(uds::timed_request(request, timeout)),
            timeout,
            || timed_out("GetPreferredAllocation", resource, &socket, timeout),
            |status| DeviceError::GetPreferredAllocation {
                resource: resource.to_owned(),
                socket: socket.clone(),
                status,
            },
        )
        .await
    }

    /// `PreStartContainer` on the current endpoint of `resource`, within the
    /// pre-start timeout, if the plugin asked for it in its options
    /// (`pre_start_required`); otherwise nothing is called.
    pub async fn pre_start_container(
        &self,
        resource: &str,
        device_ids: Vec<String>,
    ) -> Result<(), DeviceError> {
        let Target { socket, options, mut client } = self.target(resource)?;
        if !options.pre_start_required {
            debug!(resource, socket = %socket.display(), "PreStartContainer not required");
            return Ok(());
        }
        let timeout = self.config.pre_start_timeout;
        debug!(resource, socket = %socket.display(), "PreStartContainer");
        bounded(
            client.pre_start_container(uds::timed_request(
                PreStartContainerRequest { devices_ids: device_ids },
                timeout,
            )),
            timeout,
            || timed_out("PreStartContainer", resource, &socket, timeout),
            |status| DeviceError::PreStartContainer {
                resource: resource.to_owned(),
                socket: socket.clone(),
                status,
            },
        )
        .await
        .map(|_| ())
    }

    /// Closes every endpoint's stream and waits for the streams to end.
    /// Devices are marked unhealthy; resources are kept (no grace timers
    /// run any more); later registrations are refused. Safe to call twice.
    pub async fn shutdown(&self) {
        let tasks = {
            let mut state = self.state.lock();
            state.closed = true;
            let mut tasks = Vec::new();
            for (resource, entry) in &mut state.resources {
                if let Some(removal) = entry.removal.take() {
                    removal.timer.abort();
                    tasks.push(removal.timer);
                }
                if let Some(endpoint) = entry.current.take() {
                    info!(resource, socket = %endpoint.socket.display(), "closing device plugin endpoint");
                    entry.mark_unhealthy();
                    if let Some(stream) = endpoint.stream {
                        stream.abort();
                        tasks.push(stream);
                    }
                }
            }
            tasks
        };
        self.changed();
        for task in tasks {
            // Aborted: the result is a cancellation error.
            let _ = task.await;
        }
    }

    // --- Internals ---

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn changed(&self) {
        self.changes.send_modify(|counter| *counter = counter.wrapping_add(1));
    }

    /// Whether `socket` (still the file `file`) is the current endpoint of `resource`.
    fn is_connected(&self, resource: &str, socket: &Path, file: Option<&FileId>) -> bool {
        let state = self.state.lock();
        state
            .resources
            .get(resource)
            .and_then(|entry| entry.current.as_ref())
            .is_some_and(|current| current.is_at(socket, file))
    }

    /// Makes a new endpoint the current one of `resource`. `None` if the same
    /// socket was connected meanwhile (the caller's connection is dropped).
    pub(crate) fn install(
        &self,
        resource: &str,
        socket: &Path,
        file: Option<FileId>,
        options: DevicePluginOptions,
        channel: UdsChannel,
    ) -> Result<Option<u64>, DeviceError> {
        let mut state = self.state.lock();
        if state.closed {
            return Err(shut_down(resource, socket));
        }
        let entry = state.resources.entry(resource.to_owned()).or_default();
        if entry.current.as_ref().is_some_and(|current| current.is_at(socket, file.as_ref())) {
            return Ok(None);
        }
        if let Some(removal) = entry.removal.take() {
            removal.timer.abort();
            debug!(resource, socket = %socket.display(), "removal cancelled: a plugin registered");
        }
        let id = self.next_id();
        let endpoint =
            Endpoint { id, socket: socket.to_path_buf(), file, options, channel, stream: None };
        if let Some(old) = entry.current.replace(endpoint) {
            if let Some(stream) = old.stream {
                stream.abort();
            }
            info!(
                resource,
                socket = %socket.display(),
                replaced = %old.socket.display(),
                "device plugin endpoint replaced by a newer registration"
            );
        }
        drop(state);
        self.changed();
        Ok(Some(id))
    }

    /// Hands the `ListAndWatch` task to endpoint `id`, or aborts it if that
    /// endpoint is no longer current.
    fn attach_stream(&self, resource: &str, id: u64, task: JoinHandle<()>) {
        let mut state = self.state.lock();
        match state.resources.get_mut(resource).and_then(|entry| entry.current.as_mut()) {
            Some(current) if current.id == id => current.stream = Some(task),
            _ => task.abort(),
        }
    }

    /// A `ListAndWatch` update of endpoint `id`: replaces the resource's
    /// devices. Returns false if `id` is not the current endpoint any more.
    pub(crate) fn update_devices(
        &self,
        resource: &str,
        id: u64,
        update: ListAndWatchResponse,
    ) -> bool {
        let mut state = self.state.lock();
        let Some(entry) = state.resources.get_mut(resource) else { return false };
        let Some(current) = entry.current.as_ref().filter(|current| current.id == id) else {
            return false;
        };
        let socket = current.socket.display().to_string();
        entry.devices = update
            .devices
            .into_iter()
            .map(|device| {
                let mut numa_nodes: Vec<i64> = device
                    .topology
                    .map(|topology| topology.nodes.iter().map(|node| node.id).collect())
                    .unwrap_or_default();
                numa_nodes.sort_unstable();
                numa_nodes.dedup();
                (
                    device.id.clone(),
                    DeviceStatus { id: device.id, health: device.health, numa_nodes },
                )
            })
            .collect();
        let (healthy, unhealthy) = entry.counts();
        drop(state);
        debug!(resource, socket, healthy, unhealthy, "ListAndWatch update");
        self.changed();
        true
    }

    /// Endpoint `id`'s stream ended: if it is still current, its devices go
    /// unhealthy at once and the grace period starts.
    pub(crate) fn endpoint_gone(&self, resource: &str, id: u64, reason: &str) {
        let mut state = self.state.lock();
        let closed = state.closed;
        let Some(entry) = state.resources.get_mut(resource) else { return };
        // The stream handle is the calling task's own: dropping it detaches.
        let Some(endpoint) = entry.current.take_if(|current| current.id == id) else {
            debug!(resource, reason, "stream of a replaced endpoint ended");
            return;
        };
        entry.mark_unhealthy();
        if !closed {
            self.schedule_removal(resource, entry);
        }
        drop(state);
        warn!(
            resource,
            socket = %endpoint.socket.display(),
            reason,
            grace_period = ?self.config.grace_period,
            "device plugin endpoint went away; its devices are unhealthy until it registers again"
        );
        self.hangups.report(endpoint.socket);
        self.changed();
    }

    /// Starts the grace timer of a resource whose endpoint went away.
    fn schedule_removal(&self, resource: &str, entry: &mut Resource) {
        if let Some(old) = entry.removal.take() {
            old.timer.abort();
        }
        let token = self.next_id();
        let grace = self.config.grace_period;
        let manager = self.this.clone();
        let name = resource.to_owned();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if let Some(manager) = manager.upgrade() {
                manager.expire(&name, token);
            }
        });
        entry.removal = Some(Removal { token, at: SystemTime::now().checked_add(grace), timer });
    }

    /// The grace timer `token` fired: removes the resource if that timer is
    /// still its pending removal and no endpoint has registered since.
    fn expire(&self, resource: &str, token: u64) {
        let mut state = self.state.lock();
        let due = state.resources.get(resource).is_some_and(|entry| {
            entry.current.is_none()
                && entry.removal.as_ref().is_some_and(|removal| removal.token == token)
        });
        if !due {
            return;
        }
        state.resources.remove(resource);
        drop(state);
        info!(
            resource,
            grace_period = ?self.config.grace_period,
            "device plugin resource removed: no endpoint registered within the grace period"
        );
        self.changed();
    }

    fn target(&self, resource: &str) -> Result<Target, DeviceError> {
        let state = self.state.lock();
        let entry = state
            .resources
            .get(resource)
            .ok_or_else(|| DeviceError::UnknownResource { resource: resource.to_owned() })?;
        let current = entry
            .current
            .as_ref()
            .ok_or_else(|| DeviceError::NoEndpoint { resource: resource.to_owned() })?;
        Ok(Target {
            socket: current.socket.clone(),
            options: current.options,
            client: plugin_client(current.channel.clone()),
        })
    }
}

impl Drop for DeviceManager {
    fn drop(&mut self) {
        for entry in self.state.get_mut().resources.values_mut() {
            if let Some(stream) = entry.current.take().and_then(|endpoint| endpoint.stream) {
                stream.abort();
            }
            if let Some(removal) = entry.removal.take() {
                removal.timer.abort();
            }
        }
    }
}

#[async_trait]
impl PluginHandler for DeviceManager {
    async fn validate(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError> {
        debug!(resource = name, socket = endpoint, ?versions, "validating device plugin");
        Ok(self.validate_plugin(name, versions)?)
    }

    async fn register(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError> {
        Ok(self.register_plugin(name, endpoint, versions).await?)
    }

    async fn deregister(&self, name: &str, endpoint: &str) {
        self.deregister_plugin(name, endpoint);
    }

    /// Its options and first device list ([`DeviceManager::inspect_endpoint`]).
    async fn inspect(
        &self,
        name: &str,
        endpoint: &str,
        _versions: &[String],
    ) -> Result<Option<Box<dyn ServiceReport>>, HandlerError> {
        Ok(Some(Box::new(self.inspect_endpoint(name, Path::new(endpoint)).await?)))
    }
}

/// What a device plugin's `GetDevicePluginOptions` and first `ListAndWatch`
/// list say ([`DeviceManager::inspect_endpoint`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DevicePluginReport {
    /// The process serving the socket (`SO_PEERCRED`), if visible from here.
    pub server_pid: Option<u32>,
    /// `pre_start_required` of its options.
    pub pre_start_required: bool,
    /// `get_preferred_allocation_available` of its options.
    pub get_preferred_allocation_available: bool,
    /// Devices in its first list.
    pub devices: usize,
    /// Of those, the healthy ones.
    pub healthy: usize,
    /// The IDs of the healthy ones: the kubelet's device manager records a
    /// resource's healthy devices by ID in its checkpoint, which tells which
    /// resource a plugin on `kubelet.sock` serves.
    pub healthy_ids: BTreeSet<String>,
}

/// `N devices, M healthy; pre_start_required=… get_preferred_allocation_available=…`.
impl std::fmt::Display for DevicePluginReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} devices, {} healthy; pre_start_required={} get_preferred_allocation_available={}",
            self.devices,
            self.healthy,
            self.pre_start_required,
            self.get_preferred_allocation_available
        )
    }
}

// === Resource ===

impl Resource {
    fn status(&self, name: &str) -> ResourceStatus {
        let (healthy, unhealthy) = self.counts();
        ResourceStatus {
            resource: name.to_owned(),
            endpoint: self
                .current
                .as_ref()
                .map(|endpoint| endpoint.socket.display().to_string())
                .unwrap_or_default(),
            healthy,
            unhealthy,
            devices: self.devices.values().cloned().collect(),
            removal_at: self.removal.as_ref().and_then(|removal| removal.at),
        }
    }

    fn counts(&self) -> (usize, usize) {
        let healthy =
            self.devices.values().filter(|device| device.health == DEVICE_HEALTHY).count();
        (healthy, self.devices.len() - healthy)
    }

    fn mark_unhealthy(&mut self) {
        for device in self.devices.values_mut() {
            DEVICE_UNHEALTHY.clone_into(&mut device.health);
        }
    }
}

// === Endpoint ===

impl Endpoint {
    fn is_at(&self, socket: &Path, file: Option<&FileId>) -> bool {
        self.socket == socket && self.file.as_ref() == file
    }
}

// === Helpers ===

fn plugin_client(channel: UdsChannel) -> DevicePluginClient<UdsChannel> {
    DevicePluginClient::new(channel)
        .max_decoding_message_size(kpm_api::constants::MAX_PLUGIN_MESSAGE_BYTES)
}

/// Follows endpoint `id`'s `ListAndWatch` stream until it ends or the
/// endpoint is replaced (then this task is aborted).
async fn watch_devices(
    manager: Weak<DeviceManager>,
    resource: String,
    socket: PathBuf,
    id: u64,
    channel: UdsChannel,
) {
    let reason = match list_and_watch(channel).await {
        Err(status) => format!("ListAndWatch failed: {}", rpc_error(&status)),
        Ok(mut stream) => loop {
            match stream.message().await {
                Ok(Some(update)) => {
                    let Some(manager) = manager.upgrade() else { return };
                    if !manager.update_devices(&resource, id, update) {
                        return;
                    }
                }
                Ok(None) => break "the plugin ended the ListAndWatch stream".to_owned(),
                Err(status) => {
                    break format!("ListAndWatch stream broke: {}", rpc_error(&status));
                }
            }
        },
    };
    debug!(resource, socket = %socket.display(), reason, "ListAndWatch ended");
    if let Some(manager) = manager.upgrade() {
        manager.endpoint_gone(&resource, id, &reason);
    }
}

/// Opens the `ListAndWatch` stream. Not through the generated client: its
/// codec's 8 KiB decode buffer would be held for as long as the stream, one
/// per plugin, for messages of a few hundred bytes.
async fn list_and_watch(
    channel: UdsChannel,
) -> Result<tonic::codec::Streaming<ListAndWatchResponse>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(kpm_api::constants::MAX_PLUGIN_MESSAGE_BYTES);
    grpc.ready().await.map_err(|err| tonic::Status::unavailable(err.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(LIST_AND_WATCH);
    let codec = uds::SmallBufferCodec::<Empty, ListAndWatchResponse>::default();
    let response = grpc.server_streaming(tonic::Request::new(Empty {}), path, codec).await?;
    Ok(response.into_inner())
}

/// `rpc error: code = .. desc = ..`, as grpc-go prints a status.
fn rpc_error(status: &tonic::Status) -> String {
    format!("rpc error: code = {} desc = {}", go_code_name(status.code()), status.message())
}

fn shut_down(resource: &str, socket: &Path) -> DeviceError {
    DeviceError::ShutDown { resource: resource.to_owned(), socket: socket.to_path_buf() }
}

fn timed_out(call: &'static str, resource: &str, socket: &Path, timeout: Duration) -> DeviceError {
    DeviceError::Timeout {
        call,
        resource: resource.to_owned(),
        socket: socket.to_path_buf(),
        timeout,
    }
}

/// Awaits a call for at most `timeout`; see [`uds::timed_call`].
async fn bounded<T>(
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    timeout: Duration,
    on_timeout: impl FnOnce() -> DeviceError,
    on_status: impl FnOnce(tonic::Status) -> DeviceError,
) -> Result<T, DeviceError> {
    uds::timed_call(timeout, call).await.map(tonic::Response::into_inner).map_err(|failed| {
        match failed {
            uds::TimedCallError::Failed(status) => on_status(status),
            uds::TimedCallError::TimedOut => on_timeout(),
        }
    })
}

#[cfg(test)]
mod tests;
