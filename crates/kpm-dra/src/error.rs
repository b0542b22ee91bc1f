//! The error types of the DRA crate (a refused config, [`DraConfigError`];
//! everything else, [`DraError`]), and the Go formatting helpers that make
//! their texts read like the kubelet's.
//!
//! Where the kubelet has a text for the same failure (spec C.2-C.4), it is
//! reproduced; the texts of the call errors name the driver, the endpoint and
//! the gRPC method, and end with the gRPC status as grpc-go prints it.

use std::time::Duration;

use kpm_api::constants::MAX_SOCKET_PATH_BYTES;
pub(crate) use kpm_api::gotext::{error_chain, go_code_name, go_quote, go_quote_list};

/// Why a DRA driver could not be validated, registered or called. Variants
/// are named after the step that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DraError {
    // === ValidatePlugin: the driver name ===
    /// The driver name is empty, longer than 63 bytes, or not a DNS
    /// subdomain once lowercased. `reasons` are the field errors
    /// (`Required value`, `Too long: ..`, `Invalid value: ..`).
    #[error("invalid DRA driver name {}: {}", go_quote(driver), go_join(reasons))]
    InvalidDriverName {
        /// The driver's name.
        driver: String,
        /// The field errors, as the kubelet words them.
        reasons: Vec<String>,
    },

    // === ValidatePlugin: the endpoint ===
    /// The plugin reported no endpoint.
    #[error("empty DRA plugin endpoint")]
    EmptyEndpoint,

    /// The endpoint is not an absolute path.
    #[error("DRA plugin endpoint {} must be an absolute path", go_quote(endpoint))]
    RelativeEndpoint {
        /// The driver's service socket, as reported.
        endpoint: String,
    },

    /// The endpoint does not fit in a Unix socket address.
    #[error(
        "DRA plugin endpoint {} must not be longer than {MAX_SOCKET_PATH_BYTES} bytes (the limit of a Unix socket path), it has {len}",
        go_quote(endpoint)
    )]
    EndpointTooLong {
        /// The driver's service socket, as reported.
        endpoint: String,
        /// Its length in bytes.
        len: usize,
    },

    /// The endpoint, cleaned, is not a path inside the node agent's root
    /// directory.
    #[error(
        "DRA plugin endpoint {} is not inside the kubelet root directory {}",
        go_quote(endpoint),
        go_quote(root)
    )]
    EndpointOutsideRoot {
        /// The driver's service socket, as reported.
        endpoint: String,
        /// The node agent's root directory.
        root: String,
    },

    // === ValidatePlugin: the supported services ===
    /// `ValidatePlugin`'s and `RegisterPlugin`'s wrapper around a service
    /// selection error.
    #[error(
        "invalid supported gRPC versions of DRA driver plugin {driver} at endpoint {endpoint}: {source}"
    )]
    InvalidServices {
        /// The driver's name.
        driver: String,
        /// The driver's service socket, as reported.
        endpoint: String,
        /// The service selection error.
        #[source]
        source: Box<DraError>,
    },

    /// The plugin advertised no services.
    #[error("empty list of supported gRPC services (aka supported versions)")]
    NoServices,

    /// None of the advertised services is a DRA service kpm speaks.
    #[error(
        "none of services supported by the plugin ({}) are supported by the kubelet ({})",
        go_quote_list(services),
        go_quote_list(supported)
    )]
    UnsupportedServices {
        /// The services the plugin advertised.
        services: Vec<String>,
        /// The services kpm speaks.
        supported: Vec<String>,
    },

    // === RegisterPlugin ===
    /// This (driver, endpoint) pair is already registered.
    #[error("endpoint {endpoint} already registered for DRA driver plugin {driver}")]
    AlreadyRegistered {
        /// The driver's name.
        driver: String,
        /// The driver's service socket, as reported.
        endpoint: String,
    },

    /// The manager was shut down; it takes no more registrations or calls.
    #[error("the DRA driver manager is shut down")]
    ShutDown,

    // === GetPlugin ===
    /// A driver was looked up by an empty name.
    #[error("DRA driver name is empty")]
    EmptyDriverName,

    /// No instance of the driver is registered.
    #[error("DRA driver {driver} is not registered")]
    NotRegistered {
        /// The driver's name.
        driver: String,
    },

    // === Calls on the serving instance ===
    /// `NodePrepareResources` failed or timed out (then the status is
    /// `DeadlineExceeded`). `method` is the full gRPC method called, which
    /// names the negotiated service.
    #[error(
        "calling {method} on DRA driver {driver} at endpoint {endpoint}: rpc error: code = {} desc = {}",
        go_code_name(status.code()),
        status.message()
    )]
    NodePrepareResources {
        /// The driver's name.
        driver: String,
        /// The driver's service socket, as reported.
        endpoint: String,
        /// The full gRPC method called.
        method: &'static str,
        /// The status returned, `DeadlineExceeded` on timeout.
        #[source]
        status: tonic::Status,
    },

    /// Connecting to a driver's endpoint failed (inspections only:
    /// registration starts disconnected and keeps trying).
    #[error("connecting to DRA driver {driver} at endpoint {endpoint}: {}", error_chain(source))]
    Connect {
        /// The driver's name.
        driver: String,
        /// The driver's service socket, as reported.
        endpoint: String,
        /// The transport's error.
        #[source]
        source: kpm_transport::TransportError,
    },

    /// `NodeUnprepareResources` failed or timed out (then the status is
    /// `DeadlineExceeded`).
    #[error(
        "calling {method} on DRA driver {driver} at endpoint {endpoint}: rpc error: code = {} desc = {}",
        go_code_name(status.code()),
        status.message()
    )]
    NodeUnprepareResources {
        /// The driver's name.
        driver: String,
        /// The driver's service socket, as reported.
        endpoint: String,
        /// The full gRPC method called.
        method: &'static str,
        /// The status returned, `DeadlineExceeded` on timeout.
        #[source]
        status: tonic::Status,
    },
}

