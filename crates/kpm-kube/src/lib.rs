//! Publishes what the kubelet publishes about a node's plugins through the
//! Kubernetes API, with kube-rs, and keeps it true:
//!
//! - **CSI** ([`KubeNodeInfo`], a `kpm_csi::NodeInfoSink`): the Node's
//!   `csi.volume.kubernetes.io/nodeid` annotation and topology labels, and
//!   the CSINode named after the node (owned by the Node) with one
//!   `spec.drivers[]` entry per driver. A failure fails the registration,
//!   as in the kubelet: the driver is told why and retried with backoff.
//! - **Device plugins** ([`KubePublisher::publish_capacity`]): the Node's
//!   `status.capacity` (all devices) and `status.allocatable` (healthy
//!   ones) per extended resource; a resource removed after its grace period
//!   is published as zero, then removed. Patches are at most one per
//!   [`KubeConfig::capacity_interval`]; a failure never fails a
//!   registration.
//! - **DRA** ([`KubeSliceCleanup`], a `kpm_dra::SliceCleanup`): the
//!   deletion of a driver's ResourceSlices on this node once no instance
//!   has stayed connected for the grace period, and the drivers with slices
//!   of this node at start, whose slices go the same way unless they
//!   register within the grace period.
//! - **An earlier run's leftovers.** After a restart the kubelet restores
//!   its device resources from its checkpoint (published at zero until
//!   their plugins register again), and a CSINode entry whose driver never
//!   comes back stays for good (kubernetes #94388). kpm keeps no
//!   checkpoint; it reads at start what its field manager owns on the Node
//!   and the CSINode (`metadata.managedFields`, entries of manager
//!   [`FIELD_MANAGER`] that no other manager shares) and removes what no
//!   plugin registers within a grace period. Device resources
//!   ([`KubePublisher::publish_capacity`]) keep the counts the Node shows
//!   until the device manager has devices for them, so nothing flaps when
//!   the plugin comes back; after the device grace period (5 min, from the
//!   start) the others leave as any resource whose plugin went away: zero,
//!   then removed. CSI drivers ([`KubePublisher::clean_up_csi_leftovers`])
//!   not in the CSI handler's store after [`KubeConfig::csi_cleanup_grace`]
//!   (30 s) are withdrawn as a deregistration withdraws them: the CSINode
//!   entry and the node-id annotation entry; topology labels stay, as the
//!   kubelet never removes them. The annotation is one field for every
//!   driver, so a driver's entry there is kpm's when its CSINode entry is
//!   (or, when kpm owns the annotation, when the driver has no CSINode
//!   entry at all). A read kpm is not allowed is logged once and that
//!   clean-up skipped; a missing Node has nothing left on it.
//! - **Reading** ([`observe_node`]): what the API server shows of a node
//!   (CSINode drivers, the node-id annotation, capacity and allocatable,
//!   the drivers with ResourceSlices there), for `kpm doctor`.
//!
//! # Kept true
//!
//! The publishers only set what each object should hold; one reconcile
//! loop, spawned by [`KubePublisher::new`], compares it with what the API
//! server holds and writes the difference, and nothing when there is none.
//! While the two differ it tries again, at most 5 s apart, without end, and
//! a watch of the Node and the CSINode wakes it when another writer changes
//! them or the API server is back. The kubelet gives up after four attempts
//! (its `updateBackoff`), so a deregistration during an API server outage is
//! lost; kpm keeps those four attempts for a CSI registration's answer, and
//! goes on after them. [`KubePublisher::status`] lists what is still
//! pending ([`PendingPublication`]).
//!
//! Every write names [`FIELD_MANAGER`]. Objects shared with other writers
//! are written back with the `resourceVersion` read, so that a concurrent
//! write makes kpm start again from a fresh read instead of losing the
//! other writer's entries; the device capacity patch names only kpm's
//! resources. kpm never creates the Node: while it is missing, what kpm
//! would publish there waits.
//!
//! [`KubePublisher::status`] also reports, per [`ObjectKind`], the last
//! successful sync and the last error, and counts API requests by verb,
//! resource and outcome.
//!
//! Every request but the watches goes through one door, which bounds it in
//! time and counts it. A clean-up removes only what kpm alone owns, and
//! labels are never removed. The crate has one retry schedule: kpm-api's
//! backoff from 10 ms, ×5, with 10 % jitter, capped at 5 s.
//!
//! This crate leaves the choice of the k8s-openapi version feature to the
//! binary, as kube-rs advises (`kpm-cli` takes `v1_34`, the first with
//! `resource.k8s.io/v1`). Built alone (or `kpm` with `kube`), it needs
//! `K8S_OPENAPI_ENABLED_VERSION=1.34`, which `cargo xtask ci`'s packaging
//! and the docs.rs metadata set.
//!
//! `tests/reconcile.rs` runs the loop against kpm-test-support's stand-in API
//! server (objects, `resourceVersion`s, watches, an outage) on paused time,
//! `tests/requests.rs` pins the requests literally, and `cargo xtask
//! kube-e2e` runs kpm against a real kube-apiserver.

