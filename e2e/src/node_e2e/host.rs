//! The node's own corner of the host: a private mount and network
//! namespace, its state folder, and a cgroup of its own.
//!
//! `cargo xtask node-e2e` re-executes itself under `unshare --mount --net
//! --propagation private` ([`reexec_in_namespaces`]): everything the node
//! mounts (containerd's overlays, the pods' volumes, `/run`, `/var/lib`), its
//! bridge, routes and iptables rules exist only there and vanish with the
//! last process in it. What a namespace cannot hold (the cgroups the kubelet
//! and runc create, and processes that outlive the run) sits under one
//! cgroup, [`CGROUP_ROOT`], which the outer process empties and removes after
//! the inner one exits ([`clean_up_cgroups`]). So the host is left as it was
//! found, whatever the scenarios did.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::command::Result;
use crate::scenario::wait_until;

/// Set in the environment of the re-executed xtask: it runs inside the
/// namespaces.
const INSIDE: &str = "KPM_NODE_E2E_INSIDE";
/// The kubelet root of the node inside the namespaces.
const KUBELET_ROOT: &str = "KPM_NODE_E2E_KUBELET_ROOT";
/// The environment variable that gives the node inside the namespaces the
/// kubelet's folder of `--kubelet-dir`, when one was given.
const KUBELET_DIR: &str = "KPM_NODE_E2E_KUBELET_DIR";

/// The cgroup of every process of the node, in each v1 controller (the
/// kubelet's `cgroupRoot`): runc puts the pods' containers under it, and
/// the inner xtask moves itself there so that etcd, containerd and its shims
/// are found too.
pub(super) const CGROUP_ROOT: &str = "kpm-node-e2e";

/// The node's address on its bridge: the kubelet's node IP, the pods'
/// gateway, where kube-apiserver serves.
pub(super) const NODE_IP: &str = "10.88.0.1";
/// The pods' subnet on the bridge `cni0`.
pub(super) const POD_SUBNET: &str = "10.88.0.0/16";
/// The `kubernetes` Service's cluster IP, the first of the service range. No
/// kube-proxy runs: the address is the node's own, and kube-apiserver
/// serves on it at port 443, so in-cluster clients reach it as in a cluster.
pub(super) const SERVICE_IP: &str = "10.0.0.1";
pub(super) const SERVICE_RANGE: &str = "10.0.0.0/24";

