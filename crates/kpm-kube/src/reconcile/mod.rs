//! The one loop that brings the API server to the desired state: CSI
//! drivers on the Node and the CSINode (`csi`), device resources on the
//! Node's status (`devices`), the ResourceSlice wipes that are due
//! (`slices`).
//!
//! Level-triggered, as Kubernetes' controllers and kube-runtime's
//! `Controller` are: each pass reads the objects, compares them with the
//! desired state and writes only the difference, so a pass that finds
//! nothing to do writes nothing. While they differ, passes repeat with
//! [`Backoff::RETRY`], without end: a write that falls in an API server
//! outage is only late. A change of the desired state starts a pass at
//! once (and the backoff afresh), and so does a watch event on the Node or
//! the CSINode, so that another writer's change, or the API server's
//! return, is seen at once.
//!
//! A pass works by target (`desired::Target`: a CSI driver, a device
//! resource, a wipe) and reports each one's outcome to the books: agreed,
//! done (it leaves the desired state), writing, failing on an object, or
//! refused. `ObjectKind` only names the object a write or a read went to.

mod csi;
mod devices;
mod slices;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt as _};
use tracing::{debug, info, warn};

use crate::api::NodeApi;
use crate::backoff::Backoff;
use crate::desired::{Books, Desired, PassResult, State, Target};
use crate::status::PendingPublication;

/// How many passes in a row may end with a write that left more to do
/// before the next one waits for the backoff: a withdrawal takes two (the
/// CSINode entry, then the annotation entry), a gone resource two (zero,
/// then removed); more means another writer undoes what kpm writes.
const QUICK_PASSES: u32 = 4;

