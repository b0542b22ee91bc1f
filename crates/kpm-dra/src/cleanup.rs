//! What happens to a driver's published resources when no instance of it is
//! connected for a while (spec C.5): the [`SliceCleanup`] hook, an in-memory
//! implementation, and the per-driver grace-period timers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tracing::{debug, info};

/// Removes what a DRA driver published for this node once none of its
/// instances has been connected for the grace period. The kubelet deletes
/// the node's ResourceSlices of the driver (`DeleteCollection` with
/// `spec.nodeName=<node>,spec.driver=<driver>`, retried with backoff); an
/// implementation backed by the Kubernetes API does the same and owns its
/// retries: the call cannot fail.
#[async_trait]
pub trait SliceCleanup: Send + Sync + 'static {
    /// Removes the driver's ResourceSlices of this node.
    async fn wipe_driver(&self, driver: &str);

    /// The drivers that have published resources for this node, asked once
    /// at start ([`DraManager::clean_up_leftovers`](crate::DraManager::clean_up_leftovers)):
    /// those that do not register within the grace period are wiped. The
    /// default knows of none.
    async fn published_drivers(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Cleanups are opaque; this lets structs holding them derive `Debug`.
impl std::fmt::Debug for dyn SliceCleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dyn SliceCleanup")
    }
}

/// A [`SliceCleanup`] that only records the wipes, in order, for the status
/// API and tests (kpm publishes no ResourceSlices itself).
#[derive(Debug, Default)]
pub struct InMemoryCleanup {
    wiped: Mutex<Vec<String>>,
}

impl InMemoryCleanup {
    /// The drivers wiped so far, in order, one entry per wipe.
    pub fn wiped(&self) -> Vec<String> {
        self.wiped.lock().clone()
    }
}

#[async_trait]
impl SliceCleanup for InMemoryCleanup {
    async fn wipe_driver(&self, driver: &str) {
        self.wiped.lock().push(driver.to_owned());
    }
}

/// One queued cleanup.
#[derive(Debug)]
struct Pending {
    id: u64,
    until: SystemTime,
    timer: JoinHandle<()>,
}

/// The pending cleanups, one per driver at most, each a sleeping task.
#[derive(Debug)]
pub(crate) struct CleanupTimers {
    grace: Duration,
    cleanup: Arc<dyn SliceCleanup>,
    pending: Arc<Mutex<HashMap<String, Pending>>>,
    next_id: Mutex<u64>,
}

impl CleanupTimers {
    pub(crate) fn new(grace: Duration, cleanup: Arc<dyn SliceCleanup>) -> Self {
        Self { grace, cleanup, pending: Arc::default(), next_id: Mutex::new(0) }
    }

    /// The kubelet's `sync(driver)`: with an instance connected, a pending
    /// cleanup is cancelled; with none, one is queued at now + grace unless
    /// one is already queued (it keeps its original time). Outside a tokio
    /// runtime nothing is queued.
    pub(crate) fn update(&self, driver: &str, any_connected: bool) {
        let mut pending = self.pending.lock();
        if any_connected {
            if let Some(cancelled) = pending.remove(driver) {
                cancelled.timer.abort();
                info!(driver, "DRA driver is connected again; cancelled the pending cleanup");
            }
            return;
        }
        if pending.contains_key(driver) {
            return;
        }
        let id = {
            let mut next_id = self.next_id.lock();
            *next_id += 1;
            *next_id
        };
        // The grace is at most MAX_CONFIG_DURATION (a driver registers only
        // with a valid config): neither sum can overflow.
        let until = SystemTime::now() + self.grace;
        let Some(timer) = crate::spawn(fire_after(
            tokio::time::Instant::now() + self.grace,
            driver.to_owned(),
            id,
            Arc::clone(&self.pending),
            Arc::clone(&self.cleanup),
        )) else {
            return;
        };
        info!(
            driver,
            grace = ?self.grace,
            "no instance of the DRA driver is connected; cleanup queued"
        );
        pending.insert(driver.to_owned(), Pending { id, until, timer });
    }

    /// The cleanup the timers call.
    pub(crate) fn cleanup(&self) -> &Arc<dyn SliceCleanup> {
        &self.cleanup
    }

    /// When the pending cleanup of `driver` fires, if one is queued.
    pub(crate) fn pending_until(&self, driver: &str) -> Option<SystemTime> {
        self.pending.lock().get(driver).map(|pending| pending.until)
    }

    /// Drivers with a pending cleanup.
    pub(crate) fn pending_drivers(&self) -> Vec<String> {
        self.pending.lock().keys().cloned().collect()
    }

    /// Cancels every pending cleanup, and stops one that is running.
    pub(crate) fn cancel_all(&self) {
        for (driver, cancelled) in self.pending.lock().drain() {
            cancelled.timer.abort();
            debug!(driver, "cancelled the pending cleanup");
        }
    }
}

/// Sleeps until the end of the grace period, then wipes. The entry stays
/// queued while the wipe runs (and retries), so that a reconnect aborts it:
/// a wipe that succeeded late must not delete what the driver published
/// since. It is dequeued once done, if it is still the queued one.
async fn fire_after(
    deadline: tokio::time::Instant,
    driver: String,
    id: u64,
    pending: Arc<Mutex<HashMap<String, Pending>>>,
    cleanup: Arc<dyn SliceCleanup>,
) {
    tokio::time::sleep_until(deadline).await;
    info!(driver, "no instance of the DRA driver connected within the grace period; cleaning up");
    cleanup.wipe_driver(&driver).await;
    let mut pending = pending.lock();
    if pending.get(&driver).is_some_and(|queued| queued.id == id) {
        pending.remove(&driver);
    }
}

#[cfg(test)]
mod tests {
    //! The timer logic in paused time, without sockets.

