//! `kpm doctor`: why each plugin on a live node is or is not registered,
//! read-only, next to the real kubelet.
//!
//! It finds the kubelet's root (`--root-dir`, else a running kubelet's,
//! MicroK8s' kubelite's or k3s's, else the default), judges every entry of
//! its registry and every socket of `device-plugins/` (but `kubelet.sock`)
//! with the inspection `kpm run` would register with (the kubelet's rules
//! and its 1 s `GetInfo` timeout), names the registries of other well-known roots that hold
//! sockets nobody watches, and the sockets still listening whose file is
//! gone. With an API server (`--kubeconfig`, or in a pod), it holds the
//! plugins against what the cluster shows of the node (`cluster.rs`). It
//! never notifies a plugin, never creates, removes or renames anything,
//! never writes to the API server, and closes every connection when its
//! call is done.

mod checkpoint;
mod cluster;
mod host;
mod judge;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::inspect::{self, JudgeArgs};
use crate::{CliError, OutputFormat};
pub(crate) use judge::Verdict;

/// The roots other distributions give the kubelet, checked for registries
/// that no running kubelet watches (the DaemonSet then mounts the wrong one).
const WELL_KNOWN_ROOTS: &[&str] =
    &["/var/lib/kubelet", "/var/lib/k0s/kubelet", "/var/snap/microk8s/common/var/lib/kubelet"];

#[derive(Debug, clap::Args)]
pub(crate) struct DoctorArgs {
    /// The kubelet's root directory [default: the `--root-dir` of a running
    /// kubelet (also inside MicroK8s' kubelite or k3s), else /var/lib/kubelet].
    #[arg(long, value_name = "DIR", env = "KPM_ROOT_DIR")]
    root_dir: Option<PathBuf>,
    /// Other kubelet roots to look for registries nobody watches; repeat for
    /// several [default: the well-known roots of kubeadm, k0s and microk8s].
    #[arg(long = "other-root", value_name = "DIR")]
    other_roots: Vec<PathBuf>,
    #[command(flatten)]
    judge: JudgeArgs,
    /// Hold the plugins against what this kubeconfig's API server shows of
    /// the node: CSINode and the CSI node-id annotation, device capacity,
    /// ResourceSlices. Inside a pod the service account is used without it.
    #[arg(long, value_name = "PATH", env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The node's name in the cluster [default: the hostname, lower-cased,
    /// as with the kubelet].
    #[arg(long, value_name = "NAME", env = "KPM_NODE_NAME")]
    node_name: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
    output: OutputFormat,
}

/// What the doctor saw on the node.
#[derive(Debug, Serialize)]
struct Report {
    /// The kubelet root judged by, and how it was found.
    root_dir: PathBuf,
    root_from: String,
    /// The kubelets running on this host.
    kubelets: Vec<host::KubeletProcess>,
    /// The node the cluster was asked about, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    /// One row per registry entry, device-plugin socket and deleted socket.
    plugins: Vec<judge::Row>,
    /// Findings about the node rather than one socket.
    findings: Vec<Finding>,
    /// What could not be looked at, and why.
    unseen: Vec<String>,
    /// No plugin and no finding fails.
    ok: bool,
}

/// A finding about the node.
#[derive(Debug, Serialize)]
struct Finding {
    verdict: Verdict,
    path: PathBuf,
    reason: String,
    hint: String,
}

