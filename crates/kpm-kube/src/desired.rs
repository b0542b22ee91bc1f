//! What kpm wants the API server to hold for its node (the desired state),
//! and how far the reconcile loop has got towards it (the progress).
//!
//! The publishers' handles (the CSI sink, the DRA cleanup, the device
//! capacity, the leftovers' clean-up) only change the desired state and wake
//! the loop; the loop (`reconcile`) is the one writer. A target keeps the
//! revision it was set at, so that the loop's outcome for it can be matched
//! with the change a caller waits for, and the time it was set at, so that
//! a difference that lasts shows since when.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use kpm_csi::{CsiError, DriverNodeInfo};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::KubeError;
use crate::status::{ObjectKind, PendingPublication};

/// A device resource's (capacity, allocatable).
pub(crate) type Counts = (usize, usize);

/// What a CSI driver should have on the Node and the CSINode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CsiTarget {
    /// Its node-id annotation entry, topology labels and CSINode entry
    /// (`InstallCSIDriver`).
    Installed(DriverNodeInfo),
    /// No CSINode entry and no annotation entry; labels stay
    /// (`UninstallCSIDriver`). Dropped once the API server agrees.
    Withdrawn,
}

/// What a device resource should show on the Node's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceTarget {
    /// These counts.
    Counts(Counts),
    /// Nothing: as the kubelet does, zero first (a watcher of the Node sees
    /// the last word), then removed. Dropped once the API server agrees.
    Gone,
}

/// One target and when it was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target<T> {
    pub(crate) value: T,
    /// The desired state's revision when it was set.
    pub(crate) revision: u64,
    pub(crate) since: SystemTime,
}

/// Everything kpm wants the API server to hold; what is in none of the
/// maps is left alone.
#[derive(Debug, Clone, Default)]
pub(crate) struct Desired {
    revision: u64,
    /// By driver name.
    pub(crate) csi: BTreeMap<String, Target<CsiTarget>>,
    /// By resource name.
    pub(crate) devices: BTreeMap<String, Target<DeviceTarget>>,
    /// The DRA drivers whose ResourceSlices of this node are due to be
    /// deleted. Dropped once deleted, or when the wipe is called off.
    pub(crate) wipes: BTreeMap<String, Target<()>>,
}

impl Desired {
    pub(crate) fn is_empty(&self) -> bool {
        self.csi.is_empty() && self.devices.is_empty() && self.wipes.is_empty()
    }

    /// Sets `key` to `value` in `map` (one of this state's); returns the
    /// target's revision, a new one only if the value changed.
    pub(crate) fn set<T: PartialEq>(
        revision: &mut u64,
        map: &mut BTreeMap<String, Target<T>>,
        key: &str,
        value: T,
    ) -> u64 {
        if let Some(target) = map.get(key)
            && target.value == value
        {
            return target.revision;
        }
        *revision += 1;
        map.insert(key.to_owned(), Target { value, revision: *revision, since: SystemTime::now() });
        *revision
    }

    pub(crate) fn set_csi(&mut self, driver: &str, target: CsiTarget) -> u64 {
        Self::set(&mut self.revision, &mut self.csi, driver, target)
    }

    pub(crate) fn set_device(&mut self, resource: &str, target: DeviceTarget) -> u64 {
        Self::set(&mut self.revision, &mut self.devices, resource, target)
    }

    pub(crate) fn add_wipe(&mut self, driver: &str) -> u64 {
        Self::set(&mut self.revision, &mut self.wipes, driver, ())
    }
}

/// How the loop's last pass left one target.
#[derive(Debug, Clone)]
pub(crate) enum State {
    /// The API server holds what the target says.
    Agreed,
    /// A step was written and the next one follows at once (a withdrawn
    /// driver's annotation entry after its CSINode entry).
    Writing,
    /// The API server could not be brought to it: `attempts` passes in a
    /// row failed since the target was set.
    Failing { attempts: u32, error: Arc<KubeError> },
    /// A rule of the kubelet's refuses it (a topology label another
    /// writer set differently, an annotation that is not JSON): retried
    /// only when the object or the target changes.
    Refused(Arc<CsiError>),
}

/// The loop's last word on one target, at the target's revision.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub(crate) revision: u64,
    /// The object the target is pending on (a CSI driver's Node or
    /// CSINode), or was last written to.
    pub(crate) kind: ObjectKind,
    pub(crate) state: State,
    /// Whether the API server agreed with this revision in an earlier pass
    /// (it may have changed since): a caller that missed that pass has its
    /// answer all the same.
    pub(crate) agreed_before: bool,
}

/// The targets a caller waits on the loop for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// A CSI driver's.
    Csi,
    /// A DRA driver's wipe.
    Wipe,
}

/// What the loop reports after each pass.
#[derive(Debug, Clone, Default)]
pub(crate) struct Progress {
    /// By CSI driver.
    pub(crate) csi: BTreeMap<String, Outcome>,
    /// By DRA driver.
    pub(crate) wipes: BTreeMap<String, Outcome>,
    /// The targets the API server does not hold yet, oldest first.
    pub(crate) pending: Vec<PendingPublication>,
}

