//! The kubelet of a check on its temporary root, and what it registered of
//! the plugin.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kpm::{KubeletHandle, PluginDetails, PluginState};
use tokio::sync::oneshot;

use super::plugin::Dirs;
use crate::SuiteError;

/// A kubelet running on the temporary root until stopped.
pub(super) struct Node {
    pub(super) handle: KubeletHandle,
    stop: oneshot::Sender<()>,
    running: tokio::task::JoinHandle<kpm::Result<()>>,
}

/// How often the check's kubelet lists its registry besides its events:
/// a plugin is found within it even when an inotify event is late (on a
/// loaded machine, and under the unit tests' paused clock, which runs ahead
/// of notify's thread).
const RESYNC: Duration = Duration::from_secs(1);

impl Node {
    pub(super) fn start(dirs: &Dirs) -> Result<Self, SuiteError> {
        let watcher = kpm::WatcherConfig::default().resync_period(RESYNC);
        let kubelet = kpm::Kubelet::builder()
            .root_dir(dirs.root())
            .manager(|manager| manager.liveness(None).watcher_config(watcher))
            .build()
            .map_err(|err| SuiteError::BuildKubelet(Box::new(err)))?;
        let handle = kubelet.handle();
        let (stop, stopped) = oneshot::channel::<()>();
        let running = tokio::spawn(kubelet.run(async move {
            let _ = stopped.await;
        }));
        Ok(Self { handle, stop, running })
    }

    /// Stops it as SIGTERM stops `kpm run`: `kubelet.sock` goes, the
    /// plugins' sockets stay.
    pub(super) async fn stop(self) -> Result<(), SuiteError> {
        drop(self.stop);
        match self.running.await {
            Ok(result) => result.map_err(|err| SuiteError::RunKubelet(Box::new(err))),
            Err(join) => Err(SuiteError::KubeletTask(join.to_string())),
        }
    }

    /// What is registered: the registry's sockets and the device plugins
    /// registered on `kubelet.sock` (resources with an endpoint in
    /// `device-plugins/`), by what a report shows.
    pub(super) fn registered(&self, dirs: &Dirs) -> Registrations {
        let sockets: Vec<Socket> = self
            .handle
            .manager()
            .status()
            .into_iter()
            .filter(|status| status.state == PluginState::Registered)
            .filter_map(|status| {
                let registered = status.registration?;
                Some(Socket {
                    path: status.socket_path,
                    plugin_type: registered.plugin_type,
                    plugin: registered.plugin,
                })
            })
            .collect();
        let resources = self
            .handle
            .devices()
            .resources()
            .into_iter()
            .filter(|resource| Path::new(&resource.endpoint).starts_with(&dirs.env.device_plugins))
            .filter(|resource| sockets.iter().all(|socket| socket.plugin.name != resource.resource))
            .map(|resource| (resource.resource, PathBuf::from(resource.endpoint)))
            .collect();
        Registrations { sockets, resources }
    }
}

/// A registration socket the kubelet registered.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Socket {
    pub(super) path: PathBuf,
    /// The type it reported in `GetInfo`.
    pub(super) plugin_type: String,
    /// Its name, endpoint and versions.
    pub(super) plugin: PluginDetails,
}

/// What the kubelet has registered of the plugin.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Registrations {
    /// Registry sockets.
    pub(super) sockets: Vec<Socket>,
    /// Device plugins registered on `kubelet.sock`: `(resource, endpoint)`.
    pub(super) resources: Vec<(String, PathBuf)>,
}

impl Registrations {
    pub(super) fn is_empty(&self) -> bool {
        self.sockets.is_empty() && self.resources.is_empty()
    }

    /// The same plugins by type and name, wherever their sockets are: a
    /// plugin may serve on another socket once it registers again
    /// (`dp.<time>`, a device plugin's endpoint).
    pub(super) fn same_names(&self, other: &Self) -> bool {
        let names = |registered: &Self| -> Vec<(String, String)> {
            let sockets = registered
                .sockets
                .iter()
                .map(|socket| (socket.plugin_type.clone(), socket.plugin.name.clone()));
            let resources = registered
                .resources
                .iter()
                .map(|(resource, _)| (kpm::api::DEVICE_PLUGIN.to_owned(), resource.clone()));
            let mut names: Vec<_> = sockets.chain(resources).collect();
            names.sort();
            names
        };
        names(self) == names(other)
    }

    /// The registration sockets of `plugin_type`.
    pub(super) fn of_type<'a>(&'a self, plugin_type: &'a str) -> impl Iterator<Item = &'a Socket> {
        self.sockets.iter().filter(move |socket| socket.plugin_type == plugin_type)
    }

    /// Every device plugin, registered either way: `(resource, endpoint)`.
    pub(super) fn device_endpoints(&self) -> Vec<(String, PathBuf)> {
        let sockets = self.of_type(kpm::api::DEVICE_PLUGIN).map(|socket| {
            (socket.plugin.name.clone(), socket.plugin.endpoint.socket_path().to_path_buf())
        });
        sockets.chain(self.resources.iter().cloned()).collect()
    }

    pub(super) fn describe(&self, dirs: &Dirs) -> String {
        if self.is_empty() {
            return "nothing registered".into();
        }
        let sockets = self.sockets.iter().map(|socket| {
            format!("{} {} at {}", socket.plugin_type, socket.plugin.name, dirs.shown(&socket.path))
        });
        let resources = self.resources.iter().map(|(resource, endpoint)| {
            format!("DevicePlugin {resource} on kubelet.sock, endpoint {}", dirs.shown(endpoint))
        });
        sockets.chain(resources).collect::<Vec<_>>().join("; ")
    }
}
