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
//! `--only` runs one scenario. Both processes get at least 8192 open files
//! (raised in the shell that execs them, up to the hard limit): 1000 plugins
//! are 1000 listening sockets plus their connections.

use std::fmt::Write as _;
use std::fs;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::Result;

/// The scenarios, in the order they run.
const SCENARIOS: [&str; 6] =
    ["staggered", "burst", "burst-in-place", "steady", "churn", "deregister"];

/// How long `steady` holds and `churn` churns with `--quick`, in seconds.
const QUICK_DURATION_SECS: &str = "5";

/// How long kpm may take to serve its status socket, and to exit on SIGTERM.
const KPM_START_TIMEOUT: Duration = Duration::from_secs(10);
const KPM_STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// Raises the soft limit of open files to 8192 (or the hard limit, if lower),
/// then execs the command: the process keeps the shell's pid.
const FD_LIMIT_SCRIPT: &str = r#"n=$(ulimit -n)
if [ "$n" != unlimited ] && [ "$n" -lt 8192 ]; then
  ulimit -n 8192 2>/dev/null || ulimit -n "$(ulimit -Hn)"
fi
exec "$@""#;

pub(crate) fn run(root: &Path, options: &[&str]) -> Result {
    let mut quick = false;
    let mut only = None;
    let usage = || format!("usage: cargo xtask bench [--quick] [--only {}]", SCENARIOS.join("|"));
    let mut options = options.iter().copied();
    while let Some(option) = options.next() {
        match (option, option == "--only") {
            ("--quick", _) => quick = true,
            (_, true) => match options.next() {
                Some(scenario) if SCENARIOS.contains(&scenario) => only = Some(scenario),
                _ => return Err(usage().into()),
            },
            _ => return Err(usage().into()),
        }
    }

    crate::cargo(root, &["build", "--release", "-p", "kpm-cli", "-p", "kpm-bench"], &[])?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), |dir| root.join(dir));
    let kpm = target.join("release/kpm");
    let loadgen = target.join("release/kpm-loadgen");
    let out = target.join("bench");
    fs::create_dir_all(&out).map_err(|err| format!("cannot create {}: {err}", out.display()))?;

    let machine = stdout_of(Command::new(&loadgen).arg("machine"))?;
    let mut parts = Vec::new();
    let mut failed = Vec::new();
    for scenario in SCENARIOS.into_iter().filter(|s| only.is_none_or(|only| only == *s)) {
        let fragment = match run_scenario(&kpm, &loadgen, &out, scenario, quick) {
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
    let file = out.join("results.json");
    fs::write(&file, format!("{results}\n"))
        .map_err(|err| format!("cannot write {}: {err}", file.display()))?;
    println!("{results}");
    println!();
    println!("{}", stdout_of(Command::new(&loadgen).arg("report").arg(&file))?);
    println!("\nresults: {}", file.display());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("scenario(s) failed: {}", failed.join(", ")).into())
    }
}

/// One scenario against a fresh kpm; returns the load generator's JSON.
fn run_scenario(
    kpm_bin: &Path,
    loadgen: &Path,
    out: &Path,
    scenario: &str,
    quick: bool,
) -> Result<String> {
    // Short, so that socket paths stay far below sun_path's 108 bytes.
    let dir = tempfile::Builder::new().prefix("kpm-bench-").tempdir_in("/tmp")?;
    let root = dir.path();
    let log_path = out.join(format!("kpm-{scenario}.log"));
    let log = fs::File::create(&log_path)
        .map_err(|err| format!("cannot create {}: {err}", log_path.display()))?;
    let mut kpm = Kpm::start(kpm_bin, root, log)?;
    kpm.wait_ready(&root.join("kpm.sock"))?;
    let pid = kpm.pid().to_string();
    eprintln!("\n== {scenario}: kpm pid {pid} on {}", root.display());

    let mut command = with_fd_limit(loadgen);
    command.arg("run").arg("--root").arg(root).args(["--scenario", scenario, "--kpm-pid", &pid]);
    if quick {
        command.args(["--duration-secs", QUICK_DURATION_SECS]);
    }
    let output = command
        .stderr(Stdio::inherit())
        .output()
        .map_err(|err| format!("cannot start {}: {err}", loadgen.display()))?;
    let kpm_exit = kpm.stop()?;
    if !output.status.success() {
        return Err(format!("kpm-loadgen failed ({})", output.status).into());
    }
    let json = String::from_utf8(output.stdout)?.trim().to_owned();
    let Some(fields) = json.strip_prefix('{').filter(|rest| rest.len() > 1) else {
        return Err(format!("kpm-loadgen printed no JSON object: {json:?}").into());
    };
    if !kpm_exit.success() {
        eprintln!("bench: kpm exited with {kpm_exit}; see {}", log_path.display());
    }
    Ok(format!("{{\"kpm_exit\":{},{fields}", json_string(&kpm_exit.to_string())))
}

/// A `kpm run` child process; killed if dropped while running.
struct Kpm {
    child: Child,
}

impl Kpm {
    fn start(bin: &Path, root: &Path, log: fs::File) -> Result<Self> {
        let child = with_fd_limit(bin)
            .arg("run")
            .arg("--root-dir")
            .arg(root)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|err| format!("cannot start {}: {err}", bin.display()))?;
        Ok(Self { child })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the status socket accepts connections.
    fn wait_ready(&mut self, socket: &Path) -> Result {
        let deadline = Instant::now() + KPM_START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(format!("kpm exited at start ({status})").into());
            }
            if UnixStream::connect(socket).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "kpm did not serve {} within {KPM_START_TIMEOUT:?}",
                    socket.display()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits for the exit (SIGKILL after the timeout).
    fn stop(&mut self) -> Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        Command::new("kill").args(["-TERM", &self.pid().to_string()]).status()?;
        let deadline = Instant::now() + KPM_STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.kill()?;
        self.child.wait()?;
        Err(format!("kpm did not exit within {KPM_STOP_TIMEOUT:?} of SIGTERM").into())
    }
}

impl Drop for Kpm {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `program`, started through a shell that raises the open-files limit.
fn with_fd_limit(program: &Path) -> Command {
    let mut command = Command::new("sh");
    command.arg("-c").arg(FD_LIMIT_SCRIPT).arg("kpm-bench").arg(program);
    command
}

/// Runs `command` and returns its stdout, trimmed; its stderr goes to ours.
fn stdout_of(command: &mut Command) -> Result<String> {
    let output = command.stderr(Stdio::inherit()).output()?;
    if !output.status.success() {
        return Err(format!("{command:?} failed ({})", output.status).into());
    }
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
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
