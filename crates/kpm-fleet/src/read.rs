//! Reading the fleet, read-only, at the weight of what it judges.
//!
//! Each node's doctor has already judged its node, so the read starts from
//! the reports, and asks for each thing at the weight it needs:
//!
//! - the reports as the server-side `Table` `kubectl get kpr` asks for,
//!   without their objects: a row a node, with the health, the failing
//!   count, the reason, the kubelet, the heartbeat and what the node's API
//!   objects show registered (the printer columns of the CRD);
//! - the Nodes' names as a `Table` too (a real Node weighs 10–30 KB: its
//!   images, labels and conditions), and the CSIDrivers (a few);
//! - a report in full only where its row fails or cannot judge, to name the
//!   failing plugins;
//! - a Node, its CSINode and its ResourceSlices only where no report says
//!   what they show (no doctor, or one from before `registered`): one by
//!   one (three requests a node, its bytes only) while they are at most
//!   half of the nodes, listed whole (what the cluster weighs, in fewer
//!   requests) when most nodes have no doctor. The cross-check
//!   ([`FleetConfig::cross_check`]) lists them whole for every node, to
//!   hold each report against them: what the cluster weighs, said in its
//!   help.
//!
//! The two tables, the single reads and a node's slices come from the API
//! server's watch cache (`resourceVersion=0`), whole: at 20,000 nodes,
//! paging the reports' table from etcd made the API server read and
//! convert every report in full, 71 MB, page by page (15–22 s on two
//! cores), where the cache serves it in under a second. Other lists are
//! paged (`limit`, `continue`), and each page is folded into
//! [`FleetObjects`] and dropped before the next is asked for. Reports are
//! read with the report crate's own types and path; other objects are
//! parsed into types that hold only what is judged. Every request goes
//! through one [`Reader`], which counts it and its bytes.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use futures_util::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kpm_report::{CONDITION_TYPE, Health, KubeletPluginReport, Resource as _, ShownRegistered};
use kube::api::ListParams;
use kube::core::ObjectList;
use serde::Deserialize;

use super::pages::{Listed, Reader, Row, Table};
use super::{
    FailingPlugin, FleetConfig, FleetError, FleetObjects, NodeCondition, NodeObject, NodeReport,
};

const NODES: Resource = Resource { name: "nodes", path: "/api/v1/nodes" };
const CSI_DRIVERS: Resource =
    Resource { name: "csidrivers", path: "/apis/storage.k8s.io/v1/csidrivers" };
const CSI_NODES: Resource = Resource { name: "csinodes", path: "/apis/storage.k8s.io/v1/csinodes" };
const RESOURCE_SLICES: Resource =
    Resource { name: "resourceslices", path: "/apis/resource.k8s.io/v1/resourceslices" };

/// How many single reads (a report, a node's objects) are in flight at
/// once.
const IN_FLIGHT: usize = 16;

/// The report table's columns the read uses, as the CRD names them
/// (`report.rs`'s printer columns; a test holds the two together).
pub(crate) mod column {
    pub(crate) const HEALTH: &str = "Health";
    pub(crate) const FAILING: &str = "Failing";
    pub(crate) const REASON: &str = "Reason";
    pub(crate) const KUBELET: &str = "Kubelet";
    pub(crate) const HEARTBEAT_TIME: &str = "Heartbeat Time";
    pub(crate) const REGISTERED: &str = "Registered";
}

/// A collection of the API server the fleet reads without a type of
/// k8s-openapi's: only what is judged of each object is parsed.
#[derive(Debug, Clone, Copy)]
struct Resource {
    /// Its plural, as errors name it.
    name: &'static str,
    /// The collection's path.
    path: &'static str,
}

impl Resource {
    fn what(self) -> Cow<'static, str> {
        Cow::Borrowed(self.name)
    }
}

