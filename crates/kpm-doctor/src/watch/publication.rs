//! What `--watch` publishes after each pass, and when it judges again: how
//! two passes compare, the Events from one published outcome to the next,
//! and the decisions of the loop as a state machine without IO, on tokio's
//! clock (so that they are tested on paused time).

use std::time::Duration;

use tokio::time::Instant;

use super::flaps::Flaps;
use super::graces::Graces;
use super::{NODE, RECHECK, WatchConfig};
use crate::outcome::Outcome;
use crate::publish::events::{CAN_JUDGE_REASON, RECOVERED_REASON, STABLE_REASON};
use crate::publish::{EventType, Occurrence};
use kpm_report::CANNOT_JUDGE_REASON;
use kpm_report::Verdict;

/// How `--watch` compares its passes and what it tells of a change.
impl Outcome {
    /// Whether `other` has the same entries and verdicts, each failure
    /// behind the same pod container, and is as blind (reasons may carry
    /// figures that change from pass to pass, as may why the doctor cannot
    /// look, and a crash-looping container's restarts).
    pub(super) fn agrees(&self, other: &Self) -> bool {
        self.sockets.len() == other.sockets.len()
            && self.kubelet == other.kubelet
            && self.blind.is_some() == other.blind.is_some()
            && self.failing.len() == other.failing.len()
            && self.failing.iter().zip(&other.failing).all(|((a, fa), (b, fb))| {
                a == b
                    && fa.verdict == fb.verdict
                    && same_container(fa.pod.as_ref(), fb.pod.as_ref())
            })
    }

    /// Whether every failure here is one of `before`'s, with the same
    /// verdict, or what a flapping one settled to: only recoveries and
    /// what held still for the flap hold, which need no second look. Going
    /// blind is none: a blind pass sees no failure because it sees nothing.
    pub(super) fn only_better_than(&self, before: &Self) -> bool {
        (self.blind.is_none() || before.blind.is_some())
            && self.failing.iter().all(|(path, failing)| {
                before.failing.get(path).is_some_and(|was| {
                    was.verdict == failing.verdict || was.verdict == Verdict::Flapping
                })
            })
    }

    /// Whether a plugin here is newly found lost to a node event (the
    /// kubelet's start, a reboot): that needs no second look, for the
    /// event is a fact, not a flicker, and until it is published the
    /// condition vouches for a plugin the kubelet no longer has.
    pub(super) fn newly_lost_to_a_node_event(&self, before: &Self) -> bool {
        self.failing.iter().any(|(path, failing)| {
            failing.verdict == Verdict::NotRegisteredAgain
                && before.failing.get(path).is_none_or(|was| was.verdict != failing.verdict)
        })
    }

    /// The Events from `before` to `self`. A blind pass tells of no
    /// recovery: what it does not see, it cannot call fixed.
    pub(super) fn transitions(&self, before: &Self) -> Vec<Occurrence> {
        let mut occurrences = Vec::new();
        match (&before.blind, &self.blind) {
            (None, Some(blind)) => occurrences.push(Occurrence {
                event_type: EventType::Warning,
                reason: CANNOT_JUDGE_REASON.to_owned(),
                about: NODE.to_owned(),
                note: format!("cannot judge this node: {}; try: {}", blind.why, blind.hint),
                related: None,
            }),
            (Some(was), None) => occurrences.push(Occurrence {
                event_type: EventType::Normal,
                reason: CAN_JUDGE_REASON.to_owned(),
                about: NODE.to_owned(),
                note: format!("the node is judged again; before: {}", was.why),
                related: None,
            }),
            _ => {}
        }
        for (path, failing) in &self.failing {
            if before.failing.get(path).is_some_and(|was| was.verdict == failing.verdict) {
                continue;
            }
            occurrences.push(Occurrence {
                event_type: EventType::Warning,
                reason: failing.verdict.reason(),
                about: path.display().to_string(),
                note: format!(
                    "{} ({}{}) is {}: {}",
                    failing.subject,
                    path.display(),
                    failing.pod.as_ref().map_or_else(String::new, |pod| format!(", {pod}")),
                    failing.verdict.name(),
                    failing.reason
                ),
                related: failing.pod.clone(),
            });
        }
        if self.blind.is_some() {
            return occurrences;
        }
        for (path, was) in &before.failing {
            let now = self.failing.get(path).map(|failing| failing.verdict);
            if was.verdict == Verdict::Flapping && now != Some(Verdict::Flapping) {
                let now = match (now, self.sockets.get(path)) {
                    (Some(verdict), _) => verdict.name(),
                    (None, Some(socket)) => socket.verdict.name(),
                    (None, None) => "gone",
                };
                occurrences.push(Occurrence {
                    event_type: EventType::Normal,
                    reason: STABLE_REASON.to_owned(),
                    about: path.display().to_string(),
                    note: format!(
                        "{} ({}) holds still again after flapping: {now}",
                        was.subject,
                        path.display()
                    ),
                    related: was.pod.clone(),
                });
                continue;
            }
            if now.is_some() {
                continue;
            }
            occurrences.push(Occurrence {
                event_type: EventType::Normal,
                reason: RECOVERED_REASON.to_owned(),
                about: path.display().to_string(),
                note: format!(
                    "{} ({}) is no longer {}",
                    was.subject,
                    path.display(),
                    was.verdict.name()
                ),
                related: was.pod.clone(),
            });
        }
        occurrences
    }
}

