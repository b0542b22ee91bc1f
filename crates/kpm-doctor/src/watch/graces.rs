//! Findings the kubelet clears by itself after a grace, held back by
//! `--watch` until they outlive it: the ResourceSlices of a DRA driver
//! that went, which a kubelet from 1.33 wipes 30 s after the driver's last
//! instance goes (`kpm_minors::slice_wipe_delay`; node-e2e's `dra`
//! measured 30.0 s on 1.33 to 1.36). Without the hold, every restart or
//! upgrade of a DRA driver turned the condition False for half a minute,
//! with a Warning, and its recovery looked like flapping. Slices still
//! there once the grace is over are published as any new failure: after a
//! second look, and so are slices a kubelet that wipes at once (1.31,
//! 1.32) left for longer than its wipe takes. Slices kept for a driver's stale socket (a `cause`) are
//! not held: that kubelet keeps the driver registered and wipes nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use crate::standing::Standing;
use kpm_report::Verdict;

/// When each finding held back was first seen, by path.
#[derive(Debug, Default)]
pub(super) struct Graces {
    since: BTreeMap<PathBuf, Instant>,
    /// The grace of the kubelet last judged.
    grace: Duration,
}

impl Graces {
    /// `seen` without the findings still within the kubelet's grace, as of
    /// `now`. A blind pass is left as it is, and forgets nothing.
    pub(super) fn hold(&mut self, mut seen: Standing, now: Instant) -> Standing {
        if seen.blind.is_some() {
            return seen;
        }
        self.grace = grace_of(&seen);
        let young: Vec<PathBuf> = seen
            .failing
            .iter()
            .filter(|(_, failing)| {
                failing.verdict == Verdict::OrphanedSlices && failing.cause.is_none()
            })
            .map(|(path, _)| path.clone())
            .collect();
        self.since.retain(|path, _| young.contains(path));
        for path in young {
            let since = *self.since.entry(path.clone()).or_insert(now);
            if now < since + self.grace {
                seen.failing.remove(&path);
            }
        }
        seen
    }

    /// When the first finding held back outlives the grace, to be judged
    /// again then.
    pub(super) fn next_due(&self) -> Option<Instant> {
        let now = Instant::now();
        self.since.values().map(|since| *since + self.grace).filter(|due| *due > now).min()
    }
}

/// What a kubelet's wipe takes beyond its delay: a `DeleteCollection`, tried
/// again 1 s then 2 s later when it fails (every minor). node-e2e saw 0.4
/// to 1.0 s on 1.32, which wipes at once, and 30.0 to 30.9 s on 1.33 to
/// 1.36.
const WIPE_SLACK: Duration = Duration::from_secs(5);

/// How long the judged kubelet takes to wipe a gone driver's slices: its
/// minor's delay (none before 1.33), the newer kubelets' when its version
/// is not known, and the wipe's own time.
fn grace_of(seen: &Standing) -> Duration {
    let delay = kpm_minors::slice_wipe_delay(seen.kubelet.version.as_deref());
    delay.unwrap_or_default() + WIPE_SLACK
}
