//! Events are hints: rescans and periodic resyncs repair DesiredState, and a
//! removed or moved registry directory is re-created and watched again.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{Fixture, make_socket, serve};
use kpm_api::constants::MAX_CONFIG_DURATION;
use kpm_cache::DesiredState;
use kpm_test_support::wait_until;
use kpm_watcher::{Watcher, WatcherConfig, WatcherError};

const ELSEWHERE: &str = "/var/lib/kubelet/device-plugins/not-ours.sock";

fn three_sockets(root: &Path) {
    fs::create_dir(root.join("sub")).unwrap();
    for name in ["a.sock", "b.sock", "sub/c.sock"] {
        make_socket(&root.join(name));
    }
}

/// Removes `a.sock` behind the watcher's back, adds entries for a path that
/// is not on disk and for one outside the root.
fn tamper(f: &Fixture) {
    f.desired.remove(&f.path("a.sock")).unwrap();
    f.desired.add_or_update(&f.path("ghost.sock")).unwrap();
    f.desired.add_or_update(&f.path("sub/gone/ghost.sock")).unwrap();
    f.desired.add_or_update(Path::new(ELSEWHERE)).unwrap();
}

#[tokio::test]
async fn rescan_repairs_tampered_desired_state() {
    let f = Fixture::start_with(three_sockets, WatcherConfig::default());
    let b = f.generation(&f.path("b.sock")).unwrap();
    let c = f.generation(&f.path("sub/c.sock")).unwrap();
    tamper(&f);
    f.watcher.rescan().await.unwrap();
    let mut expected = f.expect(&["a.sock", "b.sock", "sub/c.sock"]);
    expected.push(ELSEWHERE.into());
    expected.sort();
    assert_eq!(f.paths(), expected, "re-added, ghosts removed, other roots left alone");
    assert_eq!(f.generation(&f.path("b.sock")), Some(b), "untouched entries keep their generation");
    assert_eq!(f.generation(&f.path("sub/c.sock")), Some(c));
}

#[tokio::test]
async fn periodic_resync_repairs_tampered_desired_state() {
    let config = WatcherConfig::default().resync_period(Duration::from_millis(100));
    let f = Fixture::start_with(three_sockets, config);
    let stats = f.watcher.stats();
    let b = f.generation(&f.path("b.sock")).unwrap();
    tamper(&f);
    wait_until("the periodic resync repairs DesiredState", || {
        f.desired.contains(&f.path("a.sock"))
            && !f.desired.contains(&f.path("ghost.sock"))
            && !f.desired.contains(&f.path("sub/gone/ghost.sock"))
    })
    .await;
    assert_eq!(f.generation(&f.path("b.sock")), Some(b));
    assert!(f.desired.contains(Path::new(ELSEWHERE)));
    assert!(stats.rescans() >= 1, "the resync is counted");
}

#[tokio::test]
async fn removed_root_is_recreated_and_watched_again() {
    // The sockets' listeners are closed: a bound socket pins the directory,
    // and inotify reports the root's deletion only once none is left.
    let f = Fixture::start_with(three_sockets, WatcherConfig::default());
    fs::remove_dir_all(&f.root).unwrap();
    wait_until("the root is re-created and the old sockets are removed", || {
        f.root.is_dir() && f.desired.is_empty()
    })
    .await;
    make_socket(&f.path("new.sock"));
    f.wait_present(&f.path("new.sock")).await;
    fs::create_dir(f.path("dir")).unwrap();
    make_socket(&f.path("dir/s.sock"));
    f.wait_present(&f.path("dir/s.sock")).await;
}

