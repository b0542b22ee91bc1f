//! kpm's memory allocator, jemalloc, and its statistics for `/metrics`.
//!
//! jemalloc hands pages freed by churning connections back to the system
//! within seconds, from a background thread of its own once `kpm run`
//! starts it; with glibc's malloc kpm's RSS kept growing under churn while
//! its live heap stayed flat (`docs/reliability.md`, soak).

use serde::Deserialize;
use tikv_jemalloc_ctl::stats_print::{self, Options};
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

/// What the allocator holds, in bytes: jemalloc's `stats.*`.
#[derive(Debug, Clone)]
pub(crate) struct HeapStats {
    /// Allocated by kpm and not freed yet: the live heap.
    pub(crate) allocated: usize,
    /// In pages of live allocations: the live heap and the free room between
    /// its allocations (fragmentation).
    pub(crate) active: usize,
    /// The allocator's own bookkeeping.
    pub(crate) metadata: usize,
    /// In pages the allocator keeps resident: active pages, metadata, and
    /// dirty and muzzy pages not returned yet.
    pub(crate) resident: usize,
    /// In chunks mapped for use (active pages and what is around them).
    pub(crate) mapped: usize,
    /// Mapped, returned to the system, and kept as address space for reuse:
    /// not resident.
    pub(crate) retained: usize,
    /// Freed pages each arena has not returned yet.
    pub(crate) arenas: Vec<ArenaPages>,
}

/// Freed pages an arena holds, in bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ArenaPages {
    /// The arena's index: threads are spread over arenas.
    pub(crate) arena: usize,
    /// Freed and still resident; returned after `dirty_decay_ms`.
    pub(crate) dirty: usize,
    /// Returned lazily (`MADV_FREE`): resident, and counted in RSS, until the
    /// kernel needs the memory or `muzzy_decay_ms` returns them for good.
    pub(crate) muzzy: usize,
}

/// The allocator's statistics now; `None` if jemalloc cannot tell.
pub(crate) fn stats() -> Option<HeapStats> {
    // jemalloc's statistics are a snapshot, refreshed by advancing its epoch.
    epoch::advance().ok()?;
    Some(HeapStats {
        allocated: stats::allocated::read().ok()?,
        active: stats::active::read().ok()?,
        metadata: stats::metadata::read().ok()?,
        resident: stats::resident::read().ok()?,
        mapped: stats::mapped::read().ok()?,
        retained: stats::retained::read().ok()?,
        arenas: arena_pages().unwrap_or_default(),
    })
}

/// The dirty and muzzy pages of every arena in use. jemalloc's control
/// interface reads one arena's figures only by a name built at run time,
/// which the safe wrapper does not offer, so they come from its statistics
/// report, as JSON, without the per-size-class tables.
fn arena_pages() -> Option<Vec<ArenaPages>> {
    let mut options = Options::default();
    options.json_format = true;
    options.skip_merged_arenas = true;
    options.skip_bin_size_classes = true;
    options.skip_large_size_classes = true;
    options.skip_mutex_statistics = true;
    let mut json = Vec::new();
    stats_print::stats_print(&mut json, options).ok()?;
    parse_arena_pages(&json)
}

/// jemalloc's report, the parts read here.
#[derive(Deserialize)]
struct Report {
    jemalloc: Jemalloc,
}

#[derive(Deserialize)]
struct Jemalloc {
    arenas: Constants,
    #[serde(rename = "stats.arenas")]
    arenas_stats: std::collections::BTreeMap<String, ArenaReport>,
}

#[derive(Deserialize)]
struct Constants {
    page: usize,
}

#[derive(Deserialize)]
struct ArenaReport {
    pdirty: usize,
    pmuzzy: usize,
}

/// The per-arena figures of a report; keys other than an arena's index
/// (merged or destroyed arenas) are left out.
fn parse_arena_pages(json: &[u8]) -> Option<Vec<ArenaPages>> {
    let report: Report = serde_json::from_slice(json).ok()?;
    let page = report.jemalloc.arenas.page;
    let mut arenas: Vec<ArenaPages> = report
        .jemalloc
        .arenas_stats
        .into_iter()
        .filter_map(|(key, arena)| {
            Some(ArenaPages {
                arena: key.parse().ok()?,
                dirty: arena.pdirty.saturating_mul(page),
                muzzy: arena.pmuzzy.saturating_mul(page),
            })
        })
        .collect();
    arenas.sort_by_key(|arena| arena.arena);
    Some(arenas)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocator_reports_every_figure_and_its_arenas() {
        // Allocate and free enough to leave dirty pages behind in this thread's arena.
        drop(std::hint::black_box(vec![1_u8; 8 << 20]));
        let heap = stats().expect("jemalloc's statistics");
        assert!(heap.allocated > 0);
        assert!(heap.active >= heap.allocated);
        assert!(heap.resident >= heap.active);
        assert!(heap.mapped >= heap.active);
        assert!(heap.metadata > 0);
        assert!(!heap.arenas.is_empty(), "at least this thread's arena is in use");
        assert!(heap.arenas.windows(2).all(|pair| pair[0].arena < pair[1].arena));
    }

    #[test]
    fn a_report_gives_each_arena_in_bytes_and_skips_merged_ones() {
        let json = br#"{"jemalloc": {"version": "5.3.0", "arenas": {"narenas": 8, "page": 4096},
            "stats.arenas": {"merged": {"pdirty": 9, "pmuzzy": 9},
                             "2": {"nthreads": 1, "pdirty": 3, "pmuzzy": 1},
                             "0": {"nthreads": 2, "pdirty": 10, "pmuzzy": 0}}}}"#;
        let arenas = parse_arena_pages(json).expect("parsed");
        let pages: Vec<_> = arenas.iter().map(|a| (a.arena, a.dirty, a.muzzy)).collect();
        assert_eq!(pages, [(0, 40_960, 0), (2, 12_288, 4096)]);
        assert!(parse_arena_pages(b"not json").is_none());
    }
}
