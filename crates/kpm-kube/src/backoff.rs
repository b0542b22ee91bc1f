//! The one retry schedule of kpm-kube, apimachinery's `wait.Backoff`
//! without its step limit, as a [`backon`] backoff: kpm's one backoff
//! ([`ExponentialBackoff`], validated where it is made) with a factor and a
//! jitter, the random share drawn here with `fastrand`. backon only runs
//! the schedule (`retry`, `when`, `notify`); the waits are the one type's.

use std::time::Duration;

use kpm_api::backoff::{self, ExponentialBackoff};

/// How kpm retries the API server: the kubelet's nodeinfomanager
/// `updateBackoff` (spec A.8: 10 ms, factor 5, jitter 0.1), so that a
/// CSI registration fails after the kubelet's four attempts, about
/// 310 ms of waiting. The kubelet then gives up for good, and a
/// deregistration that falls in an API server outage is lost; kpm goes
/// on, every 5 s at most, until the API server holds what kpm
/// publishes (the crate docs, *Kept true*).
// Unchecked, as a constant is made: `the_retry_policy_is_valid` checks it.
const RETRY_POLICY: ExponentialBackoff =
    ExponentialBackoff::new_unchecked(Duration::from_millis(10), Duration::from_secs(5), 5, 10);

/// The waits of [`RETRY_POLICY`] after consecutive failures, each
/// stretched by a random share of at most its jitter.
#[derive(Debug, Clone)]
pub(crate) struct Backoff(backoff::Backoff);

impl Backoff {
    /// Before the first retry of the API server.
    pub(crate) const RETRY: Self = Self(backoff::Backoff::new(RETRY_POLICY));
}

impl Iterator for Backoff {
    type Item = Duration;

    /// The wait before the next attempt; never `None`.
    fn next(&mut self) -> Option<Duration> {
        let wait = self.0.next_delay();
        Some(self.0.policy().jittered(wait, fastrand::f64()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_policy_is_valid() {
        assert_eq!(RETRY_POLICY.validate(), Ok(RETRY_POLICY));
    }

    #[test]
    fn retries_start_as_the_kubelets_and_go_on_every_five_seconds_at_most() {
        let mut low = backoff::Backoff::new(RETRY_POLICY.with_jitter(0).unwrap());
        let waits: Vec<u128> = (0..8).map(|_| low.next_delay().as_millis()).collect();
        assert_eq!(waits, [10, 50, 250, 1250, 5000, 5000, 5000, 5000]);
        let mut low = backoff::Backoff::new(RETRY_POLICY.with_jitter(0).unwrap());
        for wait in Backoff::RETRY.take(100) {
            let low = low.next_delay();
            assert!(
                wait >= low && wait <= (low + low / 10).min(Duration::from_secs(5)),
                "{wait:?} for {low:?}"
            );
        }
    }
}
