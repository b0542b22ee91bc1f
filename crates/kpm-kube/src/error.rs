//! The one error type of kpm-kube.

use std::path::PathBuf;
use std::time::Duration;

/// Why talking to the Kubernetes API failed. Variants are named after the
/// failing step; request errors name the verb, the resource and the object.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeError {
    /// The API server answered with an error status or could not be reached.
    #[error("{verb} {resource} {name:?}: {source}")]
    Request {
        /// The Kubernetes verb: `get`, `create`, `update`, `patch`, `list`, `deletecollection`.
        verb: &'static str,
        /// The resource, e.g. `nodes/status`.
        resource: &'static str,
        /// The object's name, or the field selector of a collection.
        name: String,
        /// kube-rs's error.
        #[source]
        source: kube::Error,
    },

    /// The request had no answer within the configured request timeout.
    #[error("{verb} {resource} {name:?}: no answer within {timeout:?}")]
    Timeout {
        /// The Kubernetes verb.
        verb: &'static str,
        /// The resource.
        resource: &'static str,
        /// The object's name, or the field selector of a collection.
        name: String,
        /// The timeout that passed.
        timeout: Duration,
    },

    /// The Node this node agent publishes for does not exist; kpm never
    /// creates it (the kubelet, or whoever provisions the node, does).
    #[error("node {node:?} not found; kpm waits for it and never creates it")]
    NodeNotFound {
        /// The node's name.
        node: String,
    },

    /// Listing or watching the CSIDriver objects failed (retried with backoff).
    #[error("watch csidrivers: {0}")]
    WatchCsiDrivers(#[source] kube::runtime::watcher::Error),

    /// A kubeconfig file could not be read or used.
    #[error("load kubeconfig {}: {source}", path.display())]
    LoadKubeconfig {
        /// The file.
        path: PathBuf,
        /// kube-rs's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The in-cluster configuration (service account token and CA) could not be loaded.
    #[error("load the in-cluster config: {0}")]
    InClusterConfig(#[source] kube::config::InClusterError),

    /// The client could not be built from the configuration (TLS, proxy).
    #[error("build the Kubernetes client: {0}")]
    BuildClient(#[source] kube::Error),

    /// A duration of the [`KubeConfig`](crate::KubeConfig) is out of range.
    #[error("invalid Kubernetes publisher config: {0}")]
    InvalidConfig(#[from] kpm_api::config::DurationOutOfRange),

    /// The publishers were created outside a tokio runtime, where their
    /// reconcile loop cannot run.
    #[error("start the reconcile loop: {0}")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),

    /// The node name is not a valid Kubernetes object name.
    #[error("invalid node name {name:?}: {reason}")]
    InvalidNodeName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl KubeError {
    /// The HTTP status the API server answered with, if it answered.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            Self::Request { source: kube::Error::Api(status), .. } => Some(status.code),
            _ => None,
        }
    }

    /// A 404.
    pub(crate) fn is_not_found(&self) -> bool {
        self.status_code() == Some(404)
    }

    /// A 403: kpm's credentials do not allow the request.
    pub(crate) fn is_forbidden(&self) -> bool {
        self.status_code() == Some(403)
    }
}
