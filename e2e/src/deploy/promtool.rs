//! The alerting rules checked by promtool, Prometheus' own checker:
//! `promtool check rules` (syntax, PromQL, templates) and `promtool test
//! rules` (the alerts fire on the series of the tests, and only there).
//!
//! promtool comes with Debian's `prometheus` package. When it is not on
//! `$PATH` and this runs as root on Debian (CI), the package is installed
//! (`crate::debian`: no recommended packages, no service started). A
//! Prometheus that starts all the same is stopped and reported.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::command::Result;

/// The rule file and its tests, in `deploy/doctor`.
const RULES: &str = "alerts.yaml";
const RULE_TESTS: &str = "alerts.test.yaml";

const PROMETHEUS_PACKAGE: &str = "prometheus";
/// Where the package installs promtool.
const DEBIAN_PROMTOOL: &str = "/usr/bin/promtool";

/// Checks and tests the rules in `dir`.
pub(super) fn check_alerts(dir: &Path) -> Result {
    let promtool = match crate::debian::find("promtool") {
        Some(promtool) => promtool,
        None => install()?,
    };
    for args in [["check", "rules", RULES], ["test", "rules", RULE_TESTS]] {
        println!("$ {} {}", promtool.display(), args.join(" "));
        let status = Command::new(&promtool)
            .args(args)
            .current_dir(dir)
            .status()
            .map_err(|err| format!("cannot start {}: {err}", promtool.display()))?;
        if !status.success() {
            return Err(format!(
                "`promtool {}` in {} failed ({status})",
                args.join(" "),
                dir.display()
            )
            .into());
        }
    }
    Ok(())
}

/// Installs Debian's `prometheus` package, no service started; its promtool.
fn install() -> Result<PathBuf> {
    let running_before = prometheus_processes();
    crate::debian::install(&[PROMETHEUS_PACKAGE], "promtool")?;
    let started_by_install: Vec<u32> =
        prometheus_processes().difference(&running_before).copied().collect();
    for pid in &started_by_install {
        // Only processes that were not there before the install.
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    if !started_by_install.is_empty() {
        return Err(format!(
            "installing {PROMETHEUS_PACKAGE} started Prometheus (pids {started_by_install:?}, now stopped) \
             despite policy-rc.d"
        )
        .into());
    }
    crate::debian::find("promtool")
        .or_else(|| Path::new(DEBIAN_PROMTOOL).is_file().then(|| PathBuf::from(DEBIAN_PROMTOOL)))
        .ok_or_else(|| {
            format!("{PROMETHEUS_PACKAGE} installed, but no promtool at {DEBIAN_PROMTOOL}").into()
        })
}

/// Pids of the processes named `prometheus`.
fn prometheus_processes() -> BTreeSet<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return BTreeSet::new() };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let comm = fs::read_to_string(entry.path().join("comm")).ok()?;
            (comm.trim_end() == PROMETHEUS_PACKAGE).then_some(pid)
        })
        .collect()
}
