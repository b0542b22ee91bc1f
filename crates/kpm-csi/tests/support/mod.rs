//! A fake CSI driver: `csi.v1` Identity and Node served by tonic on a Unix
//! socket in a temp dir, with NodeGetInfo answers scripted call by call, and
//! a count of the connections it has open.

// A failed setup fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(dead_code, reason = "each test binary uses a part of the fake driver")]

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use kpm_api::csi::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse,
    NodeGetInfoRequest, NodeGetInfoResponse, ProbeRequest, ProbeResponse, Topology,
    identity_server::{Identity, IdentityServer},
    node_server::{Node, NodeServer},
};
use kpm_test_support::within;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, watch};
use tokio_stream::StreamExt as _;
use tonic::{Request, Response, Status};

/// How the fake driver answers one NodeGetInfo call.
#[derive(Clone)]
pub(crate) enum Reply {
    /// Answers with this node id, volume limit and topology.
    Info { node_id: String, max_volumes: i64, topology: BTreeMap<String, String> },
    /// Fails with this status.
    Fail(Status),
    /// Never answers.
    Hang,
    /// Waits until the gate is notified, then replies.
    After(Arc<Notify>, Box<Reply>),
}

/// An `Info` reply.
pub(crate) fn info(node_id: &str, max_volumes: i64, topology: &[(&str, &str)]) -> Reply {
    Reply::Info {
        node_id: node_id.into(),
        max_volumes,
        topology: topology.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
    }
}

/// The driver: answers scripted replies in order, then `fallback` forever.
pub(crate) struct FakeDriver {
    name: String,
    script: Mutex<VecDeque<Reply>>,
    fallback: Reply,
    calls: watch::Sender<usize>,
}

impl FakeDriver {
    pub(crate) fn new(name: &str, script: Vec<Reply>, fallback: Reply) -> Self {
        Self {
            name: name.into(),
            script: Mutex::new(script.into()),
            fallback,
            calls: watch::Sender::new(0),
        }
    }

    /// A driver that always answers with `reply`.
    pub(crate) fn always(name: &str, reply: Reply) -> Self {
        Self::new(name, Vec::new(), reply)
    }

    /// The number of NodeGetInfo calls so far.
    pub(crate) fn calls(&self) -> usize {
        *self.calls.borrow()
    }

    /// Waits until at least `n` NodeGetInfo calls have arrived.
    pub(crate) async fn wait_for_calls(&self, n: usize) {
        let mut calls = self.calls.subscribe();
        within(format_args!("{n} NodeGetInfo calls arrive"), calls.wait_for(|calls| *calls >= n))
            .await
            .unwrap();
    }

    async fn answer(reply: Reply) -> Result<Response<NodeGetInfoResponse>, Status> {
        let mut reply = reply;
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
impl Identity for FakeDriver {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: "0.1.0".into(),
            manifest: std::collections::HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse { capabilities: Vec::new() }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for FakeDriver {
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
        let reply = self.script.lock().pop_front().unwrap_or_else(|| self.fallback.clone());
        self.calls.send_modify(|calls| *calls += 1);
        Self::answer(reply).await
    }
}

/// A served fake driver; the server stops when this is dropped.
pub(crate) struct Served {
    pub(crate) driver: Arc<FakeDriver>,
    pub(crate) socket: PathBuf,
    open: Arc<watch::Sender<usize>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Served {
    /// The socket path as a string, the way a plugin reports its endpoint.
    pub(crate) fn endpoint(&self) -> String {
        self.socket.display().to_string()
    }

    /// Waits until every connection to the driver has been closed.
    pub(crate) async fn wait_until_no_connection_is_open(&self) {
        let mut open = self.open.subscribe();
        within("every connection is closed", open.wait_for(|open| *open == 0)).await.unwrap();
    }

    /// The number of connections accepted and not yet closed.
    pub(crate) fn open_connections(&self) -> usize {
        *self.open.borrow()
    }
}

/// Serves `driver` on `dir/file`.
pub(crate) async fn serve(dir: &Path, file: &str, driver: FakeDriver) -> Served {
    let socket = dir.join(file);
    let driver = Arc::new(driver);
    let open = Arc::new(watch::Sender::new(0_usize));
    let counter = Arc::clone(&open);
    let incoming = kpm_transport::bind(&socket).await.unwrap().map(move |stream| {
        stream.map(|inner| {
            counter.send_modify(|open| *open += 1);
            Tracked { inner, open: Arc::clone(&counter) }
        })
    });
    let identity = IdentityServer::from_arc(Arc::clone(&driver));
    let node = NodeServer::from_arc(Arc::clone(&driver));
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(identity)
            .add_service(node)
            .serve_with_incoming(incoming)
            .await;
    });
    Served { driver, socket, open, server }
}

/// A server-side connection that counts itself out when the server drops it.
struct Tracked {
    inner: kpm_transport::Connection,
    open: Arc<watch::Sender<usize>>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.open.send_modify(|open| *open -= 1);
    }
}

impl tonic::transport::server::Connected for Tracked {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
