//! `kubelet.sock`: the `v1beta1.Registration` service most device plugins
//! register through (spec B.5).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kpm_api::constants::KUBELET_SOCKET_NAME;
use kpm_api::deviceplugin::v1beta1::registration_server::{Registration, RegistrationServer};
use kpm_api::deviceplugin::v1beta1::{Empty, RegisterRequest};
use kpm_transport::TransportError;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use crate::error::DeviceError;
use crate::manager::DeviceManager;
use kpm_transport::{BoundSocket, OWNER_ONLY, bind_with_mode};

/// How long [`KubeletSocket::shutdown`] lets in-flight `Register` calls finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// The served `kubelet.sock`, returned by
/// [`DeviceManager::serve_registration`]. Dropping it stops the server (in
/// the background) and removes the socket, like
/// [`shutdown`](Self::shutdown) without waiting.
#[derive(Debug)]
pub struct KubeletSocket {
    path: PathBuf,
    /// The file we bound, so that we never remove one someone else created.
    bound: BoundSocket,
    /// Sending (or dropping) it stops the server. `None` once stopped.
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

/// The `v1beta1.Registration` service.
struct RegistrationService {
    manager: Arc<DeviceManager>,
    dir: PathBuf,
}

// === DeviceManager::serve_registration ===

impl DeviceManager {
    /// Serves `v1beta1.Registration` on `<dir>/kubelet.sock`: creates `dir`
    /// (`mkdir -p`, mode 0750), removes a stale socket file, and refuses a
    /// socket a live process answers on
    /// ([`DeviceError::KubeletSocketInUse`]). Endpoints in `Register`
    /// requests are file names in `dir`.
    ///
    /// Once `kubelet.sock` is its own, it removes every other socket in
    /// `dir`, as the kubelet's device manager does when it starts: that is
    /// the protocol's signal to re-register. Device plugins watch either
    /// `kubelet.sock` being created anew or their own socket going away
    /// (generic-device-plugin, among others, only the latter), then serve
    /// anew and register. Directories and other files (the kubelet's
    /// checkpoint) stay.
    pub async fn serve_registration(
        self: &Arc<Self>,
        dir: &Path,
    ) -> Result<KubeletSocket, DeviceError> {
        let create_err = |source| DeviceError::CreateDir { path: dir.to_path_buf(), source };
        let dir = std::path::absolute(dir).map_err(create_err)?;
        create_dir(&dir).map_err(create_err)?;
        let path = dir.join(KUBELET_SOCKET_NAME);
        let (incoming, bound) =
            bind_with_mode(&path, OWNER_ONLY).await.map_err(|source| match source {
                TransportError::InUse { path } => DeviceError::KubeletSocketInUse { path },
                source => DeviceError::BindKubeletSocket { path: path.clone(), source },
            })?;
        remove_plugin_sockets(&dir, &path);
        let incoming = incoming
            .handshake_timeout(self.config().handshake_timeout)
            .budget(self.reach.budget().clone());
        let service = RegistrationService { manager: Arc::clone(self), dir };
        let (stop, stopped) = oneshot::channel::<()>();
        let socket = path.clone();
        let server = tokio::spawn(async move {
            let served =
                tonic::transport::Server::builder()
                    .layer(kpm_transport::TrackRequests)
                    .add_service(RegistrationServer::new(service).max_decoding_message_size(
                        kpm_api::constants::MAX_REGISTRATION_MESSAGE_BYTES,
                    ))
                    .serve_with_incoming_shutdown(incoming, async {
                        // A send and a dropped sender both mean stop.
                        let _ = stopped.await;
                    })
                    .await;
            if let Err(err) = served {
                warn!(socket = %socket.display(), error = %err, "device plugin registration server failed");
            }
        });
        info!(socket = %path.display(), "serving device plugin registration");
        Ok(KubeletSocket { path, bound, stop: Some(stop), server: Some(server) })
    }
}

// === KubeletSocket ===

impl KubeletSocket {
    /// The socket served on: `<dir>/kubelet.sock`, with `dir` made absolute.
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// Removes `kubelet.sock` if it is still the file we bound, then stops
    /// serving, letting in-flight `Register` calls finish for up to a second.
    pub async fn shutdown(mut self) {
        self.remove_socket();
        self.stop.take();
        if let Some(mut server) = self.server.take()
            && tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await.is_err()
        {
            debug!(socket = %self.path.display(), "Register calls still in flight; dropping them");
            server.abort();
        }
        info!(socket = %self.path.display(), "stopped serving device plugin registration");
    }

    /// Removes the socket file if it is still the one we bound. Runs before
    /// the server stops: the bound listener keeps the file's inode alive, so
    /// no new file at the path can have it yet.
    fn remove_socket(&self) {
        let path = &self.path;
        match self.bound.remove() {
            Ok(true) => {}
            Ok(false) => {
                debug!(socket = %path.display(), "kubelet.sock is gone or not ours; leaving it");
            }
            Err(err) => {
                warn!(socket = %path.display(), error = %err, "removing kubelet.sock failed");
            }
        }
    }
}

impl Drop for KubeletSocket {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.remove_socket();
            self.stop.take();
        }
    }
}

// === RegistrationService ===

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        let (resource, endpoint) = (&request.resource_name, &request.endpoint);
        info!(resource, endpoint, version = request.version, "device plugin Register request");
        match self.manager.handle_register(&self.dir, &request).await {
            Ok(()) => Ok(Response::new(Empty {})),
            Err(err) => {
                warn!(resource, endpoint, error = %err, "device plugin Register request failed");
                Err(err.to_status())
            }
        }
    }
}

/// Removes the sockets in `dir` but `kubelet_sock` (symlinks are not
/// followed), each logged; a failure is logged and the rest go on.
fn remove_plugin_sockets(dir: &Path, kubelet_sock: &Path) {
    use std::os::unix::fs::FileTypeExt as _;
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            warn!(dir = %dir.display(), %error, "cannot list the device-plugin directory");
            return;
        }
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let is_socket = entry.file_type().is_ok_and(|kind| kind.is_socket());
        if !is_socket || path == kubelet_sock {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                info!(socket = %path.display(), "removed a device plugin's socket: it re-registers");
            }
            Err(error) => {
                warn!(socket = %path.display(), %error, "cannot remove a device plugin's socket");
            }
        }
    }
}

/// `mkdir -p` with mode 0750 for the directories it creates.
fn create_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new().recursive(true).mode(kpm_api::constants::OWN_DIR_MODE).create(dir)
}
