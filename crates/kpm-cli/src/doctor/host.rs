//! What the host's `/proc` says: the kubelets running and their roots, the
//! Unix sockets listening, and who a process is.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

/// The kubelet's root directory when it is given none.
pub(crate) const DEFAULT_ROOT: &str = kpm::api::DEFAULT_ROOT_DIR;

/// A running kubelet and the root directory its command line gives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct KubeletProcess {
    pub(crate) pid: u32,
    pub(crate) root_dir: PathBuf,
}

/// The processes whose program is named `kubelet`, with their
/// `--root-dir` (`--root-dir=DIR` or `--root-dir DIR`; the default without).
pub(crate) fn kubelets() -> Vec<KubeletProcess> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found: Vec<KubeletProcess> = entries
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let args = cmdline(pid)?;
            let program = Path::new(args.first()?).file_name()?;
            (program == "kubelet").then(|| KubeletProcess { pid, root_dir: root_dir_of(&args) })
        })
        .collect();
    found.sort_by_key(|kubelet| kubelet.pid);
    found
}

/// The `--root-dir` a kubelet's arguments give.
fn root_dir_of(args: &[String]) -> PathBuf {
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if let Some(dir) = arg.strip_prefix("--root-dir=") {
            return PathBuf::from(dir);
        }
        if arg == "--root-dir"
            && let Some(dir) = args.next()
        {
            return PathBuf::from(dir);
        }
    }
    PathBuf::from(DEFAULT_ROOT)
}

/// A process's arguments; `None` for a kernel thread or one that is gone.
fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw
        .split(|&byte| byte == 0)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    (!args.is_empty()).then_some(args)
}

/// The paths of the Unix sockets listening in this network namespace
/// (`/proc/net/unix`), deleted or not: the kernel keeps the name a socket
/// was bound to after its file is removed. `None` if it cannot be read.
pub(crate) fn listening_unix_paths() -> Option<BTreeSet<PathBuf>> {
    let table = std::fs::read_to_string("/proc/net/unix").ok()?;
    Some(table.lines().skip(1).filter_map(listening_path).collect())
}

/// `Num RefCount Protocol Flags Type St Inode Path`: a listening socket has
/// `__SO_ACCEPTCON` (0x10000) in its flags.
fn listening_path(line: &str) -> Option<PathBuf> {
    const ACCEPTING: u32 = 0x1_0000;
    let fields: Vec<&str> = line.split_whitespace().collect();
    let flags = u32::from_str_radix(fields.get(3)?, 16).ok()?;
    let path = fields.get(7)?;
    (flags & ACCEPTING != 0 && path.starts_with('/')).then(|| PathBuf::from(path))
}

/// Who a process is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct ProcessInfo {
    pub(crate) pid: u32,
    /// Its command line, arguments joined by spaces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) command: Option<String>,
    /// The container it runs in, from its cgroup path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) container_id: Option<String>,
    /// How long it has run, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) running_secs: Option<u64>,
}

/// What `/proc/<pid>` says of `pid`; fields it cannot read are `None`.
pub(crate) fn process(pid: u32) -> ProcessInfo {
    ProcessInfo {
        pid,
        command: cmdline(pid).map(|args| args.join(" ")),
        container_id: std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()
            .and_then(|cgroup| container_id(&cgroup)),
        running_secs: running_for(pid).map(|running| running.as_secs()),
    }
}

/// The container id in a cgroup file: the 64-hex-digit name containerd,
/// CRI-O and Docker give a container's cgroup
/// (`cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`,
/// or `<id>` under cgroupfs).
fn container_id(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        let last = line.rsplit('/').next()?;
        let name = last.strip_suffix(".scope").unwrap_or(last);
        let id = name.rsplit('-').next()?;
        (id.len() == 64 && id.bytes().all(|byte| byte.is_ascii_hexdigit())).then(|| id.to_owned())
    })
}

/// How long `pid` has run: the system's uptime less its start time
/// (`/proc/<pid>/stat` field 22, in clock ticks since boot).
fn running_for(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let started_ticks: u64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let uptime_secs: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    let ticks = rustix::param::clock_ticks_per_second().max(1);
    let started = Duration::from_millis(started_ticks.saturating_mul(1000) / ticks);
    Duration::try_from_secs_f64(uptime_secs).ok()?.checked_sub(started)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_dir_comes_from_either_flag_form_or_the_default() {
        let args = |list: &[&str]| list.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(
            root_dir_of(&args(&["kubelet", "--root-dir=/var/lib/k0s/kubelet"])),
            PathBuf::from("/var/lib/k0s/kubelet")
        );
        assert_eq!(
            root_dir_of(&args(&["kubelet", "--v=2", "--root-dir", "/r"])),
            PathBuf::from("/r")
        );
        assert_eq!(root_dir_of(&args(&["kubelet", "--config=/c"])), PathBuf::from(DEFAULT_ROOT));
    }

    #[test]
    fn a_container_id_is_read_from_each_runtimes_cgroup_name() {
        let id = "3f".repeat(32);
        for line in [
            format!("0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-{id}.scope"),
            format!("0::/system.slice/crio-{id}.scope"),
            format!("12:pids:/kubepods/besteffort/pod1234/{id}"),
        ] {
            assert_eq!(container_id(&line), Some(id.clone()), "{line}");
        }
        assert_eq!(container_id("0::/user.slice/session-2.scope"), None);
    }

    #[test]
    fn a_listening_socket_is_told_by_its_flags() {
        let listening = "0000000000000000: 00000002 00000000 00010000 0001 01 27717 /run/a.sock";
        let connected = "0000000000000000: 00000003 00000000 00000000 0001 03 27718 /run/a.sock";
        let abstract_ = "0000000000000000: 00000002 00000000 00010000 0001 01 27719 @abstract";
        assert_eq!(listening_path(listening), Some(PathBuf::from("/run/a.sock")));
        assert_eq!(listening_path(connected), None);
        assert_eq!(listening_path(abstract_), None);
    }

    #[test]
    fn this_process_is_described() {
        let me = process(std::process::id());
        assert!(me.command.is_some_and(|command| !command.is_empty()));
        assert!(me.running_secs.is_some());
    }
}
