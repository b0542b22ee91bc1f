//! `DeviceView`: what a node agent may do with the device manager without
//! owning it.

use std::sync::Arc;

use kpm_api::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, DevicePluginOptions, PreferredAllocationRequest,
    PreferredAllocationResponse,
};
use tokio::sync::watch;

use crate::config::DeviceConfig;
use crate::error::DeviceError;
use crate::manager::{DeviceManager, DevicePluginReport, ResourceStatus};

/// A cheap, cloneable, read-only view of a [`DeviceManager`], from
/// [`DeviceManager::view`]: the resources, their devices and health, the
/// [`changes`](Self::changes) counter, and the calls a node agent makes on a
/// resource's current endpoint (`Allocate`, `GetPreferredAllocation`,
/// `PreStartContainer`), which use a registration without changing it.
///
/// Nothing on it registers, deregisters, connects, serves `kubelet.sock` or
/// shuts down: registrations come only through the owner of the manager
/// (the plugin manager's executor and `kubelet.sock`). The manager itself
/// is a [`PluginHandler`](kpm_cache::PluginHandler):
///
/// ```
/// # async fn owner(manager: std::sync::Arc<kpm_device::DeviceManager>) {
/// use kpm_cache::PluginHandler as _;
/// let socket = kpm_cache::PluginEndpoint::RegistrationSocket("/run/gpu.sock".into());
/// let plugin = kpm_cache::PluginDetails::new("vendor.com/gpu", socket, ["v1beta1"]);
/// let _ = manager.register(&plugin).await;
/// manager.deregister(&plugin).await;
/// manager.shutdown().await;
/// # }
/// ```
///
/// a view is not:
///
/// ```compile_fail
/// # async fn holder(view: kpm_device::DeviceView) {
/// use kpm_cache::PluginHandler as _;
/// let socket = kpm_cache::PluginEndpoint::RegistrationSocket("/run/gpu.sock".into());
/// let plugin = kpm_cache::PluginDetails::new("vendor.com/gpu", socket, ["v1beta1"]);
/// let _ = view.register(&plugin).await;
/// # }
/// ```
///
/// ```compile_fail
/// # async fn holder(view: kpm_device::DeviceView) {
/// use kpm_cache::PluginHandler as _;
/// let socket = kpm_cache::PluginEndpoint::RegistrationSocket("/run/gpu.sock".into());
/// let plugin = kpm_cache::PluginDetails::new("vendor.com/gpu", socket, ["v1beta1"]);
/// view.deregister(&plugin).await;
/// # }
/// ```
///
/// ```compile_fail
/// # async fn holder(view: kpm_device::DeviceView) {
/// view.shutdown().await;
/// # }
/// ```
///
/// ```compile_fail
/// # async fn holder(view: kpm_device::DeviceView, dir: &std::path::Path) {
/// let _ = view.serve_registration(dir).await;
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DeviceView {
    manager: Arc<DeviceManager>,
}

impl DeviceManager {
    /// A read-only view of this manager, to hand to whoever must not
    /// register or deregister.
    pub fn view(self: &Arc<Self>) -> DeviceView {
        DeviceView { manager: Arc::clone(self) }
    }
}

impl DeviceView {
    /// See [`DeviceManager::config`].
    pub fn config(&self) -> DeviceConfig {
        self.manager.config()
    }

    /// See [`DeviceManager::changes`].
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.manager.changes()
    }

    /// See [`DeviceManager::resources`].
    pub fn resources(&self) -> Vec<ResourceStatus> {
        self.manager.resources()
    }

    /// See [`DeviceManager::resource`].
    pub fn resource(&self, resource: &str) -> Option<ResourceStatus> {
        self.manager.resource(resource)
    }

    /// See [`DeviceManager::options`].
    pub fn options(&self, resource: &str) -> Option<DevicePluginOptions> {
        self.manager.options(resource)
    }

    /// See [`DeviceManager::validate_plugin`]: no side effects.
    pub fn validate_plugin(&self, name: &str, versions: &[String]) -> Result<(), DeviceError> {
        self.manager.validate_plugin(name, versions)
    }

    /// See [`DeviceManager::inspect_endpoint`]: read-only, and the
    /// connection is closed afterwards.
    pub async fn inspect_endpoint(
        &self,
        resource: &str,
        socket: &std::path::Path,
    ) -> Result<DevicePluginReport, DeviceError> {
        self.manager.inspect_endpoint(resource, socket).await
    }

    /// See [`DeviceManager::allocate`].
    pub async fn allocate(
        &self,
        resource: &str,
        request: AllocateRequest,
    ) -> Result<AllocateResponse, DeviceError> {
        self.manager.allocate(resource, request).await
    }

    /// See [`DeviceManager::get_preferred_allocation`].
    pub async fn get_preferred_allocation(
        &self,
        resource: &str,
        request: PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, DeviceError> {
        self.manager.get_preferred_allocation(resource, request).await
    }

    /// See [`DeviceManager::pre_start_container`].
    pub async fn pre_start_container(
        &self,
        resource: &str,
        device_ids: Vec<String>,
    ) -> Result<(), DeviceError> {
        self.manager.pre_start_container(resource, device_ids).await
    }
}