/// The sysctls the kubelet checks at start and tries to set: bind-mounted
/// from files of the state folder, so the host's stay untouched.
const SYSCTLS: &[(&str, &str)] = &[
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// The cgroup v1 controllers the kubelet's `cgroupRoot` must exist in.
const CONTROLLERS: &[&str] =
    &["blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids", "systemd"];

/// Whether this process is the re-executed one, inside the namespaces.
pub(super) fn inside() -> bool {
    std::env::var_os(INSIDE).is_some()
}

/// Runs this xtask again with the same arguments in a private mount and
/// network namespace for a node on `kubelet_root`, and waits for it; `read`
/// then reads what it left in the state folder. Then the node's cgroups and
/// state folder are emptied and removed, whatever the run's outcome.
pub(super) fn reexec_in_namespaces<T>(
    state: &Path,
    kubelet_root: &str,
    kubelet_dir: Option<&Path>,
    read: impl FnOnce() -> Result<T>,
) -> Result<(std::process::ExitStatus, T)> {
    let exe = std::env::current_exe()?;
    let mut unshare = Command::new("unshare");
    unshare
        .args(["--mount", "--net", "--propagation", "private", "--"])
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(INSIDE, state)
        .env(KUBELET_ROOT, kubelet_root);
    if let Some(dir) = kubelet_dir {
        unshare.env(KUBELET_DIR, dir);
    }
    let status = unshare.status().map_err(|err| format!("cannot run unshare (util-linux): {err}"));
    let read = read();
    let cleaned = clean_up_cgroups();
    // The mounts went with the namespace: what is left is plain files.
    let removed = fs::remove_dir_all(state)
        .map_err(|err| format!("cannot remove {}: {err}", state.display()));
    let (status, read) = (status?, read?);
    cleaned?;
    removed?;
    Ok((status, read))
}

/// The kubelet root the node inside the namespaces runs on.
pub(super) fn kubelet_root() -> Result<PathBuf> {
    std::env::var_os(KUBELET_ROOT).map(PathBuf::from).ok_or_else(|| "no kubelet root given".into())
}

/// The kubelet's folder the node inside the namespaces runs, if one was
/// given (`--kubelet-dir`); `None` outside them.
pub(super) fn kubelet_dir() -> Option<PathBuf> {
    std::env::var_os(KUBELET_DIR).map(PathBuf::from)
}

/// The state folder the outer process made, as the inner one is told.
pub(super) fn state_dir() -> Result<PathBuf> {
    std::env::var_os(INSIDE).map(PathBuf::from).ok_or_else(|| "not inside the namespaces".into())
}

/// Inside the namespaces: the mounts, sysctls, network and cgroup a node
/// needs (`../shared/real-node.md` has why each one).
pub(super) fn prepare(state: &Path) -> Result {
    // Propagation inside the namespace only: containerd refuses the pods'
    // HostToContainer mounts on a private `/`, and the namespace was made
    // private from the host first, so nothing propagates out.
    run("mount", &["--make-rshared", "/"])?;
    for (dir, target) in [("run", "/run"), ("var-lib", "/var/lib"), ("var-log", "/var/log")] {
        let source = state.join(dir);
        fs::create_dir_all(&source)?;
        bind(&source, Path::new(target))?;
    }
    let sysctls = state.join("sysctl");
    fs::create_dir_all(&sysctls)?;
    for (key, value) in SYSCTLS {
        let file = sysctls.join(key.replace('/', "."));
        fs::write(&file, format!("{value}\n"))?;
        bind(&file, &Path::new("/proc/sys").join(key))?;
    }

    run("ip", &["link", "set", "lo", "up"])?;
    run("ip", &["addr", "add", &format!("{SERVICE_IP}/32"), "dev", "lo"])?;
    // The bridge the CNI `bridge` plugin attaches pods to, made up front so
    // the kubelet has its node IP from the start.
    run("ip", &["link", "add", "cni0", "type", "bridge"])?;
    run("ip", &["addr", "add", &format!("{NODE_IP}/16"), "dev", "cni0"])?;
    run("ip", &["link", "set", "cni0", "up"])?;

    for controller in CONTROLLERS {
        let dir = cgroup(controller);
        fs::create_dir_all(&dir)
            .map_err(|err| format!("cannot create cgroup {}: {err}", dir.display()))?;
        if *controller == "cpuset" {
            // A new v1 cpuset has no CPUs and no memory nodes: a process
            // cannot join it until they are copied from the parent.
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let parent = fs::read_to_string(Path::new("/sys/fs/cgroup/cpuset").join(file))?;
                fs::write(dir.join(file), parent.trim())?;
            }
        }
    }
    // This process, and so everything it starts, is found in the pids
    // controller's tree at the end.
    let system = cgroup("pids").join("system");
    fs::create_dir_all(&system)?;
    fs::write(system.join("cgroup.procs"), std::process::id().to_string())?;
    Ok(())
}

/// The node's cgroup in `controller`.
fn cgroup(controller: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup").join(controller).join(CGROUP_ROOT)
}

/// Kills every process left in the node's cgroups (shims and containers
/// outlive containerd and the kubelet) and removes the cgroups, deepest
/// first.
pub(super) fn clean_up_cgroups() -> Result {
    let pids = cgroup("pids");
    if pids.is_dir() {
        wait_until("the node's processes gone", Duration::from_secs(20), || {
            let mut left = 0;
            for procs in files_named(&pids, "cgroup.procs")? {
                for pid in fs::read_to_string(&procs).unwrap_or_default().lines() {
                    left += 1;
                    let _ = Command::new("kill").args(["-KILL", pid]).status();
                }
            }
            Ok(left == 0)
        })?;
    }
    remove_cgroups(|_, _| true)
}

