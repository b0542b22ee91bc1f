//! What the host's `/proc` says: the kubelets running and their roots, the
//! Unix sockets listening, and who a process is; read under the prefix
//! where this process sees the host ([`Host`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

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
/// them ([`KubeletProcess::view`]: `<host-root>/proc/PID/root` when it runs
/// in a mount namespace of its own). What the judging kubelet reads it is
/// given as [`Seen`] paths too, and its words come back through
/// `View::as_on_host`, the one place they are mapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    view: View,
}

impl Default for Host {
    /// The host's own view: nothing moved.
    fn default() -> Self {
        Self { view: View { root: PathBuf::from("/") } }
    }
}

/// A file system as one process sees it, and where this process reads it:
/// a prefix (`/`, `/host`, `/host/proc/42/root`) under which a path of
/// that file system is read. Paths are named as that process names them
/// (the host's, for a kubelet), never with the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    root: PathBuf,
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
    /// Where this view's `/` is in this process: the prefix paths are read
    /// under (a judging kubelet's `host_root`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether paths are read under a prefix.
    fn is_prefixed(&self) -> bool {
        self.root.as_os_str() != "/"
    }

    /// `on_host`, a path of this view, and where this process reads it.
    pub fn path(&self, on_host: &Path) -> Seen {
        let read_at = match on_host.strip_prefix("/") {
            Ok(relative) if self.is_prefixed() => self.root.join(relative),
            _ => on_host.to_path_buf(),
        };
        Seen { on_host: on_host.to_path_buf(), read_at }
    }

    /// `text`, words of the judging kubelet (an error, an endpoint, a
    /// service's report), with every path it names under the prefix named
    /// as on the host. That kubelet is given [`Seen`] paths to read and its
    /// messages name what it read (`dial /host/var/lib/kubelet/…`,
    /// `dial /proc/42/root/var/lib/kubelet/…`); the doctor cannot type
    /// another crate's words, so they are mapped here, where they come
    /// back, and nowhere else. A path starts the text or follows a space, a
    /// quote, a bracket, `=`, `:`, `,` or `/` (`unix:///host/…`).
    pub(crate) fn as_on_host(&self, text: &str) -> String {
        let root = self.root.to_string_lossy();
        let root = root.trim_end_matches('/');
        if !self.is_prefixed() || root.is_empty() {
            return text.to_owned();
        }
        let starts_path = |before: &str| {
            before.chars().next_back().is_none_or(|c| c.is_whitespace() || "\"'([<{=:,".contains(c))
                // `unix:///host/…`: the scheme's slashes, not a directory.
                || before.ends_with("unix://")
        };
        let mut shown = String::with_capacity(text.len());
        let mut copied = 0;
        for (at, _) in text.match_indices(root) {
            let after = &text[at + root.len()..];
            if at < copied || !starts_path(&text[..at]) {
                continue;
            }
            // `/host/var/…` is `/var/…`; `/host` alone is `/`; `/hostile` is
            // no path under `/host`.
            let alone = match after.chars().next() {
                Some('/') => false,
                None => true,
                Some(c) => c.is_whitespace() || "\"')]>},:;".contains(c),
            };
            if !alone && !after.starts_with('/') {
                continue;
            }
            shown.push_str(&text[copied..at]);
            if alone {
                shown.push('/');
            }
            copied = at + root.len();
        }
        shown.push_str(&text[copied..]);
        shown
    }
}

impl Host {
    /// The host seen with its `/` at `root`.
    pub fn under(root: impl Into<PathBuf>) -> Self {
        Self { view: View { root: root.into() } }
    }

    /// Where the host's `/` is in this process.
    pub fn root(&self) -> &Path {
        &self.view.root
    }

    /// The host's file system as this process sees it: where a process
    /// that shares the host's mount namespace has its files.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// Whether the host is seen under a prefix.
    fn is_prefixed(&self) -> bool {
        self.view.is_prefixed()
    }

    /// `on_host`, a path on the host, and where this process reads it.
    pub fn path(&self, on_host: &Path) -> Seen {
        self.view.path(on_host)
    }

    /// The host's `/proc/<rest>`.
    fn proc(&self, rest: &str) -> Seen {
        self.path(&Path::new("/proc").join(rest))
    }

