//! Refreshing a driver's allocatable count (KEP-4876,
//! `MutableCSINodeAllocatableCount`, GA in Kubernetes 1.36): for a driver
//! with an update period, `NodeGetInfo` on that period, and its CSINode
//! entry's `allocatable.count` updated when `max_volumes_per_node` changed.
//!
//! The kubelet's `csiNodeUpdater` takes the period from the driver's
//! CSIDriver object (`spec.nodeAllocatableUpdatePeriodSeconds`); here a
//! node's own setting ([`CsiConfig::allocatable_update_period`](crate::CsiConfig::allocatable_update_period)) comes
//! first, then what the cluster says ([`AllocatableUpdatePeriods::set`]).
//! Unlike the kubelet, which reads the CSINode every period, nothing is
//! sent to the sink while the count stays the same.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kpm_api::constants::MAX_CONFIG_DURATION;
use kpm_transport::Reach;
use parking_lot::Mutex;
use tokio::task::AbortHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{debug, info, warn};

use crate::client;
use crate::config::CsiConfig;
use crate::error::CsiError;
use crate::locks::NameLocks;
use crate::node_info::NodeInfoSink;
use crate::store::{CsiDrivers, DriverNodeInfo};

/// The shortest update period: the API refuses a CSIDriver with less
/// (`nodeAllocatableUpdatePeriodSeconds` ≥ 10), and a shorter one is
/// raised to it.
pub const MIN_ALLOCATABLE_UPDATE_PERIOD: Duration = Duration::from_secs(10);

/// The update period in effect: at least [`MIN_ALLOCATABLE_UPDATE_PERIOD`],
/// at most [`MAX_CONFIG_DURATION`] (an `Instant` must carry it).
pub(crate) fn effective_period(period: Duration) -> Duration {
    period.clamp(MIN_ALLOCATABLE_UPDATE_PERIOD, MAX_CONFIG_DURATION)
}

/// Where the cluster's update periods enter the CSI handler: the
/// publisher that follows CSIDriver objects calls [`set`](Self::set) for
/// each driver. Cheap to clone; from [`CsiHandler::allocatable_update_periods`](crate::CsiHandler::allocatable_update_periods).
#[derive(Debug, Clone)]
pub struct AllocatableUpdatePeriods {
    updater: Arc<Updater>,
}

impl AllocatableUpdatePeriods {
    pub(crate) fn new(updater: Arc<Updater>) -> Self {
        Self { updater }
    }

    /// Sets the period the cluster gives `driver` (its CSIDriver's
    /// `nodeAllocatableUpdatePeriodSeconds`); `None` when it has none or
    /// its CSIDriver is gone. A registered driver's refresh starts, stops
    /// or restarts on its new period at once; a node's own setting for the
    /// driver wins over this one.
    pub fn set(&self, driver: &str, period: Option<Duration>) {
        {
            let mut state = self.updater.state.lock();
            let old = match period {
                Some(period) => state.from_cluster.insert(driver.to_owned(), period),
                None => state.from_cluster.remove(driver),
            };
            if old == period {
                return;
            }
        }
        debug!(plugin = driver, ?period, "allocatable update period from the cluster");
        self.updater.sync(driver);
    }
}

/// The refreshes of the registered drivers that have an update period:
/// one task each, started and stopped by [`sync`](Self::sync).
#[derive(Debug)]
pub(crate) struct Updater {
    sink: Arc<dyn NodeInfoSink>,
    drivers: Arc<CsiDrivers>,
    locks: Arc<NameLocks>,
    reach: Reach,
    config: CsiConfig,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    from_cluster: HashMap<String, Duration>,
    running: HashMap<String, Refresh>,
}

/// A driver's refresh task, for one endpoint and period.
#[derive(Debug)]
struct Refresh {
    endpoint: String,
    period: Duration,
    task: AbortHandle,
}

impl Drop for Refresh {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Updater {
    pub(crate) fn new(
        sink: Arc<dyn NodeInfoSink>,
        drivers: Arc<CsiDrivers>,
        locks: Arc<NameLocks>,
        reach: Reach,
        config: CsiConfig,
    ) -> Self {
        Self { sink, drivers, locks, reach, config, state: Mutex::default() }
    }

