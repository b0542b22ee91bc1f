//! The node info a CSI driver publishes, modelled on the kubelet's
//! `nodeinfomanager` (spec A.8): the Node's node-id annotation and topology
//! labels, and the driver entries of the CSINode object.
//!
//! [`NodeInfoSink`] is where the handler publishes; [`InMemoryNodeInfo`] keeps
//! the result in memory for the status API. The update rules are plain
//! functions over maps ([`set_node_id_annotation`], [`remove_node_id_annotation`],
//! [`add_topology_labels`], [`CsiNode::install_driver`],
//! [`CsiNode::uninstall_driver`]) so that a sink backed by the Kubernetes API
//! can apply exactly the same rules to the Node and CSINode objects it reads,
//! inside its own retry loop.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use async_trait::async_trait;
use parking_lot::Mutex;
use tracing::{debug, error, warn};

use crate::NODE_ID_ANNOTATION;
use crate::error::{CsiError, NodeInfoError};
use crate::store::DriverNodeInfo;

/// Where the CSI handler publishes what a driver reports about this node.
///
/// The in-memory implementation is [`InMemoryNodeInfo`]. One backed by the
/// Kubernetes API patches the Node (annotation and labels) and creates or
/// updates the CSINode, using the same update functions, and reports failures
/// with [`CsiError::UpdateNode`], [`CsiError::UpdateCsiNode`],
/// [`CsiError::UninstallFromCsiNode`] and [`CsiError::UninstallFromNode`].
///
/// Calls for one driver name never overlap; calls for different drivers may.
#[async_trait]
pub trait NodeInfoSink: Send + Sync + 'static {
    /// Publishes `info` for `driver` (`InstallCSIDriver`): the driver's node
    /// id in the node-id annotation, its topology as labels, its CSINode
    /// entry. Fails with [`CsiError::EmptyNodeId`] on an empty node id and
    /// with [`CsiError::TopologyCollision`] when a topology segment
    /// contradicts an existing label.
    async fn install_driver(
        &self,
        driver: &str,
        info: &DriverNodeInfo,
    ) -> Result<(), NodeInfoError>;

    /// Withdraws `driver` (`UninstallCSIDriver`): its CSINode entry and its
    /// annotation entry. Labels stay. An error says the withdrawal is not
    /// done yet: the kubelet gives up there, a sink that keeps what it
    /// publishes true (kpm-kube's) goes on until it is.
    async fn uninstall_driver(&self, driver: &str) -> Result<(), NodeInfoError>;

    /// Publishes a refreshed `info` of an installed `driver` whose
    /// `max_volumes_per_node` changed: its CSINode entry's
    /// `allocatable.count` (the kubelet's `UpdateCSIDriver`). The default
    /// installs the driver again, which changes only that entry when the
    /// node id and topology are the installed ones; a sink with a cheaper
    /// way to change the one field overrides it.
    async fn update_allocatable(
        &self,
        driver: &str,
        info: &DriverNodeInfo,
    ) -> Result<(), NodeInfoError> {
        self.install_driver(driver, info).await
    }
}

/// Sinks are opaque; this lets structs holding them derive `Debug`.
impl fmt::Debug for dyn NodeInfoSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dyn NodeInfoSink")
    }
}

/// What the node publishes about its CSI drivers: the parts of the Node and
/// CSINode objects the kubelet's `nodeinfomanager` writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct NodeInfo {
    /// Node annotations. [`NODE_ID_ANNOTATION`] maps driver names to node ids
    /// as a JSON object with sorted keys; the key is absent when no driver is
    /// installed.
    pub annotations: BTreeMap<String, String>,
    /// Node labels: the drivers' topology segments. Never removed.
    pub labels: BTreeMap<String, String>,
    /// The CSINode object's spec.
    pub csinode: CsiNode,
}

/// The spec of the node's CSINode object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CsiNode {
    /// One entry per installed driver. An updated entry moves to the end,
    /// as with the kubelet.
    pub drivers: Vec<CsiNodeDriver>,
}

