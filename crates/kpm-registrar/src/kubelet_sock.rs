//! Device plugins that register through the kubelet's `kubelet.sock`
//! (`v1beta1.Registration/Register`) rather than a registration socket, as
//! most device plugins do: [`register_device_plugin`] registers once,
//! [`keep_device_plugin_registered`] again each time the kubelet restarts
//! (it creates `kubelet.sock` anew, and forgets every device plugin).

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use kpm_api::FileId;
use kpm_api::constants::KUBELET_SOCKET_NAME;
use kpm_api::deviceplugin::v1beta1::RegisterRequest;
use kpm_api::deviceplugin::v1beta1::registration_client::RegistrationClient;
use tracing::{info, warn};

use crate::RegistrarError;

/// The device-plugin API version a plugin registers with.
const DEVICE_PLUGIN_VERSION: &str = "v1beta1";

/// How often [`keep_device_plugin_registered`] looks at `kubelet.sock`.
const LOOK_EVERY: Duration = Duration::from_millis(100);

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
    let channel = kpm_transport::dial(&socket, timeout).await?;
    let request = RegisterRequest {
        version: DEVICE_PLUGIN_VERSION.to_owned(),
        endpoint: endpoint.to_owned(),
        resource_name: resource.to_owned(),
        options: None,
    };
    let mut client = RegistrationClient::new(channel);
    let call = client.register(kpm_transport::timed_request(request, timeout));
    match kpm_transport::within(timeout, call).await {
        Ok(_) => Ok(()),
        Err(status) => Err(RegistrarError::RegisterDevicePlugin {
            socket,
            resource: resource.to_owned(),
            status: status.unwrap_or_else(|| tonic::Status::deadline_exceeded("no answer in time")),
        }),
    }
}

/// Registers as [`register_device_plugin`] does each time `dir/kubelet.sock`
/// is a new file (the kubelet started or restarted): at once if it is
/// there, then whenever it is replaced, looking every 100 ms, until
/// `shutdown` completes. A failed attempt is logged and made again at the
/// next look.
pub async fn keep_device_plugin_registered(
    dir: &Path,
    endpoint: &str,
    resource: &str,
    shutdown: impl Future<Output = ()>,
) {
    let socket = dir.join(KUBELET_SOCKET_NAME);
    let mut registered_with = None;
    tokio::pin!(shutdown);
    loop {
        let current = std::fs::metadata(&socket).ok().map(|meta| FileId::of(&meta));
        if current.is_some() && current != registered_with {
            match register_device_plugin(dir, endpoint, resource, Duration::from_secs(5)).await {
                Ok(()) => {
                    info!(resource, socket = %socket.display(), "registered with the kubelet");
                    registered_with = current;
                }
                Err(err) => {
                    warn!(resource, error = %err, "registering with the kubelet failed; trying again");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(LOOK_EVERY) => {}
            () = &mut shutdown => return,
        }
    }
}