/// Why a [`DraConfig`](crate::DraConfig) was refused, by
/// [`DraConfig::validate`](crate::DraConfig::validate) or
/// [`DraManager::try_new`](crate::DraManager::try_new). Each variant names
/// the bad field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DraConfigError {
    /// A duration is out of range: `call_timeout` zero, or either duration
    /// longer than [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION).
    /// Its `field` is the config field's name.
    #[error("invalid DRA manager config: {0}")]
    DurationOutOfRange(#[from] kpm_api::config::DurationOutOfRange),
}

impl DraError {
    /// The gRPC status code of a failed call, `None` for other errors.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::NodePrepareResources { status, .. }
            | Self::NodeUnprepareResources { status, .. } => Some(status.code()),
            _ => None,
        }
    }
}

/// The status of a call that did not finish within `timeout`, as grpc-go
/// reports an expired context deadline.
pub(crate) fn deadline_exceeded(timeout: Duration) -> tonic::Status {
    tonic::Status::deadline_exceeded(format!(
        "context deadline exceeded (no answer within {timeout:?})"
    ))
}

/// An apimachinery aggregate of field errors: the one error, or `[a, b]`.
fn go_join(reasons: &[String]) -> String {
    match reasons {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_errors_end_with_the_grpc_status_as_grpc_go_prints_it() {
        let err = DraError::NodePrepareResources {
            driver: "dra.example.com".into(),
            endpoint: "/dra.sock".into(),
            method: "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            status: tonic::Status::unavailable("driver is starting"),
        };
        assert_eq!(
            err.to_string(),
            "calling /k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources on DRA \
             driver dra.example.com at endpoint /dra.sock: rpc error: code = Unavailable desc = \
             driver is starting"
        );
        assert_eq!(err.code(), Some(tonic::Code::Unavailable));
        assert_eq!(DraError::EmptyDriverName.code(), None);
    }

    #[test]
    fn several_driver_name_problems_are_listed_like_an_aggregate() {
        let err = DraError::InvalidDriverName {
            driver: "A B".into(),
            reasons: vec!["Too long".into(), "Invalid value".into()],
        };
        assert_eq!(err.to_string(), "invalid DRA driver name \"A B\": [Too long, Invalid value]");
    }
}
