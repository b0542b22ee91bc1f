//! The kubelet's retry schedules, as apimachinery's `wait.Backoff` computes
//! them, as [`backon`] backoffs.

use std::time::Duration;

/// apimachinery's `wait.Backoff`: `steps` attempts; the first retry waits
/// `duration`, each next one `factor` times longer (at most `cap`), each
/// wait stretched by a random fraction of at most `jitter`.
#[derive(Debug, Clone)]
pub(crate) struct KubeletBackoff {
    duration: Duration,
    factor: f64,
    jitter: f64,
    /// Attempts left, the first one included.
    steps: u32,
    cap: Duration,
}

impl KubeletBackoff {
    /// The nodeinfomanager's `updateBackoff` (spec A.8): 4 attempts, 10 ms,
    /// factor 5, jitter 0.1, so at most 10 + 50 + 250 ms of waiting.
    pub(crate) const NODE_INFO: Self = Self {
        duration: Duration::from_millis(10),
        factor: 5.0,
        jitter: 0.1,
        steps: 4,
        cap: Duration::MAX,
    };

    /// The DRA manager's ResourceSlice wipe (spec C.5): 1 s, factor 2,
    /// jitter 0.2, at most 5 min, 100 attempts.
    pub(crate) const SLICE_WIPE: Self = Self {
        duration: Duration::from_secs(1),
        factor: 2.0,
        jitter: 0.2,
        steps: 100,
        cap: Duration::from_secs(5 * 60),
    };

    /// The retries of the device capacity: 500 ms, doubling, at most 30 s,
    /// without end (the publisher keeps trying while it runs).
    pub(crate) const CAPACITY: Self = Self {
        duration: Duration::from_millis(500),
        factor: 2.0,
        jitter: 0.1,
        steps: u32::MAX,
        cap: Duration::from_secs(30),
    };
}

impl Iterator for KubeletBackoff {
    type Item = Duration;

    /// The wait before the next attempt; `None` after the last attempt.
    fn next(&mut self) -> Option<Duration> {
        if self.steps <= 1 {
            return None;
        }
        self.steps -= 1;
        let wait = self.duration;
        self.duration = self.duration.mul_f64(self.factor).min(self.cap);
        Some(wait.mul_f64(1.0 + self.jitter * fastrand::f64()).min(self.cap))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(backoff: KubeletBackoff) -> Vec<(u128, u128)> {
        let mut low = backoff.clone();
        low.jitter = 0.0;
        low.zip(backoff).map(|(low, wait)| (low.as_millis(), wait.as_millis())).collect()
    }

    #[test]
    fn node_info_retries_three_times_after_10_50_250_ms_plus_at_most_a_tenth() {
        let waits = bounds(KubeletBackoff::NODE_INFO);
        assert_eq!(waits.iter().map(|w| w.0).collect::<Vec<_>>(), [10, 50, 250]);
        for (low, wait) in waits {
            assert!(wait >= low && wait <= low + low / 10, "{wait} ms for {low} ms");
        }
    }

    #[test]
    fn slice_wipes_double_from_one_second_up_to_five_minutes_for_100_attempts() {
        let waits: Vec<u128> = bounds(KubeletBackoff::SLICE_WIPE).iter().map(|w| w.0).collect();
        assert_eq!(waits.len(), 99);
        assert_eq!(
            waits[..10],
            [1000, 2000, 4000, 8000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000]
        );
        assert!(waits[10..].iter().all(|wait| *wait == 300_000));
        let mut waits = KubeletBackoff::SLICE_WIPE;
        assert!(waits.all(|wait| wait <= Duration::from_secs(300)));
    }
}
