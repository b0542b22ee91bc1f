//! The registration server: [`RegistrarBuilder`] (configuration), [`Registrar`]
//! (the running handle) and the `pluginregistration.Registration` service.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kpm_api::PluginKind;
use kpm_api::constants::{DEFAULT_ROOT_DIR, PLUGINS_REGISTRY_DIR_NAME};
use kpm_api::registration::v1::registration_server::{Registration, RegistrationServer};
use kpm_api::registration::v1::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use kpm_transport::BoundSocket;
use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use crate::RegistrarError;
use crate::naming::{socket_file_name, socket_path};

/// How long [`Registrar::shutdown`] lets in-flight calls finish before it
/// drops the server's connections (upstream's example plugin waits 1 s too).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// The `supported_versions` a plugin of `plugin_type` advertises unless told
/// otherwise: its kind's ([`PluginKind::default_versions`]), none for other
/// types.
pub fn default_versions(plugin_type: &str) -> &'static [&'static str] {
    PluginKind::from_plugin_type(plugin_type).map_or(&[], PluginKind::default_versions)
}

/// Configuration of a registration socket; [`serve`](Self::serve) starts it.
/// Made by [`Registrar::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RegistrarBuilder {
    plugin_type: String,
    name: String,
    versions: Option<Vec<String>>,
    endpoint: Option<PathBuf>,
    rolling_update_uid: Option<String>,
    socket_dir: PathBuf,
    routes: Routes,
    get_info_delay: Duration,
}

/// A running registration socket: serves `pluginregistration.Registration`
/// until [`shutdown`](Self::shutdown) or drop, and records every
/// `NotifyRegistrationStatus` it receives.
///
/// Dropping it stops the server (in the background) and removes its socket
/// file, like `shutdown` but without waiting or reporting errors.
#[derive(Debug)]
pub struct Registrar {
    plugin: Arc<Plugin>,
    /// Identity of the socket file we bound, so that we never remove a file a
    /// newer instance created at the same path.
    socket_file: BoundSocket,
    /// Sending (or dropping) it stops the server. `None` once stopped.
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

/// State shared between the handle and the gRPC service.
#[derive(Debug)]
struct Plugin {
    info: PluginInfo,
    socket: PathBuf,
    get_info_delay: Duration,
    latest: watch::Sender<Option<RegistrationStatus>>,
    history: Mutex<Vec<RegistrationStatus>>,
}

// === RegistrarBuilder ===

impl RegistrarBuilder {
    /// The versions (or, for DRA, service names) to advertise in
    /// `PluginInfo.supported_versions`. Defaults to [`default_versions`] of
    /// the plugin type.
    pub fn versions<I, V>(mut self, versions: I) -> Self
    where
        I: IntoIterator<Item = V>,
        V: Into<String>,
    {
        self.versions = Some(versions.into_iter().map(Into::into).collect());
        self
    }

    /// The socket the plugin's own service (CSI, device plugin, DRA) listens
    /// on, sent as `PluginInfo.endpoint`. Without it the endpoint is empty and
    /// the node agent calls the plugin's service on the registration socket
    /// itself (add the service with [`routes`](Self::routes)).
    pub fn endpoint(mut self, endpoint: impl Into<PathBuf>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Names the socket `<name>-<uid>-reg.sock` instead of `<name>-reg.sock`,
    /// so that a new instance of the plugin registers next to the old one
    /// during a rolling update instead of replacing its socket. Use something
    /// unique per instance, such as the pod UID. An empty uid is ignored.
    pub fn rolling_update_uid(mut self, uid: impl Into<String>) -> Self {
        self.rolling_update_uid = Some(uid.into());
        self
    }

    /// The directory to create the socket in, created if missing. Defaults to
    /// `/var/lib/kubelet/plugins_registry`.
    pub fn socket_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.socket_dir = dir.into();
        self
    }

    /// More gRPC services to serve on the registration socket, such as the
    /// `DevicePlugin` service of a device plugin without an endpoint of its
    /// own. `pluginregistration.Registration` is added to them; `routes` must
    /// not contain it already (tonic's router panics on a duplicate service).
    pub fn routes(mut self, routes: Routes) -> Self {
        self.routes = routes;
        self
    }