    /// The processes that run a kubelet (see [`KubeletProcess::program`]),
    /// with its `--root-dir` (the default without), where its files are
    /// read and the node it is, by pid.
    pub(crate) fn kubelets(&self) -> Vec<KubeletProcess> {
        let Ok(entries) = std::fs::read_dir(self.proc("")) else { return Vec::new() };
        let mut found: Vec<KubeletProcess> = entries
            .filter_map(|entry| {
                let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
                kubelet_of(self, pid, &self.cmdline(pid)?)
            })
            .collect();
        found.sort_by_key(|kubelet| kubelet.pid);
        found
    }

    /// Where process `pid`'s files are as it sees them: the host's view
    /// when it shares the host's mount namespace (a kubelet run by
    /// systemd), else `/proc/PID/root` (kind, k3d, a kubelet in a
    /// container), else, when that cannot be read, the host's view again,
    /// with why.
    fn view_of(&self, pid: u32) -> (View, ReadThrough, Option<String>) {
        if self.shares_mount_namespace(pid) {
            return (self.view.clone(), ReadThrough::Host, None);
        }
        let root = self.proc(&format!("{pid}/root"));
        let unreadable = match std::fs::metadata(&root) {
            Ok(meta) if meta.is_dir() => {
                return (View { root: root.as_ref().to_path_buf() }, ReadThrough::ProcRoot, None);
            }
            Ok(_) => "not a directory".to_owned(),
            Err(err) => err.to_string(),
        };
        tracing::debug!(pid, error = %unreadable, "reading a kubelet's files at their host paths");
        let why = format!("{}: cannot be read: {unreadable}", root.on_host().display());
        (self.view.clone(), ReadThrough::HostFallback, Some(why))
    }

    /// Whether `pid` is in the mount namespace of the host's view: this
    /// process's on the host, pid 1's under a prefix. `false` when either
    /// cannot be told (reading another user's namespace takes root).
    fn shares_mount_namespace(&self, pid: u32) -> bool {
        let ours = if self.is_prefixed() { "1/ns/mnt" } else { "self/ns/mnt" };
        let namespace = |rest: &str| std::fs::read_link(self.proc(rest)).ok();
        namespace(ours).is_some_and(|ours| namespace(&format!("{pid}/ns/mnt")) == Some(ours))
    }

    /// A process's arguments; `None` for a kernel thread or one that is gone.
    fn cmdline(&self, pid: u32) -> Option<Vec<String>> {
        let raw = std::fs::read(self.proc(&format!("{pid}/cmdline"))).ok()?;
        let args: Vec<String> = raw
            .split(|&byte| byte == 0)
            .filter(|arg| !arg.is_empty())
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect();
        (!args.is_empty()).then_some(args)
    }

    /// A process's environment; empty if it cannot be read.
    fn environ(&self, pid: u32) -> BTreeMap<String, String> {
        let raw = std::fs::read(self.proc(&format!("{pid}/environ"))).unwrap_or_default();
        raw.split(|&byte| byte == 0)
            .filter_map(|entry| {
                let (name, value) = std::str::from_utf8(entry).ok()?.split_once('=')?;
                Some((name.to_owned(), value.to_owned()))
            })
            .collect()
    }