/// Reads the fleet through `client`: the Nodes `config` selects with what
/// their doctors' reports say, and the CSIDrivers; the full reports of the
/// nodes that fail, and the objects of those no report speaks for (or of
/// all, with [`FleetConfig::cross_check`]). Lists are paged by
/// `config.page_size` and every request is bounded by
/// `config.request_timeout`. It never writes. A cluster without the
/// report's CRD, or an API server without `resource.k8s.io/v1` (DRA off, or
/// older than 1.34), shows no reports or no slices, and says so in
/// [`FleetObjects::unseen`], as does a reader not allowed to list them;
/// any other failure ends the read.
pub async fn read_fleet(
    client: &kube::Client,
    config: &FleetConfig,
) -> Result<FleetObjects, FleetError> {
    let reader = Reader::new(client, config);
    let (summaries, names, csi_drivers) = tokio::try_join!(
        read_summaries(&reader),
        read_node_names(&reader),
        read_csi_drivers(&reader),
    )?;
    let mut unseen = Vec::new();
    let mut reports = summaries.unwrap_or_else(|status| {
        unseen.push(format!(
            "{plural}: {} ({} {}): nodes are judged by their doctor's condition alone; install \
             the CRD (kubectl apply -k deploy/doctor) and let the reader list {plural} (the \
             kpm-doctor-fleet-reader ClusterRole)",
            status.message,
            status.code,
            status.reason,
            plural = KubeletPluginReport::plural(&()),
        ));
        BTreeMap::new()
    });
    let failing: Vec<&str> = names
        .iter()
        .filter(|name| reports.get(*name).is_some_and(|report| report.health != Health::Healthy))
        .map(String::as_str)
        .collect();
    for (name, report) in read_full_reports(&reader, &failing).await? {
        reports.insert(name, report);
    }
    let speaks_for = |name: &String| reports.get(name).is_some_and(|r| r.registered.is_some());
    let unspoken: Vec<&str> = names
        .iter()
        .filter(|name| config.cross_check || !speaks_for(name))
        .map(String::as_str)
        .collect();
    let whole = config.cross_check || unspoken.len() * 2 > names.len();
    let mut read = read_objects(&reader, &unspoken, whole, &mut unseen).await?;
    let nodes: Vec<NodeObject> = names
        .into_iter()
        .map(|name| {
            let objects = read.remove(&name);
            NodeObject {
                report: reports.remove(&name),
                condition: objects.as_ref().and_then(|objects| objects.condition.clone()),
                shown: objects.map(|objects| objects.shown),
                name,
            }
        })
        .collect();
    let workloads = match super::workloads::read_workloads(&reader, &nodes).await {
        Ok(workloads) => workloads,
        Err(err) if err.is_forbidden() => {
            unseen.push(format!(
                "{err}: the drivers missing on some nodes are not traced to their DaemonSet (let \
                 the reader get pods and daemonsets, and list pods: the kpm-doctor-fleet-reader \
                 ClusterRole)"
            ));
            BTreeMap::new()
        }
        Err(err) => return Err(err),
    };
    let (requests, bytes) = reader.cost();
    Ok(FleetObjects {
        nodes,
        csi_drivers,
        cross_checked: config.cross_check,
        unseen,
        requests,
        bytes,
        workloads,
    })
}

/// Each report's table row, by node name, or why reports are unseen.
async fn read_summaries(
    reader: &Reader<'_>,
) -> Result<Result<BTreeMap<String, NodeReport>, Box<kube::core::Status>>, FleetError> {
    let plural = KubeletPluginReport::plural(&());
    let path = KubeletPluginReport::url_path(&(), None);
    let mut reports = BTreeMap::new();
    let fold = |rows: Vec<Row>| reports.extend(rows.iter().filter_map(summary));
    let params = ListParams::default().match_any();
    let listed = reader.list::<Table>(plural, &path, true, params, fold).await?;
    Ok(match listed {
        Listed::Read => Ok(reports),
        Listed::Unseen(status) => Err(status),
    })
}

/// What a report's row says: no failing entries, only how many.
fn summary(row: &Row) -> Option<(String, NodeReport)> {
    let report = NodeReport {
        health: row.cell(column::HEALTH)?,
        reason: row.cell(column::REASON).unwrap_or_default(),
        heartbeat_time: row.cell(column::HEARTBEAT_TIME),
        kubelet_version: row.cell(column::KUBELET),
        failing_count: row.cell(column::FAILING).unwrap_or_default(),
        registered: row.cell(column::REGISTERED),
        ..NodeReport::default()
    };
    Some((row.name()?.to_owned(), report))
}

/// The reports of `nodes` in full, a few at a time; one deleted since its
/// row was read is left out.
async fn read_full_reports(
    reader: &Reader<'_>,
    nodes: &[&str],
) -> Result<Vec<(String, NodeReport)>, FleetError> {
    let path = KubeletPluginReport::url_path(&(), None);
    let read = futures_util::stream::iter(nodes)
        .map(|name| {
            let get = reader.get(KubeletPluginReport::plural(&()), &path, name);
            async move { Ok::<_, FleetError>(get.await?.and_then(reduce_report)) }
        })
        .buffer_unordered(IN_FLIGHT);
    Ok(read.try_collect::<Vec<_>>().await?.into_iter().flatten().collect())
}

