//! A channel to a plugin's endpoint, dialled as the kubelet dials it.

use std::time::Duration;

use kpm::transport::{Dialer, fd};
use tonic::transport::Channel;

/// A channel to the plugin at `endpoint` (a `unix://` prefix stripped),
/// within `bound`; `Err` says what failed.
pub(crate) async fn dial(endpoint: &str, bound: Duration) -> Result<Channel, String> {
    let socket = kpm::api::endpoint_path(endpoint);
    let dialed = Dialer::new(fd::budget().clone(), bound).grpc(socket).await;
    dialed
        .map(|dialed| dialed.channel)
        .map_err(|err| format!("dial {}: {}", socket.display(), kpm_api::gotext::error_chain(&err)))
}