    /// The paths of the Unix sockets listening in `kubelet`'s network
    /// namespace, deleted or not: the kernel keeps the name a socket was
    /// bound to after its file is removed. For a kubelet whose files are
    /// read through its `/proc/PID/root`, its `/proc/PID/net/unix`; else
    /// the host's: on the host, this process's `/proc/net/unix`; under a
    /// prefix, that of the host's pid 1 (which takes a pod with `hostPID`).
    /// The table's path on the host if it cannot be read.
    pub(crate) fn listening_unix_paths(
        &self,
        kubelet: Option<&KubeletProcess>,
    ) -> Result<BTreeSet<PathBuf>, PathBuf> {
        let table = match kubelet {
            Some(kubelet) if kubelet.files == ReadThrough::ProcRoot => {
                self.proc(&format!("{}/net/unix", kubelet.pid))
            }
            _ if self.is_prefixed() => self.proc("1/net/unix"),
            _ => self.proc("net/unix"),
        };
        let text = std::fs::read_to_string(&table).map_err(|_| table.on_host().to_path_buf())?;
        Ok(text.lines().skip(1).filter_map(listening_path).collect())
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

    /// How long `pid` has run: the system's uptime less its start time
    /// (`/proc/<pid>/stat` field 22, in clock ticks since boot).
    fn running_for(&self, pid: u32) -> Option<Duration> {
        let stat = std::fs::read_to_string(self.proc(&format!("{pid}/stat"))).ok()?;
        // The command name (field 2) is in parentheses and may hold spaces.
        let after_name = &stat[stat.rfind(')')? + 1..];
        let started_ticks: u64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
        let uptime = std::fs::read_to_string(self.proc("uptime")).ok()?;
        let uptime_secs: f64 = uptime.split_whitespace().next()?.parse().ok()?;
        let ticks = rustix::param::clock_ticks_per_second().max(1);
        let started = Duration::from_millis(started_ticks.saturating_mul(1000) / ticks);
        Duration::try_from_secs_f64(uptime_secs).ok()?.checked_sub(started)
    }
}

/// A running kubelet: the root directory its command line gives, where
/// its files are read, and the node it is, when that can be told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KubeletProcess {
    /// Its process id, as the host's `/proc` names it.
    pub pid: u32,
    /// What runs it: `kubelet`; `kubelite` (`MicroK8s`, the kubelet among
    /// the other components in one process); `k3s` (`k3s server` or `k3s
    /// agent`, the kubelet in-process).
    pub program: &'static str,
    /// Its `--root-dir`, a path as it sees it.
    pub root_dir: PathBuf,
    /// The name of its Node, when its flags, its config file or its
    /// hostname tell it (lower-cased, as the kubelet does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Where [`node_name`](Self::node_name) comes from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name_from: Option<NodeNameFrom>,
    /// How its files are read.
    pub files: ReadThrough,
    /// Where its files are read: never shown.
    #[serde(skip)]
    view: View,
    /// Why its `/proc/PID/root` could not be read, when it could not.
    #[serde(skip)]
    unreadable: Option<String>,
}

/// How a running kubelet's files are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ReadThrough {
    /// It shares the host's mount namespace: its files are the host's.
    Host,
    /// It runs in a mount namespace of its own (kind, k3d, a containerized
    /// kubelet): its files are read through `/proc/PID/root`.
    ProcRoot,
    /// Its `/proc/PID/root` cannot be read (another user's process, one
    /// that is gone): its files are read at their paths on the host, which
    /// are its own only if it shares the host's mount namespace.
    HostFallback,
}

/// Where a kubelet's node name was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum NodeNameFrom {
    /// Its command line: `--hostname-override` (k3s: `--node-name`).
    Flag,
    /// `hostnameOverride` in its `--config` file.
    ConfigFile,
    /// Its environment (k3s: `K3S_NODE_NAME`).
    Environment,
    /// Its `/etc/hostname`, the name a kubelet without an override takes.
    Hostname,
}

impl KubeletProcess {
    /// How a report names it: `the running kubelet, pid 42`.
    pub fn describe(&self) -> String {
        match self.program {
            "kubelet" => format!("the running kubelet, pid {}", self.pid),
            program => format!("the kubelet in the running {program}, pid {}", self.pid),
        }
    }

    /// Its files as it sees them.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// Why its `/proc/PID/root` could not be read, when its files are read
    /// at their host paths for that reason ([`ReadThrough::HostFallback`]).
    pub fn unreadable(&self) -> Option<&str> {
        self.unreadable.as_deref()
    }

    /// `pid 42 (kubelet) root /var/lib/kubelet node n1`, for a list.
    pub fn summary(&self) -> String {
        let node = self.node_name.as_deref().unwrap_or("unknown");
        format!("pid {} ({}) root {} node {node}", self.pid, self.program, self.root_dir.display())
    }
}

/// Where `MicroK8s`' kubelite reads the kubelet's flags without
/// `--kubelet-args-file`.
const KUBELITE_KUBELET_ARGS: &str = "/var/snap/microk8s/current/args/kubelet";

