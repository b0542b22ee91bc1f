//! A fake container runtime: the CRI's `RuntimeService` on a real Unix
//! socket, answering `ListContainers` and `ContainerStatus` from the
//! containers the test gives it, as containerd answers the kubelet.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kpm_api::cri::v1 as cri;
use parking_lot::Mutex;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::server::Server;

/// A container as the fake runtime keeps it: its full status, from which
/// its entry in the list is made.
#[derive(Debug, Clone, Default)]
pub struct FakeContainer {
    /// Its status, with the kubelet's labels.
    pub status: cri::ContainerStatus,
}

impl FakeContainer {
    /// A run of `container` of pod `namespace/pod` (UID `uid`), as the
    /// kubelet creates it: its labels, its attempt, a log under
    /// `/var/log/pods`.
    pub fn new(
        id: &str,
        (namespace, pod, uid): (&str, &str, &str),
        container: &str,
        attempt: u32,
    ) -> Self {
        let labels = [
            ("io.kubernetes.pod.name", pod),
            ("io.kubernetes.pod.namespace", namespace),
            ("io.kubernetes.pod.uid", uid),
            ("io.kubernetes.container.name", container),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
        Self {
            status: cri::ContainerStatus {
                id: id.to_owned(),
                metadata: Some(cri::ContainerMetadata { name: container.to_owned(), attempt }),
                state: cri::ContainerState::ContainerRunning.into(),
                created_at: 1,
                started_at: 1,
                labels,
                log_path: format!(
                    "/var/log/pods/{namespace}_{pod}_{uid}/{container}/{attempt}.log"
                ),
                ..Default::default()
            },
        }
    }

    /// The run ended with `exit_code` (`reason` as the runtime says it) at
    /// `finished_at` nanoseconds since the epoch.
    #[must_use]
    pub fn exited(mut self, exit_code: i32, reason: &str, finished_at: i64) -> Self {
        self.status.state = cri::ContainerState::ContainerExited.into();
        self.status.exit_code = exit_code;
        reason.clone_into(&mut self.status.reason);
        self.status.finished_at = finished_at;
        self
    }

    /// `host_path` mounted at `container_path`.
    #[must_use]
    pub fn mount(mut self, container_path: &str, host_path: &str) -> Self {
        self.status.mounts.push(cri::Mount {
            container_path: container_path.to_owned(),
            host_path: host_path.to_owned(),
            readonly: false,
        });
        self
    }

    /// `host_path` mounted read-only at `container_path`.
    #[must_use]
    pub fn read_only_mount(mut self, container_path: &str, host_path: &str) -> Self {
        self = self.mount(container_path, host_path);
        if let Some(mount) = self.status.mounts.last_mut() {
            mount.readonly = true;
        }
        self
    }

    fn listed(&self) -> cri::Container {
        let status = &self.status;
        cri::Container {
            id: status.id.clone(),
            pod_sandbox_id: format!(
                "sandbox-of-{}",
                status.labels.get("io.kubernetes.pod.uid").map_or("", String::as_str)
            ),
            metadata: status.metadata.clone(),
            state: status.state,
            created_at: status.created_at,
            labels: status.labels.clone(),
            annotations: status.annotations.clone(),
        }
    }
}

/// The fake runtime's containers and what it was asked.
#[derive(Debug, Default)]
pub struct FakeRuntime {
    /// The containers it keeps; a test may change them between looks.
    pub containers: Mutex<Vec<FakeContainer>>,
    /// `ContainerStatus` calls, by container id.
    pub status_calls: Mutex<Vec<String>>,
    /// `ListContainers` calls.
    pub list_calls: AtomicUsize,
}

/// The fake as tonic serves it.
struct Service(Arc<FakeRuntime>);

#[tonic::async_trait]
impl cri::runtime_service_server::RuntimeService for Service {
    async fn list_containers(
        &self,
        request: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        self.0.list_calls.fetch_add(1, Ordering::SeqCst);
        let filter = request.into_inner().filter.unwrap_or_default();
        let containers = self
            .0
            .containers
            .lock()
            .iter()
            .map(FakeContainer::listed)
            .filter(|listed| filter.id.is_empty() || listed.id == filter.id)
            .filter(|listed| filter.state.is_none_or(|wanted| wanted.state == listed.state))
            .filter(|listed| {
                filter
                    .label_selector
                    .iter()
                    .all(|(key, value)| listed.labels.get(key) == Some(value))
            })
            .collect();
        Ok(Response::new(cri::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        request: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        let request = request.into_inner();
        if request.verbose {
            return Err(Status::invalid_argument("the fake runtime keeps no verbose info"));
        }
        self.0.status_calls.lock().push(request.container_id.clone());
        let found =
            self.0.containers.lock().iter().find(|c| c.status.id == request.container_id).cloned();
        match found {
            Some(container) => {
                Ok(Response::new(cri::ContainerStatusResponse { status: Some(container.status) }))
            }
            None => Err(Status::not_found(format!(
                "an error occurred when try to find container {:?}: not found",
                request.container_id
            ))),
        }
    }
}

/// A served fake runtime; the server stops when this is dropped.
#[derive(Debug)]
pub struct Served {
    /// The runtime, to change its containers or read its calls.
    pub runtime: Arc<FakeRuntime>,
    /// Where it is served.
    pub socket: PathBuf,
    server: Server,
}

impl Served {
    /// The connections to it accepted and not yet closed.
    pub fn open_connections(&self) -> usize {
        *self.server.connections.open.borrow()
    }
}

/// Serves a runtime keeping `containers` on `socket` (bound on return), on
/// the current runtime.
pub async fn serve(socket: &Path, containers: Vec<FakeContainer>) -> Served {
    let runtime =
        Arc::new(FakeRuntime { containers: Mutex::new(containers), ..Default::default() });
    let service =
        cri::runtime_service_server::RuntimeServiceServer::new(Service(Arc::clone(&runtime)));
    let server = Server::start(socket, Routes::new(service)).await;
    Served { runtime, socket: socket.to_path_buf(), server }
}
