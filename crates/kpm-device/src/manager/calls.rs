//! The calls node agents make on a resource's current endpoint:
//! `Allocate`, `GetPreferredAllocation` and `PreStartContainer`, each within
//! its timeout and honouring the options the plugin reported. They use a
//! registration without changing it, which is why a
//! [`DeviceView`](crate::DeviceView) may make them.

use std::path::PathBuf;

use kpm_api::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use kpm_api::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, DevicePluginOptions, PreStartContainerRequest,
    PreferredAllocationRequest, PreferredAllocationResponse,
};
use kpm_transport as uds;
use kpm_transport::UdsChannel;
use tracing::debug;

use super::DeviceManager;
use super::rpc::{bounded, plugin_client, timed_out};
use crate::error::DeviceError;

/// What a call needs of the current endpoint, taken out of the lock.
struct Target {
    socket: PathBuf,
    options: DevicePluginOptions,
    client: DevicePluginClient<UdsChannel>,
}

impl DeviceManager {
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