/// The kubelet that process `pid`, with command line `args`, runs, if any,
/// with its files read as it sees them.
fn kubelet_of(host: &Host, pid: u32, args: &[String]) -> Option<KubeletProcess> {
    let program = Path::new(args.first()?).file_name()?.to_str()?;
    let program = match program {
        "kubelet" => "kubelet",
        "kubelite" => "kubelite",
        "k3s" if matches!(args.get(1).map(String::as_str), Some("server" | "agent")) => "k3s",
        _ => return None,
    };
    let (view, files, unreadable) = host.view_of(pid);
    let read = |file: &str| std::fs::read_to_string(view.path(&Path::new("/").join(file))).ok();
    let flags = match program {
        "kubelite" => {
            let file =
                flag_values(args, "--kubelet-args-file").last().unwrap_or(KUBELITE_KUBELET_ARGS);
            kubelite_args(&read(file).unwrap_or_default(), &host.environ(pid))
        }
        "k3s" => k3s_kubelet_args(args),
        _ => args.to_vec(),
    };
    let root_dir = flag_values(&flags, "--root-dir").last().unwrap_or(DEFAULT_ROOT).into();
    let node = node_name_of(program, args, &flags, || host.environ(pid), read);
    let (node_name, node_name_from) =
        node.map_or((None, None), |(name, from)| (Some(name), Some(from)));
    Some(KubeletProcess {
        pid,
        program,
        root_dir,
        node_name,
        node_name_from,
        files,
        view,
        unreadable,
    })
}

/// The name of the kubelet's Node, as the kubelet takes it
/// (`nodeutil.GetHostname`: trimmed, lower-cased): `--hostname-override`
/// (k3s: its `--node-name` or `K3S_NODE_NAME`), else `hostnameOverride` in
/// its `--config` file, else its hostname; `read` reads a file as the
/// kubelet sees it. `None` when none can be read. (A cloud provider may
/// name the Node otherwise: the name is what the kubelet's own settings
/// say.)
fn node_name_of(
    program: &str,
    args: &[String],
    flags: &[String],
    environment: impl FnOnce() -> BTreeMap<String, String>,
    read: impl Fn(&str) -> Option<String>,
) -> Option<(String, NodeNameFrom)> {
    let named = |name: &str| {
        let name = name.trim().to_lowercase();
        (!name.is_empty()).then_some(name)
    };
    let k3s_flag = (program == "k3s").then(|| flag_values(args, "--node-name").last()).flatten();
    if let Some(name) =
        k3s_flag.or_else(|| flag_values(flags, "--hostname-override").last()).and_then(named)
    {
        return Some((name, NodeNameFrom::Flag));
    }
    if program == "k3s"
        && let Some(name) = environment().get("K3S_NODE_NAME").and_then(|name| named(name))
    {
        return Some((name, NodeNameFrom::Environment));
    }
    let config = flag_values(flags, "--config").last().and_then(&read);
    if let Some(name) = config.as_deref().and_then(hostname_override).and_then(|name| named(&name))
    {
        return Some((name, NodeNameFrom::ConfigFile));
    }
    let hostname = read("/etc/hostname")?;
    named(hostname.lines().next()?).map(|name| (name, NodeNameFrom::Hostname))
}

/// `hostnameOverride` of a `KubeletConfiguration`, YAML or JSON: a
/// top-level key (at the start of a line, or quoted), its value up to the
/// end of the line, a comment, `,` or `}`, quotes removed. Nothing else of
/// the file is read, so no YAML parser is needed for it.
fn hostname_override(config: &str) -> Option<String> {
    const KEY: &str = "hostnameOverride";
    config.match_indices(KEY).find_map(|(at, _)| {
        let quote = config[..at].chars().next_back().filter(|c| matches!(c, '"' | '\''));
        let line_start = config[..at - quote.map_or(0, char::len_utf8)].chars().next_back();
        // Indented, it is not top-level (YAML); quoted, JSON puts it anywhere.
        if quote.is_none() && line_start.is_some_and(|c| c != '\n') {
            return None;
        }
        let mut rest = &config[at + KEY.len()..];
        if let Some(quote) = quote {
            rest = rest.strip_prefix(quote)?;
        }
        let rest = rest.trim_start_matches([' ', '\t']).strip_prefix(':')?;
        let rest = rest.trim_start_matches([' ', '\t']);
        let value = match rest.chars().next()? {
            quote @ ('"' | '\'') => rest[1..].split(quote).next()?,
            _ => rest.split(['\n', '#', ',', '}']).next()?.trim(),
        };
        (!value.is_empty()).then(|| value.to_owned())
    })
}

