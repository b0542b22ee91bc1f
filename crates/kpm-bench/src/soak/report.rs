//! The soak's report: a sample as JSON, the verdict (the final quiescent
//! sample against the baseline), and the tables of a soak's results file.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};

use crate::stats::{Fit, fit, float, round};
use crate::{columns::columns, procfs};

/// Allowed growth of RSS and of the live heap, in percent of the baseline.
const MEMORY_GROWTH_PERCENT: u64 = 5;

/// One reading of kpm (and of the load generator's own file descriptors).
#[derive(Debug, Clone)]
pub(super) struct Sample {
    /// Since the start of the run.
    pub(super) at: Duration,
    /// `load`, `pause`, `baseline` or `final`.
    pub(super) phase: &'static str,
    pub(super) rss_kb: u64,
    /// Of the RSS, anonymous pages and pages of mapped files (the binary).
    pub(super) rss_anon_kb: u64,
    pub(super) rss_file_kb: u64,
    /// kpm's live heap (`kpm_heap_allocated_bytes`), in KiB.
    pub(super) heap_kb: Option<u64>,
    /// What kpm's allocator holds beside its live heap.
    pub(super) allocator: Allocator,
    pub(super) fds: u64,
    pub(super) threads: u64,
    pub(super) tasks: Option<u64>,
    /// Connections liveness keeps between probes (`kpm_liveness_probe_connections`):
    /// one fd and two tasks each, bounded, and gone with their plugin.
    pub(super) probe_connections: Option<u64>,
    pub(super) operations: Option<u64>,
    /// Sockets in kpm's actual and desired state of the world.
    pub(super) registered: u64,
    pub(super) desired: u64,
    /// kpm's counters since it started.
    pub(super) registrations: Option<u64>,
    pub(super) rejections: Option<u64>,
    /// Socket files in the registry.
    pub(super) sockets: u64,
    /// Misbehaving plugins running.
    pub(super) misbehaving: usize,
    pub(super) loadgen_fds: u64,
}

/// kpm's allocator's own accounting (its `kpm_heap_*` metrics), in KiB;
/// `None` where kpm did not report it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Allocator {
    pub(super) active_kb: Option<u64>,
    pub(super) metadata_kb: Option<u64>,
    pub(super) resident_kb: Option<u64>,
    pub(super) mapped_kb: Option<u64>,
    pub(super) retained_kb: Option<u64>,
    /// Freed pages not returned yet, summed over the arenas.
    pub(super) dirty_kb: Option<u64>,
    pub(super) muzzy_kb: Option<u64>,
    /// Freed blocks kept in the threads' caches, summed over the arenas.
    pub(super) cached_kb: Option<u64>,
    /// Arenas with pages of their own.
    pub(super) arenas: u64,
}

impl Allocator {
    fn json(&self) -> Value {
        let mb = |kb: Option<u64>| kb.map(procfs::mb);
        json!({
            "active_mb": mb(self.active_kb),
            "metadata_mb": mb(self.metadata_kb),
            "resident_mb": mb(self.resident_kb),
            "mapped_mb": mb(self.mapped_kb),
            "retained_mb": mb(self.retained_kb),
            "dirty_mb": mb(self.dirty_kb),
            "muzzy_mb": mb(self.muzzy_kb),
            "cached_mb": mb(self.cached_kb),
            "arenas": self.arenas,
        })
    }
}

impl Sample {
    pub(super) fn json(&self) -> Value {
        json!({
            "t_s": round(self.at.as_secs_f64(), 1),
            "phase": self.phase,
            "rss_mb": procfs::mb(self.rss_kb),
            "rss_kb": self.rss_kb,
            "rss_anon_mb": procfs::mb(self.rss_anon_kb),
            "rss_file_mb": procfs::mb(self.rss_file_kb),
            "heap_mb": self.heap_kb.map(procfs::mb),
            "heap_kb": self.heap_kb,
            "allocator": self.allocator.json(),
            "fds": self.fds,
            "threads": self.threads,
            "tokio_tasks": self.tasks,
            "probe_connections": self.probe_connections,
            "executor_entries": self.operations,
            "registered": self.registered,
            "desired": self.desired,
            "registrations_total": self.registrations,
            "rejections_total": self.rejections,
            "sockets": self.sockets,
            "misbehaving": self.misbehaving,
            "loadgen_fds": self.loadgen_fds,
        })
    }
}

