//! The stub device plugin: devices whose health the caller controls, and
//! the answers the kubelet's device manager relies on, unless told to
//! misbehave.

use std::collections::BTreeSet;
use std::pin::Pin;

use kpm_api::constants::{DEVICE_HEALTHY, DEVICE_UNHEALTHY};
use kpm_api::deviceplugin::v1beta1 as dp;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::{Stream, StreamExt};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::{Misbehaviour, Misbehaviours};

/// The host device every stub device hands to its container: one that
/// exists on every Linux host.
const HOST_DEVICE: &str = "/dev/null";

/// A device plugin whose device list the caller controls through the
/// [`DeviceList`] returned with it; every change is streamed to the node
/// agent through `ListAndWatch`. `Allocate` hands each device to the
/// container as `/dev/<id>` (the host's `/dev/null`) with
/// `STUB_DEVICES=<ids>`, for listed ids only.
#[derive(Debug, Clone)]
pub struct StubDevicePlugin {
    devices: watch::Receiver<Vec<dp::Device>>,
    options: dp::DevicePluginOptions,
    misbehaviours: Misbehaviours,
}

/// Changes the devices a [`StubDevicePlugin`] reports.
#[derive(Debug, Clone)]
pub struct DeviceList {
    tx: watch::Sender<Vec<dp::Device>>,
}

impl StubDevicePlugin {
    /// A plugin reporting `(id, health)` devices, with no options set.
    pub fn new<'a>(devices: impl IntoIterator<Item = (&'a str, &'a str)>) -> (Self, DeviceList) {
        let (tx, rx) = watch::channel(Vec::new());
        let list = DeviceList { tx };
        list.set(devices);
        let plugin = Self {
            devices: rx,
            options: dp::DevicePluginOptions::default(),
            misbehaviours: Misbehaviours::default(),
        };
        (plugin, list)
    }

    /// Offers `GetPreferredAllocation` (`get_preferred_allocation_available`):
    /// the ids it must include, then the others offered, in order, up to
    /// the size asked.
    #[must_use]
    pub fn preferred_allocation(mut self) -> Self {
        self.options.get_preferred_allocation_available = true;
        self
    }

    /// Asks for `PreStartContainer` before each container starts
    /// (`pre_start_required`), and answers it.
    #[must_use]
    pub fn pre_start_required(mut self) -> Self {
        self.options.pre_start_required = true;
        self
    }

    /// Breaks the rules named, those for device plugins; the others are
    /// ignored. [`Misbehaviour::PreferredIgnoresMustInclude`] and
    /// [`Misbehaviour::PreStartFails`] also set the option they need.
    #[must_use]
    pub fn misbehave(mut self, misbehaviours: impl IntoIterator<Item = Misbehaviour>) -> Self {
        self.misbehaviours = Misbehaviours::of(misbehaviours);
        if self.misbehaviours.has(Misbehaviour::PreferredIgnoresMustInclude) {
            self.options.get_preferred_allocation_available = true;
        }
        if self.misbehaviours.has(Misbehaviour::PreStartFails) {
            self.options.pre_start_required = true;
        }
        self
    }

    /// The `v1beta1.DevicePlugin` service, to serve on the plugin's socket.
    pub fn routes(self) -> Routes {
        Routes::new(dp::device_plugin_server::DevicePluginServer::new(self))
    }

    /// The ids listed now.
    fn listed(&self) -> BTreeSet<String> {
        self.devices.borrow().iter().map(|device| device.id.clone()).collect()
    }

    /// What a container is given for `ids`.
    fn container_response(&self, ids: &[String]) -> dp::ContainerAllocateResponse {
        let missing = self.misbehaviours.has(Misbehaviour::AllocateMissingDevice);
        let devices = ids
            .iter()
            .map(|id| dp::DeviceSpec {
                container_path: format!("/dev/{id}"),
                host_path: if missing {
                    format!("/dev/kpm-stub-missing-{id}")
                } else {
                    HOST_DEVICE.to_owned()
                },
                permissions: "rw".into(),
            })
            .collect();
        dp::ContainerAllocateResponse {
            envs: [("STUB_DEVICES".to_owned(), ids.join(","))].into(),
            devices,
            ..Default::default()
        }
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

    /// Marks the first healthy device unhealthy and returns its id; `None`
    /// when none is healthy.
    pub fn fail_next(&self) -> Option<String> {
        let mut failed = None;
        self.tx.send_if_modified(|devices| {
            let device = devices.iter_mut().find(|device| device.health == DEVICE_HEALTHY);
            failed = device.map(|device| {
                DEVICE_UNHEALTHY.clone_into(&mut device.health);
                device.id.clone()
            });
            failed.is_some()
        });
        failed
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
        Ok(Response::new(self.options))
    }

    async fn list_and_watch(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<DeviceStream>, Status> {
        if self.misbehaviours.has(Misbehaviour::NoDeviceList) {
            return Ok(Response::new(Box::pin(tokio_stream::pending())));
        }
        let duplicate = self.misbehaviours.has(Misbehaviour::DuplicateIds);
        let partial = self.misbehaviours.has(Misbehaviour::PartialUpdates);
        // The current list first, then every change; once nobody controls
        // the list any more, the last one stands until the agent hangs up.
        let mut sent: Option<Vec<dp::Device>> = None;
        let updates = WatchStream::new(self.devices.clone()).map(move |devices| {
            let mut listed = match (&sent, partial) {
                (Some(before), true) => {
                    devices.iter().filter(|device| !before.contains(device)).cloned().collect()
                }
                _ => devices.clone(),
            };
            sent = Some(devices);
            if duplicate {
                listed.extend(listed.clone());
            }
            Ok(dp::ListAndWatchResponse { devices: listed })
        });
        if self.misbehaviours.has(Misbehaviour::StreamEnds) {
            return Ok(Response::new(Box::pin(updates.take(1))));
        }
        Ok(Response::new(Box::pin(updates.chain(tokio_stream::pending()))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        if !self.options.get_preferred_allocation_available {
            return Err(Status::unimplemented("no preferred allocation"));
        }
        let ignore_must_include = self.misbehaviours.has(Misbehaviour::PreferredIgnoresMustInclude);
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|asked| {
                let size = usize::try_from(asked.allocation_size).unwrap_or(0);
                let must =
                    if ignore_must_include { &[][..] } else { &asked.must_include_device_i_ds[..] };
                let mut chosen: Vec<String> = must.to_vec();
                for id in &asked.available_device_i_ds {
                    if chosen.len() >= size {
                        break;
                    }
                    if !chosen.contains(id) {
                        chosen.push(id.clone());
                    }
                }
                dp::ContainerPreferredAllocationResponse { device_i_ds: chosen }
            })
            .collect();
        Ok(Response::new(dp::PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(
        &self,
        request: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        if self.misbehaviours.has(Misbehaviour::AllocateNoResponse) {
            return Ok(Response::new(dp::AllocateResponse::default()));
        }
        let listed = self.listed();
        let mut container_responses = Vec::new();
        for asked in request.into_inner().container_requests {
            let unknown: Vec<&String> =
                asked.devices_ids.iter().filter(|id| !listed.contains(*id)).collect();
            if !unknown.is_empty() && !self.misbehaviours.has(Misbehaviour::AllocateUnknownIds) {
                return Err(Status::invalid_argument(format!("unknown devices {unknown:?}")));
            }
            container_responses.push(self.container_response(&asked.devices_ids));
        }
        Ok(Response::new(dp::AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        _: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        if self.misbehaviours.has(Misbehaviour::PreStartFails) {
            return Err(Status::internal("the stub fails PreStartContainer"));
        }
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}