/// What is judged of a report: its health, reason and heartbeat, the
/// kubelet's version, its failing entries and the names of its ok ones.
fn reduce_report(report: KubeletPluginReport) -> Option<(String, NodeReport)> {
    let name = report.metadata.name?;
    let status = report.status?;
    let mut ok = BTreeSet::new();
    let mut failing = Vec::new();
    let mut pods = BTreeMap::new();
    for entry in status.plugins {
        if let (Some(name), Some(pod)) = (&entry.name, &entry.pod) {
            pods.insert(name.clone(), pod.clone());
        }
        if entry.verdict.fails() {
            let subject = entry.name.clone().unwrap_or_else(|| file_name(&entry.socket));
            failing.push(FailingPlugin {
                subject,
                name: entry.name,
                verdict: entry.verdict,
                reason: entry.reason,
            });
        } else if let Some(name) = entry.name {
            ok.insert(name);
        }
    }
    failing.extend(status.findings.into_iter().filter(|f| f.verdict.fails()).map(|finding| {
        FailingPlugin {
            subject: finding.name.clone().unwrap_or_else(|| finding.object.clone()),
            name: finding.name,
            verdict: finding.verdict,
            reason: finding.reason,
        }
    }));
    let node = NodeReport {
        health: status.health,
        reason: status.reason,
        blind: status.blind.map(|blind| blind.why),
        heartbeat_time: status.heartbeat_time,
        kubelet_version: status.kubelet.version,
        failing_count: usize::try_from(status.counts.failing).unwrap_or(usize::MAX),
        failing,
        ok,
        registered: status.registered,
        pods,
    };
    Some((name, node))
}

/// The last component of a socket's path.
fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_owned()
}

/// The selected Nodes' names, from their table: a real Node weighs 10–30
/// KB, its row without the object tens of bytes.
async fn read_node_names(reader: &Reader<'_>) -> Result<Vec<String>, FleetError> {
    let mut names = Vec::new();
    let params = selected(reader.config).match_any();
    let fold =
        |rows: Vec<Row>| names.extend(rows.iter().filter_map(|r| r.name().map(str::to_owned)));
    reader.list::<Table>(NODES.what(), NODES.path, false, params, fold).await?;
    Ok(names)
}

/// The list parameters of the selected Nodes.
fn selected(config: &FleetConfig) -> ListParams {
    match config.label_selector.as_deref() {
        Some(selector) => ListParams::default().labels(selector),
        None => ListParams::default(),
    }
}

async fn read_csi_drivers(reader: &Reader<'_>) -> Result<BTreeSet<String>, FleetError> {
    let mut drivers = BTreeSet::new();
    let fold = |page: Vec<Named>| drivers.extend(page.into_iter().map(|d| d.metadata.name));
    reader
        .list::<ObjectList<Named>>(
            CSI_DRIVERS.what(),
            CSI_DRIVERS.path,
            false,
            ListParams::default(),
            fold,
        )
        .await?;
    Ok(drivers)
}

/// What a node's own objects show: its doctor's condition, and what its
/// Node, CSINode and ResourceSlices show registered.
struct NodeRead {
    condition: Option<NodeCondition>,
    shown: ShownRegistered,
}

/// The objects of `nodes`, by name: one by one, or with `whole` from the
/// whole lists. A Node deleted meanwhile is left out;
/// slices not served or not allowed are said in `unseen`.
async fn read_objects(
    reader: &Reader<'_>,
    nodes: &[&str],
    whole: bool,
    unseen: &mut Vec<String>,
) -> Result<BTreeMap<String, NodeRead>, FleetError> {
    if nodes.is_empty() {
        return Ok(BTreeMap::new());
    }
    let (objects, slices) =
        if whole { list_objects(reader).await? } else { get_objects(reader, nodes).await? };
    let slices = slices.unwrap_or_else(|status| {
        unseen.push(format!(
            "resourceslices: {} ({} {}): no DRA driver is judged (DRA is off, Kubernetes is \
             older than 1.34, or the reader may not list resource.k8s.io/v1 resourceslices)",
            status.message, status.code, status.reason
        ));
        BTreeMap::new()
    });
    let wanted: BTreeSet<&str> = nodes.iter().copied().collect();
    Ok(objects
        .into_iter()
        .filter(|(node, _)| wanted.contains(node.as_str()))
        .map(|(name, (node, csi_node))| {
            let capacity = node.capacity.iter().map(|(r, q)| (r.as_str(), q.as_str()));
            let slices = slices.get(&name).into_iter().flatten();
            let shown = ShownRegistered::shown_by(
                csi_node.iter().map(String::as_str),
                capacity,
                slices.map(|(driver, count)| (driver.as_str(), *count)),
            );
            (name, NodeRead { condition: node.condition, shown })
        })
        .collect())
}

