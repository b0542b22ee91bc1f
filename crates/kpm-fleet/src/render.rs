//! A [`Fleet`] as `kpm doctor --cluster` prints it: the drivers and
//! resources, then the nodes, then a count.

use std::fmt::Write as _;

use kpm_report::CANNOT_JUDGE_REASON;

use super::{DoctorState, DriverView, Fleet, PodThere};

/// How many nodes a driver's row names where it is not registered; the
/// others are counted (`-o json` lists them all).
const NOT_ON_SHOWN: usize = 3;

/// How long a reason may be in the table, in characters.
const REASON_CHARS: usize = 80;

/// The fleet as two tables: each driver or resource with the nodes it is
/// registered on (`47/50`) and the first few it is not, with why; each
/// node with its doctor's state, reason and failing plugins. Then what
/// could not be read, and a count.
pub fn render_fleet_table(fleet: &Fleet) -> String {
    let mut text = String::new();
    if fleet.drivers.is_empty() {
        text.push_str("no CSI driver, device-plugin resource or DRA driver seen\n");
    } else {
        let mut drivers = table(["KIND", "DRIVER / RESOURCE", "REGISTERED", "NOT ON"]);
        for driver in &fleet.drivers {
            let name = match &driver.daemon_set {
                Some(daemon_set) => format!("{}\n(DaemonSet {daemon_set})", driver.name),
                None => driver.name.clone(),
            };
            drivers.add_row([
                driver.kind.name().to_owned(),
                name,
                format!("{}/{}", driver.registered, driver.nodes),
                not_on(driver),
            ]);
        }
        text.push_str(&drivers.trim_fmt());
        text.push('\n');
    }
    text.push('\n');
    let mut nodes = table(["NODE", "DOCTOR", "KUBELET", "REASON", "FAILING PLUGINS"]);
    for node in &fleet.nodes {
        let reason = match &node.doctor {
            DoctorState::Failing { reason } => reason.clone(),
            DoctorState::CannotJudge { why } if !why.is_empty() => shortened(why),
            DoctorState::CannotJudge { .. } => CANNOT_JUDGE_REASON.to_owned(),
            DoctorState::Silent { since: Some(since) } => format!("no heartbeat since {}", since.0),
            DoctorState::Silent { since: None } => "no heartbeat".to_owned(),
            DoctorState::Healthy | DoctorState::NoDoctor => "-".to_owned(),
        };
        let mut failing: Vec<String> = node
            .failing_plugins
            .iter()
            .map(|plugin| format!("{} ({})", plugin.subject, plugin.verdict))
            .collect();
        if node.more_failing > 0 {
            failing.push(format!("and {} more", node.more_failing));
        }
        let failing = if failing.is_empty() { "-".to_owned() } else { failing.join(", ") };
        // A kubelet the doctor was not checked against is marked so.
        let kubelet = match node.kubelet_version.as_deref() {
            None => "-".to_owned(),
            Some(version) if kpm_report::checked(version) == Some(true) => version.to_owned(),
            Some(version) => format!("{version} (unchecked)"),
        };
        nodes.add_row([node.name.clone(), node.doctor.name().to_owned(), kubelet, reason, failing]);
    }
    text.push_str(&nodes.trim_fmt());
    text.push('\n');
    if fleet.read.cross_check {
        let _ = write!(
            text,
            "\ncross-check: {} report(s) disagree with their node's objects\n",
            fleet.disagreements.len()
        );
    }
    for disagreement in &fleet.disagreements {
        let _ = writeln!(text, "  {disagreement}");
    }
    for what in &fleet.unseen {
        let _ = write!(text, "\nnot seen: {what}\n");
    }
    let count = |state: &str| fleet.nodes.iter().filter(|n| n.doctor.name() == state).count();
    let _ = writeln!(
        text,
        "\n{} nodes: {} healthy, {} failing, {} cannot judge, {} silent, {} without a doctor",
        fleet.nodes.len(),
        count("healthy"),
        count("failing"),
        count("cannot judge"),
        count("silent"),
        count("no doctor"),
    );
    text
}

fn table<const N: usize>(header: [&str; N]) -> comfy_table::Table {
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::NOTHING);
    table.set_header(header);
    table
}

/// The first nodes a driver is not on, one a line, and how many more.
fn not_on(driver: &DriverView) -> String {
    if driver.not_on.is_empty() {
        return "-".to_owned();
    }
    let mut lines: Vec<String> = driver
        .not_on
        .iter()
        .take(NOT_ON_SHOWN)
        .map(|missing| {
            // What the DaemonSet runs there, unless its pod is ready: then
            // the node's doctor says why.
            let why = match &missing.pod {
                Some(PodThere::Ready { .. }) | None => missing.why.clone(),
                Some(pod) => pod.to_string(),
            };
            format!("{}: {}", missing.node, shortened(&why))
        })
        .collect();
    if driver.not_on.len() > NOT_ON_SHOWN {
        lines.push(format!("and {} more", driver.not_on.len() - NOT_ON_SHOWN));
    }
    lines.join("\n")
}

