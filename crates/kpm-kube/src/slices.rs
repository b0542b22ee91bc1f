//! [`KubeSliceCleanup`]: the DRA manager's [`SliceCleanup`] on the API
//! server, as the kubelet does it (spec C.5): one `DeleteCollection` of
//! `resource.k8s.io/v1` ResourceSlices per wipe, with field selector
//! `spec.nodeName=<node>,spec.driver=<driver>`, retried with the kubelet's
//! backoff until it succeeds or the collection is not found.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use backon::Retryable;
use kpm_dra::SliceCleanup;
use kube::api::{DeleteParams, ListParams};
use tracing::{info, warn};

use crate::KubeError;
use crate::api::NodeApi;
use crate::backoff::KubeletBackoff;
use crate::status::ObjectKind;

/// Removes a DRA driver's ResourceSlices of this node once it is gone for
/// good, and names the drivers that have slices of this node at start.
#[derive(Debug)]
pub struct KubeSliceCleanup {
    api: Arc<NodeApi>,
}

impl KubeSliceCleanup {
    pub(crate) fn new(api: Arc<NodeApi>) -> Self {
        Self { api }
    }

    async fn delete(&self, selector: &str) -> Result<(), KubeError> {
        let slices = self.api.resource_slices();
        let params = ListParams::default().fields(selector);
        let delete = DeleteParams::default();
        let deleted = self.api.call(
            "deletecollection",
            "resourceslices",
            selector,
            slices.delete_collection(&delete, &params),
        );
        match deleted.await {
            Err(err) if !err.is_not_found() => Err(err),
            _ => Ok(()),
        }
    }
}

#[async_trait]
impl SliceCleanup for KubeSliceCleanup {
    async fn wipe_driver(&self, driver: &str) {
        let selector = format!("spec.nodeName={},spec.driver={driver}", self.api.node);
        let result = (|| self.delete(&selector))
            .retry(KubeletBackoff::SLICE_WIPE)
            .notify(|err, wait| warn!(driver, error = %err, ?wait, "deleting ResourceSlices failed; retrying"))
            .await;
        if self.api.record(ObjectKind::ResourceSlice, result).is_ok() {
            info!(driver, node = self.api.node, "deleted the driver's ResourceSlices of this node");
        }
    }

    async fn published_drivers(&self) -> Vec<String> {
        let selector = format!("spec.nodeName={}", self.api.node);
        let list = || async {
            let slices = self.api.resource_slices();
            let params = ListParams::default().fields(&selector);
            self.api.call("list", "resourceslices", &selector, slices.list(&params)).await
        };
        let listed = list
            .retry(KubeletBackoff::SLICE_WIPE)
            .notify(
                |err, wait| warn!(error = %err, ?wait, "listing ResourceSlices failed; retrying"),
            )
            .await;
        match self.api.record(ObjectKind::ResourceSlice, listed) {
            Ok(slices) => slices
                .items
                .iter()
                .filter_map(|slice| slice.data["spec"]["driver"].as_str().map(str::to_owned))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}