/// A Node's condition and capacity, and its CSINode's drivers, by node.
type Objects = BTreeMap<String, (ReducedNode, BTreeSet<String>)>;

/// How many ResourceSlices each driver published, by node then driver, or
/// why slices are unseen.
type SliceCounts = Result<BTreeMap<String, BTreeMap<String, usize>>, Box<kube::core::Status>>;

/// The Nodes, CSINodes and ResourceSlices of the cluster, listed whole.
async fn list_objects(reader: &Reader<'_>) -> Result<(Objects, SliceCounts), FleetError> {
    let (nodes, csi_nodes, slices) = tokio::try_join!(
        async {
            let mut nodes = BTreeMap::new();
            let fold = |page: Vec<Node>| nodes.extend(page.into_iter().map(reduce_node));
            let params = selected(reader.config);
            reader.list::<ObjectList<Node>>(NODES.what(), NODES.path, false, params, fold).await?;
            Ok::<_, FleetError>(nodes)
        },
        async {
            let mut drivers = BTreeMap::new();
            let fold = |page: Vec<CsiNode>| drivers.extend(page.into_iter().map(reduce_csi_node));
            let (what, path) = (CSI_NODES.what(), CSI_NODES.path);
            reader
                .list::<ObjectList<CsiNode>>(what, path, false, ListParams::default(), fold)
                .await?;
            Ok(drivers)
        },
        list_slices(reader, ListParams::default()),
    )?;
    Ok((join_csi_nodes(nodes, csi_nodes), slices))
}

/// The objects of each of `nodes`, read one by one, a few at a time.
async fn get_objects(
    reader: &Reader<'_>,
    nodes: &[&str],
) -> Result<(Objects, SliceCounts), FleetError> {
    let read = futures_util::stream::iter(nodes)
        .map(|name| async move {
            // From the watch cache, in one page: from etcd, each would
            // read every slice of the cluster to find the node's few (at
            // 80,000 slices, past the request timeout).
            let on_node =
                ListParams::default().fields(&format!("spec.nodeName={name}")).match_any();
            tokio::try_join!(
                reader.get::<Node>(NODES.what(), NODES.path, name),
                reader.get::<CsiNode>(CSI_NODES.what(), CSI_NODES.path, name),
                list_slices(reader, on_node),
            )
        })
        .buffer_unordered(IN_FLIGHT);
    let read: Vec<_> = read.try_collect().await?;
    let (mut nodes, mut csi_nodes, mut slices) =
        (BTreeMap::new(), BTreeMap::new(), Ok(BTreeMap::new()));
    for (node, csi_node, node_slices) in read {
        nodes.extend(node.map(reduce_node));
        csi_nodes.extend(csi_node.map(reduce_csi_node));
        match (&mut slices, node_slices) {
            (Ok(all), Ok(counts)) => all.extend(counts),
            (Ok(_), Err(status)) => slices = Err(status),
            (Err(_), _) => {}
        }
    }
    Ok((join_csi_nodes(nodes, csi_nodes), slices))
}

/// The ResourceSlices `params` select, counted by node and driver.
async fn list_slices(reader: &Reader<'_>, params: ListParams) -> Result<SliceCounts, FleetError> {
    let mut counts: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    let fold = |page: Vec<Slice>| {
        for spec in page.into_iter().filter_map(|slice| slice.spec) {
            // Slices of a node selector or of all nodes (network-attached
            // devices) belong to no one node's driver.
            if let Some(node) = spec.node_name {
                *counts.entry(node).or_default().entry(spec.driver).or_default() += 1;
            }
        }
    };
    let (what, path) = (RESOURCE_SLICES.what(), RESOURCE_SLICES.path);
    // A cluster without DRA does not serve them, and a reader may not be
    // allowed to list them: unseen, not a failure.
    let listed = reader.list::<ObjectList<Slice>>(what, path, true, params, fold).await?;
    Ok(match listed {
        Listed::Read => Ok(counts),
        Listed::Unseen(status) => Err(status),
    })
}

