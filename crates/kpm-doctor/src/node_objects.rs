//! What the API server shows of the node, held against its plugins: CSINode
//! and the CSI node-id annotation, device capacity, DRA ResourceSlices.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use kpm::PluginKind;
use kpm::kube::{NodeObjects, NodeResources};

use crate::device_plugins::LAGGING_DEVICES;
use kpm_report::{ShownRegistered, Verdict};

use crate::found::Found;
use crate::judge::Row;
use crate::pending::{Change, PUBLISHING_HINT, Publishing};
use crate::{Blind, Finding};

/// Marks the rows the cluster contradicts and adds what the cluster shows
/// that no plugin of the node explains, but what `kpm run` is still
/// `publishing`; what could not be read is `found` unseen.
pub(crate) fn compare(objects: &NodeObjects, publishing: &Publishing, found: &mut Found) {
    let first_finding = found.findings.len();
    compare_all(objects, found);
    let Found { plugins: rows, findings, .. } = found;
    for row in rows.iter_mut().filter(|row| row.verdict.fails()) {
        let (Some(kind), Some(name)) = (row.kind, &row.name) else { continue };
        if let Some(reason) = publishing.excuse(kind, Change::Add, name, &row.reason) {
            (row.verdict, row.reason) = (Verdict::Publishing, reason);
            PUBLISHING_HINT.clone_into(&mut row.hint);
        }
    }
    for finding in &mut findings[first_finding..] {
        let (Some(object), Some(name)) = (finding.verdict.object(), &finding.name) else {
            continue;
        };
        if let Some(reason) =
            publishing.excuse(object.kind(), Change::Remove, name, &finding.reason)
        {
            (finding.verdict, finding.reason) = (Verdict::Publishing, reason);
            PUBLISHING_HINT.clone_into(&mut finding.hint);
        }
    }
}

/// Each kind's plugins held against the objects that register them in
/// the cluster, kind by kind: one arm per kind, so that a new kind says
/// how the doctor judges it.
fn compare_all(objects: &NodeObjects, found: &mut Found) {
    for kind in PluginKind::ALL {
        match kind {
            PluginKind::Csi => compare_csi(objects, found),
            PluginKind::Device => compare_devices(objects, found),
            PluginKind::Dra => compare_dra(objects, found),
        }
    }
}

/// The drivers of `kind` the kubelet holds a registration of: those whose
/// plugin answered `GetInfo` (a name told), ok or failing otherwise. A
/// driver that hangs behind a live registrar is registered still: its
/// CSINode entry and slices are its own, not another's leftovers.
fn registered(rows: &[Row], kind: PluginKind) -> BTreeSet<String> {
    rows.iter()
        .filter(|row| {
            row.kind == Some(kind)
                && !matches!(row.verdict, Verdict::Stale | Verdict::DeletedButListening)
        })
        .filter_map(|row| row.name.clone())
        .collect()
}

/// Live CSI drivers against the CSINode and the node-id annotation, and
/// the CSINode's entries no live driver serves.
fn compare_csi(objects: &NodeObjects, found: &mut Found) {
    let Found { plugins: rows, findings, unseen, .. } = found;
    let node = &objects.node;
    match &objects.csi_drivers {
        Ok(drivers) => {
            let empty = BTreeMap::default();
            let drivers = drivers.as_ref().unwrap_or(&empty);
            let annotation = match &objects.resources {
                Ok(Some(resources)) => Some(&resources.csi_node_ids),
                _ => None,
            };
            for row in csi_rows(rows) {
                check_csi(
                    node,
                    row,
                    drivers,
                    annotation,
                    objects.csi_drivers.as_ref().is_ok_and(Option::is_some),
                );
            }
            let served = registered(rows, PluginKind::Csi);
            for name in drivers.keys().filter(|name| !served.contains(*name)) {
                findings.push(kept_for(
                    rows,
                    name,
                    Kept {
                        verdict: Verdict::StaleCsiNodeEntry,
                        path: PathBuf::from(format!("csinodes/{node}")),
                        what: format!("CSINode {node} lists driver {name}, but no plugin of this node registers it"),
                        restart: "the driver's registrar (node-driver-registrar)",
                        then: "drops the entry by itself".into(),
                        otherwise: "the kubelet drops the entry only when the driver deregisters (its \
                                    registration socket removed while the kubelet runs); one removed while \
                                    the kubelet was down, or left by a driver a restarted kubelet could no \
                                    longer reach, stays, restarts included: remove the entry \
                                    (kubectl edit csinode NODE), or run the driver again and remove it \
                                    cleanly"
                            .into(),
                    },
                ));
            }
        }
        Err(err) => unseen.push(format!("CSINode {node}: {err}")),
    }
}

