//! What the host's `/proc` says: the kubelets running (`kubelets.rs` reads
//! each) and where each sees its files ([`View`]), the Unix sockets
//! listening, and who a process is; read under the prefix where this
//! process sees the host ([`Host`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use kpm::transport::HostRoot;
use serde::Serialize;

/// The kubelet's root directory when it is given none.
pub(crate) const DEFAULT_ROOT: &str = kpm::api::DEFAULT_ROOT_DIR;

/// Where this process sees the host's file system: `/` on the host itself,
/// `/host` in a pod that mounts it there (`kubectl debug node/NAME`; the
/// `--path.rootfs` of node-exporter). The host's `/proc` is read there.
///
/// The doctor keeps every path as the host's, the path the kubelet and the
/// plugins use and an operator can paste into a shell on the node; a path
/// is resolved under a [`View`]'s prefix only to be read ([`View::path`], a
/// [`Seen`], which cannot be shown). The host's own view is
/// [`Host::view`]; a running kubelet's is where its files are as it sees
/// them ([`KubeletProcess::view`](crate::KubeletProcess::view): `<host-root>/proc/PID/root` when it runs
/// in a mount namespace of its own). The referee is given a view's
/// [`HostRoot`] and the host's paths, so that its words name those paths
/// as they are: no text is ever mapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    view: View,
}

impl Default for Host {
    /// The host's own view: nothing moved.
    fn default() -> Self {
        Self { view: View { root: HostRoot::default() } }
    }
}

/// A file system as one process sees it, and where this process reads it:
/// a prefix (`/`, `/host`, `/host/proc/42/root`) under which a path of
/// that file system is read. Paths are named as that process names them
/// (the host's, for a kubelet), never with the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    root: HostRoot,
}

/// A path on the host and where this process reads it, made by
/// [`View::path`]. It is read through [`AsRef<Path>`] (`std::fs`, a dial,
/// inotify) and has no `Display` and no `Serialize`: a message or report
/// names [`on_host`](Self::on_host), so that none can carry the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    on_host: PathBuf,
    read_at: PathBuf,
}

impl Seen {
    /// The path on the host, the one to show.
    pub fn on_host(&self) -> &Path {
        &self.on_host
    }

    /// `name` below this path, on the host and where it is read.
    #[must_use]
    pub fn join(&self, name: impl AsRef<Path>) -> Self {
        let name = name.as_ref();
        Self { on_host: self.on_host.join(name), read_at: self.read_at.join(name) }
    }

    /// The path on the host of `entry`, a path read below this one (an
    /// entry of its listing); this path itself for one that is not below
    /// it, which a listing never gives.
    pub fn on_host_of(&self, entry: &Path) -> PathBuf {
        entry
            .strip_prefix(&self.read_at)
            .map_or_else(|_| self.on_host.clone(), |below| self.on_host.join(below))
    }
}

impl AsRef<Path> for Seen {
    /// Where the path is read: never to be shown.
    fn as_ref(&self) -> &Path {
        &self.read_at
    }
}

impl View {
    /// The file system whose `/` this process reads at `root`.
    pub(crate) fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: HostRoot::at(root) }
    }

    /// Where this view's `/` is in this process: the prefix paths are read
    /// under.
    pub fn root(&self) -> &Path {
        self.root.dir()
    }

    /// The prefix as the transport takes it: the referee's and every
    /// dialer's, which open the host's paths under it.
    pub(crate) fn host_root(&self) -> &HostRoot {
        &self.root
    }

    /// Whether paths are read under a prefix.
    fn is_prefixed(&self) -> bool {
        self.root != HostRoot::default()
    }

    /// `on_host`, a path of this view, and where this process reads it.
    pub fn path(&self, on_host: &Path) -> Seen {
        let read_at = self.root.reach(on_host).into_owned();
        Seen { on_host: on_host.to_path_buf(), read_at }
    }
}

impl Host {
    /// The host seen with its `/` at `root`.
    pub fn under(root: impl Into<PathBuf>) -> Self {
        Self { view: View::at(root) }
    }

    /// Where the host's `/` is in this process.
    pub fn root(&self) -> &Path {
        self.view.root()
    }

    /// The host's file system as this process sees it: where a process
    /// that shares the host's mount namespace has its files.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// Whether the host is seen under a prefix.
    pub(crate) fn is_prefixed(&self) -> bool {
        self.view.is_prefixed()
    }

    /// `on_host`, a path on the host, and where this process reads it.
    pub fn path(&self, on_host: &Path) -> Seen {
        self.view.path(on_host)
    }

    /// The host's `/proc/<rest>`.
    pub(crate) fn proc(&self, rest: &str) -> Seen {
        self.path(&Path::new("/proc").join(rest))
    }

    /// A process's arguments; `None` for a kernel thread or one that is gone.
    pub(crate) fn cmdline(&self, pid: u32) -> Option<Vec<String>> {
        let raw = std::fs::read(self.proc(&format!("{pid}/cmdline"))).ok()?;
        let args: Vec<String> = raw
            .split(|&byte| byte == 0)
            .filter(|arg| !arg.is_empty())
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect();
        (!args.is_empty()).then_some(args)
    }