/// Each Node with its CSINode's drivers (none without a CSINode).
fn join_csi_nodes(
    nodes: BTreeMap<String, ReducedNode>,
    mut csi_nodes: BTreeMap<String, BTreeSet<String>>,
) -> Objects {
    nodes
        .into_iter()
        .map(|(name, node)| {
            let drivers = csi_nodes.remove(&name).unwrap_or_default();
            (name, (node, drivers))
        })
        .collect()
}

fn reduce_csi_node(csi_node: CsiNode) -> (String, BTreeSet<String>) {
    let drivers = csi_node.spec.and_then(|spec| spec.drivers).unwrap_or_default();
    (csi_node.metadata.name, drivers.into_iter().map(|driver| driver.name).collect())
}

/// What is judged of a Node: its doctor's condition and its capacity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ReducedNode {
    condition: Option<NodeCondition>,
    capacity: BTreeMap<String, String>,
}

/// What is judged of a Node, by its name: its doctor's condition and its
/// capacity.
fn reduce_node(node: Node) -> (String, ReducedNode) {
    let status = node.status.unwrap_or(NodeStatus { capacity: None, conditions: None });
    let condition = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|condition| condition.kind == CONDITION_TYPE)
        .map(|condition| NodeCondition {
            status: condition.status,
            reason: condition.reason.unwrap_or_default(),
            message: condition.message.unwrap_or_default(),
            last_heartbeat_time: condition.last_heartbeat_time,
            last_transition_time: condition.last_transition_time,
        });
    let capacity = status.capacity.unwrap_or_default();
    (node.metadata.name, ReducedNode { condition, capacity })
}

#[derive(Debug, Clone, Deserialize)]
struct Meta {
    name: String,
}

#[derive(Debug, Clone, Deserialize)]
struct Named {
    metadata: Meta,
}

#[derive(Debug, Clone, Deserialize)]
struct Node {
    metadata: Meta,
    status: Option<NodeStatus>,
}

#[derive(Debug, Clone, Deserialize)]
struct NodeStatus {
    capacity: Option<BTreeMap<String, String>>,
    conditions: Option<Vec<Condition>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Condition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
    reason: Option<String>,
    message: Option<String>,
    last_heartbeat_time: Option<Time>,
    last_transition_time: Option<Time>,
}

#[derive(Debug, Clone, Deserialize)]
struct CsiNode {
    metadata: Meta,
    spec: Option<CsiNodeSpec>,
}

#[derive(Debug, Clone, Deserialize)]
struct CsiNodeSpec {
    drivers: Option<Vec<Entry>>,
}

/// A list entry named by a `name` field of its own.
#[derive(Debug, Clone, Deserialize)]
struct Entry {
    name: String,
}

#[derive(Debug, Clone, Deserialize)]
struct Slice {
    spec: Option<SliceSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SliceSpec {
    driver: String,
    node_name: Option<String>,
}

#[cfg(test)]
mod tests {
    use kpm_report::{Health, ReportedVerdict, Verdict};

    /// A time as the API server writes it.
    fn text(time: Option<&Time>) -> Option<String> {
        time.map(|time| time.0.to_string())
    }

    use super::*;

    /// A page of reports as the API server sends it.
    fn reports(items: &serde_json::Value) -> Vec<(String, NodeReport)> {
        let page: ObjectList<KubeletPluginReport> = serde_json::from_value(serde_json::json!({
            "apiVersion": "doctor.kpm.io/v1alpha1", "kind": "KubeletPluginReportList",
            "metadata": {"resourceVersion": "9"}, "items": items,
        }))
        .unwrap();
        page.items.into_iter().filter_map(reduce_report).collect()
    }

