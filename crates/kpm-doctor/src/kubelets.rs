//! The kubelets running on a host: what runs each (a kubelet, `MicroK8s`'
//! kubelite, k3s), its `--root-dir`, where its files are read (its
//! [`View`]), and the node it is, when its flags, its config file or its
//! hostname tell.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::host::{DEFAULT_ROOT, Host, View};

impl Host {
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
            return (self.view().clone(), ReadThrough::Host, None);
        }
        let root = self.proc(&format!("{pid}/root"));
        let unreadable = match std::fs::metadata(&root) {
            Ok(meta) if meta.is_dir() => {
                return (View::at(root.as_ref()), ReadThrough::ProcRoot, None);
            }
            Ok(_) => "not a directory".to_owned(),
            Err(err) => err.to_string(),
        };
        tracing::debug!(pid, error = %unreadable, "reading a kubelet's files at their host paths");
        let why = format!("{}: cannot be read: {unreadable}", root.on_host().display());
        (self.view().clone(), ReadThrough::HostFallback, Some(why))
    }

    /// Whether `pid` is in the mount namespace of the host's view: this
    /// process's on the host, pid 1's under a prefix. `false` when either
    /// cannot be told (reading another user's namespace takes root).
    fn shares_mount_namespace(&self, pid: u32) -> bool {
        let ours = if self.is_prefixed() { "1/ns/mnt" } else { "self/ns/mnt" };
        let namespace = |rest: &str| std::fs::read_link(self.proc(rest)).ok();
        namespace(ours).is_some_and(|ours| namespace(&format!("{pid}/ns/mnt")) == Some(ours))
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
    /// The feature gates its command line and its `--config` file set,
    /// the command line winning gate by gate as the kubelet merges them; a
    /// gate not named has its default.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    /// The socket of its container runtime, as it sees it: its
    /// `--container-runtime-endpoint` or its config file's
    /// `containerRuntimeEndpoint`, else its default (containerd's; k3s' own
    /// containerd for k3s).
    pub runtime_endpoint: PathBuf,
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
    let config = flag_values(&flags, "--config")
        .last()
        .and_then(&read)
        .map(|text| ConfigFile::parse(&text))
        .unwrap_or_default();
    let feature_gates = feature_gates(&flags, &config);
    let runtime_endpoint = runtime_endpoint(program, args, &flags, &config);
    let node = node_name_of(program, args, &flags, || host.environ(pid), &config, read);
    let (node_name, node_name_from) =
        node.map_or((None, None), |(name, from)| (Some(name), Some(from)));
    Some(KubeletProcess {
        pid,
        program,
        root_dir,
        node_name,
        node_name_from,
        feature_gates,
        runtime_endpoint,
        files,
        view,
        unreadable,
    })
}

/// k3s' kubelet talks to the containerd k3s runs, at its own socket.
const K3S_RUNTIME_ENDPOINT: &str = "/run/k3s/containerd/containerd.sock";

/// The kubelet's container runtime socket: the flag (k3s: its own flag
/// too), else the config file's, else the default; `unix://` dropped.
fn runtime_endpoint(
    program: &str,
    args: &[String],
    flags: &[String],
    config: &ConfigFile,
) -> PathBuf {
    const FLAG: &str = "--container-runtime-endpoint";
    let k3s_flag = (program == "k3s").then(|| flag_values(args, FLAG).last()).flatten();
    let named = k3s_flag
        .or_else(|| flag_values(flags, FLAG).last())
        .or(config.runtime_endpoint.as_deref())
        .filter(|endpoint| !endpoint.is_empty());
    let default = if program == "k3s" { K3S_RUNTIME_ENDPOINT } else { kpm_pods::DEFAULT_ENDPOINT };
    let endpoint = named.unwrap_or(default);
    PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(endpoint))
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
    config: &ConfigFile,
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
    if let Some(name) = config.hostname_override.as_deref().and_then(named) {
        return Some((name, NodeNameFrom::ConfigFile));
    }
    let hostname = read("/etc/hostname")?;
    named(hostname.lines().next()?).map(|name| (name, NodeNameFrom::Hostname))
}

/// What the doctor reads of a kubelet's `--config` file, a
/// `KubeletConfiguration` in YAML or JSON: nothing of a file that does not
/// parse, as the kubelet would not start with it.
#[derive(Debug, Default)]
struct ConfigFile {
    hostname_override: Option<String>,
    feature_gates: BTreeMap<String, bool>,
    runtime_endpoint: Option<String>,
}

