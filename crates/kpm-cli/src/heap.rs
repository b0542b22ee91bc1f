//! kpm's memory allocator, jemalloc, and its statistics for `/metrics`
//! (`kpm_status::metrics`, which shows them).
//!
//! jemalloc hands pages freed by churning connections back to the system
//! (at once, from `kpm run` and `kpm doctor --watch` on), and each runtime
//! thread that goes idle hands back the blocks its cache keeps; with
//! glibc's malloc kpm's RSS kept growing under churn while its live heap
//! stayed flat (`docs/reliability.md`, soak).

use std::cell::Cell;
use std::time::{Duration, Instant};

use kpm_status::metrics::{ArenaPages, HeapStats};
use tikv_jemalloc_ctl::{Access as _, AsName as _, arenas, epoch, stats};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Has jemalloc return pages to the system as soon as they are free
/// (`dirty_decay_ms` 0, in the arenas in use and in those to come) rather
/// than keep them for ten seconds to reuse.
///
/// Under churn a freed page is reused within milliseconds by whatever asks
/// next. h2 sizes each connection's buffers for the worst case (16 KiB to
/// write, 8 KiB to read) and a plugin's connection touches a few hundred
/// bytes of them: a fresh page never touched takes no memory, but a page
/// reused dirty is resident already. So under churn RSS crept up towards
/// all that jemalloc holds while the live heap stayed flat: +6 % in four
/// minutes of the soak at 1000 plugins, 50 re-created a second, and still
/// climbing. Returned at once, RSS stays at what is touched, and falls as
/// it settles (issue 36, docs/performance.md). Nothing stays dirty for a
/// background thread to purge once kpm idles.
pub(crate) fn return_freed_pages_at_once() {
    if let Err(error) = no_dirty_decay() {
        tracing::warn!(
            %error,
            "cannot have the allocator return freed pages at once; under churn RSS may grow \
             up to what it holds"
        );
    }
}

/// How often a runtime thread that goes idle may hand back the blocks its
/// cache keeps: soon enough that an idle kpm holds no more than it uses
/// well within a minute of a burst, seldom enough that a thread that parks
/// between every two registrations under churn keeps its cache.
const THREAD_CACHE_FLUSH_PERIOD: Duration = Duration::from_secs(10);

thread_local! {
    /// When this thread last handed its cached blocks back.
    static THREAD_CACHE_FLUSHED: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Has the calling thread hand back the blocks its cache keeps (jemalloc's
/// tcache), at most once per [`THREAD_CACHE_FLUSH_PERIOD`]: for a runtime
/// thread about to park, with nothing left to do.
///
/// Each thread keeps the blocks it frees, up to 200 of a size, to serve its
/// next allocations without a lock, and gives them back only as it
/// allocates more. A thread that goes idle after a burst keeps them for
/// good: 1000 CSI drivers registered at once left 6.8 MB in the caches of
/// kpm's four threads, a quarter of its RSS (issue 36). Turning the cache
/// off and on again flushes it; jemalloc has no other call for it that
/// safe code can make.
pub(crate) fn flush_thread_cache_when_idle() {
    let now = Instant::now();
    let due = THREAD_CACHE_FLUSHED.get().is_none_or(|last| now - last >= THREAD_CACHE_FLUSH_PERIOD);
    if !due {
        return;
    }
    THREAD_CACHE_FLUSHED.set(Some(now));
    let enabled = b"thread.tcache.enabled\0".name();
    // Failing, the cache stays as it was: nothing to undo.
    if enabled.write(false).is_ok() {
        let _ = enabled.write(true);
    }
}

fn no_dirty_decay() -> tikv_jemalloc_ctl::Result<()> {
    const AT_ONCE: isize = 0;
    // The default for arenas created later, then each arena in use.
    b"arenas.dirty_decay_ms\0".name().write(AT_ONCE)?;
    for arena in 0..arenas::narenas::read()? {
        // An arena no thread has used yet does not exist: it will take the default.
        let _ = format!("arena.{arena}.dirty_decay_ms\0").name().write(AT_ONCE);
    }
    Ok(())
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

/// The dirty and muzzy pages and the cached blocks of every arena in use.
/// An arena's figures are read by a name with its index in it; an arena no
/// thread has used yet has none.
fn arena_pages() -> Option<Vec<ArenaPages>> {
    let page: usize = b"arenas.page\0".name().read().ok()?;
    let pages = |arena: u32, figure: &str| -> Option<usize> {
        let pages: usize = format!("stats.arenas.{arena}.{figure}\0").name().read().ok()?;
        Some(pages.saturating_mul(page))
    };
    let arenas = (0..arenas::narenas::read().ok()?)
        .filter_map(|arena| {
            Some(ArenaPages {
                arena,
                dirty: pages(arena, "pdirty")?,
                muzzy: pages(arena, "pmuzzy")?,
                cached: format!("stats.arenas.{arena}.tcache_bytes\0").name().read().ok()?,
            })
        })
        .collect();
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
        assert!(heap.arenas.iter().all(|arena| arena.dirty % 4096 == 0 && arena.muzzy % 4096 == 0));
    }

    #[test]
    fn a_thread_going_idle_hands_its_cached_blocks_back() {
        // A thread of its own, with an arena no other test thread is likely to share.
        std::thread::spawn(|| {
            let arena: u32 = b"thread.arena\0".name().read().expect("the thread's arena");
            let cached = || {
                let heap = stats().expect("jemalloc's statistics");
                heap.arenas.iter().find(|a| a.arena == arena).map_or(0, |a| a.cached)
            };
            // Blocks of the size h2 reads into, freed: the thread keeps some.
            let blocks: Vec<Vec<u8>> = (0..64).map(|_| vec![1_u8; 8 << 10]).collect();
            drop(std::hint::black_box(blocks));
            let before = cached();
            assert!(before >= 64 << 10, "{before} bytes cached");
            flush_thread_cache_when_idle();
            let after = cached();
            assert!(after < before / 4, "{after} of {before} bytes still cached");
        })
        .join()
        .expect("the test's thread");
    }

    #[test]
    fn freed_pages_go_back_at_once() {
        // Beyond the thread's cache, below the size jemalloc always returns at once.
        const FREED: usize = 2 << 20;
        return_freed_pages_at_once();
        drop(std::hint::black_box(vec![1_u8; FREED]));
        let heap = stats().expect("jemalloc's statistics");
        let dirty: usize = heap.arenas.iter().map(|arena| arena.dirty).sum();
        assert!(dirty < FREED, "{dirty} bytes kept dirty: {heap:?}");
    }
}
