//! Probes: when each followed plugin is probed (spread over the period, on
//! a grid of ticks), what each probe asks over which connection (see
//! [`crate::probe`]), and what the monitor makes of the answers: a plugin
//! that fails `failure_threshold` probes in a row is registered anew.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kpm_api::constants::CSI_PLUGIN;
use kpm_cache::{Generation, Registration};
use tokio::time::Instant;

use super::{Done, State};
use crate::ProbeFailure;
use crate::probe::{Ask, Call, Checked, Target, check};

/// The step of the grid probes fall on (see `first_probe`), or the
/// period if shorter.
pub(super) const PROBE_TICK: Duration = Duration::from_secs(2);

/// The sockets a plugin is probed on: its registration socket, asked
/// `GetInfo` when a PING is not enough; for a CSI driver also its endpoint,
/// asked `Identity/Probe` (the registration socket is node-driver-registrar's,
/// which answers while the driver hangs). A driver serving both on one
/// socket is one server, asked `GetInfo`. `driver` is the socket the
/// plugin is served on.
pub(super) fn targets(socket: &Path, info: &Registration, driver: &Path) -> Vec<Target> {
    if info.plugin_type != CSI_PLUGIN || driver.as_os_str().is_empty() || driver == socket {
        return vec![Target::new(socket.to_path_buf(), Call::GetInfo)];
    }
    vec![
        Target::new(socket.to_path_buf(), Call::GetInfo),
        Target::new(driver.to_path_buf(), Call::CsiProbe),
    ]
}

impl State<'_> {
    /// When a newly followed plugin is first probed: on a random tick of the
    /// next period. The ticks are a grid from the monitor's start, and each
    /// probe is a period after the last, so with a period that is a whole
    /// number of ticks (the default) every probe falls on the grid: the
    /// runtime wakes once per tick for that tick's share of the plugins,
    /// instead of once per probe. Waking was most of what a probe cost
    /// (docs/performance.md).
    pub(super) fn first_probe(&self, period: Duration) -> Instant {
        let tick = PROBE_TICK.min(period).as_nanos();
        let next_tick = self.origin.elapsed().as_nanos().div_ceil(tick);
        let ticks_per_period = (period.as_nanos() / tick).max(1);
        let offset = (next_tick + fastrand::u128(0..ticks_per_period)) * tick;
        // Within a period of now: far from overflowing either type.
        self.origin + Duration::from_nanos(u64::try_from(offset).unwrap_or(u64::MAX))
    }

    /// A plugin's probe is due: start it, and schedule the next one a period
    /// later (on its own phase, whatever the probe takes).
    pub(super) fn probe_due(&mut self, socket: PathBuf, due: Instant) {
        let (Some(period), Some(followed)) =
            (self.monitor.config.period, self.followed.get_mut(&socket))
        else {
            return;
        };
        let next = (due + period).max(Instant::now());
        followed.next_probe = Some(self.schedule.insert_at(socket.clone(), next));
        // A probe still running (a hung plugin's, within its timeout) is
        // judged first; this round is skipped.
        if followed.probing {
            return;
        }
        followed.probing = true;
        let (generation, timeout) = (followed.generation, self.monitor.config.timeout);
        let failing = followed.failures > 0;
        let mut shared = self.monitor.shared.as_ref().and_then(|shared| {
            let info = self.monitor.actual.get(&socket)?;
            (info.generation == generation).then(|| shared.connection(&info)).flatten()
        });
        let checks: Vec<_> = followed
            .targets
            .iter_mut()
            .map(|target| {
                let shared = if target.socket == socket { shared.take() } else { None };
                target.next_check(failing, shared)
            })
            .collect();
        let connections = Arc::clone(&self.connections);
        self.probes.push(Box::pin(async move {
            let mut checked = Vec::with_capacity(checks.len());
            for one in checks {
                checked.push(check(one, timeout, &connections).await);
            }
            Done::Probed { socket, generation, checked }
        }));
    }

    /// What a probe found: counted, and the plugin renewed if it failed
    /// too many in a row.
    pub(super) fn judge(&mut self, socket: &Path, generation: Generation, checked: Vec<Checked>) {
        let counters = &self.monitor.counters;
        counters.probes.fetch_add(1, Ordering::Relaxed);
        for one in &checked {
            match one.asked() {
                Some(Ask::Ping) => counters.pings.fetch_add(1, Ordering::Relaxed),
                Some(Ask::Call(_)) => counters.probe_calls.fetch_add(1, Ordering::Relaxed),
                None => 0,
            };
        }
        let Some(followed) = self.followed.get_mut(socket) else { return };
        if followed.generation != generation {
            return;
        }
        followed.probing = false;
        // The first failure is the one told; every target takes back its
        // connection (a failed one's is closed now).
        let mut failure = None;
        for (target, checked) in followed.targets.iter_mut().zip(checked) {
            let outcome = target.checked(checked).map_err(|failed| {
                if target.socket.as_path() == socket {
                    return failed;
                }
                let reason =
                    format!("its driver at {}: {}", target.socket.display(), failed.reason);
                ProbeFailure { reason, ..failed }
            });
            failure = failure.or(outcome.err());
        }
        let Some(failure) = failure else {
            followed.failures = 0;
            return;
        };
        counters.failed_probes.fetch_add(1, Ordering::Relaxed);
        let threshold = self.monitor.config.failure_threshold;
        followed.failures = if failure.gone { threshold } else { followed.failures + 1 };
        let failures = followed.failures;
        if failures < threshold {
            tracing::debug!(
                socket = %socket.display(), failures, reason = %failure.reason,
                "liveness probe failed"
            );
            return;
        }
        self.renew(socket, generation, failures, failure.reason);
    }
}
