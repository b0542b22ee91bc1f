//! `kpm doctor`: why each plugin on a live node is or is not registered,
//! read-only, next to the real kubelet; a thin command on `kpm-doctor`.
//!
//! With an API server (`--kubeconfig`, or in a pod), it holds the plugins
//! against what the cluster shows of the node. It never notifies a plugin,
//! never creates, removes or renames anything, never writes to the API
//! server, and closes every connection when its call is done.
//!
//! With `--cluster` it judges no node itself: it reads back, read-only,
//! what every node's doctor published and what the API server shows of
//! each driver, and prints the fleet view (`kpm_doctor::read_fleet`).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use kpm_doctor::{Doctor, DoctorConfig, FleetConfig, Host};

use crate::inspect::JudgeArgs;
use crate::{CliError, OutputFormat};

#[derive(Debug, clap::Args)]
pub(crate) struct DoctorArgs {
    /// The kubelet's root directory, on the host [default: the `--root-dir`
    /// of a running kubelet (also inside MicroK8s' kubelite or k3s), else
    /// /var/lib/kubelet].
    #[arg(long, value_name = "DIR", env = "KPM_ROOT_DIR")]
    root_dir: Option<PathBuf>,
    /// Where the host's `/` is in this process's file system, in a pod that
    /// mounts it elsewhere (`kubectl debug node/NAME` puts it at /host):
    /// /proc, the kubelet root and the plugins' sockets are read under it.
    #[arg(long, value_name = "DIR", default_value = "/", env = "KPM_HOST_ROOT")]
    host_root: PathBuf,
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
    /// Judge no node here: read, from the API server, what every node's
    /// doctor (`kpm doctor --watch`) published, with CSIDrivers, CSINodes,
    /// device capacity and ResourceSlices, and show for each driver the
    /// nodes it is registered on and why not on the others, and for each
    /// node its doctor's state. Exits 1 when a node's doctor reports a
    /// failure or is silent. Reads only; needs `list` on nodes, csidrivers,
    /// csinodes and resourceslices. Uses --kubeconfig, else the service
    /// account in a pod, else ~/.kube/config.
    #[arg(long)]
    cluster: bool,
    /// With --cluster: only the nodes this label selector selects
    /// (`node-role.kubernetes.io/gpu`, `pool in (a,b)`).
    #[arg(short = 'l', long, value_name = "SELECTOR", requires = "cluster")]
    selector: Option<String>,
    /// With --cluster: how many objects each list request asks for.
    #[arg(
        long,
        value_name = "N",
        default_value_t = kpm_doctor::DEFAULT_PAGE_SIZE,
        value_parser = clap::value_parser!(u32).range(1..),
        requires = "cluster"
    )]
    page_size: u32,
    /// With --cluster: a doctor whose last heartbeat is older than this
    /// many seconds is silent (two of its heartbeat periods by default).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = kpm_doctor::DEFAULT_STALE_AFTER.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..=crate::MAX_PERIOD_SECS),
        requires = "cluster"
    )]
    stale_after: u64,
}

impl DoctorArgs {
    /// The doctor these flags describe.
    fn config(&self) -> DoctorConfig {
        let mut config = DoctorConfig::default()
            .host(Host::under(&self.host_root))
            .disabled(self.judge.disable.iter().map(|kind| kind.kind()).collect())
            .timeout(self.judge.timeout());
        if let Some(root) = &self.root_dir {
            config = config.root_dir(root);
        }
        if !self.other_roots.is_empty() {
            config = config.other_roots(self.other_roots.clone());
        }
        config
    }
}

pub(crate) async fn doctor(args: DoctorArgs) -> Result<bool, CliError> {
    if args.cluster {
        return fleet(&args).await;
    }
    let doctor = Doctor::new(args.config())?;
    let objects = match crate::run::api_client(args.kubeconfig.as_deref()).await? {
        Some(client) => {
            let name = crate::run::node_name(args.node_name.as_deref())?;
            let config = kpm::kube::KubeConfig::default().request_timeout(args.judge.timeout());
            Some(kpm::kube::observe_node(client, &name, config).await)
        }
        None => None,
    };
    let report = doctor.examine(objects.as_ref()).await;
    let text = match args.output {
        OutputFormat::Json => json(&report)?,
        OutputFormat::Table => kpm_doctor::render_table(&report),
    };
    std::io::stdout().lock().write_all(text.as_bytes()).map_err(CliError::Output)?;
    Ok(report.ok)
}

/// `kpm doctor --cluster`: the fleet view; `Ok(false)` when a node's doctor
/// reports a failure or is silent.
async fn fleet(args: &DoctorArgs) -> Result<bool, CliError> {
    let client = match crate::run::api_client(args.kubeconfig.as_deref()).await? {
        Some(client) => client,
        // As kubectl does, for `kubectl kpm doctor --cluster`.
        None => match home_kubeconfig() {
            Some(path) => kpm::kube::client_from_kubeconfig(&path).await?,
            None => return Err(CliError::NoApiServer),
        },
    };
    let mut config = FleetConfig::default()
        .page_size(args.page_size)
        .request_timeout(args.judge.timeout())
        .stale_after(Duration::from_secs(args.stale_after));
    if let Some(selector) = &args.selector {
        config = config.label_selector(selector);
    }
    let objects = kpm_doctor::read_fleet(&client, &config).await?;
    tracing::debug!(nodes = objects.nodes.len(), requests = objects.requests, "read the fleet");
    let fleet = kpm_doctor::judge_fleet(&objects, SystemTime::now(), config.stale_after);
    drop(objects);
    let text = match args.output {
        OutputFormat::Json => json(&fleet)?,
        OutputFormat::Table => kpm_doctor::render_fleet_table(&fleet),
    };
    std::io::stdout().lock().write_all(text.as_bytes()).map_err(CliError::Output)?;
    Ok(fleet.ok())
}

/// `~/.kube/config`, when it exists.
fn home_kubeconfig() -> Option<PathBuf> {
    let path = Path::new(&std::env::var_os("HOME")?).join(".kube/config");
    path.is_file().then_some(path)
}

fn json(value: &impl serde::Serialize) -> Result<String, CliError> {
    let mut json = serde_json::to_string_pretty(value)
        .map_err(|err| CliError::Output(std::io::Error::other(err)))?;
    json.push('\n');
    Ok(json)
}
