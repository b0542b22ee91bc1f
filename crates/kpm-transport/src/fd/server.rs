//! The permits of connections kpm's servers accept, and shedding the idle
//! ones when the budget runs short.
//!
//! A peer that connects and never speaks, or keeps a connection open and
//! idle, costs kpm an fd like any registration does. Each accepted
//! connection therefore holds a [`ServerPermit`], and its server reports the
//! requests it has open through the connection's [`Activity`]. When an
//! [`acquire`](super::FdBudget::acquire) finds no permit free, the idle
//! connections (no request open) are shed first, longest idle first, so
//! that registrations never wait on connections nobody uses.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Waker};

use tokio::time::Instant;

use super::{FdPermit, Inner};

/// `Entry::open` of a connection that was shed: no request starts on it.
const SHED: usize = usize::MAX;

/// How long a connection must have been idle to be shed: a client just
/// accepted has this long to open its first request, so that a flood of
/// connections pushes out the silent ones before it, never a plugin's
/// connection whose request is on its way.
pub(super) const SHED_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The server connections holding permits of one budget.
#[derive(Debug, Default)]
pub(super) struct Servers {
    next_id: AtomicU64,
    entries: Mutex<HashMap<u64, Arc<Entry>>>,
}

/// One accepted connection, as its permit and its server see it.
#[derive(Debug)]
struct Entry {
    /// The listener that accepted it (a socket path or an address), for logs.
    listener: Arc<str>,
    /// The budget's birth, the origin of `idle_since`.
    created: Instant,
    /// Requests (HTTP/2 streams) open, or [`SHED`].
    open: AtomicUsize,
    /// When it last became idle, in milliseconds since `created`.
    idle_since: AtomicU64,
    shed: AtomicBool,
    /// Woken when the connection is shed, so that its IO fails at once.
    waker: Mutex<Option<Waker>>,
}

impl Entry {
    fn now(&self) -> u64 {
        u64::try_from(self.created.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

impl Servers {
    /// Sheds connections idle for [`SHED_GRACE`] or longer, longest idle
    /// first, until `wanted` are shed and not yet closed (at least one now,
    /// if there is one), and says how many each listener lost (in the order
    /// of their first shed).
    pub(super) fn shed(&self, wanted: usize) -> Vec<(Arc<str>, usize)> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let closing = entries.values().filter(|entry| entry.shed.load(Ordering::Acquire)).count();
        let wanted = wanted.saturating_sub(closing).max(1);
        let grace = u64::try_from(SHED_GRACE.as_millis()).unwrap_or(u64::MAX);
        let mut idle: Vec<&Arc<Entry>> = entries
            .values()
            .filter(|entry| entry.open.load(Ordering::Acquire) == 0)
            .filter(|entry| {
                entry.now().saturating_sub(entry.idle_since.load(Ordering::Relaxed)) >= grace
            })
            .collect();
        idle.sort_by_key(|entry| entry.idle_since.load(Ordering::Relaxed));
        let mut shed: Vec<(Arc<str>, usize)> = Vec::new();
        for entry in idle {
            if shed.iter().map(|(_, n)| n).sum::<usize>() == wanted {
                break;
            }
            // A request that started since the filter keeps its connection.
            if entry.open.compare_exchange(0, SHED, Ordering::AcqRel, Ordering::Acquire).is_err() {
                continue;
            }
            entry.shed.store(true, Ordering::Release);
            if let Some(waker) = entry.waker.lock().unwrap_or_else(PoisonError::into_inner).take() {
                waker.wake();
            }
            match shed.iter_mut().find(|(listener, _)| *listener == entry.listener) {
                Some((_, n)) => *n += 1,
                None => shed.push((Arc::clone(&entry.listener), 1)),
            }
        }
        shed
    }

    fn remove(&self, id: u64) {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
    }
}

/// The permit of a connection a server accepted: released, and the
/// connection forgotten, on drop. Keep it with the connection.
#[derive(Debug)]
pub struct ServerPermit {
    permit: FdPermit,
    id: u64,
    activity: Activity,
}

impl ServerPermit {
    /// Registers the connection `permit` pays for, accepted on `listener`,
    /// as idle since now.
    pub(super) fn new(permit: FdPermit, listener: Arc<str>) -> Self {
        let inner: &Inner = &permit.inner;
        let entry = Arc::new(Entry {
            listener,
            created: inner.created,
            open: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            shed: AtomicBool::new(false),
            waker: Mutex::new(None),
        });
        entry.idle_since.store(entry.now(), Ordering::Relaxed);
        let id = inner.servers.next_id.fetch_add(1, Ordering::Relaxed);
        inner
            .servers
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::clone(&entry));
        Self { permit, id, activity: Activity { entry } }
    }

    /// The connection's activity, for its server to report requests.
    pub fn activity(&self) -> &Activity {
        &self.activity
    }

    /// Whether the connection was shed: its IO should fail from now on.
    pub fn is_shed(&self) -> bool {
        self.activity.entry.shed.load(Ordering::Acquire)
    }

    /// Like [`is_shed`](Self::is_shed), and wakes `cx` when it is shed.
    pub fn poll_shed(&self, cx: &Context<'_>) -> bool {
        let entry = &self.activity.entry;
        {
            let mut waker = entry.waker.lock().unwrap_or_else(PoisonError::into_inner);
            if !waker.as_ref().is_some_and(|waker| waker.will_wake(cx.waker())) {
                *waker = Some(cx.waker().clone());
            }
        }
        // Checked after registering, so that a shed in between still wakes.
        self.is_shed()
    }
}

impl Drop for ServerPermit {
    fn drop(&mut self) {
        self.permit.inner.servers.remove(self.id);
    }
}

/// What a server tells of one accepted connection: which requests are
/// open. Cloneable, for the server's request path.
#[derive(Debug, Clone)]
pub struct Activity {
    entry: Arc<Entry>,
}

impl Activity {
    /// Marks a request (an HTTP/2 stream, an HTTP/1 exchange) open until the
    /// guard is dropped: the connection is not idle meanwhile.
    pub fn request(&self) -> OpenRequest {
        // A shed connection is closing: the request fails with it anyway.
        let _ = self.entry.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
            (open != SHED).then(|| open + 1)
        });
        OpenRequest { entry: Arc::clone(&self.entry) }
    }

    /// Requests open now.
    pub fn open_requests(&self) -> usize {
        match self.entry.open.load(Ordering::Acquire) {
            SHED => 0,
            open => open,
        }
    }
}

