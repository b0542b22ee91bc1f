//! The machine description and the results table: each figure against the
//! target of issue 8 and the kubelet's plugin manager (Go, v1.32) measured
//! on the same machine. A soak's results file gets the soak's tables instead.

use std::path::Path;

use serde_json::{Value, json};

use crate::Result;
use crate::columns::columns;

/// This machine, as the results file records it.
pub(crate) fn machine() -> Value {
    let cpus = std::thread::available_parallelism().map(usize::from).ok();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|text| text.trim().to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_total_mb = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(crate::procfs::mb);
    json!({ "cpus": cpus, "cpu_model": model, "kernel": kernel, "mem_total_mb": mem_total_mb })
}

/// One line of the table.
struct Row<'a> {
    scenario: &'a str,
    measure: &'static str,
    value: String,
    target: &'static str,
    kubelet: &'static str,
    verdict: &'static str,
}

/// The table of the combined results in `file`.
pub(crate) fn table(file: &Path) -> Result<String> {
    let text = std::fs::read_to_string(file)
        .map_err(|err| format!("cannot read {}: {err}", file.display()))?;
    let results: Value = serde_json::from_str(&text)?;
    if results["scenario"] == "soak" {
        return Ok(crate::soak::table(&results));
    }
    let rows: Vec<Vec<String>> = rows(&results)
        .into_iter()
        .map(|row| {
            vec![
                row.scenario.to_owned(),
                row.measure.to_owned(),
                row.value,
                row.target.to_owned(),
                row.kubelet.to_owned(),
                row.verdict.to_owned(),
            ]
        })
        .collect();
    let headers = ["SCENARIO", "MEASURE", "KPM", "TARGET", "KUBELET v1.32", "VERDICT"];
    Ok(columns(&headers, &rows))
}

/// The scenarios in `results`, in the order they ran: xtask writes them
/// so, and the map keeps its keys' order (`serde_json`'s `preserve_order`).
fn scenarios(results: &Value) -> Vec<&str> {
    results["scenarios"]
        .as_object()
        .map(|scenarios| scenarios.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

fn rows(results: &Value) -> Vec<Row<'_>> {
    let number = |pointer: &str| results.pointer(pointer).and_then(Value::as_f64);
    let mut rows = failure_rows(results);
    rows.extend(latency_rows(&number));
    rows.extend(resource_rows(&number));
    rows.push(hang_row(&number));
    // Only the scenarios that ran, in the order they ran.
    let ran = scenarios(results);
    rows.retain(|row| ran.contains(&row.scenario));
    rows.sort_by_key(|row| ran.iter().position(|scenario| *scenario == row.scenario));
    rows
}

/// A row for each scenario that failed or has plugins that never registered.
fn failure_rows(results: &Value) -> Vec<Row<'_>> {
    let mut rows = Vec::new();
    for scenario in scenarios(results) {
        let field = |name: &str| results.pointer(&format!("/scenarios/{scenario}/{name}"));
        if let Some(error) = field("error") {
            rows.push(Row {
                scenario,
                measure: "error",
                value: error.as_str().unwrap_or_default().to_owned(),
                target: "",
                kubelet: "",
                verdict: "FAILED",
            });
        }
        let failures = field("failure_count").or_else(|| field("missing_count"));
        if let Some(failures) = failures.and_then(Value::as_u64).filter(|&n| n > 0) {
            rows.push(Row {
                scenario,
                measure: "plugins not registered / events missing",
                value: failures.to_string(),
                target: "0",
                kubelet: "",
                verdict: "FAILED",
            });
        }
    }
    rows
}