#[tokio::test]
async fn root_moved_away_is_recreated_and_the_moved_tree_is_forgotten() {
    let f = Fixture::start_with(three_sockets, WatcherConfig::default());
    let moved = f.dir.path().join("moved");
    fs::rename(&f.root, &moved).unwrap();
    wait_until("the root is re-created and the moved sockets are removed", || {
        f.root.is_dir() && f.desired.is_empty()
    })
    .await;
    // Events in the moved tree must not be reported under the root's path.
    make_socket(&moved.join("x.sock"));
    make_socket(&moved.join("sub/y.sock"));
    make_socket(&f.path("new.sock"));
    f.wait_present(&f.path("new.sock")).await;
    f.settle().await;
    assert_eq!(f.paths(), f.expect(&["new.sock"]));
}

/// A listening socket pins the removed root: inotify reports its deletion
/// on the root only when the last one closes. The watch on its parent
/// reports it at once, with no resync to help.
#[tokio::test]
async fn root_removed_under_a_live_listener_is_recovered_at_once() {
    let config = WatcherConfig::default().resync_period(Duration::ZERO);
    let f = Fixture::start_with(three_sockets, config);
    let plugin = serve(&f.path("live.sock"));
    f.wait_present(&f.path("live.sock")).await;
    fs::remove_dir_all(&f.root).unwrap();
    wait_until("the root is re-created and the old sockets are removed", || {
        f.root.is_dir() && f.desired.is_empty()
    })
    .await;
    fs::create_dir(f.path("dir")).unwrap();
    make_socket(&f.path("dir/new.sock"));
    f.wait_present(&f.path("dir/new.sock")).await;
    drop(plugin);
    f.settle().await;
    assert_eq!(f.paths(), f.expect(&["dir/new.sock"]));
}

/// The periodic resync notices a missing root too.
#[tokio::test]
async fn root_removed_under_a_live_listener_is_recovered_by_the_resync() {
    let config = WatcherConfig::default().resync_period(Duration::from_millis(100));
    let f = Fixture::start_with(three_sockets, config);
    let plugin = serve(&f.path("live.sock"));
    f.wait_present(&f.path("live.sock")).await;
    fs::remove_dir_all(&f.root).unwrap();
    wait_until("the root is re-created and the old sockets are removed", || {
        f.root.is_dir() && f.desired.is_empty()
    })
    .await;
    make_socket(&f.path("new.sock"));
    f.wait_present(&f.path("new.sock")).await;
    drop(plugin);
    make_socket(&f.path("after-close.sock"));
    f.wait_present(&f.path("after-close.sock")).await;
    f.settle().await;
    assert_eq!(f.paths(), f.expect(&["after-close.sock", "new.sock"]));
}

#[tokio::test]
async fn resync_periods_beyond_the_bound_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for too_long in [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        MAX_CONFIG_DURATION + Duration::from_nanos(1),
    ] {
        let config = WatcherConfig::default().resync_period(too_long);
        let root = dir.path().join("plugins_registry");
        let error = Watcher::start(root.clone(), Arc::new(DesiredState::new()), config)
            .expect_err("refused");
        assert!(
            matches!(error, WatcherError::InvalidConfig(kpm_api::config::DurationOutOfRange { field: "resync_period", value, .. }) if value == too_long),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(text.contains("resync_period") && text.contains("365 days"), "{text}");
        assert!(!root.exists(), "nothing is done before the config is checked");
    }
}

#[tokio::test(start_paused = true)]
async fn the_longest_resync_period_runs_without_overflow() {
    let config = WatcherConfig::default().resync_period(MAX_CONFIG_DURATION);
    let f = Fixture::start_with(three_sockets, config);
    let stats = f.watcher.stats();
    // A round trip: the task has started and armed its timer.
    f.watcher.rescan().await.unwrap();
    for periods in 1..=3 {
        tokio::time::advance(MAX_CONFIG_DURATION).await;
        wait_until("the periodic resync runs", || stats.rescans() > periods).await;
        assert_eq!(stats.rescans(), 1 + periods, "one resync per period");
    }
    assert_eq!(f.paths(), f.expect(&["a.sock", "b.sock", "sub/c.sock"]));
}
