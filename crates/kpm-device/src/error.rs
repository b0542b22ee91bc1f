//! The errors of the device-plugin crate: [`DeviceError`] for what a
//! registration, a call or `kubelet.sock` can fail with, [`DeviceConfigError`]
//! for a config refused at construction; and the Go formatting helpers that
//! make their texts read exactly like the kubelet's.
//!
//! The validation texts are the kubelet's (spec B.3, B.5); every other text
//! names the step, the resource and the socket, and a gRPC failure ends with
//! the kubelet's `rpc error: code = .. desc = ..`.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

pub(crate) use kpm_api::gotext::{error_chain, go_code_name, go_list, go_quote};
use kpm_transport::TransportError;

/// Why a device plugin could not be validated, connected or called, or why
/// `kubelet.sock` could not be served. Variants are named after the step that
/// failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    // === Validation on the plugin-watcher path (`ValidatePlugin`) ===
    /// None of the plugin's versions is `v1beta1`.
    #[error(
        "manager version, v1beta1, is not among plugin supported versions {}",
        go_list(versions)
    )]
    UnsupportedVersions {
        /// The versions the plugin reported.
        versions: Vec<String>,
    },

    /// The plugin name is not an extended resource name.
    #[error("invalid name of device plugin socket: the ResourceName {} is invalid", go_quote(name))]
    InvalidPluginName {
        /// The plugin's name.
        name: String,
    },

    // === Validation of a `v1beta1.Registration/Register` request ===
    /// The request's version is not `v1beta1`.
    #[error(
        "requested API version {} is not supported by kubelet. Supported version is [\"v1beta1\"]",
        go_quote(version)
    )]
    UnsupportedVersion {
        /// The version the request asked for.
        version: String,
    },

    /// The request's resource name is not an extended resource name.
    #[error("the ResourceName {} is invalid", go_quote(resource))]
    InvalidResourceName {
        /// The resource name requested.
        resource: String,
    },

    /// The request's endpoint is not a plain file name (absolute, `..`, a
    /// `/`, empty): it would point outside the device-plugins directory.
    #[error(
        "invalid endpoint {}: must be a socket file name inside {}",
        go_quote(endpoint),
        dir.display()
    )]
    InvalidEndpoint {
        /// The endpoint the request gave.
        endpoint: String,
        /// The device-plugins directory.
        dir: PathBuf,
    },

    // === Connecting to a device plugin ===
    /// Connecting to the plugin's socket failed or timed out. The source
    /// names the socket.
    #[error("failed to dial device plugin {resource}: {}", error_chain(source))]
    Dial {
        /// The extended resource name.
        resource: String,
        /// The plugin's service socket.
        socket: PathBuf,
        /// The transport's error.
        #[source]
        source: TransportError,
    },

    /// The plugin answered `GetDevicePluginOptions` with an error.
    #[error(
        "failed to get device plugin options from {resource} at {}: rpc error: code = {} desc = {}",
        socket.display(), go_code_name(status.code()), status.message()
    )]
    GetDevicePluginOptions {
        /// The extended resource name.
        resource: String,
        /// The plugin's service socket.
        socket: PathBuf,
        /// The status the plugin returned.
        #[source]
        status: tonic::Status,
    },

    /// The plugin's `ListAndWatch` failed or ended before its first list
    /// (inspections only; registration follows the stream instead).
    #[error("ListAndWatch of device plugin {resource} at {}: {reason}", socket.display())]
    ListAndWatch {
        /// The extended resource name.
        resource: String,
        /// The plugin's service socket.
        socket: PathBuf,
        /// What went wrong, as grpc-go prints a status.
        reason: String,
    },

    /// The manager was shut down: no new endpoints are connected.
    #[error("device manager is shut down: not connecting {resource} at {}", socket.display())]
    ShutDown {
        /// The extended resource name.
        resource: String,
        /// The plugin's service socket.
        socket: PathBuf,
    },

    // === Calls of node agents ===
    /// No device plugin has registered this resource (or it was removed
    /// after its grace period).
    #[error("no device plugin is registered for resource {resource}")]
    UnknownResource {
        /// The extended resource name.
        resource: String,
    },

    /// The resource is known, but its endpoint went away (its devices are
    /// unhealthy until the resource is removed or a plugin registers again).
    #[error("the device plugin of resource {resource} is not connected")]
    NoEndpoint {
        /// The extended resource name.
        resource: String,
    },

    /// The plugin said in its options that it does not implement
    /// `GetPreferredAllocation`.
    #[error(
        "device plugin {resource} at {} does not offer GetPreferredAllocation \
         (get_preferred_allocation_available is false)",
        socket.display()
    )]
    PreferredAllocationUnavailable {
        /// The extended resource name.
        resource: String,
        /// The plugin's service socket.
        socket: PathBuf,
    },

    /// The plugin answered `Allocate` with an error.
    #[error(
        "Allocate on device plugin {resource} at {}: rpc error: code = {} desc = {}",
        socket.display(), go_code_name(status.code()), status.message()
    )]
    Allocate {
        /// The extended resource name.
        resource: String,
        /// The plugin's service socket.
        socket: PathBuf,
        /// The status the plugin returned.
        #[source]
        status: tonic::Status,
    },

    /// The plugin answered `GetPreferredAllocation` with an error.
    #[error(
        "GetPreferredAllocation on device plugin {resource} at {}: rpc error: code = {} desc = {}",
        socket.display(), go_code_name(status.code()), status.message()
    )]
    GetPreferredAllocation {
        /// The extended resource name.
        resource: String,
        /// The plugin's service socket.
        socket: PathBuf,
        /// The status the plugin returned.
        #[source]
        status: tonic::Status,
    },

    /// The plugin answered `PreStartContainer` with an error.
    #[error(
        "PreStartContainer on device plugin {resource} at {}: rpc error: code = {} desc = {}",
        socket.display(), go_code_name(status.code()), status.message()
    )]
    PreStartContainer {
        /// The extended resource name.
        resource: String,
        /// The plugin's service socket.
        socket: PathBuf,
        /// The status the plugin returned.
        #[source]
        status: tonic::Status,
    },

    /// A call (`call` is its gRPC method name) got no answer in time.
    #[error(
        "{call} on device plugin {resource} at {}: no answer within {timeout:?} (context deadline exceeded)",
        socket.display()
    )]
    Timeout {
        /// The gRPC method.
        call: &'static str,
        /// The extended resource name.
        resource: String,
        /// The plugin's service socket.
        socket: PathBuf,
        /// The deadline that passed.
        timeout: Duration,
    },

    // === Serving kubelet.sock ===
    /// The device-plugins directory could not be created.
    #[error("create device plugin directory {}: {source}", path.display())]
    CreateDir {
        /// The device-plugins directory.
        path: PathBuf,
        /// The `mkdir -p` error.
        #[source]
        source: io::Error,
    },

    /// A live process (another kubelet or kpm) answers on `kubelet.sock`; it
    /// is not ours to remove.
    #[error(
        "serve device plugin registration on {}: a live process already answers on this socket \
         (another kubelet or kpm?); not replacing it",
        path.display()
    )]
    KubeletSocketInUse {
        /// The `kubelet.sock` path.
        path: PathBuf,
    },

    /// Removing a stale `kubelet.sock` or binding the new one failed.
    #[error("serve device plugin registration on {}: {}", path.display(), error_chain(source))]
    BindKubeletSocket {
        /// The `kubelet.sock` path.
        path: PathBuf,
        /// The remove or bind error.
        #[source]
        source: TransportError,
    },
}