    /// Answers `GetInfo` only after `delay`: a plugin slower than the node
    /// agent waits (the kubelet, 1 s), to test how it is treated. Feature
    /// `stub`.
    #[cfg(feature = "stub")]
    pub fn get_info_delay(mut self, delay: Duration) -> Self {
        self.get_info_delay = delay;
        self
    }

    /// Where [`serve`](Self::serve) will bind: see
    /// [`socket_file_name`] for the name.
    pub fn socket_path(&self) -> Result<PathBuf, RegistrarError> {
        socket_path(
            &self.socket_dir,
            &socket_file_name(&self.name, self.rolling_update_uid.as_deref()),
        )
    }

    /// Creates the socket directory, binds the registration socket (replacing
    /// a stale socket file, refusing one a live server answers on) and starts
    /// serving on it. Must be called within a tokio runtime.
    pub async fn serve(self) -> Result<Registrar, RegistrarError> {
        let socket = self.socket_path()?;
        let endpoint = match &self.endpoint {
            None => String::new(),
            Some(path) => path
                .to_str()
                .ok_or_else(|| RegistrarError::EndpointNotUtf8 { path: path.clone() })?
                .to_owned(),
        };
        let versions = self.versions.unwrap_or_else(|| {
            default_versions(&self.plugin_type).iter().map(|&v| v.to_owned()).collect()
        });
        let info = PluginInfo {
            r#type: self.plugin_type,
            name: self.name,
            endpoint,
            supported_versions: versions,
        };

        std::fs::create_dir_all(&self.socket_dir).map_err(|source| RegistrarError::CreateDir {
            path: self.socket_dir.clone(),
            source,
        })?;
        let incoming = kpm_transport::bind(&socket).await?;
        let socket_file = BoundSocket::new(&socket);

        let (latest, _) = watch::channel(None);
        let plugin = Arc::new(Plugin {
            info,
            socket,
            get_info_delay: self.get_info_delay,
            latest,
            history: Mutex::new(Vec::new()),
        });
        let routes = self.routes.add_service(RegistrationServer::from_arc(Arc::clone(&plugin)));
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .layer(kpm_transport::TrackRequests)
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, async {
                    // A send and a dropped sender both mean stop.
                    let _ = stopped.await;
                }),
        );
        info!(
            plugin = %plugin.info.name,
            r#type = %plugin.info.r#type,
            socket = %plugin.socket.display(),
            "serving registration socket"
        );
        Ok(Registrar { plugin, socket_file, stop: Some(stop), server: Some(server) })
    }
}

// === Registrar ===

impl Registrar {
    /// Configures a registration socket for the plugin `name` of
    /// `plugin_type`: [`DEVICE_PLUGIN`](crate::DEVICE_PLUGIN),
    /// [`CSI_PLUGIN`](crate::CSI_PLUGIN), [`DRA_PLUGIN`](crate::DRA_PLUGIN),
    /// or anything else, to see a node agent reject it.
    pub fn builder(plugin_type: impl Into<String>, name: impl Into<String>) -> RegistrarBuilder {
        RegistrarBuilder {
            plugin_type: plugin_type.into(),
            name: name.into(),
            versions: None,
            endpoint: None,
            rolling_update_uid: None,
            socket_dir: Path::new(DEFAULT_ROOT_DIR).join(PLUGINS_REGISTRY_DIR_NAME),
            routes: Routes::default(),
            get_info_delay: Duration::ZERO,
        }
    }

    /// The registration socket this plugin serves on.
    pub fn socket_path(&self) -> &Path {
        &self.plugin.socket
    }

    /// What `GetInfo` answers.
    pub fn plugin_info(&self) -> &PluginInfo {
        &self.plugin.info
    }

    /// The latest registration status received: `None` until the node agent
    /// first calls `NotifyRegistrationStatus`. Await `changed()` on the
    /// receiver to follow later ones (a re-registration, for instance).
    pub fn status(&self) -> watch::Receiver<Option<RegistrationStatus>> {
        self.plugin.latest.subscribe()
    }

