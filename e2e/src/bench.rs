//! `cargo xtask bench [--quick] [--only SCENARIO]`: the performance
//! benchmark of issue 8, described in `docs/performance.md`.
//!
//! Builds `kpm` and `kpm-loadgen` (crate `kpm-bench`) in release mode, then
//! for each scenario starts a fresh `kpm run --root-dir /tmp/kpm-bench-XXXX`
//! (`RUST_LOG=warn`, its log in `target/bench/kpm-<scenario>.log`), waits for
//! its status socket, runs `kpm-loadgen run --scenario <scenario> --kpm-pid
//! <pid>` against it (the load generator reads kpm's `/proc` itself, since it
//! knows when each phase starts and ends) and stops kpm with SIGTERM. The
//! scenarios' JSON objects are combined into `target/bench/results.json`,
//! printed, and summed up as a table by `kpm-loadgen report`.
//!
//! `--quick` holds `steady` and churns `churn` for 5 s instead of 30 s;
//! `--only` runs one scenario. How kpm and the load generator are built and
//! started is shared with `soak` (`harness.rs`).

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;

use crate::command::{Misused, Result};
use crate::harness::{self, Binaries, stdout_of};

/// The scenarios, in the order they run. `steady-csi` is `steady` with
/// CSI drivers instead of device plugins: liveness probes each type its
/// own way.
const SCENARIOS: [&str; 10] = [
    "staggered",
    "burst",
    "burst-in-place",
    "steady",
    "steady-csi",
    "churn",
    "deregister",
    "kill",
    "hang",
    "doctor-idle",
];

/// `doctor-idle`: `kpm doctor --watch` beside a `kpm run` with this many
/// CSI drivers, judging every `DOCTOR_PERIOD_SECS` (a fifth of the default,
/// so that the hold takes in full passes), held for `DOCTOR_HOLD_SECS`.
const DOCTOR_PLUGINS: &str = "20";
const DOCTOR_PERIOD_SECS: &str = "60";
const DOCTOR_HOLD_SECS: &str = "180";

/// The liveness settings of `hang` (kpm's default period is 30 s): a stopped
/// plugin must be deregistered within `period × (failures + 1)`.
const HANG_LIVENESS: [&str; 4] = ["--liveness-period", "2", "--liveness-failures", "3"];

/// How long `steady` holds and `churn` churns with `--quick`, in seconds.
const QUICK_DURATION_SECS: &str = "5";

/// The usage `--help` prints: the synopsis `cargo xtask bench …`, then what
/// its words stand for.
pub fn usage() -> String {
    format!("cargo xtask bench [--quick] [--only SCENARIO]\n  SCENARIO: {}", SCENARIOS.join(", "))
}

/// Runs `cargo xtask bench` in the workspace at `root` with `options`, the
/// words after its name; wrong ones are a [`Misused`].
pub fn run(root: &Path, options: &[&str]) -> Result {
    let mut quick = false;
    let mut only = None;
    let mut options = options.iter().copied();
    while let Some(option) = options.next() {
        match option {
            "--quick" => quick = true,
            "--only" => match options.next() {
                Some(scenario) if SCENARIOS.contains(&scenario) => only = Some(scenario),
                value => return Err(Misused::refused(option, value).into()),
            },
            _ => return Err(Misused::refused(option, None).into()),
        }
    }

    let binaries = harness::build(root)?;
    let machine = stdout_of(Command::new(&binaries.loadgen).arg("machine"))?;
    let mut parts = Vec::new();
    let mut failed = Vec::new();
    for scenario in SCENARIOS.into_iter().filter(|s| only.is_none_or(|only| only == *s)) {
        let fragment = match run_scenario(&binaries, scenario, quick) {
            Ok(json) => json,
            Err(err) => {
                eprintln!("bench: {scenario} failed: {err}");
                failed.push(scenario);
                format!("{{\"error\":{}}}", json_string(&err.to_string()))
            }
        };
        parts.push(format!("\"{scenario}\":{fragment}"));
    }
    let results = format!(
        "{{\"machine\":{machine},\"quick\":{quick},\"scenarios\":{{{}}}}}",
        parts.join(",")
    );
    let file = binaries.out.join("results.json");
    fs::write(&file, format!("{results}\n"))
        .map_err(|err| format!("cannot write {}: {err}", file.display()))?;
    println!("{results}");
    println!();
    println!("{}", stdout_of(Command::new(&binaries.loadgen).arg("report").arg(&file))?);
    println!("\nresults: {}", file.display());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("scenario(s) failed: {}", failed.join(", ")).into())
    }
}

/// One scenario against a fresh kpm; returns the load generator's JSON.
fn run_scenario(binaries: &Binaries, scenario: &str, quick: bool) -> Result<String> {
    let mut args = match scenario {
        "steady-csi" => vec!["--scenario", "steady", "--plugin-type", "csi"],
        // The doctor's cost, measured as `steady` measures kpm's.
        "doctor-idle" => vec![
            "--scenario",
            "steady",
            "--plugin-type",
            "csi",
            "--plugins",
            DOCTOR_PLUGINS,
            "--duration-secs",
            DOCTOR_HOLD_SECS,
        ],
        _ => vec!["--scenario", scenario],
    };
    if quick && scenario != "doctor-idle" {
        args.extend(["--duration-secs", QUICK_DURATION_SECS]);
    }
    let kpm_args: &[&str] = if scenario == "hang" { &HANG_LIVENESS } else { &[] };
    if scenario == "hang" {
        args.extend(["--liveness-period-secs", HANG_LIVENESS[1]]);
        args.extend(["--liveness-failures", HANG_LIVENESS[3]]);
    }
    let run = if scenario == "doctor-idle" {
        let doctor = ["--period", DOCTOR_PERIOD_SECS];
        harness::against_fresh_kpm_measuring_doctor(binaries, scenario, &doctor, &args)?
    } else {
        harness::against_fresh_kpm(binaries, scenario, kpm_args, &args)?
    };
    if !run.loadgen.status.success() {
        return Err(format!("kpm-loadgen failed ({})", run.loadgen.status).into());
    }
    let json = String::from_utf8(run.loadgen.stdout)?.trim().to_owned();
    let Some(fields) = json.strip_prefix('{').filter(|rest| rest.len() > 1) else {
        return Err(format!("kpm-loadgen printed no JSON object: {json:?}").into());
    };
    if !run.kpm_exit.success() {
        eprintln!("bench: kpm exited with {}; see {}", run.kpm_exit, run.log.display());
    }
    Ok(format!("{{\"kpm_exit\":{},{fields}", json_string(&run.kpm_exit.to_string())))
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a \"b\" \\ c\nd\u{1}"), r#""a \"b\" \\ c\nd\u0001""#);
    }
}
