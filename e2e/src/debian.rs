//! Debian's packages the project's own steps need, installed when missing:
//! promtool for `cargo xtask deploy` (in CI), containerd, runc, the CNI
//! plugins, gcc and Prometheus for `cargo xtask node-e2e`.
//!
//! Only as root on a Debian system, and saying what it installs. Without
//! the packages they recommend, and with no service started: their
//! postinsts would start Prometheus or containerd, so a `policy-rc.d` that
//! forbids every start stands while apt runs (Debian's way to keep packages
//! from starting services, honoured by `invoke-rc.d` and
//! `deb-systemd-invoke`), unless the machine has one already. apt is
//! retried while another apt holds its lock.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::command::Result;

const APT_GET: &str = "/usr/bin/apt-get";
/// The script `invoke-rc.d` asks before it starts a service; exit 101:
/// "action forbidden by policy".
const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";
const FORBID_ALL_STARTS: &str =
    "#!/bin/sh\n# cargo xtask: no service starts while it installs packages.\nexit 101\n";
/// apt's own wait for another apt's lock, then tries this often, this far apart.
const APT_LOCK_TIMEOUT_SECS: u32 = 120;
const APT_ATTEMPTS: u32 = 5;
const APT_RETRY_DELAY: Duration = Duration::from_secs(15);
/// A Debian system's `$PATH`, for apt and dpkg's scripts whatever ours is.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `name` on `$PATH`.
pub(crate) fn find(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// Installs Debian's `packages`, which `what` needs, with no service
/// started; fails saying what to install where it cannot (not root, not
/// Debian).
pub(crate) fn install(packages: &[&str], what: &str) -> Result {
    let as_root = fs::metadata("/proc/self").is_ok_and(|proc_self| proc_self.uid() == 0);
    let list = packages.join(" ");
    if !as_root || !Path::new(APT_GET).is_file() {
        return Err(format!(
            "{what} needs Debian's {list}: install them (apt-get install --no-install-recommends \
             {list}); run as root on Debian, this step installs them"
        )
        .into());
    }
    println!(
        "xtask: {what} needs Debian's {list}: installing them, without their recommended \
         packages, their services kept from starting"
    );
    let started = Instant::now();
    {
        let _no_starts = NoServiceStarts::in_place(Path::new(POLICY_RC_D))?;
        apt(&["update"])?;
        let mut args = vec!["install", "-y", "--no-install-recommends"];
        args.extend(packages);
        apt(&args)?;
    }
    println!("xtask: {list} installed in {:.0?}", started.elapsed());
    Ok(())
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
                    println!("xtask: {} is there already; left as it is", path.display());
                    return Ok(Self { written: None });
                }
                Err(err) => return Err(format!("cannot write {}: {err}", path.display()).into()),
            };
        // Removed on drop from here on, also when the write fails.
        let guard = Self { written: Some(path.to_path_buf()) };
        file.write_all(FORBID_ALL_STARTS.as_bytes())?;
        println!("xtask: wrote {} (exit 101: no service starts) for the install", path.display());
        Ok(guard)
    }
}

impl Drop for NoServiceStarts {
    fn drop(&mut self) {
        if let Some(path) = &self.written
            && let Err(err) = fs::remove_file(path)
        {
            eprintln!("xtask: cannot remove {}, which it wrote: {err}", path.display());
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
