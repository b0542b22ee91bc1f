//! Judging the fleet, without IO: what each node's doctor says (healthy,
//! failing, silent, none), which plugins it names as failing, and for each
//! CSI driver, device-plugin resource and DRA driver, the nodes where it is
//! registered and why it is not on the others.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use super::{
    DoctorState, DriverKind, DriverView, FailingPlugin, Fleet, FleetObjects, NodeObject, NodeView,
    NotOn,
};
use crate::judge::Verdict;

/// Judges `objects` as of `now`: a doctor whose last heartbeat is older
/// than `stale_after` is silent. Drivers come by kind then name, nodes by
/// name.
pub fn judge_fleet(objects: &FleetObjects, now: SystemTime, stale_after: Duration) -> Fleet {
    let mut selected: Vec<&NodeObject> = objects.nodes.iter().collect();
    selected.sort_by(|a, b| a.name.cmp(&b.name));
    selected.dedup_by(|a, b| a.name == b.name);
    let nodes: Vec<NodeView> =
        selected.iter().map(|node| node_view(node, now, stale_after)).collect();

    let mut drivers = Vec::new();
    // CSI: the CSIDriver objects, and every driver a selected node's
    // CSINode lists; registered where that CSINode lists it.
    let csi_on = |node: &str, driver: &str| {
        objects.csi_nodes.get(node).is_some_and(|drivers| drivers.contains(driver))
    };
    let mut csi: BTreeSet<&str> = objects.csi_drivers.iter().map(String::as_str).collect();
    for node in &selected {
        csi.extend(objects.csi_nodes.get(&node.name).into_iter().flatten().map(String::as_str));
    }
    for name in csi {
        let has_object = objects.csi_drivers.contains(name);
        drivers.push(driver_view(DriverKind::Csi, name, has_object, &nodes, |node| {
            csi_on(node, name)
        }));
    }
    // Device plugins: the extended resources of the selected nodes;
    // registered where the capacity is not zero (the kubelet zeroes the
    // capacity of a resource whose plugin is gone).
    let capacity = |node: &NodeObject, name: &str| {
        node.extended_resources.get(name).is_some_and(|quantity| nonzero(quantity))
    };
    let by_name: BTreeMap<&str, &NodeObject> =
        selected.iter().map(|node| (node.name.as_str(), *node)).collect();
    let resources: BTreeSet<&str> = selected
        .iter()
        .flat_map(|node| node.extended_resources.keys().map(String::as_str))
        .collect();
    for name in resources {
        drivers.push(driver_view(DriverKind::DevicePlugin, name, false, &nodes, |node| {
            by_name.get(node).is_some_and(|node| capacity(node, name))
        }));
    }
    // DRA: the drivers of the selected nodes' ResourceSlices.
    let dra: BTreeSet<&str> = selected
        .iter()
        .flat_map(|node| objects.slices.get(&node.name).into_iter().flatten())
        .filter(|(_, count)| **count > 0)
        .map(|(driver, _)| driver.as_str())
        .collect();
    for name in dra {
        drivers.push(driver_view(DriverKind::Dra, name, false, &nodes, |node| {
            objects.slices.get(node).and_then(|drivers| drivers.get(name)).is_some_and(|n| *n > 0)
        }));
    }
    Fleet { drivers, nodes, unseen: objects.unseen.clone() }
}

/// One driver across `nodes`, registered on those `on` says.
fn driver_view(
    kind: DriverKind,
    name: &str,
    has_object: bool,
    nodes: &[NodeView],
    on: impl Fn(&str) -> bool,
) -> DriverView {
    let (registered, missing): (Vec<&NodeView>, Vec<&NodeView>) =
        nodes.iter().partition(|node| on(&node.name));
    // A driver on no selected node and without an object is meant for
    // other nodes: listing every node would say nothing.
    let not_on = if registered.is_empty() && !has_object {
        Vec::new()
    } else {
        missing
            .iter()
            .map(|node| NotOn { node: node.name.clone(), why: why_not(node, name) })
            .collect()
    };
    DriverView {
        kind,
        name: name.to_owned(),
        has_object,
        registered: registered.len(),
        nodes: nodes.len(),
        not_on,
    }
}

