//! File descriptors as a budget.
//!
//! Every connection kpm opens costs a file descriptor, and `RLIMIT_NOFILE`
//! caps them per process. Running out (`EMFILE`) is kpm's own shortage, not
//! a plugin's fault, so kpm must neither blame the plugin nor stop serving
//! its own sockets. The budget is the soft limit minus a reserve (the fds
//! open when it is sized, the listeners, the watcher, a margin); every
//! outgoing connection holds an [`FdPermit`] for as long as it is open.
//!
//! - Operations take a permit with [`FdBudget::acquire`], which waits.
//! - Optional long-lived holders (liveness connections, pidfds) take one
//!   with [`FdBudget::try_acquire`], which refuses while less than a quarter
//!   of the budget is free, so that they can never starve registrations.
//! - A shortage seen anyway (another part of the process holds fds, or
//!   another process shares the system table) is waited out with
//!   [`FdBudget::wait_for_fd`]: logged once per episode and counted.
//! - Connections kpm's servers accept hold a [`ServerPermit`] too
//!   ([`FdBudget::server_permit`]); when an [`acquire`](FdBudget::acquire)
//!   finds none free, the idle ones are shed first, longest idle first.
//!
//! The process-wide budget is [`budget()`]; `kpm run` sizes it with
//! [`init`] after [`raise_soft_limit`]. A library user who never calls
//! [`init`] gets one sized from the current limit at first use. No dial
//! pays from it unless its caller names it: a [`Dialer`](crate::Dialer) is
//! made with the budget its connections pay from (a reconnection and an fd
//! shortage included). A server pays from the budget given to its
//! `Incoming`, the process-wide one unless set.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustix::io::Errno;
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use crate::error::{TransportError, show_limit};

mod server;

pub use server::{Activity, OpenRequest, ServerPermit};

/// Fds kept out of the budget beyond those open when it is sized: the
/// `kubelet.sock`, `kpm.sock` and metrics listeners and the status API's
/// spare, the watcher's inotify and poll fds, connections accepted by kpm's
/// servers (status API, metrics, device plugins registering) and the
/// Kubernetes client's connections.
pub const DEFAULT_RESERVE: usize = 32;

/// Permits beyond this are never needed; it keeps an unlimited (or huge)
/// `RLIMIT_NOFILE` from making a semaphore of billions of permits.
const MAX_BUDGET: usize = 1 << 20;

/// Optional holders leave at least `size / OPTIONAL_FLOOR` permits free.
const OPTIONAL_FLOOR: usize = 4;

/// How long a shortage is waited out when no permit is released meanwhile:
/// fds kpm does not count (another thread's files) free up unannounced, and
/// retrying at once would spin. Accept loops, which cannot wait for a
/// permit, pause this long.
pub const SHORTAGE_PAUSE: Duration = Duration::from_millis(20);

/// A shortage episode ends at the first fd taken this long after its last
/// shortage: under contention one waiter gets an fd while the next one
/// fails, which is still the same episode.
const EPISODE_QUIET: Duration = Duration::from_secs(1);

static GLOBAL: OnceLock<FdBudget> = OnceLock::new();

/// The process-wide budget, sized from the current soft limit with
/// [`DEFAULT_RESERVE`] at first use unless [`init`] came first.
pub fn budget() -> &'static FdBudget {
    GLOBAL.get_or_init(|| FdBudget::from_limit(DEFAULT_RESERVE))
}

/// Sizes the process-wide budget from the current soft limit, keeping
/// `reserve` fds beyond those open now, and returns it. Call it once at
/// start, before anything dials; if the budget was already in use, that one
/// is returned unchanged.
pub fn init(reserve: usize) -> &'static FdBudget {
    GLOBAL.get_or_init(|| FdBudget::from_limit(reserve))
}

/// `RLIMIT_NOFILE`; `None` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    /// The soft limit, the one enforced.
    pub soft: Option<u64>,
    /// The hard limit, up to which the soft one may be raised.
    pub hard: Option<u64>,
}