/// The values flag `name` is given in `args`, `--name=VALUE` or `--name
/// VALUE`, in order (Go's flag packages keep the last one).
fn flag_values<'a>(args: &'a [String], name: &'a str) -> impl Iterator<Item = &'a str> {
    let mut args = args.iter();
    std::iter::from_fn(move || {
        while let Some(arg) = args.next() {
            match arg.strip_prefix(name).map(|rest| (rest, rest.strip_prefix('='))) {
                Some(("", _)) => return args.next().map(String::as_str),
                Some((_, Some(value))) => return Some(value),
                _ => {}
            }
        }
        None
    })
}

/// The kubelet's flags in a kubelite args file, read as kubelite's
/// `ReadArgsFromFile` does: lines trimmed, empty and `#` lines skipped,
/// quotes removed, split on spaces, `$VAR` and `${VAR}` expanded from
/// kubelite's environment (unset: empty, as Go's `os.ExpandEnv`).
fn kubelite_args(text: &str, environment: &BTreeMap<String, String>) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .flat_map(|line| {
            line.replace(['"', '\''], "").split(' ').map(str::to_owned).collect::<Vec<_>>()
        })
        .map(|part| {
            let value = |name: &str| Some(environment.get(name).map_or("", String::as_str));
            shellexpand::env_with_context_no_errors(&part, value).into_owned()
        })
        .collect()
}