/// Why `driver` is not registered on `node`, as far as its doctor tells:
/// the failing plugin of its message that names the driver, else the
/// message if it names it, else the doctor's reason, else that there is no
/// doctor or it is silent.
fn why_not(node: &NodeView, driver: &str) -> String {
    match &node.doctor {
        DoctorState::Healthy | DoctorState::Failing { .. } => {}
        DoctorState::NoDoctor => return "no doctor there".to_owned(),
        DoctorState::Silent { since: Some(since) } => {
            return format!("its doctor is silent since {since}");
        }
        DoctorState::Silent { since: None } => {
            return "its doctor is silent (no heartbeat)".to_owned();
        }
    }
    let named = |exact: bool| {
        node.failing_plugins
            .iter()
            .find(|plugin| if exact { plugin.name == driver } else { plugin.name.contains(driver) })
    };
    if let Some(plugin) = named(true).or_else(|| named(false)) {
        return format!("{} ({}): {}", plugin.name, plugin.verdict.name(), plugin.reason);
    }
    match &node.doctor {
        DoctorState::Failing { message, .. } if message.contains(driver) => message.clone(),
        DoctorState::Failing { reason, .. } => format!("its doctor: {reason}, not naming it"),
        _ => "its doctor: all plugins ok, none of this name".to_owned(),
    }
}

/// What `node`'s doctor says as of `now`.
fn node_view(node: &NodeObject, now: SystemTime, stale_after: Duration) -> NodeView {
    let view = |doctor| NodeView {
        name: node.name.clone(),
        doctor,
        failing_plugins: Vec::new(),
        more_failing: 0,
    };
    let Some(condition) = &node.condition else {
        return view(DoctorState::NoDoctor);
    };
    let heartbeat = condition
        .last_heartbeat_time
        .as_deref()
        .and_then(|t| humantime::parse_rfc3339_weak(t).ok());
    // A heartbeat ahead of this clock (skew) is fresh.
    let silent = heartbeat
        .is_none_or(|heartbeat| now.duration_since(heartbeat).is_ok_and(|age| age > stale_after));
    if silent {
        return view(DoctorState::Silent { since: condition.last_heartbeat_time.clone() });
    }
    if condition.status == "True" {
        return view(DoctorState::Healthy);
    }
    // `False`, or `Unknown` (nobody could tell): not healthy either way.
    let (failing_plugins, more_failing) = failing_plugins(&condition.message);
    NodeView {
        failing_plugins,
        more_failing,
        ..view(DoctorState::Failing {
            reason: condition.reason.clone(),
            message: condition.message.clone(),
        })
    }
}

/// The failing plugins a doctor's message names (`2 failing: a-reg.sock
/// (stale): refused; vendor.com/gpu (not-registered): …; and 3 more`),
/// and how many more it counts than it names.
fn failing_plugins(message: &str) -> (Vec<FailingPlugin>, usize) {
    let Some((count, list)) = message.split_once(" failing: ") else {
        return (Vec::new(), 0);
    };
    let mut plugins: Vec<FailingPlugin> = Vec::new();
    let pieces: Vec<&str> = list.split("; ").collect();
    for (i, piece) in pieces.iter().enumerate() {
        if let Some(plugin) = failing_plugin(piece) {
            plugins.push(plugin);
        } else if i + 1 == pieces.len() && piece.starts_with("and ") && piece.ends_with(" more") {
            // The count below says how many.
        } else if let Some(last) = plugins.last_mut() {
            // A reason with "; " of its own.
            last.reason.push_str("; ");
            last.reason.push_str(piece);
        }
    }
    let total = count.parse::<usize>().unwrap_or(plugins.len());
    let more = total.saturating_sub(plugins.len());
    (plugins, more)
}

/// `SUBJECT (VERDICT): REASON`, with a verdict of the doctor's.
fn failing_plugin(piece: &str) -> Option<FailingPlugin> {
    let (head, reason) = piece.split_once("): ")?;
    let (name, verdict) = head.rsplit_once(" (")?;
    let verdict = Verdict::ALL.into_iter().find(|known| known.name() == verdict)?;
    Some(FailingPlugin { name: name.to_owned(), verdict, reason: reason.to_owned() })
}

