//! The document built from the library's status types, as the server
//! serves it.

use kpm::KubeletHandle;
use kpm_api::json::Rfc3339;

use super::{
    Allocatable, CsiDriver, CsiNode, CsiNodeDriver, Device, DeviceResource, DraDevice, DraDriver,
    DraInstance, Kubernetes, Node, ObjectSync, Plugin, PluginList, RequestCount, SyncError,
};

impl From<&KubeletHandle> for PluginList {
    fn from(kubelet: &KubeletHandle) -> Self {
        Self {
            plugins: kubelet.manager().status().into_iter().map(Plugin::from).collect(),
            csi_drivers: kubelet.csi_drivers().list().into_iter().map(CsiDriver::from).collect(),
            node: kubelet.node_info().unwrap_or_default().into(),
            device_resources: kubelet.devices().resources().into_iter().map(Into::into).collect(),
            dra_drivers: kubelet.dra().drivers().into_iter().map(DraDriver::from).collect(),
            kubernetes: kubelet.kubernetes().map(Kubernetes::from),
        }
    }
}

/// Until the socket is registered, the plugin's strings are empty and its
/// versions `[]`, as scripts written against the first status API expect.
impl From<kpm::PluginStatus> for Plugin {
    fn from(status: kpm::PluginStatus) -> Self {
        let registration = status.registration;
        let (plugin_type, registered_at, server_pid) =
            registration.as_ref().map_or((String::new(), None, None), |registered| {
                let at = Some(Rfc3339(registered.registered_at));
                (registered.plugin_type.clone(), at, registered.server_pid)
            });
        let plugin = registration.map(|registered| registered.plugin);
        Self {
            socket_path: status.socket_path.display().to_string(),
            plugin_type,
            name: plugin.as_ref().map(|plugin| plugin.name.clone()).unwrap_or_default(),
            endpoint: plugin
                .as_ref()
                .map(|plugin| plugin.endpoint.target().into_owned())
                .unwrap_or_default(),
            versions: plugin.map(|plugin| plugin.versions).unwrap_or_default(),
            state: status.state.as_str().to_owned(),
            generation: status.generation.get(),
            last_error: status.last_error,
            registered_at,
            retry_at: status.state.retry_at().map(Rfc3339),
            server_pid,
        }
    }
}

impl From<kpm::csi::CsiDriver> for CsiDriver {
    fn from(driver: kpm::csi::CsiDriver) -> Self {
        let node = driver.node;
        Self {
            name: driver.name,
            endpoint: driver.endpoint,
            version: driver.version.to_string(),
            node_id: node.as_ref().map(|node| node.node_id.clone()),
            max_volumes: node.as_ref().map(|node| node.max_volumes_per_node),
            topology: node.map(|node| node.topology).unwrap_or_default(),
            allocatable_update_period_s: driver.allocatable_update_period.map(|p| p.as_secs()),
            allocatable_refreshed_at: driver.allocatable_refreshed_at.map(Rfc3339),
        }
    }
}

impl From<kpm::csi::NodeInfo> for Node {
    fn from(node: kpm::csi::NodeInfo) -> Self {
        let drivers = node.csinode.drivers.into_iter().map(|driver| CsiNodeDriver {
            name: driver.name,
            node_id: driver.node_id,
            topology_keys: driver.topology_keys,
            allocatable: driver.allocatable_count.map(|count| Allocatable { count }),
        });
        Self {
            annotations: node.annotations,
            labels: node.labels,
            csinode: CsiNode { drivers: drivers.collect() },
        }
    }
}

impl From<kpm::device::ResourceStatus> for DeviceResource {
    fn from(resource: kpm::device::ResourceStatus) -> Self {
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        Self {
            resource: resource.resource,
            endpoint: resource.endpoint,
            healthy: count(resource.healthy),
            unhealthy: count(resource.unhealthy),
            devices: resource
                .devices
                .into_iter()
                .map(|device| Device { id: device.id, health: device.health })
                .collect(),
            removal_at: resource.removal_at.map(Rfc3339),
        }
    }
}

impl From<kpm::dra::DraDriverStatus> for DraDriver {
    fn from(driver: kpm::dra::DraDriverStatus) -> Self {
        let instances = driver.instances.into_iter().map(|instance| DraInstance {
            endpoint: instance.endpoint,
            version: instance.version,
            connected: instance.connected,
            registered_at: Rfc3339(instance.registered_at),
        });
        let devices = driver.devices.into_iter().map(|device| DraDevice {
            pool: device.pool,
            device: device.device,
            health: device.health,
            message: device.message,
            reported_at: Rfc3339(device.reported_at),
            expires_at: device.expires_at.map(Rfc3339),
        });
        Self {
            name: driver.name,
            instances: instances.collect(),
            cleanup_pending_until: driver.cleanup_pending_until.map(Rfc3339),
            devices: devices.collect(),
        }
    }
}

impl From<kpm::kube::KubeStatus> for Kubernetes {
    fn from(kube: kpm::kube::KubeStatus) -> Self {
        let objects = kube.objects.into_iter().map(|(kind, sync)| ObjectSync {
            kind: kind.as_str().to_owned(),
            last_success: sync.last_success.map(Rfc3339),
            last_error: sync
                .last_error
                .map(|error| SyncError { at: Rfc3339(error.at), message: error.message }),
        });
        let requests = kube.requests.into_iter().map(|request| RequestCount {
            verb: request.verb.to_owned(),
            resource: request.resource.to_owned(),
            outcome: request.outcome,
            count: request.count,
        });
        Self {
            node: kube.node,
            objects: objects.collect(),
            requests: requests.collect(),
            pending: kube.pending,
        }
    }
}
