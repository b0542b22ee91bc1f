//! A handler that accepts any plugin with a name and at least one version,
//! and records it: a simple handler for tests, demos and plugin types that
//! have no handler of their own.

use std::collections::BTreeMap;

use async_trait::async_trait;
use kpm_cache::{HandlerError, PluginDetails, PluginEndpoint, PluginHandler};
use parking_lot::Mutex;

/// A plugin the basic handler holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BasicRegistration {
    /// The plugin's name.
    pub name: String,
    /// Where the plugin serves.
    pub endpoint: PluginEndpoint,
    /// The versions the plugin supports.
    pub versions: Vec<String>,
}

/// Accepts plugins that report a non-empty name and at least one non-empty
/// version; keeps them by (name, endpoint), so several instances of one
/// plugin are told apart.
#[derive(Debug)]
pub struct BasicHandler {
    plugin_type: String,
    registered: Mutex<BTreeMap<(String, PluginEndpoint), Vec<String>>>,
}

impl BasicHandler {
    /// A handler for plugins of `plugin_type`, named in its rejections.
    pub fn new(plugin_type: impl Into<String>) -> Self {
        Self { plugin_type: plugin_type.into(), registered: Mutex::new(BTreeMap::new()) }
    }

    /// The plugins registered with this handler, sorted by name and endpoint.
    pub fn registered(&self) -> Vec<BasicRegistration> {
        self.registered
            .lock()
            .iter()
            .map(|((name, endpoint), versions)| BasicRegistration {
                name: name.clone(),
                endpoint: endpoint.clone(),
                versions: versions.clone(),
            })
            .collect()
    }
}

#[async_trait]
impl PluginHandler for BasicHandler {
    async fn validate(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let (name, versions) = (plugin.name.as_str(), plugin.versions.as_slice());
        if name.is_empty() {
            return Err(format!("{} plugin reported an empty name", self.plugin_type).into());
        }
        if versions.iter().all(String::is_empty) {
            return Err(format!(
                "{} plugin {name:?} reported no supported versions",
                self.plugin_type
            )
            .into());
        }
        Ok(())
    }

    async fn register(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        self.validate(plugin).await?;
        let key = (plugin.name.clone(), plugin.endpoint.clone());
        self.registered.lock().insert(key, plugin.versions.clone());
        Ok(())
    }

    async fn deregister(&self, plugin: &PluginDetails) {
        self.registered.lock().remove(&(plugin.name.clone(), plugin.endpoint.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepts_named_versioned_plugins_and_tracks_instances() {
        let handler = BasicHandler::new("DevicePlugin");
        let versions = vec!["v1beta1".to_owned()];
        let socket = |path: &str| PluginEndpoint::RegistrationSocket(path.into());
        let gpu = |path| PluginDetails::new("vendor.com/gpu", socket(path), versions.clone());
        handler.register(&gpu("/a.sock")).await.unwrap();
        handler.register(&gpu("/b.sock")).await.unwrap();
        assert_eq!(handler.registered().len(), 2);
        handler.deregister(&gpu("/a.sock")).await;
        assert_eq!(
            handler.registered(),
            [BasicRegistration {
                name: "vendor.com/gpu".into(),
                endpoint: socket("/b.sock"),
                versions
            }]
        );
    }

    #[tokio::test]
    async fn rejects_an_empty_name_or_no_versions_with_a_reason() {
        let handler = BasicHandler::new("CSIPlugin");
        let endpoint = PluginEndpoint::Advertised("/s".into());
        let err = handler
            .validate(&PluginDetails::new("", endpoint.clone(), ["1.0.0"]))
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "CSIPlugin plugin reported an empty name");
        let none: [&str; 0] = [];
        let err = handler
            .validate(&PluginDetails::new("csi.example.com", endpoint, none))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("no supported versions"), "{err}");
        assert!(handler.registered().is_empty());
    }
}
