//! The allocator's figures, as `/metrics` shows them. The allocator is
//! the binary's choice (`kpm` runs on jemalloc); the binary reads them.

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;

use super::encode::{gauge, gauge_family};

/// What the allocator holds, in bytes (jemalloc's `stats.*`). Not
/// `#[non_exhaustive]`: a new figure is a compile error where it is read.
#[derive(Debug, Clone)]
pub struct HeapStats {
    /// Allocated and not freed yet: the live heap.
    pub allocated: usize,
    /// In pages of live allocations: the live heap and the free room between
    /// its allocations (fragmentation).
    pub active: usize,
    /// The allocator's own bookkeeping.
    pub metadata: usize,
    /// In pages the allocator keeps resident: active pages, metadata, and
    /// dirty and muzzy pages not returned yet.
    pub resident: usize,
    /// In chunks mapped for use (active pages and what is around them).
    pub mapped: usize,
    /// Mapped, returned to the system, and kept as address space for reuse:
    /// not resident.
    pub retained: usize,
    /// Freed pages each arena has not returned yet.
    pub arenas: Vec<ArenaPages>,
}

/// Freed pages an arena holds, in bytes.
#[derive(Debug, Clone, Copy)]
pub struct ArenaPages {
    /// The arena's index: threads are spread over arenas.
    pub arena: u32,
    /// Freed and still resident; returned after `dirty_decay_ms`.
    pub dirty: usize,
    /// Returned lazily (`MADV_FREE`): resident, and counted in RSS, until the
    /// kernel needs the memory or `muzzy_decay_ms` returns them for good.
    pub muzzy: usize,
    /// Freed blocks the threads of the arena keep in their caches for their
    /// next allocations: active, not free to return.
    pub cached: usize,
}

/// The allocator's figures: jemalloc's totals, and the freed pages each of
/// its arenas still holds (where RSS goes that the live heap does not show).
pub(super) fn encode_heap(heap: &HeapStats, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let totals = [
        (
            "kpm_heap_allocated_bytes",
            "Bytes kpm has allocated and not freed (the allocator's live heap).",
            heap.allocated,
        ),
        (
            "kpm_heap_active_bytes",
            "Bytes in the allocator's pages that hold live allocations (live heap and the room between them).",
            heap.active,
        ),
        ("kpm_heap_metadata_bytes", "Bytes of the allocator's own bookkeeping.", heap.metadata),
        (
            "kpm_heap_resident_bytes",
            "Bytes in pages kpm's allocator keeps resident (live heap, metadata, freed pages not returned yet).",
            heap.resident,
        ),
        ("kpm_heap_mapped_bytes", "Bytes the allocator has mapped for use.", heap.mapped),
        (
            "kpm_heap_retained_bytes",
            "Bytes of address space the allocator returned to the system and keeps for reuse (not resident).",
            heap.retained,
        ),
    ];
    for (name, help, bytes) in totals {
        gauge(encoder, name, help, bytes)?;
    }
    let arena = |arena: &ArenaPages| [("arena", arena.arena.to_string())];
    gauge_family(
        encoder,
        "kpm_heap_dirty_bytes",
        "Bytes of freed pages an allocator arena keeps resident until its dirty decay returns them.",
        heap.arenas.iter().map(|a| (arena(a), a.dirty)),
    )?;
    gauge_family(
        encoder,
        "kpm_heap_muzzy_bytes",
        "Bytes of freed pages an allocator arena returned lazily (MADV_FREE): resident until the kernel takes them.",
        heap.arenas.iter().map(|a| (arena(a), a.muzzy)),
    )?;
    gauge_family(
        encoder,
        "kpm_heap_thread_cache_bytes",
        "Bytes of freed blocks the threads of an allocator arena keep cached for their next allocations.",
        heap.arenas.iter().map(|a| (arena(a), a.cached)),
    )
}