    /// A process's environment; empty if it cannot be read.
    pub(crate) fn environ(&self, pid: u32) -> BTreeMap<String, String> {
        let raw = std::fs::read(self.proc(&format!("{pid}/environ"))).unwrap_or_default();
        raw.split(|&byte| byte == 0)
            .filter_map(|entry| {
                let (name, value) = std::str::from_utf8(entry).ok()?.split_once('=')?;
                Some((name.to_owned(), value.to_owned()))
            })
            .collect()
    }

    /// The Unix sockets listening in a network namespace, deleted or not,
    /// by path, with their inodes: the kernel keeps the name a socket was
    /// bound to after its file is removed. With `own`, the pid of a kubelet
    /// whose files are read through its `/proc/PID/root`, its
    /// `/proc/PID/net/unix`; else the host's: on the host, this process's
    /// `/proc/net/unix`; under a prefix, that of the host's pid 1 (which
    /// takes a pod with `hostPID`). The table's path on the host if it
    /// cannot be read.
    pub(crate) fn listening_unix_sockets(
        &self,
        own: Option<u32>,
    ) -> Result<BTreeMap<PathBuf, u64>, PathBuf> {
        let table = match own {
            Some(pid) => self.proc(&format!("{pid}/net/unix")),
            None if self.is_prefixed() => self.proc("1/net/unix"),
            None => self.proc("net/unix"),
        };
        let text = std::fs::read_to_string(&table).map_err(|_| table.on_host().to_path_buf())?;
        Ok(text.lines().skip(1).filter_map(listening_socket).collect())
    }

    /// The process holding the socket of inode `inode` open, of those whose
    /// descriptors this process may read: the one listening on it, for a
    /// socket whose file is gone and cannot be dialled to ask the kernel.
    pub(crate) fn socket_holder(&self, inode: u64) -> Option<u32> {
        let wanted = format!("socket:[{inode}]");
        let entries = std::fs::read_dir(self.proc("")).ok()?;
        entries.filter_map(Result::ok).find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let fds = std::fs::read_dir(entry.path().join("fd")).ok()?;
            fds.filter_map(Result::ok)
                .any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|target| target.as_os_str() == wanted.as_str())
                })
                .then_some(pid)
        })
    }

    /// What the host's `/proc/<pid>` says of `pid`; fields it cannot read
    /// are `None`.
    pub(crate) fn process(&self, pid: u32) -> ProcessInfo {
        ProcessInfo {
            pid,
            command: self.cmdline(pid).map(|args| args.join(" ")),
            container_id: std::fs::read_to_string(self.proc(&format!("{pid}/cgroup")))
                .ok()
                .and_then(|cgroup| container_id(&cgroup)),
            running_secs: self.running_for(pid).map(|running| running.as_secs()),
        }
    }

    /// How long `pid` has run: the system's uptime less its start time.
    fn running_for(&self, pid: u32) -> Option<Duration> {
        let uptime = std::fs::read_to_string(self.proc("uptime")).ok()?;
        let uptime_secs: f64 = uptime.split_whitespace().next()?.parse().ok()?;
        Duration::try_from_secs_f64(uptime_secs).ok()?.checked_sub(self.started_after_boot(pid)?)
    }

    /// When `pid` started, by the wall clock: the host's boot time and the
    /// process's start after it. A node event's time: the kubelet's start.
    pub(crate) fn started_at(&self, pid: u32) -> Option<SystemTime> {
        self.boot_time()?.checked_add(self.started_after_boot(pid)?)
    }

    /// When the host booted: `btime` of `/proc/stat`, in seconds since the
    /// epoch.
    pub(crate) fn boot_time(&self) -> Option<SystemTime> {
        let stat = std::fs::read_to_string(self.proc("stat")).ok()?;
        let secs: u64 =
            stat.lines().find_map(|line| line.strip_prefix("btime "))?.trim().parse().ok()?;
        SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs))
    }

    /// How long after the host's boot `pid` started: `/proc/<pid>/stat`
    /// field 22, in clock ticks.
    fn started_after_boot(&self, pid: u32) -> Option<Duration> {
        let stat = std::fs::read_to_string(self.proc(&format!("{pid}/stat"))).ok()?;
        // The command name (field 2) is in parentheses and may hold spaces.
        let after_name = &stat[stat.rfind(')')? + 1..];
        let started_ticks: u64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
        let ticks = rustix::param::clock_ticks_per_second().max(1);
        Some(Duration::from_millis(started_ticks.saturating_mul(1000) / ticks))
    }
}

/// `Num RefCount Protocol Flags Type St Inode Path`: a listening socket has
/// `__SO_ACCEPTCON` (0x10000) in its flags.
fn listening_socket(line: &str) -> Option<(PathBuf, u64)> {
    const ACCEPTING: u32 = 0x1_0000;
    let fields: Vec<&str> = line.split_whitespace().collect();
    let flags = u32::from_str_radix(fields.get(3)?, 16).ok()?;
    let inode = fields.get(6)?.parse().ok()?;
    let path = fields.get(7)?;
    (flags & ACCEPTING != 0 && path.starts_with('/')).then(|| (PathBuf::from(path), inode))
}