/// Why [`DeviceManager::try_new`](crate::DeviceManager::try_new) refused a
/// [`DeviceConfig`](crate::DeviceConfig): the error names the bad field.
/// Checked once, at construction, so no operation of a manager fails on its
/// config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceConfigError {
    /// A duration is out of range; see
    /// [`DeviceConfig::validate`](crate::DeviceConfig::validate).
    #[error("invalid device manager config: {0}")]
    DurationOutOfRange(#[from] kpm_api::config::DurationOutOfRange),
}

impl DeviceError {
    /// The gRPC status a `Register` request that failed with this error is
    /// answered with: `InvalidArgument` for a rejected request,
    /// `Unavailable` after shutdown, otherwise `Unknown` (what the kubelet's
    /// Go errors become). The message is the error's text.
    pub fn to_status(&self) -> tonic::Status {
        let code = match self {
            Self::UnsupportedVersions { .. }
            | Self::InvalidPluginName { .. }
            | Self::UnsupportedVersion { .. }
            | Self::InvalidResourceName { .. }
            | Self::InvalidEndpoint { .. } => tonic::Code::InvalidArgument,
            Self::ShutDown { .. } => tonic::Code::Unavailable,
            _ => tonic::Code::Unknown,
        };
        tonic::Status::new(code, self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_errors_carry_the_kubelets_texts() {
        let versions = vec!["v1alpha1".to_owned(), "v1".to_owned()];
        assert_eq!(
            DeviceError::UnsupportedVersions { versions }.to_string(),
            "manager version, v1beta1, is not among plugin supported versions [v1alpha1 v1]"
        );
        assert_eq!(
            DeviceError::UnsupportedVersions { versions: Vec::new() }.to_string(),
            "manager version, v1beta1, is not among plugin supported versions []"
        );
        assert_eq!(
            DeviceError::InvalidPluginName { name: "gpu".into() }.to_string(),
            "invalid name of device plugin socket: the ResourceName \"gpu\" is invalid"
        );
        assert_eq!(
            DeviceError::UnsupportedVersion { version: "v1alpha".into() }.to_string(),
            "requested API version \"v1alpha\" is not supported by kubelet. \
             Supported version is [\"v1beta1\"]"
        );
        assert_eq!(
            DeviceError::InvalidResourceName { resource: "kubernetes.io/gpu".into() }.to_string(),
            "the ResourceName \"kubernetes.io/gpu\" is invalid"
        );
        assert_eq!(
            DeviceError::InvalidEndpoint {
                endpoint: "../x.sock".into(),
                dir: "/var/lib/kubelet/device-plugins".into()
            }
            .to_string(),
            "invalid endpoint \"../x.sock\": must be a socket file name inside \
             /var/lib/kubelet/device-plugins"
        );
    }

    #[test]
    fn rejected_register_requests_are_invalid_arguments_and_other_failures_unknown() {
        let invalid = DeviceError::InvalidResourceName { resource: "gpu".into() }.to_status();
        assert_eq!(invalid.code(), tonic::Code::InvalidArgument);
        assert_eq!(invalid.message(), "the ResourceName \"gpu\" is invalid");
        let failed = DeviceError::GetDevicePluginOptions {
            resource: "vendor.com/gpu".into(),
            socket: "/dp/gpu.sock".into(),
            status: tonic::Status::unavailable("starting"),
        };
        assert_eq!(
            failed.to_string(),
            "failed to get device plugin options from vendor.com/gpu at /dp/gpu.sock: \
             rpc error: code = Unavailable desc = starting"
        );
        assert_eq!(failed.to_status().code(), tonic::Code::Unknown);
        let shut = DeviceError::ShutDown { resource: "a.com/b".into(), socket: "/s".into() };
        assert_eq!(shut.to_status().code(), tonic::Code::Unavailable);
    }
}