    /// The columns the read takes from a report's table are the CRD's, of
    /// the fields they are read as, and of a type the table keeps as
    /// written (a `date` column is an age).
    #[test]
    fn the_report_columns_read_are_the_crds() {
        use kpm_report::CustomResourceExt as _;
        let crd = KubeletPluginReport::crd();
        let columns = crd.spec.versions[0].additional_printer_columns.clone().unwrap();
        let column = |name: &str| {
            let found = columns.iter().find(|c| c.name == name).unwrap();
            (found.json_path.as_str(), found.type_.as_str())
        };
        assert_eq!(column(column::HEALTH), (".status.health", "string"));
        assert_eq!(column(column::FAILING), (".status.counts.failing", "integer"));
        assert_eq!(column(column::REASON), (".status.reason", "string"));
        assert_eq!(column(column::KUBELET), (".status.kubelet.version", "string"));
        assert_eq!(column(column::HEARTBEAT_TIME), (".status.heartbeatTime", "string"));
        assert_eq!(column(column::REGISTERED), (".status.registered", "string"));
    }

    #[test]
    fn a_report_row_says_what_its_columns_do() {
        let table: Table = serde_json::from_value(serde_json::json!({
            "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {},
            "columnDefinitions": [
                {"name": "Name"}, {"name": "Health"}, {"name": "Failing"}, {"name": "Reason"},
                {"name": "Kubelet"}, {"name": "Heartbeat"}, {"name": "Age"},
                {"name": "Registered"}, {"name": "Heartbeat Time"},
            ],
            "rows": [
                {"cells": ["n1", "Failing", 2, "Stale", "v1.36.2", "5m", "3d",
                           "CSIPlugin:a.example.com", "2026-03-01T11:55:00Z"]},
                {"cells": ["older", "Healthy", 0, "PluginsHealthy", null, "1m", "3d", null,
                           "2026-03-01T11:59:00Z"]},
                {"cells": ["newer", "Wobbly", 1, "X", null, null, "1d", "", null]},
            ],
        }))
        .unwrap();
        let (rows, _) = super::super::pages::Page::into_parts(table);
        let read: BTreeMap<String, NodeReport> = rows.iter().filter_map(summary).collect();
        let n1 = &read["n1"];
        assert_eq!(
            (n1.health, n1.failing_count, n1.reason.as_str()),
            (Health::Failing, 2, "Stale")
        );
        assert_eq!(n1.kubelet_version.as_deref(), Some("v1.36.2"));
        assert_eq!(text(n1.heartbeat_time.as_ref()).as_deref(), Some("2026-03-01T11:55:00Z"));
        assert_eq!(
            n1.registered.as_ref().map(ToString::to_string).as_deref(),
            Some("CSIPlugin:a.example.com")
        );
        assert!(n1.failing.is_empty(), "a row names no failing plugin");
        assert_eq!(read["older"].registered, None, "a doctor before the field");
        assert_eq!(read["newer"].health, Health::Unknown);
        assert_eq!(read["newer"].registered, Some(ShownRegistered::default()));
    }

    #[test]
    fn a_report_is_read_into_its_failing_entries_and_its_ok_names() {
        // As a doctor of v1alpha1's first schema wrote it (kpm 0.1, issue 45).
        let read = reports(&serde_json::json!([{
            "apiVersion": "doctor.kpm.io/v1alpha1", "kind": "KubeletPluginReport",
            "metadata": {"name": "n1", "uid": "u1"}, "spec": {"nodeName": "n1"},
            "status": {
                "health": "Failing", "reason": "Rejected",
                "kubelet": {"rootDir": "/var/lib/kubelet", "foundBy": "the running kubelet, pid 42",
                            "version": "v1.36.2"},
                "counts": {"plugins": 3, "failing": 4, "omitted": 0},
                "plugins": [
                    {"socket": "/var/lib/kubelet/plugins_registry/p001-reg.sock", "type": "CSIPlugin",
                     "verdict": "rejected", "reason": "needs v1.x; got 0.3.0",
                     "since": "2026-03-01T11:00:00Z"},
                    {"socket": "/var/lib/kubelet/plugins_registry/gpu.sock", "type": "DevicePlugin",
                     "name": "vendor.com/gpu", "verdict": "ok", "reason": "registered",
                     "since": "2026-03-01T11:00:00Z"},
                ],
                "findings": [
                    {"object": "csinodes/n1", "name": "gone.csi.example.com",
                     "verdict": "stale-csi-node-entry", "reason": "no live plugin serves it",
                     "since": "2026-03-01T11:00:00Z"},
                ],
                "heartbeatTime": "2026-03-01T11:30:00Z", "doctorVersion": "0.1.0",
            },
        }]));
        let [(name, report)] = &read[..] else { panic!("{read:?}") };
        assert_eq!(name, "n1");
        assert_eq!((report.health, report.reason.as_str()), (Health::Failing, "Rejected"));
        assert_eq!(report.failing_count, 4, "the doctor's count, not the entries'");
        assert_eq!(report.kubelet_version.as_deref(), Some("v1.36.2"));
        assert_eq!(text(report.heartbeat_time.as_ref()).as_deref(), Some("2026-03-01T11:30:00Z"));
        let failing: Vec<(&str, &str)> =
            report.failing.iter().map(|f| (f.subject.as_str(), f.verdict.name())).collect();
        assert_eq!(
            failing,
            [("p001-reg.sock", "rejected"), ("gone.csi.example.com", "stale-csi-node-entry")]
        );
        assert_eq!(report.failing[0].verdict, Verdict::Rejected);
        assert!(report.ok.contains("vendor.com/gpu"));
    }

