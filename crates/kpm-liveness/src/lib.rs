//! Liveness probing of registered plugins.
//!
//! The kubelet only looks at the registry directory: a plugin that crashed
//! and left its socket file behind stays registered forever (kubernetes
//! #128696). The [`LivenessProber`] asks every registered plugin for
//! `GetInfo` once per period. A plugin that fails `failure_threshold` probes
//! in a row, or whose socket refuses connections (nobody listens: the plugin
//! is gone), gets a new generation in [`DesiredState`]
//! ([`DesiredState::renew`]). The reconciler then does what it does for any
//! new incarnation: deregisters the old one and registers anew, which fails
//! and backs off until the plugin answers again.
//!
//! The prober never touches ActualState or a handler itself, so every
//! registration and deregistration still goes through the one operation per
//! socket of the executor: nothing is deregistered twice.

#![deny(missing_docs)]

mod probe;

use kpm_api::config::check_durations;
use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kpm_cache::{ActualState, DesiredState, EventBus, Generation, PluginEvent};
use parking_lot::Mutex;
use tokio::task::JoinSet;

pub use probe::{ProbeFailure, probe};

/// Probes in flight at once: enough to get through a thousand plugins in a
/// fraction of the period, few enough not to flood the node.
const CONCURRENT_PROBES: usize = 16;

/// Settings of liveness probing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessConfig {
    /// Time between two probes of a plugin: non-zero, at most
    /// [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION) (365 days).
    pub period: Duration,
    /// Failed probes in a row after which the plugin is registered anew.
    pub failure_threshold: u32,
    /// Deadline of each step of a probe (dial, `GetInfo`): non-zero, at most
    /// the period.
    pub timeout: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            period: Duration::from_secs(10),
            failure_threshold: 3,
            timeout: Duration::from_secs(1),
        }
    }
}

/// Why liveness probing cannot start.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum LivenessError {
    /// The period is zero: the prober would spin.
    #[error("liveness probing: the period must be non-zero")]
    ZeroPeriod,
    /// The failure threshold is zero: every plugin would be registered anew
    /// on every probe.
    #[error("liveness probing: the failure threshold must be at least 1")]
    ZeroThreshold,
    /// The probe timeout is zero or longer than the period, so probes of one
    /// plugin would overlap.
    #[error(
        "liveness probing: the probe timeout {timeout:?} must be non-zero and at most the period {period:?}"
    )]
    InvalidTimeout {
        /// The probe timeout given.
        timeout: Duration,
        /// The period given.
        period: Duration,
    },
    /// A duration is longer than [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION).
    #[error("liveness probing: {0}")]
    InvalidConfig(#[from] kpm_api::config::DurationOutOfRange),
}

impl LivenessConfig {
    /// Checks the ranges [`LivenessProber::new`] relies on: a non-zero period
    /// of at most [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION), a threshold of at least 1, and a
    /// non-zero timeout of at most the period.
    pub fn validate(&self) -> Result<(), LivenessError> {
        if self.period.is_zero() {
            return Err(LivenessError::ZeroPeriod);
        }
        check_durations(&[], &[("period", self.period)])?;
        if self.failure_threshold == 0 {
            return Err(LivenessError::ZeroThreshold);
        }
        if self.timeout.is_zero() || self.timeout > self.period {
            return Err(LivenessError::InvalidTimeout {
                timeout: self.timeout,
                period: self.period,
            });
        }
        Ok(())
    }
}

/// Failed probes in a row of one plugin incarnation.
#[derive(Debug, Clone, Copy)]
struct Failures {
    generation: Generation,
    count: u32,
}

/// Probes registered plugins and renews the ones that stopped answering.
#[derive(Debug)]
pub struct LivenessProber {
    desired: Arc<DesiredState>,
    actual: Arc<ActualState>,
    events: EventBus,
    config: LivenessConfig,
    failures: Mutex<HashMap<PathBuf, Failures>>,
}

impl LivenessProber {
    /// A prober of the plugins registered in `actual`; refuses a config that
    /// does not pass [`LivenessConfig::validate`].
    pub fn new(
        desired: Arc<DesiredState>,
        actual: Arc<ActualState>,
        events: EventBus,
        config: LivenessConfig,
    ) -> Result<Self, LivenessError> {
        config.validate()?;
        Ok(Self { desired, actual, events, config, failures: Mutex::new(HashMap::new()) })
    }

    /// The period, timeout and threshold the prober runs with.
    pub fn config(&self) -> &LivenessConfig {
        &self.config
    }

    /// Probes every registered plugin once per period until `shutdown`.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut ticks = tokio::time::interval(self.config.period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await; // the first tick is immediate; plugins were just registered
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = ticks.tick() => {}
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = self.probe_all() => {}
            }
        }
        tracing::debug!("liveness prober stopped");
    }

    /// One round: probes every registered plugin, at most
    /// 16 at a time, and renews those that failed too often.
    pub async fn probe_all(&self) {
        let mut pending = self.actual.paths().into_iter();
        let mut running = JoinSet::new();
        loop {
            while running.len() < CONCURRENT_PROBES {
                let Some(socket) = pending.next() else { break };
                // Deregistered since the round started: nothing to probe.
                let Some(generation) = self.actual.generation(&socket) else { continue };
                let timeout = self.config.timeout;
                running.spawn(async move {
                    let outcome = probe(&socket, timeout).await;
                    (socket, generation, outcome)
                });
            }
            let Some(joined) = running.join_next().await else { break };
            // A probe task only panics if tonic does; count it as no answer.
            let Ok((socket, generation, outcome)) = joined else { continue };
            self.judge(&socket, generation, outcome);
        }
        // Forget plugins that are no longer registered (the map is small:
        // only plugins that failed their last probe).
        self.failures.lock().retain(|socket, _| self.actual.contains(socket));
    }

    fn judge(&self, socket: &PathBuf, generation: Generation, outcome: Result<(), ProbeFailure>) {
        let failure = match outcome {
            Ok(()) => {
                self.failures.lock().remove(socket);
                return;
            }
            Err(failure) => failure,
        };
        let count = {
            let mut failures = self.failures.lock();
            let entry = failures.entry(socket.clone()).or_insert(Failures { generation, count: 0 });
            if entry.generation != generation {
                *entry = Failures { generation, count: 0 };
            }
            entry.count =
                if failure.gone { self.config.failure_threshold } else { entry.count + 1 };
            let count = entry.count;
            if count >= self.config.failure_threshold {
                failures.remove(socket);
            }
            count
        };
        let Some(info) = self.actual.get(socket) else { return };
        if count < self.config.failure_threshold {
            tracing::debug!(
                socket = %socket.display(), plugin = %info.name, failures = count,
                reason = %failure.reason, "liveness probe failed"
            );
            return;
        }
        // Only the incarnation that was probed: a socket re-created meanwhile
        // is a new plugin and is left alone.
        if self.desired.renew(socket, generation).is_none() {
            return;
        }
        tracing::warn!(
            socket = %socket.display(), plugin = %info.name, plugin_type = %info.plugin_type,
            failures = count, reason = %failure.reason,
            "plugin stopped answering; registering it anew"
        );
        self.events.publish(PluginEvent::Unresponsive {
            socket: socket.clone(),
            generation,
            plugin_type: info.plugin_type,
            name: info.name,
            failures: count,
            reason: failure.reason,
        });
    }
}
