//! Reading the fleet, read-only: `KubeletPluginReports`, Nodes, CSIDrivers,
//! CSINodes and ResourceSlices, each listed page by page (`limit`,
//! `continue`), the five lists at once. Each page is parsed into types that hold only what is
//! judged (serde skips the rest: a Node's images, a slice's devices), folded
//! into [`FleetObjects`] and dropped before the next is asked for, so that
//! 5000 Nodes and 20,000 ResourceSlices take a few megabytes, not the
//! gigabyte their full objects would.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::ListParams;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tracing::debug;

use super::{
    FailingPlugin, FleetConfig, FleetError, FleetObjects, NodeCondition, NodeObject, NodeReport,
};
use crate::condition::CONDITION_TYPE;
use crate::judge::Verdict;

const NODES: Resource = Resource { name: "nodes", path: "/api/v1/nodes", optional: false };
const CSI_DRIVERS: Resource =
    Resource { name: "csidrivers", path: "/apis/storage.k8s.io/v1/csidrivers", optional: false };
const CSI_NODES: Resource =
    Resource { name: "csinodes", path: "/apis/storage.k8s.io/v1/csinodes", optional: false };
const REPORTS: Resource = Resource {
    name: "kubeletpluginreports",
    path: "/apis/doctor.kpm.io/v1alpha1/kubeletpluginreports",
    optional: true,
};
const RESOURCE_SLICES: Resource = Resource {
    name: "resourceslices",
    path: "/apis/resource.k8s.io/v1/resourceslices",
    optional: true,
};

/// A collection of the API server.
#[derive(Debug, Clone, Copy)]
struct Resource {
    /// Its plural, as errors name it.
    name: &'static str,
    /// The collection's path.
    path: &'static str,
    /// A cluster may not serve it, or the reader may not be allowed to
    /// list it (a 404 or 403 on the first page): it is then unseen, not a
    /// failure.
    optional: bool,
}

/// How a list went.
enum Listed {
    /// Every page was read, in this many requests.
    Pages(usize),
    /// An optional resource, not served (404) or not allowed (403).
    Unseen(Box<kube::core::Status>),
}

/// Reads the fleet through `client`: the Nodes `config` selects with their
/// doctors' reports, every CSIDriver, CSINode and ResourceSlice, each list
/// paged by `config.page_size` and every request bounded by
/// `config.request_timeout`. It never writes. A cluster without the
/// report's CRD, or an API server without `resource.k8s.io/v1` (DRA off, or
/// older than 1.34), shows no reports or no slices, and says so in
/// [`FleetObjects::unseen`], as does a reader not allowed to list them;
/// any other failure ends the read.
pub async fn read_fleet(
    client: &kube::Client,
    config: &FleetConfig,
) -> Result<FleetObjects, FleetError> {
    let (reports, nodes, csi_drivers, csi_nodes, slices) = tokio::try_join!(
        read_reports(client, config),
        read_nodes(client, config),
        read_csi_drivers(client, config),
        read_csi_nodes(client, config),
        read_slices(client, config),
    )?;
    let mut objects = FleetObjects {
        requests: reports.1 + nodes.1 + csi_drivers.1 + csi_nodes.1 + slices.1,
        nodes: nodes.0,
        csi_drivers: csi_drivers.0,
        csi_nodes: csi_nodes.0,
        ..FleetObjects::default()
    };
    match reports.0 {
        Ok(mut reports) => {
            for node in &mut objects.nodes {
                node.report = reports.remove(&node.name);
            }
        }
        Err(status) => objects.unseen.push(format!(
            "kubeletpluginreports: {} ({} {}): nodes are judged by their doctor's condition \
             alone; install the CRD (kubectl apply -k deploy/doctor) and let the reader list \
             kubeletpluginreports (the kpm-doctor-fleet-reader ClusterRole)",
            status.message, status.code, status.reason
        )),
    }
    match slices.0 {
        Ok(slices) => objects.slices = slices,
        Err(status) => objects.unseen.push(format!(
            "resourceslices: {} ({} {}): no DRA driver is judged (DRA is off, Kubernetes is \
             older than 1.34, or the reader may not list resource.k8s.io/v1 resourceslices)",
            status.message, status.code, status.reason
        )),
    }
    Ok(objects)
}

