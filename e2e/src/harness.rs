//! What `bench` and `soak` share: the release build of `kpm` and
//! `kpm-loadgen`, and one load-generator run against a fresh `kpm run`.
//!
//! kpm runs on a new root `/tmp/kpm-bench-XXXX` (short, so that socket paths
//! stay far below `sun_path`'s 108 bytes) with `RUST_LOG=warn`, its log in
//! `target/bench/kpm-<name>.log`. Both processes get at least 8192 open
//! files (raised in the shell that execs them, up to the hard limit): 1000
//! plugins are 1000 listening sockets plus their connections.

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use crate::command::Result;

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

/// The release binaries and the output directory `target/bench`.
#[derive(Debug)]
pub(crate) struct Binaries {
    pub(crate) kpm: PathBuf,
    pub(crate) loadgen: PathBuf,
    pub(crate) out: PathBuf,
}

/// Builds `kpm` (crate `kpm-cli`) and `kpm-loadgen` (crate `kpm-bench`) in
/// release mode and creates `target/bench`.
pub(crate) fn build(root: &Path) -> Result<Binaries> {
    crate::command::cargo(root, &["build", "--release", "-p", "kpm-cli", "-p", "kpm-bench"], &[])?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), |dir| root.join(dir));
    let out = target.join("bench");
    fs::create_dir_all(&out).map_err(|err| format!("cannot create {}: {err}", out.display()))?;
    Ok(Binaries {
        kpm: target.join("release/kpm"),
        loadgen: target.join("release/kpm-loadgen"),
        out,
    })
}

/// A load-generator run and how kpm ended.
#[derive(Debug)]
pub(crate) struct Run {
    /// The load generator's exit status and stdout (its stderr was ours).
    pub(crate) loadgen: Output,
    pub(crate) kpm_exit: ExitStatus,
    pub(crate) log: PathBuf,
}

/// Starts `kpm run --root-dir /tmp/kpm-bench-XXXX <kpm_args>`, waits for its
/// status socket, runs `kpm-loadgen run --root <root> --kpm-pid <pid>
/// <loadgen_args>` against it, then stops kpm with SIGTERM.
pub(crate) fn against_fresh_kpm(
    binaries: &Binaries,
    name: &str,
    kpm_args: &[&str],
    loadgen_args: &[&str],
) -> Result<Run> {
    against_fresh_kpm_measuring(binaries, name, kpm_args, loadgen_args, None)
}

/// [`against_fresh_kpm`], with `kpm doctor --watch <doctor_args>` on the
/// same root beside it, which the load generator measures instead of kpm.
pub(crate) fn against_fresh_kpm_measuring_doctor(
    binaries: &Binaries,
    name: &str,
    doctor_args: &[&str],
    loadgen_args: &[&str],
) -> Result<Run> {
    against_fresh_kpm_measuring(binaries, name, &[], loadgen_args, Some(doctor_args))
}

fn against_fresh_kpm_measuring(
    binaries: &Binaries,
    name: &str,
    kpm_args: &[&str],
    loadgen_args: &[&str],
    doctor_args: Option<&[&str]>,
) -> Result<Run> {
    let dir = tempfile::Builder::new().prefix("kpm-bench-").tempdir_in("/tmp")?;
    let root = dir.path();
    let log = binaries.out.join(format!("kpm-{name}.log"));
    let log_file =
        fs::File::create(&log).map_err(|err| format!("cannot create {}: {err}", log.display()))?;
    let mut kpm = Kpm::start(&binaries.kpm, root, kpm_args, log_file)?;
    kpm.wait_ready(&root.join("kpm.sock"))?;
    let mut pid = kpm.pid().to_string();
    eprintln!("\n== {name}: kpm pid {pid} on {}", root.display());
    let _doctor = match doctor_args {
        Some(args) => {
            let doctor = Doctor::start(
                binaries,
                root,
                args,
                &binaries.out.join(format!("doctor-{name}.log")),
            )?;
            pid = doctor.child.id().to_string();
            eprintln!("{name}: kpm doctor --watch pid {pid} measured");
            Some(doctor)
        }
        None => None,
    };

    let output = with_fd_limit(&binaries.loadgen)
        .arg("run")
        .arg("--root")
        .arg(root)
        .args(["--kpm-pid", &pid])
        .args(loadgen_args)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|err| format!("cannot start {}: {err}", binaries.loadgen.display()))?;
    let kpm_exit = kpm.stop()?;
    Ok(Run { loadgen: output, kpm_exit, log })
}

