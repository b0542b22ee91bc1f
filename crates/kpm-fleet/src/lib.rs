//! The fleet view of `kpm doctor --cluster`: what every node's doctor
//! published (its [`KubeletPluginReport`](kpm_report::KubeletPluginReport), else the status and reason of
//! its [`CONDITION_TYPE`](kpm_report::CONDITION_TYPE) condition) and what
//! the API server shows of each driver, read back for the whole cluster.
//! No message is parsed: a doctor's findings are read typed, from its
//! report, with the report crate's own types (`kube::Api<KubeletPluginReport>`).
//!
//! It never writes, and it is a reader only: it depends on the report
//! crate, kube's client and the wire's shared names, not on the node
//! doctor (no inotify, no `/proc`, no kubelet config parser).
//!
//! - `read` lists `KubeletPluginReports`, Nodes, CSIDrivers, CSINodes and
//!   ResourceSlices, read-only, page by page, and keeps of each page only
//!   what is judged ([`FleetObjects`]), so that memory follows what is kept
//!   rather than the size of the objects.
//! - `judge` turns them into a [`Fleet`], without IO: each node's doctor
//!   state and failing plugins, and for each CSI driver, device-plugin
//!   resource and DRA driver, on how many nodes it is registered and why
//!   not on the others.
//! - `render` prints it as `kpm doctor --cluster` does.

#![deny(missing_docs)]

mod error;
mod judge;
mod pages;
mod read;
mod render;
mod scheduling;
mod workloads;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kpm_api::PluginKind;
pub use kpm_api::config::{Bounds, OutOfRange, REQUEST_TIMEOUT};
use kpm_report::{Health, PodContainer, ReportedVerdict, ShownRegistered};
use serde::Serialize;
use serde::ser::SerializeStruct as _;

pub use self::error::FleetError;
pub use self::judge::judge_fleet;
pub use self::read::read_fleet;
pub use self::render::render_fleet_table;
pub use self::workloads::{PodThere, Workload};

/// How many objects one list request asks for by default.
pub const DEFAULT_PAGE_SIZE: u32 = 500;

/// How old a doctor's last heartbeat may be before it counts as silent by
/// default: two of its heartbeat periods (30 min each).
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(60 * 60);

/// How long one API request may take by default: kpm's, 10 s.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = kpm_api::constants::API_REQUEST_TIMEOUT;

/// The largest [`FleetConfig::page_size`].
pub const MAX_PAGE_SIZE: u32 = 10_000;

/// What the fleet view reads and how. [`Default`], else made by
/// [`builder`](Self::builder), whose [`build`](FleetConfigBuilder::build)
/// checks each field once.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetConfig {
    label_selector: Option<String>,
    page_size: u32,
    request_timeout: Duration,
    stale_after: Duration,
    cross_check: bool,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            cross_check: false,
            label_selector: None,
            page_size: DEFAULT_PAGE_SIZE,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            stale_after: DEFAULT_STALE_AFTER,
        }
    }
}

impl FleetConfig {
    /// A builder from the defaults.
    pub fn builder() -> FleetConfigBuilder {
        FleetConfigBuilder(Self::default())
    }

    /// Only the Nodes this label selector selects; `None`: all.
    pub fn label_selector(&self) -> Option<&str> {
        self.label_selector.as_deref()
    }

    /// How many objects each list request asks for (`limit`): 1 (0 would
    /// ask for everything at once) to [`MAX_PAGE_SIZE`]. Default
    /// [`DEFAULT_PAGE_SIZE`], 500.
    pub fn page_size(&self) -> u32 {
        self.page_size
    }

    /// How long each list request may take: 1 ms to 10 min. Default
    /// [`DEFAULT_REQUEST_TIMEOUT`], 10 s.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// How old a doctor's heartbeat may be before it is silent: 1 s to 7
    /// days. Default [`DEFAULT_STALE_AFTER`], 60 min.
    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// Whether every node's Node, CSINode and ResourceSlices are read, to
    /// hold its report against them: what a report shows registered and
    /// what they do must agree. It costs what the cluster weighs (a real
    /// Node is 10–30 KB); without it, the objects are read only of nodes
    /// no report speaks for. Default off.
    pub fn cross_check(&self) -> bool {
        self.cross_check
    }
}

/// A [`FleetConfig`] being set; [`build`](Self::build) checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetConfigBuilder(FleetConfig);

