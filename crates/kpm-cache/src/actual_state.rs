//! ActualState: the plugins that are registered with their handler.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::{CacheError, ChangeSignal, Changes, Generation, PluginHandler, Registration};

/// A registration and the handler that accepted it, so that deregistration
/// reaches the same handler even if the handler table changed since.
#[derive(Clone)]
#[non_exhaustive]
pub struct Registered {
    /// What was registered.
    pub registration: Registration,
    /// The handler that registered the plugin and will deregister it.
    pub handler: Arc<dyn PluginHandler>,
}

impl Registered {
    /// `registration`, accepted by `handler`.
    pub fn new(registration: Registration, handler: Arc<dyn PluginHandler>) -> Self {
        Self { registration, handler }
    }
}

impl fmt::Debug for Registered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Handlers are opaque: the registration says which plugin this is.
        self.registration.fmt(f)
    }
}

/// The set of registered plugins, keyed by registration socket path.
#[derive(Debug, Default)]
pub struct ActualState {
    plugins: RwLock<HashMap<PathBuf, Registered>>,
    changes: ChangeSignal,
}

impl ActualState {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a registered plugin, replacing any entry for the same socket.
    pub fn add(&self, registered: Registered) -> Result<(), CacheError> {
        let socket_path = &registered.registration.socket_path;
        if socket_path.as_os_str().is_empty() {
            return Err(CacheError::EmptySocketPath);
        }
        self.plugins.write().insert(socket_path.clone(), registered);
        self.changes.bump();
        Ok(())
    }

    /// Forgets the plugin at `socket_path`, returning it if it was there.
    pub fn remove(&self, socket_path: &Path) -> Option<Registered> {
        let removed = self.plugins.write().remove(socket_path);
        if removed.is_some() {
            self.changes.bump();
        }
        removed
    }

    /// Forgets the plugin at `socket_path` only if it is that incarnation, so
    /// that a stale removal cannot take out a newer registration.
    pub fn remove_generation(
        &self,
        socket_path: &Path,
        generation: Generation,
    ) -> Option<Registered> {
        let removed = {
            let mut plugins = self.plugins.write();
            match plugins.get(socket_path) {
                Some(entry) if entry.registration.generation == generation => {
                    plugins.remove(socket_path)
                }
                _ => None,
            }
        };
        if removed.is_some() {
            self.changes.bump();
        }
        removed
    }

    /// Whether a plugin is registered at `socket_path`, in any incarnation.
    pub fn contains(&self, socket_path: &Path) -> bool {
        self.plugins.read().contains_key(socket_path)
    }

    /// Whether the plugin at `socket_path` is registered in that incarnation.
    pub fn contains_generation(&self, socket_path: &Path, generation: Generation) -> bool {
        self.plugins
            .read()
            .get(socket_path)
            .is_some_and(|entry| entry.registration.generation == generation)
    }

    /// The registered incarnation at `socket_path`, without copying the
    /// plugin's details.
    pub fn generation(&self, socket_path: &Path) -> Option<Generation> {
        self.plugins.read().get(socket_path).map(|entry| entry.registration.generation)
    }

    /// A copy of the plugin registered at `socket_path`, if any.
    pub fn get(&self, socket_path: &Path) -> Option<Registration> {
        self.plugins.read().get(socket_path).map(|entry| entry.registration.clone())
    }

    /// The plugin registered at `socket_path` with its handler, for the
    /// one who will deregister it.
    pub fn registered(&self, socket_path: &Path) -> Option<Registered> {
        self.plugins.read().get(socket_path).cloned()
    }

    /// How many plugins are registered.
    pub fn len(&self) -> usize {
        self.plugins.read().len()
    }

    /// Whether no plugin is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every registered plugin, sorted by socket path.
    pub fn snapshot(&self) -> Vec<Registration> {
        let mut plugins: Vec<Registration> =
            self.plugins.read().values().map(|entry| entry.registration.clone()).collect();
        plugins.sort_unstable_by(|a, b| a.socket_path.cmp(&b.socket_path));
        plugins
    }

