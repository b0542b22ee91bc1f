//! [`KubeNodeInfo`]: the CSI handler's [`NodeInfoSink`] on the Node and
//! CSINode objects, with the kubelet's `nodeinfomanager` rules (spec A.8).
//!
//! Each call sets the driver's goal in the desired state, which the
//! reconcile loop brings the API server to, and waits for the loop's word
//! on it, as the kubelet waits for its own writes: the call fails once
//! [`KUBELET_ATTEMPTS`] passes in a row failed (the kubelet's four
//! attempts), or at once when a rule refuses the driver (a topology label
//! set differently by another writer, an annotation that is not JSON). A
//! failed installation fails the registration, as in the kubelet, and the
//! handler withdraws the driver. Unlike the kubelet, the loop goes on after
//! a call gave up: a withdrawal that fell in an API server outage is
//! written once the API server is back.

use std::sync::Arc;

use async_trait::async_trait;
use kpm_csi::{CsiDrivers, CsiError, DriverNodeInfo, NodeInfoError, NodeInfoSink};
use tracing::debug;

use crate::desired::{Books, CsiGoal, Settled, Target};
use crate::status::ObjectKind;

/// How many failed passes in a row make a call give up: the attempts of
/// the kubelet's `updateBackoff`, which fail the registration after them.
pub(crate) const KUBELET_ATTEMPTS: u32 = 4;

/// Publishes CSI drivers' node information on the Node (node-id annotation,
/// topology labels) and the CSINode of the node, like the kubelet, and
/// keeps it there. Failures fail the registration: the driver is told why
/// and retried with backoff.
#[derive(Debug)]
pub struct KubeNodeInfo {
    books: Arc<Books>,
}

impl KubeNodeInfo {
    pub(crate) fn new(books: Arc<Books>) -> Self {
        Self { books }
    }

    /// Sets `driver`'s goal and waits for the loop's word on it.
    async fn publish(&self, driver: &str, goal: CsiGoal) -> Result<(), NodeInfoError> {
        let installing = matches!(goal, CsiGoal::Installed(_));
        let target = Target::Csi(driver.to_owned());
        let awaited = self.books.set_awaited(target, |desired| Some(desired.set_csi(driver, goal)));
        let settled = match awaited {
            Some(awaited) => awaited.settled(KUBELET_ATTEMPTS).await,
            None => None,
        };
        let Some(settled) = settled else {
            // A newer goal of the same driver: the leftovers' clean-up and
            // a registration crossed; the newer one holds.
            return Ok(());
        };
        if matches!(settled, Settled::Agreed) {
            debug!(plugin = driver, installing, "the API server holds the CSI driver's node info");
        }
        result(installing, settled)
    }

    /// Withdraws `driver` as its deregistration would, unless `drivers`
    /// has it. The CSI handler stores a driver before it publishes it, and
    /// this checks under the lock every change of the desired state takes:
    /// a registration that comes meanwhile sets its goal after this one,
    /// so nothing of it is lost. Returns whether it withdrew.
    pub(crate) async fn uninstall_unregistered(
        &self,
        driver: &str,
        drivers: &CsiDrivers,
    ) -> Result<bool, NodeInfoError> {
        let target = Target::Csi(driver.to_owned());
        let awaited = self.books.set_awaited(target, |desired| {
            let installed = desired
                .csi
                .get(driver)
                .is_some_and(|goal| matches!(goal.value, CsiGoal::Installed(_)));
            (drivers.get(driver).is_none() && !installed)
                .then(|| desired.set_csi(driver, CsiGoal::Withdrawn))
        });
        let Some(awaited) = awaited else { return Ok(false) };
        match awaited.settled(u32::MAX).await {
            // Registered meanwhile.
            None => Ok(false),
            Some(settled) => result(false, settled).map(|()| true),
        }
    }
}

/// The loop's word on a CSI driver's goal as the kubelet's nodeinfomanager
/// words it: the step that failed, installing or withdrawing.
fn result(installing: bool, settled: Settled) -> Result<(), NodeInfoError> {
    let (object, source): (_, kpm_csi::BoxError) = match settled {
        Settled::Agreed => return Ok(()),
        Settled::Failed { object, error } => (object, Box::new(error)),
        Settled::Refused(error) => (ObjectKind::Node, Box::new(error)),
    };
    Err(match (installing, object) {
        (true, ObjectKind::CsiNode) => CsiError::UpdateCsiNode { source },
        (true, _) => CsiError::UpdateNode { source },
        (false, ObjectKind::CsiNode) => CsiError::UninstallFromCsiNode { source },
        (false, _) => CsiError::UninstallFromNode { source },
    })
}

#[async_trait]
impl NodeInfoSink for KubeNodeInfo {
    async fn install_driver(
        &self,
        driver: &str,
        info: &DriverNodeInfo,
    ) -> Result<(), NodeInfoError> {
        if info.node_id.is_empty() {
            return Err(CsiError::EmptyNodeId);
        }
        self.publish(driver, CsiGoal::Installed(info.clone())).await
    }

    async fn uninstall_driver(&self, driver: &str) -> Result<(), NodeInfoError> {
        self.publish(driver, CsiGoal::Withdrawn).await
    }
}
