//! The watched tree: turns notify events and listings into DesiredState
//! changes, without churning the generation of sockets that did not change.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, DirBuilder};
use std::io;
use std::ops::Bound;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kpm_api::FileId;
use kpm_cache::DesiredState;
use notify::event::{ModifyKind, RenameMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};

use crate::WatcherStats;
use crate::error::exhausted_limit;
use crate::scan::{self, Listing};

/// `mkdir -p root` with mode 0750.
pub(crate) fn create_root(root: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(kpm_api::constants::OWN_DIR_MODE).create(root)?;
    // `create` succeeds on an existing path only if it is a directory; check
    // anyway so that a symlink to a file is reported here, not at listing.
    if fs::metadata(root)?.is_dir() {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::NotADirectory, "not a directory"))
    }
}

/// Watches `dir` and every directory below it. notify's recursive watch
/// gives up at the first directory it cannot watch (one without read
/// permission) and leaves the rest of its walk unwatched; then `dir` is
/// watched on its own and each sub-directory likewise, so that such a
/// directory costs only its own subtree. The directories below `dir` that
/// could not be watched end up in `unwatched` (those recorded there before
/// are dropped: they are tried again here), to be tried again when their
/// attributes change and at every resync. Fails if `dir` itself cannot be
/// watched, or on an inotify limit.
pub(crate) fn watch_tree(
    notify: &mut RecommendedWatcher,
    dir: &Path,
    unwatched: &mut BTreeSet<PathBuf>,
) -> notify::Result<()> {
    unwatched.retain(|known| !known.starts_with(dir));
    let error = match notify.watch(dir, RecursiveMode::Recursive) {
        Ok(()) => return Ok(()),
        Err(error) => error,
    };
    let below = !error.paths.is_empty() && error.paths.iter().all(|path| path != dir);
    if !below || matches!(error.kind, notify::ErrorKind::MaxFilesWatch) {
        return Err(error);
    }
    tracing::warn!(dir = %dir.display(), %error, "cannot watch a directory below; watching the others one by one");
    notify.watch(dir, RecursiveMode::NonRecursive)?;
    for entry in fs::read_dir(dir).map_err(|error| notify::Error::io(error).add_path(dir.into()))? {
        let Ok(entry) = entry else { continue };
        if !entry.file_type().is_ok_and(|file_type| file_type.is_dir()) {
            continue;
        }
        let sub = entry.path();
        match watch_tree(notify, &sub, unwatched) {
            Ok(()) => {}
            Err(error) if matches!(error.kind, notify::ErrorKind::MaxFilesWatch) => {
                return Err(error);
            }
            Err(error) => {
                tracing::warn!(dir = %sub.display(), %error, "cannot watch directory");
                unwatched.insert(sub);
            }
        }
    }
    Ok(())
}

/// Why the whole tree is listed again.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Resync {
    /// notify's `Rescan` flag (inotify queue overflow) or our channel was full.
    Overflow,
    /// The periodic safety net.
    Periodic,
    /// `Watcher::rescan`.
    Requested,
}

impl Resync {
    fn as_str(self) -> &'static str {
        match self {
            Self::Overflow => "event overflow",
            Self::Periodic => "periodic resync",
            Self::Requested => "requested",
        }
    }
}

/// The state owned by the watcher task.
pub(crate) struct Tree {
    root: PathBuf,
    desired: Arc<DesiredState>,
    notify: RecommendedWatcher,
    /// The identity of every socket this watcher put into DesiredState.
    known: BTreeMap<PathBuf, FileId>,
    /// The identity of the root directory whose watch is live; `None` after
    /// the root was removed or moved and could not be watched again yet.
    root_id: Option<FileId>,
    /// Directories below the root that could not be watched (no read
    /// permission yet): watched and listed as soon as their attributes
    /// change (a `chmod` is reported by the parent's watch), and tried again
    /// at every resync in case that event was missed.
    unwatched: BTreeSet<PathBuf>,
    /// Counters for metrics.
    stats: WatcherStats,
}

impl std::fmt::Debug for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tree")
            .field("root", &self.root)
            .field("known", &self.known.len())
            .field("root_id", &self.root_id)
            .finish_non_exhaustive()
    }
}

