//! What `interop` and `kube-e2e` share: the build of `kpm` and the example
//! plugin (debug, or release for timed scenarios), `kpm run` on a scenario's root, peer processes with their
//! output in files, and polling with a deadline.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::command::Result;
use crate::harness::{self, Kpm};

/// Which cargo profile the scenario's binaries are built with: debug for
/// checks, release where a scenario's times are the point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Profile {
    Debug,
    Release,
}

impl Profile {
    /// The profile's folder under the target directory.
    fn dir(self) -> &'static str {
        match self {
            Self::Debug => "debug",
            Self::Release => "release",
        }
    }
}

/// The binaries a scenario runs, and its output directory.
pub(crate) struct Binaries {
    pub(crate) kpm: PathBuf,
    pub(crate) example_plugin: PathBuf,
    /// `target/<suite>`, for the logs.
    pub(crate) out: PathBuf,
}

impl Binaries {
    /// The binaries' paths in the target directory; creates `target/<suite>`.
    pub(crate) fn locate(root: &Path, suite: &str, profile: Profile) -> Result<Self> {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| root.join("target"), |dir| root.join(dir));
        let out = target.join(suite);
        fs::create_dir_all(&out)?;
        Ok(Self {
            kpm: target.join(profile.dir()).join("kpm"),
            example_plugin: target.join(profile.dir()).join("examples/example_plugin"),
            out,
        })
    }
}

/// The cargo arguments that select the registrar's example plugin, with
/// its stub services.
pub(crate) const EXAMPLE_PLUGIN: &[&str] =
    &["-p", "kpm-registrar", "--features", "kpm-registrar/stub", "--example", "example_plugin"];

/// Builds `kpm` and the registrar's example plugin.
pub(crate) fn build(root: &Path, profile: Profile) -> Result {
    // Both targets named: a lone `--example` would leave the `kpm` binary out.
    let mut args = vec!["build", "-p", "kpm-cli", "--bin", "kpm"];
    args.extend(EXAMPLE_PLUGIN);
    if profile == Profile::Release {
        args.push("--release");
    }
    crate::command::cargo(root, &args, &[])
}

/// The value of each series with a whole value kpm serves on `/metrics` at
/// `addr` (counters under their `_total` name), labels left in the name.
pub(crate) fn metrics(addr: &str) -> Result<std::collections::BTreeMap<String, u64>> {
    let text = ureq::get(&format!("http://{addr}/metrics")).call()?.body_mut().read_to_string()?;
    let samples = kpm_test_support::prometheus::parse(&text)?;
    Ok(samples
        .into_iter()
        .filter_map(|sample| Some((sample.series.to_owned(), sample.value.parse().ok()?)))
        .collect())
}

/// `kpm run` on a scenario's root.
pub(crate) struct RunningKpm {
    kpm: Kpm,
    bin: PathBuf,
    pub(crate) root: PathBuf,
}

impl RunningKpm {
    /// Starts `kpm run --root-dir root ARGS`, its log in `log`, and waits
    /// until it serves its status socket.
    pub(crate) fn start(bin: &Path, root: &Path, args: &[&str], log: &Path) -> Result<Self> {
        let mut kpm = Kpm::start(bin, root, args, fs::File::create(log)?)?;
        kpm.wait_ready(&root.join("kpm.sock"))
            .map_err(|err| format!("{err}, see {}", log.display()))?;
        Ok(Self { kpm, bin: bin.to_path_buf(), root: root.to_path_buf() })
    }

    /// `kpm list -o json`, as a user would run it.
    pub(crate) fn list(&self) -> Result<Value> {
        let output = Command::new(&self.bin)
            .args(["list", "-o", "json", "--root-dir"])
            .arg(&self.root)
            .stderr(Stdio::inherit())
            .output()?;
        if !output.status.success() {
            return Err(format!("kpm list failed ({})", output.status).into());
        }
        Ok(serde_json::from_slice(&output.stdout)?)
    }

    /// SIGTERM; fails unless kpm exits cleanly.
    pub(crate) fn stop(mut self) -> Result {
        let status = self.kpm.stop()?;
        if status.success() { Ok(()) } else { Err(format!("kpm exited with {status}").into()) }
    }
}

