//! How a node's doctor publishes: [`PublishConfig`], checked where it is
//! made.

use std::time::Duration;

use kpm::ExponentialBackoff;

use super::events::EventConfig;
use crate::ConfigError;
use crate::condition::PluginConditionType;
use kpm::api::config::{Bounds, REQUEST_TIMEOUT};

use crate::config::PERIOD;

/// How a node's doctor publishes. [`Default`], else made by
/// [`builder`](Self::builder), whose [`build`](PublishConfigBuilder::build)
/// checks each field once.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishConfig {
    heartbeat: Duration,
    request_timeout: Duration,
    /// The waits between tries of a failed write: from `retry`, doubling,
    /// up to [`MAX_RETRY`].
    retries: ExponentialBackoff,
    events: EventConfig,
    plugin_conditions: Vec<PluginConditionType>,
}

/// The longest wait between two tries of a failed write.
pub(super) const MAX_RETRY: Duration = Duration::from_secs(120);

/// The range of the first retry's wait: from 10 ms (below, a failing API
/// server would be asked in a loop) to 2 min.
pub const RETRY: Bounds<Duration> =
    Bounds::new(Duration::from_millis(10), MAX_RETRY, "between 10ms and 2m");

/// The default first wait before a failed write is tried again.
const DEFAULT_RETRY: Duration = Duration::from_secs(1);

/// The default retries: 1 s doubling to 2 min.
// Unchecked, as a constant is made: config.rs's
// `the_defaults_are_what_their_builders_build` checks it.
const DEFAULT_RETRIES: ExponentialBackoff =
    ExponentialBackoff::new_unchecked(DEFAULT_RETRY, MAX_RETRY, 2, 0);

impl Default for PublishConfig {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(30 * 60),
            request_timeout: kpm::kube::DEFAULT_REQUEST_TIMEOUT,
            retries: DEFAULT_RETRIES,
            events: EventConfig::default(),
            plugin_conditions: Vec::new(),
        }
    }
}

impl PublishConfig {
    /// A builder from the defaults.
    pub fn builder() -> PublishConfigBuilder {
        PublishConfigBuilder { config: Self::default(), retry: DEFAULT_RETRY }
    }

    /// How often the condition is written when nothing changes, to show
    /// that the doctor still runs: 1 s to a day. Default 30 min.
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat
    }

    /// How long one request may take: 1 ms to 10 min. Default
    /// [`DEFAULT_REQUEST_TIMEOUT`](kpm::kube::DEFAULT_REQUEST_TIMEOUT), 10 s.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The waits between tries of a failed write: [`retry`](Self::retry)
    /// doubling up to 2 min.
    pub(super) fn retries(&self) -> ExponentialBackoff {
        self.retries
    }

    /// The first wait before a failed write is tried again: 10 ms to
    /// 2 min; it doubles up to 2 min. Default 1 s.
    pub fn retry(&self) -> Duration {
        self.retries.initial()
    }

    /// Aggregation and rate of the Events.
    pub fn events(&self) -> EventConfig {
        self.events
    }

    /// The conditions of single plugins written beside the node's own,
    /// each type once. Default none.
    pub fn plugin_conditions(&self) -> &[PluginConditionType] {
        &self.plugin_conditions
    }
}

/// A [`PublishConfig`] being set; [`build`](Self::build) checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishConfigBuilder {
    config: PublishConfig,
    retry: Duration,
}

impl PublishConfigBuilder {
    /// Sets [`PublishConfig::heartbeat`] (default 30 min).
    #[must_use]
    pub fn heartbeat(mut self, heartbeat: Duration) -> Self {
        self.config.heartbeat = heartbeat;
        self
    }

    /// Sets [`PublishConfig::request_timeout`] (default 10 s).
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.config.request_timeout = timeout;
        self
    }

    /// Sets [`PublishConfig::retry`] (default 1 s).
    #[must_use]
    pub fn retry(mut self, retry: Duration) -> Self {
        self.retry = retry;
        self
    }

    /// Sets [`PublishConfig::events`], checked when it was made.
    #[must_use]
    pub fn events(mut self, events: EventConfig) -> Self {
        self.config.events = events;
        self
    }

    /// Sets [`PublishConfig::plugin_conditions`] (default none).
    #[must_use]
    pub fn plugin_conditions(
        mut self,
        conditions: impl IntoIterator<Item = PluginConditionType>,
    ) -> Self {
        self.config.plugin_conditions = conditions.into_iter().collect();
        self
    }

    /// The config, once each field is in its range; the error names the
    /// first that is not.
    pub fn build(self) -> Result<PublishConfig, ConfigError> {
        let PublishConfig { heartbeat, request_timeout, events, plugin_conditions, .. } =
            self.config;
        for (at, condition) in plugin_conditions.iter().enumerate() {
            let earlier = plugin_conditions[..at]
                .iter()
                .find(|earlier| earlier.condition_type() == condition.condition_type());
            if let Some(earlier) = earlier {
                return Err(ConfigError::PluginCondition {
                    spec: condition.plugin().to_owned(),
                    why: format!(
                        "its type {} is {}'s already",
                        condition.condition_type(),
                        earlier.plugin()
                    ),
                });
            }
        }
        let heartbeat = PERIOD.check("publish.heartbeat", heartbeat)?;
        let request_timeout = REQUEST_TIMEOUT.check("publish.request_timeout", request_timeout)?;
        let retry = RETRY.check("publish.retry", self.retry)?;
        let retries = ExponentialBackoff::try_new(retry, MAX_RETRY)
            .map_err(|source| ConfigError::Backoff { field: "publish.retry", source })?;
        Ok(PublishConfig { heartbeat, request_timeout, retries, events, plugin_conditions })
    }
}
