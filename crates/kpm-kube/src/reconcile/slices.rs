//! A pass over the due ResourceSlice wipes (spec C.5): one
//! `DeleteCollection` of `resource.k8s.io/v1` ResourceSlices per driver,
//! with field selector `spec.nodeName=<node>,spec.driver=<driver>`, as the
//! kubelet sends it; first a list with the same selector, so that a wipe
//! of nothing writes nothing.

use kube::api::{DeleteParams, ListParams};
use tracing::info;

use super::{LoopState, Pass};
use crate::KubeError;
use crate::api::NodeApi;
use crate::desired::{Desired, State, Target};
use crate::status::{ObjectKind, PendingPublication};

pub(super) async fn pass(
    api: &NodeApi,
    desired: &Desired,
    pass: &mut Pass,
    loop_state: &mut LoopState,
) {
    for (driver, goal) in &desired.wipes {
        let target = Target::Wipe(driver.clone());
        let state = match api.record(ObjectKind::ResourceSlice, wipe(api, driver).await) {
            Ok(()) => State::Done,
            Err(error) => State::Failing {
                attempts: loop_state.failed(&target, goal.revision),
                object: ObjectKind::ResourceSlice,
                error: error.into(),
                unread: false,
            },
        };
        pass.outcome(target, goal.revision, state, || {
            let want = format!("no ResourceSlice of node {} from driver {driver}", api.node);
            PendingPublication::new(ObjectKind::ResourceSlice, driver, want, true, goal.since)
        });
    }
}

/// Deletes the driver's slices of this node, if it has any; a collection
/// not found has none.
async fn wipe(api: &NodeApi, driver: &str) -> Result<(), KubeError> {
    let selector = format!("spec.nodeName={},spec.driver={driver}", api.node);
    let slices = api.resource_slices();
    let params = ListParams::default().fields(&selector);
    let listed = match api.call("list", "resourceslices", &selector, slices.list(&params)).await {
        Err(err) if err.is_not_found() => return Ok(()),
        listed => listed?,
    };
    if listed.items.is_empty() {
        return Ok(());
    }
    let delete = DeleteParams::default();
    let deleted = api.call(
        "deletecollection",
        "resourceslices",
        &selector,
        slices.delete_collection(&delete, &params),
    );
    match deleted.await {
        Err(err) if !err.is_not_found() => Err(err),
        _ => {
            info!(
                driver,
                node = api.node,
                slices = listed.items.len(),
                "deleted the driver's ResourceSlices of this node"
            );
            Ok(())
        }
    }
}
