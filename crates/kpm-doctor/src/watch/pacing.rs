//! The pace of `--watch`: after each pass, what it publishes (a standing
//! confirmed, with the one published before, whose Events `publish` tells)
//! and when it judges again, as a state machine without IO, on tokio's
//! clock (so that it is tested on paused time).

use std::time::Duration;

use tokio::time::Instant;

use super::flaps::Flaps;
use super::graces::Graces;
use super::{RECHECK, WatchConfig};
use crate::standing::Standing;

/// Why a pass ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ran {
    /// When it was due: the period, a recheck, a confirmation.
    Due,
    /// Early, woken by what the watch follows: a file-system change, a
    /// plugin's exit, a look that found the node changed.
    WokenUp,
}

/// What `--watch` publishes after each pass, and when it judges again:
/// the decisions of its loop, without IO, on tokio's clock (so that they
/// are tested on paused time).
#[derive(Debug)]
pub(super) struct Pacing {
    config: WatchConfig,
    flaps: Flaps,
    graces: Graces,
    /// What was published last; before the first, nothing fails.
    confirmed: Standing,
    published: bool,
    /// The pass before, damped.
    last: Option<Standing>,
    /// The wait before a failing node is judged again.
    recheck: Duration,
}

/// What to do after a pass.
#[derive(Debug)]
pub(super) struct Next {
    /// An standing to publish, and the one published before it.
    pub(super) publish: Option<(Standing, Standing)>,
    /// When to judge again, if nothing wakes the loop before.
    pub(super) judge_at: Instant,
}

impl Pacing {
    pub(super) fn new(config: WatchConfig) -> Self {
        Self {
            config,
            flaps: Flaps::new(config.flaps),
            graces: Graces::default(),
            confirmed: Standing::default(),
            published: false,
            last: None,
            recheck: RECHECK,
        }
    }

    /// Takes the pass that saw `seen`, run as `ran` says.
    pub(super) fn after_pass(&mut self, seen: &Standing, ran: Ran) -> Next {
        let now = Instant::now();
        // What the kubelet clears by itself is not seen until its grace is
        // over, by the flap damping either.
        let seen = self.graces.hold(seen.clone(), now);
        self.flaps.observe(&seen, now);
        let standing = self.flaps.damp(seen);
        let changed = !self.last.as_ref().is_some_and(|last| last.agrees(&standing));
        let mut confirm_at = None;
        let mut publish = None;
        if self.published && standing.agrees(&self.confirmed) {
            // Nothing new.
        } else if !changed
            || standing.only_better_than(&self.confirmed)
            || standing.newly_lost_to_a_node_event(&self.confirmed)
        {
            let before = std::mem::replace(&mut self.confirmed, standing.clone());
            publish = Some((standing.clone(), before));
            self.published = true;
        } else {
            confirm_at = Some(now + self.config.confirm);
        }
        // While something fails, the node is judged again sooner than the
        // period, less often the longer nothing moves: a fix made in the
        // cluster alone (a kubelet that registers a driver at last)
        // changes no file here, or changes one before it is done (a
        // kubelet's socket, at its start). A change is looked at again
        // after `confirm` only, so that the kubelet has had its time.
        // The waits are kpm's one backoff (`rechecks`), restarted at
        // `confirm` by a change and at its first wait by a wake-up.
        self.recheck = if changed {
            self.config.confirm
        } else if ran == Ran::WokenUp {
            self.config.rechecks.next(None)
        } else {
            self.config.rechecks.next(Some(self.recheck))
        };
        let recheck_at = standing.fails().then(|| now + self.recheck);
        self.last = Some(standing);
        let period_at = now + self.config.period;
        let judge_at = [confirm_at, recheck_at, self.flaps.next_stable(), self.graces.next_due()]
            .into_iter()
            .flatten()
            .fold(period_at, Instant::min);
        Next { publish, judge_at }
    }
}
