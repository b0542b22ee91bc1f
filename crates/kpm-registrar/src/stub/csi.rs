//! The stub CSI driver.

use std::collections::HashMap;
use std::path::PathBuf;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kpm_api::csi::v1 as csi;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::{Misbehaviour, Misbehaviours};

/// A CSI driver answering `Identity`, `Node.NodeGetInfo` and
/// `Node.NodeGetCapabilities` (no capability).
#[derive(Debug, Clone)]
pub struct StubCsiDriver {
    name: String,
    node_id: String,
    topology: HashMap<String, String>,
    max_volumes: MaxVolumes,
    misbehaviours: Misbehaviours,
    /// `NodeGetInfo` calls so far, for [`Misbehaviour::NodeIdChanges`].
    calls: Arc<AtomicU64>,
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
            misbehaviours: Misbehaviours::default(),
            calls: Arc::default(),
        }
    }

    /// Breaks the rules named, those for CSI drivers; the others are ignored.
    #[must_use]
    pub fn misbehave(mut self, misbehaviours: impl IntoIterator<Item = Misbehaviour>) -> Self {
        self.misbehaviours = Misbehaviours::of(misbehaviours);
        self
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
        let name = if self.misbehaviours.has(Misbehaviour::PluginInfoNameDiffers) {
            format!("other.{}", self.name)
        } else {
            self.name.clone()
        };
        Ok(Response::new(csi::GetPluginInfoResponse {
            name,
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
        if self.misbehaviours.has(Misbehaviour::NoNodeCapabilities) {
            return Err(Status::unimplemented("NodeGetCapabilities"));
        }
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
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let node_id = if self.misbehaviours.has(Misbehaviour::NodeIdChanges) {
            format!("{}-{call}", self.node_id)
        } else {
            self.node_id.clone()
        };
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id,
            max_volumes_per_node,
            accessible_topology,
        }))
    }
}