/// Live device plugins against the Node's capacity, and the capacity no
/// live plugin serves.
fn compare_devices(objects: &NodeObjects, found: &mut Found) {
    let Found { plugins: rows, findings, unseen, .. } = found;
    let node = &objects.node;
    match &objects.resources {
        Ok(Some(resources)) => {
            for row in rows.iter_mut().filter(|row| is_live(row, PluginKind::Device)) {
                check_capacity(node, row, resources);
            }
            kept_capacity(node, rows, resources, findings, unseen);
        }
        Ok(None) => unseen.push(format!("Node {node}: not found; device capacity not compared")),
        Err(err) => unseen.push(format!("Node {node}: {err}")),
    }
}

/// Live DRA drivers against the node's ResourceSlices, and the slices no
/// live driver serves.
fn compare_dra(objects: &NodeObjects, found: &mut Found) {
    let Found { plugins: rows, findings, unseen, .. } = found;
    let node = &objects.node;
    match &objects.slice_drivers {
        Ok(slices) => {
            for row in rows.iter_mut().filter(|row| is_live(row, PluginKind::Dra)) {
                let name = row.name.clone().unwrap_or_default();
                if let Some(count) = slices.get(&name) {
                    row.api_objects = Some(format!("{count} ResourceSlice(s) of this node"));
                } else {
                    row.verdict = Verdict::NotPublished;
                    row.reason =
                        format!("the driver is live, but no ResourceSlice of node {node} names it");
                    row.hint = "it has not published its devices: see the driver's logs (its \
                                ResourceSlice controller needs RBAC on resourceslices)"
                        .into();
                }
            }
            let served = registered(rows, PluginKind::Dra);
            let (then, otherwise) = match kpm_minors::slice_wipe_delay(kubelet_version(objects)) {
                Some(delay) => {
                    let delay = humantime::format_duration(delay);
                    (
                        format!(
                            "deregisters it and wipes its slices after its grace period ({delay})"
                        ),
                        format!(
                            "the kubelet wipes them once the driver has been gone for its grace \
                             period ({delay}): start the driver if it should be here"
                        ),
                    )
                }
                None => (
                    "deregisters it and wipes its slices at once".to_owned(),
                    "this node's kubelet wipes a driver's slices as soon as the driver \
                     deregisters, so these outlived it (the kubelet was down, or its wipe failed) \
                     or another writer left them: start the driver if it should be here, or \
                     remove them"
                        .to_owned(),
                ),
            };
            for (driver, count) in slices.iter().filter(|(driver, _)| !served.contains(*driver)) {
                findings.push(kept_for(
                    rows,
                    driver,
                    Kept {
                        verdict: Verdict::OrphanedSlices,
                        path: PathBuf::from(format!("resourceslices/{driver}")),
                        what: format!("{count} ResourceSlice(s) of node {node} from driver {driver}, which no plugin of this node registers"),
                        restart: "the driver",
                        then: then.clone(),
                        otherwise: otherwise.clone(),
                    },
                ));
            }
        }
        Err(err) => unseen.push(format!("ResourceSlices of node {node}: {err}")),
    }
}

/// The kubelet's version its Node reports (`nodeInfo.kubeletVersion`),
/// when the Node could be read.
pub(crate) fn kubelet_version(objects: &NodeObjects) -> Option<&str> {
    objects.resources.as_ref().ok()?.as_ref()?.kubelet_version.as_deref()
}