/// A driver entry of the CSINode (`spec.drivers[]`), serialized with the
/// Kubernetes API's field names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CsiNodeDriver {
    /// `name`: the driver name.
    pub name: String,
    /// `nodeID`: the driver's node id.
    #[cfg_attr(feature = "serde", serde(rename = "nodeID"))]
    pub node_id: String,
    /// `topologyKeys`: the keys of the driver's topology, sorted; empty when none.
    #[cfg_attr(feature = "serde", serde(rename = "topologyKeys"))]
    pub topology_keys: Vec<String>,
    /// `allocatable.count`: the driver's volume limit, `None` when it reported none.
    #[cfg_attr(
        feature = "serde",
        serde(
            rename = "allocatable",
            skip_serializing_if = "Option::is_none",
            serialize_with = "allocatable"
        )
    )]
    pub allocatable_count: Option<i32>,
}

/// `allocatable_count` as the API has it: `{"count": n}`.
#[cfg(feature = "serde")]
#[allow(
    clippy::ref_option,
    clippy::trivially_copy_pass_by_ref,
    reason = "the signature serde's `serialize_with` calls"
)]
fn allocatable<S: serde::Serializer>(
    count: &Option<i32>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct as _;
    let mut allocatable = serializer.serialize_struct("VolumeNodeResources", 1)?;
    allocatable.serialize_field("count", count)?;
    allocatable.end()
}

impl CsiNodeDriver {
    /// The entry the kubelet builds for `driver`: topology keys sorted, the
    /// limit clamped to `i32::MAX`, a zero or negative limit giving no
    /// allocatable count.
    pub fn new(driver: &str, info: &DriverNodeInfo) -> Self {
        let limit = info.max_volumes_per_node;
        let allocatable_count = if limit > 0 {
            Some(i32::try_from(limit).unwrap_or_else(|_| {
                warn!(plugin = driver, limit, "volume limit exceeds {}; truncating it", i32::MAX);
                i32::MAX
            }))
        } else {
            if limit < 0 {
                error!(plugin = driver, limit, "invalid volume limit; not added to the CSINode");
            }
            None
        };
        Self {
            name: driver.to_owned(),
            node_id: info.node_id.clone(),
            topology_keys: info.topology.keys().cloned().collect(),
            allocatable_count,
        }
    }
}

impl CsiNode {
    /// The entry of `driver`, if installed.
    pub fn driver(&self, driver: &str) -> Option<&CsiNodeDriver> {
        self.drivers.iter().find(|entry| entry.name == driver)
    }

    /// Installs `driver` like the kubelet's `installDriverToCSINode`: if its
    /// entry already has this node id, the same set of topology keys and a
    /// matching allocatable count, nothing changes; otherwise the entry is
    /// rebuilt and appended at the end. Returns whether anything changed.
    pub fn install_driver(&mut self, driver: &str, info: &DriverNodeInfo) -> bool {
        let keys: BTreeSet<&str> = info.topology.keys().map(String::as_str).collect();
        let unchanged = self.drivers.iter().any(|entry| {
            entry.name == driver
                && entry.node_id == info.node_id
                && entry.topology_keys.iter().map(String::as_str).collect::<BTreeSet<_>>() == keys
                && keep_allocatable_count(entry.allocatable_count, info.max_volumes_per_node)
        });
        if unchanged {
            return false;
        }
        self.drivers.retain(|entry| entry.name != driver);
        self.drivers.push(CsiNodeDriver::new(driver, info));
        true
    }

    /// Removes the entry of `driver`; returns whether there was one.
    pub fn uninstall_driver(&mut self, driver: &str) -> bool {
        let before = self.drivers.len();
        self.drivers.retain(|entry| entry.name != driver);
        self.drivers.len() != before
    }
}

/// The kubelet's `keepAllocatableCount`: a limit of 0 keeps an entry without a
/// count, any other limit keeps an entry whose count equals it.
fn keep_allocatable_count(count: Option<i32>, limit: i64) -> bool {
    if limit == 0 { count.is_none() } else { count.is_some_and(|count| i64::from(count) == limit) }
}

