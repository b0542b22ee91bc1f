//! Socket incarnations seen and not registered yet, for the registration
//! latency histogram.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tokio::time::Instant;

/// Below this many entries the map is never swept: a sweep would cost more
/// than the memory it frees.
const MIN_SWEEP: usize = 64;

/// When each socket's latest incarnation was seen, until it registers.
///
/// Keyed by socket path, so that a new incarnation replaces the old one. A
/// socket removed before it registers sends no event of its own: such entries
/// are dropped by a sweep over the sockets no longer desired, run only when the
/// map has doubled since the last sweep, so that each event costs O(1)
/// amortized however many sockets churn.
///
/// The sweep reads the desired state as it is now, while the events handled
/// may be a little older: an incarnation that registered and went away
/// before its `Registered` event was handled can be swept first, and its
/// latency goes unobserved. That takes a sweep (64 incarnations or more
/// waiting) at that moment; the histogram loses one sample, never counts a
/// wrong one.
#[derive(Debug)]
pub(super) struct Pending {
    seen: HashMap<PathBuf, Incarnation>,
    /// The size at which the next [`seen`](Self::seen) sweeps.
    sweep_at: usize,
}

#[derive(Debug, Clone, Copy)]
struct Incarnation {
    generation: u64,
    at: Instant,
}

impl Default for Pending {
    fn default() -> Self {
        Self { seen: HashMap::new(), sweep_at: MIN_SWEEP }
    }
}

impl Pending {
    /// Records that incarnation `generation` of `socket` was seen `at`.
    /// `desired` tells whether a socket still exists; it is asked only
    /// during a sweep.
    pub(super) fn seen(
        &mut self,
        socket: PathBuf,
        generation: u64,
        at: Instant,
        desired: impl Fn(&Path) -> bool,
    ) {
        self.seen.insert(socket, Incarnation { generation, at });
        if self.seen.len() >= self.sweep_at {
            self.seen.retain(|socket, _| desired(socket));
            self.sweep_at = self.seen.len().saturating_mul(2).max(MIN_SWEEP);
        }
    }

    /// Forgets incarnation `generation` of `socket` (registered or gone);
    /// returns when it was seen. A newer incarnation of the socket is kept.
    pub(super) fn take(&mut self, socket: &Path, generation: u64) -> Option<Instant> {
        match self.seen.get(socket) {
            Some(incarnation) if incarnation.generation == generation => {
                self.seen.remove(socket).map(|incarnation| incarnation.at)
            }
            _ => None,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    use super::*;

    fn socket(n: usize) -> PathBuf {
        PathBuf::from(format!("/registry/plugin-{n}.sock"))
    }

    #[test]
    fn an_incarnation_is_taken_once_with_the_time_it_was_seen() {
        let mut pending = Pending::default();
        let at = Instant::now();
        pending.seen(socket(0), 1, at, |_| true);
        assert_eq!(pending.take(&socket(0), 1), Some(at));
        assert_eq!(pending.take(&socket(0), 1), None);
        assert_eq!(pending.len(), 0);
    }

    #[test]
    fn a_new_incarnation_replaces_the_old_and_outlives_its_late_events() {
        let mut pending = Pending::default();
        let first = Instant::now();
        let second = first + Duration::from_secs(1);
        pending.seen(socket(0), 1, first, |_| true);
        pending.seen(socket(0), 2, second, |_| true);
        assert_eq!(pending.len(), 1);
        // The old incarnation's deregistration arrives after the new one was seen.
        assert_eq!(pending.take(&socket(0), 1), None);
        assert_eq!(pending.take(&socket(0), 2), Some(second));
    }

    #[test]
    fn sockets_gone_unregistered_are_swept_in_amortized_constant_time() {
        let mut pending = Pending::default();
        let asked = Cell::new(0_usize);
        let at = Instant::now();
        let churned = 100_000;
        for n in 0..churned {
            // Every socket is gone by the time of a sweep, but the last one.
            pending.seen(socket(n), 1, at, |s| {
                asked.set(asked.get() + 1);
                s == socket(n)
            });
            assert!(pending.len() <= MIN_SWEEP, "{} entries after {n} sockets", pending.len());
        }
        assert!(asked.get() <= 2 * churned, "{} questions for {churned} sockets", asked.get());
    }

    #[test]
    fn sockets_still_desired_survive_sweeps_and_double_the_next_sweep_size() {
        let stay = |n: usize| PathBuf::from(format!("/registry/stay-{n}.sock"));
        let mut pending = Pending::default();
        let asked = Cell::new(0_usize);
        let at = Instant::now();
        let waiting = 1_000;
        // Sockets that stay, never registering (a plugin that never answers).
        for n in 0..waiting {
            pending.seen(stay(n), 1, at, |_| {
                asked.set(asked.get() + 1);
                true
            });
        }
        assert_eq!(pending.len(), waiting);
        // Then churn: sockets that come and go without registering.
        let churned = 100_000;
        for n in 0..churned {
            pending.seen(socket(n), 1, at, |s| {
                asked.set(asked.get() + 1);
                s.to_string_lossy().contains("/stay-") || s == socket(n)
            });
            assert!(pending.len() <= 2 * (waiting + 1), "{} entries", pending.len());
        }
        for n in 0..waiting {
            assert_eq!(pending.take(&stay(n), 1), Some(at), "{}", stay(n).display());
        }
        let events = waiting + churned;
        assert!(asked.get() <= 3 * events, "{} questions for {events} events", asked.get());
    }
}
