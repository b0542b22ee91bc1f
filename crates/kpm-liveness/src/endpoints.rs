//! The service sockets plugins reported as their endpoints, watched on the
//! filesystem: the directory each is in (or, while that is missing, its
//! nearest existing ancestor) has an inotify watch, and any change there
//! has its endpoints looked at again. The kubelet dials a CSI driver's
//! deleted socket for as long as it stays registered (kubernetes #132660).

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kpm_api::FileId;
use notify::{Config, Event, RecommendedWatcher, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

/// How many directory changes wait for the monitor before the rest are
/// replaced by a look at every endpoint.
const QUEUE: usize = 256;

/// The socket file at `endpoint` now, if there is one.
pub(crate) fn socket_at(endpoint: &Path) -> Option<FileId> {
    let meta = std::fs::symlink_metadata(endpoint).ok()?;
    meta.file_type().is_socket().then(|| FileId::of(&meta))
}

/// `served`, the socket a plugin registered at `socket` is served on, if it
/// is a path to watch: not one that is not absolute, nor the registration
/// socket, which the registry's watcher covers.
pub(crate) fn watched(served: &Path, socket: &Path) -> bool {
    served.is_absolute() && served != socket
}

/// The directory watches of the endpoints armed.
pub(crate) struct EndpointWatch {
    /// Created with the first endpoint: a node without any costs nothing.
    watcher: Option<RecommendedWatcher>,
    changes: mpsc::Receiver<PathBuf>,
    sender: mpsc::Sender<PathBuf>,
    overflowed: Arc<AtomicBool>,
    /// Watched directory → the endpoints armed there.
    armed: HashMap<PathBuf, HashSet<PathBuf>>,
    /// Endpoint → the directory it is armed at.
    armed_at: HashMap<PathBuf, PathBuf>,
}

impl EndpointWatch {
    pub(crate) fn new() -> Self {
        let (sender, changes) = mpsc::channel(QUEUE);
        Self {
            watcher: None,
            changes,
            sender,
            overflowed: Arc::default(),
            armed: HashMap::new(),
            armed_at: HashMap::new(),
        }
    }

    /// The endpoints armed now.
    pub(crate) fn len(&self) -> usize {
        self.armed_at.len()
    }

    /// Watches the directory of `endpoint`, or its nearest existing
    /// ancestor; again after the directories changed, to move down to the
    /// endpoint's own directory once it exists.
    pub(crate) fn arm(&mut self, endpoint: &Path) -> Result<(), notify::Error> {
        let Some(dir) = endpoint.ancestors().skip(1).find(|dir| dir.is_dir()) else {
            return Ok(());
        };
        if self.armed_at.get(endpoint).is_some_and(|at| at == dir) {
            return Ok(());
        }
        self.disarm(endpoint);
        if !self.armed.contains_key(dir) {
            self.watcher()?.watch(dir, RecursiveMode::NonRecursive)?;
        }
        self.armed.entry(dir.to_path_buf()).or_default().insert(endpoint.to_path_buf());
        self.armed_at.insert(endpoint.to_path_buf(), dir.to_path_buf());
        Ok(())
    }

    /// Stops watching for `endpoint`; its directory's watch goes with its
    /// last endpoint.
    pub(crate) fn disarm(&mut self, endpoint: &Path) {
        let Some(dir) = self.armed_at.remove(endpoint) else { return };
        let Some(endpoints) = self.armed.get_mut(&dir) else { return };
        endpoints.remove(endpoint);
        if endpoints.is_empty() {
            self.armed.remove(&dir);
            if let Some(watcher) = &mut self.watcher {
                // Gone with the directory already, if it was removed.
                let _ = watcher.unwatch(&dir);
            }
        }
    }

    /// Waits for a change, then returns the endpoints to look at: those
    /// armed at the directories that changed (every one after an overflow).
    pub(crate) async fn changed(&mut self) -> Vec<PathBuf> {
        let Some(first) = self.changes.recv().await else {
            return std::future::pending().await;
        };
        let mut dirs = HashSet::from([first]);
        while let Ok(dir) = self.changes.try_recv() {
            dirs.insert(dir);
        }
        if self.overflowed.swap(false, Ordering::Relaxed) {
            return self.armed_at.keys().cloned().collect();
        }
        dirs.iter().filter_map(|dir| self.armed.get(dir)).flatten().cloned().collect()
    }

    fn watcher(&mut self) -> Result<&mut RecommendedWatcher, notify::Error> {
        let watcher = match self.watcher.take() {
            Some(watcher) => watcher,
            None => self.new_watcher()?,
        };
        Ok(self.watcher.insert(watcher))
    }

    fn new_watcher(&self) -> Result<RecommendedWatcher, notify::Error> {
        let (sender, overflowed) = (self.sender.clone(), Arc::clone(&self.overflowed));
        let forward = move |event: notify::Result<Event>| {
            // An error (the queue overflowed in the kernel) or an event
            // without a path: look at everything.
            let dirs: Vec<PathBuf> = match event {
                Ok(event) if !event.paths.is_empty() => event
                    .paths
                    .iter()
                    .flat_map(|path| {
                        [path.clone()].into_iter().chain(path.parent().map(Path::to_path_buf))
                    })
                    .collect(),
                _ => Vec::new(),
            };
            if dirs.is_empty() {
                overflowed.store(true, Ordering::Relaxed);
            }
            for dir in dirs {
                if sender.try_send(dir).is_err() {
                    overflowed.store(true, Ordering::Relaxed);
                    return;
                }
            }
        };
        RecommendedWatcher::new(forward, Config::default().with_follow_symlinks(false))
    }
}

#[cfg(test)]
mod tests {
    use kpm_cache::PluginEndpoint;

    use super::*;

    #[test]
    fn endpoints_are_watched_by_absolute_path_and_never_as_the_registration_socket() {
        let socket = Path::new("/r/plugins_registry/a-reg.sock");
        let advertised = |endpoint: &str| PluginEndpoint::Advertised(endpoint.to_owned());
        let watched_at = |endpoint: &PluginEndpoint| {
            let served = endpoint.socket_path();
            watched(served, socket).then(|| served.to_path_buf())
        };
        let csi = Some(PathBuf::from("/r/plugins/a/csi.sock"));
        assert_eq!(watched_at(&advertised("/r/plugins/a/csi.sock")), csi);
        assert_eq!(watched_at(&advertised("unix:///r/plugins/a/csi.sock")), csi);
        assert_eq!(watched_at(&advertised("unix:/r/plugins/a/csi.sock")), csi);
        assert_eq!(watched_at(&advertised("/r/plugins_registry/a-reg.sock")), None);
        assert_eq!(watched_at(&advertised("a.sock")), None);
        assert_eq!(watched_at(&advertised("")), None);
        let served_on_socket = PluginEndpoint::RegistrationSocket(socket.to_path_buf());
        assert_eq!(watched_at(&served_on_socket), None);
    }
}
