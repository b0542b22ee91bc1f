//! Reading the fleet, read-only: `KubeletPluginReports`, Nodes, CSIDrivers,
//! CSINodes and ResourceSlices, each listed page by page (`limit`,
//! `continue`), the five lists at once, through one paging loop. Reports are
//! read with the report crate's own types (`kube::Api<KubeletPluginReport>`);
//! the other objects are parsed into types that hold only what is judged
//! (serde skips the rest: a Node's images, a slice's devices). Each page is
//! folded into [`FleetObjects`] and dropped before the next is asked for, so
//! that 5000 Nodes and 20,000 ResourceSlices take a few megabytes, not the
//! gigabyte their full objects would.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kpm_report::{CONDITION_TYPE, KubeletPluginReport, Resource as _};
use kube::api::{Api, ListParams};
use kube::core::ObjectList;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tracing::debug;

use super::{
    FailingPlugin, FleetConfig, FleetError, FleetObjects, NodeCondition, NodeObject, NodeReport,
};

const NODES: Resource = Resource { name: "nodes", path: "/api/v1/nodes", optional: false };
const CSI_DRIVERS: Resource =
    Resource { name: "csidrivers", path: "/apis/storage.k8s.io/v1/csidrivers", optional: false };
const CSI_NODES: Resource =
    Resource { name: "csinodes", path: "/apis/storage.k8s.io/v1/csinodes", optional: false };
const RESOURCE_SLICES: Resource = Resource {
    name: "resourceslices",
    path: "/apis/resource.k8s.io/v1/resourceslices",
    optional: true,
};

/// A collection of the API server the fleet reads without a type of
/// k8s-openapi's: only what is judged of each object is parsed.
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
            "{plural}: {} ({} {}): nodes are judged by their doctor's condition alone; install \
             the CRD (kubectl apply -k deploy/doctor) and let the reader list {plural} (the \
             kpm-doctor-fleet-reader ClusterRole)",
            status.message,
            status.code,
            status.reason,
            plural = KubeletPluginReport::plural(&()),
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

/// Lists `resource` page by page through `client` as a raw collection,
/// handing each page's items to `fold`.
async fn list_raw<T: DeserializeOwned + Clone>(
    client: &kube::Client,
    resource: Resource,
    config: &FleetConfig,
    label_selector: Option<&str>,
    fold: impl FnMut(Vec<T>),
) -> Result<Listed, FleetError> {
    let request = kube::core::Request::new(resource.path);
    let page = |params: ListParams| {
        let http = request.list(&params).map_err(kube::Error::BuildRequest);
        async move { client.request::<ObjectList<T>>(http?).await }
    };
    list_pages(Cow::Borrowed(resource.name), resource.optional, config, label_selector, page, fold)
        .await
}

/// Lists a collection page by page, `list` asking for one page, handing
/// each page's items to `fold`: the one paging loop of the fleet read.
async fn list_pages<T: Clone, F: Future<Output = Result<ObjectList<T>, kube::Error>>>(
    resource: Cow<'static, str>,
    optional: bool,
    config: &FleetConfig,
    label_selector: Option<&str>,
    mut list: impl FnMut(ListParams) -> F,
    mut fold: impl FnMut(Vec<T>),
) -> Result<Listed, FleetError> {
    let mut params = ListParams::default().limit(config.page_size);
    if let Some(selector) = label_selector {
        params = params.labels(selector);
    }
    let mut page = 0;
    loop {
        page += 1;
        let listed = match tokio::time::timeout(config.request_timeout, list(params.clone())).await
        {
            Ok(Ok(listed)) => listed,
            Ok(Err(kube::Error::Api(status)))
                if optional && page == 1 && matches!(status.code, 403 | 404) =>
            {
                debug!(%resource, code = status.code, "not seen");
                return Ok(Listed::Unseen(status));
            }
            Ok(Err(source)) => return Err(FleetError::List { resource, page, source }),
            Err(_) => {
                return Err(FleetError::Timeout {
                    resource,
                    page,
                    timeout: config.request_timeout,
                });
            }
        };
        debug!(%resource, page, items = listed.items.len(), "listed a page");
        fold(listed.items);
        match listed.metadata.continue_.filter(|token| !token.is_empty()) {
            None => return Ok(Listed::Pages(page)),
            Some(token) if params.continue_token.as_ref() == Some(&token) => {
                return Err(FleetError::Paging { resource, page });
            }
            Some(token) => params.continue_token = Some(token),
        }
    }
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
    let api: Api<KubeletPluginReport> = Api::all(client.clone());
    let mut reports = BTreeMap::new();
    let page = |params: ListParams| {
        let api = api.clone();
        async move { api.list(&params).await }
    };
    // Their path and plural are the custom resource's own.
    let plural = KubeletPluginReport::plural(&());
    let listed = list_pages(plural, true, config, None, page, |page| {
        reports.extend(page.into_iter().filter_map(reduce_report));
    })
    .await?;
    let count = listed.count();
    Ok((listed.seen(reports), count))
}

/// What is judged of a report: its health, reason and heartbeat, the
/// kubelet's version, its failing entries and the names of its ok ones.
fn reduce_report(report: KubeletPluginReport) -> Option<(String, NodeReport)> {
    let name = report.metadata.name?;
    let status = report.status?;
    let mut ok = BTreeSet::new();
    let mut failing = Vec::new();
    for entry in status.plugins {
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
    };
    Some((name, node))
}

/// The last component of a socket's path.
fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_owned()
}

async fn read_nodes(client: &kube::Client, config: &FleetConfig) -> Read<Vec<NodeObject>> {
    let mut nodes = Vec::new();
    let selector = config.label_selector.as_deref();
    let requests = list_raw(client, NODES, config, selector, |page: Vec<Node>| {
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
        .filter(|(name, _)| kpm_api::is_extended_resource_name(name))
        .collect();
    NodeObject { name: node.metadata.name, report: None, condition, extended_resources }
}

async fn read_csi_drivers(client: &kube::Client, config: &FleetConfig) -> Read<BTreeSet<String>> {
    let mut drivers = BTreeSet::new();
    let requests = list_raw(client, CSI_DRIVERS, config, None, |page: Vec<Named>| {
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
    let requests = list_raw(client, CSI_NODES, config, None, |page: Vec<CsiNode>| {
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
    let requests = list_raw(client, RESOURCE_SLICES, config, None, |page: Vec<Slice>| {
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
                     "since": "2026-01-01T00:00:00Z", "pod": "kube-system/a-0"},
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
        let nodes: Vec<NodeObject> = page.items.into_iter().map(reduce_node).collect();
        let condition = nodes[0].condition.as_ref().unwrap();
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
        let resources: Vec<(&str, &str)> = nodes[0]
            .extended_resources
            .iter()
            .map(|(name, quantity)| (name.as_str(), quantity.as_str()))
            .collect();
        assert_eq!(resources, [("example.com/nic", "0"), ("vendor.com/gpu", "2")]);
        assert_eq!(nodes[1], NodeObject::new("bare"));
    }
}