/// The process's current `RLIMIT_NOFILE`.
pub fn nofile_limit() -> NofileLimit {
    let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
    NofileLimit { soft: current, hard: maximum }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one, as Go programs (the
/// kubelet among them) do at start since Go 1.19: the soft limit of 1024
/// exists for `select(2)`, which kpm does not use. Returns the limit now in
/// force (unchanged if it already was the hard one).
pub fn raise_soft_limit() -> Result<NofileLimit, TransportError> {
    let limit = nofile_limit();
    if limit.soft == limit.hard {
        return Ok(limit);
    }
    let raised = Rlimit { current: limit.hard, maximum: limit.hard };
    setrlimit(Resource::Nofile, raised).map_err(|errno| TransportError::RaiseFdLimit {
        soft: limit.soft,
        hard: limit.hard,
        source: errno.into(),
    })?;
    Ok(nofile_limit())
}

/// The fds open in this process (entries of `/proc/self/fd`, without the
/// one that reads them); `None` where that cannot be read.
pub fn open_fds() -> Option<usize> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    Some(entries.count().saturating_sub(1))
}

/// Whether `err` says the process (`EMFILE`) or the system (`ENFILE`) ran
/// out of file descriptors.
pub fn is_shortage(err: &io::Error) -> bool {
    matches!(Errno::from_io_error(err), Some(Errno::MFILE | Errno::NFILE))
}

/// A share of the process's file descriptors; see the [module](self) docs.
/// Clones share the same permits.
///
/// It has no `Default` on purpose: a [`Dialer`](crate::Dialer) is made with
/// the budget its connections pay from ([`budget()`] for the process-wide
/// one), so that no component dials on a global budget unseen. A server's
/// `Incoming` pays from the process-wide budget unless given its own.
#[derive(Debug, Clone)]
pub struct FdBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    size: usize,
    /// The soft limit the budget was sized from, for logs and metrics.
    limit: Option<u64>,
    permits: Semaphore,
    /// Woken when a permit is released, for those waiting out a shortage.
    released: Notify,
    in_shortage: AtomicBool,
    /// The budget's birth, the origin of `last_shortage`.
    created: Instant,
    /// When the last shortage was met, in milliseconds since `created`.
    last_shortage: AtomicU64,
    /// `shortage_waits` when the current episode began.
    episode_base: AtomicU64,
    shortage_episodes: AtomicU64,
    shortage_waits: AtomicU64,
    permit_waits: AtomicU64,
    optional_refused: AtomicU64,
    /// The connections kpm's servers accepted, to shed the idle ones.
    servers: server::Servers,
    shed_connections: AtomicU64,
}

/// Counters and levels of a budget, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdStats {
    /// The soft `RLIMIT_NOFILE` it was sized from; `None` is unlimited.
    pub limit: Option<u64>,
    /// Permits in all.
    pub size: usize,
    /// Permits held now.
    pub in_use: usize,
    /// Shortages (`EMFILE`, `ENFILE`) begun: a run of them with no fd
    /// successfully taken in between counts once.
    pub shortage_episodes: u64,
    /// Waits for an fd after a shortage.
    pub shortage_waits: u64,
    /// Acquisitions that had to wait for a permit.
    pub permit_waits: u64,
    /// Optional acquisitions refused to keep a share free.
    pub optional_refused: u64,
    /// Idle server connections closed to free permits.
    pub shed_connections: u64,
}

impl FdBudget {
    /// A budget of `size` permits (at least one), sized from the soft limit
    /// `limit` (only reported).
    pub fn new(size: usize, limit: Option<u64>) -> Self {
        let size = size.clamp(1, MAX_BUDGET);
        Self {
            inner: Arc::new(Inner {
                size,
                limit,
                permits: Semaphore::new(size),
                released: Notify::new(),
                in_shortage: AtomicBool::new(false),
                created: Instant::now(),
                last_shortage: AtomicU64::new(0),
                episode_base: AtomicU64::new(0),
                shortage_episodes: AtomicU64::new(0),
                shortage_waits: AtomicU64::new(0),
                permit_waits: AtomicU64::new(0),
                optional_refused: AtomicU64::new(0),
                servers: server::Servers::default(),
                shed_connections: AtomicU64::new(0),
            }),
        }
    }

    /// A budget of the current soft limit minus the fds open now and
    /// `reserve`.
    pub fn from_limit(reserve: usize) -> Self {
        let limit = nofile_limit().soft;
        let open = open_fds().unwrap_or(0);
        let soft = limit.map_or(MAX_BUDGET, |soft| usize::try_from(soft).unwrap_or(MAX_BUDGET));
        let size = soft.saturating_sub(open).saturating_sub(reserve);
        let budget = Self::new(size, limit);
        tracing::info!(
            limit = show_limit(limit),
            open,
            reserve,
            budget = budget.size(),
            "file descriptor budget"
        );
        budget
    }

    /// Permits in all.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// Permits held now.
    pub fn in_use(&self) -> usize {
        self.inner.size.saturating_sub(self.inner.permits.available_permits())
    }