/// Who a process is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ProcessInfo {
    /// Its process id.
    pub pid: u32,
    /// Its command line, arguments joined by spaces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The container it runs in, from its cgroup path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// How long it has run, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running_secs: Option<u64>,
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

/// A host's `/proc` made of files, for tests: kubelets in the host's mount
/// namespace, in their own (`proc/PID/root` a directory of their files),
/// or whose `proc/PID/root` cannot be read.
#[cfg(test)]
pub(crate) struct FakeHost {
    pub(crate) dir: tempfile::TempDir,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
impl FakeHost {
    /// A host with a `/proc` whose pid 1 is in mount namespace 1.
    pub(crate) fn new() -> Self {
        let fake = Self { dir: tempfile::tempdir().unwrap() };
        fake.namespace(1, "mnt:[1]");
        fake
    }

    /// The host seen under this one's directory.
    pub(crate) fn host(&self) -> Host {
        Host::under(self.dir.path())
    }

    /// Where `on_host` is in this process.
    pub(crate) fn at(&self, on_host: &str) -> PathBuf {
        self.dir.path().join(on_host.trim_start_matches('/'))
    }

    fn namespace(&self, pid: u32, namespace: &str) {
        let ns = self.at(&format!("/proc/{pid}/ns"));
        std::fs::create_dir_all(&ns).unwrap();
        std::os::unix::fs::symlink(namespace, ns.join("mnt")).unwrap();
    }

    /// Process `pid` running `args`: in the host's mount namespace when
    /// `files` is `None`, else in its own, its `/` at `files`.
    pub(crate) fn process(&self, pid: u32, args: &[&str], files: Option<&Path>) {
        let dir = self.at(&format!("/proc/{pid}"));
        std::fs::create_dir_all(&dir).unwrap();
        let cmdline = args.join("\0") + "\0";
        std::fs::write(dir.join("cmdline"), cmdline).unwrap();
        match files {
            None => self.namespace(pid, "mnt:[1]"),
            Some(files) => {
                self.namespace(pid, &format!("mnt:[{pid}]"));
                std::os::unix::fs::symlink(files, dir.join("root")).unwrap();
            }
        }
    }

    /// Process `pid` running `args`, whose namespace and `/` cannot be read.
    pub(crate) fn hidden_process(&self, pid: u32, args: &[&str]) {
        let dir = self.at(&format!("/proc/{pid}"));
        std::fs::create_dir_all(&dir).unwrap();
        let cmdline = args.join("\0") + "\0";
        std::fs::write(dir.join("cmdline"), cmdline).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(listening_socket(listening), Some((PathBuf::from("/run/a.sock"), 27717)));
        assert_eq!(listening_socket(connected), None);
        assert_eq!(listening_socket(abstract_), None);
    }

    #[test]
    fn a_host_path_is_read_under_the_prefix_and_shown_as_on_the_host() {
        let registry = Path::new("/var/lib/kubelet/plugins_registry");
        let seen = Host::under("/host").path(registry);
        assert_eq!(seen.as_ref(), Path::new("/host/var/lib/kubelet/plugins_registry"));
        assert_eq!(seen.on_host(), registry);
        let socket = seen.join("a-reg.sock");
        assert_eq!(socket.on_host(), registry.join("a-reg.sock"));
        let entry = Path::new("/host/var/lib/kubelet/plugins_registry/sub/b.sock");
        assert_eq!(seen.on_host_of(entry), registry.join("sub/b.sock"));
        assert_eq!(seen.on_host_of(Path::new("/elsewhere/c.sock")), registry);
        // The host's own view moves nothing.
        assert_eq!(Host::default().path(registry).as_ref(), registry);
    }

    #[test]
    fn a_process_is_described_from_its_proc_files() {
        let fake = FakeHost::new();
        fake.process(42, &["/csi-node-driver-registrar", "--v=5"], None);
        let ticks = rustix::param::clock_ticks_per_second();
        // Started 100 s after boot, in clock ticks (field 22); up 160.5 s.
        let stat = format!(
            "42 (node driver (reg)) S 1 42 42 0 -1 4 0 0 0 0 1 1 0 0 20 0 9 0 {} 1 1",
            100 * ticks
        );
        std::fs::write(fake.at("/proc/42/stat"), stat).unwrap();
        std::fs::write(fake.at("/proc/uptime"), "160.50 300.00\n").unwrap();
        let cgroup = "0::/kubepods.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n";
        std::fs::write(fake.at("/proc/42/cgroup"), cgroup).unwrap();
        let described = fake.host().process(42);
        assert_eq!(described.command.as_deref(), Some("/csi-node-driver-registrar --v=5"));
        assert_eq!(described.running_secs, Some(60));
        assert!(described.container_id.is_some_and(|id| id.starts_with("0123456789ab")));
        // A process gone: only its pid.
        let gone = fake.host().process(43);
        assert_eq!((gone.command, gone.running_secs, gone.container_id), (None, None, None));
    }
}
