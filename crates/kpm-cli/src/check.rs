//! `kpm check -- PLUGIN-COMMAND…`: the conformance suite of
//! `kpm-conformance` run on a plugin's command, its flags made a
//! [`Config`], its [`Report`] printed as lines or JSON (`-o json`) and
//! written as JUnit XML (`--junit FILE`). Exit 1 when the plugin is not
//! conformant: a check failed, or warned under `--strict`.

use std::path::PathBuf;
use std::time::Duration;

use kpm_conformance::{Config, Report, Suite};

use crate::error::CliError;
use crate::output::OutputFormat;

#[derive(Debug, clap::Args)]
pub(crate) struct CheckArgs {
    /// How long the plugin may take to register, to register again after a
    /// restart, and to go after SIGTERM, in seconds.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = kpm_conformance::DEFAULT_BOUND.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..=crate::args::MAX_PERIOD_SECS)
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
    /// Strict mode: a warning fails the run too (exit 1), as a failure does.
    #[arg(long)]
    strict: bool,
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
    #[arg(long, value_name = "NAME", default_value = kpm_conformance::DEFAULT_NODE)]
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

/// Runs `kpm check`: `Ok(false)` when the plugin is not conformant.
pub(crate) async fn check(args: CheckArgs) -> Result<bool, CliError> {
    let mut config = Config::new(args.command)
        .bound(Duration::from_secs(args.timeout))
        .node_name(args.node_name)
        .keep_root(args.keep)
        .strict(args.strict);
    if let Some(kubeconfig) = args.kubeconfig {
        config = config.kubeconfig(kubeconfig);
    }
    if let Some(command) = args.health_change {
        config = config.health_change(command);
    }
    let report = Suite::try_new(config)?.run().await?;
    crate::output::print(&args.output.render(&report, Report::text)?)?;
    if let Some(path) = &args.junit {
        report.write_junit(path)?;
    }
    Ok(report.conformant())
}