    /// Every registered socket path, in no particular order: cheaper than a
    /// snapshot for a caller that looks each path up anyway.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.plugins.read().keys().cloned().collect()
    }

    /// A subscription that wakes on every add and removal.
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DesiredState, HandlerError, PluginDetails, PluginEndpoint};

    struct NoopHandler;

    #[async_trait::async_trait]
    impl PluginHandler for NoopHandler {
        async fn validate(&self, _: &PluginDetails) -> Result<(), HandlerError> {
            Ok(())
        }
        async fn register(&self, _: &PluginDetails) -> Result<(), HandlerError> {
            Ok(())
        }
        async fn deregister(&self, _: &PluginDetails) {}
    }

    /// A registration as the executor would record it; the generation comes
    /// from a real DesiredState so that it is a genuine incarnation id.
    fn info(path: &str) -> Registered {
        let generation = DesiredState::new().add_or_update(Path::new("/g")).unwrap();
        let endpoint = PluginEndpoint::RegistrationSocket(path.into());
        let plugin = PluginDetails::new("test", endpoint, ["v1beta1"]);
        Registered::new(
            Registration::new(path, generation, "DevicePlugin", plugin, None),
            Arc::new(NoopHandler),
        )
    }

    fn incarnation(generation: Generation) -> Registered {
        let mut registered = info("/p.sock");
        registered.registration.generation = generation;
        registered
    }

    #[test]
    fn add_new_plugin() {
        let asw = ActualState::new();
        let entry = info("/var/lib/kubelet/device-plugins/test-plugin.sock");
        let plugin = entry.registration.clone();
        asw.add(entry).unwrap();
        let snapshot = asw.snapshot();
        assert_eq!(snapshot, std::slice::from_ref(&plugin));
        assert_eq!(snapshot[0].plugin.name, "test");
        assert!(asw.contains_generation(&plugin.socket_path, plugin.generation));
        assert!(asw.contains(&plugin.socket_path));
    }

    #[test]
    fn empty_socket_path_is_rejected_with_the_kubelet_text() {
        let asw = ActualState::new();
        let entry = info("");
        let plugin = entry.registration.clone();
        let err = asw.add(entry).unwrap_err();
        assert_eq!(err.to_string(), "socket path is empty");
        assert!(asw.is_empty());
        assert!(!asw.contains_generation(Path::new(""), plugin.generation));
    }

    #[test]
    fn remove_plugin() {
        let asw = ActualState::new();
        let entry = info("/p.sock");
        let plugin = entry.registration.clone();
        asw.add(entry).unwrap();
        let removed = asw.remove(&plugin.socket_path).map(|p| p.registration.plugin.name);
        assert_eq!(removed, Some("test".into()));
        assert!(asw.is_empty());
        assert!(!asw.contains_generation(&plugin.socket_path, plugin.generation));
        assert!(!asw.contains(&plugin.socket_path));
        assert!(asw.remove(&plugin.socket_path).is_none());
    }

    #[test]
    fn remove_generation_leaves_a_newer_incarnation_alone() {
        let asw = ActualState::new();
        let dsw = DesiredState::new();
        let old = dsw.add_or_update(Path::new("/p.sock")).unwrap();
        let new = dsw.add_or_update(Path::new("/p.sock")).unwrap();
        asw.add(incarnation(new)).unwrap();
        assert!(asw.remove_generation(Path::new("/p.sock"), old).is_none());
        assert!(asw.contains_generation(Path::new("/p.sock"), new));
        assert!(asw.remove_generation(Path::new("/p.sock"), new).is_some());
        assert!(asw.is_empty());
    }

    #[test]
    fn wrong_generation_is_not_registered() {
        let asw = ActualState::new();
        let dsw = DesiredState::new();
        let old = dsw.add_or_update(Path::new("/p.sock")).unwrap();
        let new = dsw.add_or_update(Path::new("/p.sock")).unwrap();
        asw.add(incarnation(old)).unwrap();
        assert!(asw.contains_generation(Path::new("/p.sock"), old));
        assert!(!asw.contains_generation(Path::new("/p.sock"), new));
        assert_eq!(asw.generation(Path::new("/p.sock")), Some(old));
        assert_eq!(asw.generation(Path::new("/q.sock")), None);
    }

    #[test]
    fn snapshot_is_sorted_and_debug_omits_the_handler() {
        let asw = ActualState::new();
        for path in ["/z.sock", "/a.sock", "/m.sock"] {
            asw.add(info(path)).unwrap();
        }
        let paths: Vec<_> = asw.snapshot().into_iter().map(|p| p.socket_path).collect();
        assert_eq!(paths, [PathBuf::from("/a.sock"), "/m.sock".into(), "/z.sock".into()]);
        let mut light = asw.paths();
        light.sort();
        assert_eq!(light, paths);
        let debug = format!("{:?}", info("/a.sock"));
        assert!(debug.contains("/a.sock") && !debug.contains("handler"), "{debug}");
    }
}
