//! DesiredState: the registration sockets that exist right now.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use parking_lot::RwLock;

use crate::{CacheError, ChangeSignal, Changes};

/// Identifies one incarnation of a socket path. Every
/// [`DesiredState::add_or_update`] yields a new, larger generation, so a socket
/// removed and re-created within the same clock tick is still a new plugin
/// (the kubelet's timestamp comparison missed that on Windows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(transparent))]
pub struct Generation(u64);

impl Generation {
    /// The number, for logs and status output; only its order means anything.
    pub fn get(self) -> u64 {
        self.0
    }

    /// A made-up generation, for tests that build status documents by hand
    /// (feature `testing`): it is no incarnation of any socket.
    #[cfg(feature = "testing")]
    pub fn for_tests(number: u64) -> Self {
        Self(number)
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A socket that should be registered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DesiredPlugin {
    /// The registration socket.
    pub socket_path: PathBuf,
    /// Its current incarnation.
    pub generation: Generation,
    /// Why it is held back from registration, if it is (see
    /// [`DesiredState::hold`]).
    pub held: Option<String>,
}

/// The set of registration sockets present on disk, keyed by socket path.
///
/// Besides the [`ChangeSignal`], every change is recorded in a journal of
/// changed paths that one consumer, the reconciler, drains with
/// [`take_changed`](Self::take_changed) to look only at what changed.
#[derive(Debug, Default)]
pub struct DesiredState {
    inner: RwLock<Inner>,
    changes: ChangeSignal,
}

#[derive(Debug, Default)]
struct Inner {
    plugins: HashMap<PathBuf, Entry>,
    last_generation: u64,
    /// Paths added, re-created or removed since the last `take_changed`.
    changed: HashSet<PathBuf>,
}

/// A socket's incarnation, and whether it is held back.
#[derive(Debug)]
struct Entry {
    generation: Generation,
    held: Option<String>,
}

impl Inner {
    /// Gives `socket_path` the next generation, not held, and notes it as
    /// changed.
    fn new_generation(&mut self, socket_path: &Path) -> Generation {
        self.last_generation += 1;
        let generation = Generation(self.last_generation);
        let entry = Entry { generation, held: None };
        if let Some(old) = self.plugins.insert(socket_path.to_path_buf(), entry) {
            let old = old.generation;
            tracing::debug!(socket = %socket_path.display(), %old, new = %generation, "new incarnation");
        }
        self.changed.insert(socket_path.to_path_buf());
        generation
    }

    /// The entry of `socket_path` if it has `generation`.
    fn entry_of(&mut self, socket_path: &Path, generation: Generation) -> Option<&mut Entry> {
        self.plugins.get_mut(socket_path).filter(|entry| entry.generation == generation)
    }
}

impl DesiredState {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that a socket exists at `socket_path`, replacing any previous
    /// incarnation: the returned generation is always new.
    pub fn add_or_update(&self, socket_path: &Path) -> Result<Generation, CacheError> {
        if socket_path.as_os_str().is_empty() {
            return Err(CacheError::EmptySocketPath);
        }
        let generation = self.inner.write().new_generation(socket_path);
        self.changes.bump();
        Ok(generation)
    }

    /// Gives the socket a new generation if it still has `generation`: the
    /// same file, but a plugin to be registered anew (it stopped answering).
    /// `None` if the socket is gone or was re-created meanwhile.
    pub fn renew(&self, socket_path: &Path, generation: Generation) -> Option<Generation> {
        let renewed = {
            let mut inner = self.inner.write();
            inner.entry_of(socket_path, generation)?;
            inner.new_generation(socket_path)
        };
        self.changes.bump();
        Some(renewed)
    }

    /// Holds the socket back from registration, if it still has
    /// `generation` and is not held yet: the socket stays (the watcher's
    /// file is unchanged), but [`registrable`](Self::registrable) has no
    /// generation for it, so the reconciler deregisters its plugin and
    /// registers nothing until [`release`](Self::release) or a new
    /// incarnation. `reason` says why, for the status. Whether it was held.
    pub fn hold(&self, socket_path: &Path, generation: Generation, reason: String) -> bool {
        {
            let mut inner = self.inner.write();
            match inner.entry_of(socket_path, generation) {
                Some(entry) if entry.held.is_none() => entry.held = Some(reason),
                _ => return false,
            }
            inner.changed.insert(socket_path.to_path_buf());
        }
        self.changes.bump();
        true
    }

    /// Ends a [`hold`](Self::hold) of `generation` with a new generation, to
    /// be registered at once; `None` if the socket is gone, was re-created
    /// meanwhile, or is not held.
    pub fn release(&self, socket_path: &Path, generation: Generation) -> Option<Generation> {
        let released = {
            let mut inner = self.inner.write();
            inner.entry_of(socket_path, generation)?.held.as_ref()?;
            inner.new_generation(socket_path)
        };
        self.changes.bump();
        Some(released)
    }

    /// Forgets the socket; returns the generation it had, `None` if absent.
    pub fn remove(&self, socket_path: &Path) -> Option<Generation> {
        let removed = {
            let mut inner = self.inner.write();
            let removed = inner.plugins.remove(socket_path).map(|entry| entry.generation);
            if removed.is_some() {
                inner.changed.insert(socket_path.to_path_buf());
            }
            removed
        };
        if removed.is_some() {
            self.changes.bump();
        }
        removed
    }

    /// Whether a socket exists at `socket_path`, in any incarnation.
    pub fn contains(&self, socket_path: &Path) -> bool {
        self.inner.read().plugins.contains_key(socket_path)
    }

    /// The current generation of the socket, if present (held or not).
    pub fn generation(&self, socket_path: &Path) -> Option<Generation> {
        self.inner.read().plugins.get(socket_path).map(|entry| entry.generation)
    }

    /// The generation of the socket to register: its current one, unless
    /// it is absent or [held](Self::hold).
    pub fn registrable(&self, socket_path: &Path) -> Option<Generation> {
        let inner = self.inner.read();
        let entry = inner.plugins.get(socket_path)?;
        entry.held.is_none().then_some(entry.generation)
    }

    /// How many sockets exist.
    pub fn len(&self) -> usize {
        self.inner.read().plugins.len()
    }

    /// Whether no socket exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every socket, sorted by path.
    pub fn snapshot(&self) -> Vec<DesiredPlugin> {
        let mut plugins: Vec<DesiredPlugin> = self
            .inner
            .read()
            .plugins
            .iter()
            .map(|(path, entry)| DesiredPlugin {
                socket_path: path.clone(),
                generation: entry.generation,
                held: entry.held.clone(),
            })
            .collect();
        plugins.sort_unstable_by(|a, b| a.socket_path.cmp(&b.socket_path));
        plugins
    }

    /// Every socket path, in no particular order: cheaper than a snapshot
    /// for a caller that looks each path up anyway.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.inner.read().plugins.keys().cloned().collect()
    }

    /// A subscription that wakes on every add, update and removal.
    pub fn subscribe(&self) -> Changes {
        self.changes.subscribe()
    }

    /// How many changes were made so far (wrapping), each counted once it
    /// is made: if the count read before a look at the contents is still
    /// the count, no change was made since, or one is being made and the
    /// next count shows it.
    pub fn change_count(&self) -> u64 {
        self.changes.count()
    }

    /// Drains the journal: every path added, re-created or removed since the
    /// previous call, once each, in no particular order. The journal is
    /// written before the [`ChangeSignal`] is bumped, so a consumer that
    /// drains after each wake-up misses nothing. There must be one consumer
    /// only (the reconciler): another one would take its changes away.
    /// Undrained, it holds at most one entry per path ever changed.
    pub fn take_changed(&self) -> Vec<PathBuf> {
        self.inner.write().changed.drain().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOCKET: &str = "/var/lib/kubelet/device-plugins/test-plugin.sock";

    #[tokio::test(start_paused = true)]
    async fn renew_replaces_only_the_expected_generation() {
        let dsw = DesiredState::new();
        let socket = Path::new(SOCKET);
        let first = dsw.add_or_update(socket).unwrap();
        let mut changes = dsw.subscribe();
        let renewed = dsw.renew(socket, first).unwrap();
        assert!(renewed > first);
        assert_eq!(dsw.generation(socket), Some(renewed));
        let woken = tokio::time::timeout(std::time::Duration::from_secs(1), changes.changed());
        assert!(woken.await.is_ok(), "a renewal wakes subscribers");
        assert!(dsw.take_changed().contains(&socket.to_path_buf()), "and is journalled");
        assert_eq!(dsw.renew(socket, first), None, "stale generation");
        dsw.remove(socket);
        assert_eq!(dsw.renew(socket, renewed), None, "gone");
    }

    #[test]
    fn a_held_socket_stays_but_is_not_registrable_until_released_or_recreated() {
        let dsw = DesiredState::new();
        let socket = Path::new(SOCKET);
        let first = dsw.add_or_update(socket).unwrap();
        dsw.take_changed();
        assert!(dsw.hold(socket, first, "endpoint gone".into()));
        assert!(!dsw.hold(socket, first, "again".into()), "held once");
        assert_eq!(dsw.take_changed(), [socket.to_path_buf()], "the reconciler looks again");
        assert!(dsw.contains(socket));
        assert_eq!((dsw.generation(socket), dsw.registrable(socket)), (Some(first), None));
        assert_eq!(dsw.snapshot()[0].held.as_deref(), Some("endpoint gone"));

        let released = dsw.release(socket, first).unwrap();
        assert!(released > first);
        assert_eq!(dsw.registrable(socket), Some(released));
        assert_eq!(dsw.release(socket, released), None, "not held");

        assert!(dsw.hold(socket, released, "gone again".into()));
        let recreated = dsw.add_or_update(socket).unwrap();
        assert_eq!(dsw.registrable(socket), Some(recreated), "a new file is not held");
        assert_eq!(dsw.release(socket, released), None, "an older incarnation");
        assert!(!dsw.hold(socket, released, "stale".into()), "an older incarnation");
    }

    #[test]
    fn add_new_plugin() {
        let dsw = DesiredState::new();
        let generation = dsw.add_or_update(Path::new(SOCKET)).unwrap();
        let snapshot = dsw.snapshot();
        assert_eq!(
            snapshot,
            [DesiredPlugin { socket_path: SOCKET.into(), generation, held: None }]
        );
        assert!(dsw.contains(Path::new(SOCKET)));
    }

    #[test]
    fn add_existing_plugin_keeps_one_entry_with_a_new_generation() {
        let dsw = DesiredState::new();
        let first = dsw.add_or_update(Path::new(SOCKET)).unwrap();
        let second = dsw.add_or_update(Path::new(SOCKET)).unwrap();
        assert_eq!(dsw.len(), 1);
        assert!(second > first);
        assert_eq!(dsw.generation(Path::new(SOCKET)), Some(second));
    }

    #[test]
    fn empty_socket_path_is_rejected_with_the_kubelet_text() {
        let dsw = DesiredState::new();
        let err = dsw.add_or_update(Path::new("")).unwrap_err();
        assert_eq!(err.to_string(), "socket path is empty");
        assert!(dsw.is_empty());
        assert!(!dsw.contains(Path::new("")));
    }

    #[test]
    fn remove_plugin() {
        let dsw = DesiredState::new();
        let generation = dsw.add_or_update(Path::new(SOCKET)).unwrap();
        assert_eq!(dsw.remove(Path::new(SOCKET)), Some(generation));
        assert!(dsw.is_empty());
        assert!(!dsw.contains(Path::new(SOCKET)));
        assert_eq!(dsw.remove(Path::new(SOCKET)), None, "removing twice is a no-op");
    }

    #[test]
    fn snapshot_is_sorted_by_path_components() {
        let dsw = DesiredState::new();
        for name in ["c.sock", "a.sock", "b/z.sock", "b.sock"] {
            dsw.add_or_update(&Path::new("/r").join(name)).unwrap();
        }
        let paths: Vec<_> = dsw.snapshot().into_iter().map(|p| p.socket_path).collect();
        let expected: Vec<PathBuf> = ["/r/a.sock", "/r/b/z.sock", "/r/b.sock", "/r/c.sock"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(paths, expected);
    }

    #[test]
    fn paths_lists_every_socket() {
        let dsw = DesiredState::new();
        assert!(dsw.paths().is_empty());
        for name in ["/c.sock", "/a.sock", "/b.sock"] {
            dsw.add_or_update(Path::new(name)).unwrap();
        }
        dsw.remove(Path::new("/b.sock"));
        let mut paths = dsw.paths();
        paths.sort();
        assert_eq!(paths, [PathBuf::from("/a.sock"), PathBuf::from("/c.sock")]);
    }

    #[test]
    fn journal_records_each_changed_path_once_until_drained() {
        let dsw = DesiredState::new();
        let (a, b) = (Path::new("/a.sock"), Path::new("/b.sock"));
        dsw.add_or_update(a).unwrap();
        dsw.add_or_update(a).unwrap();
        dsw.add_or_update(b).unwrap();
        dsw.remove(a);
        let mut changed = dsw.take_changed();
        changed.sort();
        assert_eq!(changed, [a.to_path_buf(), b.to_path_buf()], "deduplicated");
        assert!(dsw.take_changed().is_empty(), "a drain empties the journal");

        dsw.remove(a);
        assert!(dsw.take_changed().is_empty(), "a no-op removal is not a change");
        assert!(dsw.add_or_update(Path::new("")).is_err());
        assert!(dsw.take_changed().is_empty(), "a rejected add is not a change");
        dsw.remove(b);
        assert_eq!(dsw.take_changed(), [b.to_path_buf()]);
    }

    #[tokio::test(start_paused = true)]
    async fn subscribers_wake_on_add_and_remove_but_not_on_noops() {
        let dsw = DesiredState::new();
        let mut changes = dsw.subscribe();
        dsw.add_or_update(Path::new(SOCKET)).unwrap();
        changes.changed().await;
        dsw.remove(Path::new(SOCKET)).unwrap();
        changes.changed().await;
        dsw.remove(Path::new(SOCKET));
        let idle = tokio::time::timeout(std::time::Duration::from_secs(60), changes.changed());
        assert!(idle.await.is_err(), "a no-op removal is not a change");
    }
}