/// An open request of a server connection; see [`Activity::request`].
#[derive(Debug)]
pub struct OpenRequest {
    entry: Arc<Entry>,
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        let entry = &self.entry;
        entry.idle_since.store(entry.now(), Ordering::Relaxed);
        let _ = entry.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
            (open != SHED && open > 0).then(|| open - 1)
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::FdBudget;
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn idle_connections_are_shed_longest_idle_first_when_an_acquire_finds_none_free() {
        let budget = FdBudget::new(8, None);
        let mut connections = Vec::new();
        for listener in ["kubelet.sock", "kpm.sock", "kubelet.sock", "kpm.sock", "kubelet.sock"] {
            connections.push(budget.server_permit(Arc::from(listener)).await);
            tokio::time::sleep(SECOND).await;
        }
        // The oldest is busy; the second oldest's request ended last.
        let _busy = connections[0].activity().request();
        drop(connections[1].activity().request());
        assert_eq!(connections[0].activity().open_requests(), 1);
        let _others: Vec<_> = std::iter::from_fn(|| budget.try_acquire()).collect();
        let _operations = (budget.acquire().await, budget.acquire().await);
        assert_eq!(budget.in_use(), 8);
        assert_eq!(budget.stats().shed_connections, 0, "nothing shed while permits were free");

        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire().await }
        });
        tokio::task::yield_now().await;
        // A quarter of 8: the two longest idle, neither the busy one nor the
        // one whose request just ended.
        let shed: Vec<_> = connections.iter().map(ServerPermit::is_shed).collect();
        assert_eq!(shed, [false, false, true, true, false]);
        assert_eq!(budget.stats().shed_connections, 2);
        assert!(!waiting.is_finished(), "the permit comes back when the connection closes");
        drop(connections.remove(2));
        let _permit = waiting.await.unwrap();

        // Connections shed and still closing count towards the next episode;
        // each waiter still sheds at least one.
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire().await }
        });
        tokio::task::yield_now().await;
        let shed: Vec<_> = connections.iter().map(ServerPermit::is_shed).collect();
        assert_eq!(shed, [false, false, true, true], "then the longest idle of the rest");
        assert_eq!(connections[1].activity().open_requests(), 0);
        drop(connections.remove(2));
        waiting.await.unwrap();
        // A request on a shed connection changes nothing.
        let late = connections[2].activity().request();
        assert_eq!(connections[2].activity().open_requests(), 0);
        drop(late);
        assert_eq!(budget.stats().shed_connections, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_idle_connection_an_acquire_waits_and_sheds_nothing() {
        let budget = FdBudget::new(1, None);
        let busy = budget.server_permit(Arc::from("kubelet.sock")).await;
        let open = busy.activity().request();
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire().await }
        });
        tokio::time::sleep(SECOND).await;
        assert!(!busy.is_shed() && !waiting.is_finished());
        assert_eq!(budget.stats().shed_connections, 0);
        drop(open);
        drop(busy);
        waiting.await.unwrap();
    }
}
