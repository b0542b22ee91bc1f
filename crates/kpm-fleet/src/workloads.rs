//! Which DaemonSet serves a driver that is registered on some nodes and
//! not on others, and what its pod is on each node that lacks the driver:
//! none (its taints, `nodeSelector` or affinity keep it off:
//! `scheduling.rs`), Pending, not ready, or ready (then the node's doctor
//! says why).
//!
//! The DaemonSet is learnt from the reports of the nodes where the driver
//! is registered: their doctors name the pod serving each socket. A few
//! requests a driver: a report in full where none was read, the pod, its
//! DaemonSet; then, for each node that lacks it (at most
//! [`MAX_NODES_ASKED`]), the DaemonSet's pods on that node (a label and a
//! field selector, from the watch cache) and, without one, the Node.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kpm_api::PluginKind;
use kpm_report::{KubeletPluginReport, PodContainer, Resource as _};
use kube::api::ListParams;
use kube::core::ObjectList;
use serde::Serialize;

use super::pages::Reader;
use super::scheduling::kept_off;
use super::{FleetError, NodeObject};

/// How many drivers missing somewhere are traced to their DaemonSet.
const MAX_DRIVERS: usize = 16;
/// How many nodes that lack a driver are asked about, per driver.
pub(crate) const MAX_NODES_ASKED: usize = 32;

/// The nodes a driver is registered on, and the names of those it is not.
type OnAndOff<'a> = (Vec<&'a NodeObject>, Vec<&'a str>);

/// The workloads of the drivers registered on some of `nodes` and not on
/// others, by driver.
pub(crate) async fn read_workloads(
    reader: &Reader<'_>,
    nodes: &[NodeObject],
) -> Result<BTreeMap<(PluginKind, String), Workload>, FleetError> {
    let mut on: BTreeMap<(PluginKind, &str), OnAndOff<'_>> = BTreeMap::new();
    let known: Vec<(&NodeObject, &kpm_report::ShownRegistered)> =
        nodes.iter().filter_map(|node| Some((node, node.registered()?))).collect();
    for (node, registered) in &known {
        for (kind, name) in registered.iter() {
            on.entry((kind, name)).or_default().0.push(node);
        }
    }
    for (driver, (registered_on, missing_on)) in &mut on {
        missing_on.extend(
            known
                .iter()
                .filter(|(_, registered)| !registered.contains(driver.0, driver.1))
                .map(|(node, _)| node.name.as_str())
                .filter(|name| !registered_on.iter().any(|node| node.name == *name)),
        );
    }
    let mut workloads = BTreeMap::new();
    let mut fetched = Fetched::new();
    let partial = on.iter().filter(|(_, (_, missing))| !missing.is_empty()).take(MAX_DRIVERS);
    for (&(kind, name), (registered_on, missing_on)) in partial {
        let Some(pod) = serving_pod(reader, registered_on, name, &mut fetched).await? else {
            continue;
        };
        let Some(daemon_set) = owning_daemon_set(reader, &pod).await? else { continue };
        let mut on_nodes = BTreeMap::new();
        for node in missing_on.iter().take(MAX_NODES_ASKED) {
            if let Some(there) = pod_there(reader, &daemon_set, node).await? {
                on_nodes.insert((*node).to_owned(), there);
            }
        }
        let named = format!(
            "{}/{}",
            daemon_set.metadata.namespace.as_deref().unwrap_or_default(),
            daemon_set.metadata.name.as_deref().unwrap_or_default()
        );
        let asked = missing_on.len().min(MAX_NODES_ASKED);
        workloads.insert(
            (kind, name.to_owned()),
            Workload { daemon_set: named, on_nodes, not_asked: missing_on.len() - asked },
        );
    }
    Ok(workloads)
}

/// The pods the reports read in full here name, by node then plugin.
type Fetched = BTreeMap<String, BTreeMap<String, PodContainer>>;

/// The pod container serving `driver` on one of `nodes`, as its doctor's
/// report names it: from a report read in full, else from the first
/// node's, read now (once: `fetched` keeps what it names).
async fn serving_pod(
    reader: &Reader<'_>,
    nodes: &[&NodeObject],
    driver: &str,
    fetched: &mut Fetched,
) -> Result<Option<PodContainer>, FleetError> {
    let read = nodes.iter().find_map(|node| node.report.as_ref()?.pods.get(driver).cloned());
    if read.is_some() {
        return Ok(read);
    }
    let Some(node) = nodes.iter().find(|node| node.report.is_some()) else { return Ok(None) };
    if !fetched.contains_key(&node.name) {
        let path = KubeletPluginReport::url_path(&(), None);
        let report: Option<KubeletPluginReport> =
            reader.get(KubeletPluginReport::plural(&()), &path, &node.name).await?;
        let pods = report
            .and_then(|report| report.status)
            .map(|status| status.plugins)
            .into_iter()
            .flatten()
            .filter_map(|entry| Some((entry.name?, entry.pod?)))
            .collect();
        fetched.insert(node.name.clone(), pods);
    }
    Ok(fetched.get(&node.name).and_then(|pods| pods.get(driver)).cloned())
}

