//! `Kubelet`: a plugin manager with the kubelet's handlers, composed the way
//! `kpm run` runs it.
//!
//! [`KubeletBuilder::build`] checks the settings and creates the handlers
//! without any IO, so that `kpm probe` inspects a socket
//! ([`ManagerHandle::inspect`]) with the very handlers `kpm run` would use.
//! It wires them to each other: liveness gets the device manager's
//! connections to share, and the DRA manager publishes device health on the
//! manager's own event bus. A kind's handler is its block in `build`; a unit
//! test holds the kinds a build serves against [`PluginKind::ALL`] and the
//! crate's features, so a new kind cannot be forgotten here.
//!
//! [`KubeletBuilder::manager`] hands over the [`PluginManagerBuilder`]
//! itself rather than copying its setters, so that the two cannot drift.
//! The [`Kubelet`] alone holds the managers; its handle gets views.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kpm_api::PluginKind;
use kpm_cache::PluginHandler;
use kpm_transport::HostRoot;
use kpm_transport::fd::FdBudget;

use crate::Result;
use crate::manager::{ManagerHandle, PluginManager, PluginManagerBuilder};

/// Configures a [`Kubelet`]. Every setting has the kubelet's default.
#[derive(Debug)]
#[must_use]
pub struct KubeletBuilder {
    root_dir: PathBuf,
    registry_dir: Option<PathBuf>,
    host: HostRoot,
    disabled: Vec<PluginKind>,
    manager: PluginManagerBuilder,
    fd_budget: FdBudget,
    #[cfg(feature = "csi")]
    csi: crate::csi::CsiConfig,
    #[cfg(feature = "csi")]
    node_info: Option<Arc<dyn crate::csi::NodeInfoSink>>,
    #[cfg(feature = "device")]
    device: crate::device::DeviceConfig,
    #[cfg(feature = "device")]
    device_plugin_dir: Option<PathBuf>,
    #[cfg(feature = "dra")]
    dra: crate::dra::DraConfig,
    #[cfg(feature = "dra")]
    slice_cleanup: Option<Arc<dyn crate::dra::SliceCleanup>>,
    #[cfg(feature = "kube")]
    kubernetes: Option<crate::kube::KubePublisher>,
}

impl Default for KubeletBuilder {
    fn default() -> Self {
        Self {
            root_dir: PathBuf::from(kpm_api::constants::DEFAULT_ROOT_DIR),
            registry_dir: None,
            host: HostRoot::default(),
            disabled: Vec::new(),
            manager: PluginManager::builder(),
            fd_budget: kpm_transport::fd::budget().clone(),
            #[cfg(feature = "csi")]
            csi: crate::csi::CsiConfig::default(),
            #[cfg(feature = "csi")]
            node_info: None,
            #[cfg(feature = "device")]
            device: crate::device::DeviceConfig::default(),
            #[cfg(feature = "device")]
            device_plugin_dir: None,
            #[cfg(feature = "dra")]
            dra: crate::dra::DraConfig::default(),
            #[cfg(feature = "dra")]
            slice_cleanup: None,
            #[cfg(feature = "kube")]
            kubernetes: None,
        }
    }
}

