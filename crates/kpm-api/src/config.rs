//! The range check every kpm config shares for its durations.
//!
//! Every crate's settings are one config struct of one shape
//! (`ExecutorConfig`, `ReconcilerConfig`, `WatcherConfig`, `LivenessConfig`,
//! `CsiConfig`, `DeviceConfig`, `DraConfig`, `KubeConfig`): `Default` with
//! the kubelet's figures; `#[non_exhaustive]`, so that a new setting breaks
//! no user and no literal is written outside the crate; a `#[must_use]`
//! setter per field, named after it, whose doc gives the default; public
//! fields to read them back, and no getters. The ranges are checked once, by
//! the config's `validate()` with [`check_durations`] (against
//! [`CONFIG_TIMEOUT`] and [`CONFIG_PERIOD`]), called by the
//! constructor of what runs (`try_new(config, …)`, `Watcher::start`,
//! `KubePublisher::new`): never by the setters, and never per operation.
//! A refusal names the field: the crate's `InvalidConfig` variant, or a
//! config error of its own where the crate's error is about plugins
//! (`DeviceConfigError`, `DraConfigError`). Settings of other ranges than a
//! duration's (the doctor's, the fleet reader's) are checked against their
//! [`Bounds`], which also tell a command line what it may take. A config holds settings only:
//! counters belong to what runs (`Watcher::stats`), and where a component
//! dials or accepts, its fd budget is an argument of that constructor, not a
//! setting with a default.

use std::fmt::{self, Debug};
use std::time::Duration;

use crate::constants::MAX_CONFIG_DURATION;

/// The range a setting takes, both ends included, and how a refusal says
/// it. One constant per range, public, so that a command line bounds its
/// flags with the library's own figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Bounds<T> {
    /// The least value taken.
    pub min: T,
    /// The greatest value taken.
    pub max: T,
    /// The range in words: `between 1s and 24h`.
    pub text: &'static str,
}

impl<T: PartialOrd + Debug> Bounds<T> {
    /// The range from `min` to `max`, said as `text`.
    pub const fn new(min: T, max: T, text: &'static str) -> Self {
        Self { min, max, text }
    }

    /// Whether `value` is in the range.
    pub fn contains(&self, value: &T) -> bool {
        (&self.min..=&self.max).contains(&value)
    }

    /// `value` of `field` when it is in the range; else the refusal,
    /// naming the field.
    pub fn check(&self, field: &'static str, value: T) -> Result<T, OutOfRange> {
        if self.contains(&value) {
            Ok(value)
        } else {
            Err(OutOfRange { field, value: format!("{value:?}"), expected: self.text })
        }
    }
}

/// The bounds of one request to the API server or a plugin: a millisecond
/// (a zero deadline fails every call) to 10 min.
pub const REQUEST_TIMEOUT: Bounds<Duration> =
    Bounds::new(Duration::from_millis(1), Duration::from_secs(10 * 60), "between 1ms and 10m");

/// A setting out of its [`Bounds`]: which one, its value, and the range.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutOfRange {
    /// The field, as `config.field`.
    pub field: &'static str,
    /// The value given, as Rust debug-prints it.
    pub value: String,
    /// What it must be: the range's [`text`](Bounds::text).
    pub expected: &'static str,
}

impl fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {} is out of range: it must be {}", self.field, self.value, self.expected)
    }
}

impl std::error::Error for OutOfRange {}

/// A duration setting out of range: which one, its value, and the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DurationOutOfRange {
    /// The config field.
    pub field: &'static str,
    /// The value it was given.
    pub value: Duration,
    /// The rule it breaks.
    pub reason: &'static str,
}

impl fmt::Display for DurationOutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?} is out of range: {}", self.field, self.value, self.reason)
    }
}

impl std::error::Error for DurationOutOfRange {}

/// A timeout of a config: non-zero (a zero deadline fails every call) and
/// at most [`MAX_CONFIG_DURATION`].
pub const CONFIG_TIMEOUT: Bounds<Duration> = Bounds::new(
    Duration::from_nanos(1),
    MAX_CONFIG_DURATION,
    "non-zero (a zero timeout fails every call) and at most 365 days (MAX_CONFIG_DURATION)",
);

/// Any other duration of a config: at most [`MAX_CONFIG_DURATION`]; zero is
/// taken, and each config documents what it means (off, or at once).
pub const CONFIG_PERIOD: Bounds<Duration> =
    Bounds::new(Duration::ZERO, MAX_CONFIG_DURATION, "at most 365 days (MAX_CONFIG_DURATION)");

/// Checks a config's durations, `timeouts` against [`CONFIG_TIMEOUT`] and
/// `periods` against [`CONFIG_PERIOD`]; the first out of range is refused.
pub fn check_durations(
    timeouts: &[(&'static str, Duration)],
    periods: &[(&'static str, Duration)],
) -> Result<(), DurationOutOfRange> {
    let checked = |bounds: &'static Bounds<Duration>| {
        move |&(field, value): &(&'static str, Duration)| {
            (!bounds.contains(&value)).then_some(DurationOutOfRange {
                field,
                value,
                reason: bounds.text,
            })
        }
    };
    let refused = timeouts
        .iter()
        .find_map(checked(&CONFIG_TIMEOUT))
        .or_else(|| periods.iter().find_map(checked(&CONFIG_PERIOD)));
    refused.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_take_both_ends_and_name_the_field_they_refuse() {
        let pages = Bounds::new(1_u32, 10, "between 1 and 10");
        assert_eq!(pages.check("fleet.page_size", 1), Ok(1));
        assert_eq!(pages.check("fleet.page_size", 10), Ok(10));
        let refused = pages.check("fleet.page_size", 0).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "fleet.page_size = 0 is out of range: it must be between 1 and 10"
        );
        assert!(!REQUEST_TIMEOUT.contains(&Duration::ZERO));
        assert!(REQUEST_TIMEOUT.contains(&Duration::from_secs(600)));
        assert!(!REQUEST_TIMEOUT.contains(&Duration::from_millis(600_001)));
    }

    #[test]
    fn timeouts_must_be_set_and_everything_within_a_year() {
        let second = Duration::from_secs(1);
        let too_long = MAX_CONFIG_DURATION + Duration::from_nanos(1);
        assert_eq!(check_durations(&[("t", second)], &[("p", Duration::ZERO)]), Ok(()));
        assert_eq!(
            check_durations(&[("t", MAX_CONFIG_DURATION)], &[("p", MAX_CONFIG_DURATION)]),
            Ok(())
        );
        let refused =
            |timeouts: &[_], periods: &[_]| check_durations(timeouts, periods).unwrap_err();
        assert_eq!(refused(&[("t", second), ("u", Duration::ZERO)], &[]).field, "u");
        assert_eq!(refused(&[("t", Duration::MAX)], &[]).field, "t");
        assert_eq!(
            refused(&[("t", Duration::ZERO)], &[]).to_string(),
            "t 0ns is out of range: non-zero (a zero timeout fails every call) and at most 365 days (MAX_CONFIG_DURATION)"
        );
        let long = refused(&[("t", second)], &[("p", too_long)]);
        assert_eq!((long.field, long.value), ("p", too_long));
        assert_eq!(
            long.to_string(),
            "p 31536000.000000001s is out of range: at most 365 days (MAX_CONFIG_DURATION)"
        );
    }
}
