//! `kpm`: the kubelet plugin manager as a command.
//!
//! - `kpm run`: watch `<root>/plugins_registry`, register plugins, serve the
//!   status API on `<root>/kpm.sock`.
//! - `kpm list`: print the plugins a running `kpm run` knows.
//! - `kpm watch`: print what happens to plugins, as it happens.
//! - `kpm probe SOCKET`: diagnose a registration socket without registering it.
//! - `kpm doctor`: why each plugin of a live node is or is not registered;
//!   `--watch` publishes it on the Node, `--cluster` reads the fleet back.
//! - `kpm check -- PLUGIN-COMMAND…`: a plugin checked against what kubelets rely on.
//! - `kpm demo`: a manager and example plugins of every type on a temp dir.
//!
//! Installed as `kubectl-kpm` (a link to `kpm` on the `PATH`), it is the
//! kubectl plugin `kubectl kpm …`: the same commands, its help naming it so.
//!
//! Exit codes: 0 ok, 1 failing (an error is one line naming the path and
//! the step), 2 a bad command line, or, for `kpm doctor` and `kpm check`,
//! could not look (an error of theirs included). One `Outcome` per command
//! decides it.

// Doc comments on the clap types are the command's help text, read in a terminal.
#![allow(clippy::doc_markdown)]

mod check;
#[cfg(feature = "demo")]
mod demo;
#[cfg(test)]
mod doc_commands;
mod doctor;
mod error;
mod heap;
mod inspect;
mod list;
mod listener;
mod metrics;
mod output;
mod probe;
mod run;
mod setup;
mod status_api;
mod watch;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

pub(crate) use error::CliError;
pub(crate) use output::OutputFormat;

#[derive(Debug, Parser)]
#[command(name = "kpm", version, about = "The kubelet plugin manager, in Rust")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the node's kubelet-style directories are.
#[derive(Debug, Clone, clap::Args)]
struct RootArgs {
    /// The kubelet root directory.
    #[arg(long, value_name = "DIR", default_value = kpm::api::DEFAULT_ROOT_DIR, env = "KPM_ROOT_DIR")]
    root_dir: PathBuf,
    /// The status API socket [default: <ROOT_DIR>/kpm.sock].
    #[arg(long, value_name = "PATH", env = "KPM_STATUS_SOCKET")]
    status_socket: Option<PathBuf>,
}

impl RootArgs {
    fn status_socket(&self) -> PathBuf {
        self.status_socket.clone().unwrap_or_else(|| self.root_dir.join(STATUS_SOCKET_NAME))
    }
}

/// The longest period or timeout a flag accepts, in seconds (a year): far
/// beyond any useful setting, and far from overflowing a clock.
const MAX_PERIOD_SECS: u64 = kpm::api::MAX_CONFIG_DURATION.as_secs();

/// Name of the status API socket in the root directory.
pub(crate) const STATUS_SOCKET_NAME: &str = "kpm.sock";

#[derive(Debug, Subcommand)]
enum Command {
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
fn parse() -> Cli {
    let as_plugin = std::env::args_os()
        .next()
        .is_some_and(|argv0| Path::new(&argv0).file_name() == Some(KUBECTL_PLUGIN.as_ref()));
    if !as_plugin {
        return Cli::parse();
    }
    let matches = Cli::command().name(KUBECTL_PLUGIN).bin_name("kubectl kpm").get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.exit())
}

fn main() -> ExitCode {
    let cli = parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(heap::flush_thread_cache_when_idle)
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return fail(&CliError::Runtime(err), Outcome::Failing),
    };
    // Failing: the command ran and its answer is "no" (a probe verdict).
    // A command that judges cannot say "no" when it could not look: its
    // error has an exit status of its own.
    let judges = matches!(cli.command, Command::Doctor(_) | Command::Check(_));
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await.map(|()| Outcome::Ok),
            Command::List { root, output } => {
                list::list(&root.status_socket(), output).await.map(|()| Outcome::Ok)
            }
            Command::Watch { root, output } => {
                watch::watch(&root.status_socket(), output).await.map(|()| Outcome::Ok)
            }
            Command::Probe(args) => probe::probe(args).await.map(Outcome::from),
            Command::Doctor(args) => doctor::doctor(args).await,
            Command::Check(args) => check::check(args).await.map(Outcome::from),
            #[cfg(feature = "demo")]
            Command::Demo => demo::demo().await.map(|()| Outcome::Ok),
        }
    });
    match result {
        Ok(outcome) => outcome.into(),
        Err(err) if judges => fail(&err, Outcome::CannotJudge),
        Err(err) => fail(&err, Outcome::Failing),
    }
}

/// What a command came to, as its exit status says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// 0: done; what it judged is fine.
    Ok,
    /// 1: what it judged fails (a probe, a doctor's or a check's verdict).
    Failing,
    /// [`CANNOT_JUDGE`]: it could not look where it was asked to.
    CannotJudge,
}

impl From<bool> for Outcome {
    fn from(ok: bool) -> Self {
        if ok { Self::Ok } else { Self::Failing }
    }
}

/// The exit status of `kpm doctor` and `kpm check` when they could not look
/// where they were asked to, as clap's for a bad command line: nothing was
/// judged, so neither 0 nor 1 would be true.
const CANNOT_JUDGE: u8 = 2;

impl From<Outcome> for ExitCode {
    fn from(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Ok => Self::SUCCESS,
            Outcome::Failing => Self::FAILURE,
            Outcome::CannotJudge => Self::from(CANNOT_JUDGE),
        }
    }
}

/// Says why a command stopped, and exits as `outcome`.
fn fail(err: &CliError, outcome: Outcome) -> ExitCode {
    eprintln!("kpm: error: {err}");
    outcome.into()
}