/// Device resources the Node still counts, none allocatable, that no live
/// device plugin of the node serves: what the kubelet (and `kpm run`)
/// keeps of a plugin that stopped. Its devices stay in the capacity,
/// unhealthy, for the grace period (`endpointStopGracePeriod`, 5 min), and
/// come back when the plugin registers again; the capacity drops to 0 once
/// the grace period is over. Its socket plays no part: the kubelet learns
/// of the stop from the plugin's `ListAndWatch` stream. A resource with
/// allocatable devices and no plugin is one advertised by hand, which is
/// allowed, and a capacity of 0 is what the kubelet leaves of a resource
/// it dropped.
fn kept_capacity(
    node: &str,
    rows: &[Row],
    resources: &NodeResources,
    findings: &mut Vec<Finding>,
    unseen: &mut Vec<String>,
) {
    let live: Vec<&Row> = rows.iter().filter(|row| is_live(row, PluginKind::Device)).collect();
    let kept = resources.capacity.iter().filter(|(resource, capacity)| {
        kpm::device::is_extended_resource_name(resource)
            && capacity.as_str() != "0"
            && resources.allocatable.get(*resource).is_none_or(|allocatable| allocatable == "0")
            && !live.iter().any(|row| row.name.as_ref() == Some(*resource))
    });
    // A live plugin whose resource is not known may be the one: all its
    // devices unhealthy look the same from the Node.
    let unnamed: Vec<String> = live
        .iter()
        .filter(|row| row.name.is_none())
        .map(|row| row.path.display().to_string())
        .collect();
    let grace = humantime::format_duration(kpm::device::DEFAULT_GRACE_PERIOD);
    for (resource, capacity) in kept {
        if !unnamed.is_empty() {
            unseen.push(format!(
                "Node {node}: capacity {capacity} of {resource}, none allocatable, not held \
                 against a plugin: the resource of {} is not known",
                unnamed.join(", ")
            ));
            continue;
        }
        findings.push(Finding {
            verdict: Verdict::OrphanedCapacity,
            path: PathBuf::from(format!("nodes/{node}")),
            name: Some(resource.clone()),
            reason: format!(
                "Node {node} counts {capacity} device(s) of resource {resource}, none \
                 allocatable, and no live device plugin of this node serves it: its plugin \
                 stopped, and the kubelet keeps its devices, unhealthy, for {grace}"
            ),
            hint: format!(
                "start the device plugin if it should run here: its devices come back when it \
                 registers; if not, the kubelet sets the capacity to 0 within {grace} of the \
                 plugin's stop. If it stays longer, something else set it (a patch of the \
                 Node's status): remove it the same way"
            ),
            cause: None,
        });
    }
}

/// What the node's objects show registered, as its report tells the fleet
/// view ([`ShownRegistered::shown_by`]); none when one of them could not be
/// read. A Node not found shows no capacity.
pub(crate) fn shown(objects: &NodeObjects) -> Option<ShownRegistered> {
    let (Ok(csi_node), Ok(node), Ok(slices)) =
        (&objects.csi_drivers, &objects.resources, &objects.slice_drivers)
    else {
        return None;
    };
    let csi_node = csi_node.iter().flat_map(BTreeMap::keys).map(String::as_str);
    let capacity = node.iter().flat_map(|node| &node.capacity);
    Some(ShownRegistered::shown_by(
        csi_node,
        capacity.map(|(resource, quantity)| (resource.as_str(), quantity.as_str())),
        slices.iter().map(|(driver, count)| (driver.as_str(), *count)),
    ))
}

/// Why nothing of the cluster could be read, when nothing could: the
/// doctor was asked to hold the plugins against it and could not.
pub(crate) fn unread(objects: &NodeObjects) -> Option<Blind> {
    let (Err(csi), Err(_), Err(_)) =
        (&objects.csi_drivers, &objects.resources, &objects.slice_drivers)
    else {
        return None;
    };
    Some(Blind {
        why: format!("the API server could not be read about node {}: {csi}", objects.node),
        hint: "check that the API server is reachable with --kubeconfig (or the pod's service \
               account), that the node's name is right (--node-name), and that the account may \
               get nodes and csinodes and list resourceslices"
            .to_owned(),
    })
}

/// What the cluster keeps of a driver no live plugin serves, and how each
/// case is fixed.
struct Kept {
    verdict: Verdict,
    path: PathBuf,
    /// What the cluster shows.
    what: String,
    /// What to restart when the driver's socket is stale.
    restart: &'static str,
    /// What the kubelet does once that socket is gone.
    then: String,
    /// The fix when no socket of the driver is left.
    otherwise: String,
}

/// The finding of `kept`: explained by `driver`'s stale registration
/// socket when one is left, as `kept.otherwise` says when not.
fn kept_for(rows: &[Row], driver: &str, kept: Kept) -> Finding {
    let Kept { verdict, path, what, restart, then, otherwise } = kept;
    match stale_socket_of(rows, driver) {
        Some(socket) => Finding {
            verdict,
            path,
            name: Some(driver.to_owned()),
            reason: format!(
                "{what}: its registration socket {} is still in the registry with nobody \
                 listening (stale), so the kubelet keeps the driver registered",
                socket.display()
            ),
            hint: format!(
                "restart {restart}, or remove {}: the kubelet then {then}",
                socket.display()
            ),
            cause: Some(socket),
        },
        None => Finding {
            verdict,
            path,
            name: Some(driver.to_owned()),
            reason: what,
            hint: otherwise,
            cause: None,
        },
    }
}