    /// Makes `driver`'s refresh match the store and the periods: running
    /// on its period for the endpoint it is registered at, or not at all
    /// (not registered, no node info yet, no period). Records the period
    /// in effect in the store.
    pub(crate) fn sync(self: &Arc<Self>, driver: &str) {
        let mut state = self.state.lock();
        let registered = self.drivers.get(driver).filter(|entry| entry.node.is_some());
        let period = self
            .config
            .allocatable_update_periods
            .get(driver)
            .or_else(|| state.from_cluster.get(driver))
            .map(|period| effective_period(*period));
        let wanted = registered.zip(period);
        let running = state.running.get(driver);
        if let (Some((entry, period)), Some(running)) = (&wanted, running)
            && running.endpoint == entry.endpoint
            && running.period == *period
        {
            return;
        }
        // Dropping the old refresh aborts its task.
        state.running.remove(driver);
        let Some((entry, period)) = wanted else {
            self.drivers.update(driver, |entry| entry.allocatable_update_period = None);
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            debug!(plugin = driver, "no runtime; the refresh starts with the next registration");
            return;
        };
        info!(
            plugin = driver,
            endpoint = entry.endpoint,
            ?period,
            "refreshing the allocatable count"
        );
        let task = runtime
            .spawn(Arc::clone(self).run(driver.to_owned(), entry.endpoint.clone(), period))
            .abort_handle();
        state
            .running
            .insert(driver.to_owned(), Refresh { endpoint: entry.endpoint.clone(), period, task });
        self.drivers.update(driver, |entry| entry.allocatable_update_period = Some(period));
    }

    /// Stops every refresh.
    pub(crate) fn stop_all(&self) {
        self.state.lock().running.clear();
    }

    /// Refreshes every `period` until aborted. A failure keeps the last
    /// count; it is logged once per run of failures.
    async fn run(self: Arc<Self>, driver: String, endpoint: String, period: Duration) {
        let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            ticks.tick().await;
            match self.refresh(&driver, &endpoint).await {
                Ok(()) if failing => {
                    info!(
                        plugin = driver,
                        endpoint, "refreshing the allocatable count works again"
                    );
                    failing = false;
                }
                Ok(()) => {}
                Err(err) if failing => {
                    debug!(plugin = driver, endpoint, error = %err, "refresh failed again");
                }
                Err(err) => {
                    warn!(
                        plugin = driver,
                        endpoint,
                        error = %err,
                        "refreshing the allocatable count failed; keeping the last count"
                    );
                    failing = true;
                }
            }
        }
    }

    /// One refresh: `NodeGetInfo`, then, under the driver's lock and only
    /// if it is still registered at `endpoint`, the sink's update if the
    /// limit changed.
    async fn refresh(&self, driver: &str, endpoint: &str) -> Result<(), CsiError> {
        // Outside the lock: a slow driver must not hold up its registrations.
        let reported =
            client::node_get_info(endpoint, self.config.node_get_info_timeout, self.reach.clone())
                .await?;
        let _lock = self.locks.lock(driver).await;
        let Some(known) = self
            .drivers
            .get(driver)
            .filter(|entry| entry.endpoint == endpoint)
            .and_then(|entry| entry.node)
        else {
            return Ok(());
        };
        // The node id and topology are the registration's (the annotation
        // and labels follow them): only the volume limit is refreshed.
        if reported.max_volumes_per_node != known.max_volumes_per_node {
            let updated = DriverNodeInfo {
                max_volumes_per_node: reported.max_volumes_per_node,
                ..known.clone()
            };
            self.sink.update_allocatable(driver, &updated).await?;
            info!(
                plugin = driver,
                endpoint,
                from = known.max_volumes_per_node,
                to = updated.max_volumes_per_node,
                "updated the allocatable count"
            );
            self.drivers.update(driver, |entry| entry.node = Some(updated));
        }
        let now = SystemTime::now();
        self.drivers.update(driver, |entry| entry.allocatable_refreshed_at = Some(now));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_below_ten_seconds_are_raised_and_huge_ones_bounded() {
        assert_eq!(effective_period(Duration::ZERO), MIN_ALLOCATABLE_UPDATE_PERIOD);
        assert_eq!(effective_period(Duration::from_secs(9)), MIN_ALLOCATABLE_UPDATE_PERIOD);
        assert_eq!(effective_period(Duration::from_secs(60)), Duration::from_secs(60));
        assert_eq!(effective_period(Duration::MAX), MAX_CONFIG_DURATION);
    }
}
