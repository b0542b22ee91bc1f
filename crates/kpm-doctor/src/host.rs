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
/// `--path.rootfs` of node-exporter).
///
/// The doctor keeps every path as the host's, the path the kubelet and the
/// plugins use and an operator can paste into a shell on the node; a path
/// is resolved under the prefix only to be read ([`Host::path`], a
/// [`Seen`], which cannot be shown). What the judging kubelet reads it is
/// given as [`Seen`] paths too, and its words come back through
/// `Host::as_on_host`, the one place they are mapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    root: PathBuf,
}

impl Default for Host {
    /// The host's own view: nothing moved.
    fn default() -> Self {
        Self { root: PathBuf::from("/") }
    }
}

/// A path on the host and where this process reads it, made by
/// [`Host::path`]. It is read through [`AsRef<Path>`] (`std::fs`, a dial,
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

impl Host {
    /// The host seen with its `/` at `root`.
    pub fn under(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Where the host's `/` is in this process.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the host is seen under a prefix.
    fn is_prefixed(&self) -> bool {
        self.root.as_os_str() != "/"
    }

    /// `on_host`, a path on the host, and where this process reads it.
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
    /// messages name what it read (`dial /host/var/lib/kubelet/…`); the
    /// doctor cannot type another crate's words, so they are mapped here,
    /// where they come back, and nowhere else. A path starts the text or
    /// follows a space, a quote, a bracket, `=`, `:` or `,`.
    pub(crate) fn as_on_host(&self, text: &str) -> String {
        let root = self.root.to_string_lossy();
        let root = root.trim_end_matches('/');
        if !self.is_prefixed() || root.is_empty() {
            return text.to_owned();
        }
        let starts_path = |before: &str| {
            before.chars().next_back().is_none_or(|c| c.is_whitespace() || "\"'([<{=:,".contains(c))
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

    /// The host's `/proc/<rest>`.
    fn proc(&self, rest: &str) -> Seen {
        self.path(&Path::new("/proc").join(rest))
    }

    /// The processes that run a kubelet (see [`KubeletProcess::program`]),
    /// with its `--root-dir` (the default without), by pid.
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

    /// The paths of the Unix sockets listening in the host's network
    /// namespace, deleted or not: the kernel keeps the name a socket was
    /// bound to after its file is removed. On the host, this process's
    /// `/proc/net/unix`; under a prefix, that of the host's pid 1 (which
    /// takes a pod with `hostPID`). `None` if it cannot be read.
    pub(crate) fn listening_unix_paths(&self) -> Option<BTreeSet<PathBuf>> {
        let table =
            if self.is_prefixed() { self.proc("1/net/unix") } else { self.proc("net/unix") };
        let table = std::fs::read_to_string(table).ok()?;
        Some(table.lines().skip(1).filter_map(listening_path).collect())
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

/// A running kubelet and the root directory its command line gives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KubeletProcess {
    /// Its process id, as the host's `/proc` names it.
    pub pid: u32,
    /// What runs it: `kubelet`; `kubelite` (`MicroK8s`, the kubelet among
    /// the other components in one process); `k3s` (`k3s server` or `k3s
    /// agent`, the kubelet in-process).
    pub program: &'static str,
    /// Its `--root-dir`, a path on the host.
    pub root_dir: PathBuf,
}

impl KubeletProcess {
    /// How a report names it: `the running kubelet, pid 42`.
    pub fn describe(&self) -> String {
        match self.program {
            "kubelet" => format!("the running kubelet, pid {}", self.pid),
            program => format!("the kubelet in the running {program}, pid {}", self.pid),
        }
    }
}

/// Where `MicroK8s`' kubelite reads the kubelet's flags without
/// `--kubelet-args-file`.
const KUBELITE_KUBELET_ARGS: &str = "/var/snap/microk8s/current/args/kubelet";

/// The kubelet that process `pid`, with command line `args`, runs, if any.
fn kubelet_of(host: &Host, pid: u32, args: &[String]) -> Option<KubeletProcess> {
    let program = Path::new(args.first()?).file_name()?.to_str()?;
    let (program, flags) = match program {
        "kubelet" => ("kubelet", args.to_vec()),
        "kubelite" => {
            let file =
                flag_values(args, "--kubelet-args-file").last().unwrap_or(KUBELITE_KUBELET_ARGS);
            let text = std::fs::read_to_string(host.path(Path::new(file))).unwrap_or_default();
            ("kubelite", kubelite_args(&text, &host.environ(pid)))
        }
        "k3s" if matches!(args.get(1).map(String::as_str), Some("server" | "agent")) => {
            ("k3s", k3s_kubelet_args(args))
        }
        _ => return None,
    };
    let root_dir = flag_values(&flags, "--root-dir").last().unwrap_or(DEFAULT_ROOT).into();
    Some(KubeletProcess { pid, program, root_dir })
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
            assert_eq!(host.as_on_host(said), shown, "{said}");
        }
        let on_the_host = "dial /host/a.sock";
        assert_eq!(Host::default().as_on_host(on_the_host), on_the_host);
    }

    #[test]
    fn this_process_is_described() {
        let me = Host::default().process(std::process::id());
        assert!(me.command.is_some_and(|command| !command.is_empty()));
        assert!(me.running_secs.is_some());
    }
}
