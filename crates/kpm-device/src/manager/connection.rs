//! An endpoint's connection, from start to end: dial the plugin's socket
//! and ask its options, follow its `ListAndWatch` stream in a task (each
//! update replaces the resource's devices), lend the open channel to
//! liveness, and report the stream's end. Also the read-only inspection,
//! which opens a connection the same way and reads one list. Kept together
//! because the connection's id ties every later event to it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::time::Duration;

use kpm_api::constants::DEVICE_HEALTHY;
use kpm_api::deviceplugin::v1beta1::{DevicePluginOptions, Empty, ListAndWatchResponse};
use kpm_transport as uds;
use kpm_transport::{Dialer, UdsChannel};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::rpc::{bounded, plugin_client, timed_out};
use super::{DeviceManager, DeviceStatus, shut_down};
use crate::error::{DeviceError, go_code_name};

/// The gRPC path of `v1beta1.DevicePlugin/ListAndWatch`.
const LIST_AND_WATCH: &str = "/v1beta1.DevicePlugin/ListAndWatch";

/// What a device plugin's `GetDevicePluginOptions` and first `ListAndWatch`
/// list say ([`DeviceManager::inspect_endpoint`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DevicePluginReport {
    /// The process serving the socket (`SO_PEERCRED`), if visible from here.
    pub server_pid: Option<u32>,
    /// `pre_start_required` of its options.
    pub pre_start_required: bool,
    /// `get_preferred_allocation_available` of its options.
    pub get_preferred_allocation_available: bool,
    /// Devices in its first list.
    pub devices: usize,
    /// Of those, the healthy ones.
    pub healthy: usize,
    /// The IDs of the healthy ones: the kubelet's device manager records a
    /// resource's healthy devices by ID in its checkpoint, which tells which
    /// resource a plugin on `kubelet.sock` serves.
    pub healthy_ids: BTreeSet<String>,
    /// The ids the first list named more than once: the kubelet keeps one
    /// device per id, so its capacity is smaller than the list.
    pub repeated_ids: BTreeSet<String>,
    /// How long the first list took, from the `ListAndWatch` call.
    pub first_list_took: Duration,
}

/// `N devices, M healthy; pre_start_required=… get_preferred_allocation_available=…`.
impl std::fmt::Display for DevicePluginReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} devices, {} healthy; pre_start_required={} get_preferred_allocation_available={}",
            self.devices,
            self.healthy,
            self.pre_start_required,
            self.get_preferred_allocation_available
        )
    }
}

impl DeviceManager {
    /// The endpoint sockets whose `ListAndWatch` stream ended by itself while
    /// they were current: hints for liveness (see [`Hangups`](kpm_cache::Hangups)).
    pub fn hangups(&self) -> broadcast::Receiver<PathBuf> {
        self.hangups.subscribe()
    }

    /// The open connection to `resource`'s current endpoint, if that is
    /// `socket`: liveness probes a device plugin whose registration socket
    /// is its endpoint over it, instead of dialling.
    pub fn connection(&self, resource: &str, socket: &Path) -> Option<UdsChannel> {
        let state = self.state.lock();
        let current = state.resources.get(resource)?.current.as_ref()?;
        (current.socket == socket && !current.channel.is_closed()).then(|| current.channel.clone())
    }

    /// Connects to the device plugin on `socket` for `resource`: dials it,
    /// asks for its options, makes it the resource's current endpoint
    /// (closing the previous one's stream and cancelling a pending removal)
    /// and starts following its `ListAndWatch` stream in the background.
    /// Returns before the first device list arrives. Nothing is kept on error.
    ///
    /// If `socket` is already the resource's current endpoint, and still the
    /// same socket file, nothing is done: no second connection.
    pub(super) async fn connect(&self, resource: &str, socket: &Path) -> Result<(), DeviceError> {
        let file = self.reach.host().file_id_at(socket);
        let shown = socket.display();
        if self.is_connected(resource, socket, file.as_ref()) {
            debug!(resource, socket = %shown, "device plugin is already connected");
            return Ok(());
        }
        if self.state.lock().closed {
            return Err(shut_down(resource, socket));
        }
        debug!(resource, socket = %shown, "connecting to device plugin");
        let (channel, options) = self.open(resource, socket).await?;
        let Some(id) = self.install(resource, socket, file, options, channel.clone())? else {
            debug!(resource, socket = %shown, "device plugin was connected meanwhile");
            return Ok(());
        };
        let task = tokio::spawn(watch_devices(
            self.this.clone(),
            resource.to_owned(),
            socket.to_path_buf(),
            id,
            channel,
        ));
        self.attach_stream(resource, id, task);
        info!(
            resource,
            socket = %shown,
            pre_start_required = options.pre_start_required,
            get_preferred_allocation_available = options.get_preferred_allocation_available,
            "device plugin connected"
        );
        Ok(())
    }

