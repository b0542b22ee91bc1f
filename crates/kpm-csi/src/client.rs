//! The CSI client the handler needs: `csi.v1.Node/NodeGetInfo` over a fresh
//! connection to the driver's Unix socket (spec A.7).

use std::path::Path;
use std::time::Duration;

use kpm_api::csi::v1::NodeGetInfoRequest;
use kpm_api::csi::v1::node_client::NodeClient;
use kpm_transport::fd::FdBudget;
use kpm_transport::{Dialer, TimedCallError};
use tokio::time::Instant;
use tracing::debug;

use crate::error::CsiError;
use crate::store::DriverNodeInfo;

/// The socket path of a CSI endpoint: the kubelet dials it as a raw path,
/// and a `unix://` or `unix:` prefix (a gRPC target, as some drivers report
/// it) is stripped ([`kpm_transport::endpoint_path`]).
pub fn socket_path(endpoint: &str) -> &Path {
    kpm_transport::endpoint_path(endpoint)
}

/// Calls `csi.v1.Node/NodeGetInfo` on the driver at `endpoint` over a new
/// connection, closed afterwards. Dialing and the call together get at most
/// `timeout`; the remaining time is also sent as the call's gRPC deadline.
/// No retries: the caller's backoff decides when to try again. The
/// connection holds a permit of `budget`.
pub async fn node_get_info(
    endpoint: &str,
    timeout: Duration,
    budget: &FdBudget,
) -> Result<DriverNodeInfo, CsiError> {
    debug!(endpoint, "calling NodeGetInfo");
    let started = Instant::now();
    let call = async {
        let dialed = Dialer::new(budget.clone(), timeout)
            .grpc(socket_path(endpoint))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_target_prefixes_are_stripped_from_endpoints() {
        assert_eq!(socket_path("/csi/csi.sock"), Path::new("/csi/csi.sock"));
        assert_eq!(socket_path("unix:///csi/csi.sock"), Path::new("/csi/csi.sock"));
        assert_eq!(socket_path("unix:/csi/csi.sock"), Path::new("/csi/csi.sock"));
        assert_eq!(socket_path("relative.sock"), Path::new("relative.sock"));
    }
}
