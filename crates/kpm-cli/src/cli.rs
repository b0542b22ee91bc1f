//! The command line: the commands and their flags, parsed.

use std::path::Path;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use crate::args::RootArgs;
use crate::output::OutputFormat;
use crate::{check, doctor, probe, run};

#[derive(Debug, Parser)]
#[command(name = "kpm", version, about = "The kubelet plugin manager, in Rust")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Watch the registry directory and register plugins until SIGINT or SIGTERM.
    Run(run::RunArgs),
    /// List the plugins of a running `kpm run`.
    List {
        #[command(flatten)]
        root: RootArgs,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
        output: OutputFormat,
    },
    /// Start a plugin manager on a temporary directory with example plugins
    /// of all three types and show, live, registrations, a re-registration,
    /// a device going unhealthy and a removal; then exit. No set-up needed.
    #[cfg(feature = "demo")]
    Demo,
    /// Diagnose a registration socket without registering it: dial, GetInfo,
    /// the validation of its type's handler, then read-only calls on the
    /// plugin's service. Exits 0 when it would register, 1 otherwise.
    Probe(probe::ProbeArgs),
    /// Tell, read-only, why each plugin of a node with a running kubelet is
    /// or is not registered: every registry entry and device-plugin socket
    /// judged by the kubelet's rules, with what serves it and how to fix
    /// it. With --watch, keeps judging and publishes the Node condition
    /// KubeletPluginsHealthy and Events; with --cluster, reads back what
    /// every node's doctor published.
    ///
    /// Exit status: 0 when everything it should judge was judged and is
    /// fine; 1 when something fails; 2 when it could not look: the
    /// registry missing or unreadable (a wrong --root-dir or --host-root, no
    /// kubelet found to take the root from), the API server not read at all,
    /// a kubeconfig that cannot be read, or a bad command line. The last
    /// line says why and what to try.
    Doctor(doctor::DoctorArgs),
    /// Run a plugin against a kubelet on a temporary root and check what
    /// real kubelets rely on: it registers, answers GetInfo within 1 s, passes
    /// its type's checks, names its sockets by the conventions, registers
    /// again after a kubelet restart, removes its sockets on SIGTERM. Ends
    /// with `N passed, M failed`.
    ///
    /// Exit status: 0 when every step passed; 1 when a step failed; 2 when
    /// the check could not run (the plugin's command did not start, the
    /// temporary kubelet could not be set up, a bad command line).
    Check(check::CheckArgs),
    /// Print what happens to plugins (seen, registered, rejected,
    /// deregistered, retry scheduled), one line each, until interrupted.
    Watch {
        #[command(flatten)]
        root: RootArgs,
        /// Output format: text lines, or one JSON object per line.
        #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
        output: OutputFormat,
    },
}

/// The file name kubectl runs a plugin named `kpm` by.
const KUBECTL_PLUGIN: &str = "kubectl-kpm";

/// The command line, parsed; when started as [`KUBECTL_PLUGIN`], help and
/// usage name the command `kubectl kpm` (clap skips `argv[0]` either way).
pub(crate) fn parse() -> Cli {
    let as_plugin = std::env::args_os()
        .next()
        .is_some_and(|argv0| Path::new(&argv0).file_name() == Some(KUBECTL_PLUGIN.as_ref()));
    if !as_plugin {
        return Cli::parse();
    }
    let matches = Cli::command().name(KUBECTL_PLUGIN).bin_name("kubectl kpm").get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.exit())
}