impl KubeletBuilder {
    /// The kubelet's root directory (default `/var/lib/kubelet`): the
    /// registry is `plugins_registry/` in it, device plugins' sockets are
    /// in `device-plugins/`, and DRA endpoints must be inside it.
    pub fn root_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root_dir = dir.into();
        self
    }

    /// The registry directory, if not `<root>/plugins_registry`.
    pub fn registry_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.registry_dir = Some(dir.into());
        self
    }

    /// Runs without the handler of `kind`: its plugins are told that no
    /// handler is registered for their type.
    pub fn disable(mut self, kind: PluginKind) -> Self {
        self.disabled.push(kind);
        self
    }

    /// Runs without the handlers of `kinds` (see [`disable`](Self::disable)):
    /// the kubelet's `--disable`-style list in one call.
    pub fn disable_all(self, kinds: impl IntoIterator<Item = PluginKind>) -> Self {
        kinds.into_iter().fold(self, Self::disable)
    }

    /// Configures the plugin manager underneath with every setting of
    /// [`PluginManagerBuilder`]: executor, reconciler, watcher, liveness,
    /// shutdown grace, event capacity, and handlers for other plugin types.
    /// A handler for a type the kubelet serves itself (an enabled
    /// [`PluginKind`]), or one given twice, makes [`build`](Self::build) fail
    /// with [`Error::AddHandler`](crate::Error::AddHandler); to serve a kind
    /// with a handler of your own, [`disable`](Self::disable) it. The
    /// registry directory and the fd budget are the kubelet's own
    /// ([`registry_dir`](Self::registry_dir), [`fd_budget`](Self::fd_budget)):
    /// `build` sets them on the manager over what `configure` set.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// let kubelet = kpm::Kubelet::builder()
    ///     .manager(|manager| manager.reconcile_period(Duration::from_secs(30)).event_capacity(64))
    ///     .build();
    /// ```
    pub fn manager(
        mut self,
        configure: impl FnOnce(PluginManagerBuilder) -> PluginManagerBuilder,
    ) -> Self {
        self.manager = configure(self.manager);
        self
    }

    /// The file descriptors every connection to a plugin pays from (the
    /// executor's, liveness', CSI `NodeGetInfo`, device plugins' and DRA
    /// drivers' endpoints) and every connection `kubelet.sock` accepts.
    /// Default: the process-wide [`fd::budget`](crate::transport::fd::budget).
    pub fn fd_budget(mut self, budget: FdBudget) -> Self {
        self.fd_budget = budget;
        self
    }

    /// The CSI handler's settings.
    #[cfg(feature = "csi")]
    pub fn csi_config(mut self, config: crate::csi::CsiConfig) -> Self {
        self.csi = config;
        self
    }

    /// Where CSI drivers' node information goes (node-id annotation,
    /// topology labels, CSINode). Default: kept in memory, and shown by
    /// [`KubeletHandle::node_info`].
    #[cfg(feature = "csi")]
    pub fn node_info_sink(mut self, sink: Arc<dyn crate::csi::NodeInfoSink>) -> Self {
        self.node_info = Some(sink);
        self
    }

    /// The device manager's settings.
    #[cfg(feature = "device")]
    pub fn device_config(mut self, config: crate::device::DeviceConfig) -> Self {
        self.device = config;
        self
    }

    /// Where `kubelet.sock` is served for device plugins that register
    /// directly, if not `<root>/device-plugins`.
    #[cfg(feature = "device")]
    pub fn device_plugin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.device_plugin_dir = Some(dir.into());
        self
    }

    /// The DRA manager's settings. Without a `root_dir` of its own, DRA
    /// endpoints must be inside the kubelet's root directory.
    #[cfg(feature = "dra")]
    pub fn dra_config(mut self, config: crate::dra::DraConfig) -> Self {
        self.dra = config;
        self
    }

    /// What removes a DRA driver's ResourceSlices once it is gone for good.
    /// Default: the wipes are only recorded and logged, as there is no API
    /// server to remove them from.
    #[cfg(feature = "dra")]
    pub fn slice_cleanup(mut self, cleanup: Arc<dyn crate::dra::SliceCleanup>) -> Self {
        self.slice_cleanup = Some(cleanup);
        self
    }

    /// Publishes what the kubelet publishes through the Kubernetes API:
    /// CSI drivers' node information on the Node and its CSINode (replacing
    /// [`node_info_sink`](Self::node_info_sink)), device-plugin capacity on
    /// the Node's status while [`Kubelet::run`] runs, and the cleanup of
    /// DRA drivers' ResourceSlices (replacing [`slice_cleanup`](Self::slice_cleanup)).
    #[cfg(feature = "kube")]
    pub fn kubernetes(mut self, publisher: crate::kube::KubePublisher) -> Self {
        self.node_info = Some(publisher.node_info());
        self.slice_cleanup = Some(publisher.slice_cleanup());
        self.kubernetes = Some(publisher);
        self
    }

    /// A kubelet that only inspects, as a judge of plugins (the doctor's
    /// *referee*, `kpm probe`, `kpm check`'s second opinion): no liveness,
    /// `GetInfo` bounded by `get_info` (the kubelet's is 1 s) and every other
    /// dial and call by `timeout`. Its manager's
    /// [`inspect`](ManagerHandle::inspect) runs a registration's steps and
    /// registers nothing; do not [`run`](Kubelet::run) it.
    ///
    /// `host` is where this process sees the host's `/`: under a prefix for
    /// a process in a pod that mounts it elsewhere (`/host`, as `kubectl
    /// debug node/NAME` does). The root and registry directories, the
    /// sockets inspected and the endpoints plugins advertise are all paths
    /// on the host; they are opened under the prefix, and every record and
    /// error names them as on the host.
    pub fn inspect_only(mut self, timeout: Duration, get_info: Duration, host: HostRoot) -> Self {
        self.host = host;
        let executor = crate::ExecutorConfig::default()
            .dial_timeout(timeout)
            .get_info_timeout(get_info)
            .handler_timeout(timeout);
        let builder = self.manager(|manager| manager.liveness(None).executor_config(executor));
        #[cfg(feature = "csi")]
        let builder =
            builder.csi_config(crate::csi::CsiConfig::default().node_get_info_timeout(timeout));
        #[cfg(feature = "device")]
        let builder = builder.device_config(
            crate::device::DeviceConfig::default().dial_timeout(timeout).call_timeout(timeout),
        );
        #[cfg(feature = "dra")]
        let builder = builder.dra_config(crate::dra::DraConfig::default().call_timeout(timeout));
        builder
    }

    /// Checks every setting and creates the handlers and the manager;
    /// nothing is served or watched until [`Kubelet::run`].
    pub fn build(self) -> Result<Kubelet> {
        // How every handler opens sockets: the budget, and the host's `/`.
        #[cfg(any(feature = "csi", feature = "device", feature = "dra"))]
        let reach = kpm_transport::Reach::new(self.fd_budget.clone(), self.host.clone());
        // `try_new` is where the device manager's config is checked.
        #[cfg(feature = "device")]
        let devices =
            crate::device::DeviceManager::try_new(self.device, reach.clone()).map_err(|err| {
                crate::Error::InvalidConfig { setting: "device_config", reason: err.to_string() }
            })?;
        let enabled = |kind| !self.disabled.contains(&kind);
        // One bus for the manager's events and the handlers' own.
        let events = self.manager.event_bus()?;
        let mut manager = self
            .manager
            .registry_dir(self.registry_dir.unwrap_or_else(|| {
                self.root_dir.join(kpm_api::constants::PLUGINS_REGISTRY_DIR_NAME)
            }))
            .fd_budget(self.fd_budget.clone())
            .host(self.host.clone());
        let mut handlers: Vec<(PluginKind, Arc<dyn PluginHandler>)> = Vec::new();

        // Followed from the cluster's CSIDrivers, so only with `kube`.
        #[cfg(feature = "kube")]
        let csi_periods;
        #[cfg(feature = "csi")]
        let (csi_drivers, node_info) = {
            // The default sink is kept in memory, so that it can be shown.
            let (sink, memory): (Arc<dyn crate::csi::NodeInfoSink>, _) =
                if let Some(sink) = self.node_info {
                    (sink, None)
                } else {
                    let memory = Arc::new(crate::csi::InMemoryNodeInfo::default());
                    (memory.clone(), Some(memory))
                };
            let csi =
                crate::csi::CsiHandler::try_new(sink, self.csi, reach.clone()).map_err(|err| {
                    crate::Error::InvalidConfig { setting: "csi_config", reason: err.to_string() }
                })?;
            #[cfg(feature = "kube")]
            {
                csi_periods = csi.allocatable_update_periods();
            }
            let drivers = csi.drivers();
            handlers.push((PluginKind::Csi, Arc::new(csi)));
            (drivers, memory)
        };

        #[cfg(feature = "device")]
        let (devices, device_plugin_dir) = {
            handlers.push((PluginKind::Device, devices.clone()));
            if enabled(PluginKind::Device) {
                manager = manager.shared_connections(Arc::new(DeviceConnections(devices.clone())));
            }
            let dir = self
                .device_plugin_dir
                .unwrap_or_else(|| self.root_dir.join(kpm_api::constants::DEVICE_PLUGINS_DIR_NAME));
            (devices, dir)
        };

        #[cfg(feature = "dra")]
        let dra = {
            let mut config = self.dra;
            config.root_dir.get_or_insert_with(|| self.root_dir.clone());
            let cleanup = self
                .slice_cleanup
                .unwrap_or_else(|| Arc::new(crate::dra::InMemoryCleanup::default()));
            let health_events = Some(events.clone());
            let dra = crate::dra::DraManager::try_new(config, reach, cleanup, health_events);
            let dra = crate::manager::invalid_if("dra_config", dra)?;
            handlers.push((PluginKind::Dra, dra.clone()));
            dra
        };

        handlers.retain(|(kind, _)| enabled(*kind));
        for (kind, handler) in &handlers {
            manager = manager.handler(kind.plugin_type(), Arc::clone(handler));
        }
        let manager = manager.build_with_events(events)?;
        let handle = KubeletHandle {
            manager: manager.handle(),
            #[cfg(feature = "csi")]
            csi_drivers,
            #[cfg(feature = "csi")]
            node_info,
            #[cfg(feature = "device")]
            devices: devices.view(),
            #[cfg(feature = "dra")]
            dra: dra.view(),
            #[cfg(feature = "kube")]
            kubernetes: self.kubernetes,
        };
        Ok(Kubelet {
            manager,
            handle,
            kinds: handlers.iter().map(|(kind, _)| *kind).collect(),
            #[cfg(feature = "device")]
            devices,
            #[cfg(feature = "device")]
            device_plugin_dir: enabled(PluginKind::Device).then_some(device_plugin_dir),
            #[cfg(feature = "dra")]
            dra,
            #[cfg(feature = "kube")]
            csi_periods,
        })
    }
}

