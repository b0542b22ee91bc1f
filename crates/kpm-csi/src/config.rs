//! The CSI handler's settings.

use std::collections::BTreeMap;
use std::time::Duration;

use kpm_api::config::check_durations;

use crate::error::CsiError;

/// The kubelet's `csiTimeout`: how long NodeGetInfo may take at registration.
pub const DEFAULT_NODE_GET_INFO_TIMEOUT: Duration = Duration::from_secs(120);

/// Settings of the [`CsiHandler`](crate::CsiHandler). Build it from [`Default`] with the
/// setters; the fields are public to read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CsiConfig {
    /// How long dialing the driver and its NodeGetInfo may take together.
    /// Default [`DEFAULT_NODE_GET_INFO_TIMEOUT`] (2 min), as in the kubelet.
    pub node_get_info_timeout: Duration,
    /// The node's own allocatable update periods, by driver name: these
    /// drivers' counts are refreshed on this period whatever the cluster
    /// says. Empty by default.
    pub allocatable_update_periods: BTreeMap<String, Duration>,
}

impl Default for CsiConfig {
    fn default() -> Self {
        Self {
            node_get_info_timeout: DEFAULT_NODE_GET_INFO_TIMEOUT,
            allocatable_update_periods: BTreeMap::new(),
        }
    }
}

impl CsiConfig {
    /// Sets [`node_get_info_timeout`](Self::node_get_info_timeout) (default
    /// [`DEFAULT_NODE_GET_INFO_TIMEOUT`], 2 min).
    #[must_use]
    pub fn node_get_info_timeout(mut self, timeout: Duration) -> Self {
        self.node_get_info_timeout = timeout;
        self
    }

    /// Refreshes `driver`'s allocatable count every `period`, as a CSIDriver
    /// with `nodeAllocatableUpdatePeriodSeconds` would have the kubelet do
    /// (KEP-4876): `NodeGetInfo` on the period, and the CSINode entry's
    /// `allocatable.count` updated when the driver's limit changed. A
    /// period below [`MIN_ALLOCATABLE_UPDATE_PERIOD`](crate::MIN_ALLOCATABLE_UPDATE_PERIOD)
    /// (10 s) is raised to it. This setting wins over the cluster's.
    #[must_use]
    pub fn allocatable_update_period(
        mut self,
        driver: impl Into<String>,
        period: Duration,
    ) -> Self {
        self.allocatable_update_periods.insert(driver.into(), period);
        self
    }

    /// Refuses a zero timeout (every driver would fail) and one above
    /// [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION),
    /// which a deadline and the gRPC timeout header could not carry; update
    /// periods are bounded by it when used.
    pub fn validate(&self) -> Result<(), CsiError> {
        Ok(check_durations(&[("node_get_info_timeout", self.node_get_info_timeout)], &[])?)
    }
}