    /// Takes a permit, waiting (in FIFO order) for one to be released. When
    /// none is free, idle server connections are shed first (see
    /// [`shed_idle`](Self::shed_idle)), and again each second while it waits
    /// (a connection is shed only once idle for a second), so the wait is
    /// for them to close.
    pub async fn acquire(&self) -> FdPermit {
        if let Some(permit) = self.take() {
            return permit;
        }
        self.inner.permit_waits.fetch_add(1, Ordering::Relaxed);
        // Kept across the sheds below, so that the waiter keeps its place.
        let waiting = self.inner.permits.acquire();
        tokio::pin!(waiting);
        loop {
            self.shed_idle();
            // Connections too fresh to shed now may be old enough later.
            tokio::select! {
                acquired = &mut waiting => {
                    // The semaphore is never closed, so this is always a permit.
                    if let Ok(permit) = acquired {
                        permit.forget();
                    }
                    return FdPermit { inner: Arc::clone(&self.inner) };
                }
                () = tokio::time::sleep(server::SHED_GRACE) => {}
            }
        }
    }

    /// A permit for a connection a server accepted on `listener` (a socket
    /// path or an address, for logs), taken as [`acquire`](Self::acquire)
    /// does. The server reports the connection's requests through
    /// [`ServerPermit::activity`], and gives the connection up once
    /// [`ServerPermit::poll_shed`] says so.
    pub async fn server_permit(&self, listener: Arc<str>) -> ServerPermit {
        ServerPermit::new(self.acquire().await, listener)
    }

    /// Sheds server connections idle for a second or more, longest idle
    /// first, until a
    /// [quarter](Self::kept_free) of the budget is free or on its way back
    /// (connections shed before and not yet closed count), and at least one
    /// for this caller: an episode, logged once per listener and counted.
    /// Returns how many were shed; their permits come back as their servers
    /// close them.
    pub fn shed_idle(&self) -> usize {
        let wanted = self.kept_free().saturating_sub(self.inner.permits.available_permits()).max(1);
        let mut total = 0;
        for (listener, shed) in self.inner.servers.shed(wanted) {
            total += shed;
            tracing::warn!(
                listener = %listener,
                shed,
                permits_in_use = self.in_use(),
                budget = self.inner.size,
                "file descriptor budget short: closing idle server connections, longest idle first"
            );
        }
        self.inner
            .shed_connections
            .fetch_add(u64::try_from(total).unwrap_or(u64::MAX), Ordering::Relaxed);
        total
    }

    /// Permits optional holders always leave free ([`try_acquire`](Self::try_acquire)):
    /// what operations can count on, a quarter of the budget.
    pub fn kept_free(&self) -> usize {
        self.inner.size / OPTIONAL_FLOOR
    }

    /// Takes a permit for an optional holder, never waiting: `None` when
    /// taking it would leave less than [`kept_free`](Self::kept_free).
    pub fn try_acquire(&self) -> Option<FdPermit> {
        if self.inner.permits.available_permits() <= self.kept_free() {
            self.inner.optional_refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.take()
    }

    fn take(&self) -> Option<FdPermit> {
        let permit = self.inner.permits.try_acquire().ok()?;
        permit.forget();
        Some(FdPermit { inner: Arc::clone(&self.inner) })
    }

    /// Records that `step` met a shortage (`EMFILE`, `ENFILE`): the first
    /// one of an episode logs a warning with the limit and the fds in use.
    /// For callers that cannot await; others use [`wait_for_fd`](Self::wait_for_fd).
    pub fn shortage(&self, step: &'static str) {
        let waits = self.inner.shortage_waits.fetch_add(1, Ordering::Relaxed) + 1;
        self.inner.last_shortage.store(self.since_created(), Ordering::Relaxed);
        if self.inner.in_shortage.swap(true, Ordering::AcqRel) {
            return;
        }
        self.inner.episode_base.store(waits - 1, Ordering::Relaxed);
        self.inner.shortage_episodes.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            step,
            limit = show_limit(self.inner.limit),
            open = open_fds().map_or_else(|| "unknown".to_owned(), |n| n.to_string()),
            permits_in_use = self.in_use(),
            budget = self.inner.size,
            "out of file descriptors; waiting for one to be released"
        );
    }

    /// Records a shortage met by `step` and waits until a permit is released
    /// or a short while has passed; the caller then tries again.
    pub async fn wait_for_fd(&self, step: &'static str) {
        let released = self.inner.released.notified();
        self.shortage(step);
        tokio::select! {
            () = released => {}
            () = tokio::time::sleep(SHORTAGE_PAUSE) => {}
        }
    }

    /// Records that an fd was taken: ends a shortage episode, with a log
    /// line, once no shortage was met for a second.
    pub fn fd_available(&self) {
        if !self.inner.in_shortage.load(Ordering::Acquire) {
            return;
        }
        let quiet = u64::try_from(EPISODE_QUIET.as_millis()).unwrap_or(u64::MAX);
        let last = self.inner.last_shortage.load(Ordering::Relaxed);
        if self.since_created().saturating_sub(last) < quiet
            || !self.inner.in_shortage.swap(false, Ordering::AcqRel)
        {
            return;
        }
        let waits = self.inner.shortage_waits.load(Ordering::Relaxed);
        let waited = waits.saturating_sub(self.inner.episode_base.load(Ordering::Relaxed));
        tracing::info!(
            waits = waited,
            permits_in_use = self.in_use(),
            "file descriptors available again"
        );
    }