/// Runs passes until the future is dropped. The watches start with the
/// first goal: a publisher with nothing to publish sends nothing.
pub(crate) async fn run(api: Arc<NodeApi>, books: Arc<Books>) {
    let mut events = None;
    let mut loop_state = LoopState::default();
    let mut changes = books.changes();
    loop {
        changes.borrow_and_update();
        let desired = books.desired();
        if events.is_none() && !desired.is_empty() {
            events = Some(Box::pin(owned_objects_changed(&api)));
        }
        let pass = if desired.is_empty() {
            Pass::default()
        } else {
            Pass::run(&api, &desired, books.agreed(), &mut loop_state).await
        };
        loop_state.log(&api, &pass.outcomes);
        books.report(pass.outcomes);
        let retry_at = if pass.failed {
            loop_state.quick_passes = 0;
            let wait = loop_state.backoff.get_or_insert(Backoff::RETRY).next();
            wait.map(|wait| Instant::now() + wait)
        } else if pass.again && loop_state.quick_passes < QUICK_PASSES {
            loop_state.quick_passes += 1;
            continue;
        } else {
            loop_state.backoff = None;
            loop_state.quick_passes = 0;
            pass.status_wait
        };
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let event = async {
            match &mut events {
                Some(events) => events.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Ok(()) = changes.changed() => loop_state.backoff = None,
            Some(()) = event => debug!(node = api.node, "an owned object changed"),
            () = retry => {}
        }
    }
}

/// What the loop keeps between passes, by target.
#[derive(Debug, Default)]
struct LoopState {
    /// Set while passes fail.
    backoff: Option<Backoff>,
    /// Passes in a row that wrote and left more to do.
    quick_passes: u32,
    /// Failed passes in a row per target, at its goal's revision.
    attempts: BTreeMap<Target, (u64, u32)>,
    /// The earliest next patch of the Node's status.
    status_not_before: Option<Instant>,
    /// The error last logged per pending target, so that a retry that
    /// fails the same way is not logged again.
    logged: BTreeMap<Target, String>,
}

impl LoopState {
    /// Counts a failed pass for `target` at `revision`; returns the passes
    /// failed in a row.
    fn failed(&mut self, target: &Target, revision: u64) -> u32 {
        let entry = self.attempts.entry(target.clone()).or_insert((revision, 0));
        if entry.0 != revision {
            *entry = (revision, 0);
        }
        entry.1 += 1;
        entry.1
    }

    /// Logs the pending publications whose error is new, and the targets
    /// no longer pending; forgets the failures of the targets agreed or
    /// gone.
    fn log(&mut self, api: &NodeApi, outcomes: &BTreeMap<Target, PassResult>) {
        let mut still = BTreeMap::new();
        for (target, outcome) in outcomes {
            let Some(pending) = &outcome.pending else { continue };
            let Some(error) = &pending.last_error else { continue };
            if self.logged.get(target) != Some(error) {
                warn!(node = api.node, kind = %pending.kind, plugin = pending.name, want = pending.want, error, "the API server does not hold what kpm publishes yet; retrying");
            }
            still.insert(target.clone(), error.clone());
        }
        for target in self.logged.keys().filter(|target| !still.contains_key(*target)) {
            info!(node = api.node, plugin = target.name(), %target, "the API server holds what kpm publishes again");
        }
        self.logged = still;
        self.attempts.retain(|target, _| {
            outcomes.get(target).is_some_and(|outcome| !outcome.state.agreed())
        });
    }
}

/// What one pass found and did.
#[derive(Debug, Default)]
struct Pass {
    /// The newest revision of each target the API server agreed with
    /// before this pass.
    agreed_before: BTreeMap<Target, u64>,
    outcomes: BTreeMap<Target, PassResult>,
    /// A request failed: wait for the backoff.
    failed: bool,
    /// Writes succeeded and left a next step (see [`QUICK_PASSES`]).
    again: bool,
    /// The Node's status differs, but its next patch must wait until then.
    status_wait: Option<Instant>,
}

impl Pass {
    async fn run(
        api: &NodeApi,
        desired: &Desired,
        agreed_before: BTreeMap<Target, u64>,
        loop_state: &mut LoopState,
    ) -> Self {
        let mut pass = Self { agreed_before, ..Self::default() };
        // One read of the Node serves the CSI and the device steps.
        let node = if desired.csi.is_empty() && desired.devices.is_empty() {
            None
        } else {
            Some(api.get_node().await.map_err(Arc::new))
        };
        if let Some(node) = &node {
            if !desired.csi.is_empty() {
                csi::pass(api, desired, node, &mut pass, loop_state).await;
            }
            if !desired.devices.is_empty() {
                devices::pass(api, desired, node, &mut pass, loop_state).await;
            }
        }
        if !desired.wipes.is_empty() {
            slices::pass(api, desired, &mut pass, loop_state).await;
        }
        pass
    }

    /// Records how the pass left `target`'s goal at `revision`, and its
    /// publication (from `pending`) as pending unless the API server holds
    /// it, or unread while it agreed with it before.
    fn outcome(
        &mut self,
        target: Target,
        revision: u64,
        state: State,
        pending: impl FnOnce() -> PendingPublication,
    ) {
        let agreed_before =
            self.agreed_before.get(&target).is_some_and(|agreed| *agreed >= revision);
        let last_error = match &state {
            State::Agreed | State::Done => None,
            State::Writing => Some(None),
            State::Failing { error, unread, .. } => {
                self.failed = true;
                (!(*unread && agreed_before))
                    .then(|| Some(kpm_api::gotext::error_chain(error.as_ref())))
            }
            State::Refused(error) => Some(Some(error.to_string())),
        };
        let pending = last_error.map(|last_error| PendingPublication { last_error, ..pending() });
        self.outcomes.insert(target, PassResult { revision, state, pending });
    }
}

/// One item each time the Node or the CSINode of this node changes (or is
/// listed again after the watch was lost): a change by another writer, or
/// the API server back. Watch errors are left to the watcher's backoff:
/// the loop's own passes find out whether the API server answers.
fn owned_objects_changed(api: &NodeApi) -> impl Stream<Item = ()> + use<> {
    let config = watcher::Config::default().fields(&format!("metadata.name={}", api.node));
    let nodes = watcher::watcher(Api::<Node>::all(api.client.clone()), config.clone())
        .default_backoff()
        .filter_map(|event| changed(&event));
    let csinodes = watcher::watcher(Api::<CSINode>::all(api.client.clone()), config)
        .default_backoff()
        .filter_map(|event| changed(&event));
    nodes.merge(csinodes)
}

/// Whether a watch event says that the object may differ from what the
/// last pass read: every event but the list's single items and errors.
fn changed<K>(event: &Result<Event<K>, watcher::Error>) -> Option<()> {
    matches!(event, Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone)).then_some(())
}
