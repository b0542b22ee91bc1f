//! The stub DRA driver.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use kpm_api::dra::{v1 as dra_v1, v1beta1 as dra_v1beta1};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::{Misbehaviour, Misbehaviours};

/// A DRA driver that prepares every claim with no devices, on both DRA
/// plugin services: `v1.DRAPlugin`, which kubelets 1.34 and later call,
/// and `v1beta1.DRAPlugin`, the one kubelets 1.32 and 1.33 speak (they
/// know no v1, and fall back to an older API for a plugin without
/// v1beta1). The two services' messages are the same on the wire.
#[derive(Debug, Clone, Default)]
pub struct StubDraDriver {
    misbehaviours: Misbehaviours,
}

impl StubDraDriver {
    /// A driver that keeps every rule.
    pub fn new() -> Self {
        Self::default()
    }

    /// Breaks the rules named, those for DRA drivers
    /// ([`Misbehaviour::UnprepareUnknownFails`],
    /// [`Misbehaviour::PrepareAnswersUnsentClaim`]); the others are ignored.
    #[must_use]
    pub fn misbehave(mut self, misbehaviours: impl IntoIterator<Item = Misbehaviour>) -> Self {
        self.misbehaviours = Misbehaviours::of(misbehaviours);
        self
    }

    /// The `DRAPlugin` services, v1 and v1beta1, to serve on the driver's
    /// socket.
    pub fn routes(self) -> Routes {
        let driver =
            Driver { misbehaviours: Arc::new(self.misbehaviours), prepared: Arc::default() };
        Routes::new(dra_v1::dra_plugin_server::DraPluginServer::new(driver.clone()))
            .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(driver))
    }
}

/// The driver behind both services: what it was told to break, and the
/// uids of the claims it prepared (to tell a claim it never prepared).
#[derive(Debug, Clone)]
struct Driver {
    misbehaviours: Arc<Misbehaviours>,
    prepared: Arc<Mutex<HashSet<String>>>,
}

impl Driver {
    /// The uid a [`Misbehaviour::PrepareAnswersUnsentClaim`] driver answers too.
    const UNSENT: &'static str = "never-sent";

    fn prepared(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.prepared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes `uids` prepared; the uids to answer.
    fn prepare(&self, uids: Vec<String>) -> Vec<String> {
        let mut answered = uids.clone();
        self.prepared().extend(uids);
        if self.misbehaviours.has(Misbehaviour::PrepareAnswersUnsentClaim) {
            answered.push(Self::UNSENT.into());
        }
        answered
    }

    /// Forgets `uids`: each with its error, empty when none.
    fn unprepare(&self, uids: Vec<String>) -> Vec<(String, String)> {
        let fails = self.misbehaviours.has(Misbehaviour::UnprepareUnknownFails);
        let mut prepared = self.prepared();
        uids.into_iter()
            .map(|uid| {
                let known = prepared.remove(&uid);
                let error = if fails && !known {
                    format!("claim {uid} is not prepared")
                } else {
                    String::new()
                };
                (uid, error)
            })
            .collect()
    }
}

/// `DRAPlugin` of one API version: every claim prepared and unprepared,
/// with no devices.
macro_rules! prepare_every_claim {
    ($api:ident) => {
        #[tonic::async_trait]
        impl $api::dra_plugin_server::DraPlugin for Driver {
            async fn node_prepare_resources(
                &self,
                request: Request<$api::NodePrepareResourcesRequest>,
            ) -> Result<Response<$api::NodePrepareResourcesResponse>, Status> {
                let uids = request.into_inner().claims.into_iter().map(|claim| claim.uid).collect();
                let claims = self
                    .prepare(uids)
                    .into_iter()
                    .map(|uid| (uid, $api::NodePrepareResourceResponse::default()))
                    .collect();
                Ok(Response::new($api::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$api::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$api::NodeUnprepareResourcesResponse>, Status> {
                let uids = request.into_inner().claims.into_iter().map(|claim| claim.uid).collect();
                let claims = self
                    .unprepare(uids)
                    .into_iter()
                    .map(|(uid, error)| (uid, $api::NodeUnprepareResourceResponse { error }))
                    .collect();
                Ok(Response::new($api::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

prepare_every_claim!(dra_v1);
prepare_every_claim!(dra_v1beta1);