/// A plugin manager with the kubelet's handlers: CSI, device plugins (also
/// through `kubelet.sock`) and DRA, each enabled by the crate feature of
/// the same name. This is what `kpm run` runs.
///
/// Built by [`Kubelet::builder`]; [`Kubelet::run`] consumes it. Take a
/// [`KubeletHandle`] first to watch it while it runs.
#[derive(Debug)]
pub struct Kubelet {
    manager: PluginManager,
    handle: KubeletHandle,
    /// The kinds it serves, in the order their handlers were added.
    kinds: Vec<PluginKind>,
    /// The managers themselves, for their lifecycle: the handle has views.
    #[cfg(feature = "device")]
    devices: Arc<crate::device::DeviceManager>,
    /// `None` when device plugins are disabled.
    #[cfg(feature = "device")]
    device_plugin_dir: Option<PathBuf>,
    #[cfg(feature = "dra")]
    dra: Arc<crate::dra::DraManager>,
    /// Where the CSIDrivers' allocatable update periods reach the CSI handler.
    #[cfg(feature = "kube")]
    csi_periods: crate::csi::AllocatableUpdatePeriods,
}

impl Kubelet {
    /// A builder with the kubelet's defaults.
    pub fn builder() -> KubeletBuilder {
        KubeletBuilder::default()
    }