    use super::*;

    const GRACE: Duration = Duration::from_secs(30);

    fn timers() -> (CleanupTimers, Arc<InMemoryCleanup>) {
        let cleanup = Arc::new(InMemoryCleanup::default());
        (CleanupTimers::new(GRACE, cleanup.clone()), cleanup)
    }

    /// Lets spawned timers run up to the current (paused) time.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_driver_without_a_connected_instance_is_wiped_once_after_the_grace_period() {
        let (timers, cleanup) = timers();
        timers.update("dra.example.com", false);
        assert!(timers.pending_until("dra.example.com").is_some());
        tokio::time::advance(Duration::from_millis(29_999)).await;
        settle().await;
        assert!(cleanup.wiped().is_empty(), "not before the grace period ends");
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        assert_eq!(cleanup.wiped(), ["dra.example.com"]);
        assert_eq!(timers.pending_until("dra.example.com"), None);
        tokio::time::advance(GRACE * 3).await;
        settle().await;
        assert_eq!(cleanup.wiped(), ["dra.example.com"], "exactly once");
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_grace_period_is_added_to_both_clocks_without_overflow() {
        let longest = kpm_api::constants::MAX_CONFIG_DURATION;
        let cleanup = Arc::new(InMemoryCleanup::default());
        let timers = CleanupTimers::new(longest, cleanup.clone());
        for round in 1..=3 {
            timers.update("dra.example.com", false);
            assert!(timers.pending_until("dra.example.com").is_some());
            tokio::time::advance(longest.checked_sub(Duration::from_millis(1)).unwrap()).await;
            settle().await;
            assert_eq!(cleanup.wiped().len(), round - 1, "not before the grace period ends");
            tokio::time::advance(Duration::from_millis(1)).await;
            settle().await;
            assert_eq!(cleanup.wiped().len(), round);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_cleanup_keeps_its_original_time() {
        let (timers, cleanup) = timers();
        timers.update("dra.example.com", false);
        let until = timers.pending_until("dra.example.com");
        tokio::time::advance(GRACE / 2).await;
        timers.update("dra.example.com", false);
        assert_eq!(timers.pending_until("dra.example.com"), until);
        tokio::time::advance(GRACE / 2).await;
        settle().await;
        assert_eq!(cleanup.wiped(), ["dra.example.com"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconnect_cancels_the_pending_cleanup_and_a_later_drop_starts_a_new_one() {
        let (timers, cleanup) = timers();
        timers.update("dra.example.com", false);
        tokio::time::advance(GRACE / 2).await;
        timers.update("dra.example.com", true);
        assert_eq!(timers.pending_until("dra.example.com"), None);
        tokio::time::advance(GRACE).await;
        settle().await;
        assert!(cleanup.wiped().is_empty(), "the cancelled cleanup never fires");

        timers.update("dra.example.com", false);
        tokio::time::advance(GRACE / 2).await;
        settle().await;
        assert!(cleanup.wiped().is_empty(), "a new drop starts a full grace period");
        tokio::time::advance(GRACE / 2).await;
        settle().await;
        assert_eq!(cleanup.wiped(), ["dra.example.com"]);
    }

    #[tokio::test(start_paused = true)]
    async fn drivers_have_independent_timers_and_cancel_all_stops_them() {
        let (timers, cleanup) = timers();
        timers.update("a.example.com", false);
        tokio::time::advance(GRACE / 2).await;
        timers.update("b.example.com", false);
        let mut drivers = timers.pending_drivers();
        drivers.sort();
        assert_eq!(drivers, ["a.example.com", "b.example.com"]);
        tokio::time::advance(GRACE / 2).await;
        settle().await;
        assert_eq!(cleanup.wiped(), ["a.example.com"]);
        timers.cancel_all();
        tokio::time::advance(GRACE).await;
        settle().await;
        assert_eq!(cleanup.wiped(), ["a.example.com"]);
        assert!(timers.pending_drivers().is_empty());
    }

    /// A cleanup whose wipes take `WIPE` each, as an API server that fails
    /// and is retried would.
    #[derive(Debug, Default)]
    struct SlowCleanup {
        started: Mutex<u32>,
        finished: Mutex<u32>,
    }

    const WIPE: Duration = Duration::from_secs(10);

    #[async_trait]
    impl SliceCleanup for SlowCleanup {
        async fn wipe_driver(&self, _driver: &str) {
            *self.started.lock() += 1;
            tokio::time::sleep(WIPE).await;
            *self.finished.lock() += 1;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconnect_stops_a_wipe_that_is_still_running() {
        let cleanup = Arc::new(SlowCleanup::default());
        let timers = CleanupTimers::new(GRACE, cleanup.clone());
        timers.update("dra.example.com", false);
        tokio::time::advance(GRACE + WIPE / 2).await;
        settle().await;
        assert_eq!(*cleanup.started.lock(), 1);
        assert!(timers.pending_until("dra.example.com").is_some(), "queued while it runs");
        timers.update("dra.example.com", false);
        assert_eq!(*cleanup.started.lock(), 1, "a running wipe is not queued again");

        timers.update("dra.example.com", true);
        tokio::time::advance(WIPE).await;
        settle().await;
        assert_eq!(*cleanup.finished.lock(), 0, "the late wipe never completes");
        assert_eq!(timers.pending_until("dra.example.com"), None);

        timers.update("dra.example.com", false);
        tokio::time::advance(GRACE).await;
        settle().await;
        tokio::time::advance(WIPE).await;
        settle().await;
        assert_eq!((*cleanup.started.lock(), *cleanup.finished.lock()), (2, 1));
        assert_eq!(timers.pending_until("dra.example.com"), None, "dequeued once done");
    }
}
