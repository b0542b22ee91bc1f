//! `kpm doctor`: why each plugin on a live node is or is not registered,
//! read-only, next to the real kubelet; a thin command on `kpm-doctor`.
//!
//! With an API server (`--kubeconfig`, or in a pod), it holds the plugins
//! against what the cluster shows of the node. It never notifies a plugin,
//! never creates, removes or renames anything, never writes to the API
//! server, and closes every connection when its call is done.

use std::io::Write as _;
use std::path::PathBuf;

use kpm_doctor::{Doctor, DoctorConfig, Host};

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
        OutputFormat::Json => {
            let mut json = serde_json::to_string_pretty(&report)
                .map_err(|err| CliError::Output(std::io::Error::other(err)))?;
            json.push('\n');
            json
        }
        OutputFormat::Table => kpm_doctor::render_table(&report),
    };
    std::io::stdout().lock().write_all(text.as_bytes()).map_err(CliError::Output)?;
    Ok(report.ok)
}