/// What the verdict is drawn from.
#[derive(Debug)]
pub(super) struct Verdict<'a> {
    pub(super) plugins: usize,
    pub(super) kpm_alive: bool,
    pub(super) baseline: Option<&'a Sample>,
    pub(super) last: Option<&'a Sample>,
    /// Every sample, in order.
    pub(super) samples: &'a [Sample],
    pub(super) churn_failures: usize,
    pub(super) bad_errors: usize,
}

/// The growth allowed over a count at baseline: 2 % or 10, whichever is
/// more. Quiescent counts should match exactly; the slack absorbs what comes
/// and goes by itself (a connection closing late, an idle blocking-pool
/// thread, the scrape's own connection), while a leak of one per misbehaving
/// plugin (400 in ten minutes) or per kind-round (30) is far above it.
fn slack(baseline: u64) -> u64 {
    (baseline / 50).max(10)
}

/// The least-squares slope of kpm's RSS, in MB per hour, over the samples
/// under load in the second half of the time under load. A leak climbs
/// steadily, and its slope stands above the scatter; a plateau reached
/// earlier has a slope within its bound of zero. The pauses are left out:
/// they are quieter than the load around them.
pub(super) fn rss_slope(samples: &[Sample]) -> Option<Fit> {
    let loaded: Vec<&Sample> = samples.iter().filter(|sample| sample.phase == "load").collect();
    let (first, last) = (loaded.first()?.at, loaded.last()?.at);
    let half = first + last.saturating_sub(first) / 2;
    let hours = |at: Duration| at.as_secs_f64() / 3600.0;
    let points: Vec<(f64, f64)> = loaded
        .iter()
        .filter(|sample| sample.at >= half)
        .map(|sample| (hours(sample.at), procfs::mb(sample.rss_kb)))
        .collect();
    fit(&points)
}

/// The check of [`rss_slope`]: the slope must not stand above zero by more
/// than its bound.
fn slope_check(samples: &[Sample]) -> Value {
    let fit = rss_slope(samples);
    json!({
        "check": "kpm RSS slope, last half of the load (MB/h)",
        "baseline": Value::Null,
        "final": fit.map(|fit| format!("{:+.2} ± {:.2} ({} samples)", fit.slope, fit.bound, fit.points)),
        "limit": if fit.is_some() { "≤ 0 within its bound" } else { "3 samples or more" },
        "pass": fit.is_some_and(|fit| fit.slope - fit.bound <= 0.0),
    })
}