/// The stale registration socket of `driver`, the one a plugin that died
/// left behind: node-driver-registrar and the DRA kubelet-plugin helper name
/// theirs `<driver>-reg.sock` (`<driver>-<uid>-reg.sock` for a rolling
/// update). The kubelet keeps a plugin registered as long as its socket
/// stays, so what it published stays too.
fn stale_socket_of(rows: &[Row], driver: &str) -> Option<PathBuf> {
    rows.iter()
        .filter(|row| row.verdict == Verdict::Stale)
        .find(|row| {
            let name = row.path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
            name.strip_prefix(driver).is_some_and(|rest| rest.starts_with('-'))
        })
        .map(|row| row.path.clone())
}

/// Whether `row` is a plugin of `kind` the kubelet would keep.
fn is_live(row: &Row, kind: PluginKind) -> bool {
    row.verdict == Verdict::Ok && row.kind == Some(kind)
}

fn csi_rows(rows: &mut [Row]) -> impl Iterator<Item = &mut Row> {
    rows.iter_mut().filter(|row| is_live(row, PluginKind::Csi))
}

/// A live CSI driver against CSINode and the node-id annotation.
fn check_csi(
    node: &str,
    row: &mut Row,
    drivers: &BTreeMap<String, String>,
    annotation: Option<&BTreeMap<String, String>>,
    csinode_exists: bool,
) {
    let name = row.name.clone().unwrap_or_default();
    let reported = row
        .service
        .as_deref()
        .and_then(|report| (report as &dyn Any).downcast_ref::<kpm::csi::DriverNodeInfo>())
        .map(|info| info.node_id.clone());
    let Some(listed) = drivers.get(&name) else {
        row.verdict = Verdict::NotRegistered;
        row.reason = if csinode_exists {
            format!(
                "the driver answers, but CSINode {node} does not list it: the kubelet did not register it"
            )
        } else {
            format!(
                "the driver answers, but CSINode {node} does not exist: the kubelet registered no CSI driver"
            )
        };
        row.hint = format!(
            "pods using it fail with \"driver name {name} not found in the list of registered CSI drivers\": \
             the kubelet does not see this socket (is its root this one?) or refused it: see the kubelet's log"
        );
        return;
    };
    row.api_objects = Some(format!("CSINode: node id {listed}"));
    let annotated = annotation.and_then(|ids| ids.get(&name));
    if let Some(reported) =
        reported.filter(|reported| reported != listed || annotated.is_some_and(|a| a != reported))
    {
        row.verdict = Verdict::ClusterMismatch;
        row.reason = format!(
            "NodeGetInfo says node id {reported}; CSINode {node} says {listed}, the node's annotation {}",
            annotated.map_or("nothing", String::as_str)
        );
        row.hint =
            "the driver changed its node id after it registered: restart its registrar so that \
                    the kubelet registers it again"
                .into();
    }
}