impl ConfigFile {
    fn parse(text: &str) -> Self {
        let Ok(config) = serde_norway::from_str::<serde_norway::Value>(text) else {
            return Self::default();
        };
        let hostname_override =
            config.get("hostnameOverride").and_then(serde_norway::Value::as_str).map(str::to_owned);
        let hostname_override = hostname_override.filter(|name| !name.is_empty());
        let feature_gates = config
            .get("featureGates")
            .and_then(serde_norway::Value::as_mapping)
            .into_iter()
            .flatten()
            .filter_map(|(gate, on)| Some((gate.as_str()?.to_owned(), on.as_bool()?)))
            .collect();
        let runtime_endpoint = config
            .get("containerRuntimeEndpoint")
            .and_then(serde_norway::Value::as_str)
            .map(str::to_owned);
        Self { hostname_override, feature_gates, runtime_endpoint }
    }
}

/// The kubelet's feature gates: its config file's, then each
/// `--feature-gates=A=true,B=false` over them, gate by gate, as
/// `kubeletConfigFlagPrecedence` merges them. Values are Go's `ParseBool`.
fn feature_gates(flags: &[String], config: &ConfigFile) -> BTreeMap<String, bool> {
    let mut gates = config.feature_gates.clone();
    let from_flags = flag_values(flags, "--feature-gates")
        .flat_map(|list| list.split(','))
        .filter_map(|pair| pair.split_once('='))
        .filter_map(|(gate, on)| {
            let on = match on.trim() {
                "1" | "t" | "T" | "true" | "TRUE" | "True" => true,
                "0" | "f" | "F" | "false" | "FALSE" | "False" => false,
                _ => return None,
            };
            Some((gate.trim().to_owned(), on))
        });
    gates.extend(from_flags);
    gates
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::FakeHost;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(ToString::to_string).collect()
    }

    /// The root `kubelet_of` finds in a command line, on a fake host whose
    /// process 7 shares its mount namespace and has no files.
    fn root_of(command: &[&str]) -> Option<(&'static str, PathBuf)> {
        let fake = FakeHost::new();
        fake.process(7, command, None);
        kubelet_of(&fake.host(), 7, &args(command))
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
    fn the_runtime_endpoint_comes_from_the_flag_the_config_or_the_default() {
        let config = ConfigFile::parse("containerRuntimeEndpoint: unix:///run/crio/crio.sock\n");
        let args = |list: &[&str]| list.iter().map(|arg| (*arg).to_owned()).collect::<Vec<_>>();
        let endpoint = |program, argv: &[String], config: &ConfigFile| {
            runtime_endpoint(program, argv, argv, config).display().to_string()
        };
        assert_eq!(endpoint("kubelet", &args(&["kubelet"]), &config), "/run/crio/crio.sock");
        let flagged = args(&["kubelet", "--container-runtime-endpoint=unix:///x/c.sock"]);
        assert_eq!(endpoint("kubelet", &flagged, &config), "/x/c.sock");
        let none = ConfigFile::default();
        assert_eq!(
            endpoint("kubelet", &args(&["kubelet"]), &none),
            "/run/containerd/containerd.sock"
        );
        assert_eq!(
            endpoint("k3s", &args(&["k3s", "agent"]), &none),
            "/run/k3s/containerd/containerd.sock"
        );
    }

    #[test]
    fn feature_gates_come_from_the_config_file_and_the_flags_win() {
        let config = ConfigFile::parse(
            "featureGates:\n  DynamicResourceAllocation: true\n  Other: false\n  Odd: maybe\n",
        );
        let flags = args(&["--feature-gates=Other=true,Third=F", "--feature-gates", "Fourth=1"]);
        let gates = feature_gates(&flags, &config);
        let expected = [
            ("DynamicResourceAllocation", true),
            ("Fourth", true),
            ("Other", true),
            ("Third", false),
        ];
        assert_eq!(gates, expected.map(|(gate, on)| (gate.to_owned(), on)).into());
        let json = ConfigFile::parse("{\"featureGates\": {\"DynamicResourceAllocation\": false}}");
        assert_eq!(json.feature_gates.get("DynamicResourceAllocation"), Some(&false));
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
            assert_eq!(
                ConfigFile::parse(config).hostname_override.as_deref(),
                expected,
                "{config}"
            );
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
        let listening = fake.host().listening_unix_sockets(Some(kubelets[0].pid)).unwrap();
        assert_eq!(kubelets[0].files, ReadThrough::ProcRoot);
        assert_eq!(
            listening.into_iter().collect::<Vec<_>>(),
            [(PathBuf::from("/var/lib/kubelet/a.sock"), 1)]
        );
        // The host's own table is pid 1's, which this fake host lacks.
        assert_eq!(
            fake.host().listening_unix_sockets(None),
            Err(PathBuf::from("/proc/1/net/unix"))
        );
    }
}
