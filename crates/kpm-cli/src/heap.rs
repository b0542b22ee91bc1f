//! kpm's memory allocator, jemalloc, and its statistics for `/metrics`.
//!
//! jemalloc hands pages freed by churning connections back to the system
//! within seconds, from a background thread of its own once `kpm run`
//! starts it; with glibc's malloc kpm's RSS kept growing under churn while
//! its live heap stayed flat (`docs/reliability.md`, soak).

use tikv_jemalloc_ctl::{background_thread, epoch, stats};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Has a jemalloc thread of its own hand freed pages back to the system on
/// time. Without it jemalloc purges only while kpm allocates, and an idle
/// kpm kept what its start-up burst freed: 45 MB instead of 30 MB at rest
/// with 1000 CSI drivers (docs/performance.md, issue 27).
pub(crate) fn purge_in_background() {
    if let Err(error) = background_thread::write(true) {
        tracing::warn!(
            %error,
            "cannot start the allocator's background thread; freed memory goes back to the \
             system only while kpm allocates"
        );
    }
}

/// What the allocator holds, in bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeapStats {
    /// Allocated by kpm and not freed yet: the live heap.
    pub(crate) allocated: usize,
    /// In pages the allocator keeps resident: the live heap, its metadata,
    /// and freed pages not returned to the system yet.
    pub(crate) resident: usize,
}

/// The allocator's statistics now; `None` if jemalloc cannot tell.
pub(crate) fn stats() -> Option<HeapStats> {
    // jemalloc's statistics are a snapshot, refreshed by advancing its epoch.
    epoch::advance().ok()?;
    Some(HeapStats {
        allocated: stats::allocated::read().ok()?,
        resident: stats::resident::read().ok()?,
    })
}
