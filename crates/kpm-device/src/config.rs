//! [`DeviceConfig`], the device manager's settings, and their defaults,
//! which are the kubelet's. Kept apart from the manager: a config is built
//! and checked before any manager exists
//! ([`DeviceManager::try_new`](crate::DeviceManager::try_new)).

use std::time::Duration;

use kpm_api::config::check_durations;
use kpm_transport as uds;

use crate::error::DeviceConfigError;

/// The kubelet's dial timeout for device plugins.
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The kubelet's `endpointStopGracePeriod`: how long a resource whose
/// endpoint went away is kept (with unhealthy devices) before it is removed.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);
/// How long `GetDevicePluginOptions`, `Allocate` and
/// `GetPreferredAllocation` may take.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The kubelet's `KubeletPreStartContainerRPCTimeoutInSecs`.
pub const DEFAULT_PRE_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings of the [`DeviceManager`](crate::DeviceManager). Every duration
/// is at most [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION)
/// (365 days) and the timeouts are non-zero; see [`validate`](Self::validate),
/// which [`DeviceManager::try_new`](crate::DeviceManager::try_new) runs once.
/// Build it from [`Default`] with the setters; the fields are public to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceConfig {
    /// How long connecting to a plugin's socket may take. Default 10 s.
    pub dial_timeout: Duration,
    /// How long a resource whose endpoint went away is kept, its devices
    /// unhealthy, before it is removed. Default 5 min, as in the kubelet.
    pub grace_period: Duration,
    /// How long `GetDevicePluginOptions` (at registration), `Allocate` and
    /// `GetPreferredAllocation` may take. Default 30 s.
    pub call_timeout: Duration,
    /// How long `PreStartContainer` may take. Default 30 s, as in the kubelet.
    pub pre_start_timeout: Duration,
    /// How long a client of `kubelet.sock` may take to send its HTTP/2
    /// preface before its connection is closed. Default 10 s.
    pub handshake_timeout: Duration,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            dial_timeout: DEFAULT_DIAL_TIMEOUT,
            grace_period: DEFAULT_GRACE_PERIOD,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            pre_start_timeout: DEFAULT_PRE_START_TIMEOUT,
            handshake_timeout: uds::DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

impl DeviceConfig {
    /// Sets [`dial_timeout`](Self::dial_timeout) (default
    /// [`DEFAULT_DIAL_TIMEOUT`], 10 s).
    #[must_use]
    pub fn dial_timeout(mut self, timeout: Duration) -> Self {
        self.dial_timeout = timeout;
        self
    }

    /// Sets [`grace_period`](Self::grace_period) (default
    /// [`DEFAULT_GRACE_PERIOD`], 5 min).
    #[must_use]
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.grace_period = grace;
        self
    }

    /// Sets [`call_timeout`](Self::call_timeout) (default
    /// [`DEFAULT_CALL_TIMEOUT`], 30 s).
    #[must_use]
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets [`pre_start_timeout`](Self::pre_start_timeout) (default
    /// [`DEFAULT_PRE_START_TIMEOUT`], 30 s).
    #[must_use]
    pub fn pre_start_timeout(mut self, timeout: Duration) -> Self {
        self.pre_start_timeout = timeout;
        self
    }

    /// Sets [`handshake_timeout`](Self::handshake_timeout) (default
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`](kpm_transport::DEFAULT_HANDSHAKE_TIMEOUT), 10 s).
    #[must_use]
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Checks the ranges: the four timeouts non-zero (a zero deadline fails
    /// every call) and at most [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION), `grace_period` at most
    /// that (zero: a resource is removed as soon as its endpoint goes).
    ///
    /// [`DeviceManager::try_new`](crate::DeviceManager::try_new) checks it
    /// once: no manager exists with a config that does not pass, so no
    /// dial, call or timer ever uses one.
    pub fn validate(&self) -> Result<(), DeviceConfigError> {
        let timeouts = [
            ("dial_timeout", self.dial_timeout),
            ("call_timeout", self.call_timeout),
            ("pre_start_timeout", self.pre_start_timeout),
            ("handshake_timeout", self.handshake_timeout),
        ];
        Ok(check_durations(&timeouts, &[("grace_period", self.grace_period)])?)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use kpm_api::config::DurationOutOfRange;
    use kpm_api::constants::MAX_CONFIG_DURATION;

    use super::*;

    #[test]
    fn the_defaults_are_the_kubelets() {
        let config = DeviceConfig::default();
        assert_eq!(config.dial_timeout, Duration::from_secs(10));
        assert_eq!(config.grace_period, Duration::from_secs(300));
        assert_eq!(config.call_timeout, Duration::from_secs(30));
        assert_eq!(config.pre_start_timeout, Duration::from_secs(30));
    }

    /// Every duration of the config at [`MAX_CONFIG_DURATION`].
    pub(crate) fn longest() -> DeviceConfig {
        DeviceConfig::default()
            .dial_timeout(MAX_CONFIG_DURATION)
            .grace_period(MAX_CONFIG_DURATION)
            .call_timeout(MAX_CONFIG_DURATION)
            .pre_start_timeout(MAX_CONFIG_DURATION)
            .handshake_timeout(MAX_CONFIG_DURATION)
    }

    #[test]
    fn durations_out_of_range_are_refused_naming_the_field() {
        type Field = fn(&mut DeviceConfig) -> &mut Duration;
        assert!(DeviceConfig::default().validate().is_ok());
        assert!(longest().validate().is_ok(), "the bound itself is accepted");
        assert!(longest().grace_period(Duration::ZERO).validate().is_ok());
        let fields: [(&str, Field); 5] = [
            ("dial_timeout", |c| &mut c.dial_timeout),
            ("grace_period", |c| &mut c.grace_period),
            ("call_timeout", |c| &mut c.call_timeout),
            ("pre_start_timeout", |c| &mut c.pre_start_timeout),
            ("handshake_timeout", |c| &mut c.handshake_timeout),
        ];
        for (name, field) in fields {
            let mut refused = vec![
                Duration::MAX,
                Duration::from_secs(u64::MAX),
                MAX_CONFIG_DURATION + Duration::from_nanos(1),
            ];
            if name != "grace_period" {
                refused.push(Duration::ZERO);
            }
            for value in refused {
                let mut config = DeviceConfig::default();
                *field(&mut config) = value;
                let error = config.validate().unwrap_err();
                assert!(
                    matches!(error, DeviceConfigError::DurationOutOfRange(DurationOutOfRange { field, value: v, .. }) if field == name && v == value),
                    "{name} = {value:?}: {error:?}"
                );
                assert!(error.to_string().contains(name), "{error}");
            }
        }
    }
}
