//! Plugin types, default paths and supported versions, as the kubelet defines them.

/// `PluginInfo.type` of a CSI driver.
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// `PluginInfo.type` of a device plugin.
pub const DEVICE_PLUGIN: &str = "DevicePlugin";
/// `PluginInfo.type` of a DRA driver.
pub const DRA_PLUGIN: &str = "DRAPlugin";
/// Every plugin type kpm has a handler for.
pub const PLUGIN_TYPES: [&str; 3] = [CSI_PLUGIN, DEVICE_PLUGIN, DRA_PLUGIN];

/// The kubelet's default root directory.
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/kubelet";
/// Directory under the root that plugins create registration sockets in.
pub const PLUGINS_REGISTRY_DIR_NAME: &str = "plugins_registry";
/// The pre-1.12 registration directory name; plugins keep their service sockets here.
pub const LEGACY_PLUGINS_DIR_NAME: &str = "plugins";
/// Directory under the root that device plugins create their sockets in.
pub const DEVICE_PLUGINS_DIR_NAME: &str = "device-plugins";
/// Name of the node agent's device-plugin `Registration` socket in [`DEVICE_PLUGINS_DIR_NAME`].
pub const KUBELET_SOCKET_NAME: &str = "kubelet.sock";

/// Versions of the registration API kpm speaks. All share the wire format.
pub const REGISTRATION_SUPPORTED_VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha1"];

/// Device plugin API version, sent in `RegisterRequest.version`.
pub const DEVICE_PLUGIN_VERSION: &str = "v1beta1";
/// Device plugin API versions kpm accepts.
pub const DEVICE_PLUGIN_SUPPORTED_VERSIONS: [&str; 1] = [DEVICE_PLUGIN_VERSION];
/// `Device.health` of a usable device.
pub const DEVICE_HEALTHY: &str = "Healthy";
/// `Device.health` of an unusable device.
pub const DEVICE_UNHEALTHY: &str = "Unhealthy";

/// Short service names a DRA driver advertises in `supported_versions`, newest first.
/// They differ from the gRPC service names (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`).
pub const DRA_V1_SERVICE: &str = "v1.DRAPlugin";
/// See [`DRA_V1_SERVICE`].
pub const DRA_V1BETA1_SERVICE: &str = "v1beta1.DRAPlugin";
/// DRA plugin services kpm can call, newest first.
pub const DRA_SUPPORTED_SERVICES: [&str; 2] = [DRA_V1_SERVICE, DRA_V1BETA1_SERVICE];
/// Short name of the v1 DRA resource health service.
pub const DRA_HEALTH_V1_SERVICE: &str = "v1.DRAResourceHealth";
/// Short name of the v1alpha1 DRA resource health service.
pub const DRA_HEALTH_V1ALPHA1_SERVICE: &str = "v1alpha1.DRAResourceHealth";

/// CSI drivers must support a version with this major number.
pub const CSI_SUPPORTED_MAJOR_VERSION: u64 = 1;