#![deny(missing_docs)]

mod api;
mod backoff;
mod capacity;
mod csi_drivers;
mod desired;
mod error;
mod leftovers;
mod managed_fields;
mod node_info;
mod observe;
mod reconcile;
mod slices;
mod status;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kpm_api::config::check_durations;
use kpm_device::DeviceView;

use tokio_util::task::AbortOnDropHandle;

use crate::api::NodeApi;
use crate::desired::Books;
pub use crate::error::KubeError;
pub use crate::node_info::KubeNodeInfo;
pub use crate::observe::{NodeObjects, NodeResources, observe_node};
pub use crate::slices::KubeSliceCleanup;
pub use crate::status::{
    KubeStatus, ObjectKind, ObjectSync, PendingPublication, RequestCount, SyncError,
};
pub use kube::Client;

/// The field manager of every write kpm makes.
pub const FIELD_MANAGER: &str = "kpm";

/// How long one API request may take by default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = kpm_api::constants::API_REQUEST_TIMEOUT;
/// The shortest time between two device-capacity patches by default.
pub const DEFAULT_CAPACITY_INTERVAL: Duration = Duration::from_millis(500);
/// How long the CSI drivers an earlier run published have to register by
/// default before they are withdrawn: the DRA manager's grace for the same
/// situation, 30 s.
pub const DEFAULT_CSI_CLEANUP_GRACE: Duration = Duration::from_secs(30);

/// Settings of the publishers. Build it from [`Default`] with the setters;
/// the fields are public to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct KubeConfig {
    /// How long one API request may take (a CSI registration waits for up
    /// to four passes of the reconcile loop, each of a few requests).
    /// Default 10 s.
    pub request_timeout: Duration,
    /// The shortest time between two device-capacity patches: changes in
    /// between are published together by the next one. Default 500 ms.
    pub capacity_interval: Duration,
    /// How long after the start a CSI driver an earlier run published has
    /// to register before kpm withdraws it as a deregistration would
    /// ([`KubePublisher::clean_up_csi_leftovers`]). Default 30 s, the DRA
    /// manager's grace for drivers that published before a restart: a
    /// driver whose socket is in the registry at start is found by the
    /// watcher's first walk and counts as registered from the start of its
    /// `RegisterPlugin` (before `NodeGetInfo`), so it makes it within a
    /// second or two, or after some five retries when it is slow to answer.
    pub csi_cleanup_grace: Duration,
}

impl Default for KubeConfig {
    fn default() -> Self {
        Self {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            capacity_interval: DEFAULT_CAPACITY_INTERVAL,
            csi_cleanup_grace: DEFAULT_CSI_CLEANUP_GRACE,
        }
    }
}

impl KubeConfig {
    /// Sets [`request_timeout`](Self::request_timeout) (default
    /// [`DEFAULT_REQUEST_TIMEOUT`], 10 s).
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`capacity_interval`](Self::capacity_interval) (default
    /// [`DEFAULT_CAPACITY_INTERVAL`], 500 ms).
    #[must_use]
    pub fn capacity_interval(mut self, interval: Duration) -> Self {
        self.capacity_interval = interval;
        self
    }

    /// Sets [`csi_cleanup_grace`](Self::csi_cleanup_grace) (default
    /// [`DEFAULT_CSI_CLEANUP_GRACE`], 30 s).
    #[must_use]
    pub fn csi_cleanup_grace(mut self, grace: Duration) -> Self {
        self.csi_cleanup_grace = grace;
        self
    }

    /// Checks the ranges: `request_timeout` non-zero, all at most
    /// [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION).
    pub fn validate(&self) -> Result<(), KubeError> {
        Ok(check_durations(
            &[("request_timeout", self.request_timeout)],
            &[
                ("capacity_interval", self.capacity_interval),
                ("csi_cleanup_grace", self.csi_cleanup_grace),
            ],
        )?)
    }
}

/// The Kubernetes publishers of one node, sharing one client, one desired
/// state and the one reconcile loop that writes it. Cheap to clone; the
/// loop stops when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct KubePublisher {
    api: Arc<NodeApi>,
    books: Arc<Books>,
    node_info: Arc<KubeNodeInfo>,
    _reconciler: Arc<AbortOnDropHandle<()>>,
}