    /// What registering the device plugin serving `socket` as `resource`
    /// would see, read-only: its options and its first device list, each
    /// call within the configured timeout; the connection is closed
    /// afterwards.
    pub async fn inspect_endpoint(
        &self,
        resource: &str,
        socket: &Path,
    ) -> Result<DevicePluginReport, DeviceError> {
        let (channel, options) = self.open(resource, socket).await?;
        let server_pid = channel.peer_pid();
        let timeout = self.config.call_timeout;
        let asked = Instant::now();
        let first = async { list_and_watch(channel).await?.message().await };
        let failed = |reason: String| DeviceError::ListAndWatch {
            resource: resource.to_owned(),
            socket: socket.to_path_buf(),
            reason,
        };
        let list = match tokio::time::timeout(timeout, first).await {
            Err(_) => return Err(timed_out("ListAndWatch", resource, socket, timeout)),
            Ok(Err(status)) => return Err(failed(rpc_error(&status))),
            Ok(Ok(None)) => return Err(failed("the stream ended before the first list".into())),
            Ok(Ok(Some(list))) => list,
        };
        let first_list_took = asked.elapsed();
        let mut seen = BTreeSet::new();
        let repeated_ids = list
            .devices
            .iter()
            .filter(|device| !seen.insert(&device.id))
            .map(|device| device.id.clone())
            .collect();
        let healthy_ids: BTreeSet<String> = list
            .devices
            .iter()
            .filter(|device| device.health == DEVICE_HEALTHY)
            .map(|device| device.id.clone())
            .collect();
        Ok(DevicePluginReport {
            server_pid,
            pre_start_required: options.pre_start_required,
            get_preferred_allocation_available: options.get_preferred_allocation_available,
            devices: list.devices.len(),
            healthy: healthy_ids.len(),
            healthy_ids,
            repeated_ids,
            first_list_took,
        })
    }

    /// Dials the device plugin at `socket` and asks its options.
    async fn open(
        &self,
        resource: &str,
        socket: &Path,
    ) -> Result<(UdsChannel, DevicePluginOptions), DeviceError> {
        // A connection of its own, without tonic's `Channel`: it is held for
        // as long as the plugin is registered, and its buffers are most of
        // kpm's memory with many plugins (docs/performance.md).
        let dialer = Dialer::new(self.reach.clone(), self.config.dial_timeout);
        let channel = dialer.kept(socket).await.map_err(|source| DeviceError::Dial {
            resource: resource.to_owned(),
            socket: socket.to_path_buf(),
            source,
        })?;
        let mut client = plugin_client(channel.clone());
        let timeout = self.config.call_timeout;
        let options = bounded(
            client.get_device_plugin_options(uds::timed_request(Empty {}, timeout)),
            timeout,
            || timed_out("GetDevicePluginOptions", resource, socket, timeout),
            |status| DeviceError::GetDevicePluginOptions {
                resource: resource.to_owned(),
                socket: socket.to_path_buf(),
                status,
            },
        )
        .await?;
        Ok((channel, options))
    }

    /// Hands the `ListAndWatch` task to endpoint `id`, or aborts it if that
    /// endpoint is no longer current.
    fn attach_stream(&self, resource: &str, id: u64, task: JoinHandle<()>) {
        let mut state = self.state.lock();
        match state.resources.get_mut(resource).and_then(|entry| entry.current.as_mut()) {
            Some(current) if current.id == id => current.stream = Some(task),
            _ => task.abort(),
        }
    }