    #[test]
    fn a_report_of_a_newer_doctor_is_read_all_the_same() {
        let read = reports(&serde_json::json!([
            {"metadata": {"name": "newer"}, "spec": {"nodeName": "newer"}, "status": {
                "health": "Wobbly", "reason": "SomeFutureVerdict", "future": {"x": 1},
                "kubelet": {"rootDir": "/r", "foundBy": "--root-dir", "cgroupDriver": "systemd"},
                "counts": {"plugins": 2, "failing": 1},
                "plugins": [
                    {"socket": "/r/a.sock", "type": "FuturePlugin", "name": "a.example.com",
                     "verdict": "some-future-verdict", "reason": "4 changes in 2m",
                     "since": "2026-01-01T00:00:00Z", "sandbox": "kube-system/a-0"},
                    {"socket": "/r/b.sock", "name": "b.example.com", "verdict": "ok",
                     "reason": "fine", "since": "2026-01-01T00:00:00Z"},
                ],
                "doctorVersion": "9.0.0"}},
            {"metadata": {"name": "no-status"}, "spec": {"nodeName": "no-status"}},
        ]));
        assert_eq!(read.len(), 1);
        let (_, newer) = &read[0];
        assert_eq!(newer.health, Health::Unknown);
        // A verdict this reader does not know fails: it is not `ok`.
        assert_eq!(
            newer.failing[0].verdict,
            ReportedVerdict::Unknown("some-future-verdict".to_owned())
        );
        assert_eq!(newer.failing_count, 1);
        assert!(newer.ok.contains("b.example.com"));
    }

    #[test]
    fn a_node_page_keeps_the_doctors_condition_and_extended_resources_only() {
        let page: ObjectList<Node> = serde_json::from_value(serde_json::json!({
            "kind": "NodeList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "7", "continue": "next"},
            "items": [{
                "metadata": {"name": "n1", "labels": {"a": "b"}},
                "spec": {"podCIDR": "10.0.0.0/24"},
                "status": {
                    "capacity": {"cpu": "4", "vendor.com/gpu": "2", "example.com/nic": "0"},
                    "images": [{"names": ["busybox"], "sizeBytes": 1}],
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                        {"type": "KubeletPluginsHealthy", "status": "False", "reason": "Stale",
                         "message": "1 failing: a-reg.sock (stale): refused",
                         "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                         "lastTransitionTime": "2025-12-31T00:00:00Z"},
                    ],
                },
            }, {"metadata": {"name": "bare"}}],
        }))
        .unwrap();
        assert_eq!(page.metadata.continue_.as_deref(), Some("next"));
        let nodes: Vec<(String, ReducedNode)> = page.items.into_iter().map(reduce_node).collect();
        let condition = nodes[0].1.condition.as_ref().unwrap();
        assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "Stale"));
        assert_eq!(condition.message, "1 failing: a-reg.sock (stale): refused");
        assert_eq!(
            text(condition.last_heartbeat_time.as_ref()).as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
        assert_eq!(
            text(condition.last_transition_time.as_ref()).as_deref(),
            Some("2025-12-31T00:00:00Z")
        );
        let capacity: Vec<(&str, &str)> =
            nodes[0].1.capacity.iter().map(|(name, q)| (name.as_str(), q.as_str())).collect();
        assert_eq!(capacity, [("cpu", "4"), ("example.com/nic", "0"), ("vendor.com/gpu", "2")]);
        assert_eq!(nodes[1], ("bare".to_owned(), ReducedNode::default()));
    }
}