    /// Every registration status received, oldest first.
    pub fn statuses(&self) -> Vec<RegistrationStatus> {
        self.plugin.history.lock().clone()
    }

    /// Waits until a registration status has been received, at most
    /// `timeout`, and returns the latest. Returns at once if one was already
    /// received. A rejection is a status too: check `plugin_registered`.
    pub async fn wait_for_status(
        &self,
        timeout: Duration,
    ) -> Result<RegistrationStatus, RegistrarError> {
        let mut latest = self.plugin.latest.subscribe();
        if let Ok(Ok(status)) =
            tokio::time::timeout(timeout, latest.wait_for(Option::is_some)).await
            && let Some(status) = status.as_ref()
        {
            return Ok(status.clone());
        }
        Err(RegistrarError::StatusTimeout { socket: self.plugin.socket.clone(), timeout })
    }

    /// Removes the socket file, so that the node agent deregisters the plugin,
    /// unless it is no longer the file this registrar bound (a newer instance
    /// of the plugin re-created it); then stops the server, letting in-flight
    /// calls finish for up to a second.
    ///
    /// The file goes first because the bound listener keeps its inode alive:
    /// until the server stops, no new file at the path can have that inode.
    pub async fn shutdown(mut self) -> Result<(), RegistrarError> {
        let removed = self.remove_socket();
        let served = self.stop_server().await;
        info!(plugin = %self.plugin.info.name, socket = %self.plugin.socket.display(), "stopped");
        removed.and(served)
    }

    /// Signals the server to stop and waits for it, at most [`SHUTDOWN_GRACE`].
    async fn stop_server(&mut self) -> Result<(), RegistrarError> {
        self.stop.take();
        let Some(mut server) = self.server.take() else { return Ok(()) };
        let socket = self.plugin.socket.display();
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
            Ok(Ok(result)) => result.map_err(|source| RegistrarError::Serve {
                socket: self.plugin.socket.clone(),
                source,
            }),
            Ok(Err(join_error)) => {
                warn!(%socket, %join_error, "registration server task failed");
                Ok(())
            }
            Err(_) => {
                debug!(%socket, grace = ?SHUTDOWN_GRACE, "calls still in flight; dropping them");
                server.abort();
                Ok(())
            }
        }
    }

    /// Removes the socket file if it is still the one we bound.
    fn remove_socket(&self) -> Result<(), RegistrarError> {
        let path = &self.plugin.socket;
        match self.socket_file.remove() {
            Ok(true) => Ok(()),
            Ok(false) => {
                debug!(socket = %path.display(), "socket file is gone or was re-created; leaving it");
                Ok(())
            }
            Err(source) => Err(RegistrarError::RemoveSocket { path: path.clone(), source }),
        }
    }
}

impl Drop for Registrar {
    fn drop(&mut self) {
        // After `shutdown` there is nothing left to do. Otherwise remove the
        // file while the listener still holds its inode, then stop the server.
        if self.stop.is_some() {
            if let Err(err) = self.remove_socket() {
                warn!(%err, "registrar dropped");
            }
            self.stop.take();
        }
    }
}

// === Plugin (the gRPC service) ===

#[tonic::async_trait]
impl Registration for Plugin {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        debug!(plugin = %self.info.name, socket = %self.socket.display(), "GetInfo");
        if !self.get_info_delay.is_zero() {
            tokio::time::sleep(self.get_info_delay).await;
        }
        Ok(Response::new(self.info.clone()))
    }

    /// Records the status and answers at once: upstream's test plugin blocked
    /// here, so every notification the kubelet sent it timed out.
    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let (plugin, socket) = (&self.info.name, self.socket.display());
        if status.plugin_registered {
            info!(%plugin, %socket, "registered");
        } else {
            warn!(%plugin, %socket, reason = %status.error, "registration rejected");
        }
        self.history.lock().push(status.clone());
        self.latest.send_replace(Some(status));
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