impl NodeInfo {
    /// The driver → node id map of the [`NODE_ID_ANNOTATION`] (empty without it).
    pub fn node_ids(&self) -> Result<BTreeMap<String, String>, CsiError> {
        self.annotations
            .get(NODE_ID_ANNOTATION)
            .map_or_else(|| Ok(BTreeMap::new()), |value| parse_node_id_annotation(value))
    }

    /// Installs `driver` (`InstallCSIDriver` without the API round trips): an
    /// empty node id fails, then the node id annotation, the topology labels
    /// and the CSINode entry are updated. All or nothing: on error `self` is
    /// unchanged. Returns whether anything changed.
    pub fn install_driver(
        &mut self,
        driver: &str,
        info: &DriverNodeInfo,
    ) -> Result<bool, CsiError> {
        if info.node_id.is_empty() {
            return Err(CsiError::EmptyNodeId);
        }
        let mut next = self.clone();
        let annotation_changed =
            set_node_id_annotation(&mut next.annotations, driver, &info.node_id)?;
        let labels_changed = add_topology_labels(&mut next.labels, &info.topology)?;
        let csinode_changed = next.csinode.install_driver(driver, info);
        *self = next;
        Ok(annotation_changed || labels_changed || csinode_changed)
    }

    /// Uninstalls `driver` (`UninstallCSIDriver`): the CSINode entry first,
    /// then the annotation entry (the annotation is removed when it becomes
    /// empty). Labels stay. As with the kubelet, an unparsable annotation fails
    /// the second step after the first took effect. Returns whether anything
    /// changed.
    pub fn uninstall_driver(&mut self, driver: &str) -> Result<bool, CsiError> {
        let csinode_changed = self.csinode.uninstall_driver(driver);
        let annotation_changed = remove_node_id_annotation(&mut self.annotations, driver)?;
        Ok(csinode_changed || annotation_changed)
    }
}

/// Parses a [`NODE_ID_ANNOTATION`] value: a JSON object from driver name to
/// node id (`null` reads as empty, as with Go's `json.Unmarshal`).
pub fn parse_node_id_annotation(value: &str) -> Result<BTreeMap<String, String>, CsiError> {
    serde_json::from_str::<Option<BTreeMap<String, String>>>(value)
        .map(Option::unwrap_or_default)
        .map_err(|source| CsiError::ParseAnnotation { value: value.to_owned(), source })
}

/// Encodes the node id map as Go's `json.Marshal` does: sorted keys, and
/// `<`, `>`, `&`, U+2028 and U+2029 escaped.
fn encode_node_ids(
    ids: &BTreeMap<String, String>,
    driver: &str,
    node_id: &str,
) -> Result<String, CsiError> {
    let json = serde_json::to_string(ids).map_err(|source| CsiError::EncodeAnnotation {
        driver: driver.to_owned(),
        node_id: node_id.to_owned(),
        source,
    })?;
    let mut escaped = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => escaped.push_str("\\u003c"),
            '>' => escaped.push_str("\\u003e"),
            '&' => escaped.push_str("\\u0026"),
            '\u{2028}' => escaped.push_str("\\u2028"),
            '\u{2029}' => escaped.push_str("\\u2029"),
            c => escaped.push(c),
        }
    }
    Ok(escaped)
}

/// Sets `driver`'s node id in the [`NODE_ID_ANNOTATION`] of `annotations`
/// (`updateNodeIDInNode`). Unchanged on error. Returns whether it changed.
pub fn set_node_id_annotation(
    annotations: &mut BTreeMap<String, String>,
    driver: &str,
    node_id: &str,
) -> Result<bool, CsiError> {
    let mut ids = match annotations.get(NODE_ID_ANNOTATION) {
        Some(value) => parse_node_id_annotation(value)?,
        None => BTreeMap::new(),
    };
    if ids.get(driver).is_some_and(|current| current == node_id) {
        return Ok(false);
    }
    ids.insert(driver.to_owned(), node_id.to_owned());
    let value = encode_node_ids(&ids, driver, node_id)?;
    annotations.insert(NODE_ID_ANNOTATION.to_owned(), value);
    Ok(true)
}