    /// A handle on the manager and the handlers' views, valid while the
    /// kubelet runs and after.
    pub fn handle(&self) -> KubeletHandle {
        self.handle.clone()
    }

    /// The kinds of plugins it serves: those of the crate's features that
    /// were not disabled.
    pub fn kinds(&self) -> &[PluginKind] {
        &self.kinds
    }

    /// Whether the kubelet serves plugins of `kind`.
    #[cfg(any(feature = "dra", feature = "kube"))]
    fn enabled(&self, kind: PluginKind) -> bool {
        self.kinds.contains(&kind)
    }

    /// Serves `kubelet.sock` (device plugins enabled), then runs the plugin
    /// manager until `shutdown` completes (see [`PluginManager::run`]);
    /// then stops serving `kubelet.sock` and closes the connections to
    /// device plugins and DRA drivers. Meanwhile, with DRA enabled, the
    /// cleanup of DRA drivers that left resources on this node is queued (see
    /// [`DraManager::clean_up_leftovers`](crate::dra::DraManager::clean_up_leftovers));
    /// with [`KubeletBuilder::kubernetes`] and device plugins enabled the
    /// device capacity is published, and what an earlier run published of
    /// resources no plugin registers within the device grace period is
    /// removed; with it and CSI enabled, so are the CSI drivers an earlier
    /// run published that do not register within
    /// [`KubeConfig::csi_cleanup_grace`](crate::kube::KubeConfig::csi_cleanup_grace),
    /// and the CSIDrivers' allocatable update periods are followed.
    /// A disabled kind's plugins cannot register, so what they left on the
    /// node is left alone.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let mut background = tokio::task::JoinSet::<()>::new();
        // A disabled kind's plugins cannot register again: its leftovers
        // (here and below) would all be wiped.
        #[cfg(feature = "dra")]
        if self.enabled(PluginKind::Dra) {
            let dra = Arc::clone(&self.dra);
            background.spawn(async move { dra.clean_up_leftovers().await });
        }
        #[cfg(feature = "kube")]
        if let Some(publisher) = &self.handle.kubernetes {
            if self.enabled(PluginKind::Device) {
                background.spawn(publisher.publish_capacity(self.handle.devices.clone()));
            }
            if self.enabled(PluginKind::Csi) {
                let drivers = Arc::clone(&self.handle.csi_drivers);
                background.spawn(publisher.clean_up_csi_leftovers(drivers));
            }
        }
        #[cfg(feature = "kube")]
        if let Some(publisher) = &self.handle.kubernetes
            && self.enabled(PluginKind::Csi)
        {
            background.spawn(publisher.follow_csi_drivers(self.csi_periods.clone()));
        }
        // A handler's connection that drops is a hint that its plugin is gone.
        #[cfg(any(feature = "device", feature = "dra"))]
        if let Some(monitor) = self.manager.handle().liveness_monitor() {
            #[cfg(feature = "device")]
            background.spawn(forward_hangups(self.devices.hangups(), Arc::clone(monitor)));
            #[cfg(feature = "dra")]
            background.spawn(forward_hangups(self.dra.hangups(), Arc::clone(monitor)));
        }
        #[cfg(feature = "device")]
        let kubelet_socket = match &self.device_plugin_dir {
            Some(dir) => Some(self.devices.serve_registration(dir).await?),
            None => None,
        };
        let result = self.manager.run(shutdown).await;
        background.shutdown().await;
        #[cfg(feature = "device")]
        {
            if let Some(kubelet_socket) = kubelet_socket {
                kubelet_socket.shutdown().await;
            }
            self.devices.shutdown().await;
        }
        #[cfg(feature = "dra")]
        self.dra.shutdown().await;
        result
    }
}

