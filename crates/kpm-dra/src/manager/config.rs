//! [`DraConfig`]: the settings of the [`DraManager`](crate::DraManager),
//! checked once, when the manager is created
//! ([`DraManager::try_new`](crate::DraManager::try_new)).

use std::path::PathBuf;
use std::time::Duration;

use kpm_api::config::check_durations;

use crate::error::DraConfigError;

/// The kubelet's `defaultClientCallTimeout`: how long `NodePrepareResources`
/// and `NodeUnprepareResources` may take.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(45);

/// The kubelet's `defaultWipingDelay`: how long a driver may have no
/// connected instance before its resources are cleaned up.
pub const DEFAULT_CLEANUP_GRACE: Duration = Duration::from_secs(30);

/// Settings of the [`DraManager`](crate::DraManager). Both durations are at
/// most [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION)
/// (365 days), the call timeout non-zero; see [`validate`](Self::validate).
/// Build it from [`Default`] with the setters; the fields are public to read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DraConfig {
    /// The deadline of each `prepare` / `unprepare` call. Default
    /// [`DEFAULT_CALL_TIMEOUT`] (45 s), as in the kubelet.
    pub call_timeout: Duration,
    /// How long a driver may have no connected instance before
    /// [`SliceCleanup::wipe_driver`](crate::SliceCleanup::wipe_driver) runs.
    /// Default [`DEFAULT_CLEANUP_GRACE`] (30 s), as in the kubelet.
    pub cleanup_grace: Duration,
    /// When set, endpoints must clean (lexically) to a path inside this
    /// directory, the node agent's root (`kpm run` passes its `--root-dir`).
    /// `None` accepts any absolute endpoint.
    pub root_dir: Option<PathBuf>,
}

impl Default for DraConfig {
    fn default() -> Self {
        Self {
            call_timeout: DEFAULT_CALL_TIMEOUT,
            cleanup_grace: DEFAULT_CLEANUP_GRACE,
            root_dir: None,
        }
    }
}

impl DraConfig {
    /// Sets [`call_timeout`](Self::call_timeout) (default
    /// [`DEFAULT_CALL_TIMEOUT`], 45 s).
    #[must_use]
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets [`cleanup_grace`](Self::cleanup_grace) (default
    /// [`DEFAULT_CLEANUP_GRACE`], 30 s).
    #[must_use]
    pub fn cleanup_grace(mut self, grace: Duration) -> Self {
        self.cleanup_grace = grace;
        self
    }

    /// Sets [`root_dir`](Self::root_dir) (default `None`: any absolute
    /// endpoint).
    #[must_use]
    pub fn root_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.root_dir = dir;
        self
    }

    /// Checks the durations: `call_timeout` non-zero (a zero deadline fails
    /// every call) and at most [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION),
    /// `cleanup_grace` at most that (zero: a driver's resources are cleaned
    /// up as soon as its last instance goes).
    ///
    /// [`DraManager::try_new`](crate::DraManager::try_new) checks it, so a
    /// manager never holds a config that does not pass, and no call or
    /// timer checks it again.
    pub fn validate(&self) -> Result<(), DraConfigError> {
        let timeouts = [("call_timeout", self.call_timeout)];
        Ok(check_durations(&timeouts, &[("cleanup_grace", self.cleanup_grace)])?)
    }
}
