//! What every subcommand that runs for a while sets up alike: the API
//! server's client and the node's name, logging, the fd budget, the signal
//! that stops it, and the flag values the subcommands share (`--disable`'s
//! plugin kinds, `--log-format`). `kpm run` and `kpm doctor` both take them
//! from here, so that neither reaches into the other.

use std::path::Path;

use clap::ValueEnum;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use kpm::PluginKind;
use kpm::kube;
use kpm::transport::fd::FdBudget;
use tokio::signal::unix::{SignalKind, signal};

use crate::error::CliError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// Parses a plugin kind by its name (`csi`, `device`, `dra`) and offers
/// every kind's name, as a value enum would: the values of `--disable`,
/// taken from [`kpm::PluginKind`] so that the CLI has no list of its own.
pub(crate) fn plugin_kind() -> impl TypedValueParser<Value = PluginKind> {
    PossibleValuesParser::new(PluginKind::ALL.map(PluginKind::name))
        // The possible values let only the kinds' names through.
        .try_map(|name| PluginKind::from_name(&name).ok_or("not a plugin kind"))
}

/// A client of the API server: through `kubeconfig` (`--kubeconfig` or
/// `KUBECONFIG`), or the service account inside a pod; none otherwise.
pub(crate) async fn api_client(
    kubeconfig: Option<&Path>,
) -> Result<Option<kube::Client>, CliError> {
    Ok(match kubeconfig {
        Some(path) => Some(kube::client_from_kubeconfig(path).await?),
        None => kube::in_cluster_client()?,
    })
}

/// The node's name: `given`, else the kubelet's default, the hostname
/// lower-cased.
pub(crate) fn node_name(given: Option<&str>) -> Result<String, CliError> {
    if let Some(name) = given {
        return Ok(name.to_owned());
    }
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(CliError::NodeName)?;
    Ok(name.trim().to_lowercase())
}

/// Completes on the first SIGINT or SIGTERM.
pub(crate) fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, CliError> {
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

/// Raises the soft open-files limit to the hard one, as the kubelet (a Go
/// program) does, then sizes the fd budget every connection pays from; logged.
pub(crate) fn init_fd_budget() -> &'static FdBudget {
    match kpm::transport::fd::raise_soft_limit() {
        Ok(limit) => tracing::debug!(?limit, "open-files limit"),
        Err(err) => tracing::warn!(error = %err, "keeping the soft open-files limit"),
    }
    kpm::transport::fd::init(kpm::transport::fd::DEFAULT_RESERVE)
}

pub(crate) fn init_logging(format: LogFormat) -> Result<(), CliError> {
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
