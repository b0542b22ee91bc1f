//! How the manager calls a plugin, whatever the call: the `DevicePlugin`
//! client with kpm's message limit, the bound every unary call is awaited
//! within, and its timeout error. Both `connection` (options, the stream)
//! and `calls` (the node agents' calls) go through it, so it depends on
//! neither.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use kpm_api::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use kpm_transport as uds;
use kpm_transport::UdsChannel;

use crate::error::DeviceError;

/// A `DevicePlugin` client on `channel` that accepts plugin messages up to
/// kpm's limit.
pub(super) fn plugin_client(channel: UdsChannel) -> DevicePluginClient<UdsChannel> {
    DevicePluginClient::new(channel)
        .max_decoding_message_size(kpm_api::constants::MAX_PLUGIN_MESSAGE_BYTES)
}

/// The error of a `call` that got no answer within `timeout`.
pub(super) fn timed_out(
    call: &'static str,
    resource: &str,
    socket: &Path,
    timeout: Duration,
) -> DeviceError {
    DeviceError::Timeout {
        call,
        resource: resource.to_owned(),
        socket: socket.to_path_buf(),
        timeout,
    }
}

/// Awaits a call for at most `timeout`; see [`uds::timed_call`].
pub(super) async fn bounded<T>(
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    timeout: Duration,
    on_timeout: impl FnOnce() -> DeviceError,
    on_status: impl FnOnce(tonic::Status) -> DeviceError,
) -> Result<T, DeviceError> {
    uds::timed_call(timeout, call).await.map(tonic::Response::into_inner).map_err(|failed| {
        match failed {
            uds::TimedCallError::Failed(status) => on_status(status),
            uds::TimedCallError::TimedOut => on_timeout(),
        }
    })
}