impl Tree {
    /// A tree whose root is already created and watched by `notify`, but for
    /// the directories in `unwatched` (see [`watch_tree`]).
    pub(crate) fn new(
        root: PathBuf,
        desired: Arc<DesiredState>,
        notify: RecommendedWatcher,
        unwatched: BTreeSet<PathBuf>,
    ) -> Self {
        let root_id = fs::metadata(&root).ok().map(|metadata| FileId::of(&metadata));
        Self {
            root,
            desired,
            notify,
            known: BTreeMap::new(),
            root_id,
            unwatched,
            stats: WatcherStats::default(),
        }
    }

    /// Counts rescans into `stats` (shared with whoever reads them).
    pub(crate) fn with_stats(mut self, stats: WatcherStats) -> Self {
        self.stats = stats;
        self
    }

    /// Lists the whole tree into DesiredState; fails if the root cannot be read.
    pub(crate) fn initial_scan(&mut self) -> io::Result<()> {
        let listing = scan::list(&self.root)?;
        let root = self.root.clone();
        self.apply(&root, &listing);
        Ok(())
    }

    /// Handles one notify event. Events are hints: every path is looked at
    /// again on disk before anything is added.
    pub(crate) fn handle_event(&mut self, event: &Event) {
        if event.need_rescan() {
            self.resync(Resync::Overflow);
            return;
        }
        match event.kind {
            // A rename within the tree is reported as From + To (handled
            // below) and then as Both; acting on Both as well would churn.
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {}
            EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(RenameMode::To)) => {
                for path in &event.paths {
                    self.appeared(path);
                }
            }
            // Removals, renames away and renames whose direction the backend
            // does not know. A name can be taken again by the time the event
            // is read (a directory renamed over an empty one reports the old
            // one's removal under the new name; a socket re-created at once):
            // what is on disk decides.
            EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_)) => {
                for path in &event.paths {
                    if path != &self.root && fs::symlink_metadata(path).is_ok() {
                        self.appeared(path);
                    } else {
                        self.gone(path);
                    }
                }
            }
            // A directory that could not be watched may have become readable.
            EventKind::Modify(ModifyKind::Metadata(_)) => {
                for path in &event.paths {
                    if self.unwatched.contains(path) {
                        self.appeared(path);
                    }
                }
            }
            // Data and access events do not change what is a socket.
            _ => {}
        }
    }

    /// Handles an error reported by notify while running.
    pub(crate) fn handle_error(&self, error: &notify::Error) {
        if let Some(limit) = exhausted_limit(error) {
            tracing::error!(
                root = %self.root.display(), %error, limit,
                "inotify limit reached: new sub-directories are not watched; \
                 sockets in them are found by the periodic resync only"
            );
        } else {
            tracing::warn!(root = %self.root.display(), %error, "file watcher error");
        }
    }

    /// Lists the whole tree again and diffs it against DesiredState. If the
    /// root is gone or was replaced, re-creates and re-watches it first.
    pub(crate) fn resync(&mut self, reason: Resync) {
        self.stats.count_rescan();
        if matches!(reason, Resync::Overflow) {
            tracing::warn!(root = %self.root.display(), "file events were lost; rescanning");
        } else {
            tracing::debug!(root = %self.root.display(), reason = reason.as_str(), "rescanning");
        }
        let current =
            fs::metadata(&self.root).ok().filter(fs::Metadata::is_dir).map(|m| FileId::of(&m));
        match current {
            None => self.recover_root("registry directory missing"),
            Some(_) if current != self.root_id => {
                self.recover_root("registry directory replaced or not watched");
            }
            Some(_) => {
                for dir in std::mem::take(&mut self.unwatched) {
                    self.watch_dir(&dir);
                }
                self.sync_dir(&self.root.clone());
            }
        }
    }

    /// A path was created or renamed into the tree.
    fn appeared(&mut self, path: &Path) {
        if !scan::is_eligible(&self.root, path) {
            return;
        }
        let metadata = match fs::symlink_metadata(path) {
            Ok(metadata) => metadata,
            // Gone again already: its removal event follows.
            Err(error) if error.kind() == io::ErrorKind::NotFound => return,
            Err(error) => {
                tracing::warn!(socket = %path.display(), %error, "cannot stat new path");
                return;
            }
        };
        let file_type = metadata.file_type();
        if file_type.is_socket() {
            self.found_socket(path, FileId::of(&metadata));
        } else if file_type.is_dir() {
            self.watch_dir(path);
            self.sync_dir(path);
        } else {
            // Not a socket (any more): a file renamed over a socket replaces it.
            self.forget(path);
            tracing::trace!(path = %path.display(), "ignoring non-socket");
        }
    }

    /// A path was removed or renamed out of (or within) the tree: forget it
    /// and everything below it.
    fn gone(&mut self, path: &Path) {
        if path == self.root {
            self.recover_root("registry directory removed or moved away");
            return;
        }
        if !path.starts_with(&self.root) {
            return;
        }
        self.forget(path);
        self.unwatched.retain(|dir| !dir.starts_with(path));
        let below: Vec<PathBuf> = self
            .known
            .range::<Path, _>((Bound::Included(path), Bound::Unbounded))
            .map(|(known, _)| known)
            .take_while(|known| known.starts_with(path))
            .cloned()
            .collect();
        for socket in below {
            self.forget(&socket);
        }
    }

    /// Makes sure a new directory is watched, and that notify's own watch on
    /// it is in place: the call is answered by notify's thread after it has
    /// processed the batch that reported the directory, so a listing made
    /// after it misses nothing (notify 8 neither reports nor lists what was
    /// created in a directory before its watch was added).
    fn watch_dir(&mut self, dir: &Path) {
        match watch_tree(&mut self.notify, dir, &mut self.unwatched) {
            Ok(()) => {}
            Err(error) if matches!(error.kind, notify::ErrorKind::PathNotFound) => {}
            Err(error) => {
                self.handle_error(&error);
                if exhausted_limit(&error).is_none() {
                    self.unwatched.insert(dir.to_path_buf());
                }
            }
        }
    }

    /// Lists `dir` and diffs it against DesiredState below `dir`.
    fn sync_dir(&mut self, dir: &Path) {
        match scan::list(dir) {
            Ok(listing) => self.apply(dir, &listing),
            // Removed meanwhile: its removal event follows.
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => tracing::warn!(dir = %dir.display(), %error, "cannot list directory"),
        }
    }

    /// Makes DesiredState below `dir` match `listing`: adds new and replaced
    /// sockets, removes vanished ones, leaves unchanged ones alone.
    fn apply(&mut self, dir: &Path, listing: &Listing) {
        for (path, id) in &listing.sockets {
            self.found_socket(path, *id);
        }
        let vanished: Vec<PathBuf> = self
            .desired
            .snapshot()
            .into_iter()
            .map(|plugin| plugin.socket_path)
            .chain(self.known.keys().cloned())
            .filter(|path| path.starts_with(dir))
            .filter(|path| !listing.sockets.contains_key(path) && !listing.is_unknown(path))
            .collect();
        for path in vanished {
            self.forget(&path);
        }
    }

    /// Records a socket seen on disk. Only a socket this watcher has not
    /// recorded with the same identity gets a new generation.
    fn found_socket(&mut self, path: &Path, id: FileId) {
        if self.known.get(path) == Some(&id) && self.desired.contains(path) {
            return;
        }
        match self.desired.add_or_update(path) {
            Ok(generation) => {
                let replaced = self.known.insert(path.to_path_buf(), id).is_some();
                tracing::info!(socket = %path.display(), %generation, replaced, "socket added");
            }
            Err(error) => {
                tracing::warn!(socket = %path.display(), %error, "cannot add socket");
            }
        }
    }

    /// Removes one path from DesiredState.
    fn forget(&mut self, path: &Path) {
        self.known.remove(path);
        if let Some(generation) = self.desired.remove(path) {
            tracing::info!(socket = %path.display(), %generation, "socket removed");
        }
    }

    /// The root was removed, moved away or replaced: the sockets below it are
    /// gone and its watch is dead. Re-creates it, watches it again and lists it.
    fn recover_root(&mut self, why: &str) {
        tracing::warn!(root = %self.root.display(), why, "registry directory lost; re-creating it");
        // Drop what is left of the old watch (after a move it would report the
        // moved directory's events under the root's path).
        let _ = self.notify.unwatch(&self.root);
        self.root_id = None;
        let root = self.root.clone();
        if let Err(error) = create_root(&root) {
            tracing::error!(
                root = %root.display(), %error,
                "error (re-)creating root; retrying at the next resync"
            );
            self.apply(&root, &Listing::default());
            return;
        }
        match watch_tree(&mut self.notify, &root, &mut self.unwatched) {
            Ok(()) => {
                self.root_id = fs::metadata(&root).ok().map(|metadata| FileId::of(&metadata));
            }
            Err(error) => {
                self.handle_error(&error);
                tracing::error!(root = %root.display(), "cannot watch root; retrying at the next resync");
            }
        }
        match scan::list(&root) {
            Ok(listing) => self.apply(&root, &listing),
            Err(error) => {
                tracing::warn!(root = %root.display(), %error, "cannot list root");
                if error.kind() == io::ErrorKind::NotFound {
                    self.apply(&root, &Listing::default());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use notify::event::Flag;

    use super::*;

    fn tree(root: &Path, desired: &Arc<DesiredState>) -> Tree {
        let mut notify =
            RecommendedWatcher::new(|_: notify::Result<Event>| {}, notify::Config::default())
                .unwrap();
        notify.watch(root, RecursiveMode::Recursive).unwrap();
        Tree::new(root.to_path_buf(), Arc::clone(desired), notify, BTreeSet::new())
    }

    /// A tree over `root` whose sub-directory `late` is recorded as not
    /// watched (as if it had had no read permission), and its events.
    fn tree_without_late_watch(
        root: &Path,
    ) -> (Tree, PathBuf, std::sync::mpsc::Receiver<notify::Result<Event>>) {
        let late = root.join("late");
        fs::create_dir(&late).unwrap();
        let (events_tx, events) = std::sync::mpsc::channel();
        let mut notify = RecommendedWatcher::new(events_tx, notify::Config::default()).unwrap();
        notify.watch(root, RecursiveMode::NonRecursive).unwrap();
        let desired = Arc::new(DesiredState::new());
        let tree = Tree::new(root.to_path_buf(), desired, notify, BTreeSet::from([late.clone()]));
        (tree, late, events)
    }

    /// Binds a socket in `dir` and waits for notify to report it.
    fn socket_is_reported(dir: &Path, events: &std::sync::mpsc::Receiver<notify::Result<Event>>) {
        let socket = dir.join("p.sock");
        let _listener = UnixListener::bind(&socket).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match events.recv_timeout(left) {
                Ok(Ok(event)) if event.paths.contains(&socket) => return,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        panic!("no event for {}: its directory is not watched", socket.display());
    }

    #[test]
    fn a_chmod_on_an_unwatched_directory_watches_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut tree, late, events) = tree_without_late_watch(dir.path());
        let attributes = Event::new(EventKind::Modify(ModifyKind::Metadata(
            notify::event::MetadataKind::Permissions,
        )))
        .add_path(late.clone());
        tree.handle_event(&attributes);
        assert!(tree.unwatched.is_empty());
        socket_is_reported(&late, &events);
    }

    #[test]
    fn a_resync_watches_unwatched_directories() {
        let dir = tempfile::tempdir().unwrap();
        let (mut tree, late, events) = tree_without_late_watch(dir.path());
        tree.resync(Resync::Periodic);
        assert!(tree.unwatched.is_empty());
        socket_is_reported(&late, &events);
    }

    #[test]
    fn overflow_event_rescans_and_keeps_unchanged_generations() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for name in ["a.sock", "b.sock"] {
            drop(UnixListener::bind(root.join(name)).unwrap());
        }
        let desired = Arc::new(DesiredState::new());
        let mut tree = tree(root, &desired);
        tree.initial_scan().unwrap();
        let b = desired.generation(&root.join("b.sock")).unwrap();

        // Changes whose events were lost in the overflow.
        std::fs::remove_file(root.join("a.sock")).unwrap();
        drop(UnixListener::bind(root.join("c.sock")).unwrap());
        desired.add_or_update(&root.join("ghost.sock")).unwrap();

        tree.handle_event(&Event::new(EventKind::Other).set_flag(Flag::Rescan));
        let paths: Vec<PathBuf> = desired.snapshot().into_iter().map(|p| p.socket_path).collect();
        assert_eq!(paths, [root.join("b.sock"), root.join("c.sock")]);
        assert_eq!(desired.generation(&root.join("b.sock")), Some(b));
    }

    #[test]
    fn rename_both_events_are_not_acted_on() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        drop(UnixListener::bind(root.join("new.sock")).unwrap());
        let desired = Arc::new(DesiredState::new());
        let mut tree = tree(root, &desired);
        tree.initial_scan().unwrap();
        let generation = desired.generation(&root.join("new.sock")).unwrap();
        let both = Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::Both)))
            .add_path(root.join("old.sock"))
            .add_path(root.join("new.sock"));
        tree.handle_event(&both);
        assert_eq!(desired.generation(&root.join("new.sock")), Some(generation));
    }
}