/// Lists `resource` page by page, handing each page's items to `fold`.
async fn list_pages<T: DeserializeOwned>(
    client: &kube::Client,
    resource: Resource,
    config: &FleetConfig,
    label_selector: Option<&str>,
    mut fold: impl FnMut(Vec<T>),
) -> Result<Listed, FleetError> {
    let request = kube::core::Request::new(resource.path);
    let mut params = ListParams::default().limit(config.page_size);
    if let Some(selector) = label_selector {
        params = params.labels(selector);
    }
    let mut page = 0;
    loop {
        page += 1;
        let http = request
            .list(&params)
            .map_err(|source| FleetError::Request { resource: resource.name, source })?;
        let listed: List<T> =
            match tokio::time::timeout(config.request_timeout, client.request(http)).await {
                Ok(Ok(listed)) => listed,
                Ok(Err(kube::Error::Api(status)))
                    if resource.optional && page == 1 && matches!(status.code, 403 | 404) =>
                {
                    debug!(resource = resource.name, code = status.code, "not seen");
                    return Ok(Listed::Unseen(status));
                }
                Ok(Err(source)) => {
                    return Err(FleetError::List { resource: resource.name, page, source });
                }
                Err(_) => {
                    return Err(FleetError::Timeout {
                        resource: resource.name,
                        page,
                        timeout: config.request_timeout,
                    });
                }
            };
        debug!(resource = resource.name, page, items = listed.items.len(), "listed a page");
        fold(listed.items);
        match listed.metadata.continue_token.filter(|token| !token.is_empty()) {
            None => return Ok(Listed::Pages(page)),
            Some(token) if params.continue_token.as_ref() == Some(&token) => {
                return Err(FleetError::Paging { resource: resource.name, page });
            }
            Some(token) => params.continue_token = Some(token),
        }
    }
}

/// A page of a list: its items, and where the next page starts.
#[derive(Debug, Deserialize)]
struct List<T> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default = "Vec::new")]
    items: Vec<T>,
}