impl FleetConfigBuilder {
    /// Sets [`FleetConfig::label_selector`] (default: every Node).
    #[must_use]
    pub fn label_selector(mut self, selector: impl Into<String>) -> Self {
        self.0.label_selector = Some(selector.into());
        self
    }

    /// Sets [`FleetConfig::page_size`] (default [`DEFAULT_PAGE_SIZE`], 500).
    #[must_use]
    pub fn page_size(mut self, size: u32) -> Self {
        self.0.page_size = size;
        self
    }

    /// Sets [`FleetConfig::request_timeout`] (default
    /// [`DEFAULT_REQUEST_TIMEOUT`], 10 s).
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.0.request_timeout = timeout;
        self
    }

    /// Sets [`FleetConfig::stale_after`] (default [`DEFAULT_STALE_AFTER`],
    /// 60 min).
    #[must_use]
    pub fn stale_after(mut self, after: Duration) -> Self {
        self.0.stale_after = after;
        self
    }

    /// Sets [`FleetConfig::cross_check`] (default off).
    #[must_use]
    pub fn cross_check(mut self, on: bool) -> Self {
        self.0.cross_check = on;
        self
    }

    /// The config, once each field is in its range; the error names the
    /// first that is not.
    pub fn build(self) -> Result<FleetConfig, OutOfRange> {
        let FleetConfig { label_selector, page_size, request_timeout, stale_after, cross_check } =
            self.0;
        Ok(FleetConfig {
            cross_check,
            label_selector,
            page_size: PAGE_SIZE.check("fleet.page_size", page_size)?,
            request_timeout: REQUEST_TIMEOUT.check("fleet.request_timeout", request_timeout)?,
            stale_after: STALE_AFTER.check("fleet.stale_after", stale_after)?,
        })
    }
}

/// The range of [`FleetConfig::page_size`]: 1 (0 would ask for everything
/// at once) to [`MAX_PAGE_SIZE`].
pub const PAGE_SIZE: Bounds<u32> = Bounds::new(1, MAX_PAGE_SIZE, "between 1 and 10000");

/// The range of [`FleetConfig::stale_after`]: a second to a week.
pub const STALE_AFTER: Bounds<Duration> = Bounds::new(
    Duration::from_secs(1),
    Duration::from_secs(7 * 24 * 60 * 60),
    "between 1s and 7 days",
);

/// What the API server shows of the fleet, reduced to what is judged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetObjects {
    /// The selected Nodes, in the API server's order.
    pub nodes: Vec<NodeObject>,
    /// The names of the CSIDriver objects.
    pub csi_drivers: BTreeSet<String>,
    /// Every node's objects were read, to hold its report against them
    /// ([`FleetConfig::cross_check`]).
    pub cross_checked: bool,
    /// What could not be read, and why (the API server serves no
    /// `resource.k8s.io/v1`).
    pub unseen: Vec<String>,
    /// How many requests were made, all resources together.
    pub requests: usize,
    /// How many bytes their answers weighed, as the client read them.
    pub bytes: usize,
    /// The DaemonSet serving each driver registered on some nodes and not
    /// on others, and its pods on those others.
    pub workloads: BTreeMap<(PluginKind, String), Workload>,
}

/// What one Node shows of its plugins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeObject {
    /// The node's name.
    pub name: String,
    /// Its doctor's report, when it has one: its table row, or in full
    /// where the row fails.
    pub report: Option<NodeReport>,
    /// Its doctor's condition, when its Node was read and has one.
    pub condition: Option<NodeCondition>,
    /// What its Node, CSINode and ResourceSlices show registered, when
    /// they were read (no report speaks for them, or the cross-check).
    pub shown: Option<ShownRegistered>,
}

impl NodeObject {
    /// A node without a condition or extended resources.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), ..Self::default() }
    }

    /// What it registered: what its objects show where they were read,
    /// else what its report says they show; none when neither is known.
    pub fn registered(&self) -> Option<&ShownRegistered> {
        self.shown.as_ref().or_else(|| self.report.as_ref()?.registered.as_ref())
    }
}

/// A node doctor's condition, as the API server shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeCondition {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// [`HEALTHY_REASON`](kpm_report::HEALTHY_REASON), or the first failing verdict in CamelCase.
    pub reason: String,
    /// Which plugins fail and why.
    pub message: String,
    /// When the doctor last wrote it.
    pub last_heartbeat_time: Option<Time>,
    /// When its status last changed.
    pub last_transition_time: Option<Time>,
}

