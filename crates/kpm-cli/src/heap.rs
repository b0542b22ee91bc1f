//! kpm's memory allocator, jemalloc, and its statistics for `/metrics`.
//!
//! jemalloc hands pages freed by churning connections back to the system
//! within seconds; with glibc's malloc kpm's RSS kept growing under churn
//! while its live heap stayed flat (`docs/reliability.md`, soak).

use tikv_jemalloc_ctl::{epoch, stats};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