    /// A `ListAndWatch` update of endpoint `id`: replaces the resource's
    /// devices. Returns false if `id` is not the current endpoint any more.
    pub(super) fn update_devices(
        &self,
        resource: &str,
        id: u64,
        update: ListAndWatchResponse,
    ) -> bool {
        let mut state = self.state.lock();
        let Some(entry) = state.resources.get_mut(resource) else { return false };
        let Some(current) = entry.current.as_ref().filter(|current| current.id == id) else {
            return false;
        };
        let socket = current.socket.display().to_string();
        entry.devices = update
            .devices
            .into_iter()
            .map(|device| {
                let mut numa_nodes: Vec<i64> = device
                    .topology
                    .map(|topology| topology.nodes.iter().map(|node| node.id).collect())
                    .unwrap_or_default();
                numa_nodes.sort_unstable();
                numa_nodes.dedup();
                (
                    device.id.clone(),
                    DeviceStatus { id: device.id, health: device.health, numa_nodes },
                )
            })
            .collect();
        let (healthy, unhealthy) = entry.counts();
        drop(state);
        debug!(resource, socket, healthy, unhealthy, "ListAndWatch update");
        self.changed();
        true
    }

    /// Endpoint `id`'s stream ended: if it is still current, its devices go
    /// unhealthy at once and the grace period starts.
    pub(super) fn endpoint_gone(&self, resource: &str, id: u64, reason: &str) {
        let mut state = self.state.lock();
        let closed = state.closed;
        let Some(entry) = state.resources.get_mut(resource) else { return };
        // The stream handle is the calling task's own: dropping it detaches.
        let Some(endpoint) = entry.current.take_if(|current| current.id == id) else {
            debug!(resource, reason, "stream of a replaced endpoint ended");
            return;
        };
        entry.mark_unhealthy();
        if !closed {
            self.schedule_removal(resource, entry);
        }
        drop(state);
        warn!(
            resource,
            socket = %endpoint.socket.display(),
            reason,
            grace_period = ?self.config.grace_period,
            "device plugin endpoint went away; its devices are unhealthy until it registers again"
        );
        self.hangups.report(endpoint.socket);
        self.changed();
    }
}

/// Follows endpoint `id`'s `ListAndWatch` stream until it ends or the
/// endpoint is replaced (then this task is aborted).
async fn watch_devices(
    manager: Weak<DeviceManager>,
    resource: String,
    socket: PathBuf,
    id: u64,
    channel: UdsChannel,
) {
    let reason = match list_and_watch(channel).await {
        Err(status) => format!("ListAndWatch failed: {}", rpc_error(&status)),
        Ok(mut stream) => loop {
            match stream.message().await {
                Ok(Some(update)) => {
                    let Some(manager) = manager.upgrade() else { return };
                    if !manager.update_devices(&resource, id, update) {
                        return;
                    }
                }
                Ok(None) => break "the plugin ended the ListAndWatch stream".to_owned(),
                Err(status) => {
                    break format!("ListAndWatch stream broke: {}", rpc_error(&status));
                }
            }
        },
    };
    debug!(resource, socket = %socket.display(), reason, "ListAndWatch ended");
    if let Some(manager) = manager.upgrade() {
        manager.endpoint_gone(&resource, id, &reason);
    }
}

/// Opens the `ListAndWatch` stream. Not through the generated client: its
/// codec's 8 KiB decode buffer would be held for as long as the stream, one
/// per plugin, for messages of a few hundred bytes.
async fn list_and_watch(
    channel: UdsChannel,
) -> Result<tonic::codec::Streaming<ListAndWatchResponse>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(kpm_api::constants::MAX_PLUGIN_MESSAGE_BYTES);
    grpc.ready().await.map_err(|err| tonic::Status::unavailable(err.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(LIST_AND_WATCH);
    let codec = uds::SmallBufferCodec::<Empty, ListAndWatchResponse>::default();
    let response = grpc.server_streaming(tonic::Request::new(Empty {}), path, codec).await?;
    Ok(response.into_inner())
}

/// `rpc error: code = .. desc = ..`, as grpc-go prints a status.
fn rpc_error(status: &tonic::Status) -> String {
    format!("rpc error: code = {} desc = {}", go_code_name(status.code()), status.message())
}
