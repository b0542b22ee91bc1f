//! `kpm run`: the plugin manager on a node.
//!
//! It builds the kubelet from its flags (`--disable` takes the names of
//! [`kpm::PluginKind`] through [`plugin_kind`], so the CLI keeps no list of
//! kinds of its own; periods are range-checked by clap), runs it, and serves
//! the status API on `kpm.sock` and, with `--metrics-addr`, the metrics.
//! Before anything else it raises the soft open-files limit and sizes the
//! fd budget ([`init_fd_budget`]); the kubelet, the status API and the
//! metrics all pay from it. Its servers accept through the transport's
//! accept path (`kpm_status`), and the status API's
//! listener keeps a spare fd that it gives up to accept a client when the
//! process is out of fds, so `kpm list` answers at the limit
//! (`tests/fd_budget.rs`, `tests/server_budget.rs`). SIGINT and SIGTERM
//! stop it cleanly; its own sockets are removed only while they are still
//! the files it bound.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kpm::kube::{self, KubePublisher};
use kpm::{Kubelet, KubeletBuilder, LivenessConfig, PluginKind};
use kpm_status::metrics::{self, Metrics};
use kpm_status::server::StatusServer;

use crate::args::RootArgs;
use crate::error::CliError;
use crate::setup::{
    LogFormat, api_client, init_fd_budget, init_logging, node_name, plugin_kind, shutdown_signal,
};

#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    root: RootArgs,
    /// The directory plugins create registration sockets in
    /// [default: <ROOT_DIR>/plugins_registry].
    #[arg(long, value_name = "DIR", env = "KPM_REGISTRY_DIR")]
    registry_dir: Option<PathBuf>,
    /// The directory of device-plugin sockets, where kpm serves kubelet.sock
    /// for device plugins that register directly [default: <ROOT_DIR>/device-plugins].
    #[arg(long, value_name = "DIR", env = "KPM_DEVICE_PLUGIN_DIR")]
    device_plugin_dir: Option<PathBuf>,
    /// Plugin types to run without a handler, comma-separated; their plugins
    /// are told that no handler is registered for their type.
    #[arg(
        long,
        value_parser = plugin_kind(),
        value_name = "TYPES",
        value_delimiter = ',',
        env = "KPM_DISABLE"
    )]
    disable: Vec<PluginKind>,
    /// Serve Prometheus metrics (and /healthz) over HTTP on this address,
    /// for example 127.0.0.1:9464. Off by default.
    #[arg(long, value_name = "HOST:PORT", env = "KPM_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "KPM_LOG_FORMAT")]
    log_format: LogFormat,
    /// Period of the full re-listing of the registry directory, in seconds,
    /// which repairs anything filesystem events missed (0: only on overflow).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(..=crate::args::MAX_PERIOD_SECS),
        env = "KPM_RESYNC_PERIOD"
    )]
    resync_period: u64,
    /// Period of the liveness probe: every registered plugin is asked for
    /// GetInfo, on a connection of its own; one that fails
    /// --liveness-failures probes in a row, or whose socket refuses
    /// connections, is deregistered and registered anew when it answers again.
    /// Probes catch plugins that hang; exits are caught at once by
    /// --watch-plugin-exits (0: no probes).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(..=crate::args::MAX_PERIOD_SECS),
        env = "KPM_LIVENESS_PERIOD"
    )]
    liveness_period: u64,
    /// Failed liveness probes in a row before a plugin is deregistered.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 3,
        value_parser = clap::value_parser!(u32).range(1..),
        env = "KPM_LIVENESS_FAILURES"
    )]
    liveness_failures: u32,
    /// Watch the process serving each registration socket (learned from the
    /// connection at registration) and, when it exits, deregister the plugin
    /// at once if its socket refuses connections. Without a pidfd-capable
    /// kernel, or when kpm cannot see the plugin's pid namespace, exits are
    /// left to the probes.
    #[arg(
        long,
        value_name = "BOOL",
        default_value_t = true,
        action = clap::ArgAction::Set,
        env = "KPM_WATCH_PLUGIN_EXITS"
    )]
    watch_plugin_exits: bool,
    /// Publish to the Kubernetes API server of this kubeconfig (its current
    /// context): CSINode and the Node's CSI annotation and labels, device
    /// capacity, ResourceSlice cleanup. Inside a pod the service account is
    /// used without it; elsewhere, without it, everything stays in memory.
    #[arg(long, value_name = "PATH", env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The Node kpm publishes for; kpm never creates it [default: the
    /// hostname, lower-cased, as with the kubelet].
    #[arg(long, value_name = "NAME", env = "KPM_NODE_NAME")]
    node_name: Option<String>,
    /// How long a DRA driver may stay without a connected instance before
    /// its ResourceSlices on this node are deleted, in seconds.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = kpm::dra::DEFAULT_CLEANUP_GRACE.as_secs(),
        value_parser = clap::value_parser!(u64).range(..=crate::args::MAX_PERIOD_SECS),
        env = "KPM_DRA_CLEANUP_GRACE"
    )]
    dra_cleanup_grace: u64,
    /// How long a device-plugin resource whose plugin went away is kept,
    /// its devices unhealthy, before it is removed, in seconds.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = kpm::device::DEFAULT_GRACE_PERIOD.as_secs(),
        value_parser = clap::value_parser!(u64).range(..=crate::args::MAX_PERIOD_SECS),
        env = "KPM_DEVICE_CLEANUP_GRACE"
    )]
    device_cleanup_grace: u64,
    /// How long a CSI driver an earlier run published on the Node and its
    /// CSINode has to register before it is withdrawn, in seconds.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = kpm::kube::DEFAULT_CSI_CLEANUP_GRACE.as_secs(),
        value_parser = clap::value_parser!(u64).range(..=crate::args::MAX_PERIOD_SECS),
        env = "KPM_CSI_CLEANUP_GRACE"
    )]
    csi_cleanup_grace: u64,
    /// How long a client of kpm's servers (kubelet.sock, the status socket,
    /// metrics) may take to send its HTTP/2 preface or first HTTP/1 request
    /// before its connection is closed, in seconds.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = kpm::transport::DEFAULT_HANDSHAKE_TIMEOUT.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..=crate::args::MAX_PERIOD_SECS),
        env = "KPM_HANDSHAKE_TIMEOUT"
    )]
    handshake_timeout: u64,
    /// Refresh a CSI driver's allocatable count (its CSINode entry's
    /// allocatable.count, from NodeGetInfo's max_volumes_per_node) on this
    /// period, as a CSIDriver with nodeAllocatableUpdatePeriodSeconds has the
    /// kubelet do: DRIVER=SECONDS, repeated or comma-separated; below 10 is
    /// raised to 10. With --kubeconfig, the CSIDriver objects give the
    /// period of the drivers not named here.
    #[arg(
        long,
        value_name = "DRIVER=SECONDS",
        value_delimiter = ',',
        value_parser = driver_period,
        env = "KPM_CSI_ALLOCATABLE_UPDATE_PERIOD"
    )]
    csi_allocatable_update_period: Vec<(String, Duration)>,
}

