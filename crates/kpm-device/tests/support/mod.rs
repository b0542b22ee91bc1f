//! A fake device plugin: `v1beta1.DevicePlugin` served by tonic on a Unix
//! socket in a temp dir, with a device list the test changes through
//! `ListAndWatch` (an mpsc channel per stream), recorded calls, scripted
//! failures, a crash that breaks its connections, and registration through
//! `kubelet.sock` like the kubelet's stub plugin (spec B.7).

// A failed setup fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kpm_api::deviceplugin::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use kpm_api::deviceplugin::v1beta1::registration_client::RegistrationClient;
use kpm_api::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, Empty, ListAndWatchResponse,
    NumaNode, PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, RegisterRequest, TopologyInfo,
};
use kpm_device::{DeviceManager, ResourceStatus};
use kpm_test_support::within;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The shared deadline, for the timeouts the tests configure.
pub use kpm_test_support::DEADLINE;

/// The resource most tests register.
pub const GPU: &str = "vendor.com/gpu";

/// A device with a health and NUMA nodes.
pub fn device(id: &str, health: &str, numa: &[i64]) -> Device {
    Device {
        id: id.into(),
        health: health.into(),
        topology: (!numa.is_empty())
            .then(|| TopologyInfo { nodes: numa.iter().map(|&id| NumaNode { id }).collect() }),
    }
}

/// Healthy devices without topology.
pub fn healthy(ids: &[&str]) -> Vec<Device> {
    ids.iter().map(|id| device(id, "Healthy", &[])).collect()
}

/// How the fake plugin behaves beyond its devices.
#[derive(Clone, Default)]
pub struct Behaviour {
    pub options: DevicePluginOptions,
    /// `GetDevicePluginOptions` fails with this.
    pub options_error: Option<Status>,
    /// `Allocate` fails with this.
    pub allocate_error: Option<Status>,
    /// `Allocate` never answers.
    pub hang_allocate: bool,
}

/// The plugin's state and what it was asked.
pub struct FakePlugin {
    behaviour: Behaviour,
    devices: Mutex<Vec<Device>>,
    streams: Mutex<Vec<mpsc::Sender<Result<ListAndWatchResponse, Status>>>>,
    options_calls: watch::Sender<usize>,
    list_and_watch_calls: watch::Sender<usize>,
    pub allocations: Mutex<Vec<AllocateRequest>>,
    pub preferred: Mutex<Vec<PreferredAllocationRequest>>,
    pub pre_starts: Mutex<Vec<Vec<String>>>,
}

impl FakePlugin {
    pub fn new(devices: Vec<Device>, behaviour: Behaviour) -> Self {
        Self {
            behaviour,
            devices: Mutex::new(devices),
            streams: Mutex::new(Vec::new()),
            options_calls: watch::Sender::new(0),
            list_and_watch_calls: watch::Sender::new(0),
            allocations: Mutex::default(),
            preferred: Mutex::default(),
            pre_starts: Mutex::default(),
        }
    }

    /// Sends a new device list on every open `ListAndWatch` stream.
    pub async fn update(&self, devices: Vec<Device>) {
        self.devices.lock().clone_from(&devices);
        let streams: Vec<_> = self.streams.lock().clone();
        for stream in streams {
            let _ = stream.send(Ok(ListAndWatchResponse { devices: devices.clone() })).await;
        }
    }

    /// Ends every `ListAndWatch` stream cleanly (the plugin returns).
    pub fn end_streams(&self) {
        self.streams.lock().clear();
    }

    /// Ends every `ListAndWatch` stream with an error status.
    pub async fn fail_streams(&self, status: Status) {
        let streams: Vec<_> = std::mem::take(&mut *self.streams.lock());
        for stream in streams {
            let _ = stream.send(Err(status.clone())).await;
        }
    }

    pub fn options_calls(&self) -> usize {
        *self.options_calls.borrow()
    }

    pub fn list_and_watch_calls(&self) -> usize {
        *self.list_and_watch_calls.borrow()
    }

    /// Waits until `ListAndWatch` has been called `n` times.
    pub async fn wait_for_list_and_watch(&self, n: usize) {
        let mut calls = self.list_and_watch_calls.subscribe();
        within(
            format_args!("ListAndWatch is called {n} times"),
            calls.wait_for(|calls| *calls >= n),
        )
        .await
        .unwrap();
    }

    /// `ListAndWatch` streams the node agent still reads.
    pub fn open_streams(&self) -> usize {
        self.streams.lock().iter().filter(|stream| !stream.is_closed()).count()
    }

    /// Waits until the node agent has closed every `ListAndWatch` stream.
    pub async fn wait_until_streams_are_closed(&self) {
        let streams: Vec<_> = self.streams.lock().clone();
        within("the node agent closes every stream", async {
            for stream in streams {
                stream.closed().await;
            }
        })
        .await;
    }
}