/// Removes `driver` from the [`NODE_ID_ANNOTATION`] of `annotations`, and the
/// annotation itself when no driver is left (`removeNodeIDFromNode`).
/// Unchanged on error. Returns whether it changed.
pub fn remove_node_id_annotation(
    annotations: &mut BTreeMap<String, String>,
    driver: &str,
) -> Result<bool, CsiError> {
    let Some(value) = annotations.get(NODE_ID_ANNOTATION).filter(|value| !value.is_empty()) else {
        return Ok(false);
    };
    let mut ids = parse_node_id_annotation(value)?;
    let Some(node_id) = ids.remove(driver) else {
        return Ok(false);
    };
    if ids.is_empty() {
        annotations.remove(NODE_ID_ANNOTATION);
    } else {
        let value = encode_node_ids(&ids, driver, &node_id)?;
        annotations.insert(NODE_ID_ANNOTATION.to_owned(), value);
    }
    Ok(true)
}

/// Adds `topology` to `labels` (`updateTopologyLabels`). Every key is checked
/// first: a label with a different value fails with
/// [`CsiError::TopologyCollision`] and changes nothing. Labels are never
/// removed. Returns whether anything changed.
pub fn add_topology_labels(
    labels: &mut BTreeMap<String, String>,
    topology: &BTreeMap<String, String>,
) -> Result<bool, CsiError> {
    for (key, value) in topology {
        match labels.get(key) {
            Some(existing) if existing != value => {
                return Err(CsiError::TopologyCollision {
                    key: key.clone(),
                    reported: value.clone(),
                    existing: existing.clone(),
                });
            }
            _ => {}
        }
    }
    let mut changed = false;
    for (key, value) in topology {
        changed |= labels.insert(key.clone(), value.clone()).is_none();
    }
    Ok(changed)
}

/// A [`NodeInfoSink`] that keeps the [`NodeInfo`] in memory, for the status
/// API and for running without a cluster. Each call is atomic under one lock.
#[derive(Debug, Default)]
pub struct InMemoryNodeInfo {
    node: Mutex<NodeInfo>,
}

impl InMemoryNodeInfo {
    /// A sink starting from `initial` (for example labels the node already has).
    pub fn new(initial: NodeInfo) -> Self {
        Self { node: Mutex::new(initial) }
    }

    /// The node info as it is now.
    pub fn snapshot(&self) -> NodeInfo {
        self.node.lock().clone()
    }
}

#[async_trait]
impl NodeInfoSink for InMemoryNodeInfo {
    async fn install_driver(
        &self,
        driver: &str,
        info: &DriverNodeInfo,
    ) -> Result<(), NodeInfoError> {
        let changed = self.node.lock().install_driver(driver, info)?;
        debug!(plugin = driver, node_id = info.node_id, changed, "installed CSI driver node info");
        Ok(())
    }