    fn since_created(&self) -> u64 {
        u64::try_from(self.inner.created.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The budget's counters and levels.
    pub fn stats(&self) -> FdStats {
        let count = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        FdStats {
            limit: self.inner.limit,
            size: self.inner.size,
            in_use: self.in_use(),
            shortage_episodes: count(&self.inner.shortage_episodes),
            shortage_waits: count(&self.inner.shortage_waits),
            permit_waits: count(&self.inner.permit_waits),
            optional_refused: count(&self.inner.optional_refused),
            shed_connections: count(&self.inner.shed_connections),
        }
    }
}

/// One file descriptor's share of a budget, released on drop: keep it with
/// the fd it pays for.
#[derive(Debug)]
pub struct FdPermit {
    inner: Arc<Inner>,
}

impl FdPermit {
    /// The budget this permit belongs to: where the connection it pays for
    /// takes its next permit (a reconnection) and reports fd shortages.
    pub fn budget(&self) -> FdBudget {
        FdBudget { inner: Arc::clone(&self.inner) }
    }
}

impl Drop for FdPermit {
    fn drop(&mut self) {
        self.inner.permits.add_permits(1);
        self.inner.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn acquire_waits_for_a_release_in_order() {
        let budget = FdBudget::new(2, Some(64));
        let first = budget.acquire().await;
        let _second = budget.acquire().await;
        assert_eq!(budget.in_use(), 2);
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire().await }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "no permit was free");
        drop(first);
        let third = waiting.await.unwrap();
        assert_eq!(budget.in_use(), 2);
        drop(third);
        assert_eq!(budget.in_use(), 1);
        let stats = budget.stats();
        assert_eq!((stats.size, stats.permit_waits, stats.limit), (2, 1, Some(64)));
    }

    #[tokio::test(start_paused = true)]
    async fn optional_holders_leave_a_quarter_free() {
        let budget = FdBudget::new(8, None);
        let optional: Vec<_> = std::iter::from_fn(|| budget.try_acquire()).collect();
        assert_eq!(optional.len(), 6, "2 of 8 stay free");
        assert_eq!(budget.stats().optional_refused, 1);
        // Operations still get the rest.
        let _a = budget.acquire().await;
        let _b = budget.acquire().await;
        assert_eq!(budget.in_use(), 8);
        assert!(budget.try_acquire().is_none());
        drop(optional);
        assert_eq!(budget.in_use(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shortage_is_one_episode_until_an_fd_is_taken() {
        let budget = FdBudget::new(4, Some(128));
        let started = tokio::time::Instant::now();
        budget.wait_for_fd("connect").await;
        assert_eq!(started.elapsed(), SHORTAGE_PAUSE, "nothing released: a short sleep");
        budget.wait_for_fd("connect").await;
        let stats = budget.stats();
        assert_eq!((stats.shortage_episodes, stats.shortage_waits), (1, 2));

        // A released permit ends the wait at once.
        let permit = budget.acquire().await;
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move {
                let started = tokio::time::Instant::now();
                budget.wait_for_fd("accept").await;
                started.elapsed()
            }
        });
        tokio::task::yield_now().await;
        drop(permit);
        assert_eq!(waiting.await.unwrap(), Duration::ZERO);

        // An fd taken right after a shortage does not end the episode yet.
        budget.fd_available();
        budget.shortage("socket");
        assert_eq!(budget.stats().shortage_episodes, 1);
        tokio::time::sleep(EPISODE_QUIET).await;
        budget.fd_available();
        budget.fd_available();
        budget.shortage("socket");
        let stats = budget.stats();
        assert_eq!((stats.shortage_episodes, stats.shortage_waits), (2, 5));
    }

    #[test]
    fn sizes_stay_within_bounds() {
        assert_eq!(FdBudget::new(0, Some(0)).size(), 1);
        assert_eq!(FdBudget::new(usize::MAX, None).size(), MAX_BUDGET);
        let limit = nofile_limit();
        let budget = FdBudget::from_limit(DEFAULT_RESERVE);
        if let Some(soft) = limit.soft {
            assert!(u64::try_from(budget.size()).unwrap() <= soft.max(1));
        }
        assert!(open_fds().unwrap() >= 3, "stdio at least");
        assert!(is_shortage(&io::Error::from_raw_os_error(Errno::MFILE.raw_os_error())));
        assert!(is_shortage(&io::Error::from_raw_os_error(Errno::NFILE.raw_os_error())));
        assert!(!is_shortage(&io::Error::from(io::ErrorKind::ConnectionRefused)));
    }
}