/// Whether a quantity is not zero: some digit of its number is not `0`
/// (`0`, `0k`, `0.0` are zero; `1`, `100m`, `2Gi` are not).
fn nonzero(quantity: &str) -> bool {
    quantity
        .trim_start_matches(['+', '-'])
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .any(|c| c.is_ascii_digit() && c != '0')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::NodeCondition;
    use crate::judge::Row;
    use crate::{PluginsCondition, Report};

    const HOUR: Duration = Duration::from_secs(3600);

    fn now() -> SystemTime {
        humantime::parse_rfc3339("2026-03-01T12:00:00Z").unwrap()
    }

    fn at(minutes_ago: u64) -> String {
        humantime::format_rfc3339_seconds(now() - Duration::from_secs(60 * minutes_ago)).to_string()
    }

    fn node(
        name: &str,
        condition: Option<NodeCondition>,
        resources: &[(&str, &str)],
    ) -> NodeObject {
        NodeObject {
            name: name.to_owned(),
            condition,
            extended_resources: resources
                .iter()
                .map(|(name, quantity)| ((*name).to_owned(), (*quantity).to_owned()))
                .collect(),
        }
    }

    fn condition(status: &str, reason: &str, message: &str, minutes_ago: u64) -> NodeCondition {
        NodeCondition {
            last_heartbeat_time: Some(at(minutes_ago)),
            last_transition_time: Some(at(minutes_ago + 100)),
            ..NodeCondition::new(status, reason, message)
        }
    }

    fn healthy(minutes_ago: u64) -> NodeCondition {
        condition("True", "PluginsHealthy", "all 3 plugin sockets of the node are ok", minutes_ago)
    }

    fn driver<'a>(fleet: &'a Fleet, kind: DriverKind, name: &str) -> &'a DriverView {
        fleet
            .drivers
            .iter()
            .find(|driver| driver.kind == kind && driver.name == name)
            .unwrap_or_else(|| panic!("no {kind:?} {name} in {:?}", fleet.drivers))
    }

    fn not_on(view: &DriverView) -> Vec<(&str, &str)> {
        view.not_on.iter().map(|n| (n.node.as_str(), n.why.as_str())).collect()
    }

    #[test]
    fn each_nodes_doctor_is_healthy_failing_absent_or_silent() {
        let message = "2 failing: a-reg.sock (stale): connection refused; \
                       vendor.com/gpu (not-registered): the kubelet holds none";
        let ahead = NodeCondition {
            last_heartbeat_time: Some(humantime::format_rfc3339_seconds(now() + HOUR).to_string()),
            ..healthy(0)
        };
        let objects = FleetObjects {
            nodes: vec![
                node("d-silent", Some(condition("True", "PluginsHealthy", "", 61)), &[]),
                node("a-healthy", Some(healthy(59)), &[]),
                node("b-failing", Some(condition("False", "Stale", message, 1)), &[]),
                node("c-none", None, &[]),
                node("e-no-heartbeat", Some(NodeCondition::new("True", "PluginsHealthy", "")), &[]),
                node("f-unknown", Some(condition("Unknown", "Unknown", "no report", 1)), &[]),
                node("g-ahead", Some(ahead), &[]),
            ],
            ..FleetObjects::default()
        };
        let fleet = judge_fleet(&objects, now(), HOUR);
        let states: Vec<(&str, &DoctorState)> =
            fleet.nodes.iter().map(|n| (n.name.as_str(), &n.doctor)).collect();
        assert_eq!(
            states,
            [
                ("a-healthy", &DoctorState::Healthy),
                (
                    "b-failing",
                    &DoctorState::Failing { reason: "Stale".into(), message: message.into() }
                ),
                ("c-none", &DoctorState::NoDoctor),
                ("d-silent", &DoctorState::Silent { since: Some(at(61)) }),
                ("e-no-heartbeat", &DoctorState::Silent { since: None }),
                (
                    "f-unknown",
                    &DoctorState::Failing { reason: "Unknown".into(), message: "no report".into() }
                ),
                ("g-ahead", &DoctorState::Healthy),
            ]
        );
        let failing = &fleet.nodes[1].failing_plugins;
        assert_eq!(
            failing,
            &[
                FailingPlugin {
                    name: "a-reg.sock".into(),
                    verdict: Verdict::Stale,
                    reason: "connection refused".into()
                },
                FailingPlugin {
                    name: "vendor.com/gpu".into(),
                    verdict: Verdict::NotRegistered,
                    reason: "the kubelet holds none".into()
                },
            ]
        );
        assert!(!fleet.ok());
        // The bound is settable: with two hours, d is no longer silent.
        let fleet = judge_fleet(&objects, now(), 2 * HOUR);
        assert_eq!(fleet.nodes[3].doctor, DoctorState::Healthy);
    }

    #[test]
    fn the_fleet_is_ok_with_healthy_nodes_and_nodes_without_a_doctor() {
        let mut objects = FleetObjects {
            nodes: vec![node("a", Some(healthy(1)), &[]), node("b", None, &[])],
            ..FleetObjects::default()
        };
        assert!(judge_fleet(&objects, now(), HOUR).ok());
        objects.nodes.push(node("c", Some(healthy(90)), &[]));
        assert!(!judge_fleet(&objects, now(), HOUR).ok(), "a silent doctor fails the fleet");
        objects.nodes.pop();
        objects.nodes.push(node("c", Some(condition("False", "Rejected", "1 failing: x", 1)), &[]));
        assert!(!judge_fleet(&objects, now(), HOUR).ok(), "a failing node fails the fleet");
    }

    #[test]
    fn a_csi_driver_on_47_of_50_nodes_names_the_3_others_with_their_doctors_reasons() {
        let mut objects = FleetObjects::default();
        objects.csi_drivers.insert("csi.example.com".into());
        for i in 0..50 {
            let name = format!("node-{i:02}");
            let condition = match i {
                3 => Some(condition(
                    "False",
                    "NotRegistered",
                    "1 failing: csi.example.com (not-registered): CSINode does not list it",
                    5,
                )),
                7 => None,
                9 => Some(healthy(120)),
                _ => Some(healthy(5)),
            };
            objects.nodes.push(node(&name, condition, &[]));
            if ![3, 7, 9].contains(&i) {
                objects.csi_nodes.insert(name, ["csi.example.com".to_owned()].into());
            }
        }
        let fleet = judge_fleet(&objects, now(), HOUR);
        let csi = driver(&fleet, DriverKind::Csi, "csi.example.com");
        assert_eq!((csi.registered, csi.nodes, csi.has_object), (47, 50, true));
        assert_eq!(
            not_on(csi),
            [
                ("node-03", "csi.example.com (not-registered): CSINode does not list it"),
                ("node-07", "no doctor there"),
                ("node-09", format!("its doctor is silent since {}", at(120)).as_str()),
            ]
        );
    }

    #[test]
    fn a_driver_object_on_no_node_lists_every_node_and_one_meant_for_others_lists_none() {
        let mut objects = FleetObjects {
            nodes: vec![node("a", Some(healthy(1)), &[]), node("b", None, &[])],
            ..FleetObjects::default()
        };
        objects.csi_drivers.insert("nowhere.example.com".into());
        // A CSINode of a node outside the selection.
        objects.csi_nodes.insert("other".into(), ["elsewhere.example.com".into()].into());
        let fleet = judge_fleet(&objects, now(), HOUR);
        let nowhere = driver(&fleet, DriverKind::Csi, "nowhere.example.com");
        assert_eq!(nowhere.registered, 0);
        assert_eq!(
            not_on(nowhere),
            [("a", "its doctor: all plugins ok, none of this name"), ("b", "no doctor there")]
        );
        assert!(
            fleet.drivers.iter().all(|d| d.name != "elsewhere.example.com"),
            "only the selected nodes' CSINodes count"
        );
    }

    #[test]
    fn device_resources_count_where_their_capacity_is_not_zero() {
        let message = "2 failing: gpu.sock (stale): refused; nic-reg.sock (rejected): old";
        let objects = FleetObjects {
            nodes: vec![
                node("a", Some(healthy(1)), &[("vendor.com/gpu", "2"), ("example.com/nic", "1")]),
                node(
                    "b",
                    Some(condition("False", "Stale", message, 1)),
                    &[("vendor.com/gpu", "0")],
                ),
                node("c", None, &[("example.com/fpga", "0")]),
            ],
            ..FleetObjects::default()
        };
        let fleet = judge_fleet(&objects, now(), HOUR);
        // Registered nowhere and without an object: counted, no node named.
        let fpga = driver(&fleet, DriverKind::DevicePlugin, "example.com/fpga");
        assert_eq!((fpga.registered, fpga.nodes, fpga.not_on.len()), (0, 3, 0));
        let gpu = driver(&fleet, DriverKind::DevicePlugin, "vendor.com/gpu");
        assert_eq!((gpu.registered, gpu.nodes), (1, 3));
        assert_eq!(
            not_on(gpu),
            [("b", "its doctor: Stale, not naming it"), ("c", "no doctor there")]
        );
        let nic = driver(&fleet, DriverKind::DevicePlugin, "example.com/nic");
        assert_eq!(nic.registered, 1);
        // The message names a socket whose file name holds the resource's
        // name; nic-reg.sock does not hold "example.com/nic".
        assert_eq!(nic.not_on[0].why, "its doctor: Stale, not naming it");
    }

    #[test]
    fn dra_drivers_count_the_nodes_they_published_slices_for() {
        let message = "1 failing: gpu.example.com (not-published): no ResourceSlice";
        let mut objects = FleetObjects {
            nodes: vec![
                node("a", Some(healthy(1)), &[]),
                node("b", Some(condition("False", "NotPublished", message, 1)), &[]),
            ],
            ..FleetObjects::default()
        };
        objects.slices.insert("a".into(), [("gpu.example.com".to_owned(), 2)].into());
        objects.slices.insert("zz-unselected".into(), [("other.example.com".to_owned(), 1)].into());
        let fleet = judge_fleet(&objects, now(), HOUR);
        let dra = driver(&fleet, DriverKind::Dra, "gpu.example.com");
        assert_eq!((dra.registered, dra.nodes), (1, 2));
        assert_eq!(not_on(dra), [("b", "gpu.example.com (not-published): no ResourceSlice")]);
        assert_eq!(fleet.drivers.len(), 1, "{:?}", fleet.drivers);
    }

    #[test]
    fn drivers_come_by_kind_then_name() {
        let mut objects = FleetObjects {
            nodes: vec![node("a", Some(healthy(1)), &[("z.com/x", "1"), ("a.com/y", "1")])],
            ..FleetObjects::default()
        };
        objects.csi_drivers.extend(["b.csi".to_owned(), "a.csi".to_owned()]);
        objects.slices.insert("a".into(), [("dra.x".to_owned(), 1)].into());
        let fleet = judge_fleet(&objects, now(), HOUR);
        let order: Vec<(DriverKind, &str)> =
            fleet.drivers.iter().map(|d| (d.kind, d.name.as_str())).collect();
        assert_eq!(
            order,
            [
                (DriverKind::Csi, "a.csi"),
                (DriverKind::Csi, "b.csi"),
                (DriverKind::DevicePlugin, "a.com/y"),
                (DriverKind::DevicePlugin, "z.com/x"),
                (DriverKind::Dra, "dra.x"),
            ]
        );
    }

    #[test]
    fn the_message_a_node_doctor_writes_is_read_back() {
        // Written by the node's doctor (condition.rs), read back here.
        let rows = (0..40)
            .map(|i| {
                let path =
                    std::path::PathBuf::from(format!("/r/plugins_registry/p{i:02}-reg.sock"));
                Row::new(Verdict::Rejected, &path, "registry", "needs v1.x; got 0.3.0".to_owned())
            })
            .collect();
        let written = PluginsCondition::of(&Report::of_parts(rows, Vec::new(), None));
        let (plugins, more) = failing_plugins(&written.message);
        assert!(!plugins.is_empty() && more > 0, "{}", written.message);
        assert_eq!(plugins.len() + more, 40);
        assert_eq!(plugins[1].name, "p01-reg.sock");
        assert_eq!(plugins[1].verdict, Verdict::Rejected);
        assert_eq!(plugins[1].reason, "needs v1.x; got 0.3.0", "a reason with its own \"; \"");
        assert_eq!(failing_plugins("all 3 plugin sockets of the node are ok"), (Vec::new(), 0));
        assert_eq!(failing_plugins("1 failing: garbled"), (Vec::new(), 1));
    }

    #[test]
    fn zero_quantities_are_zero() {
        for zero in ["0", "0k", "0.0", "", "+0"] {
            assert!(!nonzero(zero), "{zero}");
        }
        for some in ["1", "100m", "2Gi", "0.5", "10"] {
            assert!(nonzero(some), "{some}");
        }
    }
}
