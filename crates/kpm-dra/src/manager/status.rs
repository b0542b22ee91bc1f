//! What the status API shows of the DRA drivers: [`DraDriverStatus`] and
//! [`DraInstanceStatus`], read from the registry, the cleanup timers and
//! the health streams by [`DraManager::drivers`].

use std::collections::BTreeSet;
use std::time::SystemTime;

use super::{DraManager, Instance};
use crate::health::DeviceHealthStatus;

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

impl DraManager {
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