impl NodeCondition {
    /// A condition with this status, reason and message, without times.
    pub fn new(
        status: impl Into<String>,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            ..Self::default()
        }
    }
}

/// A node doctor's [`KubeletPluginReport`](kpm_report::KubeletPluginReport), reduced to what the fleet
/// judges. Read leniently: a report of a newer doctor (a health or verdict
/// this one does not know) is still read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeReport {
    /// `Healthy`, `Failing`, `CannotJudge`, or one this reader does not know.
    pub health: Health,
    /// The condition's reason: the first failing verdict in CamelCase.
    pub reason: String,
    /// Why the doctor could not look, when it could not.
    pub blind: Option<String>,
    /// When the doctor last wrote it.
    pub heartbeat_time: Option<Time>,
    /// The kubelet's version.
    pub kubelet_version: Option<String>,
    /// The failing sockets and findings it lists.
    pub failing: Vec<FailingPlugin>,
    /// How many fail, as the condition counts them.
    pub failing_count: usize,
    /// The names of the plugins it finds ok (from the report in full).
    pub ok: BTreeSet<String>,
    /// What the node's API objects show registered, as the doctor read
    /// them; none from a doctor before the field.
    pub registered: Option<ShownRegistered>,
    /// The pod container serving each plugin it names, by plugin name
    /// (from the report in full).
    pub pods: BTreeMap<String, PodContainer>,
}

/// The fleet judged: each driver or resource, and each node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fleet {
    /// Every CSI driver, device-plugin resource and DRA driver seen, by
    /// kind then name.
    pub drivers: Vec<DriverView>,
    /// Every selected node, by name.
    pub nodes: Vec<NodeView>,
    /// Where a report and its node's objects differ (the cross-check
    /// only): a report that does not tell the truth.
    pub disagreements: Vec<Disagreement>,
    /// What could not be read, and why.
    pub unseen: Vec<String>,
    /// What the read cost.
    pub read: ReadCost,
}

impl Fleet {
    /// No node's doctor reports a failure or is silent, and no report
    /// disagrees with its node's objects. Nodes without a doctor do not
    /// count: the doctor may be meant for some nodes only.
    pub fn ok(&self) -> bool {
        self.nodes.iter().all(|node| !node.doctor.fails()) && self.disagreements.is_empty()
    }
}

/// A plugin a node's report and its objects do not agree on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Disagreement {
    /// The node.
    pub node: String,
    /// The plugin's kind (its plugin type in JSON).
    pub kind: PluginKind,
    /// The driver or resource.
    pub name: String,
    /// The report shows it registered and the objects do not; else the
    /// other way round.
    pub report_shows: bool,
}

impl std::fmt::Display for Disagreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (node, plugin) = (&self.node, format!("{} {}", self.kind.plugin_type(), self.name));
        // What the object that registers the kind says, and its absence.
        let (shows, lacks) = match self.kind.registered_in() {
            kpm_api::ApiObject::CsiNode | kpm_api::ApiObject::Node => {
                ("its CSINode lists", "its CSINode does not list it")
            }
            kpm_api::ApiObject::NodeStatus => {
                ("its Node has a capacity of", "its Node has no capacity of it")
            }
            kpm_api::ApiObject::ResourceSlice => {
                ("its ResourceSlices name", "no ResourceSlice of the node names it")
            }
        };
        if self.report_shows {
            write!(f, "{node}: its report shows {plugin} registered, but {lacks}")
        } else {
            write!(f, "{node}: {shows} {plugin}, but its report does not show it registered")
        }
    }
}

/// What a fleet read cost the API server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ReadCost {
    /// The requests made.
    pub requests: usize,
    /// The bytes of their answers, as the client read them.
    pub bytes: usize,
    /// Every node's objects were read ([`FleetConfig::cross_check`]).
    pub cross_check: bool,
}

// `ok` is a method, so that it cannot disagree with the nodes; JSON
// readers get it as a field.
impl Serialize for Fleet {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut fleet = serializer.serialize_struct("Fleet", 6)?;
        fleet.serialize_field("ok", &self.ok())?;
        fleet.serialize_field("drivers", &self.drivers)?;
        fleet.serialize_field("nodes", &self.nodes)?;
        fleet.serialize_field("disagreements", &self.disagreements)?;
        fleet.serialize_field("unseen", &self.unseen)?;
        fleet.serialize_field("read", &self.read)?;
        fleet.end()
    }
}

