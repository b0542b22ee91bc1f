//! The calls on a driver: `NodePrepareResources` and
//! `NodeUnprepareResources` on the serving instance, and the read-only
//! inspection of an endpoint. Both versions of the DRA service go through
//! one [`dispatch`](DraManager::dispatch): the v1 and v1beta1 paths differ
//! only in the generated client and the message types, so each call names
//! just that (v1beta1 converts to and from v1, see [`convert`]), and the
//! channel, the message size limit, the deadline sent along and the one
//! enforced here are written once.

use std::path::Path;
use std::time::Duration;

use kpm_api::constants::MAX_PLUGIN_MESSAGE_BYTES;
use kpm_api::dra::{v1, v1beta1};
use kpm_transport::UdsChannel;
use tracing::debug;

use super::DraManager;
use crate::connection::Connection;
use crate::convert;
use crate::error::{DraError, deadline_exceeded};
use crate::validate::{DraService, choose_service};

/// The generated client of `v1.DRAPlugin`.
type V1Client = v1::dra_plugin_client::DraPluginClient<UdsChannel>;

/// The generated client of `v1beta1.DRAPlugin`.
type V1beta1Client = v1beta1::dra_plugin_client::DraPluginClient<UdsChannel>;

/// What a DRA driver's endpoint answered ([`DraManager::inspect_endpoint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DraEndpointReport {
    /// The service it is called with.
    pub service: DraService,
}

/// `SERVICE answers NodePrepareResources (no claims)`.
impl std::fmt::Display for DraEndpointReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} answers NodePrepareResources (no claims)", self.service)
    }
}