/// A live device plugin against the Node's capacity and allocatable.
fn check_capacity(node: &str, row: &mut Row, resources: &NodeResources) {
    // A plugin on kubelet.sock the checkpoint did not name has no resource
    // to look up.
    let (Some(name), Some(report)) = (row.name.clone(), row.device_report().cloned()) else {
        return;
    };
    let (capacity, allocatable) = (resources.capacity.get(&name), resources.allocatable.get(&name));
    let Some(capacity) = capacity else {
        row.verdict = Verdict::NotRegistered;
        row.reason = format!(
            "the plugin lists {} devices, but Node {node} has no capacity for {name}",
            report.devices
        );
        row.hint = "the kubelet did not register it: see the kubelet's log (device manager)".into();
        return;
    };
    let allocatable = allocatable.map_or("0", String::as_str);
    row.api_objects = Some(format!("Node capacity {capacity}, allocatable {allocatable}"));
    if capacity != &report.devices.to_string() || allocatable != report.healthy.to_string() {
        row.verdict = Verdict::ClusterMismatch;
        row.reason = format!(
            "the plugin lists {} devices, {} healthy; Node {node} shows capacity {capacity}, allocatable {allocatable}",
            report.devices, report.healthy
        );
        row.hint = LAGGING_DEVICES.into();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use serde_json::json;

    use super::*;
    use crate::publish::stand_in;

    const SOCKET: &str = "/r/plugins_registry/csi.example.com-reg.sock";

    /// What the stand-in API server shows of `node1` whose CSINode lists
    /// `csi.example.com`.
    async fn listed() -> NodeObjects {
        let (client, state) = stand_in::client("node1");
        state.lock().csinode = Some(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": "node1", "resourceVersion": "1"},
            "spec": {"drivers": [{"name": "csi.example.com", "nodeID": "node1", "topologyKeys": null}]},
        }));
        kpm::kube::observe_node(client, "node1", kpm::kube::KubeConfig::default()).await
    }

    fn csi_row(verdict: Verdict, name: Option<&str>) -> Row {
        let mut row = Row::new(verdict, Path::new(SOCKET), "registry", "x".to_owned());
        row.kind = Some(PluginKind::Csi);
        row.name = name.map(str::to_owned);
        row
    }

    fn findings_of(objects: &NodeObjects, rows: Vec<Row>) -> Vec<Finding> {
        let mut found = Found { plugins: rows, ..Found::default() };
        compare(objects, &Publishing::default(), &mut found);
        found.findings
    }

    /// What the report tells the fleet: the CSINode's drivers, the
    /// Node's nonzero extended resources, the drivers with slices of the
    /// node; nothing when an object could not be read.
    #[tokio::test]
    async fn the_objects_read_say_what_the_report_shows_registered() {
        let (client, state) = stand_in::client("node1");
        {
            let mut state = state.lock();
            state.csinode = Some(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": {"name": "node1", "resourceVersion": "1"},
                "spec": {"drivers": [{"name": "csi.example.com", "nodeID": "node1", "topologyKeys": null}]},
            }));
            let node = state.node.as_mut().unwrap();
            node["status"]["capacity"] =
                json!({"cpu": "4", "vendor.com/gpu": "2", "example.com/gone": "0"});
            state.slices.push(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": "s1", "resourceVersion": "1"},
                "spec": {"driver": "gpu.example.com", "nodeName": "node1",
                         "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}},
            }));
        }
        let config = kpm::kube::KubeConfig::default();
        let objects = kpm::kube::observe_node(client, "node1", config).await;
        assert_eq!(
            shown(&objects).map(|shown| shown.to_string()).as_deref(),
            Some("CSIPlugin:csi.example.com,DevicePlugin:vendor.com/gpu,DRAPlugin:gpu.example.com")
        );
        // Each of the three reads is served from the watch cache, not etcd.
        let reads = state.lock().reads.clone();
        assert_eq!(reads.len(), 3, "{reads:?}");
        assert!(reads.iter().all(|read| read.contains("resourceVersion=0")), "{reads:?}");
        let timeout = kpm::kube::KubeError::Timeout {
            verb: "list",
            resource: "resourceslices",
            name: "spec.nodeName=node1".into(),
            timeout: std::time::Duration::from_secs(5),
        };
        let mut unread = objects;
        unread.slice_drivers = Err(timeout);
        assert_eq!(shown(&unread), None, "a part not read is not shown as none");
    }

    #[tokio::test]
    async fn a_driver_that_hangs_behind_its_registrar_keeps_its_csinode_entry() {
        let objects = listed().await;
        // The registrar answered GetInfo; the driver's own service hangs.
        let hung = csi_row(Verdict::ServiceFailing, Some("csi.example.com"));
        let findings = findings_of(&objects, vec![hung]);
        assert!(findings.iter().all(|f| f.verdict != Verdict::StaleCsiNodeEntry), "{findings:?}");
    }

    #[tokio::test]
    async fn an_entry_kept_for_a_stale_socket_names_it_as_its_cause() {
        let objects = listed().await;
        let findings = findings_of(&objects, vec![csi_row(Verdict::Stale, None)]);
        let entry = findings.iter().find(|f| f.verdict == Verdict::StaleCsiNodeEntry).unwrap();
        assert_eq!(entry.cause.as_deref(), Some(Path::new(SOCKET)));
        assert_eq!(entry.name.as_deref(), Some("csi.example.com"));
        assert!(entry.reason.starts_with("CSINode node1 lists driver csi.example.com, but no plugin of this node registers it: its registration socket"), "{}", entry.reason);
        // With no socket left at all, the entry is the kubelet's to drop.
        let findings = findings_of(&objects, Vec::new());
        let entry = findings.iter().find(|f| f.verdict == Verdict::StaleCsiNodeEntry).unwrap();
        assert!(entry.cause.is_none());
        assert!(
            entry.hint.starts_with("the kubelet drops the entry only when the driver deregisters")
        );
        assert!(entry.hint.contains("restarts included"), "{}", entry.hint);
    }
}
