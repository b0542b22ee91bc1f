//! The one retry schedule of kpm-kube, as apimachinery's `wait.Backoff`
//! computes one, as a [`backon`] backoff.

use std::time::Duration;

/// apimachinery's `wait.Backoff` without its step limit: the first retry
/// waits `duration`, each next one `factor` times longer (at most `cap`),
/// each wait stretched by a random fraction of at most `jitter`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    duration: Duration,
    factor: f64,
    jitter: f64,
    cap: Duration,
}

impl Backoff {
    /// How kpm retries the API server: the kubelet's nodeinfomanager
    /// `updateBackoff` (spec A.8: 10 ms, factor 5, jitter 0.1), so that a
    /// CSI registration fails after the kubelet's four attempts, about
    /// 310 ms of waiting. The kubelet then gives up for good, and a
    /// deregistration that falls in an API server outage is lost; kpm goes
    /// on, every 5 s at most, until the API server holds what kpm
    /// publishes (`docs/ARCHITECTURE.md`, kpm-kube).
    pub(crate) const RETRY: Self = Self {
        duration: Duration::from_millis(10),
        factor: 5.0,
        jitter: 0.1,
        cap: Duration::from_secs(5),
    };
}

impl Iterator for Backoff {
    type Item = Duration;

    /// The wait before the next attempt; never `None`.
    fn next(&mut self) -> Option<Duration> {
        let wait = self.duration;
        self.duration = self.duration.mul_f64(self.factor).min(self.cap);
        Some(wait.mul_f64(1.0 + self.jitter * fastrand::f64()).min(self.cap))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_start_as_the_kubelets_and_go_on_every_five_seconds_at_most() {
        let low = Backoff { jitter: 0.0, ..Backoff::RETRY };
        let waits: Vec<u128> = low.take(8).map(|wait| wait.as_millis()).collect();
        assert_eq!(waits, [10, 50, 250, 1250, 5000, 5000, 5000, 5000]);
        let low = Backoff { jitter: 0.0, ..Backoff::RETRY };
        for (low, wait) in low.zip(Backoff::RETRY).take(100) {
            assert!(
                wait >= low && wait <= (low + low / 10).min(Duration::from_secs(5)),
                "{wait:?} for {low:?}"
            );
        }
    }
}
