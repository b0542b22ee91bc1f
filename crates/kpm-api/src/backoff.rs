//! The one exponential backoff of kpm: the executor's waits between failed
//! operations on a socket (the kubelet's 500 ms doubling to 2 min 2 s),
//! kpm-kube's retries of the API server (the kubelet's `updateBackoff`:
//! 10 ms, ×5, 10 % jitter, capped), the doctor publisher's retries of a
//! failed write and its watch's rechecks of a failing node. A policy is
//! checked once, where it is made (a constant's, by a test of it:
//! [`ExponentialBackoff::new_unchecked`]); waits are then computed without
//! overflow.
//! It lives here because kpm-api is the one crate all of its users depend on.

use std::fmt;
use std::time::Duration;

use crate::config::{CONFIG_PERIOD, DurationOutOfRange};

/// A validated backoff policy: the first failure waits `initial`, each
/// consecutive failure `factor` (2 unless set) times longer, never beyond
/// `max`, itself at most [`MAX_CONFIG_DURATION`](crate::constants::MAX_CONFIG_DURATION): a wait can always be
/// added to the clock. With a jitter, each wait may be stretched by up to
/// that share of itself, still never beyond `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExponentialBackoff {
    initial: Duration,
    max: Duration,
    factor: u32,
    jitter_percent: u32,
}

/// A duration of a policy refused: a `const fn` cannot call a closure.
const fn refused(
    field: &'static str,
    value: Duration,
    reason: &'static str,
) -> Result<ExponentialBackoff, BackoffError> {
    Err(BackoffError::Duration(DurationOutOfRange { field, value, reason }))
}

/// Why a backoff policy was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackoffError {
    /// `backoff.initial` or `backoff.max` is out of range.
    Duration(DurationOutOfRange),
    /// The factor is outside `2..=`[`MAX_FACTOR`](ExponentialBackoff::MAX_FACTOR).
    Factor {
        /// The factor given.
        factor: u32,
    },
    /// The jitter is above 100 %.
    Jitter {
        /// The jitter given, in percent.
        percent: u32,
    },
}

impl fmt::Display for BackoffError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Duration(range) => range.fmt(f),
            Self::Factor { factor } => write!(
                f,
                "backoff.factor {factor} is out of range: between 2 and {}",
                ExponentialBackoff::MAX_FACTOR
            ),
            Self::Jitter { percent } => {
                write!(f, "backoff.jitter {percent}% is out of range: at most 100%")
            }
        }
    }
}

impl std::error::Error for BackoffError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Duration(range) => Some(range),
            _ => None,
        }
    }
}

impl From<DurationOutOfRange> for BackoffError {
    fn from(range: DurationOutOfRange) -> Self {
        Self::Duration(range)
    }
}

impl ExponentialBackoff {
    /// The kubelet's initial wait after a failure.
    pub const DEFAULT_INITIAL: Duration = Duration::from_millis(500);
    /// The kubelet's cap: 2 min 2 s.
    pub const DEFAULT_MAX: Duration = Duration::from_secs(2 * 60 + 2);
    /// The largest factor: beyond it a backoff is a step to `max`.
    pub const MAX_FACTOR: u32 = 10;

    /// Doubling from `initial` to `max`, without jitter. Rejects a zero
    /// `initial` (a retry storm), `initial > max`, and a `max` above
    /// [`MAX_CONFIG_DURATION`](crate::constants::MAX_CONFIG_DURATION). A `const fn`, so that a config's default
    /// policy is checked when kpm is compiled.
    pub const fn try_new(initial: Duration, max: Duration) -> Result<Self, BackoffError> {
        if initial.is_zero() {
            return refused("backoff.initial", initial, "a zero first wait is a retry storm");
        }
        if initial.as_nanos() > max.as_nanos() {
            return refused("backoff.initial", initial, "at most backoff.max");
        }
        if max.as_nanos() > CONFIG_PERIOD.max.as_nanos() {
            return refused("backoff.max", max, CONFIG_PERIOD.text);
        }
        Ok(Self { initial, max, factor: 2, jitter_percent: 0 })
    }

    /// A policy from its four parameters, unchecked: for constants only,
    /// where [`try_new`](Self::try_new) would need a `panic!` to turn its
    /// `Result` into a value (as linkerd2-proxy's exp-backoff does). Each
    /// such constant has a test that [`validate`](Self::validate) gives it
    /// back unchanged; anything read at run time goes through `try_new`.
    pub const fn new_unchecked(
        initial: Duration,
        max: Duration,
        factor: u32,
        jitter_percent: u32,
    ) -> Self {
        Self { initial, max, factor, jitter_percent }
    }

    /// The policy again, through the checks of [`try_new`](Self::try_new),
    /// [`with_factor`](Self::with_factor) and
    /// [`with_jitter`](Self::with_jitter): what proves a constant made
    /// with [`new_unchecked`](Self::new_unchecked) valid.
    pub const fn validate(self) -> Result<Self, BackoffError> {
        let policy = match Self::try_new(self.initial, self.max) {
            Ok(policy) => policy,
            Err(err) => return Err(err),
        };
        let policy = match policy.with_factor(self.factor) {
            Ok(policy) => policy,
            Err(err) => return Err(err),
        };
        policy.with_jitter(self.jitter_percent)
    }

