//! Judging the fleet, without IO: what each node's doctor says (healthy,
//! failing, cannot judge, silent, none), which plugins its report names as
//! failing, and for each
//! CSI driver, device-plugin resource and DRA driver, the nodes where it is
//! registered and why it is not on the others.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kpm_report::{ConditionStatus, Health, ShownRegistered};

use super::{
    Disagreement, DoctorState, DriverView, Fleet, FleetObjects, NodeObject, NodeView, NotOn,
    PluginKind, ReadCost, Source, Workload,
};

/// Judges `objects` as of `now`: a doctor whose last heartbeat is older
/// than `stale_after` is silent. Drivers come by kind then name, nodes by
/// name; what a node registered is what its objects show where they were
/// read, else what its report says they show. Where both are known (the
/// cross-check), each difference is a [`Disagreement`].
pub fn judge_fleet(objects: &FleetObjects, now: SystemTime, stale_after: Duration) -> Fleet {
    let mut selected: Vec<&NodeObject> = objects.nodes.iter().collect();
    selected.sort_by(|a, b| a.name.cmp(&b.name));
    selected.dedup_by(|a, b| a.name == b.name);
    let nodes: Vec<NodeView> =
        selected.iter().map(|node| node_view(node, now, stale_after)).collect();
    let registered: Vec<Option<&ShownRegistered>> =
        selected.iter().map(|node| node.registered()).collect();

    let mut drivers = Vec::new();
    for kind in PluginKind::ALL {
        let mut names: BTreeSet<&str> = BTreeSet::new();
        if kind == PluginKind::Csi {
            names.extend(objects.csi_drivers.iter().map(String::as_str));
        }
        names.extend(
            registered.iter().flatten().flat_map(|shown| {
                shown.iter().filter(move |(k, _)| *k == kind).map(|(_, name)| name)
            }),
        );
        drivers.extend(names.into_iter().map(|name| {
            let has_object = kind == PluginKind::Csi && objects.csi_drivers.contains(name);
            let on = nodes
                .iter()
                .zip(&registered)
                .map(|(node, shown)| (node, shown.is_some_and(|shown| shown.contains(kind, name))));
            let workload = objects.workloads.get(&(kind, name.to_owned()));
            driver_view(kind, name, has_object, workload, on)
        }));
    }
    let disagreements = selected.iter().flat_map(|node| disagreements(node)).collect();
    Fleet {
        drivers,
        nodes,
        disagreements,
        unseen: objects.unseen.clone(),
        read: ReadCost {
            requests: objects.requests,
            bytes: objects.bytes,
            cross_check: objects.cross_checked,
        },
    }
}

/// Where `node`'s report and its objects, both read, differ: a plugin one
/// shows registered and the other does not.
fn disagreements(node: &NodeObject) -> Vec<Disagreement> {
    let (Some(shown), Some(said)) =
        (&node.shown, node.report.as_ref().and_then(|report| report.registered.as_ref()))
    else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for (from, to, report_shows) in [(said, shown, true), (shown, said, false)] {
        for (kind, name) in from.iter().filter(|(kind, name)| !to.contains(*kind, name)) {
            let node = node.name.clone();
            found.push(Disagreement { node, kind, name: name.to_owned(), report_shows });
        }
    }
    found
}

/// One driver across the nodes, each with whether it is registered there.
fn driver_view<'a>(
    kind: PluginKind,
    name: &str,
    has_object: bool,
    workload: Option<&Workload>,
    nodes: impl Iterator<Item = (&'a NodeView, bool)>,
) -> DriverView {
    let (registered, missing): (Vec<_>, Vec<_>) = nodes.partition(|(_, on)| *on);
    // A driver on no selected node and without an object is meant for
    // other nodes: listing every node would say nothing.
    let not_on = if registered.is_empty() && !has_object {
        Vec::new()
    } else {
        missing
            .iter()
            .map(|(node, _)| {
                let pod = workload.and_then(|workload| workload.on_nodes.get(&node.name));
                NotOn { node: node.name.clone(), why: why_not(node, name), pod: pod.cloned() }
            })
            .collect()
    };
    DriverView {
        kind,
        name: name.to_owned(),
        has_object,
        registered: registered.len(),
        nodes: registered.len() + missing.len(),
        not_on,
        daemon_set: workload.map(|workload| workload.daemon_set.clone()),
    }
}