/// `kpm doctor --watch --root-dir ROOT` (no other root, no API server), a
/// child process killed when dropped.
struct Doctor {
    child: Child,
}

impl Doctor {
    fn start(binaries: &Binaries, root: &Path, args: &[&str], log: &Path) -> Result<Self> {
        let log = fs::File::create(log)
            .map_err(|err| format!("cannot create {}: {err}", log.display()))?;
        let child = Command::new(&binaries.kpm)
            .args(["doctor", "--watch", "--root-dir"])
            .arg(root)
            .arg("--other-root")
            .arg(root.join("no-other-root"))
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|err| format!("cannot start {}: {err}", binaries.kpm.display()))?;
        Ok(Self { child })
    }
}

impl Drop for Doctor {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// A `kpm run` child process; killed if dropped while running.
pub(crate) struct Kpm {
    child: Child,
}

impl Kpm {
    pub(crate) fn start(bin: &Path, root: &Path, args: &[&str], log: fs::File) -> Result<Self> {
        let child = with_fd_limit(bin)
            .arg("run")
            .arg("--root-dir")
            .arg(root)
            .args(args)
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
    pub(crate) fn wait_ready(&mut self, socket: &Path) -> Result {
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

    /// SIGTERM, then waits for the exit (SIGKILL after the timeout). A kpm
    /// that died before returns how it died.
    pub(crate) fn stop(&mut self) -> Result<ExitStatus> {
        terminate(&mut self.child, "kpm", KPM_STOP_TIMEOUT)
    }
}

impl Drop for Kpm {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// SIGTERM, then waits for the exit (SIGKILL after `timeout`, an error). A
/// child that died before returns how it died.
pub(crate) fn terminate(child: &mut Child, name: &str, timeout: Duration) -> Result<ExitStatus> {
    if let Some(status) = child.try_wait()? {
        return Ok(status);
    }
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(child);
    Err(format!("{name} did not exit within {timeout:?} of SIGTERM").into())
}

/// Kills `child` if it still runs, and reaps it.
pub(crate) fn kill(child: &mut Child) {
    if matches!(child.try_wait(), Ok(None)) {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `program`, started through a shell that raises the open-files limit.
fn with_fd_limit(program: &Path) -> Command {
    let mut command = Command::new("sh");
    command.arg("-c").arg(FD_LIMIT_SCRIPT).arg("kpm-bench").arg(program);
    command
}

/// Runs `command` and returns its stdout, trimmed; its stderr goes to ours.
pub(crate) fn stdout_of(command: &mut Command) -> Result<String> {
    let output = command.stderr(Stdio::inherit()).output()?;
    if !output.status.success() {
        return Err(format!("{command:?} failed ({})", output.status).into());
    }
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}

/// Prints what each scenario of a suite (`interop`, `kube-e2e`) came to,
/// `passed`, `skipped: …` or `FAILED: …`, and fails if one failed.
pub(crate) fn report_outcomes(
    suite: &str,
    against: &Path,
    outcomes: &[(impl AsRef<str>, String)],
    logs: &Path,
) -> Result {
    println!("\n{suite} against {}:", against.display());
    let width = outcomes.iter().map(|(name, _)| name.as_ref().len()).max().unwrap_or(0);
    for (name, outcome) in outcomes {
        println!("  {:<width$}  {outcome}", name.as_ref());
    }
    println!("logs: {}", logs.display());
    let failed = outcomes.iter().filter(|(_, outcome)| outcome.starts_with("FAILED")).count();
    if failed > 0 {
        return Err(format!("{failed} {suite} scenario(s) failed").into());
    }
    Ok(())
}
