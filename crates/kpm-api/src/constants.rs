//! Plugin types, default paths and supported versions, as the kubelet defines them,
//! and kpm's bounds: on what a plugin sends (message sizes, field lengths, the
//! socket path), and on every configured duration ([`MAX_CONFIG_DURATION`]).

/// `PluginInfo.type` of a CSI driver.
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// `PluginInfo.type` of a device plugin.
pub const DEVICE_PLUGIN: &str = "DevicePlugin";
/// `PluginInfo.type` of a DRA driver.
pub const DRA_PLUGIN: &str = "DRAPlugin";

/// The kubelet's default root directory.
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/kubelet";
/// Directory under the root that plugins create registration sockets in.
pub const PLUGINS_REGISTRY_DIR_NAME: &str = "plugins_registry";
/// Directory under the root that device plugins create their sockets in.
pub const DEVICE_PLUGINS_DIR_NAME: &str = "device-plugins";
/// Name of the node agent's device-plugin `Registration` socket in [`DEVICE_PLUGINS_DIR_NAME`].
pub const KUBELET_SOCKET_NAME: &str = "kubelet.sock";

/// Device plugin API version, sent in `RegisterRequest.version`.
pub const DEVICE_PLUGIN_VERSION: &str = "v1beta1";
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

/// Largest `GetInfo` answer (and device-plugin `RegisterRequest`) kpm decodes.
/// A valid one is a few hundred bytes; anything near this is garbage.
pub const MAX_REGISTRATION_MESSAGE_BYTES: usize = 64 * 1024;
/// Largest message kpm decodes from a plugin's own service (device lists, CSI
/// node info, DRA results): gRPC's usual default, set explicitly on every client.
pub const MAX_PLUGIN_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Longest plugin type accepted from `GetInfo`.
pub const MAX_PLUGIN_TYPE_BYTES: usize = 63;
/// Longest plugin name: a qualified name, 253-byte DNS prefix, `/`, 63-byte name
/// (device plugins are named after their extended resource, `vendor.com/gpu`).
pub const MAX_PLUGIN_NAME_BYTES: usize = 253 + 1 + 63;
/// Longest Unix socket path, in bytes, and so the longest endpoint: the path
/// must fit `sockaddr_un.sun_path` (108 bytes on Linux, 104 on the BSDs and
/// macOS) with its terminating NUL.
pub const MAX_SOCKET_PATH_BYTES: usize = if cfg!(any(
    target_os = "macos",
    target_os = "ios",
    target_os = "freebsd",
    target_os = "netbsd",
    target_os = "openbsd",
    target_os = "dragonfly"
)) {
    103
} else {
    107
};
/// Most supported versions accepted from one plugin.
pub const MAX_SUPPORTED_VERSIONS: usize = 32;
/// Longest supported version string (`v1beta1.DRAPlugin`, `1.0.0`, ...).
pub const MAX_VERSION_BYTES: usize = 63;

/// Mode of the directories kpm creates (root, registry, device-plugin dir),
/// before the umask: plugins run as root, other users have no business there.
pub const OWN_DIR_MODE: u32 = 0o750;

/// Longest period, timeout or grace period any kpm config accepts: 365 days.
/// Far longer than any sensible setting, and far below the values that make
/// `Instant + Duration` overflow or that gRPC's `grpc-timeout` header cannot
/// carry (about 11,000 years), so a config checked against it cannot panic.
pub const MAX_CONFIG_DURATION: std::time::Duration =
    std::time::Duration::from_secs(365 * 24 * 60 * 60);

/// How long one request to the Kubernetes API server may take by default,
/// for kpm's publishing (kpm-kube) and the doctors' reads and writes alike.
pub const API_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
