//! Helpers shared by the integration tests: a watcher on a temp dir, real
//! Unix sockets, and waits for DesiredState (no fixed sleeps).

// Not every test binary uses every helper; a failed setup fails the test.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kpm_cache::{DesiredState, Generation};
use kpm_test_support::wait_until;
use kpm_watcher::{Watcher, WatcherConfig};
use tempfile::TempDir;

/// Binds a Unix socket at `path` and keeps it listening.
pub(crate) fn serve(path: &Path) -> UnixListener {
    UnixListener::bind(path).unwrap_or_else(|error| panic!("bind {}: {error}", path.display()))
}

/// Binds a Unix socket at `path` and closes it: the socket file stays.
pub(crate) fn make_socket(path: &Path) {
    drop(serve(path));
}

/// A watcher on `<tempdir>/plugins_registry`, with `<tempdir>/outside` as a
/// place on the same filesystem to rename things in from and out to.
pub(crate) struct Fixture {
    pub(crate) dir: TempDir,
    pub(crate) root: PathBuf,
    pub(crate) desired: Arc<DesiredState>,
    pub(crate) watcher: Watcher,
}

impl Fixture {
    /// Starts a watcher on a fresh registry directory.
    pub(crate) fn start() -> Self {
        Self::start_with(|_| {}, WatcherConfig::default())
    }

    /// Creates the registry directory, lets `setup` fill it, then starts the watcher.
    pub(crate) fn start_with(setup: impl FnOnce(&Path), config: WatcherConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("plugins_registry");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(dir.path().join("outside")).unwrap();
        setup(&root);
        let desired = Arc::new(DesiredState::new());
        let watcher = Watcher::start(root.clone(), Arc::clone(&desired), config).unwrap();
        Self { dir, root, desired, watcher }
    }

    /// A path in the registry directory.
    pub(crate) fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    /// A path outside the registry directory, on the same filesystem.
    pub(crate) fn outside(&self, relative: &str) -> PathBuf {
        self.dir.path().join("outside").join(relative)
    }

    pub(crate) fn generation(&self, path: &Path) -> Option<Generation> {
        self.desired.generation(path)
    }

    /// Every path in DesiredState, sorted.
    pub(crate) fn paths(&self) -> Vec<PathBuf> {
        self.desired.snapshot().into_iter().map(|plugin| plugin.socket_path).collect()
    }

    /// The paths `relative` names in the registry directory, sorted as `paths` is.
    pub(crate) fn expect(&self, relative: &[&str]) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = relative.iter().map(|name| self.path(name)).collect();
        paths.sort();
        paths
    }

    /// Waits until `path` is in DesiredState and returns its generation.
    pub(crate) async fn wait_present(&self, path: &Path) -> Generation {
        wait_until(format_args!("{} is registered", path.display()), || {
            self.desired.contains(path)
        })
        .await;
        self.generation(path).unwrap()
    }

    /// Waits until `path` is not in DesiredState.
    pub(crate) async fn wait_absent(&self, path: &Path) {
        wait_until(format_args!("{} is removed", path.display()), || !self.desired.contains(path))
            .await;
    }

    /// Waits until `path` has a generation newer than `old`, and returns it.
    pub(crate) async fn wait_newer(&self, path: &Path, old: Generation) -> Generation {
        wait_until(format_args!("{} gets a generation newer than {old}", path.display()), || {
            self.generation(path).is_some_and(|generation| generation > old)
        })
        .await;
        self.generation(path).unwrap()
    }

    /// A barrier: returns once the watcher has processed every event caused
    /// before the call. inotify delivers one instance's events in order, so
    /// once a socket created now is seen (and its removal too), everything
    /// earlier has been handled. Costs one generation.
    pub(crate) async fn settle(&self) {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let sentinel =
            self.path(&format!("zz-settle-{}.sock", NEXT.fetch_add(1, Ordering::Relaxed)));
        make_socket(&sentinel);
        self.wait_present(&sentinel).await;
        std::fs::remove_file(&sentinel).unwrap();
        self.wait_absent(&sentinel).await;
    }
}
