//! ActualState: the plugins that are registered with their handler.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::RwLock;

use crate::{CacheError, ChangeSignal, Changes, Generation, PluginHandler};

/// A registered plugin: which incarnation of which socket, what it said about
/// itself, and the handler that accepted it (so that deregistration reaches the
/// same handler even if the handler table changed since).
#[derive(Clone)]
pub struct PluginInfo {
    /// The registration socket, the key of the cache.
    pub socket_path: PathBuf,
    /// The incarnation of the socket that was registered.
    pub generation: Generation,
    /// The type the plugin reported in `GetInfo` (`CSIPlugin`, `DevicePlugin`,
    /// `DRAPlugin`), which chose the handler.
    pub plugin_type: String,
    /// The plugin's name as it reported it in `GetInfo`.
    pub name: String,
    /// The plugin's service socket; the registration socket if it gave none.
    pub endpoint: String,
    /// The versions of the plugin's service that it said it supports.
    pub versions: Vec<String>,
    /// Wall-clock time of registration, for display only: identity is `generation`.
    pub registered_at: SystemTime,
    /// The process serving the registration socket when kpm registered it,
    /// as the kernel named it (`SO_PEERCRED`); `None` when kpm cannot see it
    /// (another pid namespace). Liveness watches it for exit.
    pub server_pid: Option<u32>,
    /// The handler that registered the plugin and will deregister it.
    pub handler: Arc<dyn PluginHandler>,
}

impl fmt::Debug for PluginInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginInfo")
            .field("socket_path", &self.socket_path)
            .field("generation", &self.generation)
            .field("plugin_type", &self.plugin_type)
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("versions", &self.versions)
            .field("registered_at", &self.registered_at)
            .field("server_pid", &self.server_pid)
            .finish_non_exhaustive()
    }
}

/// The set of registered plugins, keyed by registration socket path.
#[derive(Debug, Default)]
pub struct ActualState {
    plugins: RwLock<HashMap<PathBuf, PluginInfo>>,
    changes: ChangeSignal,
}

impl ActualState {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a registered plugin, replacing any entry for the same socket.
    pub fn add(&self, info: PluginInfo) -> Result<(), CacheError> {
        if info.socket_path.as_os_str().is_empty() {
            return Err(CacheError::EmptySocketPath);
        }
        self.plugins.write().insert(info.socket_path.clone(), info);
        self.changes.bump();
        Ok(())
    }

    /// Forgets the plugin at `socket_path`, returning it if it was there.
    pub fn remove(&self, socket_path: &Path) -> Option<PluginInfo> {
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
    ) -> Option<PluginInfo> {
        let removed = {
            let mut plugins = self.plugins.write();
            match plugins.get(socket_path) {
                Some(info) if info.generation == generation => plugins.remove(socket_path),
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
        self.plugins.read().get(socket_path).is_some_and(|info| info.generation == generation)
    }

    /// The registered incarnation at `socket_path`, without copying the
    /// plugin's details.
    pub fn generation(&self, socket_path: &Path) -> Option<Generation> {
        self.plugins.read().get(socket_path).map(|info| info.generation)
    }

    /// A copy of the plugin registered at `socket_path`, if any.
    pub fn get(&self, socket_path: &Path) -> Option<PluginInfo> {
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
    pub fn snapshot(&self) -> Vec<PluginInfo> {
        let mut plugins: Vec<PluginInfo> = self.plugins.read().values().cloned().collect();
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
    use crate::{DesiredState, HandlerError};

    struct NoopHandler;

    #[async_trait::async_trait]
    impl PluginHandler for NoopHandler {
        async fn validate(&self, _: &str, _: &str, _: &[String]) -> Result<(), HandlerError> {
            Ok(())
        }
        async fn register(&self, _: &str, _: &str, _: &[String]) -> Result<(), HandlerError> {
            Ok(())
        }
        async fn deregister(&self, _: &str, _: &str) {}
    }

    /// A plugin info as the executor would record it; the generation comes from
    /// a real DesiredState so that it is a genuine incarnation id.
    fn info(path: &str) -> PluginInfo {
        let generation = DesiredState::new().add_or_update(Path::new("/g")).unwrap();
        PluginInfo {
            socket_path: path.into(),
            generation,
            plugin_type: "DevicePlugin".into(),
            name: "test".into(),
            endpoint: path.into(),
            versions: vec!["v1beta1".into()],
            registered_at: SystemTime::now(),
            server_pid: None,
            handler: Arc::new(NoopHandler),
        }
    }

    #[test]
    fn add_new_plugin() {
        let asw = ActualState::new();
        let plugin = info("/var/lib/kubelet/device-plugins/test-plugin.sock");
        asw.add(plugin.clone()).unwrap();
        let snapshot = asw.snapshot();
        assert_eq!(snapshot.len(), 1);
        assert_eq!(snapshot[0].socket_path, plugin.socket_path);
        assert_eq!(snapshot[0].name, "test");
        assert!(asw.contains_generation(&plugin.socket_path, plugin.generation));
        assert!(asw.contains(&plugin.socket_path));
    }

    #[test]
    fn empty_socket_path_is_rejected_with_the_kubelet_text() {
        let asw = ActualState::new();
        let plugin = info("");
        let err = asw.add(plugin.clone()).unwrap_err();
        assert_eq!(err.to_string(), "socket path is empty");
        assert!(asw.is_empty());
        assert!(!asw.contains_generation(Path::new(""), plugin.generation));
    }

    #[test]
    fn remove_plugin() {
        let asw = ActualState::new();
        let plugin = info("/p.sock");
        asw.add(plugin.clone()).unwrap();
        assert_eq!(asw.remove(&plugin.socket_path).map(|p| p.name), Some("test".into()));
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
        asw.add(PluginInfo { generation: new, ..info("/p.sock") }).unwrap();
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
        asw.add(PluginInfo { generation: old, ..info("/p.sock") }).unwrap();
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
