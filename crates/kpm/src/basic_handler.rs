//! A handler that accepts any plugin with a name and at least one version,
//! and records it: what `kpm run` uses for a plugin type until that type's
//! own handler is in place, and a simple handler for tests and demos.

use std::collections::BTreeMap;

use async_trait::async_trait;
use kpm_cache::{HandlerError, PluginHandler};
use parking_lot::Mutex;

/// A plugin the basic handler holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BasicRegistration {
    /// The plugin's name.
    pub name: String,
    /// The plugin's service socket.
    pub endpoint: String,
    /// The versions the plugin supports.
    pub versions: Vec<String>,
}

/// Accepts plugins that report a non-empty name and at least one non-empty
/// version; keeps them by (name, endpoint), so several instances of one
/// plugin are told apart.
#[derive(Debug)]
pub struct BasicHandler {
    plugin_type: String,
    registered: Mutex<BTreeMap<(String, String), Vec<String>>>,
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
    async fn validate(
        &self,
        name: &str,
        _endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError> {
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

    async fn register(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError> {
        self.validate(name, endpoint, versions).await?;
        self.registered.lock().insert((name.to_owned(), endpoint.to_owned()), versions.to_vec());
        Ok(())
    }

    async fn deregister(&self, name: &str, endpoint: &str) {
        self.registered.lock().remove(&(name.to_owned(), endpoint.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepts_named_versioned_plugins_and_tracks_instances() {
        let handler = BasicHandler::new("DevicePlugin");
        let versions = vec!["v1beta1".to_owned()];
        handler.register("vendor.com/gpu", "/a.sock", &versions).await.unwrap();
        handler.register("vendor.com/gpu", "/b.sock", &versions).await.unwrap();
        assert_eq!(handler.registered().len(), 2);
        handler.deregister("vendor.com/gpu", "/a.sock").await;
        assert_eq!(
            handler.registered(),
            [BasicRegistration {
                name: "vendor.com/gpu".into(),
                endpoint: "/b.sock".into(),
                versions
            }]
        );
    }

    #[tokio::test]
    async fn rejects_an_empty_name_or_no_versions_with_a_reason() {
        let handler = BasicHandler::new("CSIPlugin");
        let err = handler.validate("", "/s", &["1.0.0".into()]).await.unwrap_err();
        assert_eq!(err.to_string(), "CSIPlugin plugin reported an empty name");
        let err = handler.validate("csi.example.com", "/s", &[]).await.unwrap_err();
        assert!(err.to_string().contains("no supported versions"), "{err}");
        assert!(handler.registered().is_empty());
    }
}
