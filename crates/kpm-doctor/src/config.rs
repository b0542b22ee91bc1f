//! What is wrong with a doctor's configuration: each setting is checked
//! once, where its config is made, and named when refused.
//!
//! Every config of the doctor ([`DoctorConfig`](crate::DoctorConfig),
//! [`WatchConfig`](crate::WatchConfig), [`FlapConfig`](crate::FlapConfig),
//! [`PublishConfig`](crate::PublishConfig),
//! [`EventConfig`](crate::publish::events::EventConfig),
//! [`FleetConfig`](crate::FleetConfig)) is made the same way: its
//! [`Default`] is valid, and any other is set on its builder (`builder()`,
//! the setters, then `build()`, which checks every field and names the one
//! it refuses). A built config has no public fields: what the doctor runs
//! with is always what was checked.

use std::fmt::Debug;
use std::ops::RangeInclusive;
use std::time::Duration;

/// A doctor's setting out of range, named by its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The value is outside what the field takes.
    #[error("{field} = {value} is out of range: it must be {expected}")]
    OutOfRange {
        /// The field, as `config.field`.
        field: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// The backoff made from the field was refused.
    #[error("{field}: {source}")]
    Backoff {
        /// The field, as `config.field`.
        field: &'static str,
        /// What the backoff refused.
        #[source]
        source: kpm::BackoffError,
    },
}

impl ConfigError {
    /// The field refused.
    pub fn field(&self) -> &'static str {
        match self {
            Self::OutOfRange { field, .. } | Self::Backoff { field, .. } => field,
        }
    }
}

/// `value` of `field` when it lies in `range`, which `expected` tells.
pub(crate) fn bounded<T: PartialOrd + Debug>(
    field: &'static str,
    value: T,
    range: &RangeInclusive<T>,
    expected: &'static str,
) -> Result<T, ConfigError> {
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(ConfigError::OutOfRange { field, value: format!("{value:?}"), expected })
    }
}

/// The longest period of the doctor's loops (a pass, a heartbeat, a flap
/// window): a day, far beyond a useful setting and far from the overflow of
/// `Instant + Duration`.
pub(crate) const MAX_PERIOD: Duration = Duration::from_secs(24 * 60 * 60);

/// The bounds of one request to the API server or a plugin: a millisecond
/// (a zero deadline fails every call) to 10 min.
pub(crate) const REQUEST_TIMEOUT: RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(10 * 60);

