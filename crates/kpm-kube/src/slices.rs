//! [`KubeSliceCleanup`]: the DRA manager's [`SliceCleanup`] on the API
//! server, as the kubelet does it (spec C.5): a wipe of a driver's
//! ResourceSlices of this node is set in the desired state, and the
//! reconcile loop deletes them, retrying until it has; the drivers with
//! slices of this node at start are listed, retrying until it answers.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use kpm_dra::SliceCleanup;
use kube::api::ListParams;

use crate::api::NodeApi;
use crate::desired::{Books, Target};
use crate::leftovers;

/// Removes a DRA driver's ResourceSlices of this node once it is gone for
/// good, and names the drivers that have slices of this node at start.
#[derive(Debug)]
pub struct KubeSliceCleanup {
    api: Arc<NodeApi>,
    books: Arc<Books>,
}

impl KubeSliceCleanup {
    pub(crate) fn new(api: Arc<NodeApi>, books: Arc<Books>) -> Self {
        Self { api, books }
    }
}

/// Calls a wipe off when its caller stops waiting for it: the DRA manager
/// drops the wipe of a driver that connected again, and what the driver
/// publishes from then on must stay.
struct CallOff<'a> {
    books: &'a Books,
    target: Target,
    revision: u64,
}

impl Drop for CallOff<'_> {
    fn drop(&mut self) {
        self.books.change(|desired| desired.drop_at(&self.target, self.revision));
    }
}

#[async_trait]
impl SliceCleanup for KubeSliceCleanup {
    async fn wipe_driver(&self, driver: &str) {
        let target = Target::Wipe(driver.to_owned());
        let Some(awaited) =
            self.books.set_awaited(target.clone(), |desired| Some(desired.add_wipe(driver)))
        else {
            return;
        };
        let _call_off = CallOff { books: &self.books, target, revision: awaited.revision() };
        awaited.settled(u32::MAX).await;
    }

    async fn published_drivers(&self) -> Vec<String> {
        let api = &self.api;
        let selector = format!("spec.nodeName={}", api.node);
        let read = || async {
            let params = ListParams::default().fields(&selector);
            let slices = api.resource_slices();
            let slices =
                api.call("list", "resourceslices", &selector, slices.list(&params)).await?;
            let drivers =
                slices.items.iter().filter_map(|slice| slice.data["spec"]["driver"].as_str());
            Ok(drivers.map(str::to_owned).collect::<BTreeSet<_>>())
        };
        let drivers = leftovers::read(api, "DRA drivers' ResourceSlices", read).await;
        drivers.unwrap_or_default().into_iter().collect()
    }
}