/// One CSI driver, device-plugin resource or DRA driver across the nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DriverView {
    /// What registers it on a node (see [`judge_fleet`]): a CSI driver's
    /// CSINode entry, a device plugin's nonzero extended-resource
    /// capacity, a DRA driver's ResourceSlices of the node. The table
    /// shows its [`name`](PluginKind::name), the JSON its plugin type
    /// (`CSIPlugin`), as every JSON of kpm's does.
    pub kind: PluginKind,
    /// The driver's or resource's name.
    pub name: String,
    /// A CSIDriver object of this name exists.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub has_object: bool,
    /// On how many selected nodes it is registered.
    pub registered: usize,
    /// How many nodes were selected.
    pub nodes: usize,
    /// The nodes where it is not registered, and why, by node name; only
    /// when it is registered somewhere or has a CSIDriver object (a driver
    /// on no selected node is meant for other nodes).
    pub not_on: Vec<NotOn>,
    /// The DaemonSet whose pods serve it where it is registered
    /// (`NAMESPACE/NAME`), when the doctors there name them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_set: Option<String>,
}

/// A node where a driver is not registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct NotOn {
    /// The node.
    pub node: String,
    /// Why, as far as its doctor tells.
    pub why: String,
    /// The driver's DaemonSet's pod there, when the DaemonSet is known
    /// and the node was asked about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodThere>,
}

/// One node, as its doctor reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct NodeView {
    /// The node's name.
    pub name: String,
    /// What its doctor says.
    pub doctor: DoctorState,
    /// Where that was read: its report, or the condition only (a doctor
    /// that writes no report, or whose report is older).
    pub source: Source,
    /// The kubelet's version, as the report tells.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_version: Option<String>,
    /// The failing plugins and findings its doctor's report lists.
    pub failing_plugins: Vec<FailingPlugin>,
    /// How many more fail than the report lists (it is bounded).
    #[serde(skip_serializing_if = "is_zero")]
    pub more_failing: usize,
    /// The names of the plugins its doctor finds ok.
    #[serde(skip)]
    ok: BTreeSet<String>,
}

/// Where a node's doctor state was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Source {
    /// Its `KubeletPluginReport`.
    Report,
    /// Its Node condition's status and reason.
    Condition,
    /// Neither: no doctor.
    None,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference.
fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// What a node's doctor says, as far as the API server shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum DoctorState {
    /// Every plugin is ok (the condition `True`).
    Healthy,
    /// A plugin or finding fails (the condition `False`).
    Failing {
        /// The first failing verdict in CamelCase.
        reason: String,
    },
    /// The doctor could not look (the condition `Unknown`,
    /// [`CANNOT_JUDGE_REASON`](kpm_report::CANNOT_JUDGE_REASON)).
    CannotJudge {
        /// Why, as its report tells; empty from a condition only.
        why: String,
    },
    /// The Node has no report and no condition of a doctor.
    NoDoctor,
    /// The doctor's last heartbeat is older than the bound: what it said
    /// may no longer hold.
    Silent {
        /// Its last heartbeat, when it wrote one (RFC 3339 in JSON).
        since: Option<Time>,
    },
}

impl DoctorState {
    /// Its name in the table: `healthy`, `failing`, `cannot judge`, `no
    /// doctor`, `silent`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Failing { .. } => "failing",
            Self::CannotJudge { .. } => "cannot judge",
            Self::NoDoctor => "no doctor",
            Self::Silent { .. } => "silent",
        }
    }

    /// Whether it makes the fleet fail: failing, blind or silent.
    pub fn fails(&self) -> bool {
        matches!(self, Self::Failing { .. } | Self::CannotJudge { .. } | Self::Silent { .. })
    }
}

/// A failing socket or finding a node's doctor lists in its report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct FailingPlugin {
    /// How it is shown: the plugin's name, else its socket's file name or
    /// the object.
    pub subject: String,
    /// The plugin, driver or resource it is about, when the report names
    /// one: the fleet's drivers are matched by it, exactly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its verdict (`stale`), as the report writes it.
    pub verdict: ReportedVerdict,
    /// Why it fails.
    pub reason: String,
}