/// The DaemonSet that owns `container`'s pod, if one does.
async fn owning_daemon_set(
    reader: &Reader<'_>,
    container: &PodContainer,
) -> Result<Option<DaemonSet>, FleetError> {
    let namespace = container.namespace.as_str();
    let pods = format!("/api/v1/namespaces/{namespace}/pods");
    let Some(pod) = reader.get::<Pod>(Cow::Borrowed("pods"), &pods, &container.pod).await? else {
        return Ok(None);
    };
    let owner = pod
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .find(|owner| owner.kind == "DaemonSet" && owner.api_version.starts_with("apps/"));
    let Some(owner) = owner else { return Ok(None) };
    let daemon_sets = format!("/apis/apps/v1/namespaces/{namespace}/daemonsets");
    reader.get::<DaemonSet>(Cow::Borrowed("daemonsets"), &daemon_sets, &owner.name).await
}

/// What `daemon_set` runs on `node`: its pod's state, or why it has none;
/// `None` when the Node is gone.
async fn pod_there(
    reader: &Reader<'_>,
    daemon_set: &DaemonSet,
    node: &str,
) -> Result<Option<PodThere>, FleetError> {
    let namespace = daemon_set.metadata.namespace.as_deref().unwrap_or_default();
    let spec = daemon_set.spec.as_ref();
    let selector: Vec<String> = spec
        .and_then(|spec| spec.selector.match_labels.as_ref())
        .into_iter()
        .flatten()
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    let params = ListParams::default()
        .labels(&selector.join(","))
        .fields(&format!("spec.nodeName={node}"))
        .match_any();
    let path = format!("/api/v1/namespaces/{namespace}/pods");
    let mut pods = Vec::new();
    let fold = |page: Vec<Pod>| pods.extend(page);
    reader.list::<ObjectList<Pod>>(Cow::Borrowed("pods"), &path, false, params, fold).await?;
    if let Some(pod) = pods.iter().find(|pod| pod.metadata.deletion_timestamp.is_none()) {
        return Ok(Some(state_of(pod)));
    }
    let Some(node) = reader.get::<Node>(Cow::Borrowed("nodes"), "/api/v1/nodes", node).await?
    else {
        return Ok(None);
    };
    let template = spec.and_then(|spec| spec.template.spec.as_ref());
    let why = template.and_then(|template| kept_off(template, &node)).unwrap_or_else(|| {
        "no pod, and nothing in its spec keeps one off the node (its controller has not made \
         one yet, or cannot: its events say why)"
            .to_owned()
    });
    Ok(Some(PodThere::NotScheduled { why }))
}

/// A DaemonSet's pod as `kubectl get pod` would sum it up.
fn state_of(pod: &Pod) -> PodThere {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let waiting: Vec<String> = status
        .container_statuses
        .iter()
        .flatten()
        .filter(|container| !container.ready)
        .map(|container| {
            let state = container.state.as_ref();
            let waiting = state.and_then(|state| state.waiting.as_ref());
            let terminated = state.and_then(|state| state.terminated.as_ref());
            let how = match (waiting, terminated) {
                (Some(waiting), _) => waiting.reason.clone().unwrap_or_else(|| "waiting".into()),
                (None, Some(ended)) => {
                    format!(
                        "{} (exit {})",
                        ended.reason.as_deref().unwrap_or("terminated"),
                        ended.exit_code
                    )
                }
                (None, None) => "not ready".to_owned(),
            };
            format!("{} {how}, {} restarts", container.name, container.restart_count)
        })
        .collect();
    if status.phase.as_deref() == Some("Pending") {
        let unscheduled = status
            .conditions
            .iter()
            .flatten()
            .find(|condition| condition.type_ == "PodScheduled" && condition.status == "False");
        let why = match unscheduled {
            Some(condition) => format!(
                "{}: {}",
                condition.reason.as_deref().unwrap_or("Unschedulable"),
                condition.message.as_deref().unwrap_or_default()
            ),
            None if !waiting.is_empty() => waiting.join("; "),
            None => "not started yet".to_owned(),
        };
        return PodThere::Pending { pod: name, why };
    }
    if waiting.is_empty() {
        PodThere::Ready { pod: name }
    } else {
        PodThere::NotReady { pod: name, why: waiting.join("; ") }
    }
}

/// The DaemonSet whose pods serve a driver, as the reports of the nodes
/// where it is registered name them, and what it runs on the nodes where
/// the driver is not registered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Workload {
    /// `NAMESPACE/NAME`.
    pub daemon_set: String,
    /// Its pod on each node asked about, by node.
    pub on_nodes: BTreeMap<String, PodThere>,
    /// How many nodes without the driver were not asked about (beyond the
    /// bound the read keeps to).
    pub not_asked: usize,
}

/// A DaemonSet's pod on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum PodThere {
    /// It has none, and why (a taint not tolerated, a `nodeSelector`).
    NotScheduled {
        /// Why.
        why: String,
    },
    /// It is Pending.
    Pending {
        /// The pod.
        pod: String,
        /// Why (its `PodScheduled` condition, its waiting containers).
        why: String,
    },
    /// It runs with containers not ready (crash-looping, waiting).
    NotReady {
        /// The pod.
        pod: String,
        /// Its containers that are not ready and how.
        why: String,
    },
    /// It runs, ready: the node's doctor says why the driver is not
    /// registered.
    Ready {
        /// The pod.
        pod: String,
    },
}

impl std::fmt::Display for PodThere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotScheduled { why } => write!(f, "no pod there: {why}"),
            Self::Pending { pod, why } => write!(f, "its pod {pod} is Pending: {why}"),
            Self::NotReady { pod, why } => write!(f, "its pod {pod} is not ready: {why}"),
            Self::Ready { pod } => write!(f, "its pod {pod} is ready"),
        }
    }
}