/// `DRIVER=SECONDS` of --csi-allocatable-update-period.
fn driver_period(value: &str) -> Result<(String, Duration), String> {
    let (driver, seconds) =
        value.split_once('=').ok_or_else(|| format!("{value:?} is not DRIVER=SECONDS"))?;
    if driver.is_empty() {
        return Err(format!("{value:?} names no driver"));
    }
    match seconds.parse::<u64>() {
        Ok(seconds) if seconds <= crate::args::MAX_PERIOD_SECS => {
            Ok((driver.to_owned(), Duration::from_secs(seconds)))
        }
        _ => Err(format!(
            "{seconds:?} is not a number of seconds up to {}",
            crate::args::MAX_PERIOD_SECS
        )),
    }
}

pub(crate) async fn run(args: RunArgs) -> Result<(), CliError> {
    init_logging(args.log_format)?;
    crate::heap::return_freed_pages_at_once();
    let mut builder = configured(&args).fd_budget(init_fd_budget().clone());
    if let Some(publisher) = kubernetes(&args).await? {
        tracing::info!(node = publisher.node_name(), "publishing to the Kubernetes API");
        builder = builder.kubernetes(publisher);
    }
    let kubelet = builder.build()?;
    let handle = kubelet.handle();
    let handshake = Duration::from_secs(args.handshake_timeout);
    let metrics = match args.metrics_addr {
        Some(addr) => {
            let metrics = Metrics::new(handle.clone(), crate::heap::stats);
            let serving = metrics::serve(addr, Arc::clone(&metrics), handshake).await?;
            Some((tokio::spawn(metrics.observe_latency()), serving))
        }
        None => None,
    };
    let status = StatusServer::start(&args.root.status_socket(), handle, handshake).await?;
    let result = kubelet.run(shutdown_signal()?).await.map_err(CliError::from);
    status.stop();
    if let Some((counting, serving)) = metrics {
        counting.abort();
        serving.abort();
    }
    result
}

/// The kubelet of `kpm run` and `kpm probe`: the kubelet's handlers, but
/// for the `disabled` kinds, on `root_dir`.
pub(crate) fn kubelet(root_dir: &Path, disabled: &[PluginKind]) -> KubeletBuilder {
    Kubelet::builder().root_dir(root_dir).disable_all(disabled.iter().copied())
}

/// The Kubernetes publishers, if there is an API server to publish to.
async fn kubernetes(args: &RunArgs) -> Result<Option<KubePublisher>, CliError> {
    let Some(client) = api_client(args.kubeconfig.as_deref()).await? else {
        return Ok(None);
    };
    let node = node_name(args.node_name.as_deref())?;
    let config =
        kube::KubeConfig::default().csi_cleanup_grace(Duration::from_secs(args.csi_cleanup_grace));
    Ok(Some(KubePublisher::new(client, node, config)?))
}

/// The kubelet `kpm run` runs, as its flags configure it.
fn configured(args: &RunArgs) -> KubeletBuilder {
    let dra =
        kpm::dra::DraConfig::default().cleanup_grace(Duration::from_secs(args.dra_cleanup_grace));
    let device = kpm::device::DeviceConfig::default()
        .grace_period(Duration::from_secs(args.device_cleanup_grace))
        .handshake_timeout(Duration::from_secs(args.handshake_timeout));
    let csi = args
        .csi_allocatable_update_period
        .iter()
        .fold(kpm::csi::CsiConfig::default(), |config, (driver, period)| {
            config.allocatable_update_period(driver, *period)
        });
    let mut builder = kubelet(&args.root.root_dir, &args.disable)
        .csi_config(csi)
        .dra_config(dra)
        .device_config(device)
        .manager(|manager| {
            let liveness = LivenessConfig::default()
                .period(
                    (args.liveness_period > 0).then(|| Duration::from_secs(args.liveness_period)),
                )
                .failure_threshold(args.liveness_failures)
                .watch_exits(args.watch_plugin_exits);
            manager.resync_period(Duration::from_secs(args.resync_period)).liveness(Some(liveness))
        });
    if let Some(dir) = &args.registry_dir {
        builder = builder.registry_dir(dir);
    }
    if let Some(dir) = &args.device_plugin_dir {
        builder = builder.device_plugin_dir(dir);
    }
    builder
}
