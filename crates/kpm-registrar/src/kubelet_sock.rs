//! Device plugins that register through the kubelet's `kubelet.sock`
//! (`v1beta1.Registration/Register`) rather than a registration socket, as
//! most device plugins do. [`serve_device_plugin`] keeps one served and
//! registered the way the protocol asks: the kubelet, when it (re)starts,
//! creates `kubelet.sock` anew and removes every plugin's socket, and
//! forgets every plugin; a plugin then binds its socket again and
//! registers again. [`register_device_plugin`] is the one call.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use kpm_api::FileId;
use kpm_api::constants::KUBELET_SOCKET_NAME;
use kpm_api::deviceplugin::v1beta1::RegisterRequest;
use kpm_api::deviceplugin::v1beta1::registration_client::RegistrationClient;
use kpm_transport::fd;
use kpm_transport::{BoundSocket, Dialer, TimedCallError, file_id_at};
use tokio::sync::oneshot;
use tonic::service::Routes;
use tracing::{info, warn};

use crate::RegistrarError;

/// The device-plugin API version a plugin registers with.
const DEVICE_PLUGIN_VERSION: &str = "v1beta1";

/// How often [`serve_device_plugin`] looks at the two sockets.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// How long one `Register` (dial and call) may take.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// Calls `Register` on `dir/kubelet.sock` for the extended resource
/// `resource`, whose `DevicePlugin` service listens on `dir/endpoint`
/// (`endpoint` is a file name in `dir`, as the protocol has it); dialing
/// and the call take at most `timeout`.
pub async fn register_device_plugin(
    dir: &Path,
    endpoint: &str,
    resource: &str,
    timeout: Duration,
) -> Result<(), RegistrarError> {
    let socket = dir.join(KUBELET_SOCKET_NAME);
    // A plugin process's one short call: the process-wide budget.
    let channel = Dialer::new(fd::budget().clone(), timeout).grpc(&socket).await?.channel;
    let request = RegisterRequest {
        version: DEVICE_PLUGIN_VERSION.to_owned(),
        endpoint: endpoint.to_owned(),
        resource_name: resource.to_owned(),
        options: None,
    };
    let mut client = RegistrationClient::new(channel);
    let call = client.register(kpm_transport::timed_request(request, timeout));
    match kpm_transport::timed_call(timeout, call).await {
        Ok(_) => Ok(()),
        Err(failed) => Err(RegistrarError::RegisterDevicePlugin {
            socket,
            resource: resource.to_owned(),
            status: match failed {
                TimedCallError::Failed(status) => status,
                TimedCallError::TimedOut => tonic::Status::deadline_exceeded("no answer in time"),
            },
        }),
    }
}

/// Serves `routes` (the plugin's `DevicePlugin` service) on `dir/endpoint`
/// and keeps `resource` registered through `dir/kubelet.sock` until
/// `shutdown` completes, then removes the socket it bound. Every 100 ms it
/// looks at both sockets: its own, gone or replaced (the kubelet restarted
/// and removed it), is bound again and registered again; a new
/// `kubelet.sock` (the kubelet started or restarted) is registered with. A
/// failed `Register` is logged and made again at the next look. Fails only
/// if its socket cannot be bound.
pub async fn serve_device_plugin(
    dir: &Path,
    endpoint: &str,
    resource: &str,
    routes: Routes,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RegistrarError> {
    let (socket, kubelet_sock) = (dir.join(endpoint), dir.join(KUBELET_SOCKET_NAME));
    let mut served: Option<(BoundSocket, Option<FileId>, oneshot::Sender<()>)> = None;
    let mut registered_with = None;
    tokio::pin!(shutdown);
    loop {
        let ours = file_id_at(&socket);
        if served.as_ref().is_none_or(|(_, bound, _)| *bound != ours) {
            // Its server listens on a file that is gone: stopped.
            if let Some((_, _, stop)) = served.take() {
                drop(stop);
            }
            let incoming = kpm_transport::bind(&socket).await?;
            let (stop, stopped) = oneshot::channel::<()>();
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_routes(routes.clone())
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    }),
            );
            info!(resource, socket = %socket.display(), "serving the device plugin");
            served = Some((BoundSocket::new(&socket), file_id_at(&socket), stop));
            registered_with = None;
        }
        let kubelet = file_id_at(&kubelet_sock);
        if kubelet.is_some() && kubelet != registered_with {
            match register_device_plugin(dir, endpoint, resource, REGISTER_TIMEOUT).await {
                Ok(()) => {
                    info!(resource, socket = %kubelet_sock.display(), "registered with the kubelet");
                    registered_with = kubelet;
                }
                Err(err) => {
                    warn!(resource, error = %err, "registering with the kubelet failed; trying again");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(LOOK_EVERY) => {}
            () = &mut shutdown => break,
        }
    }
    if let Some((bound, _, stop)) = served {
        if let Err(err) = bound.remove() {
            warn!(resource, socket = %socket.display(), error = %err, "cannot remove the socket");
        }
        drop(stop);
    }
    Ok(())
}