    /// The same policy, each wait `factor` times the one before (2 to
    /// [`MAX_FACTOR`](Self::MAX_FACTOR)).
    pub const fn with_factor(self, factor: u32) -> Result<Self, BackoffError> {
        if factor < 2 || factor > Self::MAX_FACTOR {
            return Err(BackoffError::Factor { factor });
        }
        Ok(Self { factor, ..self })
    }

    /// The same policy, each wait stretched by a random share of at most
    /// `percent` % of itself (apimachinery's `wait.Backoff.Jitter`), which
    /// keeps many nodes from retrying in step.
    pub const fn with_jitter(self, percent: u32) -> Result<Self, BackoffError> {
        if percent > 100 {
            return Err(BackoffError::Jitter { percent });
        }
        Ok(Self { jitter_percent: percent, ..self })
    }

    /// The wait after the first failure.
    pub const fn initial(&self) -> Duration {
        self.initial
    }

    /// The longest wait, reached by growing from [`initial`](Self::initial).
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// How many times longer each wait is than the one before.
    pub const fn factor(&self) -> u32 {
        self.factor
    }

    /// The largest stretch of a wait, in percent of it.
    pub const fn jitter_percent(&self) -> u32 {
        self.jitter_percent
    }

    /// The wait after a failure, given the wait after the previous consecutive
    /// failure (`None` for the first one), without jitter.
    pub fn next(&self, previous: Option<Duration>) -> Duration {
        match previous {
            None => self.initial,
            Some(previous) => previous.saturating_mul(self.factor).clamp(self.initial, self.max),
        }
    }

    /// `wait` stretched by the jitter times `unit`, a random number in
    /// `[0, 1]` the caller draws (taken as 0 when it is not a number, as 1
    /// above 1), never beyond [`max`](Self::max).
    pub fn jittered(&self, wait: Duration, unit: f64) -> Duration {
        let unit = if unit.is_nan() { 0.0 } else { unit.clamp(0.0, 1.0) };
        let stretch = f64::from(self.jitter_percent) / 100.0 * unit;
        // `wait` is at most a year, so the product is finite.
        wait.saturating_add(wait.mul_f64(stretch)).min(self.max)
    }
}

impl Default for ExponentialBackoff {
    fn default() -> Self {
        Self {
            initial: Self::DEFAULT_INITIAL,
            max: Self::DEFAULT_MAX,
            factor: 2,
            jitter_percent: 0,
        }
    }
}

/// A backoff's state across consecutive failures: the waits of
/// [`ExponentialBackoff::next`] one after the other, until a success
/// [`reset`](Self::reset)s it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    policy: ExponentialBackoff,
    last: Option<Duration>,
}

impl Backoff {
    /// Before the first failure.
    pub const fn new(policy: ExponentialBackoff) -> Self {
        Self { policy, last: None }
    }

    /// The wait after one more failure, without jitter.
    pub fn next_delay(&mut self) -> Duration {
        let wait = self.policy.next(self.last);
        self.last = Some(wait);
        wait
    }

    /// After a success: the next failure waits [`ExponentialBackoff::initial`].
    pub fn reset(&mut self) {
        self.last = None;
    }

    /// The last wait given since the reset, if any.
    pub const fn last(&self) -> Option<Duration> {
        self.last
    }

    /// Its policy.
    pub const fn policy(&self) -> &ExponentialBackoff {
        &self.policy
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::constants::MAX_CONFIG_DURATION;

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
        let default = ExponentialBackoff::try_new(
            ExponentialBackoff::DEFAULT_INITIAL,
            ExponentialBackoff::DEFAULT_MAX,
        );
        assert_eq!(default, Ok(backoff));
    }

