//! The record of one registration: what a plugin said about itself, which
//! incarnation of which socket said it, and when. The actual state keeps it,
//! handlers are called with its [`PluginDetails`], and the facade's status shows it.
//!
//! It is kpm's one record of a registered plugin: the executor makes it,
//! ActualState keeps it, liveness reads it (the serving pid, the endpoint),
//! and the facade's views and `PluginStatus` show it, so no layer copies it
//! into a type of its own.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::Generation;

/// What a plugin said about itself in `GetInfo` that its handler works with:
/// its name, its service endpoint and the versions it supports.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PluginDetails {
    /// The plugin's name as it reported it (a CSI driver name, a device
    /// plugin's resource name, a DRA driver name).
    pub name: String,
    /// Where the plugin serves: the endpoint it advertised, or its
    /// registration socket if it advertised none.
    pub endpoint: PluginEndpoint,
    /// The versions of the plugin's service that it said it supports.
    pub versions: Vec<String>,
}

impl PluginDetails {
    /// A plugin named `name`, served at `endpoint`, speaking `versions`.
    pub fn new(
        name: impl Into<String>,
        endpoint: PluginEndpoint,
        versions: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            name: name.into(),
            endpoint,
            versions: versions.into_iter().map(Into::into).collect(),
        }
    }
}

/// Where a plugin serves its service, and who said so: both paths on the
/// host, as the kubelet names them (a process that sees the host under
/// another root opens them there, `kpm_transport::HostRoot`, and names them
/// as here). Read through its methods, one rule each: [`target`](Self::target)
/// as handlers are given it, [`socket_path`](Self::socket_path) to dial.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PluginEndpoint {
    /// The endpoint the plugin advertised in `GetInfo`, as it sent it: a
    /// path on the host, or a gRPC target (`unix:///csi/csi.sock`).
    Advertised(String),
    /// The plugin advertised none, so it is served on its registration
    /// socket (the kubelet's rule).
    RegistrationSocket(PathBuf),
}

impl PluginEndpoint {
    /// The endpoint as the kubelet hands it to its handlers, which dial it
    /// and name it in their errors: the advertised one as it was sent, else
    /// the registration socket's path.
    pub fn target(&self) -> Cow<'_, str> {
        match self {
            Self::Advertised(endpoint) => Cow::Borrowed(endpoint),
            Self::RegistrationSocket(socket) => socket.to_string_lossy(),
        }
    }

    /// The socket the plugin is served on, as the kubelet dials it: the
    /// advertised endpoint as a path ([`kpm_api::endpoint_path`]: a
    /// `unix://` target's path), else the registration socket.
    pub fn socket_path(&self) -> &Path {
        match self {
            Self::Advertised(endpoint) => kpm_api::endpoint_path(endpoint),
            Self::RegistrationSocket(socket) => socket,
        }
    }
}

/// Its [`target`](PluginEndpoint::target), as logs and status lines show it.
impl fmt::Display for PluginEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.target())
    }
}

/// Its [`target`](PluginEndpoint::target), one string: the status API,
/// `kpm list -o json` and the event lines show the endpoint so, and scripts
/// read it so; who gave it is kpm's to know.
#[cfg(feature = "serde")]
impl serde::Serialize for PluginEndpoint {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.target())
    }
}

/// A registered plugin: which incarnation of which socket, and what it said.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Registration {
    /// The registration socket, the key of the actual state.
    pub socket_path: PathBuf,
    /// The incarnation of the socket that was registered.
    pub generation: Generation,
    /// The type the plugin reported in `GetInfo` (`CSIPlugin`, `DevicePlugin`,
    /// `DRAPlugin`), which chose the handler.
    pub plugin_type: String,
    /// Its name, endpoint and versions, as its handler was given them.
    pub plugin: PluginDetails,
    /// Wall-clock time of registration, for display only: identity is
    /// `generation`.
    pub registered_at: SystemTime,
    /// The process serving the registration socket when kpm registered it,
    /// as the kernel named it (`SO_PEERCRED`); `None` when kpm cannot see it
    /// (another pid namespace). Liveness watches it for exit.
    pub server_pid: Option<u32>,
}

impl Registration {
    /// The record of `plugin`, of type `plugin_type`, registered now from
    /// incarnation `generation` of `socket_path`, served by `server_pid`.
    pub fn new(
        socket_path: impl Into<PathBuf>,
        generation: Generation,
        plugin_type: impl Into<String>,
        plugin: PluginDetails,
        server_pid: Option<u32>,
    ) -> Self {
        Self {
            socket_path: socket_path.into(),
            generation,
            plugin_type: plugin_type.into(),
            plugin,
            registered_at: SystemTime::now(),
            server_pid,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt as _;

    use super::*;

    /// Handlers are given the advertised endpoint as it was sent, a gRPC
    /// target too, and the registration socket as a path.
    #[test]
    fn the_target_is_the_advertised_string_or_the_sockets_path() {
        let cases = [
            (PluginEndpoint::Advertised("unix:///csi/csi.sock".into()), "unix:///csi/csi.sock"),
            (PluginEndpoint::Advertised("dra.sock".into()), "dra.sock"),
            (PluginEndpoint::RegistrationSocket("/r/gpu-reg.sock".into()), "/r/gpu-reg.sock"),
            (
                PluginEndpoint::RegistrationSocket(
                    std::ffi::OsStr::from_bytes(b"/r/\xff.sock").into(),
                ),
                "/r/\u{fffd}.sock",
            ),
        ];
        for (endpoint, target) in cases {
            assert_eq!(endpoint.target(), target, "{endpoint:?}");
            assert_eq!(endpoint.to_string(), target, "{endpoint:?}");
        }
    }
}