/// The device plugins' `ListAndWatch` connections, for liveness probes of
/// plugins whose endpoint is their registration socket.
#[cfg(feature = "device")]
#[derive(Debug)]
struct DeviceConnections(Arc<crate::device::DeviceManager>);

#[cfg(feature = "device")]
impl crate::SharedConnections for DeviceConnections {
    fn connection(&self, plugin: &kpm_cache::Registration) -> Option<kpm_transport::UdsChannel> {
        if plugin.plugin_type != PluginKind::Device.plugin_type() {
            return None;
        }
        self.0.connection(&plugin.plugin.name, &plugin.socket_path)
    }
}

/// Tells liveness of every endpoint whose connection a handler lost.
#[cfg(any(feature = "device", feature = "dra"))]
async fn forward_hangups(
    mut hangups: tokio::sync::broadcast::Receiver<std::path::PathBuf>,
    monitor: Arc<kpm_liveness::LivenessMonitor>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match hangups.recv().await {
            Ok(endpoint) => monitor.suspect(&endpoint),
            // Missed hints cost only time: exits and probes still find the plugin.
            Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => break,
        }
    }
}

/// A cheap, cloneable handle on a [`Kubelet`]: the manager's
/// [`ManagerHandle`] and read-only views of the handlers. The one change it
/// can make is [`ManagerHandle::add_handler`], a handler for a plugin type
/// the kubelet does not serve, whose waiting plugins then register. Nothing
/// else reached through it registers, deregisters, connects, serves or shuts
/// down: the device and DRA views make the calls a node agent makes on a
/// registered plugin (allocate, prepare...), which change no registration.
///
/// ```compile_fail
/// # async fn holder(handle: kpm::KubeletHandle) {
/// use kpm::PluginHandler as _;
/// let socket = kpm::PluginEndpoint::RegistrationSocket("/run/gpu.sock".into());
/// let plugin = kpm::PluginDetails::new("vendor.com/gpu", socket, ["v1beta1"]);
/// let _ = handle.devices().register(&plugin).await;
/// # }
/// ```
///
/// ```compile_fail
/// # async fn holder(handle: kpm::KubeletHandle) {
/// handle.dra().deregister_plugin("gpu.example.com", "/run/dra.sock");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct KubeletHandle {
    manager: ManagerHandle,
    #[cfg(feature = "csi")]
    csi_drivers: Arc<crate::csi::CsiDrivers>,
    #[cfg(feature = "csi")]
    node_info: Option<Arc<crate::csi::InMemoryNodeInfo>>,
    #[cfg(feature = "device")]
    devices: crate::device::DeviceView,
    #[cfg(feature = "dra")]
    dra: crate::dra::DraView,
    #[cfg(feature = "kube")]
    kubernetes: Option<crate::kube::KubePublisher>,
}

