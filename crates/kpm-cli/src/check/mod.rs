//! `kpm check -- PLUGIN-COMMAND…`: a conformance run for a plugin's author,
//! without a cluster. A kubelet (the one `kpm run` runs) serves a temporary
//! root; the plugin is started with that root and driven through what real
//! kubelets do to plugins: it must register within the bound, answer
//! `GetInfo` within the kubelet's second, pass its type's checks (the
//! inspection `kpm probe` shows), name its sockets as the conventions say;
//! then hold the conversation the kubelet has with it after registration
//! (a device plugin's devices listed and allocated, a CSI driver's node
//! info, a DRA driver's claims prepared); register again when the kubelet
//! restarts and when it restarts itself, and on SIGTERM remove its sockets
//! and be deregistered. Each step passes, warns (a rule the kubelet does
//! not hold the plugin to) or fails, with its evidence; the run ends with
//! `N passed, M failed`, exit 1 if any failed. For a CI, the report is also
//! a JSON document (`-o json`) and a JUnit XML file (`--junit FILE`), each
//! step a test case.
//!
//! [`runner`] drives the kubelet ([`node`]) and the plugin ([`plugin`])
//! through the steps, and hands each registered plugin to its type's
//! conversation: [`device`], [`csi`] or [`dra`] (which reads and writes the
//! API server, and judges CDI specs with [`cdi`]); each step ends in an
//! outcome with its evidence, and [`report`] gathers the outcomes into the
//! one report all three formats render.

mod cdi;
mod csi;
mod device;
mod dra;
mod hook;
mod node;
mod plugin;
mod report;
mod runner;

use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use self::plugin::{Api, Dirs, Settings};
use self::report::Report;
use crate::{CliError, OutputFormat};

#[derive(Debug, clap::Args)]
pub(crate) struct CheckArgs {
    /// How long the plugin may take to register, to register again after a
    /// restart, and to go after SIGTERM, in seconds.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=crate::MAX_PERIOD_SECS)
    )]
    timeout: u64,
    /// Keep the temporary kubelet root (with the plugin's output in
    /// `plugin.out` and `plugin.err`) instead of removing it.
    #[arg(long)]
    keep: bool,
    /// `table`: the report as lines; `json`: one document, for scripts.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
    output: OutputFormat,
    /// Also write the report as JUnit XML to FILE (each step a test case),
    /// for a CI's test report.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// A shell command that makes one of the device plugin's devices change
    /// health (run once, with KPM_CHECK_PID the plugin's pid and the paths
    /// below in its environment); without it the health-change step is
    /// skipped. For kpm-registrar's example plugin: 'kill -USR1 $KPM_CHECK_PID'.
    #[arg(long, value_name = "COMMAND")]
    health_change: Option<String>,
    /// The kubeconfig of an API server for the DRA steps (ResourceSlices
    /// read back, a ResourceClaim allocated from them and prepared); without
    /// it those steps are skipped. Also given to the plugin as `{kubeconfig}`.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The node's name, given to the plugin as `{node}`: a DRA driver's
    /// ResourceSlices and claims are this node's.
    #[arg(long, value_name = "NAME", default_value = "kpm-check-node")]
    node_name: String,
    /// The plugin's command. `{root}`, `{registry}`, `{device-plugins}` and
    /// `{plugins}` in its arguments become the temporary kubelet root, its
    /// `plugins_registry`, `device-plugins` and `plugins` directories,
    /// `{cdi}` a directory for CDI specs, `{node}` the node's name and
    /// `{kubeconfig}` the kubeconfig, also given as KPM_CHECK_ROOT,
    /// KPM_CHECK_REGISTRY, KPM_CHECK_DEVICE_PLUGINS, KPM_CHECK_PLUGINS,
    /// KPM_CHECK_CDI, KPM_CHECK_NODE and KPM_CHECK_KUBECONFIG.
    #[arg(required = true, last = true, value_name = "PLUGIN-COMMAND")]
    command: Vec<String>,
}

/// Runs `kpm check`: `Ok(false)` when a step failed.
pub(crate) async fn check(args: CheckArgs) -> Result<bool, CliError> {
    let temp = tempfile::Builder::new()
        .prefix("kpm-check-")
        .tempdir()
        .map_err(|err| CliError::Check(format!("create a temporary kubelet root: {err}")))?;
    let dirs = Dirs::create(temp.path())?;
    let api = match args.kubeconfig {
        Some(kubeconfig) => {
            let client = kpm::kube::client_from_kubeconfig(&kubeconfig).await?;
            Some(Api { client, kubeconfig })
        }
        None => None,
    };
    let run_started = Instant::now();
    let settings = Settings {
        bound: Duration::from_secs(args.timeout),
        health_change: args.health_change,
        node: args.node_name,
        api,
    };
    let steps = runner::run(&args.command, &dirs, &settings).await?;
    let report = Report::new(&args.command, steps, args.keep.then_some(temp.path()));
    crate::output::print(&args.output.render(&report, Report::text)?)?;
    if let Some(path) = &args.junit {
        report.write_junit(path, run_started.elapsed())?;
    }
    let passed = report.passed();
    if args.keep {
        let _ = temp.keep();
    }
    Ok(passed)
}
