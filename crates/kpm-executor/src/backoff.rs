//! Exponential backoff between failed operations on one key, with the
//! kubelet's figures: 500 ms, doubling, capped at 2 min 2 s.

use kpm_api::config::check_durations;
use std::time::Duration;

use crate::ExecutorError;

/// A validated backoff policy: the first failure waits `initial`, each
/// consecutive failure doubles the wait, never beyond `max`, itself at most
/// [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION): a wait can always be added to the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExponentialBackoff {
    initial: Duration,
    max: Duration,
}

impl ExponentialBackoff {
    /// The kubelet's initial wait after a failure.
    pub const DEFAULT_INITIAL: Duration = Duration::from_millis(500);
    /// The kubelet's cap: 2 min 2 s.
    pub const DEFAULT_MAX: Duration = Duration::from_secs(2 * 60 + 2);

    /// Rejects a zero `initial` (a retry storm), `initial > max`, and a
    /// `max` above [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION).
    pub fn try_new(initial: Duration, max: Duration) -> Result<Self, ExecutorError> {
        if initial.is_zero() || initial > max {
            return Err(ExecutorError::InvalidBackoff { initial, max });
        }
        check_durations(&[], &[("backoff.max", max)])?;
        Ok(Self { initial, max })
    }

    /// The wait after the first failure.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The longest wait, reached by doubling from [`initial`](Self::initial).
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The wait after a failure, given the wait after the previous consecutive
    /// failure (`None` for the first one).
    pub fn next(&self, previous: Option<Duration>) -> Duration {
        match previous {
            None => self.initial,
            Some(previous) => previous.saturating_mul(2).clamp(self.initial, self.max),
        }
    }
}

impl Default for ExponentialBackoff {
    fn default() -> Self {
        Self { initial: Self::DEFAULT_INITIAL, max: Self::DEFAULT_MAX }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use kpm_api::constants::MAX_CONFIG_DURATION;

    #[test]
    fn default_sequence_matches_the_kubelet() {
        let backoff = ExponentialBackoff::default();
        let mut previous = None;
        let mut seen = Vec::new();
        for _ in 0..11 {
            let next = backoff.next(previous);
            seen.push(next.as_millis());
            previous = Some(next);
        }
        assert_eq!(
            seen,
            [500, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 122_000, 122_000, 122_000]
        );
    }

    #[test]
    fn invalid_policies_are_rejected() {
        let second = Duration::from_secs(1);
        assert!(ExponentialBackoff::try_new(Duration::ZERO, second).is_err());
        let err = ExponentialBackoff::try_new(2 * second, second).unwrap_err();
        assert!(err.to_string().contains("backoff"), "{err}");
        assert!(ExponentialBackoff::try_new(second, second).is_ok());
    }

    #[test]
    fn a_max_beyond_the_bound_is_refused_and_the_bound_accepted() {
        let second = Duration::from_secs(1);
        for too_long in [
            Duration::MAX,
            Duration::from_secs(u64::MAX),
            MAX_CONFIG_DURATION + Duration::from_nanos(1),
        ] {
            let err = ExponentialBackoff::try_new(second, too_long).unwrap_err();
            assert!(
                matches!(err, ExecutorError::InvalidConfig(kpm_api::config::DurationOutOfRange { field: "backoff.max", value, .. }) if value == too_long),
                "{err:?}"
            );
            assert!(err.to_string().contains("backoff.max"), "{err}");
        }
        let longest =
            ExponentialBackoff::try_new(MAX_CONFIG_DURATION, MAX_CONFIG_DURATION).unwrap();
        assert_eq!(longest.next(Some(MAX_CONFIG_DURATION)), MAX_CONFIG_DURATION);
        assert_eq!(longest.next(None), MAX_CONFIG_DURATION);
    }

    proptest! {
        #[test]
        fn waits_are_monotone_and_within_bounds(
            initial_ms in 1u64..10_000,
            extra_ms in 0u64..500_000,
            failures in 1usize..80,
        ) {
            let initial = Duration::from_millis(initial_ms);
            let max = initial + Duration::from_millis(extra_ms);
            let backoff = ExponentialBackoff::try_new(initial, max).unwrap();
            let mut previous = None;
            for _ in 0..failures {
                let next = backoff.next(previous);
                prop_assert!(next >= initial && next <= max, "{next:?} outside [{initial:?}, {max:?}]");
                if let Some(previous) = previous {
                    prop_assert!(next >= previous, "{next:?} < {previous:?}");
                }
                previous = Some(next);
            }
        }

        #[test]
        fn default_waits_are_within_the_kubelet_bounds(failures in 1usize..200) {
            let backoff = ExponentialBackoff::default();
            let mut previous = None;
            for _ in 0..failures {
                let next = backoff.next(previous);
                prop_assert!(next >= Duration::from_millis(500));
                prop_assert!(next <= Duration::from_secs(122));
                previous = Some(next);
            }
        }
    }
}