    #[test]
    fn invalid_policies_are_rejected_by_field() {
        let second = Duration::from_secs(1);
        let refused = |initial, max| match ExponentialBackoff::try_new(initial, max) {
            Err(BackoffError::Duration(range)) => range.field,
            other => panic!("{other:?}"),
        };
        assert_eq!(refused(Duration::ZERO, second), "backoff.initial");
        assert_eq!(refused(2 * second, second), "backoff.initial");
        assert!(ExponentialBackoff::try_new(second, second).is_ok());
        let err = ExponentialBackoff::try_new(2 * second, second).unwrap_err();
        assert!(err.to_string().contains("backoff"), "{err}");
        let policy = ExponentialBackoff::default();
        for factor in [0, 1, ExponentialBackoff::MAX_FACTOR + 1, u32::MAX] {
            assert_eq!(policy.with_factor(factor), Err(BackoffError::Factor { factor }));
        }
        assert_eq!(policy.with_jitter(101), Err(BackoffError::Jitter { percent: 101 }));
        assert!(policy.with_factor(5).and_then(|p| p.with_jitter(100)).is_ok());
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
                matches!(err, BackoffError::Duration(DurationOutOfRange { field: "backoff.max", value, .. }) if value == too_long),
                "{err:?}"
            );
            assert!(err.to_string().contains("backoff.max"), "{err}");
        }
        let longest =
            ExponentialBackoff::try_new(MAX_CONFIG_DURATION, MAX_CONFIG_DURATION).unwrap();
        assert_eq!(longest.next(Some(MAX_CONFIG_DURATION)), MAX_CONFIG_DURATION);
        assert_eq!(longest.next(None), MAX_CONFIG_DURATION);
        let longest = longest.with_factor(ExponentialBackoff::MAX_FACTOR).unwrap();
        let stretched = longest.with_jitter(100).unwrap();
        assert_eq!(stretched.jittered(MAX_CONFIG_DURATION, 1.0), MAX_CONFIG_DURATION);
    }

    #[test]
    fn a_stateful_backoff_grows_and_resets() {
        let policy =
            ExponentialBackoff::try_new(Duration::from_secs(1), Duration::from_secs(5)).unwrap();
        let mut backoff = Backoff::new(policy);
        let waits: Vec<u64> = (0..5).map(|_| backoff.next_delay().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5]);
        backoff.reset();
        assert_eq!(backoff.last(), None);
        assert_eq!(backoff.next_delay(), Duration::from_secs(1));
    }

    #[test]
    fn validate_refuses_what_the_checked_constructors_refuse() {
        let second = Duration::from_secs(1);
        let unchecked = ExponentialBackoff::new_unchecked;
        assert_eq!(
            unchecked(Duration::ZERO, second, 2, 0).validate().map_err(|err| match err {
                BackoffError::Duration(range) => range.field,
                other => panic!("{other:?}"),
            }),
            Err("backoff.initial")
        );
        assert_eq!(
            unchecked(second, second, 1, 0).validate(),
            Err(BackoffError::Factor { factor: 1 })
        );
        assert_eq!(
            unchecked(second, second, 2, 101).validate(),
            Err(BackoffError::Jitter { percent: 101 })
        );
        let default = ExponentialBackoff::default();
        let parts = (default.initial(), default.max(), default.factor(), default.jitter_percent());
        let made = unchecked(parts.0, parts.1, parts.2, parts.3);
        assert_eq!(made, default);
        assert_eq!(made.validate(), Ok(default));
    }

    proptest! {
        /// `new_unchecked` then `validate` is the checked constructors: a
        /// constant made unchecked that validates is one they would make.
        #[test]
        fn an_unchecked_policy_validates_as_the_checked_constructors_build_it(
            initial_ms in 0u64..10_000,
            max_ms in 0u64..20_000,
            factor in 0u32..=ExponentialBackoff::MAX_FACTOR + 2,
            percent in 0u32..=120,
        ) {
            let (initial, max) = (Duration::from_millis(initial_ms), Duration::from_millis(max_ms));
            let checked = ExponentialBackoff::try_new(initial, max)
                .and_then(|policy| policy.with_factor(factor))
                .and_then(|policy| policy.with_jitter(percent));
            let unchecked = ExponentialBackoff::new_unchecked(initial, max, factor, percent);
            prop_assert_eq!(unchecked.validate(), checked);
            if let Ok(checked) = checked {
                prop_assert_eq!(unchecked, checked);
            }
        }

        #[test]
        fn waits_are_monotone_and_within_bounds(
            initial_ms in 1u64..10_000,
            extra_ms in 0u64..500_000,
            factor in 2u32..=ExponentialBackoff::MAX_FACTOR,
            failures in 1usize..80,
        ) {
            let initial = Duration::from_millis(initial_ms);
            let max = initial + Duration::from_millis(extra_ms);
            let backoff =
                ExponentialBackoff::try_new(initial, max).unwrap().with_factor(factor).unwrap();
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

        #[test]
        fn jitter_stretches_within_its_share_and_the_max(
            initial_ms in 1u64..10_000,
            extra_ms in 0u64..500_000,
            percent in 0u32..=100,
            unit in proptest::num::f64::ANY,
            failures in 1usize..40,
        ) {
            let initial = Duration::from_millis(initial_ms);
            let max = initial + Duration::from_millis(extra_ms);
            let policy =
                ExponentialBackoff::try_new(initial, max).unwrap().with_jitter(percent).unwrap();
            let mut backoff = Backoff::new(policy);
            for _ in 0..failures {
                let wait = backoff.next_delay();
                let jittered = policy.jittered(wait, unit);
                let most = wait + wait * percent / 100 + Duration::from_nanos(1);
                prop_assert!(jittered >= wait.min(max) && jittered <= most.min(max),
                    "{jittered:?} for {wait:?}");
                prop_assert_eq!(backoff.last(), Some(wait));
            }
            backoff.reset();
            prop_assert_eq!(backoff.next_delay(), initial);
        }
    }
}