#[derive(Debug, Default, Deserialize)]
struct ListMeta {
    #[serde(rename = "continue")]
    continue_token: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Meta {
    name: String,
}

#[derive(Debug, Deserialize)]
struct Named {
    metadata: Meta,
}

#[derive(Debug, Deserialize)]
struct Node {
    metadata: Meta,
    status: Option<NodeStatus>,
}

#[derive(Debug, Deserialize)]
struct NodeStatus {
    capacity: Option<BTreeMap<String, String>>,
    conditions: Option<Vec<Condition>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Condition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
    reason: Option<String>,
    message: Option<String>,
    last_heartbeat_time: Option<String>,
    last_transition_time: Option<String>,
}

/// A `KubeletPluginReport`, every field but the name optional, strings
/// where the doctor's types are enums: a report of another version is read
/// all the same.
#[derive(Debug, Deserialize)]
struct Report {
    metadata: Meta,
    status: Option<ReportStatus>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReportStatus {
    #[serde(default)]
    health: String,
    #[serde(default)]
    reason: String,
    blind: Option<ReportBlind>,
    kubelet: Option<ReportKubelet>,
    counts: Option<ReportCounts>,
    #[serde(default)]
    plugins: Vec<ReportPlugin>,
    #[serde(default)]
    findings: Vec<ReportFinding>,
    heartbeat_time: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ReportBlind {
    #[serde(default)]
    why: String,
}

#[derive(Debug, Deserialize)]
struct ReportKubelet {
    version: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ReportCounts {
    #[serde(default)]
    failing: usize,
}

#[derive(Debug, Deserialize)]
struct ReportPlugin {
    #[serde(default)]
    socket: String,
    name: Option<String>,
    #[serde(default)]
    verdict: String,
    #[serde(default)]
    reason: String,
}

#[derive(Debug, Deserialize)]
struct ReportFinding {
    #[serde(default)]
    object: String,
    name: Option<String>,
    #[serde(default)]
    verdict: String,
    #[serde(default)]
    reason: String,
}

#[derive(Debug, Deserialize)]
struct CsiNode {
    metadata: Meta,
    spec: Option<CsiNodeSpec>,
}

#[derive(Debug, Deserialize)]
struct CsiNodeSpec {
    drivers: Option<Vec<Entry>>,
}

/// A list entry named by a `name` field of its own.
#[derive(Debug, Deserialize)]
struct Entry {
    name: String,
}

#[derive(Debug, Deserialize)]
struct Slice {
    spec: Option<SliceSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SliceSpec {
    driver: String,
    node_name: Option<String>,
}

type Read<T> = Result<(T, usize), FleetError>;

/// An optional resource's objects, or why they were not seen.
type Optional<T> = Result<T, Box<kube::core::Status>>;

impl Listed {
    /// How many requests it took.
    fn count(&self) -> usize {
        match self {
            Self::Pages(pages) => *pages,
            Self::Unseen(_) => 1,
        }
    }

    /// `objects`, or why they were not seen.
    fn seen<T>(self, objects: T) -> Optional<T> {
        match self {
            Self::Pages(_) => Ok(objects),
            Self::Unseen(status) => Err(status),
        }
    }
}

async fn read_reports(
    client: &kube::Client,
    config: &FleetConfig,
) -> Read<Optional<BTreeMap<String, NodeReport>>> {
    let mut reports = BTreeMap::new();
    let listed = list_pages(client, REPORTS, config, None, |page: Vec<Report>| {
        reports.extend(page.into_iter().filter_map(reduce_report));
    })
    .await?;
    let count = listed.count();
    Ok((listed.seen(reports), count))
}

/// What is judged of a report: its health, reason and heartbeat, the
/// kubelet's version, its failing entries and the names of its ok ones.
fn reduce_report(report: Report) -> Option<(String, NodeReport)> {
    let status = report.status?;
    let fails = |verdict: &str| Verdict::from_name(verdict).is_none_or(Verdict::fails);
    let mut ok = BTreeSet::new();
    let mut failing = Vec::new();
    for entry in status.plugins {
        if fails(&entry.verdict) {
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
    failing.extend(status.findings.into_iter().filter(|f| fails(&f.verdict)).map(|finding| {
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
        kubelet_version: status.kubelet.and_then(|kubelet| kubelet.version),
        failing_count: status.counts.map_or(failing.len(), |counts| counts.failing),
        failing,
        ok,
    };
    Some((report.metadata.name, node))
}

/// The last component of a socket's path.
fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_owned()
}

async fn read_nodes(client: &kube::Client, config: &FleetConfig) -> Read<Vec<NodeObject>> {
    let mut nodes = Vec::new();
    let selector = config.label_selector.as_deref();
    let requests = list_pages(client, NODES, config, selector, |page: Vec<Node>| {
        nodes.extend(page.into_iter().map(reduce_node));
    })
    .await?;
    Ok((nodes, requests.count()))
}

/// What is judged of a Node: its name, its doctor's condition and its
/// extended resources' capacity.
fn reduce_node(node: Node) -> NodeObject {
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
    let extended_resources = status
        .capacity
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, _)| kpm::device::is_extended_resource_name(name))
        .collect();
    NodeObject { name: node.metadata.name, report: None, condition, extended_resources }
}

async fn read_csi_drivers(client: &kube::Client, config: &FleetConfig) -> Read<BTreeSet<String>> {
    let mut drivers = BTreeSet::new();
    let requests = list_pages(client, CSI_DRIVERS, config, None, |page: Vec<Named>| {
        drivers.extend(page.into_iter().map(|driver| driver.metadata.name));
    })
    .await?;
    Ok((drivers, requests.count()))
}

async fn read_csi_nodes(
    client: &kube::Client,
    config: &FleetConfig,
) -> Read<BTreeMap<String, BTreeSet<String>>> {
    let mut nodes = BTreeMap::new();
    let requests = list_pages(client, CSI_NODES, config, None, |page: Vec<CsiNode>| {
        for csinode in page {
            let drivers = csinode.spec.and_then(|spec| spec.drivers).unwrap_or_default();
            nodes.insert(
                csinode.metadata.name,
                drivers.into_iter().map(|driver| driver.name).collect(),
            );
        }
    })
    .await?;
    Ok((nodes, requests.count()))
}

async fn read_slices(
    client: &kube::Client,
    config: &FleetConfig,
) -> Read<Optional<BTreeMap<String, BTreeMap<String, usize>>>> {
    let mut counts: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    let requests = list_pages(client, RESOURCE_SLICES, config, None, |page: Vec<Slice>| {
        for spec in page.into_iter().filter_map(|slice| slice.spec) {
            // Slices of a node selector or of all nodes (network-attached
            // devices) belong to no one node's driver.
            if let Some(node) = spec.node_name {
                *counts.entry(node).or_default().entry(spec.driver).or_default() += 1;
            }
        }
    })
    .await?;
    let count = requests.count();
    Ok((requests.seen(counts), count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_a_node_doctor_writes_is_read_back_typed() {
        use crate::judge::Row;
        // Written by the node's doctor (plugin_report.rs), read back here.
        let mut rows: Vec<Row> = (0..300)
            .map(|i| {
                let path =
                    std::path::PathBuf::from(format!("/r/plugins_registry/p{i:03}-reg.sock"));
                Row::new(Verdict::Rejected, &path, "registry", "needs v1.x; got 0.3.0".to_owned())
            })
            .collect();
        let mut ok = Row::new(
            Verdict::Ok,
            std::path::Path::new("/r/plugins_registry/gpu.sock"),
            "registry",
            "registered".to_owned(),
        );
        ok.name = Some("vendor.com/gpu".to_owned());
        rows.push(ok);
        let outcome = crate::outcome::Outcome::of(&crate::Report::of_parts(rows, Vec::new(), None));
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let mut status = crate::outcome::status_of(&outcome, &outcome.condition(), &now);
        status.heartbeat_time = Some(now);
        let written = serde_json::json!({
            "apiVersion": "doctor.kpm.io/v1alpha1", "kind": "KubeletPluginReport",
            "metadata": {"name": "n1", "uid": "u"}, "spec": {"nodeName": "n1"},
            "status": status,
        });
        let (name, report) = reduce_report(serde_json::from_value(written).unwrap()).unwrap();
        assert_eq!(name, "n1");
        assert_eq!((report.health.as_str(), report.reason.as_str()), ("Failing", "Rejected"));
        assert_eq!(report.failing_count, 300);
        assert_eq!(report.failing.len(), crate::MAX_ENTRIES, "the bound");
        assert_eq!(report.failing[1].subject, "p001-reg.sock");
        assert_eq!(report.failing[1].verdict, "rejected");
        assert_eq!(report.failing[1].reason, "needs v1.x; got 0.3.0");
        assert!(report.heartbeat_time.is_some());
        // The ok entry was left out by the bound: failing ones come first.
        assert!(report.ok.is_empty());
    }

    #[test]
    fn a_report_of_another_version_is_read_all_the_same() {
        let page: List<Report> = serde_json::from_value(serde_json::json!({
            "items": [
                {"metadata": {"name": "newer"}, "status": {
                    "health": "Wobbly", "reason": "SomeFutureVerdict", "future": {"x": 1},
                    "plugins": [
                        {"socket": "/r/a.sock", "name": "a.example.com", "verdict": "some-future-verdict",
                         "reason": "4 changes in 2m", "since": "2026-01-01T00:00:00Z"},
                        {"socket": "/r/b.sock", "name": "b.example.com", "verdict": "ok",
                         "reason": "fine", "since": "2026-01-01T00:00:00Z"},
                    ]}},
                {"metadata": {"name": "no-status"}},
            ],
        }))
        .unwrap();
        let reports: Vec<(String, NodeReport)> =
            page.items.into_iter().filter_map(reduce_report).collect();
        assert_eq!(reports.len(), 1);
        let (_, newer) = &reports[0];
        assert_eq!(newer.health, "Wobbly");
        // A verdict this reader does not know fails: it is not `ok`.
        assert_eq!(newer.failing[0].verdict, "some-future-verdict");
        assert_eq!(newer.failing_count, 1);
        assert!(newer.ok.contains("b.example.com"));
    }

    #[test]
    fn a_node_page_keeps_the_doctors_condition_and_extended_resources_only() {
        let page: List<Node> = serde_json::from_value(serde_json::json!({
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
        assert_eq!(page.metadata.continue_token.as_deref(), Some("next"));
        let nodes: Vec<NodeObject> = page.items.into_iter().map(reduce_node).collect();
        let condition = nodes[0].condition.as_ref().unwrap();
        assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "Stale"));
        assert_eq!(condition.message, "1 failing: a-reg.sock (stale): refused");
        assert_eq!(condition.last_heartbeat_time.as_deref(), Some("2026-01-01T00:00:00Z"));
        assert_eq!(condition.last_transition_time.as_deref(), Some("2025-12-31T00:00:00Z"));
        let resources: Vec<(&str, &str)> = nodes[0]
            .extended_resources
            .iter()
            .map(|(name, quantity)| (name.as_str(), quantity.as_str()))
            .collect();
        assert_eq!(resources, [("example.com/nic", "0"), ("vendor.com/gpu", "2")]);
        assert_eq!(nodes[1], NodeObject::new("bare"));
    }
}