/// Removes the node's cgroups, in each controller, that `remove` names
/// (given the controller's node cgroup and one under it), deepest first:
/// a cgroup with children cannot be removed.
fn remove_cgroups(remove: impl Fn(&Path, &Path) -> bool) -> Result {
    let mut problems = Vec::new();
    for controller in CONTROLLERS {
        let root = cgroup(controller);
        let mut dirs = dirs_under(&root)?;
        dirs.retain(|dir| remove(&root, dir));
        dirs.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
        for dir in dirs {
            if let Err(err) = fs::remove_dir(&dir) {
                problems.push(format!("cannot remove cgroup {}: {err}", dir.display()));
            }
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ").into()) }
}

/// Removes the cgroups the kubelet and runc made (the pods'), which a boot
/// starts without: left, the kubelet's cAdvisor takes them for containers
/// and asks containerd about each at its start, seconds each. The node's
/// own cgroup and `system`, where this xtask runs, stay.
pub(super) fn forget_pod_cgroups() -> Result {
    remove_cgroups(|root, dir| dir != root && !dir.starts_with(root.join("system")))
}

/// The processes of the node's cgroups whose cgroup `keep` says is theirs:
/// each cgroup's `cgroup.procs` in the pids controller.
fn node_processes(keep: impl Fn(&Path) -> bool) -> Result<Vec<String>> {
    let mut pids = Vec::new();
    for procs in files_named(&cgroup("pids"), "cgroup.procs")? {
        if keep(procs.parent().unwrap_or(&procs)) {
            pids.extend(fs::read_to_string(&procs).unwrap_or_default().lines().map(str::to_owned));
        }
    }
    Ok(pids)
}

/// Sends `signal` to each of `pids` (gone ones are no error).
fn signal_each(pids: &[String], signal: &str) {
    for pid in pids {
        let _ = Command::new("kill").args([&format!("-{signal}"), pid]).status();
    }
}

/// Ends what a shutdown ends last: every process of the pods (all of the
/// node's cgroups but `system`, where this xtask, the control plane,
/// containerd and its shims run) gets SIGTERM, and SIGKILL if it has not
/// exited after `grace`; then containerd's shims, left with no container,
/// are killed.
pub(super) fn end_pods(grace: Duration) -> Result {
    let system = cgroup("pids").join("system");
    let pods = || node_processes(|dir| !dir.starts_with(&system));
    signal_each(&pods()?, "TERM");
    if wait_until("the pods' processes gone on SIGTERM", grace, || Ok(pods()?.is_empty())).is_err()
    {
        signal_each(&pods()?, "KILL");
        wait_until("the pods' processes gone on SIGKILL", Duration::from_secs(20), || {
            Ok(pods()?.is_empty())
        })?;
    }
    let shims = || -> Result<Vec<String>> {
        Ok(node_processes(|dir| dir.starts_with(&system))?
            .into_iter()
            .filter(|pid| {
                fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.starts_with("containerd-shim"))
            })
            .collect())
    };
    signal_each(&shims()?, "KILL");
    wait_until("containerd's shims gone", Duration::from_secs(20), || Ok(shims()?.is_empty()))
}

/// Undoes every mount under `dirs` (not the dirs themselves), deepest
/// first, as a boot starts without them: the pods' volumes, containers'
/// root filesystems, network namespaces.
pub(super) fn forget_mounts(dirs: &[&Path]) -> Result {
    let table = fs::read_to_string("/proc/self/mountinfo")?;
    let mut points: Vec<PathBuf> = table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(unescape_mount_point(point)))
        .filter(|point| dirs.iter().any(|dir| point.starts_with(dir) && point != dir))
        .collect();
    points.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    points.dedup();
    for point in points {
        // Lazily: what is left holds nothing, and an overmounted point is
        // gone with the mount above it.
        let _ = Command::new("umount").arg("-l").arg(&point).status();
    }
    Ok(())
}

/// A mount point as /proc/self/mountinfo writes it, octal escapes (`\040`
/// for a space) undone.
fn unescape_mount_point(point: &str) -> String {
    let mut text = String::new();
    let mut rest = point;
    while let Some(at) = rest.find('\\') {
        text.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 4).and_then(|digits| u8::from_str_radix(digits, 8).ok());
        if let Some(byte) = code {
            text.push(char::from(byte));
            rest = &rest[at + 4..];
        } else {
            text.push('\\');
            rest = &rest[at + 1..];
        }
    }
    text.push_str(rest);
    text
}

/// Removes everything in `dir`, keeping `dir`: a tmpfs after a boot.
pub(super) fn empty_dir(dir: &Path) -> Result {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let removed = if path.is_dir() && !path.is_symlink() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        removed.map_err(|err| format!("emptying {}: {}: {err}", dir.display(), path.display()))?;
    }
    Ok(())
}

/// `dir` and every directory under it; nothing if it does not exist.
fn dirs_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for entry in entries {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                pending.push(entry.path());
            }
        }
        found.push(dir);
    }
    Ok(found)
}

/// The files named `name` in `dir` and its subdirectories.
fn files_named(dir: &Path, name: &str) -> Result<Vec<PathBuf>> {
    Ok(dirs_under(dir)?.into_iter().map(|dir| dir.join(name)).filter(|f| f.is_file()).collect())
}

fn bind(source: &Path, target: &Path) -> Result {
    let (source, target) = (source.display().to_string(), target.display().to_string());
    run("mount", &["--bind", &source, &target])
}

/// Runs a host command, failing with its name and stderr.
pub(super) fn run(program: &str, args: &[&str]) -> Result {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|err| format!("cannot run {program}: {err}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_read_with_their_escapes_undone() {
        assert_eq!(unescape_mount_point("/run/a\\040b"), "/run/a b");
        assert_eq!(unescape_mount_point("/var/lib/kubelet/pods"), "/var/lib/kubelet/pods");
        assert_eq!(unescape_mount_point("/x\\011y\\134z"), "/x\ty\\z");
        assert_eq!(unescape_mount_point("/odd\\"), "/odd\\");
    }
}
