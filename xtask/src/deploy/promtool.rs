//! The alerting rules checked by promtool, Prometheus' own checker:
//! `promtool check rules` (syntax, PromQL, templates) and `promtool test
//! rules` (the alerts fire on the series of the tests, and only there).
//!
//! promtool comes with Debian's `prometheus` package. When it is not on
//! `$PATH` and this runs as root on Debian (CI), the package is installed,
//! without the packages it recommends (node-exporter and its collectors):
//! its postinst would start the Prometheus service, so a `policy-rc.d`
//! that forbids every start stands while it installs (Debian's way to keep
//! packages from starting services, honoured by `invoke-rc.d` and
//! `deb-systemd-invoke`), unless the machine has one already. A Prometheus
//! that starts all the same is stopped and reported. apt is retried while
//! another apt holds its lock.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::Result;

/// The rule file and its tests, in `deploy/doctor`.
const RULES: &str = "alerts.yaml";
const RULE_TESTS: &str = "alerts.test.yaml";

/// Debian's programs and the package that carries promtool.
const APT_GET: &str = "/usr/bin/apt-get";
const PROMETHEUS_PACKAGE: &str = "prometheus";
/// Where the package installs promtool.
const DEBIAN_PROMTOOL: &str = "/usr/bin/promtool";
/// The script `invoke-rc.d` asks before it starts a service; exit 101:
/// "action forbidden by policy".
const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";
const FORBID_ALL_STARTS: &str =
    "#!/bin/sh\n# cargo xtask deploy: no service starts while it installs promtool.\nexit 101\n";
/// apt's own wait for another apt's lock, then tries this often, this far apart.
const APT_LOCK_TIMEOUT_SECS: u32 = 120;
const APT_ATTEMPTS: u32 = 5;
const APT_RETRY_DELAY: Duration = Duration::from_secs(15);
/// A Debian system's `$PATH`, for apt and dpkg's scripts whatever ours is.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Checks and tests the rules in `dir`.
pub(super) fn check_alerts(dir: &Path) -> Result {
    let promtool = match super::find("promtool") {
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
    let as_root = fs::metadata("/proc/self").is_ok_and(|proc_self| proc_self.uid() == 0);
    if !as_root || !Path::new(APT_GET).is_file() {
        return Err(format!(
            "promtool not found: install it (on Debian: apt-get install --no-install-recommends \
             {PROMETHEUS_PACKAGE}); run as root on Debian, this step installs it"
        )
        .into());
    }
    println!(
        "deploy: promtool not found: installing Debian's {PROMETHEUS_PACKAGE} package, which carries it, \
         without its recommended packages, its service kept from starting"
    );
    let started = Instant::now();
    let running_before = prometheus_processes();
    {
        let _no_starts = NoServiceStarts::in_place(Path::new(POLICY_RC_D))?;
        apt(&["update"])?;
        apt(&["install", "-y", "--no-install-recommends", PROMETHEUS_PACKAGE])?;
    }
    let started_by_install: Vec<u32> =
        prometheus_processes().difference(&running_before).copied().collect();
    for pid in &started_by_install {
        // Only processes that were not there before the install.
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    if !started_by_install.is_empty() {
        return Err(format!(
            "installing {PROMETHEUS_PACKAGE} started Prometheus (pids {started_by_install:?}, now stopped) \
             despite {POLICY_RC_D}"
        )
        .into());
    }
    println!("deploy: {PROMETHEUS_PACKAGE} installed in {:.0?}", started.elapsed());
    super::find("promtool")
        .or_else(|| Path::new(DEBIAN_PROMTOOL).is_file().then(|| PathBuf::from(DEBIAN_PROMTOOL)))
        .ok_or_else(|| {
            format!("{PROMETHEUS_PACKAGE} installed, but no promtool at {DEBIAN_PROMTOOL}").into()
        })
}

/// `apt-get ARGS`, non-interactive; tried again while it fails, as it does
/// when another apt holds the lock past apt's own wait.
fn apt(args: &[&str]) -> Result {
    let lock_timeout = format!("DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_SECS}");
    let mut attempt = 1;
    loop {
        println!("$ apt-get -o {lock_timeout} {}", args.join(" "));
        let status = Command::new(APT_GET)
            .args(["-o", &lock_timeout])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .env("PATH", SYSTEM_PATH)
            .status()
            .map_err(|err| format!("cannot start {APT_GET}: {err}"))?;
        if status.success() {
            return Ok(());
        }
        if attempt == APT_ATTEMPTS {
            let command = args.join(" ");
            return Err(format!("`apt-get {command}` failed {attempt} times ({status})").into());
        }
        println!(
            "deploy: apt-get {} failed ({status}); again in {APT_RETRY_DELAY:?}",
            args.join(" ")
        );
        std::thread::sleep(APT_RETRY_DELAY);
        attempt += 1;
    }
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

/// A `policy-rc.d` that forbids every service start, for as long as it
/// lives; none written, and none removed, where the machine has one.
struct NoServiceStarts {
    /// The script it wrote, removed on drop.
    written: Option<PathBuf>,
}

impl NoServiceStarts {
    fn in_place(path: &Path) -> Result<Self> {
        let mut file =
            match fs::OpenOptions::new().write(true).create_new(true).mode(0o755).open(path) {
                Ok(file) => file,
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                    println!("deploy: {} is there already; left as it is", path.display());
                    return Ok(Self { written: None });
                }
                Err(err) => return Err(format!("cannot write {}: {err}", path.display()).into()),
            };
        // Removed on drop from here on, also when the write fails.
        let guard = Self { written: Some(path.to_path_buf()) };
        file.write_all(FORBID_ALL_STARTS.as_bytes())?;
        println!("deploy: wrote {} (exit 101: no service starts) for the install", path.display());
        Ok(guard)
    }
}

impl Drop for NoServiceStarts {
    fn drop(&mut self) {
        if let Some(path) = &self.written
            && let Err(err) = fs::remove_file(path)
        {
            eprintln!("deploy: cannot remove {}, which it wrote: {err}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_forbids_starts_while_it_lives_and_a_policy_there_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy-rc.d");
        {
            let _no_starts = NoServiceStarts::in_place(&path).unwrap();
            assert_eq!(fs::metadata(&path).unwrap().mode() & 0o111, 0o111);
            // Through sh: exec'ing a file just written can fail with ETXTBSY
            // while another test's fork still holds the writer's descriptor.
            let status =
                Command::new("sh").arg(&path).args(["prometheus", "start"]).status().unwrap();
            assert_eq!(status.code(), Some(101));
        }
        assert!(!path.exists());
        fs::write(&path, "#!/bin/sh\nexit 0\n").unwrap();
        drop(NoServiceStarts::in_place(&path).unwrap());
        assert_eq!(fs::read_to_string(&path).unwrap(), "#!/bin/sh\nexit 0\n");
    }
}
