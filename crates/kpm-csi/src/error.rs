//! The one error type of the CSI handler crate, and the Go formatting helpers
//! that make its texts read exactly like the kubelet's.
//!
//! Every text the kubelet produces for the same failure is reproduced here
//! (spec A.3, A.4, A.5, A.8); the NodeGetInfo texts name the step and the
//! endpoint and end with the kubelet's gRPC error text.

use std::time::Duration;

use kpm_transport::TransportError;

use crate::version::Version;
pub(crate) use kpm_api::gotext::{error_chain, go_code_name, go_list, go_quote, go_quote_list};

/// An error of a [`NodeInfoSink`](crate::NodeInfoSink). The same enum as the
/// rest of the crate: a sink backed by the Kubernetes API reports its failures
/// with the `UpdateNode`, `UpdateCsiNode`, `UninstallFromCsiNode` and
/// `UninstallFromNode` variants.
pub type NodeInfoError = CsiError;

/// Any error, as a Kubernetes-API-backed sink would wrap its client errors.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a CSI driver could not be validated, registered or published. Variants
/// are named after the step that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CsiError {
    // === Parsing one version (apimachinery `ParseGeneric`) ===
    /// The text does not look like a version at all.
    #[error("could not parse {} as version", go_quote(version))]
    UnparsableVersion {
        /// The text given.
        version: String,
    },

    /// Fewer than two dot-separated components.
    #[error("illegal version string {}", go_quote(version))]
    IllegalVersion {
        /// The text given.
        version: String,
    },

    /// The major component has a leading zero (`01.2`).
    #[error(
        "illegal zero-prefixed version component {} in {}",
        go_quote(component),
        go_quote(version)
    )]
    ZeroPrefixedVersionComponent {
        /// The text given.
        version: String,
        /// The offending component.
        component: String,
    },

    /// A component does not fit in 64 bits.
    #[error(
        "illegal non-numeric version component {} in {}: strconv.ParseUint: parsing {}: value out of range",
        go_quote(component),
        go_quote(version),
        go_quote(component)
    )]
    VersionComponentOutOfRange {
        /// The text given.
        version: String,
        /// The offending component.
        component: String,
    },

    // === `HighestSupportedVersion` ===
    /// The list of versions is empty.
    #[error("empty array for supported versions")]
    EmptySupportedVersions,

    /// No entry parsed as a version with major 0 or 1. `last_error` is the
    /// parse error of the first unparsable entry (the list is scanned from
    /// the end), if any.
    #[error(
        "could not find a highest supported version from versions ({}) reported: {}",
        go_list(versions),
        last_error.as_ref().map_or_else(|| "<nil>".to_owned(), ToString::to_string)
    )]
    NoSupportedVersion {
        /// The versions the driver reported.
        versions: Vec<String>,
        /// The parse error of the first unparsable entry, if any.
        #[source]
        last_error: Option<Box<CsiError>>,
    },

    /// Only 0.x versions remained.
    #[error("highest supported version reported is {version}, must be v1.x")]
    NotV1 {
        /// The highest version found.
        version: Version,
    },

    /// The name breaks the CSI spec's rule for `GetPluginInfo.name`, which the
    /// kubelet does not check but uses in directory names.
    #[error(
        "kubernetes.io/csi: {caller} for CSI driver {} failed. The name must be at most 63 characters of [a-zA-Z0-9.-], beginning and ending with an alphanumeric character (CSI spec, GetPluginInfo)",
        go_quote(name)
    )]
    InvalidDriverName {
        /// The kubelet step that checked it (`ValidatePlugin` or `RegisterPlugin`).
        caller: &'static str,
        /// The driver's name.
        name: String,
    },

    // === `validateVersions` (caller is "ValidatePlugin" or "RegisterPlugin") ===
    /// The plugin reported no versions.
    #[error(
        "kubernetes.io/csi: {caller} for CSI driver {} failed. Plugin returned an empty list for supported versions",
        go_quote(name)
    )]
    EmptyVersions {
        /// The kubelet step that checked it (`ValidatePlugin` or `RegisterPlugin`).
        caller: &'static str,
        /// The driver's name.
        name: String,
    },

    /// None of the versions is a supported 1.x version.
    #[error(
        "kubernetes.io/csi: {caller} for CSI driver {} failed. None of the versions specified {} are supported. err={source}",
        go_quote(name),
        go_quote_list(versions)
    )]
    UnsupportedVersions {
        /// The kubelet step that checked it (`ValidatePlugin` or `RegisterPlugin`).
        caller: &'static str,
        /// The driver's name.
        name: String,
        /// The versions the driver reported.
        versions: Vec<String>,
        /// Why no version qualified.
        #[source]
        source: Box<CsiError>,
    },

    /// A driver with this name is registered with an equal or higher version.
    #[error(
        "kubernetes.io/csi: {caller} for CSI driver {} failed. Another driver with the same name is already registered with a higher supported version: {}",
        go_quote(name), go_quote(&existing.to_string())
    )]
    HigherVersionRegistered {
        /// The kubelet step that checked it (`ValidatePlugin` or `RegisterPlugin`).
        caller: &'static str,
        /// The driver's name.
        name: String,
        /// The version of the driver already registered.
        existing: Version,
    },

    /// `ValidatePlugin`'s wrapper around a `validateVersions` error.
    #[error("validation failed for CSI Driver {name} at endpoint {endpoint}: {source}")]
    Validation {
        /// The driver's name.
        name: String,
        /// The driver's service socket.
        endpoint: String,
        /// The `validateVersions` error.
        #[source]
        source: Box<CsiError>,
    },

    // === Store lookups (`newCsiDriverClient`) ===
    /// A driver was looked up by an empty name.
    #[error("driver name is empty")]
    EmptyDriverName,

    /// No driver with this name is registered.
    #[error("driver name {name} not found in the list of registered CSI drivers")]
    DriverNotFound {
        /// The name looked up.
        name: String,
    },

    // === NodeGetInfo ===
    /// Connecting to the driver's endpoint failed.
    #[error("NodeGetInfo on {endpoint}: {}", error_chain(source))]
    Dial {
        /// The driver's service socket.
        endpoint: String,
        /// The transport's error.
        #[source]
        source: TransportError,
    },

    /// The driver answered NodeGetInfo with an error. The text ends with the
    /// kubelet's (`rpc error: code = .. desc = ..`).
    #[error(
        "NodeGetInfo on {endpoint}: rpc error: code = {} desc = {}",
        go_code_name(status.code()), status.message()
    )]
    NodeGetInfo {
        /// The driver's service socket.
        endpoint: String,
        /// The status the driver returned.
        #[source]
        status: tonic::Status,
    },

    /// Dialing and calling NodeGetInfo did not finish within the timeout.
    #[error("NodeGetInfo on {endpoint}: no answer within {timeout:?} (context deadline exceeded)")]
    NodeGetInfoTimeout {
        /// The driver's service socket.
        endpoint: String,
        /// The deadline that passed.
        timeout: Duration,
    },

    // === Node info (nodeinfomanager) ===
    /// The driver reported an empty node id.
    #[error("error adding CSI driver node info: driverNodeID must not be empty")]
    EmptyNodeId,

    /// A topology segment of the driver contradicts an existing node label.
    #[error(
        "detected topology value collision: driver reported {}:{} but existing label is {}:{}",
        go_quote(key),
        go_quote(reported),
        go_quote(key),
        go_quote(existing)
    )]
    TopologyCollision {
        /// The topology key (a node label key).
        key: String,
        /// The value the driver reported.
        reported: String,
        /// The value of the node's label.
        existing: String,
    },

    /// The node id annotation is not a JSON object of strings.
    #[error(
        "failed to parse node's \"csi.volume.kubernetes.io/nodeid\" annotation value ({}) err={source}",
        go_quote(value)
    )]
    ParseAnnotation {
        /// The annotation's value.
        value: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },

    /// The node id annotation could not be encoded (does not happen with
    /// string maps; kept so that encoding needs no `unwrap`).
    #[error(
        "error while marshalling node annotation map for CSI driver {} with ID {}: err={source}",
        go_quote(driver),
        go_quote(node_id)
    )]
    EncodeAnnotation {
        /// The driver's name.
        driver: String,
        /// The node id the driver reported.
        node_id: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },

    /// A Kubernetes-API-backed sink could not update the Node object.
    #[error("error updating Node object with CSI driver node info: {source}")]
    UpdateNode {
        /// The sink's (API client's) error.
        #[source]
        source: BoxError,
    },

    /// A Kubernetes-API-backed sink could not create or update the CSINode object.
    #[error("error updating CSINode object with CSI driver node info: {source}")]
    UpdateCsiNode {
        /// The sink's (API client's) error.
        #[source]
        source: BoxError,
    },

    /// A Kubernetes-API-backed sink could not remove the driver from the CSINode object.
    #[error("error uninstalling CSI driver from CSINode object {source}")]
    UninstallFromCsiNode {
        /// The sink's (API client's) error.
        #[source]
        source: BoxError,
    },

    /// A Kubernetes-API-backed sink could not remove the driver from the Node object.
    #[error("error removing CSI driver node info from Node object {source}")]
    UninstallFromNode {
        /// The sink's (API client's) error.
        #[source]
        source: BoxError,
    },

    /// A duration of the [`CsiConfig`](crate::CsiConfig) is out of range;
    /// see [`CsiConfig::validate`](crate::CsiConfig::validate).
    #[error("invalid CSI handler config: {0}")]
    InvalidConfig(#[from] kpm_api::config::DurationOutOfRange),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_are_named_as_grpc_go_names_them() {
        assert_eq!(go_code_name(tonic::Code::Cancelled), "Canceled");
        assert_eq!(go_code_name(tonic::Code::Ok), "OK");
        assert_eq!(go_code_name(tonic::Code::Unavailable), "Unavailable");
        let err = CsiError::NodeGetInfo {
            endpoint: "/csi.sock".into(),
            status: tonic::Status::unavailable("driver is starting"),
        };
        assert_eq!(
            err.to_string(),
            "NodeGetInfo on /csi.sock: rpc error: code = Unavailable desc = driver is starting"
        );
    }
}