/// The checks of the verdict, each `{check, baseline, final, limit, pass}`.
pub(super) fn checks(verdict: &Verdict<'_>) -> Vec<Value> {
    let check = |name: &str, baseline: Value, last: Value, limit: String, pass: bool| json!({ "check": name, "baseline": baseline, "final": last, "limit": limit, "pass": pass });
    let mut checks = vec![check(
        "kpm alive to the end",
        Value::Null,
        verdict.kpm_alive.into(),
        "alive".to_owned(),
        verdict.kpm_alive,
    )];
    let (Some(base), Some(last)) = (verdict.baseline, verdict.last) else {
        checks.push(check(
            "quiescent samples",
            verdict.baseline.is_some().into(),
            verdict.last.is_some().into(),
            "both taken".to_owned(),
            false,
        ));
        return checks;
    };
    let no_growth = |name: &str, base: Option<u64>, last: Option<u64>| match (base, last) {
        (Some(base), Some(last)) => {
            let limit = base + slack(base);
            check(name, base.into(), last.into(), format!("≤ {limit}"), last <= limit)
        }
        _ => check(name, base.into(), last.into(), "no data".to_owned(), false),
    };
    // What the connections kept for probes hold is theirs, not a leak.
    let kept = |sample: &Sample, each: u64| sample.probe_connections.unwrap_or(0) * each;
    let fds = |sample: &Sample| sample.fds.saturating_sub(kept(sample, 1));
    let tasks = |sample: &Sample| sample.tasks.map(|tasks| tasks.saturating_sub(kept(sample, 2)));
    checks.push(no_growth(
        "kpm open fds, beyond probe connections",
        Some(fds(base)),
        Some(fds(last)),
    ));
    checks.push(no_growth("kpm tokio tasks, beyond probe connections", tasks(base), tasks(last)));
    checks.push(no_growth("kpm threads", Some(base.threads), Some(last.threads)));
    let memory = |name: &str, base: Option<u64>, last: Option<u64>| match (base, last) {
        (Some(base), Some(last)) => {
            let limit = base + base * MEMORY_GROWTH_PERCENT / 100;
            let growth = 100.0 * (float(last) / float(base.max(1)) - 1.0);
            check(
                name,
                procfs::mb(base).into(),
                procfs::mb(last).into(),
                format!("≤ {} (+{MEMORY_GROWTH_PERCENT} %); {growth:+.1} %", procfs::mb(limit)),
                last <= limit,
            )
        }
        _ => check(name, Value::Null, Value::Null, "no data".to_owned(), false),
    };
    checks.push(memory("kpm RSS (MB)", Some(base.rss_kb), Some(last.rss_kb)));
    checks.push(memory("kpm live heap (MB)", base.heap_kb, last.heap_kb));
    checks.push(slope_check(verdict.samples));
    let plugins = u64::try_from(verdict.plugins).unwrap_or(u64::MAX);
    checks.push(check(
        "well-behaved plugins registered",
        base.registered.into(),
        last.registered.into(),
        format!("= {plugins}"),
        last.registered == plugins,
    ));
    checks.push(check(
        "sockets in the registry / in kpm's desired state",
        format!("{} / {}", base.sockets, base.desired).into(),
        format!("{} / {}", last.sockets, last.desired).into(),
        format!("= {plugins} / {plugins}"),
        last.sockets == plugins && last.desired == plugins,
    ));
    // An entry exists while a socket's operation runs or after it failed;
    // success drops it. Once settled, only unregistered sockets may have one.
    let unregistered = last.sockets.saturating_sub(last.registered);
    checks.push(check(
        "kpm executor entries",
        base.operations.into(),
        last.operations.into(),
        format!("= sockets not registered ({unregistered})"),
        last.operations == Some(unregistered),
    ));
    checks.push(check(
        "churned plugins not registered",
        Value::Null,
        verdict.churn_failures.into(),
        "0".to_owned(),
        verdict.churn_failures == 0,
    ));
    checks.push(no_growth(
        "load generator open fds",
        Some(base.loadgen_fds),
        Some(last.loadgen_fds),
    ));
    checks.push(check(
        "misbehaving plugins set up as intended",
        Value::Null,
        format!("{} errors", verdict.bad_errors).into(),
        "0 errors".to_owned(),
        verdict.bad_errors == 0,
    ));
    checks
}