/// A latency row: scenario, measure, JSON pointer, limit in ms, target, kubelet.
type Latency = (&'static str, &'static str, &'static str, Option<f64>, &'static str, &'static str);

const LATENCIES: &[Latency] = &[
    (
        "staggered",
        "registration p50",
        "/scenarios/staggered/latency_ms/p50",
        Some(1.0),
        "≤ 1 ms",
        "553 ms",
    ),
    (
        "staggered",
        "registration p99",
        "/scenarios/staggered/latency_ms/p99",
        Some(5.0),
        "≤ 5 ms",
        "1003 ms",
    ),
    ("staggered", "registration max", "/scenarios/staggered/latency_ms/max", None, "", ""),
    (
        "burst",
        "1000 plugins: all notified",
        "/scenarios/burst/all_notified_ms",
        Some(200.0),
        "≤ 200 ms",
        "1239 ms",
    ),
    ("burst", "renaming the 1000 sockets in", "/scenarios/burst/rename_all_ms", None, "", ""),
    (
        "burst-in-place",
        "1000 plugins: all notified",
        "/scenarios/burst-in-place/all_notified_ms",
        None,
        "",
        "",
    ),
    (
        "burst-in-place",
        "binding the 1000 sockets",
        "/scenarios/burst-in-place/bind_all_ms",
        None,
        "",
        "",
    ),
    ("churn", "registration p50", "/scenarios/churn/latency_ms/p50", None, "", ""),
    ("churn", "registration p99", "/scenarios/churn/latency_ms/p99", Some(10.0), "≤ 10 ms", ""),
    (
        "deregister",
        "socket removed → deregistered, p50",
        "/scenarios/deregister/latency_ms/p50",
        None,
        "",
        "",
    ),
    (
        "deregister",
        "socket removed → deregistered, p99",
        "/scenarios/deregister/latency_ms/p99",
        None,
        "",
        "",
    ),
    (
        "deregister",
        "socket removed → deregistered, max",
        "/scenarios/deregister/latency_ms/max",
        None,
        "",
        "",
    ),
    ("kill", "SIGKILL → deregistered, p50", "/scenarios/kill/latency_ms/p50", None, "", ""),
    (
        "kill",
        "SIGKILL → deregistered, p99",
        "/scenarios/kill/latency_ms/p99",
        Some(50.0),
        "≤ 50 ms",
        "never",
    ),
    ("kill", "SIGKILL → deregistered, max", "/scenarios/kill/latency_ms/max", None, "", ""),
    ("hang", "SIGSTOP → deregistered, p50", "/scenarios/hang/latency_ms/p50", None, "", ""),
];

fn latency_rows(number: &impl Fn(&str) -> Option<f64>) -> Vec<Row<'static>> {
    LATENCIES
        .iter()
        .map(|&(scenario, measure, pointer, limit, target, kubelet)| Row {
            scenario,
            measure,
            value: number(pointer).map_or_else(|| "-".to_owned(), |v| format!("{v:.3} ms")),
            target,
            kubelet,
            verdict: verdict(number(pointer), limit),
        })
        .collect()
}

/// The slowest deregistration of a stopped plugin, against the bound its
/// liveness settings promise: `period × failures` plus one period.
fn hang_row(number: &impl Fn(&str) -> Option<f64>) -> Row<'static> {
    let max = number("/scenarios/hang/latency_ms/max");
    let bound = number("/scenarios/hang/bound_ms");
    Row {
        scenario: "hang",
        measure: "SIGSTOP → deregistered, max",
        value: max.map_or_else(|| "-".to_owned(), |v| format!("{v:.0} ms")),
        target: "≤ period × (failures + 1)",
        kubelet: "never",
        verdict: verdict(max, bound),
    }
}