impl KubeletHandle {
    /// The plugin manager: sockets, states, events, counters.
    pub fn manager(&self) -> &ManagerHandle {
        &self.manager
    }

    /// The registered CSI drivers (read-only: only the CSI handler writes them).
    #[cfg(feature = "csi")]
    pub fn csi_drivers(&self) -> &Arc<crate::csi::CsiDrivers> {
        &self.csi_drivers
    }

    /// What the node publishes about its CSI drivers, when it is kept in
    /// memory (no [`KubeletBuilder::node_info_sink`] was given).
    #[cfg(feature = "csi")]
    pub fn node_info(&self) -> Option<crate::csi::NodeInfo> {
        self.node_info.as_ref().map(|memory| memory.snapshot())
    }

    /// The device manager's view: resources, devices and their health,
    /// allocation.
    #[cfg(feature = "device")]
    pub fn devices(&self) -> &crate::device::DeviceView {
        &self.devices
    }

    /// The DRA manager's view: drivers, instances, prepare and unprepare.
    #[cfg(feature = "dra")]
    pub fn dra(&self) -> &crate::dra::DraView {
        &self.dra
    }

    /// What the Kubernetes publishers did, when [`KubeletBuilder::kubernetes`]
    /// was given: per kind of object the last sync and error, the API requests.
    #[cfg(feature = "kube")]
    pub fn kubernetes(&self) -> Option<crate::kube::KubeStatus> {
        self.kubernetes.as_ref().map(crate::kube::KubePublisher::status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this build has the handler of `kind`: its crate feature.
    /// One arm per kind, so that a new kind names its feature here, and the
    /// test below fails until `build` adds its handler.
    fn compiled(kind: PluginKind) -> bool {
        match kind {
            PluginKind::Csi => cfg!(feature = "csi"),
            PluginKind::Device => cfg!(feature = "device"),
            PluginKind::Dra => cfg!(feature = "dra"),
        }
    }

    #[tokio::test]
    async fn every_kind_of_the_build_has_its_handler_but_the_disabled() {
        let all: Vec<PluginKind> =
            PluginKind::ALL.into_iter().filter(|kind| compiled(*kind)).collect();
        let kubelet = Kubelet::builder().build().unwrap();
        assert_eq!(kubelet.kinds(), all);
        for kind in all.iter().copied() {
            let kubelet = Kubelet::builder().disable(kind).build().unwrap();
            let rest: Vec<PluginKind> =
                all.iter().copied().filter(|other| *other != kind).collect();
            assert_eq!(kubelet.kinds(), rest, "{kind:?} disabled");
        }
    }
}
