//! The CSI client the handler needs: `csi.v1.Node/NodeGetInfo` over a fresh
//! connection to the driver's Unix socket (spec A.7).

use std::time::Duration;

use kpm_api::csi::v1::NodeGetInfoRequest;
use kpm_api::csi::v1::node_client::NodeClient;
use kpm_transport::{Dialer, Reach, TimedCallError};
use tokio::time::Instant;
use tracing::debug;

use crate::error::CsiError;
use crate::store::DriverNodeInfo;

/// Calls `csi.v1.Node/NodeGetInfo` on the driver at `endpoint` over a new
/// connection, closed afterwards. Dialing and the call together get at most
/// `timeout`; the remaining time is also sent as the call's gRPC deadline.
/// No retries: the caller's backoff decides when to try again. The
/// connection holds a permit of the budget of `reach`. `endpoint` is a
/// path on the host or a `unix://` target
/// ([`endpoint_path`](kpm_api::endpoint_path)), and errors name it so.
pub async fn node_get_info(
    endpoint: &str,
    timeout: Duration,
    reach: impl Into<Reach>,
) -> Result<DriverNodeInfo, CsiError> {
    let reach = reach.into();
    debug!(endpoint, "calling NodeGetInfo");
    let started = Instant::now();
    let call = async {
        let dialed = Dialer::new(reach, timeout)
            .grpc(kpm_api::endpoint_path(endpoint))
            .await
            .map_err(|source| CsiError::Dial { endpoint: endpoint.to_owned(), source })?;
        let left = timeout.saturating_sub(started.elapsed());
        let request = kpm_transport::timed_request(NodeGetInfoRequest {}, left);
        NodeClient::new(dialed.channel)
            .max_decoding_message_size(kpm_api::constants::MAX_PLUGIN_MESSAGE_BYTES)
            .node_get_info(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| CsiError::NodeGetInfo { endpoint: endpoint.to_owned(), status })
    };
    let timed_out = || CsiError::NodeGetInfoTimeout { endpoint: endpoint.to_owned(), timeout };
    let response =
        kpm_transport::timed_call(timeout, call).await.map_err(|failed| match failed {
            TimedCallError::Failed(err) => err,
            TimedCallError::TimedOut => timed_out(),
        })?;
    Ok(DriverNodeInfo {
        node_id: response.node_id,
        max_volumes_per_node: response.max_volumes_per_node,
        topology: response
            .accessible_topology
            .map(|topology| topology.segments.into_iter().collect())
            .unwrap_or_default(),
    })
}