#[tonic::async_trait]
impl DevicePlugin for FakePlugin {
    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        self.options_calls.send_modify(|calls| *calls += 1);
        match &self.behaviour.options_error {
            Some(status) => Err(status.clone()),
            None => Ok(Response::new(self.behaviour.options)),
        }
    }

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (sender, receiver) = mpsc::channel(16);
        let devices = self.devices.lock().clone();
        sender.send(Ok(ListAndWatchResponse { devices })).await.unwrap();
        self.streams.lock().push(sender);
        self.list_and_watch_calls.send_modify(|calls| *calls += 1);
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let request = request.into_inner();
        self.preferred.lock().push(request.clone());
        let container_responses = request
            .container_requests
            .into_iter()
            .map(|container| {
                let size = usize::try_from(container.allocation_size).unwrap();
                let mut ids = container.must_include_device_i_ds;
                for id in container.available_device_i_ds {
                    if ids.len() < size && !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let request = request.into_inner();
        self.allocations.lock().push(request.clone());
        if self.behaviour.hang_allocate {
            std::future::pending::<()>().await;
        }
        if let Some(status) = &self.behaviour.allocate_error {
            return Err(status.clone());
        }
        let container_responses = request
            .container_requests
            .into_iter()
            .map(|container| ContainerAllocateResponse {
                envs: HashMap::from([(
                    "VENDOR_DEVICES".to_owned(),
                    container.devices_ids.join(","),
                )]),
                ..ContainerAllocateResponse::default()
            })
            .collect();
        Ok(Response::new(AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        self.pre_starts.lock().push(request.into_inner().devices_ids);
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// A served fake plugin; dropping it crashes it.
pub struct Served {
    pub plugin: Arc<FakePlugin>,
    pub socket: PathBuf,
    /// Second handles of the accepted connections, to break them.
    connections: Arc<Mutex<Vec<std::os::unix::net::UnixStream>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.crash();
    }
}

impl Served {
    /// The socket path as a string, the way the plugin manager passes it.
    pub fn endpoint(&self) -> String {
        self.socket.display().to_string()
    }

    /// The socket's file name, the way a plugin sends it in `Register`.
    pub fn file_name(&self) -> String {
        self.socket.file_name().unwrap().to_str().unwrap().to_owned()
    }

    /// The connections accepted and not broken yet.
    pub fn accepted(&self) -> usize {
        self.connections.lock().len()
    }

    /// Stops the server and breaks every connection, as if the plugin
    /// process died. The socket file stays behind, as it would.
    pub fn crash(&self) {
        self.server.abort();
        for connection in self.connections.lock().drain(..) {
            let _ = connection.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Registers through `kubelet.sock` with this plugin's socket file name,
    /// like the stub plugin.
    pub async fn register(&self, kubelet_sock: &Path, resource: &str) -> Result<(), Status> {
        register(kubelet_sock, request("v1beta1", resource, &self.file_name())).await
    }
}

/// A `RegisterRequest`.
pub fn request(version: &str, resource: &str, endpoint: &str) -> RegisterRequest {
    RegisterRequest {
        version: version.into(),
        endpoint: endpoint.into(),
        resource_name: resource.into(),
        options: Some(DevicePluginOptions::default()),
    }
}

/// Calls `v1beta1.Registration/Register` on `kubelet_sock`.
pub async fn register(kubelet_sock: &Path, request: RegisterRequest) -> Result<(), Status> {
    let dialer = kpm_transport::Dialer::new(kpm_transport::fd::budget().clone(), DEADLINE);
    let channel = dialer.grpc(kubelet_sock).await.unwrap().channel;
    RegistrationClient::new(channel).register(request).await.map(|_| ())
}

/// Serves a fake plugin with `devices` on `dir/file`.
pub async fn serve(dir: &Path, file: &str, devices: Vec<Device>, behaviour: Behaviour) -> Served {
    let socket = dir.join(file);
    let plugin = Arc::new(FakePlugin::new(devices, behaviour));
    let connections = Arc::new(Mutex::new(Vec::new()));
    let tracked = Arc::clone(&connections);
    let incoming = kpm_transport::bind(&socket).await.unwrap().map(move |stream| {
        let stream = stream?;
        let second = stream.as_fd().try_clone_to_owned()?;
        tracked.lock().push(std::os::unix::net::UnixStream::from(second));
        Ok::<_, std::io::Error>(stream)
    });
    let service = DevicePluginServer::from_arc(Arc::clone(&plugin));
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
    });
    Served { plugin, socket, connections, server }
}

/// Waits until `check` holds for the manager's resources, and returns them.
pub async fn wait_until(
    manager: &DeviceManager,
    what: &str,
    check: impl Fn(&[ResourceStatus]) -> bool,
) -> Vec<ResourceStatus> {
    let mut changes = manager.changes();
    let wait = async {
        loop {
            changes.borrow_and_update();
            let resources = manager.resources();
            if check(&resources) {
                return resources;
            }
            changes.changed().await.unwrap();
        }
    };
    let what = kpm_test_support::lazy(|| format!("{what}; resources: {:#?}", manager.resources()));
    within(what, wait).await
}

/// Waits until `resource` exists with `healthy` and `unhealthy` devices.
pub async fn wait_for_counts(
    manager: &DeviceManager,
    resource: &str,
    healthy: usize,
    unhealthy: usize,
) -> ResourceStatus {
    let what = format!("{resource} has {healthy} healthy and {unhealthy} unhealthy devices");
    let resources = wait_until(manager, &what, |resources| {
        resources.iter().any(|status| {
            status.resource == resource
                && status.healthy == healthy
                && status.unhealthy == unhealthy
        })
    })
    .await;
    resources.into_iter().find(|status| status.resource == resource).unwrap()
}

/// The device ids of a resource, in order.
pub fn ids(status: &ResourceStatus) -> Vec<&str> {
    status.devices.iter().map(|device| device.id.as_str()).collect()
}
