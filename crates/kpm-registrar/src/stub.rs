//! Stub plugin services: just enough of each plugin type's own gRPC service
//! for a node agent to accept the plugin. Used by the example plugin,
//! `kpm demo` and tests; serve them next to the registration service with
//! [`RegistrarBuilder::routes`](crate::RegistrarBuilder::routes) or on their
//! own socket.

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;

use kpm_api::PluginKind;
use kpm_api::constants::DEVICE_HEALTHY;
use kpm_api::csi::v1 as csi;
use kpm_api::deviceplugin::v1beta1 as dp;
use kpm_api::dra::{v1 as dra_v1, v1beta1 as dra_v1beta1};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::{Stream, StreamExt};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// The stub service of `plugin_type` for a plugin called `name`: a device
/// plugin with two healthy devices, a CSI driver (Identity and Node, node id
/// `example-node`), or a DRA driver (v1 and v1beta1). Empty routes for other types.
pub fn routes(plugin_type: &str, name: &str) -> Routes {
    match PluginKind::from_plugin_type(plugin_type) {
        Some(PluginKind::Device) => {
            let (plugin, _devices) =
                StubDevicePlugin::new([("dev-0", DEVICE_HEALTHY), ("dev-1", DEVICE_HEALTHY)]);
            plugin.routes()
        }
        Some(PluginKind::Csi) => StubCsiDriver::new(name, "example-node").routes(),
        Some(PluginKind::Dra) => StubDraDriver.routes(),
        None => Routes::default(),
    }
}

// === Device plugin ===

/// A device plugin whose device list the caller controls through the
/// [`DeviceList`] returned with it; every change is streamed to the node
/// agent through `ListAndWatch`.
#[derive(Debug, Clone)]
pub struct StubDevicePlugin {
    devices: watch::Receiver<Vec<dp::Device>>,
}

/// Changes the devices a [`StubDevicePlugin`] reports.
#[derive(Debug, Clone)]
pub struct DeviceList {
    tx: watch::Sender<Vec<dp::Device>>,
}

impl StubDevicePlugin {
    /// A plugin reporting `(id, health)` devices.
    pub fn new<'a>(devices: impl IntoIterator<Item = (&'a str, &'a str)>) -> (Self, DeviceList) {
        let (tx, rx) = watch::channel(Vec::new());
        let list = DeviceList { tx };
        list.set(devices);
        (Self { devices: rx }, list)
    }

    /// The `v1beta1.DevicePlugin` service, to serve on the plugin's socket.
    pub fn routes(self) -> Routes {
        Routes::new(dp::device_plugin_server::DevicePluginServer::new(self))
    }
}

impl DeviceList {
    /// Replaces the reported devices with `(id, health)` pairs.
    pub fn set<'a>(&self, devices: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let devices = devices
            .into_iter()
            .map(|(id, health)| dp::Device { id: id.into(), health: health.into(), topology: None })
            .collect();
        self.tx.send_replace(devices);
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for StubDevicePlugin {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(dp::DevicePluginOptions::default()))
    }

    async fn list_and_watch(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<DeviceStream>, Status> {
        // The current list first, then every change; once nobody controls
        // the list any more, the last one stands until the agent hangs up.
        let updates = WatchStream::new(self.devices.clone())
            .map(|devices| Ok(dp::ListAndWatchResponse { devices }));
        let stream = updates.chain(tokio_stream::pending());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("no preferred allocation"))
    }

    async fn allocate(
        &self,
        request: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let containers = request.into_inner().container_requests.len();
        let container_responses = vec![dp::ContainerAllocateResponse::default(); containers];
        Ok(Response::new(dp::AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        _: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

// === CSI driver ===

/// A CSI driver answering `Identity` and `Node.NodeGetInfo`.
#[derive(Debug, Clone)]
pub struct StubCsiDriver {
    name: String,
    node_id: String,
    topology: HashMap<String, String>,
    max_volumes: MaxVolumes,
}

/// Where the stub's `max_volumes_per_node` comes from.
#[derive(Debug, Clone)]
enum MaxVolumes {
    Fixed(i64),
    /// Read at every `NodeGetInfo`, so that the limit can change while it runs.
    File(PathBuf),
}

impl StubCsiDriver {
    /// A driver called `name` that reports `node_id` in `NodeGetInfo`, with
    /// no accessible topology and no volume limit.
    pub fn new(name: impl Into<String>, node_id: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            node_id: node_id.into(),
            topology: HashMap::new(),
            max_volumes: MaxVolumes::Fixed(0),
        }
    }

    /// Adds the segment `key`=`value` to the accessible topology reported in
    /// `NodeGetInfo`; a later value for the same key replaces the earlier.
    #[must_use]
    pub fn topology(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.topology.insert(key.into(), value.into());
        self
    }

    /// Reports `max_volumes` as `max_volumes_per_node` in `NodeGetInfo`
    /// (0, the default, means no limit).
    #[must_use]
    pub fn max_volumes(mut self, max_volumes: i64) -> Self {
        self.max_volumes = MaxVolumes::Fixed(max_volumes);
        self
    }

    /// Reports the number in the file at `path` (surrounding whitespace
    /// ignored), read at every `NodeGetInfo`: a driver whose volume limit
    /// changes while it runs, for the allocatable count's refresh. An
    /// unreadable file or another content fails the call as `Unavailable`.
    #[must_use]
    pub fn max_volumes_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.max_volumes = MaxVolumes::File(path.into());
        self
    }

    /// The CSI `Identity` and `Node` services, to serve on the driver's socket.
    pub fn routes(self) -> Routes {
        Routes::new(csi::identity_server::IdentityServer::new(self.clone()))
            .add_service(csi::node_server::NodeServer::new(self))
    }
}

#[tonic::async_trait]
impl csi::identity_server::Identity for StubCsiDriver {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl csi::node_server::Node for StubCsiDriver {
    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::NodeGetCapabilitiesResponse::default()))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        let max_volumes_per_node = match &self.max_volumes {
            MaxVolumes::Fixed(max) => *max,
            MaxVolumes::File(path) => {
                let unavailable = |reason: String| {
                    Status::unavailable(format!("max volumes from {}: {reason}", path.display()))
                };
                let text = tokio::fs::read_to_string(path)
                    .await
                    .map_err(|err| unavailable(err.to_string()))?;
                text.trim().parse().map_err(|_| unavailable(format!("{text:?} is not a number")))?
            }
        };
        // CSI: no topology is reported as an absent field, not an empty one.
        let accessible_topology =
            (!self.topology.is_empty()).then(|| csi::Topology { segments: self.topology.clone() });
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node,
            accessible_topology,
        }))
    }
}

// === DRA driver ===

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
