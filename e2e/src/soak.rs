//! `cargo xtask soak [--minutes N | --seconds N] [-- LOADGEN-OPTIONS]`: the soak test of
//! `docs/reliability.md`. Ten minutes (by default) of plugin churn with
//! misbehaving plugins mixed in, against one `kpm run`, checking that kpm's
//! memory, file descriptors, threads and tasks do not grow.
//!
//! Builds the release binaries and starts kpm as `bench` does
//! (`harness.rs`), with `--metrics-addr 127.0.0.1:<free port>` so that the
//! load generator can read kpm's task and executor gauges; kpm's log goes to
//! `target/bench/kpm-soak.log`. Runs `kpm-loadgen run --scenario soak` (see
//! `crates/kpm-bench/src/soak/`), writes its JSON to
//! `target/bench/soak.json` and prints its tables with `kpm-loadgen report`.
//! Options after `--` go to the load generator (`--misbehaviours hanging-get-info`,
//! `--rate 50`, ...: see `kpm-loadgen run --help`).
//! Fails when the verdict fails, when kpm died or did not exit cleanly on
//! SIGTERM, or when the load generator failed.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::command::{Misused, Result};
use crate::harness::{self, stdout_of};

/// The soak's length unless told otherwise.
const DEFAULT_DURATION: Duration = Duration::from_secs(10 * 60);

/// `kpm-loadgen run`'s exit status when the verdict failed.
const VERDICT_FAILED: i32 = 3;

/// The usage `--help` prints: the synopsis `cargo xtask soak …`, then what
/// its words stand for.
pub fn usage() -> String {
    "cargo xtask soak [--minutes N | --seconds N] [-- LOADGEN-OPTIONS]\n  \
     LOADGEN-OPTIONS: see `kpm-loadgen run --help`"
        .to_owned()
}

/// Runs `cargo xtask soak` in the workspace at `root` with `options`, the
/// words after its name; wrong ones are a [`Misused`].
pub fn run(root: &Path, options: &[&str]) -> Result {
    let (options, passed_on) = match options.iter().position(|option| *option == "--") {
        Some(at) => (&options[..at], &options[at + 1..]),
        None => (options, &[][..]),
    };
    let duration = duration(options)?;
    let binaries = harness::build(root)?;
    let metrics = kpm_test_support::free_local_addr();
    let secs = duration.as_secs().to_string();
    let mut loadgen_args =
        vec!["--scenario", "soak", "--duration-secs", &secs, "--metrics-addr", &metrics];
    loadgen_args.extend(passed_on);
    let run = harness::against_fresh_kpm(
        &binaries,
        "soak",
        &["--metrics-addr", &metrics],
        &loadgen_args,
    )?;
    let log = run.log.display();
    let passed = match run.loadgen.status.code() {
        Some(0) => true,
        Some(VERDICT_FAILED) => false,
        _ => {
            return Err(
                format!("kpm-loadgen failed ({}); kpm's log: {log}", run.loadgen.status).into()
            );
        }
    };
    let file = binaries.out.join("soak.json");
    let json = String::from_utf8(run.loadgen.stdout)?;
    fs::write(&file, format!("{}\n", json.trim()))
        .map_err(|err| format!("cannot write {}: {err}", file.display()))?;
    println!("{}", stdout_of(Command::new(&binaries.loadgen).arg("report").arg(&file))?);
    println!("\nresults: {}\nkpm's log: {log}", file.display());
    if !run.kpm_exit.success() {
        return Err(format!("kpm exited with {}; see {log}", run.kpm_exit).into());
    }
    if !passed {
        return Err("the soak's verdict is FAIL (see the checks above)".into());
    }
    Ok(())
}

/// The duration asked for: `--minutes N` (fractions allowed) or `--seconds N`.
fn duration(options: &[&str]) -> Result<Duration> {
    let parsed = match options {
        [] => Some(DEFAULT_DURATION),
        ["--minutes", minutes] => minutes
            .parse::<f64>()
            .ok()
            .and_then(|minutes| Duration::try_from_secs_f64(minutes * 60.0).ok()),
        ["--seconds", seconds] => seconds.parse().ok().map(Duration::from_secs),
        _ => None,
    };
    parsed
        .filter(|duration| duration.as_secs() > 0)
        .ok_or_else(|| Misused(format!("cannot take `{}`", options.join(" "))).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_come_in_minutes_or_seconds() {
        assert_eq!(duration(&[]).unwrap(), Duration::from_secs(600));
        assert_eq!(duration(&["--minutes", "1.5"]).unwrap(), Duration::from_secs(90));
        assert_eq!(duration(&["--seconds", "75"]).unwrap(), Duration::from_secs(75));
        assert!(duration(&["--minutes", "0"]).is_err());
        assert!(duration(&["--minutes", "-1"]).is_err());
        assert!(duration(&["--minutes"]).is_err());
        assert!(duration(&["--hours", "1"]).is_err());
    }
}
