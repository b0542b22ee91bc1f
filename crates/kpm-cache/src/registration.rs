//! The record of one registration: what a plugin said about itself, which
//! incarnation of which socket said it, and when. The actual state keeps it,
//! handlers are called with its [`PluginDetails`], and the facade's status shows it.
//!
//! It is kpm's one record of a registered plugin: the executor makes it,
//! ActualState keeps it, liveness reads it (the serving pid, the endpoint),
//! and the facade's views and `PluginStatus` show it, so no layer copies it
//! into a type of its own.

use std::path::PathBuf;
use std::time::SystemTime;

use crate::Generation;

/// What a plugin said about itself in `GetInfo` that its handler works with:
/// its name, its service endpoint and the versions it supports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PluginDetails {
    /// The plugin's name as it reported it (a CSI driver name, a device
    /// plugin's resource name, a DRA driver name).
    pub name: String,
    /// The plugin's service socket; the registration socket if it gave none.
    pub endpoint: String,
    /// The versions of the plugin's service that it said it supports.
    pub versions: Vec<String>,
}

impl PluginDetails {
    /// A plugin named `name`, served at `endpoint`, speaking `versions`.
    pub fn new(
        name: impl Into<String>,
        endpoint: impl Into<String>,
        versions: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            name: name.into(),
            endpoint: endpoint.into(),
            versions: versions.into_iter().map(Into::into).collect(),
        }
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