/// A program of a scenario, its stdout and stderr in files (created afresh,
/// so that no line of an earlier run is read); killed if dropped while
/// running.
pub(crate) struct Process {
    pub(crate) name: String,
    pub(crate) child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Process {
    /// Starts `bin`, naming it `name` in messages.
    pub(crate) fn spawn(
        name: &str,
        bin: &Path,
        args: &[&str],
        stdout: &Path,
        stderr: &Path,
    ) -> Result<Self> {
        Self::spawn_command(name, Command::new(bin).args(args), stdout, stderr)
    }

    /// Like [`spawn`](Self::spawn), for a command given its arguments and
    /// environment already.
    pub(crate) fn spawn_command(
        name: &str,
        command: &mut Command,
        stdout: &Path,
        stderr: &Path,
    ) -> Result<Self> {
        let child = command
            .stdin(Stdio::null())
            .stdout(fs::File::create(stdout)?)
            .stderr(fs::File::create(stderr)?)
            .spawn()
            .map_err(|err| format!("cannot start {}: {err}", command.get_program().display()))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            stdout: stdout.to_path_buf(),
            stderr: stderr.to_path_buf(),
        })
    }

    /// The lines of its stdout so far.
    pub(crate) fn lines(&self) -> Result<Vec<String>> {
        Ok(fs::read_to_string(&self.stdout)?.lines().map(str::to_owned).collect())
    }

    /// The lines of its stderr so far (where Go programs log).
    pub(crate) fn error_lines(&self) -> Result<Vec<String>> {
        Ok(fs::read_to_string(&self.stderr)?.lines().map(str::to_owned).collect())
    }

    /// Waits, at most `timeout`, for a line of its stdout that `matches`.
    pub(crate) fn wait_for_line(
        &self,
        what: &str,
        timeout: Duration,
        matches: impl Fn(&str) -> bool,
    ) -> Result {
        wait_until(&format!("{}: {what}", self.name), timeout, || {
            Ok(self.lines()?.iter().any(|line| matches(line)))
        })
    }

    /// Sends `signal` (a name for kill(1), such as `USR1`).
    pub(crate) fn signal(&self, signal: &str) -> Result {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("kill -{signal} {}: {status}", self.name).into())
        }
    }

    /// SIGTERM, and waits at most `timeout` for it to exit.
    pub(crate) fn stop(&mut self, timeout: Duration) -> Result {
        harness::terminate(&mut self.child, &self.name, timeout).map(drop)
    }

    /// SIGKILL, and reaps it.
    pub(crate) fn kill(&mut self) {
        harness::kill(&mut self.child);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        harness::kill(&mut self.child);
    }
}

/// Polls `done` every 50 ms until it holds, for at most `timeout`.
pub(crate) fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool>,
) -> Result {
    wait_for(what, timeout, || Ok(done()?.then_some(()))).map(drop)
}

/// Polls `found` every 50 ms until it finds something, for at most `timeout`.
pub(crate) fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut found: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = found()? {
            return Ok(value);
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {timeout:?}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The element of a JSON array whose `key` is `value`.
pub(crate) fn find<'a>(array: &'a Value, key: &str, value: &str) -> Option<&'a Value> {
    array.as_array()?.iter().find(|element| element[key] == value)
}

/// Runs `kpm doctor ARGS` twice: as a table, shown on stderr for the log,
/// and with `-o json`, whose report is returned; both must exit with
/// `exit` (0 all ok, 1 something failing, 2 it could not judge).
pub(crate) fn doctor(bin: &Path, args: &[&str], exit: i32) -> Result<Value> {
    let table = Command::new(bin).arg("doctor").args(args).stderr(Stdio::inherit()).output()?;
    eprintln!("$ kpm doctor {}\n{}", args.join(" "), String::from_utf8_lossy(&table.stdout));
    let json = Command::new(bin)
        .arg("doctor")
        .args(args)
        .args(["-o", "json"])
        .stderr(Stdio::inherit())
        .output()?;
    for (output, run) in [(&table, "kpm doctor"), (&json, "kpm doctor -o json")] {
        if output.status.code() != Some(exit) {
            return Err(format!("{run} exited with {}, expected {exit}", output.status).into());
        }
    }
    Ok(serde_json::from_slice(&json.stdout)?)
}

/// The verdict of the doctor's row for `path`; an error names what the
/// report has instead.
pub(crate) fn verdict(report: &Value, path: &Path) -> Result<String> {
    let path = path.display().to_string();
    let row = find(&report["plugins"], "path", &path)
        .ok_or_else(|| format!("kpm doctor has no row for {path}: {report}"))?;
    Ok(row["verdict"].as_str().unwrap_or_default().to_owned())
}

/// Fails unless the doctor's row for `path` has verdict `expected`.
pub(crate) fn expect_verdict(report: &Value, path: &Path, expected: &str) -> Result {
    let verdict = verdict(report, path)?;
    if verdict == expected {
        Ok(())
    } else {
        Err(format!(
            "kpm doctor says {verdict} of {}, expected {expected}: {report}",
            path.display()
        )
        .into())
    }
}
