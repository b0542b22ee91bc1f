//! `UnderHostRoot`: a handler that sees the host under a prefix, for a
//! process in a pod that mounts the host's `/` elsewhere (`kubectl debug
//! node/NAME` puts it at `/host`).
//!
//! A plugin advertises its endpoint as a path on the host (a CSI driver's
//! `/var/lib/kubelet/plugins/<driver>/csi.sock`); such a process reaches it
//! only under the prefix. A plugin that advertises none is served on its
//! registration socket, which the executor found as this process reaches
//! it: that one is not moved. Everything else a handler is given is a name
//! or a version, which no mount changes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kpm_cache::{HandlerError, PluginDetails, PluginEndpoint, PluginHandler, ServiceReport};

/// Delegates to `inner` with every advertised endpoint moved under
/// `host_root`.
struct UnderHostRoot {
    inner: Arc<dyn PluginHandler>,
    host_root: PathBuf,
}

/// `handler`, for a process that sees the host's `/` at `host_root`: the
/// handler itself when that is `/` or not given.
pub(crate) fn seen_from(
    host_root: Option<&Path>,
    handler: &Arc<dyn PluginHandler>,
) -> Arc<dyn PluginHandler> {
    match host_root {
        Some(host_root) if host_root != Path::new("/") => Arc::new(UnderHostRoot {
            inner: Arc::clone(handler),
            host_root: host_root.to_path_buf(),
        }),
        _ => Arc::clone(handler),
    }
}

impl UnderHostRoot {
    /// `plugin` with its endpoint as this process reaches it. It stays
    /// `Advertised`, moved: who gave it does not change, and the inner
    /// handler judges it by the same rules.
    fn moved(&self, plugin: &PluginDetails) -> PluginDetails {
        let mut moved = plugin.clone();
        if let PluginEndpoint::Advertised(on_host) = &plugin.endpoint
            && let Some(reached) = kpm_transport::endpoint_path_under(&self.host_root, on_host)
        {
            moved.endpoint = PluginEndpoint::Advertised(reached.to_string_lossy().into_owned());
        }
        moved
    }
}

#[async_trait::async_trait]
impl PluginHandler for UnderHostRoot {
    async fn validate(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        self.inner.validate(&self.moved(plugin)).await
    }

    async fn register(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        self.inner.register(&self.moved(plugin)).await
    }

    async fn deregister(&self, plugin: &PluginDetails) {
        self.inner.deregister(&self.moved(plugin)).await;
    }

    async fn inspect(
        &self,
        plugin: &PluginDetails,
    ) -> Result<Option<Box<dyn ServiceReport>>, HandlerError> {
        self.inner.inspect(&self.moved(plugin)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BasicHandler;

    /// The inner handler is given an advertised endpoint moved under the
    /// host root, and a registration socket as the executor reached it.
    #[tokio::test]
    async fn only_an_advertised_endpoint_is_moved() {
        let inner = Arc::new(BasicHandler::new("CSIPlugin"));
        let handler = seen_from(Some(Path::new("/host")), &(Arc::clone(&inner) as _));
        let socket = "/host/var/lib/kubelet/plugins_registry/gpu-reg.sock";
        let plugins = [
            ("a.example.com", PluginEndpoint::Advertised("/host/a/csi.sock".into())),
            ("b.example.com", PluginEndpoint::Advertised("unix:///b/csi.sock".into())),
            ("c.example.com", PluginEndpoint::RegistrationSocket(socket.into())),
        ];
        for (name, endpoint) in plugins {
            handler.register(&PluginDetails::new(name, endpoint, ["1.0.0"])).await.unwrap();
        }
        let reached: Vec<_> = inner
            .registered()
            .into_iter()
            .map(|registration| (registration.name, registration.endpoint))
            .collect();
        assert_eq!(
            reached,
            [
                (
                    "a.example.com".into(),
                    PluginEndpoint::Advertised("/host/host/a/csi.sock".into())
                ),
                ("b.example.com".into(), PluginEndpoint::Advertised("/host/b/csi.sock".into())),
                ("c.example.com".into(), PluginEndpoint::RegistrationSocket(socket.into())),
            ]
        );
        // Deregistration finds them where registration put them.
        let gone = PluginEndpoint::RegistrationSocket(socket.into());
        handler.deregister(&PluginDetails::new("c.example.com", gone, ["1.0.0"])).await;
        handler
            .deregister(&PluginDetails::new(
                "a.example.com",
                PluginEndpoint::Advertised("/host/a/csi.sock".into()),
                ["1.0.0"],
            ))
            .await;
        assert_eq!(inner.registered().len(), 1);
    }
}