/// What [`REQUEST_TIMEOUT`] says.
pub(crate) const REQUEST_TIMEOUT_TEXT: &str = "between 1ms and 10m";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::events::EventConfig;
    use crate::{DoctorConfig, FlapConfig, FleetConfig, PublishConfig, WatchConfig};

    /// Each row: a config built with one setting, and the field refused
    /// (`None`: accepted).
    #[test]
    fn every_config_refuses_a_setting_out_of_range_by_its_field() {
        let secs = Duration::from_secs;
        let ms = Duration::from_millis;
        let (zero, day, nano) = (Duration::ZERO, MAX_PERIOD, Duration::from_nanos(1));
        let watch = WatchConfig::builder;
        let flaps = FlapConfig::builder;
        let publish = PublishConfig::builder;
        let events = EventConfig::builder;
        let doctor = DoctorConfig::builder;
        let fleet = FleetConfig::builder;
        let table: Vec<(Result<(), ConfigError>, Option<&str>)> = vec![
            (watch().period(zero).build().map(drop), Some("watch.period")),
            (watch().period(secs(1)).build().map(drop), None),
            (watch().period(day).build().map(drop), None),
            (watch().period(day + nano).build().map(drop), Some("watch.period")),
            (watch().period(Duration::MAX).build().map(drop), Some("watch.period")),
            (watch().confirm(zero).build().map(drop), None),
            (watch().confirm(secs(60)).build().map(drop), None),
            (watch().confirm(secs(60) + nano).build().map(drop), Some("watch.confirm")),
            (watch().settle(zero).build().map(drop), None),
            (watch().settle(secs(10) + nano).build().map(drop), Some("watch.settle")),
            (flaps().window(zero).build().map(drop), Some("flaps.window")),
            (flaps().hold(day + nano).build().map(drop), Some("flaps.hold")),
            (flaps().changes(0).build().map(drop), None),
            (publish().heartbeat(zero).build().map(drop), Some("publish.heartbeat")),
            (publish().heartbeat(day).build().map(drop), None),
            (publish().heartbeat(Duration::MAX).build().map(drop), Some("publish.heartbeat")),
            (publish().request_timeout(zero).build().map(drop), Some("publish.request_timeout")),
            (publish().request_timeout(ms(1)).build().map(drop), None),
            (
                publish().request_timeout(secs(600) + nano).build().map(drop),
                Some("publish.request_timeout"),
            ),
            (publish().retry(Duration::MAX).build().map(drop), Some("publish.retry")),
            (publish().retry(ms(9)).build().map(drop), Some("publish.retry")),
            (publish().retry(ms(10)).build().map(drop), None),
            (publish().retry(secs(120)).build().map(drop), None),
            (events().burst(0).build().map(drop), Some("events.burst")),
            (events().burst(10_000).build().map(drop), None),
            (events().refill(zero).build().map(drop), Some("events.refill")),
            (events().series_window(zero).build().map(drop), Some("events.series_window")),
            (
                events().series_refresh(Duration::MAX).build().map(drop),
                Some("events.series_refresh"),
            ),
            (doctor().timeout(zero).build().map(drop), Some("doctor.timeout")),
            (doctor().timeout(secs(600)).build().map(drop), None),
            (fleet().page_size(0).build().map(drop), Some("fleet.page_size")),
            (fleet().page_size(1).build().map(drop), None),
            (fleet().page_size(10_001).build().map(drop), Some("fleet.page_size")),
            (fleet().request_timeout(zero).build().map(drop), Some("fleet.request_timeout")),
            (fleet().stale_after(zero).build().map(drop), Some("fleet.stale_after")),
            (fleet().stale_after(secs(7 * 24 * 3600)).build().map(drop), None),
            (
                fleet().stale_after(secs(7 * 24 * 3600) + nano).build().map(drop),
                Some("fleet.stale_after"),
            ),
        ];
        for (row, (built, refused)) in table.into_iter().enumerate() {
            let field = built.as_ref().err().map(ConfigError::field);
            assert_eq!(field, refused, "row {row}: {built:?}");
            if let Err(err) = built {
                assert!(err.to_string().starts_with(refused.unwrap_or_default()), "{err}");
            }
        }
    }

    #[test]
    fn the_defaults_are_what_their_builders_build() {
        assert_eq!(WatchConfig::builder().build(), Ok(WatchConfig::default()));
        assert_eq!(FlapConfig::builder().build(), Ok(FlapConfig::default()));
        assert_eq!(PublishConfig::builder().build(), Ok(PublishConfig::default()));
        assert_eq!(EventConfig::builder().build(), Ok(EventConfig::default()));
        assert_eq!(DoctorConfig::builder().build(), Ok(DoctorConfig::default()));
        assert_eq!(FleetConfig::builder().build(), Ok(FleetConfig::default()));
    }

    #[test]
    fn a_refusal_names_the_field_the_value_and_the_range() {
        let second = Duration::from_secs(1);
        let refused = bounded("watch.period", Duration::ZERO, &(second..=MAX_PERIOD), "1s..=24h");
        let err = refused.unwrap_err();
        assert_eq!(err.field(), "watch.period");
        assert_eq!(err.to_string(), "watch.period = 0ns is out of range: it must be 1s..=24h");
        assert_eq!(bounded("n", 3, &(1..=3), "1..=3"), Ok(3));
    }
}