    async fn uninstall_driver(&self, driver: &str) -> Result<(), NodeInfoError> {
        let changed = self.node.lock().uninstall_driver(driver)?;
        debug!(plugin = driver, changed, "uninstalled CSI driver node info");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Ports of the kubelet's `nodeinfomanager_test.go` cases that apply to
    //! node info kept in memory (no API objects, owner references or
    //! migration annotations).

    use super::*;

    const DRIVER1: &str = "com.example.csi.driver1";
    const NODE1: &str = "com.example.csi/csi-node1";
    const ZONE: &str = "com.example.csi/zone";
    const RACK: &str = "com.example.csi/rack";
    const OTHER_DRIVER: &str = "net.example.storage.other-driver";
    const OTHER_NODE: &str = "net.example.storage/test-node";
    const OTHER_RACK: &str = "net.example.storage/rack";

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    /// A node with the given node-id annotation JSON (if any), labels and CSINode entries.
    fn node(
        ids_json: Option<&str>,
        labels: &[(&str, &str)],
        drivers: Vec<CsiNodeDriver>,
    ) -> NodeInfo {
        NodeInfo {
            annotations: ids_json
                .map(|json| map(&[(NODE_ID_ANNOTATION, json)]))
                .unwrap_or_default(),
            labels: map(labels),
            csinode: CsiNode { drivers },
        }
    }

    fn entry(name: &str, node_id: &str, keys: &[&str], count: Option<i32>) -> CsiNodeDriver {
        CsiNodeDriver {
            name: name.into(),
            node_id: node_id.into(),
            topology_keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            allocatable_count: count,
        }
    }

    fn info(node_id: &str, limit: i64, topology: &[(&str, &str)]) -> DriverNodeInfo {
        DriverNodeInfo {
            node_id: node_id.into(),
            max_volumes_per_node: limit,
            topology: map(topology),
        }
    }

    const IDS1: &str = r#"{"com.example.csi.driver1":"com.example.csi/csi-node1"}"#;
    const IDS_OTHER: &str =
        r#"{"net.example.storage.other-driver":"net.example.storage/test-node"}"#;
    const IDS_BOTH: &str = r#"{"com.example.csi.driver1":"com.example.csi/csi-node1","net.example.storage.other-driver":"net.example.storage/test-node"}"#;

    struct InstallCase {
        name: &'static str,
        existing: NodeInfo,
        input: DriverNodeInfo,
        /// The node info afterwards, or the error text.
        expected: Result<NodeInfo, String>,
    }

    #[allow(clippy::too_many_lines)] // one table of upstream cases
    fn install_cases() -> Vec<InstallCase> {
        let other_entry = || entry(OTHER_DRIVER, OTHER_NODE, &[OTHER_RACK], None);
        vec![
            InstallCase {
                name: "1 empty node",
                existing: NodeInfo::default(),
                input: info(NODE1, 0, &[(ZONE, "zoneA")]),
                expected: Ok(node(
                    Some(IDS1),
                    &[(ZONE, "zoneA")],
                    vec![entry(DRIVER1, NODE1, &[ZONE], None)],
                )),
            },
            InstallCase {
                name: "2 pre-existing node info from the same driver",
                existing: node(
                    Some(IDS1),
                    &[(ZONE, "zoneA")],
                    vec![entry(DRIVER1, NODE1, &[ZONE], None)],
                ),
                input: info(NODE1, 0, &[(ZONE, "zoneA")]),
                expected: Ok(node(
                    Some(IDS1),
                    &[(ZONE, "zoneA")],
                    vec![entry(DRIVER1, NODE1, &[ZONE], None)],
                )),
            },
            InstallCase {
                name: "3 pre-existing node info from the same driver, but without topology info",
                existing: node(Some(IDS1), &[], vec![entry(DRIVER1, NODE1, &[], None)]),
                input: info(NODE1, 0, &[(ZONE, "zoneA")]),
                expected: Ok(node(
                    Some(IDS1),
                    &[(ZONE, "zoneA")],
                    vec![entry(DRIVER1, NODE1, &[ZONE], None)],
                )),
            },
            InstallCase {
                name: "4 pre-existing node info from a different driver",
                existing: node(Some(IDS_OTHER), &[(OTHER_RACK, "rack1")], vec![other_entry()]),
                input: info(NODE1, 0, &[(ZONE, "zoneA")]),
                expected: Ok(node(
                    Some(IDS_BOTH),
                    &[(OTHER_RACK, "rack1"), (ZONE, "zoneA")],
                    vec![other_entry(), entry(DRIVER1, NODE1, &[ZONE], None)],
                )),
            },
            InstallCase {
                name: "5 same driver, topology value collision",
                existing: node(
                    Some(IDS1),
                    &[(ZONE, "zoneA")],
                    vec![entry(DRIVER1, NODE1, &[ZONE], None)],
                ),
                input: info(NODE1, 0, &[(ZONE, "other-zone")]),
                expected: Err(format!(
                    "detected topology value collision: driver reported \"{ZONE}\":\"other-zone\" \
                     but existing label is \"{ZONE}\":\"zoneA\""
                )),
            },
            InstallCase {
                name: "6 same driver, new node id and topology key",
                existing: node(
                    Some(IDS1),
                    &[(ZONE, "zoneA")],
                    vec![entry(DRIVER1, NODE1, &[ZONE], None)],
                ),
                input: info("com.example.csi/other-node", 0, &[(RACK, "rack1")]),
                expected: Ok(node(
                    Some(r#"{"com.example.csi.driver1":"com.example.csi/other-node"}"#),
                    &[(ZONE, "zoneA"), (RACK, "rack1")],
                    vec![entry(DRIVER1, "com.example.csi/other-node", &[RACK], None)],
                )),
            },
            // Cases 7 and 8 (stale CSINode owner, migration annotation) do not apply.
            InstallCase {
                name: "9 no topology, empty node",
                existing: NodeInfo::default(),
                input: info(NODE1, 0, &[]),
                expected: Ok(node(Some(IDS1), &[], vec![entry(DRIVER1, NODE1, &[], None)])),
            },
            InstallCase {
                name: "10 no topology, pre-existing node info from the same driver",
                existing: node(
                    Some(IDS1),
                    &[(ZONE, "zoneA")],
                    vec![entry(DRIVER1, NODE1, &[ZONE], None)],
                ),
                input: info(NODE1, 0, &[]),
                expected: Ok(node(
                    Some(IDS1),
                    &[(ZONE, "zoneA")],
                    vec![entry(DRIVER1, NODE1, &[], None)],
                )),
            },
            InstallCase {
                name: "11 no topology, pre-existing node info from a different driver",
                existing: node(Some(IDS_OTHER), &[(OTHER_RACK, "rack1")], vec![other_entry()]),
                input: info(NODE1, 0, &[]),
                expected: Ok(node(
                    Some(IDS_BOTH),
                    &[(OTHER_RACK, "rack1")],
                    vec![other_entry(), entry(DRIVER1, NODE1, &[], None)],
                )),
            },
            InstallCase {
                name: "12 empty node id",
                existing: NodeInfo::default(),
                input: info("", 0, &[]),
                expected: Err(
                    "error adding CSI driver node info: driverNodeID must not be empty".into()
                ),
            },
            InstallCase {
                name: "13 new node with a valid volume limit",
                existing: NodeInfo::default(),
                input: info(NODE1, 10, &[]),
                expected: Ok(node(Some(IDS1), &[], vec![entry(DRIVER1, NODE1, &[], Some(10))])),
            },
            InstallCase {
                name: "14 volume limit of MaxInt32",
                existing: NodeInfo::default(),
                input: info(NODE1, i64::from(i32::MAX), &[]),
                expected: Ok(node(
                    Some(IDS1),
                    &[],
                    vec![entry(DRIVER1, NODE1, &[], Some(i32::MAX))],
                )),
            },
            InstallCase {
                name: "15 volume limit above MaxInt32 is clamped",
                existing: NodeInfo::default(),
                input: info(NODE1, i64::from(i32::MAX) + 1, &[]),
                expected: Ok(node(
                    Some(IDS1),
                    &[],
                    vec![entry(DRIVER1, NODE1, &[], Some(i32::MAX))],
                )),
            },
            InstallCase {
                name: "16 volume limit of 0 gives no allocatable count",
                existing: NodeInfo::default(),
                input: info(NODE1, 0, &[]),
                expected: Ok(node(Some(IDS1), &[], vec![entry(DRIVER1, NODE1, &[], None)])),
            },
            InstallCase {
                name: "17 existing CSINode count 10, new limit 20",
                existing: node(Some(IDS1), &[], vec![entry(DRIVER1, NODE1, &[], Some(10))]),
                input: info(NODE1, 20, &[]),
                expected: Ok(node(Some(IDS1), &[], vec![entry(DRIVER1, NODE1, &[], Some(20))])),
            },
            InstallCase {
                name: "negative volume limit gives no allocatable count",
                existing: NodeInfo::default(),
                input: info(NODE1, -1, &[]),
                expected: Ok(node(Some(IDS1), &[], vec![entry(DRIVER1, NODE1, &[], None)])),
            },
            InstallCase {
                name: "unparsable node id annotation",
                existing: node(Some("not json"), &[], vec![]),
                input: info(NODE1, 0, &[]),
                expected: Err("failed to parse node's \"csi.volume.kubernetes.io/nodeid\" \
                     annotation value (\"not json\") err=expected ident at line 1 column 2"
                    .into()),
            },
        ]
    }

    /// `TestInstallCSIDriver`, cases 1-6 and 9-17, through the in-memory sink.
    #[tokio::test]
    async fn install_csi_driver_updates_annotation_labels_and_csinode_like_the_kubelet() {
        for case in install_cases() {
            let sink = InMemoryNodeInfo::new(case.existing.clone());
            let result = sink.install_driver(DRIVER1, &case.input).await;
            match case.expected {
                Ok(expected) => {
                    result.unwrap_or_else(|err| panic!("{}: {err}", case.name));
                    assert_eq!(sink.snapshot(), expected, "{}", case.name);
                }
                Err(text) => {
                    let err = result.expect_err(case.name);
                    assert_eq!(err.to_string(), text, "{}", case.name);
                    assert_eq!(
                        sink.snapshot(),
                        case.existing,
                        "{}: a failed install changes nothing",
                        case.name
                    );
                }
            }
        }
    }

    #[test]
    fn an_identical_install_reports_no_change_and_an_update_moves_the_entry_to_the_end() {
        let mut node = NodeInfo::default();
        assert!(node.install_driver(DRIVER1, &info(NODE1, 0, &[(ZONE, "zoneA")])).unwrap());
        assert!(node.install_driver(OTHER_DRIVER, &info(OTHER_NODE, 0, &[])).unwrap());
        assert!(!node.install_driver(DRIVER1, &info(NODE1, 0, &[(ZONE, "zoneA")])).unwrap());
        assert_eq!(node.csinode.drivers[0].name, DRIVER1, "unchanged entry keeps its place");

        assert!(node.install_driver(DRIVER1, &info(NODE1, 5, &[(ZONE, "zoneA")])).unwrap());
        let names: Vec<_> = node.csinode.drivers.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, [OTHER_DRIVER, DRIVER1], "updated entry moves to the end");
        assert_eq!(node.csinode.driver(DRIVER1).unwrap().allocatable_count, Some(5));
    }

    #[test]
    fn a_collision_on_any_key_changes_no_label() {
        let mut labels = map(&[(RACK, "rack1")]);
        let topology = map(&[(ZONE, "zoneA"), (RACK, "rack2"), ("z", "1")]);
        let err = add_topology_labels(&mut labels, &topology).unwrap_err();
        assert!(matches!(err, CsiError::TopologyCollision { .. }), "{err}");
        assert_eq!(labels, map(&[(RACK, "rack1")]));
    }

    struct UninstallCase {
        name: &'static str,
        existing: NodeInfo,
        expected: NodeInfo,
        changed: bool,
    }

    /// `TestUninstallCSIDriver`, cases 1-5.
    #[tokio::test]
    async fn uninstall_csi_driver_removes_the_entries_but_keeps_labels() {
        let other_entry = || entry(OTHER_DRIVER, OTHER_NODE, &[OTHER_RACK], None);
        let cases = vec![
            UninstallCase {
                name: "1 empty node and empty CSINode",
                existing: NodeInfo::default(),
                expected: NodeInfo::default(),
                changed: false,
            },
            UninstallCase {
                name: "2 pre-existing node info from the same driver",
                existing: node(
                    Some(IDS1),
                    &[(ZONE, "zoneA")],
                    vec![entry(DRIVER1, NODE1, &[ZONE], None)],
                ),
                expected: node(None, &[(ZONE, "zoneA")], vec![]),
                changed: true,
            },
            UninstallCase {
                name: "3 pre-existing node info from a different driver",
                existing: node(Some(IDS_OTHER), &[(OTHER_RACK, "rack1")], vec![other_entry()]),
                expected: node(Some(IDS_OTHER), &[(OTHER_RACK, "rack1")], vec![other_entry()]),
                changed: false,
            },
            UninstallCase {
                name: "4 annotation from the same driver, CSINode without it",
                existing: node(Some(IDS1), &[], vec![]),
                expected: NodeInfo::default(),
                changed: true,
            },
            UninstallCase {
                name: "5 annotation from a different driver, CSINode without it",
                existing: node(Some(IDS_OTHER), &[], vec![]),
                expected: node(Some(IDS_OTHER), &[], vec![]),
                changed: false,
            },
            UninstallCase {
                name: "one of two drivers",
                existing: node(
                    Some(IDS_BOTH),
                    &[(ZONE, "zoneA")],
                    vec![other_entry(), entry(DRIVER1, NODE1, &[ZONE], None)],
                ),
                expected: node(Some(IDS_OTHER), &[(ZONE, "zoneA")], vec![other_entry()]),
                changed: true,
            },
        ];
        for case in cases {
            let mut direct = case.existing.clone();
            assert_eq!(direct.uninstall_driver(DRIVER1).unwrap(), case.changed, "{}", case.name);
            let sink = InMemoryNodeInfo::new(case.existing);
            sink.uninstall_driver(DRIVER1).await.unwrap();
            assert_eq!(sink.snapshot(), case.expected, "{}", case.name);
            assert_eq!(direct, case.expected, "{}", case.name);
        }
    }

    /// `TestInstallCSIDriverExistingAnnotation`.
    #[test]
    fn install_csi_driver_with_an_existing_annotation_adds_the_csinode_entry() {
        for existing_ids in [IDS1, IDS_OTHER] {
            let mut node = node(Some(existing_ids), &[], vec![]);
            node.install_driver(DRIVER1, &info(NODE1, 0, &[])).unwrap();
            let first = &node.csinode.drivers[0];
            assert_eq!((first.name.as_str(), first.node_id.as_str()), (DRIVER1, NODE1));
            assert_eq!(node.node_ids().unwrap().get(DRIVER1).map(String::as_str), Some(NODE1));
        }
    }

    #[test]
    fn the_annotation_is_encoded_like_go_json() {
        let mut annotations = BTreeMap::new();
        set_node_id_annotation(&mut annotations, "b.driver", "node-b").unwrap();
        set_node_id_annotation(&mut annotations, "a.driver", "x<y>&z").unwrap();
        assert_eq!(
            annotations[NODE_ID_ANNOTATION],
            r#"{"a.driver":"x\u003cy\u003e\u0026z","b.driver":"node-b"}"#
        );
        let ids = parse_node_id_annotation(&annotations[NODE_ID_ANNOTATION]).unwrap();
        assert_eq!(ids["a.driver"], "x<y>&z");
        assert!(parse_node_id_annotation("null").unwrap().is_empty());
        assert!(!set_node_id_annotation(&mut annotations, "b.driver", "node-b").unwrap());
    }

    #[test]
    fn removing_from_an_absent_or_empty_annotation_is_a_no_op() {
        let mut annotations = BTreeMap::new();
        assert!(!remove_node_id_annotation(&mut annotations, DRIVER1).unwrap());
        annotations.insert(NODE_ID_ANNOTATION.to_owned(), String::new());
        assert!(!remove_node_id_annotation(&mut annotations, DRIVER1).unwrap());
        annotations.insert(NODE_ID_ANNOTATION.to_owned(), "[1]".to_owned());
        assert!(matches!(
            remove_node_id_annotation(&mut annotations, DRIVER1),
            Err(CsiError::ParseAnnotation { .. })
        ));
    }
}
