//! `kpm run`: the plugin manager on a node.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use kpm::csi::{CsiConfig, CsiHandler, InMemoryNodeInfo};
use kpm::device::{DeviceConfig, DeviceManager, KubeletSocket};
use kpm::dra::{DraConfig, DraManager, InMemoryCleanup};
use kpm::{LivenessConfig, PluginManager};
use tokio::signal::unix::{SignalKind, signal};

use crate::metrics::{self, Metrics};
use crate::{CliError, RootArgs, status_api};

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
    #[arg(long, value_enum, value_name = "TYPES", value_delimiter = ',', env = "KPM_DISABLE")]
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
    #[arg(long, value_name = "SECONDS", default_value_t = 60, env = "KPM_RESYNC_PERIOD")]
    resync_period: u64,
    /// Period of the liveness probe: every registered plugin is asked for
    /// GetInfo; one that fails --liveness-failures probes in a row, or whose
    /// socket refuses connections, is deregistered and registered anew when
    /// it answers again (0: off, as in the kubelet).
    #[arg(long, value_name = "SECONDS", default_value_t = 10, env = "KPM_LIVENESS_PERIOD")]
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The plugin types kpm has handlers for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PluginKind {
    Csi,
    Device,
    Dra,
}

pub(crate) async fn run(args: RunArgs) -> Result<(), CliError> {
    init_logging(args.log_format)?;
    let root = &args.root.root_dir;
    let options = NodeOptions {
        registry_dir: args.registry_dir.clone(),
        device_plugin_dir: args.device_plugin_dir.clone(),
        disable: args.disable.clone(),
        resync_period: Duration::from_secs(args.resync_period),
        liveness: (args.liveness_period > 0).then(|| LivenessConfig {
            period: Duration::from_secs(args.liveness_period),
            failure_threshold: args.liveness_failures,
            ..LivenessConfig::default()
        }),
    };
    let node = Node::start(root, &options).await?;
    let metrics = match args.metrics_addr {
        Some(addr) => {
            let metrics = Metrics::new(node.sources.clone());
            let serving = metrics::serve(addr, Arc::clone(&metrics)).await?;
            Some((tokio::spawn(metrics.count_events()), serving))
        }
        None => None,
    };
    let status = StatusServer::start(&args.root.status_socket(), node.sources.clone()).await?;
    let result = node.sources.manager.run(shutdown_signal()?).await.map_err(CliError::from);
    status.stop();
    if let Some((counting, serving)) = metrics {
        counting.abort();
        serving.abort();
    }
    node.stop().await;
    result
}

/// What `kpm run` sets up besides the defaults.
#[derive(Debug)]
pub(crate) struct NodeOptions {
    pub(crate) registry_dir: Option<PathBuf>,
    pub(crate) device_plugin_dir: Option<PathBuf>,
    pub(crate) disable: Vec<PluginKind>,
    pub(crate) resync_period: Duration,
    /// `None`: no liveness probing.
    pub(crate) liveness: Option<LivenessConfig>,
}

/// A plugin manager with the handlers of every enabled type, as `kpm run`
/// and `kpm demo` use it. Not running yet: see `sources.manager.run`.
pub(crate) struct Node {
    pub(crate) sources: status_api::Sources,
    kubelet_socket: Option<KubeletSocket>,
}

impl Node {
    /// Creates the root directory and the handlers, and serves `kubelet.sock`.
    pub(crate) async fn start(root: &Path, options: &NodeOptions) -> Result<Self, CliError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(kpm::api::OWN_DIR_MODE)
            .create(root)
            .map_err(|source| CliError::CreateRoot { path: root.to_path_buf(), source })?;
        let enabled = |kind| !options.disable.contains(&kind);
        let registry_dir = options
            .registry_dir
            .clone()
            .unwrap_or_else(|| root.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME));
        let mut builder = PluginManager::builder()
            .registry_dir(registry_dir)
            .resync_period(options.resync_period)
            .liveness(options.liveness);

        // CSI node info is kept in memory and served by the status API; a node
        // agent with an API server would plug a Kubernetes sink in instead.
        let node = Arc::new(InMemoryNodeInfo::default());
        let csi = CsiHandler::new(node.clone(), CsiConfig::default());
        let csi_drivers = csi.drivers();
        if enabled(PluginKind::Csi) {
            builder = builder.handler(kpm::api::CSI_PLUGIN, Arc::new(csi));
        }

        let devices = DeviceManager::new(DeviceConfig::default());
        let kubelet_socket = if enabled(PluginKind::Device) {
            let dir = options
                .device_plugin_dir
                .clone()
                .unwrap_or_else(|| root.join(kpm::api::DEVICE_PLUGINS_DIR_NAME));
            builder = builder.handler(kpm::api::DEVICE_PLUGIN, devices.clone());
            Some(devices.serve_registration(&dir).await?)
        } else {
            None
        };

        // Without an API server there are no ResourceSlices to wipe: the
        // cleanup is recorded (and logged) instead.
        let dra_config = DraConfig { root_dir: Some(root.to_path_buf()), ..DraConfig::default() };
        let dra = DraManager::new(dra_config, Arc::new(InMemoryCleanup::default()));
        if enabled(PluginKind::Dra) {
            builder = builder.handler(kpm::api::DRA_PLUGIN, dra.clone());
        }
        let manager = Arc::new(builder.build());
        let sources = status_api::Sources { manager, csi_drivers, node, devices, dra };
        Ok(Self { sources, kubelet_socket })
    }

    /// Stops serving `kubelet.sock` and closes the plugins' connections.
    pub(crate) async fn stop(self) {
        if let Some(kubelet_socket) = self.kubelet_socket {
            kubelet_socket.shutdown().await;
        }
        self.sources.devices.shutdown().await;
        self.sources.dra.shutdown().await;
    }
}

/// The status API server and the socket file it owns.
struct StatusServer {
    socket: kpm_api::uds::BoundSocket,
    task: tokio::task::JoinHandle<()>,
}

impl StatusServer {
    async fn start(socket: &Path, sources: status_api::Sources) -> Result<Self, CliError> {
        let (incoming, bound) = kpm_api::uds::bind_with_mode(socket, kpm_api::uds::OWNER_ONLY)
            .await
            .map_err(CliError::StatusSocket)?;
        let listener = incoming.into_listener();
        let router = status_api::router(sources);
        let path = socket.to_path_buf();
        let task = tokio::spawn(async move {
            if let Err(source) = axum::serve(listener, router).await {
                tracing::error!(socket = %path.display(), error = %source, "status API stopped");
            }
        });
        tracing::info!(socket = %socket.display(), "status API listening");
        Ok(Self { socket: bound, task })
    }

    /// Removes the socket file if it is still ours, and stops serving.
    fn stop(self) {
        if let Err(err) = self.socket.remove() {
            let socket = self.socket.path().display();
            tracing::warn!(%socket, error = %err, "cannot remove status socket");
        }
        self.task.abort();
    }
}

/// Completes on the first SIGINT or SIGTERM.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, CliError> {
    let mut interrupt = signal(SignalKind::interrupt()).map_err(CliError::Signal)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(CliError::Signal)?;
    Ok(async move {
        let name = tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        };
        tracing::info!(signal = name, "shutting down");
    })
}

fn init_logging(format: LogFormat) -> Result<(), CliError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|err| CliError::Logging(err.to_string()))
}
