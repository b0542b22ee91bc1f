//! A fake CSI driver (feature `csi`): `csi.v1` Identity and Node served by
//! tonic on a real Unix socket, the one every crate's tests use.
//!
//! What a test can set: the driver's name; its `NodeGetInfo` answers, call
//! by call ([`Reply`]: node information, a failure, no answer, or an answer
//! held back until the test lets it go), then a fallback that the test may
//! change while the driver runs; and its `Probe` answer (ready, not ready,
//! or none). What it can read: the `NodeGetInfo` and `Probe` calls so far,
//! and the connections the served driver has open.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kpm_api::csi::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse,
    NodeGetInfoRequest, NodeGetInfoResponse, ProbeRequest, ProbeResponse, Topology,
    identity_server::{Identity, IdentityServer},
    node_server::{Node, NodeServer},
};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::server::Server;
use crate::within;

/// How the fake driver answers one `NodeGetInfo` call.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Answers with this node id, volume limit and topology (no topology
    /// is sent as an absent field, as CSI wants).
    Info {
        /// `node_id`.
        node_id: String,
        /// `max_volumes_per_node`.
        max_volumes: i64,
        /// The accessible topology's segments.
        topology: BTreeMap<String, String>,
    },
    /// Fails with this status.
    Fail(Status),
    /// Never answers.
    Hang,
    /// Waits until the gate is notified, then replies.
    After(Arc<Notify>, Box<Reply>),
}

/// An [`Reply::Info`] reply.
pub fn info(node_id: &str, max_volumes: i64, topology: &[(&str, &str)]) -> Reply {
    Reply::Info {
        node_id: node_id.into(),
        max_volumes,
        topology: topology.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
    }
}

/// The driver: answers its scripted `NodeGetInfo` replies in order, then its
/// fallback for every later call.
#[derive(Debug)]
pub struct FakeCsiDriver {
    name: String,
    script: Mutex<VecDeque<Reply>>,
    fallback: Mutex<Reply>,
    /// `Probe`'s `ready`; `None` never answers.
    ready: Option<bool>,
    calls: watch::Sender<usize>,
    probes: AtomicUsize,
}

impl FakeCsiDriver {
    /// A driver called `name` that answers `script` in order, then
    /// `fallback`; its `Probe` says ready.
    pub fn new(name: &str, script: Vec<Reply>, fallback: Reply) -> Self {
        Self {
            name: name.into(),
            script: Mutex::new(script.into()),
            fallback: Mutex::new(fallback),
            ready: Some(true),
            calls: watch::Sender::new(0),
            probes: AtomicUsize::new(0),
        }
    }

    /// A driver that always answers `NodeGetInfo` with `reply`.
    pub fn always(name: &str, reply: Reply) -> Self {
        Self::new(name, Vec::new(), reply)
    }

    /// `Probe` answers `ready: Some(ready)`, or never answers (`None`).
    #[must_use]
    pub fn probe(mut self, ready: Option<bool>) -> Self {
        self.ready = ready;
        self
    }

    /// The driver's name, as `GetPluginInfo` says it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// From now on, `NodeGetInfo` answers `reply` once the script is done:
    /// a driver whose answer changes while it runs.
    pub fn set_fallback(&self, reply: Reply) {
        *self.fallback.lock() = reply;
    }

    /// The number of `NodeGetInfo` calls so far.
    pub fn calls(&self) -> usize {
        *self.calls.borrow()
    }

    /// The number of `Probe` calls so far.
    pub fn probes(&self) -> usize {
        self.probes.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` `NodeGetInfo` calls have arrived.
    pub async fn wait_for_calls(&self, n: usize) {
        let mut calls = self.calls.subscribe();
        within(format_args!("{n} NodeGetInfo calls arrive"), calls.wait_for(|calls| *calls >= n))
            .await
            .expect("the driver is alive while borrowed");
    }

    /// The driver's Identity and Node services, to serve next to others
    /// (a registration service on the same socket).
    pub fn routes(self: Arc<Self>) -> Routes {
        Routes::new(IdentityServer::from_arc(Arc::clone(&self)))
            .add_service(NodeServer::from_arc(self))
    }

    async fn answer(mut reply: Reply) -> Result<Response<NodeGetInfoResponse>, Status> {
        loop {
            match reply {
                Reply::Info { node_id, max_volumes, topology } => {
                    return Ok(Response::new(NodeGetInfoResponse {
                        node_id,
                        max_volumes_per_node: max_volumes,
                        accessible_topology: (!topology.is_empty())
                            .then(|| Topology { segments: topology.into_iter().collect() }),
                    }));
                }
                Reply::Fail(status) => return Err(status),
                Reply::Hang => std::future::pending::<()>().await,
                Reply::After(gate, then) => {
                    gate.notified().await;
                    reply = *then;
                }
            }
        }
    }
}

#[tonic::async_trait]
impl Identity for FakeCsiDriver {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: "0.1.0".into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse { capabilities: Vec::new() }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        self.probes.fetch_add(1, Ordering::SeqCst);
        let Some(ready) = self.ready else { return std::future::pending().await };
        Ok(Response::new(ProbeResponse { ready: Some(ready) }))
    }
}

#[tonic::async_trait]
impl Node for FakeCsiDriver {
    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities: Vec::new() }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let scripted = self.script.lock().pop_front();
        let reply = scripted.unwrap_or_else(|| self.fallback.lock().clone());
        self.calls.send_modify(|calls| *calls += 1);
        Self::answer(reply).await
    }
}

/// A served fake driver; the server stops when this is dropped.
#[derive(Debug)]
pub struct Served {
    /// The driver, to read its calls or change its answers.
    pub driver: Arc<FakeCsiDriver>,
    /// Where it is served.
    pub socket: PathBuf,
    server: Server,
}

impl Served {
    /// The socket path as a string, the way a registration reports an
    /// endpoint.
    pub fn endpoint(&self) -> String {
        self.socket.display().to_string()
    }

    /// Waits until every connection to the driver has been closed.
    pub async fn wait_until_no_connection_is_open(&self) {
        let mut open = self.server.connections.open.subscribe();
        within("every connection is closed", open.wait_for(|open| *open == 0))
            .await
            .expect("the counter lives as long as `self`");
    }

    /// The number of connections accepted and not yet closed.
    pub fn open_connections(&self) -> usize {
        *self.server.connections.open.borrow()
    }
}

/// Serves `driver` on `socket` (bound on return), on the current runtime.
pub async fn serve(socket: &Path, driver: FakeCsiDriver) -> Served {
    let driver = Arc::new(driver);
    let server = Server::start(socket, Arc::clone(&driver).routes()).await;
    Served { driver, socket: socket.to_path_buf(), server }
}