pub(crate) async fn doctor(args: DoctorArgs) -> Result<bool, CliError> {
    let kubelets = host::kubelets();
    let (root_dir, root_from) = match (&args.root_dir, kubelets.first()) {
        (Some(dir), _) => (dir.clone(), "--root-dir".to_owned()),
        (None, Some(kubelet)) => (kubelet.root_dir.clone(), kubelet.describe()),
        (None, None) => (PathBuf::from(host::DEFAULT_ROOT), "the default".to_owned()),
    };
    let timeout = args.judge.timeout();
    let get_info = kpm::ExecutorConfig::default().get_info_timeout;
    let kubelet = inspect::kubelet(&root_dir, &args.judge.disable, timeout, get_info)?;
    let mut unseen = Vec::new();
    let mut plugins = judge::registry(&kubelet, &root_dir, &mut unseen).await;
    plugins.extend(judge::device_plugins(&kubelet, &root_dir, &plugins, &mut unseen).await);
    match host::listening_unix_paths() {
        Some(listening) => plugins.extend(judge::deleted(&root_dir, &listening)),
        None => {
            unseen.push("/proc/net/unix: cannot be read; deleted sockets not looked for".into());
        }
    }
    judge::mark_duplicates(&mut plugins);

    let mut findings = Vec::new();
    let mut node = None;
    if let Some(client) = crate::run::api_client(args.kubeconfig.as_deref()).await? {
        let name = crate::run::node_name(args.node_name.as_deref())?;
        let config = kpm::kube::KubeConfig::default().request_timeout(timeout);
        let objects = kpm::kube::observe_node(client, &name, config).await;
        cluster::compare(&objects, &mut plugins, &mut findings, &mut unseen);
        node = Some(name);
    }
    let other_roots: Vec<PathBuf> = if args.other_roots.is_empty() {
        WELL_KNOWN_ROOTS.iter().map(PathBuf::from).collect()
    } else {
        args.other_roots.clone()
    };
    findings.extend(unwatched_registries(&root_dir, &other_roots, &kubelets));
    let ok = plugins.iter().all(|row| !row.verdict.fails())
        && findings.iter().all(|finding| !finding.verdict.fails());
    let report = Report { root_dir, root_from, kubelets, node, plugins, findings, unseen, ok };
    let text = match args.output {
        OutputFormat::Json => {
            let mut json = serde_json::to_string_pretty(&report)
                .map_err(|err| CliError::Output(std::io::Error::other(err)))?;
            json.push('\n');
            json
        }
        OutputFormat::Table => table(&report),
    };
    std::io::stdout().lock().write_all(text.as_bytes()).map_err(CliError::Output)?;
    Ok(report.ok)
}

/// The registries of `roots` (but the one judged) that hold sockets while
/// no running kubelet has that root.
fn unwatched_registries(
    root_dir: &Path,
    roots: &[PathBuf],
    kubelets: &[host::KubeletProcess],
) -> Vec<Finding> {
    roots
        .iter()
        .filter(|root| *root != root_dir && kubelets.iter().all(|k| &k.root_dir != *root))
        .filter_map(|root| {
            let registry = root.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME);
            let entries = kpm::registry::survey(&registry).ok()?;
            let sockets = entries
                .iter()
                .filter(|(_, entry)| matches!(entry, kpm::registry::RegistryEntry::Socket))
                .count();
            (sockets > 0).then(|| Finding {
                verdict: Verdict::UnwatchedRegistry,
                reason: format!(
                    "{sockets} socket(s) in a registry no running kubelet watches (the kubelet's root is {})",
                    root_dir.display()
                ),
                hint: format!(
                    "the plugins' DaemonSets mount {} as the kubelet root: mount {} instead \
                     (node-driver-registrar's --kubelet-registration-path too)",
                    root.display(),
                    root_dir.display()
                ),
                path: registry,
            })
        })
        .collect()
}

/// The report as a table, verdict first, then each failure's reason and fix.
fn table(report: &Report) -> String {
    let mut text =
        format!("kubelet root: {} (from {})\n", report.root_dir.display(), report.root_from);
    let mut rows = comfy_table::Table::new();
    rows.load_preset(comfy_table::presets::NOTHING);
    rows.set_header(["VERDICT", "TYPE", "NAME", "SOCKET", "SERVED BY"]);
    for row in &report.plugins {
        let socket = row.path.strip_prefix(&report.root_dir).unwrap_or(&row.path);
        rows.add_row([
            row.verdict.name().to_owned(),
            row.plugin_type.clone().unwrap_or_else(|| "-".into()),
            row.name.clone().unwrap_or_else(|| "-".into()),
            socket.display().to_string(),
            row.served_by.as_ref().map_or_else(|| "-".into(), judge::served_by),
        ]);
    }
    text.push_str(&rows.trim_fmt());
    text.push('\n');
    let explained = report
        .plugins
        .iter()
        .filter(|row| row.verdict != Verdict::Ok)
        .map(|row| (row.verdict, &row.path, &row.reason, &row.hint))
        .chain(report.findings.iter().map(|f| (f.verdict, &f.path, &f.reason, &f.hint)));
    for (verdict, path, reason, hint) in explained {
        let _ = write!(text, "\n{}: {}\n  {reason}\n", verdict.name(), path.display());
        if !hint.is_empty() {
            let _ = writeln!(text, "  fix: {hint}");
        }
    }
    for what in &report.unseen {
        let _ = write!(text, "\nnot seen: {what}\n");
    }
    let failing = report.plugins.iter().filter(|row| row.verdict.fails()).count();
    let _ = write!(
        text,
        "\n{} entries: {} ok, {failing} failing",
        report.plugins.len(),
        report.plugins.iter().filter(|row| row.verdict == Verdict::Ok).count(),
    );
    match report.findings.len() {
        0 => text.push('\n'),
        n => {
            let _ = writeln!(text, "; {n} finding(s) about the node");
        }
    }
    text
}
