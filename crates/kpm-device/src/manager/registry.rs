//! The registry: which endpoint is each resource's current one, and what
//! its devices are. Both registration paths (the plugin watcher's
//! [`PluginHandler`] calls and `kubelet.sock`'s `Register`) validate here and
//! end in the same connection; deregistration and the status reads live
//! here too, since they all answer "what is registered for this resource".

use std::path::Path;
use std::time::SystemTime;

use async_trait::async_trait;
use kpm_api::FileId;
use kpm_api::constants::{DEVICE_HEALTHY, DEVICE_UNHEALTHY};
use kpm_api::deviceplugin::v1beta1::{DevicePluginOptions, RegisterRequest};
use kpm_cache::{HandlerError, PluginDetails, PluginHandler, ServiceReport};
use kpm_transport::UdsChannel;
use tracing::{debug, info};

use super::{DeviceManager, Endpoint, Resource, shut_down};
use crate::error::DeviceError;
use crate::validation::{validate_plugin, validate_register_request};

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

// === Reads ===

impl DeviceManager {
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
}

// === Registration and deregistration ===

impl DeviceManager {
    /// `ValidatePlugin` of the plugin-watcher path: one of `versions` is
    /// `v1beta1` and `name` is an extended resource name. No side effects.
    pub fn validate_plugin(&self, name: &str, versions: &[String]) -> Result<(), DeviceError> {
        validate_plugin(name, versions)
    }

    /// `RegisterPlugin` of the plugin-watcher path: validates, then connects
    /// to the plugin at `endpoint` (the socket path) for resource `name`.
    /// See [`connect`](Self::connect).
    async fn register_plugin(
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
    fn deregister_plugin(&self, name: &str, endpoint: &str) -> bool {
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

    /// Whether `socket` (still the file `file`) is the current endpoint of `resource`.
    pub(super) fn is_connected(
        &self,
        resource: &str,
        socket: &Path,
        file: Option<&FileId>,
    ) -> bool {
        let state = self.state.lock();
        state
            .resources
            .get(resource)
            .and_then(|entry| entry.current.as_ref())
            .is_some_and(|current| current.is_at(socket, file))
    }

    /// Makes a new endpoint the current one of `resource`. `None` if the same
    /// socket was connected meanwhile (the caller's connection is dropped).
    pub(super) fn install(
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

    /// If `socket` is the current endpoint of `resource`: closes its stream,
    /// marks the devices unhealthy and starts the grace period. Returns
    /// whether it was.
    pub(super) fn disconnect(&self, resource: &str, socket: &Path) -> bool {
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
}

#[async_trait]
impl PluginHandler for DeviceManager {
    async fn validate(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let (name, versions) = (plugin.name.as_str(), plugin.versions.as_slice());
        debug!(resource = name, socket = %plugin.endpoint, ?versions, "validating device plugin");
        Ok(self.validate_plugin(name, versions)?)
    }

    async fn register(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let endpoint = plugin.endpoint.target();
        Ok(self.register_plugin(&plugin.name, &endpoint, &plugin.versions).await?)
    }

    async fn deregister(&self, plugin: &PluginDetails) {
        self.deregister_plugin(&plugin.name, &plugin.endpoint.target());
    }

    /// Its options and first device list ([`DeviceManager::inspect_endpoint`]).
    async fn inspect(
        &self,
        plugin: &PluginDetails,
    ) -> Result<Option<Box<dyn ServiceReport>>, HandlerError> {
        let endpoint = plugin.endpoint.target();
        let report = self.inspect_endpoint(&plugin.name, Path::new(endpoint.as_ref()));
        Ok(Some(Box::new(report.await?)))
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

    /// (healthy, unhealthy) device counts.
    pub(super) fn counts(&self) -> (usize, usize) {
        let healthy =
            self.devices.values().filter(|device| device.health == DEVICE_HEALTHY).count();
        (healthy, self.devices.len() - healthy)
    }

    /// What the devices of a resource whose endpoint went away are.
    pub(super) fn mark_unhealthy(&mut self) {
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