/// `text` cut to [`REASON_CHARS`] characters, `…` marking a cut.
fn shortened(text: &str) -> String {
    match text.char_indices().nth(REASON_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use crate::{FailingPlugin, NodeView, NotOn, PluginKind, Source};

    fn node(name: &str, doctor: DoctorState) -> NodeView {
        NodeView {
            name: name.to_owned(),
            doctor,
            source: Source::Report,
            kubelet_version: None,
            failing_plugins: Vec::new(),
            more_failing: 0,
            ok: std::collections::BTreeSet::new(),
        }
    }

    fn fleet() -> Fleet {
        let failing = NodeView {
            failing_plugins: vec![FailingPlugin {
                subject: "a-reg.sock".into(),
                name: None,
                verdict: kpm_report::Verdict::Stale.into(),
                reason: "refused".into(),
            }],
            more_failing: 2,
            kubelet_version: Some("v1.30.14".into()),
            ..node("n2", DoctorState::Failing { reason: "Stale".into() })
        };
        let why = |node: &str, why: &str| NotOn { node: node.into(), why: why.into(), pod: None };
        Fleet {
            drivers: vec![
                DriverView {
                    kind: PluginKind::Csi,
                    name: "csi.example.com".into(),
                    has_object: true,
                    registered: 1,
                    nodes: 6,
                    not_on: vec![
                        why("n2", &"x".repeat(100)),
                        why("n3", "no doctor there"),
                        why("n4", "its doctor is silent since 2026-03-01T10:00:00Z"),
                        why("n5", "no doctor there"),
                        why("n6", "no doctor there"),
                    ],
                    daemon_set: None,
                },
                DriverView {
                    kind: PluginKind::Device,
                    name: "vendor.com/gpu".into(),
                    has_object: false,
                    registered: 6,
                    nodes: 6,
                    not_on: Vec::new(),
                    daemon_set: None,
                },
            ],
            nodes: vec![
                node("n1", DoctorState::Healthy),
                failing,
                node("n3", DoctorState::NoDoctor),
                node(
                    "n4",
                    DoctorState::Silent {
                        since: Some(Time("2026-03-01T10:00:00Z".parse().unwrap())),
                    },
                ),
                node("n5", DoctorState::CannotJudge { why: "/r/plugins_registry: gone".into() }),
            ],
            unseen: vec!["resourceslices: not served".into()],
            disagreements: Vec::new(),
            read: crate::ReadCost::default(),
        }
    }

    #[test]
    fn the_table_shows_drivers_then_nodes_then_a_count() {
        let text = render_fleet_table(&fleet());
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["KIND", "DRIVER", "/", "RESOURCE", "REGISTERED", "NOT", "ON"]
        );
        let csi: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(csi[..4], ["csi", "csi.example.com", "1/6", "n2:"]);
        assert!(lines[1].ends_with(&format!("n2: {}…", "x".repeat(80))), "{text}");
        assert!(lines[2].trim_start().starts_with("n3: no doctor there"), "{text}");
        assert!(lines[3].trim_start().starts_with("n4: its doctor is silent since"), "{text}");
        assert_eq!(lines[4].trim(), "and 2 more");
        assert_eq!(
            lines[5].split_whitespace().collect::<Vec<_>>(),
            ["device", "vendor.com/gpu", "6/6", "-"]
        );
        assert_eq!(lines[6], "");
        assert_eq!(
            lines[7].split_whitespace().collect::<Vec<_>>(),
            ["NODE", "DOCTOR", "KUBELET", "REASON", "FAILING", "PLUGINS"]
        );
        assert_eq!(
            lines[8].split_whitespace().collect::<Vec<_>>(),
            ["n1", "healthy", "-", "-", "-"]
        );
        assert_eq!(
            lines[9].split_whitespace().collect::<Vec<_>>(),
            [
                "n2",
                "failing",
                "v1.30.14",
                "(unchecked)",
                "Stale",
                "a-reg.sock",
                "(stale),",
                "and",
                "2",
                "more"
            ]
        );
        assert_eq!(
            lines[10].split_whitespace().collect::<Vec<_>>(),
            ["n3", "no", "doctor", "-", "-", "-"]
        );
        assert!(lines[11].contains("no heartbeat since 2026-03-01T10:00:00Z"), "{text}");
        assert!(lines[12].contains("cannot judge"), "{text}");
        assert!(lines[12].contains("/r/plugins_registry: gone"), "{text}");
        assert!(text.contains("\nnot seen: resourceslices: not served\n"), "{text}");
        assert!(
            text.ends_with(
                "\n5 nodes: 1 healthy, 1 failing, 1 cannot judge, 1 silent, 1 without a doctor\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_json_has_ok_and_each_view() {
        let json = serde_json::to_value(fleet()).unwrap();
        assert_eq!(json["ok"], false);
        assert_eq!(json["drivers"][0]["kind"], "CSIPlugin");
        assert_eq!(json["drivers"][0]["has_object"], true);
        assert!(json["drivers"][1].get("has_object").is_none());
        assert_eq!(json["drivers"][1]["kind"], "DevicePlugin");
        assert_eq!(json["drivers"][0]["not_on"].as_array().unwrap().len(), 5, "all, in JSON");
        assert_eq!(json["nodes"][1]["doctor"]["state"], "failing");
        assert_eq!(json["nodes"][1]["doctor"]["reason"], "Stale");
        assert_eq!(json["nodes"][1]["failing_plugins"][0]["verdict"], "stale");
        assert_eq!(json["nodes"][1]["more_failing"], 2);
        assert_eq!(json["nodes"][2]["doctor"]["state"], "no-doctor");
        assert_eq!(json["nodes"][3]["doctor"]["since"], "2026-03-01T10:00:00Z");
        assert_eq!(json["nodes"][4]["doctor"]["state"], "cannot-judge");
        assert_eq!(json["nodes"][1]["source"], "report");
        assert_eq!(json["nodes"][1]["kubelet_version"], "v1.30.14");
    }

    #[test]
    fn no_driver_is_said() {
        let fleet = Fleet { drivers: Vec::new(), ..fleet() };
        assert!(
            render_fleet_table(&fleet)
                .starts_with("no CSI driver, device-plugin resource or DRA driver seen\n\n")
        );
    }
}