/// A JSON value as a table cell: strings unquoted, `-` for null.
fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The tables of a soak's results: samples over time, latency by minute,
/// misbehaving plugins, verdict.
pub(crate) fn table(results: &Value) -> String {
    let field = |value: &Value, key: &str| cell(&value[key]);
    let list = |key: &str| results[key].as_array().cloned().unwrap_or_default();
    let mut out = format!(
        "kpm soak: {} plugins, {} re-created per second, a misbehaving plugin every {} ms \
         living {} ms; {} s under load (warm-up {} s), sampled every {} s\n\n",
        field(results, "plugins"),
        field(results, "rate_per_s"),
        cell(&results["misbehaving"]["interval_ms"]),
        cell(&results["misbehaving"]["lifetime_ms"]),
        field(results, "load_s"),
        field(results, "warmup_s"),
        field(results, "sample_every_s"),
    );
    let keys = [
        "t_s",
        "phase",
        "rss_mb",
        "heap_mb",
        "fds",
        "threads",
        "tokio_tasks",
        "executor_entries",
        "registered",
        "sockets",
        "registrations_total",
        "rejections_total",
        "misbehaving",
        "loadgen_fds",
    ];
    let headers = [
        "T (S)",
        "PHASE",
        "RSS MB",
        "HEAP MB",
        "FDS",
        "THREADS",
        "TASKS",
        "EXECUTOR",
        "REGISTERED",
        "SOCKETS",
        "REGISTRATIONS",
        "REJECTIONS",
        "MISBEHAVING",
        "LOADGEN FDS",
    ];
    let rows: Vec<Vec<String>> = list("samples")
        .iter()
        .map(|sample| keys.iter().map(|key| field(sample, key)).collect())
        .collect();
    out.push_str(&columns(&headers, &rows));
    out.push_str(&memory_table(&list("samples")));

    out.push_str("\n\nregistration latency of the re-created plugins, by minute (ms):\n");
    let rows: Vec<Vec<String>> = list("latency_by_minute")
        .iter()
        .map(|minute| {
            ["minute", "count", "p50", "p99", "max", "not_registered"]
                .iter()
                .map(|key| field(minute, key))
                .collect()
        })
        .collect();
    let headers = ["MINUTE", "COUNT", "P50", "P99", "MAX", "NOT REGISTERED"];
    out.push_str(&columns(&headers, &rows));

    out.push_str("\n\nmisbehaving plugins:\n");
    let kinds = results["misbehaving"]["kinds"].as_array().cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = kinds
        .iter()
        .map(|kind| {
            ["kind", "instances", "get_info_calls", "notified_registered", "notified_rejected"]
                .iter()
                .map(|key| field(kind, key))
                .collect()
        })
        .collect();
    let headers = ["KIND", "INSTANCES", "GETINFO CALLS", "NOTIFIED OK", "NOTIFIED REJECTED"];
    out.push_str(&columns(&headers, &rows));
    for error in results["misbehaving"]["errors"].as_array().into_iter().flatten() {
        let _ = write!(out, "\n  error: {}", cell(error));
    }
    for failure in list("churn_failures") {
        let _ = write!(out, "\n  not registered: {}", cell(&failure));
    }

    out.push_str(&verdict_table(&results["verdict"]));
    out
}

/// Where kpm's RSS goes over time: anonymous and file pages, and what its
/// allocator holds (jemalloc's own accounting).
fn memory_table(samples: &[Value]) -> String {
    let headers = [
        "T (S)", "PHASE", "RSS", "ANON", "FILE", "HEAP", "ACTIVE", "METADATA", "RESIDENT", "DIRTY",
        "MUZZY", "CACHED", "MAPPED", "RETAINED", "ARENAS",
    ];
    let rows: Vec<Vec<String>> = samples
        .iter()
        .map(|sample| {
            let top = ["t_s", "phase", "rss_mb", "rss_anon_mb", "rss_file_mb", "heap_mb"];
            let allocator = [
                "active_mb",
                "metadata_mb",
                "resident_mb",
                "dirty_mb",
                "muzzy_mb",
                "cached_mb",
                "mapped_mb",
                "retained_mb",
                "arenas",
            ];
            top.iter()
                .map(|key| cell(&sample[key]))
                .chain(allocator.iter().map(|key| cell(&sample["allocator"][key])))
                .collect()
        })
        .collect();
    format!(
        "\n\nkpm's memory (MB): RSS, its anonymous and file pages, and its allocator's figures:\n{}",
        columns(&headers, &rows)
    )
}

