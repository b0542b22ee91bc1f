//! `UnderHostRoot`: a handler that sees the host under a prefix, for a
//! process in a pod that mounts the host's `/` elsewhere (`kubectl debug
//! node/NAME` puts it at `/host`).
//!
//! A plugin advertises its endpoint as a path on the host (a CSI driver's
//! `/var/lib/kubelet/plugins/<driver>/csi.sock`); such a process reaches it
//! only under the prefix. Everything else a handler is given is a name or a
//! version, which no mount changes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kpm_cache::{HandlerError, PluginDetails, PluginHandler, ServiceReport};

/// Delegates to `inner` with every endpoint moved under `host_root`.
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

/// `endpoint`, a path on the host (a `unix://` or `unix:` prefix, as some
/// drivers report it, stripped), as a process that sees the host's `/` at
/// `host_root` reaches it. A relative endpoint is left as it is, for the
/// handler to judge, and so is one already under `host_root`: a plugin
/// that advertises no endpoint is served on its registration socket, which
/// the executor hands over as it reached it, under the prefix.
pub(crate) fn under_host_root(host_root: &Path, endpoint: &str) -> String {
    let on_host = kpm_transport::endpoint_path(endpoint);
    if on_host.starts_with(host_root) {
        return on_host.to_string_lossy().into_owned();
    }
    match on_host.strip_prefix("/") {
        Ok(relative) => host_root.join(relative).to_string_lossy().into_owned(),
        Err(_) => endpoint.to_owned(),
    }
}

impl UnderHostRoot {
    /// `plugin` with its endpoint as this process reaches it.
    fn moved(&self, plugin: &PluginDetails) -> PluginDetails {
        let mut moved = plugin.clone();
        moved.endpoint = under_host_root(&self.host_root, &plugin.endpoint);
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

    #[test]
    fn an_endpoint_on_the_host_is_reached_under_the_prefix() {
        let host = Path::new("/host");
        let cases = [
            (
                "/var/lib/kubelet/plugins/csi.example.com/csi.sock",
                "/host/var/lib/kubelet/plugins/csi.example.com/csi.sock",
            ),
            ("unix:///csi/csi.sock", "/host/csi/csi.sock"),
            ("unix:/csi/csi.sock", "/host/csi/csi.sock"),
        ];
        for (endpoint, reached) in cases {
            assert_eq!(under_host_root(host, endpoint), reached, "{endpoint}");
        }
        // The host's own view is the identity; a relative endpoint is the
        // handler's to refuse.
        assert_eq!(under_host_root(Path::new("/"), "/run/a.sock"), "/run/a.sock");
        assert_eq!(under_host_root(host, "dra.sock"), "dra.sock");
        // The registration socket of a plugin with no endpoint of its own,
        // as the executor reached it.
        let socket = "/host/var/lib/kubelet/plugins_registry/gpu-reg.sock";
        assert_eq!(under_host_root(host, socket), socket);
        assert_eq!(under_host_root(host, "/hostile/a.sock"), "/host/hostile/a.sock");
    }
}