/// The kubelet's flags k3s is given on its command line: each
/// `--kubelet-arg KEY=VALUE` (or `--kubelet-arg=KEY=VALUE`) as
/// `--KEY=VALUE`. Flags in k3s's config file are not read.
fn k3s_kubelet_args(args: &[String]) -> Vec<String> {
    flag_values(args, "--kubelet-arg")
        .map(|value| format!("--{}", value.trim_start_matches('-')))
        .collect()
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

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(ToString::to_string).collect()
    }

    /// The root `kubelet_of` finds in a command line (no process behind it).
    fn root_of(command: &[&str]) -> Option<(&'static str, PathBuf)> {
        kubelet_of(&Host::default(), 0, &args(command))
            .map(|kubelet| (kubelet.program, kubelet.root_dir))
    }

    #[test]
    fn a_kubelets_root_dir_comes_from_either_flag_form_or_the_default() {
        let kubelet = |root: &str| Some(("kubelet", PathBuf::from(root)));
        assert_eq!(
            root_of(&["/usr/bin/kubelet", "--root-dir=/var/lib/k0s/kubelet"]),
            kubelet("/var/lib/k0s/kubelet")
        );
        assert_eq!(root_of(&["kubelet", "--v=2", "--root-dir", "/r"]), kubelet("/r"));
        assert_eq!(root_of(&["kubelet", "--config=/c"]), kubelet(DEFAULT_ROOT));
        assert_eq!(root_of(&["kubelet", "--root-dir=/a", "--root-dir", "/b"]), kubelet("/b"));
        assert_eq!(root_of(&["kubelet", "--root-directory=/a"]), kubelet(DEFAULT_ROOT));
        assert_eq!(root_of(&["/usr/bin/kubectl", "--root-dir=/r"]), None);
    }

    #[test]
    fn k3s_gives_the_kubelet_its_flags_with_kubelet_arg() {
        let k3s = |root: &str| Some(("k3s", PathBuf::from(root)));
        assert_eq!(root_of(&["/usr/local/bin/k3s", "server"]), k3s(DEFAULT_ROOT));
        assert_eq!(
            root_of(&["/usr/local/bin/k3s", "agent", "--kubelet-arg=root-dir=/data/kubelet"]),
            k3s("/data/kubelet")
        );
        assert_eq!(
            root_of(&[
                "k3s",
                "server",
                "--kubelet-arg",
                "--max-pods=250",
                "--kubelet-arg",
                "root-dir=/r"
            ]),
            k3s("/r")
        );
        // A one-off command runs no kubelet.
        assert_eq!(root_of(&["/usr/local/bin/k3s", "kubectl", "get", "nodes"]), None);
    }

    #[test]
    fn kubelites_args_file_is_read_as_kubelite_reads_it() {
        // Lines of /var/snap/microk8s/current/args/kubelet on a MicroK8s node.
        let text = "--kubeconfig=${SNAP_DATA}/credentials/kubelet.config\n\
                    # a comment\n\n  --root-dir=${SNAP_COMMON}/var/lib/kubelet  \n\
                    --eviction-hard=\"memory.available<100Mi,nodefs.available<1Gi\"\n\
                    --node-labels=a=$UNSET --v=2\n";
        let environment: BTreeMap<String, String> = [
            ("SNAP_COMMON", "/var/snap/microk8s/common"),
            ("SNAP_DATA", "/var/snap/microk8s/7964"),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
        assert_eq!(
            kubelite_args(text, &environment),
            [
                "--kubeconfig=/var/snap/microk8s/7964/credentials/kubelet.config",
                "--root-dir=/var/snap/microk8s/common/var/lib/kubelet",
                "--eviction-hard=memory.available<100Mi,nodefs.available<1Gi",
                "--node-labels=a=",
                "--v=2",
            ]
        );
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
    fn the_judging_kubelets_words_name_the_hosts_paths() {
        let host = Host::under("/host/");
        let cases = [
            (
                "dial /host/var/lib/kubelet/plugins_registry/a.sock: Connection refused",
                "dial /var/lib/kubelet/plugins_registry/a.sock: Connection refused",
            ),
            (
                "NodeGetInfo on /host/csi.sock: dial /host/csi.sock: gone",
                "NodeGetInfo on /csi.sock: dial /csi.sock: gone",
            ),
            (
                "endpoint \"/host/r/d.sock\" not in \"/host/r\"",
                "endpoint \"/r/d.sock\" not in \"/r\"",
            ),
            ("/host/var/x", "/var/x"),
            ("unix:/host/var/x", "unix:/var/x"),
            ("the root /host: unreadable", "the root /: unreadable"),
            ("/host", "/"),
            // Not paths under the prefix.
            ("/hostile/x and /var/host/x and x/host/y", "/hostile/x and /var/host/x and x/host/y"),
        ];
        for (said, shown) in cases {
            assert_eq!(host.view().as_on_host(said), shown, "{said}");
        }
        let on_the_host = "dial /host/a.sock";
        assert_eq!(Host::default().view().as_on_host(on_the_host), on_the_host);
    }

    #[test]
    fn a_kubelets_files_are_read_as_it_sees_them() {
        let fake = FakeHost::new();
        // A kubelet run by systemd, one in a container (kind) with its node
        // name in its config file, one whose files cannot be read.
        fake.process(10, &["/usr/bin/kubelet", "--hostname-override=Node-A"], None);
        let kind = tempfile::tempdir().unwrap();
        let config = "apiVersion: kubelet.config.k8s.io/v1beta1\nhostnameOverride: kind-worker\n";
        std::fs::create_dir_all(kind.path().join("etc")).unwrap();
        std::fs::write(kind.path().join("etc/kubelet.yaml"), config).unwrap();
        std::fs::write(kind.path().join("etc/hostname"), "ignored\n").unwrap();
        fake.process(20, &["kubelet", "--config", "/etc/kubelet.yaml"], Some(kind.path()));
        fake.hidden_process(30, &["kubelet", "--root-dir=/r"]);
        fake.hidden_process(40, &["/usr/bin/kubectl"]);
        let kubelets = fake.host().kubelets();
        let found: Vec<_> = kubelets
            .iter()
            .map(|k| (k.pid, k.files, k.node_name.as_deref(), k.node_name_from))
            .collect();
        assert_eq!(
            found,
            [
                (10, ReadThrough::Host, Some("node-a"), Some(NodeNameFrom::Flag)),
                (20, ReadThrough::ProcRoot, Some("kind-worker"), Some(NodeNameFrom::ConfigFile)),
                (30, ReadThrough::HostFallback, None, None),
            ]
        );
        // The first reads the host where this process sees it; the second
        // through its /proc/PID/root, named as it names its files.
        let root = Path::new(DEFAULT_ROOT);
        assert_eq!(kubelets[0].view().path(root).as_ref(), fake.at("/var/lib/kubelet"));
        let seen = kubelets[1].view().path(root);
        assert_eq!(seen.as_ref(), fake.at("/proc/20/root/var/lib/kubelet"));
        assert_eq!(seen.on_host(), root);
        // The third is read at its host paths, and says why.
        assert_eq!(kubelets[2].view(), fake.host().view());
        let why = kubelets[2].unreadable().unwrap();
        assert!(why.starts_with("/proc/30/root: cannot be read: "), "{why}");
        assert!(kubelets.iter().all(|k| {
            k.unreadable().is_none_or(|why| !why.contains(fake.dir.path().to_str().unwrap()))
        }));
    }

    #[test]
    fn a_kubelet_without_an_override_is_the_node_of_its_hostname() {
        let fake = FakeHost::new();
        let files = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(files.path().join("etc")).unwrap();
        std::fs::write(files.path().join("etc/hostname"), "K3D-Agent-0\n").unwrap();
        fake.process(7, &["/bin/k3s", "agent"], Some(files.path()));
        fake.process(8, &["/bin/k3s", "server", "--node-name", "srv"], Some(files.path()));
        let kubelets = fake.host().kubelets();
        let names: Vec<_> =
            kubelets.iter().map(|k| (k.node_name.as_deref(), k.node_name_from)).collect();
        assert_eq!(
            names,
            [
                (Some("k3d-agent-0"), Some(NodeNameFrom::Hostname)),
                (Some("srv"), Some(NodeNameFrom::Flag)),
            ]
        );
    }

    #[test]
    fn hostname_override_is_read_from_yaml_or_json() {
        let cases = [
            ("kind: KubeletConfiguration\nhostnameOverride: n1\n", Some("n1")),
            ("hostnameOverride: \"n2\" # a comment\n", Some("n2")),
            ("hostnameOverride: n3 # a comment\n", Some("n3")),
            ("{\"kind\":\"KubeletConfiguration\",\"hostnameOverride\": \"n4\"}", Some("n4")),
            // Not top-level, empty, or another key.
            ("nested:\n  hostnameOverride: no\n", None),
            ("hostnameOverride: \"\"\n", None),
            ("hostnameOverrides: no\n", None),
            ("", None),
        ];
        for (config, expected) in cases {
            assert_eq!(hostname_override(config).as_deref(), expected, "{config}");
        }
    }

    #[test]
    fn a_kubelet_in_its_own_namespace_lists_its_own_sockets() {
        let fake = FakeHost::new();
        let files = tempfile::tempdir().unwrap();
        fake.process(20, &["kubelet"], Some(files.path()));
        let table = "Num RefCount Protocol Flags Type St Inode Path\n\
                     0000000000000000: 00000002 00000000 00010000 0001 01 1 /var/lib/kubelet/a.sock\n";
        std::fs::create_dir_all(fake.at("/proc/20/net")).unwrap();
        std::fs::write(fake.at("/proc/20/net/unix"), table).unwrap();
        let kubelets = fake.host().kubelets();
        let listening = fake.host().listening_unix_paths(kubelets.first()).unwrap();
        assert_eq!(kubelets[0].files, ReadThrough::ProcRoot);
        assert_eq!(
            listening.into_iter().collect::<Vec<_>>(),
            [PathBuf::from("/var/lib/kubelet/a.sock")]
        );
        // The host's own table is pid 1's, which this fake host lacks.
        assert_eq!(fake.host().listening_unix_paths(None), Err(PathBuf::from("/proc/1/net/unix")));
    }

    #[test]
    fn words_read_through_a_kubelets_proc_root_name_its_paths() {
        let view = Host::under("/host").path(Path::new("/proc/42/root"));
        let view = View { root: view.as_ref().to_path_buf() };
        let cases = [
            (
                "dial /host/proc/42/root/var/lib/kubelet/plugins_registry/a.sock: refused",
                "dial /var/lib/kubelet/plugins_registry/a.sock: refused",
            ),
            ("unix:///host/proc/42/root/csi/csi.sock", "unix:///csi/csi.sock"),
            // Another kubelet's, or the host's, are not this one's.
            ("/host/proc/421/root/x and /host/var/x", "/host/proc/421/root/x and /host/var/x"),
        ];
        for (said, shown) in cases {
            assert_eq!(view.as_on_host(said), shown, "{said}");
        }
    }

    #[test]
    fn this_process_is_described() {
        let me = Host::default().process(std::process::id());
        assert!(me.command.is_some_and(|command| !command.is_empty()));
        assert!(me.running_secs.is_some());
    }
}