impl Progress {
    fn outcome(&self, waited: Waited, name: &str) -> Option<&Outcome> {
        match waited {
            Waited::Csi => self.csi.get(name),
            Waited::Wipe => self.wipes.get(name),
        }
    }
}

/// The desired state, shared by the handles that change it and the loop
/// that reads it, with the loop's progress.
#[derive(Debug)]
pub(crate) struct Books {
    desired: Mutex<Desired>,
    /// The desired state's revision, for the loop to wait on.
    revision: watch::Sender<u64>,
    progress: watch::Sender<Progress>,
}

impl Default for Books {
    fn default() -> Self {
        Self {
            desired: Mutex::default(),
            revision: watch::Sender::new(0),
            progress: watch::Sender::new(Progress::default()),
        }
    }
}

impl Books {
    /// Changes the desired state with `change`, and wakes the loop if a
    /// target was set anew (one called off needs no pass).
    pub(crate) fn change<R>(&self, change: impl FnOnce(&mut Desired) -> R) -> R {
        let mut desired = self.desired.lock();
        let before = desired.revision;
        let result = change(&mut desired);
        if desired.revision != before {
            self.revision.send_replace(desired.revision);
        }
        result
    }

    /// The changes of the desired state, for the loop: mark one seen
    /// before taking [`desired`](Self::desired).
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// A copy of the desired state, for one pass of the loop.
    pub(crate) fn desired(&self) -> Desired {
        self.desired.lock().clone()
    }

    /// Drops the targets the API server agrees with and that leave once
    /// it does (withdrawn drivers, gone resources, done wipes), if they
    /// are still at the revision the loop worked from.
    pub(crate) fn forget_done(&self, worked_from: &Desired, progress: &Progress, gone: &[String]) {
        let mut desired = self.desired.lock();
        let unchanged =
            |current: Option<u64>, seen: Option<u64>| current.is_some() && current == seen;
        for (driver, outcome) in &progress.csi {
            let seen = worked_from.csi.get(driver);
            if matches!(outcome.state, State::Agreed)
                && seen.is_some_and(|target| target.value == CsiTarget::Withdrawn)
                && unchanged(desired.csi.get(driver).map(|t| t.revision), seen.map(|t| t.revision))
            {
                desired.csi.remove(driver);
            }
        }
        for (driver, outcome) in &progress.wipes {
            let seen = worked_from.wipes.get(driver).map(|t| t.revision);
            if matches!(outcome.state, State::Agreed)
                && unchanged(desired.wipes.get(driver).map(|t| t.revision), seen)
            {
                desired.wipes.remove(driver);
            }
        }
        for resource in gone {
            let seen = worked_from.devices.get(resource).map(|t| t.revision);
            if unchanged(desired.devices.get(resource).map(|t| t.revision), seen) {
                desired.devices.remove(resource);
            }
        }
    }

    /// Waits for the loop's word on the `waited` target `name` set at
    /// `revision`: the API server agrees, a rule refuses it, or
    /// `attempts` passes in a row failed. `None` when a newer target
    /// replaced it first. A target the loop dropped once the API server
    /// agreed (a withdrawal, a wipe) is agreed even when the caller missed
    /// the pass that said so: the progress holds only the last pass.
    pub(crate) async fn settled(
        &self,
        waited: Waited,
        name: &str,
        revision: u64,
        attempts: u32,
    ) -> Option<Outcome> {
        let current = || {
            let desired = self.desired.lock();
            match waited {
                Waited::Csi => desired.csi.get(name).map(|target| target.revision),
                Waited::Wipe => desired.wipes.get(name).map(|target| target.revision),
            }
        };
        let mut progress = self.progress.subscribe();
        let settled = progress.wait_for(|progress| {
            let said = progress.outcome(waited, name).is_some_and(|outcome| {
                outcome.revision == revision
                    && (outcome.agreed_before
                        || match outcome.state {
                            State::Agreed | State::Refused(_) => true,
                            State::Writing => false,
                            State::Failing { attempts: failed, .. } => failed >= attempts,
                        })
            });
            said || current() != Some(revision)
        });
        // The sender lives as long as `self`.
        let progress = settled.await.ok()?;
        let agreed = Outcome {
            revision,
            kind: ObjectKind::CsiNode,
            state: State::Agreed,
            agreed_before: true,
        };
        match progress.outcome(waited, name).filter(|o| o.revision == revision) {
            Some(outcome) if outcome.agreed_before => Some(agreed),
            Some(outcome) => Some(outcome.clone()),
            None => match current() {
                Some(newer) if newer > revision => None,
                _ => Some(agreed),
            },
        }
    }

    pub(crate) fn report(&self, progress: Progress) {
        self.progress.send_replace(progress);
    }

    /// The last progress reported.
    pub(crate) fn last_progress(&self) -> Progress {
        self.progress.borrow().clone()
    }
}
