//! `DraView`: what a node agent may do with the DRA manager without owning it.

use std::sync::Arc;

use kpm_api::dra::v1;

use crate::error::DraError;
use crate::manager::{DraConfig, DraDriverStatus, DraManager};
use crate::validate::DraService;

/// A cheap, cloneable, read-only view of a [`DraManager`], from
/// [`DraManager::view`]: the drivers, their instances and device health,
/// and the calls a node agent makes on a driver's serving instance
/// ([`prepare`](Self::prepare), [`unprepare`](Self::unprepare)), which use
/// a registration without changing it.
///
/// Nothing on it registers, deregisters, cleans up or shuts down:
/// registrations come only through the owner of the manager (the plugin
/// manager's executor). The manager itself is a
/// [`PluginHandler`](kpm_cache::PluginHandler):
///
/// ```
/// # async fn owner(manager: std::sync::Arc<kpm_dra::DraManager>) {
/// use kpm_cache::PluginHandler as _;
/// let endpoint = kpm_cache::PluginEndpoint::Advertised("/run/dra.sock".into());
/// let plugin = kpm_cache::PluginDetails::new("gpu.example.com", endpoint, ["v1.DRAPlugin"]);
/// let _ = manager.register(&plugin).await;
/// manager.deregister(&plugin).await;
/// manager.clean_up_leftovers().await;
/// manager.shutdown().await;
/// # }
/// ```
///
/// a view is not:
///
/// ```compile_fail
/// # async fn holder(view: kpm_dra::DraView) {
/// use kpm_cache::PluginHandler as _;
/// let endpoint = kpm_cache::PluginEndpoint::Advertised("/run/dra.sock".into());
/// let plugin = kpm_cache::PluginDetails::new("gpu.example.com", endpoint, ["v1.DRAPlugin"]);
/// let _ = view.register(&plugin).await;
/// # }
/// ```
///
/// ```compile_fail
/// # async fn holder(view: kpm_dra::DraView) {
/// use kpm_cache::PluginHandler as _;
/// let endpoint = kpm_cache::PluginEndpoint::Advertised("/run/dra.sock".into());
/// let plugin = kpm_cache::PluginDetails::new("gpu.example.com", endpoint, ["v1.DRAPlugin"]);
/// view.deregister(&plugin).await;
/// # }
/// ```
///
/// ```compile_fail
/// # async fn holder(view: kpm_dra::DraView) {
/// view.clean_up_leftovers().await;
/// # }
/// ```
///
/// ```compile_fail
/// # async fn holder(view: kpm_dra::DraView) {
/// view.shutdown().await;
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DraView {
    manager: Arc<DraManager>,
}

impl DraManager {
    /// A read-only view of this manager, to hand to whoever must not
    /// register or deregister.
    pub fn view(self: &Arc<Self>) -> DraView {
        DraView { manager: Arc::clone(self) }
    }
}

impl DraView {
    /// See [`DraManager::config`].
    pub fn config(&self) -> &DraConfig {
        self.manager.config()
    }

    /// See [`DraManager::validate_plugin`]: no side effects.
    pub fn validate_plugin(
        &self,
        driver: &str,
        endpoint: &str,
        services: &[String],
    ) -> Result<(), DraError> {
        self.manager.validate_plugin(driver, endpoint, services)
    }

    /// See [`DraManager::drivers`].
    pub fn drivers(&self) -> Vec<DraDriverStatus> {
        self.manager.drivers()
    }

    /// See [`DraManager::prepare`].
    pub async fn prepare(
        &self,
        driver: &str,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::NodePrepareResourcesResponse, DraError> {
        self.manager.prepare(driver, claims).await
    }

    /// See [`DraManager::prepare_at`]: registers nothing.
    pub async fn prepare_at(
        &self,
        driver: &str,
        endpoint: &str,
        service: DraService,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::NodePrepareResourcesResponse, DraError> {
        self.manager.prepare_at(driver, endpoint, service, claims).await
    }

    /// See [`DraManager::unprepare_at`]: registers nothing.
    pub async fn unprepare_at(
        &self,
        driver: &str,
        endpoint: &str,
        service: DraService,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::NodeUnprepareResourcesResponse, DraError> {
        self.manager.unprepare_at(driver, endpoint, service, claims).await
    }

    /// See [`DraManager::unprepare`].
    pub async fn unprepare(
        &self,
        driver: &str,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::NodeUnprepareResourcesResponse, DraError> {
        self.manager.unprepare(driver, claims).await
    }
}
