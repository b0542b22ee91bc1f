//! The stub DRA driver.

use kpm_api::dra::{v1 as dra_v1, v1beta1 as dra_v1beta1};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// A DRA driver that prepares every claim with no devices, on both DRA
/// plugin services: `v1.DRAPlugin`, which kubelets 1.34 and later call,
/// and `v1beta1.DRAPlugin`, the one kubelets 1.32 and 1.33 speak (they
/// know no v1, and fall back to an older API for a plugin without
/// v1beta1). The two services' messages are the same on the wire.
#[derive(Debug, Clone, Copy)]
pub struct StubDraDriver;

impl StubDraDriver {
    /// The `DRAPlugin` services, v1 and v1beta1, to serve on the driver's
    /// socket.
    pub fn routes(self) -> Routes {
        Routes::new(dra_v1::dra_plugin_server::DraPluginServer::new(self))
            .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(self))
    }
}

/// `DRAPlugin` of one API version: every claim prepared and unprepared,
/// with no devices.
macro_rules! prepare_every_claim {
    ($api:ident) => {
        #[tonic::async_trait]
        impl $api::dra_plugin_server::DraPlugin for StubDraDriver {
            async fn node_prepare_resources(
                &self,
                request: Request<$api::NodePrepareResourcesRequest>,
            ) -> Result<Response<$api::NodePrepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|claim| (claim.uid, $api::NodePrepareResourceResponse::default()))
                    .collect();
                Ok(Response::new($api::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$api::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$api::NodeUnprepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|claim| (claim.uid, $api::NodeUnprepareResourceResponse::default()))
                    .collect();
                Ok(Response::new($api::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

prepare_every_claim!(dra_v1);
prepare_every_claim!(dra_v1beta1);
