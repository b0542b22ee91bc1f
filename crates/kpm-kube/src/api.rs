//! One door to the API server: every request goes through [`NodeApi::call`],
//! which bounds it in time and counts it by verb, resource and outcome. The
//! watches alone (the Node and the CSINode, which wake the reconcile loop;
//! the CSIDrivers) are kube-runtime's long requests; the CSIDriver watch's
//! events and errors are recorded as syncs of [`ObjectKind::CsiDriver`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject, PatchParams, PostParams};
use tracing::{debug, warn};

use crate::status::{KubeStatus, ObjectKind, PendingPublication, RequestCount, Stats};
use crate::{FIELD_MANAGER, KubeConfig, KubeError};

/// The client, the node's name and the books.
pub(crate) struct NodeApi {
    pub(crate) client: kube::Client,
    pub(crate) node: String,
    pub(crate) config: KubeConfig,
    stats: Stats,
    /// Whether a Node without managedFields was logged: every reader of
    /// leftovers finds the same Node, and one warning says it.
    untracked_node_logged: AtomicBool,
}

impl std::fmt::Debug for NodeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeApi")
            .field("node", &self.node)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl NodeApi {
    pub(crate) fn new(client: kube::Client, node: String, config: KubeConfig) -> Arc<Self> {
        Arc::new(Self {
            client,
            node,
            config,
            stats: Stats::default(),
            untracked_node_logged: AtomicBool::new(false),
        })
    }

    /// Sends `request`, at most for the request timeout, and counts it.
    pub(crate) async fn call<T>(
        &self,
        verb: &'static str,
        resource: &'static str,
        name: &str,
        request: impl Future<Output = kube::Result<T>>,
    ) -> Result<T, KubeError> {
        let timeout = self.config.request_timeout;
        let (outcome, result) = match tokio::time::timeout(timeout, request).await {
            Ok(Ok(answer)) => (RequestCount::SUCCESS.to_owned(), Ok(answer)),
            Ok(Err(source)) => {
                let outcome = match &source {
                    kube::Error::Api(status) => status.code.to_string(),
                    _ => "error".to_owned(),
                };
                (outcome, Err(KubeError::Request { verb, resource, name: name.to_owned(), source }))
            }
            Err(_) => (
                "timeout".to_owned(),
                Err(KubeError::Timeout { verb, resource, name: name.to_owned(), timeout }),
            ),
        };
        debug!(verb, resource, name, outcome, "API request");
        self.stats.count(verb, resource, outcome);
        result
    }

    /// Records how a sync of `kind` ended, and passes the result on.
    pub(crate) fn record<T, E: std::error::Error>(
        &self,
        kind: ObjectKind,
        result: Result<T, E>,
    ) -> Result<T, E> {
        match &result {
            Ok(_) => self.stats.synced(kind),
            Err(err) => self.stats.failed(kind, err),
        }
        result
    }

    /// `resource.k8s.io/v1` ResourceSlices, without depending on the
    /// k8s-openapi version the binary chooses.
    pub(crate) fn resource_slices(&self) -> Api<DynamicObject> {
        let resource = ApiResource {
            group: "resource.k8s.io".to_owned(),
            version: "v1".to_owned(),
            api_version: "resource.k8s.io/v1".to_owned(),
            kind: "ResourceSlice".to_owned(),
            plural: "resourceslices".to_owned(),
        };
        Api::all_with(self.client.clone(), &resource)
    }

    pub(crate) fn status(&self, pending: Vec<PendingPublication>) -> KubeStatus {
        self.stats.snapshot(&self.node, pending)
    }

    /// The Node; a 404 becomes [`KubeError::NodeNotFound`].
    pub(crate) async fn get_node(&self) -> Result<Node, KubeError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        self.call("get", "nodes", &self.node, nodes.get(&self.node))
            .await
            .map_err(|err| self.on_node(err))
    }

    /// The Node, read to find what an earlier run published on it. The API
    /// server starts tracking an object's owners at a create that sets some
    /// field, or at an apply; a Node created bare and only updated since has
    /// no managedFields, and gets none from kpm's updates either, so nothing
    /// an earlier run published on it can be told apart. The kubelet's Nodes
    /// always have some; a Node without is logged, once.
    pub(crate) async fn get_node_for_leftovers(&self) -> Result<Node, KubeError> {
        let node = self.get_node().await?;
        let untracked = node.metadata.managed_fields.as_ref().is_none_or(Vec::is_empty);
        if untracked && !self.untracked_node_logged.swap(true, Ordering::Relaxed) {
            warn!(
                node = self.node,
                "the Node has no managedFields: the API server records no field owners on it, \
                 so kpm cannot tell what an earlier run published there and leaves it alone"
            );
        }
        Ok(node)
    }

    /// The error of a request on the Node: a 404 says that the Node is missing.
    pub(crate) fn on_node(&self, err: KubeError) -> KubeError {
        if err.is_not_found() { KubeError::NodeNotFound { node: self.node.clone() } } else { err }
    }

    /// Patch parameters naming kpm as the field manager.
    pub(crate) fn patch_params() -> PatchParams {
        PatchParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..PatchParams::default() }
    }

    /// Create and update parameters naming kpm as the field manager.
    pub(crate) fn post_params() -> PostParams {
        PostParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..PostParams::default() }
    }
}