/// Whether two failures are behind the same pod container (a new pod of a
/// DaemonSet is another), whatever its restarts.
fn same_container(
    a: Option<&kpm_report::PodContainer>,
    b: Option<&kpm_report::PodContainer>,
) -> bool {
    a.map(|pod| (&pod.uid, &pod.container)) == b.map(|pod| (&pod.uid, &pod.container))
}

/// What `--watch` publishes after each pass, and when it judges again:
/// the decisions of its loop, without IO, on tokio's clock (so that they
/// are tested on paused time).
#[derive(Debug)]
pub(super) struct Publication {
    config: WatchConfig,
    flaps: Flaps,
    graces: Graces,
    /// What was published last; before the first, nothing fails.
    confirmed: Outcome,
    published: bool,
    /// The pass before, damped.
    last: Option<Outcome>,
    /// The wait before a failing node is judged again.
    recheck: Duration,
}

/// What to do after a pass.
#[derive(Debug)]
pub(super) struct Next {
    /// An outcome to publish, and the one published before it.
    pub(super) publish: Option<(Outcome, Outcome)>,
    /// When to judge again, if nothing wakes the loop before.
    pub(super) judge_at: Instant,
}

impl Publication {
    pub(super) fn new(config: WatchConfig) -> Self {
        Self {
            config,
            flaps: Flaps::new(config.flaps),
            graces: Graces::default(),
            confirmed: Outcome::default(),
            published: false,
            last: None,
            recheck: RECHECK,
        }
    }

    /// Takes the pass that saw `seen`, run after a wake-up (a file-system
    /// change, a plugin's exit) when `woken`.
    pub(super) fn after_pass(&mut self, seen: &Outcome, woken: bool) -> Next {
        let now = Instant::now();
        // What the kubelet clears by itself is not seen until its grace is
        // over, by the flap damping either.
        let seen = self.graces.hold(seen.clone(), now);
        self.flaps.observe(&seen, now);
        let outcome = self.flaps.damp(seen);
        let changed = !self.last.as_ref().is_some_and(|last| last.agrees(&outcome));
        let mut confirm_at = None;
        let mut publish = None;
        if self.published && outcome.agrees(&self.confirmed) {
            // Nothing new.
        } else if !changed
            || outcome.only_better_than(&self.confirmed)
            || outcome.newly_lost_to_a_node_event(&self.confirmed)
        {
            let before = std::mem::replace(&mut self.confirmed, outcome.clone());
            publish = Some((outcome.clone(), before));
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
        } else if woken {
            self.config.rechecks.next(None)
        } else {
            self.config.rechecks.next(Some(self.recheck))
        };
        let recheck_at = outcome.fails().then(|| now + self.recheck);
        self.last = Some(outcome);
        let period_at = now + self.config.period;
        let judge_at = [confirm_at, recheck_at, self.flaps.next_stable(), self.graces.next_due()]
            .into_iter()
            .flatten()
            .fold(period_at, Instant::min);
        Next { publish, judge_at }
    }
}