impl DraManager {
    /// Calls `NodePrepareResources` on the serving instance of `driver` (the
    /// newest connected one, else the newest) with its negotiated service,
    /// within [`DraConfig::call_timeout`](crate::DraConfig::call_timeout).
    pub async fn prepare(
        &self,
        driver: &str,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::NodePrepareResourcesResponse, DraError> {
        let instance = self.serving(driver)?;
        let (endpoint, service) = (instance.endpoint.as_str(), instance.service);
        debug!(driver, endpoint, claims = claims.len(), "NodePrepareResources");
        self.node_prepare(driver, endpoint, service, instance.connection.channel(), claims).await
    }

    /// Calls `NodeUnprepareResources` on the serving instance of `driver`,
    /// as [`DraManager::prepare`] does.
    pub async fn unprepare(
        &self,
        driver: &str,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::NodeUnprepareResourcesResponse, DraError> {
        let instance = self.serving(driver)?;
        let (endpoint, service) = (instance.endpoint.as_str(), instance.service);
        debug!(driver, endpoint, claims = claims.len(), "NodeUnprepareResources");
        self.node_unprepare(driver, endpoint, service, instance.connection.channel(), claims).await
    }

    /// `NodePrepareResources` of `claims` on the driver `driver` at
    /// `endpoint` with `service`, whatever it would negotiate, over a
    /// connection of its own, closed afterwards: a conformance check drives
    /// each service a driver offers. Nothing is registered.
    pub async fn prepare_at(
        &self,
        driver: &str,
        endpoint: &str,
        service: DraService,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::NodePrepareResourcesResponse, DraError> {
        let channel = self.connect_once(driver, endpoint).await?;
        self.node_prepare(driver, endpoint, service, channel, claims).await
    }

    /// `NodeUnprepareResources`, as [`DraManager::prepare_at`].
    pub async fn unprepare_at(
        &self,
        driver: &str,
        endpoint: &str,
        service: DraService,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::NodeUnprepareResourcesResponse, DraError> {
        let channel = self.connect_once(driver, endpoint).await?;
        self.node_unprepare(driver, endpoint, service, channel, claims).await
    }

    /// A connection of its own to `endpoint`, for calls outside a registration.
    async fn connect_once(
        &self,
        driver: &str,
        endpoint: &str,
    ) -> Result<Result<UdsChannel, tonic::Status>, DraError> {
        let connection = Connection::new(Path::new(endpoint), self.shared.reach.clone());
        connection.reconnect().await.map_err(|source| DraError::Connect {
            driver: driver.to_owned(),
            endpoint: endpoint.to_owned(),
            source,
        })?;
        Ok(connection.channel())
    }

    /// `NodeUnprepareResources` of `claims` on `channel` with `service`.
    async fn node_unprepare(
        &self,
        driver: &str,
        endpoint: &str,
        service: DraService,
        channel: Result<UdsChannel, tonic::Status>,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::NodeUnprepareResourcesResponse, DraError> {
        self.dispatch(
            channel,
            service,
            claims,
            |mut client: V1Client, request| async move {
                let request = request.map(|claims| v1::NodeUnprepareResourcesRequest { claims });
                Ok(client.node_unprepare_resources(request).await?.into_inner())
            },
            |mut client: V1beta1Client, request| async move {
                let request = request.map(convert::unprepare_request);
                let response = client.node_unprepare_resources(request).await?;
                Ok(convert::unprepare_response(response.into_inner()))
            },
        )
        .await
        .map_err(|status| DraError::NodeUnprepareResources {
            driver: driver.to_owned(),
            endpoint: endpoint.to_owned(),
            method: service.unprepare_method(),
            status,
        })
    }

    /// What registering the DRA driver `driver` at `endpoint` would see,
    /// read-only: the service it would be called with (negotiated from
    /// `services`) answers `NodePrepareResources` with no claims, which
    /// prepares nothing. The connection is closed afterwards.
    pub async fn inspect_endpoint(
        &self,
        driver: &str,
        endpoint: &str,
        services: &[String],
    ) -> Result<DraEndpointReport, DraError> {
        let service = choose_service(services)?;
        let channel = self.connect_once(driver, endpoint).await?;
        self.node_prepare(driver, endpoint, service, channel, Vec::new()).await?;
        Ok(DraEndpointReport { service })
    }

    /// `NodePrepareResources` of `claims` on `channel` with `service`.
    async fn node_prepare(
        &self,
        driver: &str,
        endpoint: &str,
        service: DraService,
        channel: Result<UdsChannel, tonic::Status>,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::NodePrepareResourcesResponse, DraError> {
        self.dispatch(
            channel,
            service,
            claims,
            |mut client: V1Client, request| async move {
                let request = request.map(|claims| v1::NodePrepareResourcesRequest { claims });
                Ok(client.node_prepare_resources(request).await?.into_inner())
            },
            |mut client: V1beta1Client, request| async move {
                let request = request.map(convert::prepare_request);
                let response = client.node_prepare_resources(request).await?;
                Ok(convert::prepare_response(response.into_inner()))
            },
        )
        .await
        .map_err(|status| DraError::NodePrepareResources {
            driver: driver.to_owned(),
            endpoint: endpoint.to_owned(),
            method: service.prepare_method(),
            status,
        })
    }

    /// One call of the DRA service on `channel`, in the version `service`
    /// names: `input`, wrapped in a request that carries
    /// [`DraConfig::call_timeout`](crate::DraConfig::call_timeout) as its
    /// gRPC deadline, goes to `v1` or to `v1beta1` with that version's
    /// client, which makes the call and converts to and from its messages.
    /// Fails with `DeadlineExceeded` when the call does not finish within
    /// the timeout (see [`kpm_transport::timed_call`]), whatever the driver does
    /// with the deadline.
    async fn dispatch<I, T, V1, V1beta1>(
        &self,
        channel: Result<UdsChannel, tonic::Status>,
        service: DraService,
        input: I,
        v1: impl FnOnce(V1Client, tonic::Request<I>) -> V1,
        v1beta1: impl FnOnce(V1beta1Client, tonic::Request<I>) -> V1beta1,
    ) -> Result<T, tonic::Status>
    where
        V1: Future<Output = Result<T, tonic::Status>>,
        V1beta1: Future<Output = Result<T, tonic::Status>>,
    {
        let timeout = self.shared.config.call_timeout;
        let call = async move {
            let channel = channel?;
            let request = kpm_transport::timed_request(input, timeout);
            match service {
                DraService::V1 => {
                    let client =
                        V1Client::new(channel).max_decoding_message_size(MAX_PLUGIN_MESSAGE_BYTES);
                    v1(client, request).await
                }
                DraService::V1beta1 => {
                    let client = V1beta1Client::new(channel)
                        .max_decoding_message_size(MAX_PLUGIN_MESSAGE_BYTES);
                    v1beta1(client, request).await
                }
            }
        };
        call_with_deadline(call, timeout).await
    }
}

/// Runs `call`, failing with `DeadlineExceeded` when it does not finish
/// within `timeout` (see [`kpm_transport::timed_call`]).
async fn call_with_deadline<T>(
    call: impl Future<Output = Result<T, tonic::Status>>,
    timeout: Duration,
) -> Result<T, tonic::Status> {
    kpm_transport::timed_call(timeout, call).await.map_err(|failed| match failed {
        kpm_transport::TimedCallError::Failed(status) => status,
        kpm_transport::TimedCallError::TimedOut => deadline_exceeded(timeout),
    })
}