/// Why `driver` is not registered on `node`, as far as its doctor tells:
/// the failing plugin or finding its report names the driver by, else
/// what the report says of the driver's absence, else the state of the
/// doctor. A driver is matched by its exact name, never a part of it.
fn why_not(node: &NodeView, driver: &str) -> String {
    match &node.doctor {
        DoctorState::NoDoctor => return "no doctor there".to_owned(),
        DoctorState::Silent { since: Some(since) } => {
            return format!("its doctor is silent since {}", since.0);
        }
        DoctorState::Silent { since: None } => {
            return "its doctor is silent (no heartbeat)".to_owned();
        }
        DoctorState::CannotJudge { why } if why.is_empty() => {
            return "its doctor cannot judge the node".to_owned();
        }
        DoctorState::CannotJudge { why } => {
            return format!("its doctor cannot judge the node: {why}");
        }
        DoctorState::Healthy | DoctorState::Failing { .. } => {}
    }
    let named = node.failing_plugins.iter().find(|plugin| plugin.name.as_deref() == Some(driver));
    if let Some(plugin) = named {
        return format!("{} ({}): {}", plugin.subject, plugin.verdict, plugin.reason);
    }
    let mut unnamed = node.failing_plugins.iter().filter(|plugin| plugin.name.is_none());
    match (node.source, &node.doctor) {
        (Source::Report, _) if node.ok.contains(driver) => {
            "its doctor finds the plugin ok: the cluster does not show its registration yet"
                .to_owned()
        }
        (Source::Report, _) if node.more_failing > 0 => format!(
            "its doctor lists no plugin of this name, and {} failures more than it lists",
            node.more_failing
        ),
        (Source::Report, _) => match unnamed.next() {
            // A socket that cannot tell its name (a stale one) may be the
            // driver's: shown, never guessed from its file name.
            Some(plugin) => {
                let more = unnamed.count();
                format!(
                    "{} ({}), a failing socket that cannot tell its name: {}{}",
                    plugin.subject,
                    plugin.verdict,
                    plugin.reason,
                    if more > 0 { format!(" (and {more} more)") } else { String::new() }
                )
            }
            None => "its doctor finds no plugin of this name on the node".to_owned(),
        },
        (_, DoctorState::Failing { reason }) => format!(
            "its doctor: {reason}; it writes no KubeletPluginReport to tell which plugin \
             (upgrade it)"
        ),
        _ => "its doctor: all plugins ok, none of this name".to_owned(),
    }
}