/// The verdict and its checks.
fn verdict_table(verdict: &Value) -> String {
    let field = |value: &Value, key: &str| cell(&value[key]);
    let pass = verdict["pass"] == true;
    let mut out = format!("\n\nverdict: {}\n", if pass { "PASS" } else { "FAIL" });
    let rows: Vec<Vec<String>> = verdict["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|check| {
            let result = if check["pass"] == true { "ok" } else { "FAILED" };
            vec![
                field(check, "check"),
                field(check, "baseline"),
                field(check, "final"),
                field(check, "limit"),
                result.to_owned(),
            ]
        })
        .collect();
    out.push_str(&columns(&["CHECK", "BASELINE", "FINAL", "LIMIT", "RESULT"], &rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(fds: u64, tasks: u64, rss_kb: u64) -> Sample {
        Sample {
            at: Duration::from_secs(60),
            phase: "baseline",
            rss_kb,
            rss_anon_kb: rss_kb / 2,
            rss_file_kb: rss_kb / 4,
            heap_kb: Some(rss_kb / 2),
            allocator: Allocator::default(),
            fds,
            threads: 3,
            tasks: Some(tasks),
            probe_connections: Some(0),
            operations: Some(0),
            registered: 200,
            desired: 200,
            registrations: Some(400),
            rejections: Some(30),
            sockets: 200,
            misbehaving: 0,
            loadgen_fds: 420,
        }
    }

    fn failed(checks: &[Value]) -> Vec<String> {
        checks.iter().filter(|c| c["pass"] != true).map(|c| c["check"].to_string()).collect()
    }

    /// Samples under load every 10 s for 20 minutes, RSS in KiB by time in seconds.
    fn loaded(rss_kb: impl Fn(u64) -> u64) -> Vec<Sample> {
        (1..=120)
            .map(|tick| {
                let at = tick * 10;
                Sample {
                    at: Duration::from_secs(at),
                    phase: "load",
                    ..sample(230, 700, rss_kb(at))
                }
            })
            .collect()
    }

    #[test]
    fn the_verdict_allows_small_noise_and_catches_growth() {
        let base = sample(230, 700, 20_000);
        let flat = loaded(|_| 20_000);
        let verdict = |last: &Sample| {
            checks(&Verdict {
                plugins: 200,
                kpm_alive: true,
                baseline: Some(&base),
                last: Some(last),
                samples: &flat,
                churn_failures: 0,
                bad_errors: 0,
            })
        };
        assert!(failed(&verdict(&sample(240, 714, 21_000))).is_empty());
        assert_eq!(
            failed(&verdict(&sample(241, 700, 20_000))),
            ["\"kpm open fds, beyond probe connections\""]
        );
        assert_eq!(
            failed(&verdict(&sample(230, 715, 20_000))),
            ["\"kpm tokio tasks, beyond probe connections\""]
        );
        // Twenty more connections kept for probes: one fd and two tasks each.
        let kept = Sample { probe_connections: Some(20), ..sample(250, 740, 20_000) };
        assert!(failed(&verdict(&kept)).is_empty());
        assert_eq!(failed(&verdict(&sample(230, 700, 21_001))), ["\"kpm RSS (MB)\""]);
        let heap_grew = Sample { heap_kb: Some(10_501), ..sample(230, 700, 20_000) };
        assert_eq!(failed(&verdict(&heap_grew)), ["\"kpm live heap (MB)\""]);
        let leaked = Sample { operations: Some(3), ..sample(230, 700, 20_000) };
        assert_eq!(failed(&verdict(&leaked)), ["\"kpm executor entries\""]);
        let stuck = Sample { registered: 199, ..sample(230, 700, 20_000) };
        assert_eq!(
            failed(&verdict(&stuck)),
            ["\"well-behaved plugins registered\"", "\"kpm executor entries\""]
        );
        let died = checks(&Verdict {
            plugins: 200,
            kpm_alive: false,
            baseline: Some(&base),
            last: None,
            samples: &[],
            churn_failures: 0,
            bad_errors: 0,
        });
        assert_eq!(failed(&died), ["\"kpm alive to the end\"", "\"quiescent samples\""]);
    }

    #[test]
    fn the_slope_tells_a_plateau_from_a_leak() {
        let slope = |rss_kb: &dyn Fn(u64) -> u64| rss_slope(&loaded(rss_kb)).expect("a fit");
        // Climbing 5 MB in the first minutes, then a saw-tooth of 1 MB around 25 MB.
        let plateau =
            slope(&|at| if at < 300 { 20_000 + at * 16 } else { 24_500 + (at / 10 % 2) * 1000 });
        assert!(plateau.slope - plateau.bound <= 0.0, "{plateau:?}");
        assert_eq!(plateau.points, 60, "the second half of the load only: 610 s to 1200 s");
        // The same saw-tooth over a leak of 10 MiB an hour (2.8 KiB a second),
        // which ten minutes tell from the saw-tooth: the issue-36 soak grew
        // 1.7 MB in its last 5.5 minutes (18 MB an hour).
        let leak = slope(&|at| 20_000 + at * 10_000 / 3600 + (at / 10 % 2) * 1000);
        assert!(leak.slope - leak.bound > 0.0, "{leak:?}");
        assert!((leak.slope - 10.24).abs() < 1.0, "MB (10^6) per hour: {leak:?}");
        // Pause samples are left out, and too few samples give no fit.
        let mut paused = loaded(|_| 20_000);
        paused.iter_mut().skip(2).for_each(|sample| sample.phase = "pause");
        assert!(rss_slope(&paused).is_none());
    }
}