impl KubePublisher {
    /// Publishers for Node `node_name` through `client`, and their
    /// reconcile loop, spawned on the current tokio runtime. Fails on an
    /// invalid config, a node name that is not a Kubernetes object name, or
    /// outside a tokio runtime.
    pub fn new(
        client: Client,
        node_name: impl Into<String>,
        config: KubeConfig,
    ) -> Result<Self, KubeError> {
        config.validate()?;
        let node = node_name.into();
        check_node_name(&node)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(KubeError::NoRuntime)?;
        let api = NodeApi::new(client, node, config);
        let books = Arc::new(Books::default());
        let reconciler = runtime.spawn(reconcile::run(Arc::clone(&api), Arc::clone(&books)));
        Ok(Self {
            node_info: Arc::new(KubeNodeInfo::new(Arc::clone(&books))),
            _reconciler: Arc::new(AbortOnDropHandle::new(reconciler)),
            api,
            books,
        })
    }

    /// The Node's name.
    pub fn node_name(&self) -> &str {
        &self.api.node
    }

    /// The CSI handler's sink: the Node's annotation and labels, the
    /// CSINode. The same sink every time.
    pub fn node_info(&self) -> Arc<KubeNodeInfo> {
        Arc::clone(&self.node_info)
    }

    /// Withdraws the CSI drivers an earlier run published (the CSINode
    /// entries kpm owns, with their node-id annotation entries) that are
    /// not in `drivers`, the CSI handler's store, once
    /// [`KubeConfig::csi_cleanup_grace`] has passed since the start; each as
    /// its deregistration would, through [`node_info`](Self::node_info),
    /// whose writes it waits for. Spawn it at start, with the handler
    /// that publishes through `node_info`; abort it to stop.
    pub fn clean_up_csi_leftovers(
        &self,
        drivers: Arc<kpm_csi::CsiDrivers>,
    ) -> impl Future<Output = ()> + Send + 'static {
        leftovers::clean_up_csi(Arc::clone(&self.api), Arc::clone(&self.node_info), drivers)
    }

    /// The DRA manager's cleanup: the node's ResourceSlices of gone drivers.
    pub fn slice_cleanup(&self) -> Arc<KubeSliceCleanup> {
        Arc::new(KubeSliceCleanup::new(Arc::clone(&self.api), Arc::clone(&self.books)))
    }

    /// Publishes the resources of `devices` on the Node's status for as
    /// long as the returned future runs; spawn it at start, abort it to
    /// stop. It only reads the device manager. The resources an earlier
    /// run published are kept until the device manager has them, and
    /// removed once its grace period has passed since the start without.
    pub fn publish_capacity(
        &self,
        devices: DeviceView,
    ) -> impl Future<Output = ()> + Send + 'static {
        capacity::publish(Arc::clone(&self.api), Arc::clone(&self.books), devices)
    }

    /// Follows the cluster's CSIDriver objects for as long as the returned
    /// future runs, giving each driver's `nodeAllocatableUpdatePeriodSeconds`
    /// to `periods` (the CSI handler's
    /// [`allocatable_update_periods`](kpm_csi::CsiHandler::allocatable_update_periods)).
    pub fn follow_csi_drivers(
        &self,
        periods: kpm_csi::AllocatableUpdatePeriods,
    ) -> impl Future<Output = ()> + Send + 'static {
        csi_drivers::follow(Arc::clone(&self.api), periods)
    }

    /// What the publishers did so far, and what the API server does not
    /// hold yet.
    pub fn status(&self) -> KubeStatus {
        self.api.status(self.books.pending())
    }
}

/// A client from the kubeconfig file at `path` (its current context).
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client, KubeError> {
    let load = |source: Box<dyn std::error::Error + Send + Sync>| KubeError::LoadKubeconfig {
        path: path.to_owned(),
        source,
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|err| load(err.into()))?;
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|err| load(err.into()))?;
    Client::try_from(config).map_err(KubeError::BuildClient)
}

/// A client from the pod's service account, when running in a pod
/// (`KUBERNETES_SERVICE_HOST` is set); `None` elsewhere.
pub fn in_cluster_client() -> Result<Option<Client>, KubeError> {
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
        return Ok(None);
    }
    let config = kube::Config::incluster().map_err(KubeError::InClusterConfig)?;
    Client::try_from(config).map(Some).map_err(KubeError::BuildClient)
}

/// A Node name is a DNS subdomain: at most 253 characters of lower-case
/// alphanumerics, `-` and `.`, starting and ending with an alphanumeric.
fn check_node_name(name: &str) -> Result<(), KubeError> {
    let invalid = |reason| Err(KubeError::InvalidNodeName { name: name.to_owned(), reason });
    if name.is_empty() || name.len() > 253 {
        return invalid("must be 1 to 253 characters");
    }
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return invalid("must consist of lower-case letters, digits, '-' and '.'");
    }
    let alphanumeric =
        |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !alphanumeric(name.as_bytes().first()) || !alphanumeric(name.as_bytes().last()) {
        return invalid("must start and end with a letter or digit");
    }
    Ok(())
}