/// What `node`'s doctor says as of `now`: from its report, unless its
/// condition is fresher (a doctor that writes no report, or no longer
/// may); from the condition, only its status and reason.
fn node_view(node: &NodeObject, now: SystemTime, stale_after: Duration) -> NodeView {
    let view = |doctor, source| NodeView {
        name: node.name.clone(),
        doctor,
        source,
        kubelet_version: None,
        failing_plugins: Vec::new(),
        more_failing: 0,
        ok: BTreeSet::new(),
    };
    // A heartbeat ahead of this clock (skew) is fresh.
    let silent = |time: &Option<Time>| {
        time.as_ref().is_none_or(|at| {
            now.duration_since(SystemTime::from(at.0)).is_ok_and(|age| age > stale_after)
        })
    };
    let report = node.report.as_ref().filter(|report| {
        node.condition
            .as_ref()
            .is_none_or(|condition| report.heartbeat_time >= condition.last_heartbeat_time)
    });
    if let Some(report) = report {
        if silent(&report.heartbeat_time) {
            let since = report.heartbeat_time.clone();
            return view(DoctorState::Silent { since }, Source::Report);
        }
        let doctor = match report.health {
            Health::Healthy => DoctorState::Healthy,
            Health::CannotJudge => {
                DoctorState::CannotJudge { why: report.blind.clone().unwrap_or_default() }
            }
            // A health a newer doctor wrote is never read as healthy.
            Health::Failing | Health::Unknown => {
                DoctorState::Failing { reason: report.reason.clone() }
            }
        };
        return NodeView {
            kubelet_version: report.kubelet_version.clone(),
            failing_plugins: report.failing.clone(),
            more_failing: report.failing_count.saturating_sub(report.failing.len()),
            ok: report.ok.clone(),
            ..view(doctor, Source::Report)
        };
    }
    let Some(condition) = &node.condition else {
        return view(DoctorState::NoDoctor, Source::None);
    };
    if silent(&condition.last_heartbeat_time) {
        let since = condition.last_heartbeat_time.clone();
        return view(DoctorState::Silent { since }, Source::Condition);
    }
    let doctor = match ConditionStatus::from_api(&condition.status) {
        ConditionStatus::True => DoctorState::Healthy,
        ConditionStatus::False => DoctorState::Failing { reason: condition.reason.clone() },
        _ => DoctorState::CannotJudge { why: String::new() },
    };
    view(doctor, Source::Condition)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpm_report::ReportedVerdict;

    use crate::{FailingPlugin, NodeCondition, NodeReport};

    const HOUR: Duration = Duration::from_secs(3600);

    fn now() -> SystemTime {
        humantime::parse_rfc3339("2026-03-01T12:00:00Z").unwrap()
    }

    fn at(minutes_ago: u64) -> Time {
        time(now() - Duration::from_secs(60 * minutes_ago))
    }

    fn time(at: SystemTime) -> Time {
        Time(at.try_into().unwrap())
    }

    /// Node `name` with `report`, whose objects were read and show
    /// `shown` registered; not read when it is empty.
    fn node(name: &str, report: Option<NodeReport>, shown: &[(PluginKind, &str)]) -> NodeObject {
        NodeObject {
            name: name.to_owned(),
            report,
            condition: None,
            shown: (!shown.is_empty()).then(|| shown.iter().copied().collect()),
        }
    }

    fn with_condition(node: NodeObject, condition: NodeCondition) -> NodeObject {
        NodeObject { condition: Some(condition), ..node }
    }

    fn condition(status: &str, reason: &str, minutes_ago: u64) -> NodeCondition {
        NodeCondition {
            last_heartbeat_time: Some(at(minutes_ago)),
            last_transition_time: Some(at(minutes_ago + 100)),
            ..NodeCondition::new(status, reason, "a message no one parses")
        }
    }

    /// A failing entry: `subject`, the name it tells, the verdict, why.
    fn failing(subject: &str, name: Option<&str>, verdict: &str, reason: &str) -> FailingPlugin {
        FailingPlugin {
            subject: subject.into(),
            name: name.map(str::to_owned),
            verdict: ReportedVerdict::named(verdict),
            reason: reason.into(),
        }
    }

    #[allow(clippy::unnecessary_wraps)] // A node's report, as `node` takes it.
    fn healthy(minutes_ago: u64) -> Option<NodeReport> {
        Some(NodeReport {
            health: Health::Healthy,
            reason: "PluginsHealthy".into(),
            heartbeat_time: Some(at(minutes_ago)),
            kubelet_version: Some("v1.36.2".into()),
            ..NodeReport::default()
        })
    }

    fn failing_report(reason: &str, entries: Vec<FailingPlugin>) -> Option<NodeReport> {
        Some(NodeReport {
            health: Health::Failing,
            reason: reason.into(),
            failing_count: entries.len(),
            failing: entries,
            ..healthy(1)?
        })
    }

    fn driver<'a>(fleet: &'a Fleet, kind: PluginKind, name: &str) -> &'a DriverView {
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
    fn each_nodes_doctor_is_read_from_its_report_else_its_conditions_status() {
        let stale = failing("a-reg.sock", None, "stale", "connection refused");
        let blind = NodeReport {
            health: Health::CannotJudge,
            reason: "CannotJudge".into(),
            blind: Some("/var/lib/kubelet/plugins_registry: cannot be listed".into()),
            ..healthy(1).unwrap()
        };
        let ahead = NodeReport { heartbeat_time: Some(time(now() + HOUR)), ..healthy(0).unwrap() };
        let objects = FleetObjects {
            nodes: vec![
                node("d-silent", healthy(61), &[]),
                node("a-healthy", healthy(59), &[]),
                node("b-failing", failing_report("Stale", vec![stale.clone()]), &[]),
                node("c-none", None, &[]),
                node("e-no-heartbeat", Some(NodeReport::default()), &[]),
                node("f-blind", Some(blind), &[]),
                node("g-ahead", Some(ahead), &[]),
                with_condition(node("h-old-doctor", None, &[]), condition("False", "Stale", 1)),
                with_condition(node("i-old-unknown", None, &[]), condition("Unknown", "X", 1)),
                // A report older than the condition: the doctor no longer
                // writes it; the condition is newer.
                with_condition(
                    node("j-stale-report", healthy(30), &[]),
                    condition("False", "Rejected", 1),
                ),
            ],
            ..FleetObjects::default()
        };
        let fleet = judge_fleet(&objects, now(), HOUR);
        let states: Vec<(&str, &DoctorState, Source)> =
            fleet.nodes.iter().map(|n| (n.name.as_str(), &n.doctor, n.source)).collect();
        assert_eq!(
            states,
            [
                ("a-healthy", &DoctorState::Healthy, Source::Report),
                ("b-failing", &DoctorState::Failing { reason: "Stale".into() }, Source::Report),
                ("c-none", &DoctorState::NoDoctor, Source::None),
                ("d-silent", &DoctorState::Silent { since: Some(at(61)) }, Source::Report),
                ("e-no-heartbeat", &DoctorState::Silent { since: None }, Source::Report),
                (
                    "f-blind",
                    &DoctorState::CannotJudge {
                        why: "/var/lib/kubelet/plugins_registry: cannot be listed".into()
                    },
                    Source::Report
                ),
                ("g-ahead", &DoctorState::Healthy, Source::Report),
                (
                    "h-old-doctor",
                    &DoctorState::Failing { reason: "Stale".into() },
                    Source::Condition
                ),
                (
                    "i-old-unknown",
                    &DoctorState::CannotJudge { why: String::new() },
                    Source::Condition
                ),
                (
                    "j-stale-report",
                    &DoctorState::Failing { reason: "Rejected".into() },
                    Source::Condition
                ),
            ]
        );
        assert_eq!(fleet.nodes[1].failing_plugins, [stale]);
        assert_eq!(fleet.nodes[0].kubelet_version.as_deref(), Some("v1.36.2"));
        assert!(fleet.nodes[7].failing_plugins.is_empty(), "no message is parsed");
        assert!(!fleet.ok());
        // The bound is settable: with two hours, d is no longer silent.
        let fleet = judge_fleet(&objects, now(), 2 * HOUR);
        assert_eq!(fleet.nodes[3].doctor, DoctorState::Healthy);
    }

    #[test]
    fn the_fleet_is_ok_with_healthy_nodes_and_nodes_without_a_doctor() {
        let mut objects = FleetObjects {
            nodes: vec![node("a", healthy(1), &[]), node("b", None, &[])],
            ..FleetObjects::default()
        };
        assert!(judge_fleet(&objects, now(), HOUR).ok());
        objects.nodes.push(node("c", healthy(90), &[]));
        assert!(!judge_fleet(&objects, now(), HOUR).ok(), "a silent doctor fails the fleet");
        objects.nodes.pop();
        objects.nodes.push(node("c", failing_report("Rejected", Vec::new()), &[]));
        assert!(!judge_fleet(&objects, now(), HOUR).ok(), "a failing node fails the fleet");
    }

    #[test]
    fn a_csi_driver_on_47_of_50_nodes_names_the_3_others_with_their_doctors_reasons() {
        let mut objects = FleetObjects::default();
        objects.csi_drivers.insert("csi.example.com".into());
        for i in 0..50 {
            let name = format!("node-{i:02}");
            let report = match i {
                3 => failing_report(
                    "NotRegistered",
                    vec![failing(
                        "csi.example.com",
                        Some("csi.example.com"),
                        "not-registered",
                        "CSINode does not list it",
                    )],
                ),
                7 => None,
                9 => healthy(120),
                _ => healthy(5),
            };
            let on: &[_] =
                if [3, 7, 9].contains(&i) { &[] } else { &[(PluginKind::Csi, "csi.example.com")] };
            objects.nodes.push(node(&name, report, on));
        }
        let fleet = judge_fleet(&objects, now(), HOUR);
        let csi = driver(&fleet, PluginKind::Csi, "csi.example.com");
        assert_eq!((csi.registered, csi.nodes, csi.has_object), (47, 50, true));
        assert_eq!(
            not_on(csi),
            [
                ("node-03", "csi.example.com (not-registered): CSINode does not list it"),
                ("node-07", "no doctor there"),
                ("node-09", format!("its doctor is silent since {}", at(120).0).as_str()),
            ]
        );
    }

    #[test]
    fn a_driver_is_matched_by_its_exact_name_and_the_report_tells_what_it_knows() {
        let gpu_x = failing("vendor.com/gpu-x", Some("vendor.com/gpu-x"), "stale", "refused");
        let mut ok_gpu = healthy(1).unwrap();
        ok_gpu.ok.insert("vendor.com/gpu".into());
        let bounded = NodeReport {
            failing_count: 300,
            ..failing_report("Stale", vec![gpu_x.clone()]).unwrap()
        };
        let objects = FleetObjects {
            nodes: vec![
                node("a", healthy(1), &[(PluginKind::Device, "vendor.com/gpu")]),
                node("b", failing_report("Stale", vec![gpu_x]), &[]),
                node("c", Some(ok_gpu), &[]),
                node("d", Some(bounded), &[]),
                with_condition(node("e", None, &[]), condition("False", "Stale", 1)),
                with_condition(node("f", None, &[]), condition("True", "PluginsHealthy", 1)),
                node(
                    "g",
                    failing_report(
                        "Stale",
                        vec![
                            failing("gpu.sock", None, "stale", "refused"),
                            failing("x.sock", None, "stale", "refused"),
                        ],
                    ),
                    &[],
                ),
            ],
            ..FleetObjects::default()
        };
        let fleet = judge_fleet(&objects, now(), HOUR);
        let gpu = driver(&fleet, PluginKind::Device, "vendor.com/gpu");
        assert_eq!((gpu.registered, gpu.nodes), (1, 7));
        assert_eq!(
            not_on(gpu),
            [
                ("b", "its doctor finds no plugin of this name on the node"),
                (
                    "c",
                    "its doctor finds the plugin ok: the cluster does not show its registration yet"
                ),
                (
                    "d",
                    "its doctor lists no plugin of this name, and 299 failures more than it lists"
                ),
                (
                    "e",
                    "its doctor: Stale; it writes no KubeletPluginReport to tell which plugin \
                     (upgrade it)"
                ),
                ("f", "its doctor: all plugins ok, none of this name"),
                (
                    "g",
                    "gpu.sock (stale), a failing socket that cannot tell its name: refused (and \
                     1 more)"
                ),
            ]
        );
        assert_eq!(fleet.nodes[3].more_failing, 299);
    }

    #[test]
    fn a_driver_object_on_no_node_lists_every_node_and_one_meant_for_others_lists_none() {
        let mut objects = FleetObjects {
            nodes: vec![node("a", healthy(1), &[]), node("b", None, &[])],
            ..FleetObjects::default()
        };
        objects.csi_drivers.insert("nowhere.example.com".into());
        let fleet = judge_fleet(&objects, now(), HOUR);
        let nowhere = driver(&fleet, PluginKind::Csi, "nowhere.example.com");
        assert_eq!(nowhere.registered, 0);
        assert_eq!(
            not_on(nowhere),
            [
                ("a", "its doctor finds no plugin of this name on the node"),
                ("b", "no doctor there")
            ]
        );
    }

    /// A report's row says what its node's objects show, where they were
    /// not read; where they were, they are the truth.
    #[test]
    fn what_a_node_registered_is_read_from_its_report_where_its_objects_were_not() {
        let said = |plugins: &[(PluginKind, &str)]| NodeReport {
            registered: Some(plugins.iter().copied().collect()),
            ..healthy(1).unwrap()
        };
        let gpu = (PluginKind::Device, "vendor.com/gpu");
        let objects = FleetObjects {
            nodes: vec![
                node("a", Some(said(&[gpu, (PluginKind::Device, "example.com/nic")])), &[]),
                node("b", Some(said(&[])), &[]),
                node("c", Some(said(&[])), &[gpu]),
                node("d", None, &[]),
            ],
            ..FleetObjects::default()
        };
        let fleet = judge_fleet(&objects, now(), HOUR);
        let view = driver(&fleet, PluginKind::Device, "vendor.com/gpu");
        assert_eq!((view.registered, view.nodes), (2, 4));
        assert_eq!(not_on(view)[1], ("d", "no doctor there"));
        assert_eq!(driver(&fleet, PluginKind::Device, "example.com/nic").registered, 1);
        // c's report and objects were both read, and differ.
        assert_eq!(
            fleet.disagreements,
            [Disagreement {
                node: "c".into(),
                kind: PluginKind::Device,
                name: "vendor.com/gpu".into(),
                report_shows: false
            }]
        );
        assert_eq!(
            fleet.disagreements[0].to_string(),
            "c: its Node has a capacity of DevicePlugin vendor.com/gpu, but its report does not \
             show it registered"
        );
        assert!(!fleet.ok(), "a report that lies fails the fleet");
    }

    /// The cross-check: a report shows a driver registered that its
    /// CSINode does not list.
    #[test]
    fn a_report_that_says_more_than_its_objects_show_is_named() {
        let csi = (PluginKind::Csi, "csi.example.com");
        let lying =
            NodeReport { registered: Some([csi].into_iter().collect()), ..healthy(1).unwrap() };
        let objects = FleetObjects {
            nodes: vec![node("a", Some(lying), &[(PluginKind::Dra, "gpu.example.com")])],
            cross_checked: true,
            ..FleetObjects::default()
        };
        let fleet = judge_fleet(&objects, now(), HOUR);
        let said: Vec<String> = fleet.disagreements.iter().map(ToString::to_string).collect();
        assert_eq!(
            said,
            [
                "a: its report shows CSIPlugin csi.example.com registered, but its CSINode does \
                 not list it",
                "a: its ResourceSlices name DRAPlugin gpu.example.com, but its report does not \
                 show it registered",
            ]
        );
        assert!(
            fleet.drivers.iter().all(|d| d.name != "csi.example.com"),
            "the objects read are the truth: {:?}",
            fleet.drivers
        );
        assert!(fleet.read.cross_check);
    }

    #[test]
    fn dra_drivers_count_the_nodes_they_published_slices_for() {
        let not_published = failing(
            "gpu.example.com",
            Some("gpu.example.com"),
            "not-published",
            "no ResourceSlice",
        );
        let objects = FleetObjects {
            nodes: vec![
                node("a", healthy(1), &[(PluginKind::Dra, "gpu.example.com")]),
                node("b", failing_report("NotPublished", vec![not_published]), &[]),
            ],
            ..FleetObjects::default()
        };
        let fleet = judge_fleet(&objects, now(), HOUR);
        let dra = driver(&fleet, PluginKind::Dra, "gpu.example.com");
        assert_eq!((dra.registered, dra.nodes), (1, 2));
        assert_eq!(not_on(dra), [("b", "gpu.example.com (not-published): no ResourceSlice")]);
        assert_eq!(fleet.drivers.len(), 1, "{:?}", fleet.drivers);
    }

    #[test]
    fn drivers_come_by_kind_then_name() {
        let shown = [
            (PluginKind::Dra, "dra.x"),
            (PluginKind::Device, "z.com/x"),
            (PluginKind::Device, "a.com/y"),
        ];
        let mut objects =
            FleetObjects { nodes: vec![node("a", healthy(1), &shown)], ..FleetObjects::default() };
        objects.csi_drivers.extend(["b.csi".to_owned(), "a.csi".to_owned()]);
        let fleet = judge_fleet(&objects, now(), HOUR);
        let order: Vec<(PluginKind, &str)> =
            fleet.drivers.iter().map(|d| (d.kind, d.name.as_str())).collect();
        assert_eq!(
            order,
            [
                (PluginKind::Csi, "a.csi"),
                (PluginKind::Csi, "b.csi"),
                (PluginKind::Device, "a.com/y"),
                (PluginKind::Device, "z.com/x"),
                (PluginKind::Dra, "dra.x"),
            ]
        );
    }
}
