//! The container runtime, asked on its socket: a connection for one look.

use std::path::{Path, PathBuf};

use kpm_api::cri::v1 as cri;
use kpm_api::cri::v1::runtime_service_client::RuntimeServiceClient;
use kpm_transport::{Dialer, TransportError};
use tonic::transport::Channel;

use crate::containers::{Containers, Run, RunStatus};

/// The kubelet's `containerRuntimeEndpoint` when it is given none
/// (containerd's socket).
pub const DEFAULT_ENDPOINT: &str = "/run/containerd/containerd.sock";

/// Why the runtime could not be asked, named by the step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PodsError {
    /// Its socket could not be dialed.
    #[error("dial the container runtime at {}: {source}", endpoint.display())]
    Dial {
        /// The runtime's socket, on the host.
        endpoint: PathBuf,
        /// Why.
        #[source]
        source: TransportError,
    },
    /// `ListContainers` failed.
    #[error("list the containers of the runtime at {}: {}", endpoint.display(), status.message())]
    ListContainers {
        /// The runtime's socket, on the host.
        endpoint: PathBuf,
        /// What it answered.
        status: Box<tonic::Status>,
    },
    /// `ContainerStatus` failed for a container other than by its being gone.
    #[error("ask the runtime at {} for container {id}: {}", endpoint.display(), status.message())]
    ContainerStatus {
        /// The runtime's socket, on the host.
        endpoint: PathBuf,
        /// The container.
        id: String,
        /// What it answered.
        status: Box<tonic::Status>,
    },
}

/// A connection to the container runtime, for one look: dropped, it is
/// closed.
#[derive(Debug)]
pub struct Runtime {
    endpoint: PathBuf,
    client: RuntimeServiceClient<Channel>,
}

impl Runtime {
    /// Dials the runtime whose socket is `endpoint` on the host, where
    /// `dialer` sees the host.
    pub async fn connect(dialer: &Dialer, endpoint: &Path) -> Result<Self, PodsError> {
        let channel = dialer
            .grpc(endpoint)
            .await
            .map_err(|source| PodsError::Dial { endpoint: endpoint.to_path_buf(), source })?
            .channel;
        Ok(Self { endpoint: endpoint.to_path_buf(), client: RuntimeServiceClient::new(channel) })
    }

    /// The runtime's socket, on the host.
    pub fn endpoint(&self) -> &Path {
        &self.endpoint
    }

    /// Every container the runtime keeps that the kubelet made, running or
    /// not, without their status.
    pub async fn containers(&mut self) -> Result<Containers, PodsError> {
        let listed = self
            .client
            .list_containers(cri::ListContainersRequest { filter: None })
            .await
            .map_err(|status| PodsError::ListContainers {
                endpoint: self.endpoint.clone(),
                status: Box::new(status),
            })?
            .into_inner();
        Ok(Containers::new(listed.containers.into_iter().filter_map(Run::listed)))
    }

    /// Asks for the status of each of `ids` whose status `containers` does
    /// not hold yet. A container removed since the list (`NotFound`) keeps
    /// none.
    pub async fn load_status<'a>(
        &mut self,
        containers: &mut Containers,
        ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), PodsError> {
        let wanted: Vec<String> = ids
            .into_iter()
            .filter(|id| containers.by_id(id).is_some_and(|run| run.status.is_none()))
            .map(str::to_owned)
            .collect();
        for id in wanted {
            let request = cri::ContainerStatusRequest { container_id: id.clone(), verbose: false };
            match self.client.container_status(request).await {
                Ok(response) => {
                    if let Some(status) = response.into_inner().status {
                        containers.set_status(&id, RunStatus::from_cri(&status));
                    }
                }
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) => {
                    return Err(PodsError::ContainerStatus {
                        endpoint: self.endpoint.clone(),
                        id,
                        status: Box::new(status),
                    });
                }
            }
        }
        Ok(())
    }
}
