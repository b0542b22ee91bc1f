//! What is wrong with a doctor's configuration: each setting is checked
//! once, where its config is made, and named when refused.
//!
//! Every config of the doctor ([`DoctorConfig`](crate::DoctorConfig),
//! [`WatchConfig`](crate::WatchConfig), [`FlapConfig`](crate::FlapConfig),
//! [`PublishConfig`](crate::PublishConfig),
//! [`EventConfig`](crate::EventConfig)) is made the same way: its
//! [`Default`] is valid, and any other is set on its builder (`builder()`,
//! the setters, then `build()`, which checks every field and names the one
//! it refuses). A built config has no public fields: what the doctor runs
//! with is always what was checked.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kpm::PluginKind;
use kpm::api::config::{Bounds, OutOfRange, REQUEST_TIMEOUT};

use crate::{DEFAULT_TIMEOUT, Host, WELL_KNOWN_ROOTS};

/// A doctor's setting out of range, named by its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The value is outside its [`Bounds`].
    #[error(transparent)]
    OutOfRange(#[from] OutOfRange),
    /// The backoff made from the field was refused.
    #[error("{field}: {source}")]
    Backoff {
        /// The field, as `config.field`.
        field: &'static str,
        /// What the backoff refused.
        #[source]
        source: kpm::BackoffError,
    },
    /// A plugin condition named wrongly, or twice.
    #[error("plugin condition {spec}: {why}")]
    PluginCondition {
        /// What was given.
        spec: String,
        /// Why it is refused.
        why: String,
    },
}

impl ConfigError {
    /// The field refused.
    pub fn field(&self) -> &'static str {
        match self {
            Self::OutOfRange(refused) => refused.field,
            Self::Backoff { field, .. } => field,
            Self::PluginCondition { .. } => "publish.plugin_conditions",
        }
    }
}

/// The longest period of the doctor's loops (a pass, a heartbeat, a flap
/// window): a day, far beyond a useful setting and far from the overflow of
/// `Instant + Duration`.
pub(crate) const MAX_PERIOD: Duration = Duration::from_secs(24 * 60 * 60);

/// The bounds of a period of the doctor's loops: a second (the watch's
/// granularity) to a day.
pub const PERIOD: Bounds<Duration> =
    Bounds::new(Duration::from_secs(1), MAX_PERIOD, "between 1s and 24h");

/// What a [`Doctor`](crate::Doctor) judges and how. [`Default`], else made by
/// [`builder`](Self::builder), whose [`build`](DoctorConfigBuilder::build)
/// checks each field once.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DoctorConfig {
    pub(crate) root_dir: Option<PathBuf>,
    pub(crate) node_name: Option<String>,
    pub(crate) host: Host,
    pub(crate) other_roots: Vec<PathBuf>,
    pub(crate) disabled: Vec<PluginKind>,
    pub(crate) timeout: Duration,
}

impl Default for DoctorConfig {
    fn default() -> Self {
        Self {
            root_dir: None,
            node_name: None,
            host: Host::default(),
            other_roots: WELL_KNOWN_ROOTS.iter().map(PathBuf::from).collect(),
            disabled: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl DoctorConfig {
    /// A builder from the defaults.
    pub fn builder() -> DoctorConfigBuilder {
        DoctorConfigBuilder(Self::default())
    }

    /// The kubelet's root on the host; `None`: the running kubelet's, else
    /// `/var/lib/kubelet`.
    pub fn root_dir(&self) -> Option<&Path> {
        self.root_dir.as_deref()
    }

    /// The name of the node judged, when known (`--node-name`, a
    /// kubeconfig's node): of several kubelets on the host, the one that
    /// is this node is judged. `None`: see [`Doctor`](crate::Doctor) for the rule.
    pub fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    /// Where this process sees the host. Default: the host's own view.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Other roots whose registries are looked at for sockets no kubelet
    /// watches. Default: [`WELL_KNOWN_ROOTS`].
    pub fn other_roots(&self) -> &[PathBuf] {
        &self.other_roots
    }

    /// Plugin types the kubelet runs without a handler.
    pub fn disabled(&self) -> &[PluginKind] {
        &self.disabled
    }

    /// How long dialing and each call may take (`GetInfo` gets the
    /// kubelet's 1 s): 1 ms (a zero deadline fails every call) to 10 min.
    /// Default [`DEFAULT_TIMEOUT`], 5 s.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// A [`DoctorConfig`] being set; [`build`](Self::build) checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctorConfigBuilder(DoctorConfig);

impl DoctorConfigBuilder {
    /// Sets [`DoctorConfig::root_dir`] (default: found).
    #[must_use]
    pub fn root_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.0.root_dir = Some(dir.into());
        self
    }

    /// Sets [`DoctorConfig::node_name`] (default: not known).
    #[must_use]
    pub fn node_name(mut self, name: impl Into<String>) -> Self {
        self.0.node_name = Some(name.into());
        self
    }

    /// Sets [`DoctorConfig::host`] (default: the host's own view).
    #[must_use]
    pub fn host(mut self, host: Host) -> Self {
        self.0.host = host;
        self
    }

    /// Sets [`DoctorConfig::other_roots`] (default [`WELL_KNOWN_ROOTS`]).
    #[must_use]
    pub fn other_roots(mut self, roots: Vec<PathBuf>) -> Self {
        self.0.other_roots = roots;
        self
    }

    /// Sets [`DoctorConfig::disabled`] (default none).
    #[must_use]
    pub fn disabled(mut self, kinds: Vec<PluginKind>) -> Self {
        self.0.disabled = kinds;
        self
    }

    /// Sets [`DoctorConfig::timeout`] (default [`DEFAULT_TIMEOUT`], 5 s).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.0.timeout = timeout;
        self
    }

    /// The config, once each field is in its range; the error names the
    /// first that is not.
    pub fn build(self) -> Result<DoctorConfig, ConfigError> {
        let mut config = self.0;
        config.timeout = REQUEST_TIMEOUT.check("doctor.timeout", config.timeout)?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DoctorConfig, EventConfig, FlapConfig, PublishConfig, WatchConfig};

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
    }

    #[test]
    fn a_refusal_names_the_field_the_value_and_the_range() {
        let err = WatchConfig::builder().period(Duration::ZERO).build().unwrap_err();
        assert_eq!(err.field(), "watch.period");
        assert_eq!(
            err.to_string(),
            "watch.period = 0ns is out of range: it must be between 1s and 24h"
        );
    }
}