/// kpm's CPU, memory and file descriptors in `steady` and `churn`.
fn resource_rows(number: &impl Fn(&str) -> Option<f64>) -> Vec<Row<'static>> {
    let shown = |value: Option<f64>, format: fn(f64) -> String| {
        value.map_or_else(|| "-".to_owned(), format)
    };
    let cpu = number("/scenarios/steady/kpm/cpu/cpu_percent");
    let sched = number("/scenarios/steady/kpm/cpu/cpu_percent_schedstat");
    let rss = number("/scenarios/steady/kpm/end/rss_mb");
    let csi_sched = number("/scenarios/steady-csi/kpm/cpu/cpu_percent_schedstat");
    let csi_rss = number("/scenarios/steady-csi/kpm/end/rss_mb");
    let fds = (number("/scenarios/churn/kpm/start/fds"), number("/scenarios/churn/kpm/end/fds"));
    let churn_rss = (
        number("/scenarios/churn/kpm/start/rss_mb"),
        number("/scenarios/churn/kpm/end/rss_mb"),
        number("/scenarios/churn/kpm/rss_growth_percent"),
    );
    vec![
        Row {
            scenario: "steady",
            measure: "kpm CPU, 1000 plugins (ticks)",
            value: shown(cpu, |v| format!("{v:.3} %")),
            target: "≤ 0.1 %",
            kubelet: "18 %",
            verdict: verdict(cpu, Some(0.1)),
        },
        Row {
            scenario: "steady",
            measure: "kpm CPU, 1000 plugins (schedstat)",
            value: shown(sched, |v| format!("{v:.4} %")),
            target: "≤ 0.1 %",
            kubelet: "18 %",
            verdict: verdict(sched, Some(0.1)),
        },
        Row {
            scenario: "steady",
            measure: "kpm RSS, 1000 plugins",
            value: shown(rss, |v| format!("{v:.1} MB")),
            target: "≤ 30 MB",
            kubelet: "70 MB",
            verdict: verdict(rss, Some(30.0)),
        },
        Row {
            scenario: "steady-csi",
            measure: "kpm CPU, 1000 CSI drivers (schedstat)",
            value: shown(csi_sched, |v| format!("{v:.4} %")),
            target: "≤ 0.1 %",
            kubelet: "24.6 %",
            verdict: verdict(csi_sched, Some(0.1)),
        },
        Row {
            scenario: "steady-csi",
            measure: "kpm RSS, 1000 CSI drivers",
            value: shown(csi_rss, |v| format!("{v:.1} MB")),
            target: "≤ 20 MB",
            kubelet: "50.8 MB",
            verdict: verdict(csi_rss, Some(20.0)),
        },
        Row {
            scenario: "churn",
            measure: "kpm open fds, start → end",
            value: match fds {
                (Some(start), Some(end)) => format!("{start} → {end}"),
                _ => "-".to_owned(),
            },
            target: "no growth",
            kubelet: "",
            verdict: verdict(number("/scenarios/churn/kpm/fd_growth"), Some(0.0)),
        },
        Row {
            scenario: "churn",
            measure: "kpm RSS, start → end",
            value: match churn_rss {
                (Some(start), Some(end), Some(growth)) => {
                    format!("{start:.1} → {end:.1} MB ({growth:+.1} %)")
                }
                _ => "-".to_owned(),
            },
            target: "≤ +5 %",
            kubelet: "",
            verdict: verdict(churn_rss.2, Some(5.0)),
        },
    ]
}

fn verdict(value: Option<f64>, limit: Option<f64>) -> &'static str {
    match (value, limit) {
        (None, _) => "no data",
        (Some(_), None) => "",
        (Some(value), Some(limit)) if value <= limit => "met",
        (Some(_), Some(_)) => "MISSED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_compare_with_the_target() {
        assert_eq!(verdict(Some(0.5), Some(1.0)), "met");
        assert_eq!(verdict(Some(1.0), Some(1.0)), "met");
        assert_eq!(verdict(Some(1.5), Some(1.0)), "MISSED");
        assert_eq!(verdict(None, Some(1.0)), "no data");
        assert_eq!(verdict(Some(1.5), None), "");
    }

    #[test]
    fn rows_read_the_results() {
        let results = json!({"scenarios": {
            "staggered": {"latency_ms": {"p50": 0.8, "p99": 7.0, "max": 9.0}, "failure_count": 0},
            "churn": {"kpm": {"start": {"fds": 2010, "rss_mb": 10.0},
                              "end": {"fds": 2010, "rss_mb": 10.2},
                              "rss_growth_percent": 2.0, "fd_growth": 0}},
            "burst": {"error": "kpm did not start"},
        }});
        let rows = rows(&results);
        let find = |scenario, measure| {
            rows.iter().find(|row| row.scenario == scenario && row.measure == measure).unwrap()
        };
        assert_eq!(find("staggered", "registration p50").verdict, "met");
        assert_eq!(find("staggered", "registration p99").verdict, "MISSED");
        assert_eq!(find("churn", "kpm open fds, start → end").value, "2010 → 2010");
        assert_eq!(find("churn", "kpm RSS, start → end").verdict, "met");
        assert_eq!(find("burst", "error").verdict, "FAILED");
        assert_eq!(find("burst", "1000 plugins: all notified").verdict, "no data");
        assert!(rows.iter().all(|row| row.scenario != "steady"));
        // In the order the results hold them, which is the order they ran.
        let mut order: Vec<&str> = rows.iter().map(|row| row.scenario).collect();
        order.dedup();
        assert_eq!(order, ["staggered", "churn", "burst"]);
    }
}
