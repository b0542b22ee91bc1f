//! `kpm-loadgen`: the load generator of `cargo xtask bench`.
//!
//! Runs many `kpm-registrar` device plugins in one process against a running
//! `kpm run` and prints one JSON object of measurements on stdout:
//!
//! - `run --root DIR --scenario staggered|burst|burst-in-place|steady|churn|deregister
//!   [--kpm-pid PID] [--plugins N] [--interval-ms MS] [--rate N]
//!   [--duration-secs S] [--plugin-type device|csi]`: one scenario (see `scenarios.rs`), with the
//!   defaults of the issue unless told otherwise;
//! - `machine`: a description of this machine (CPUs, model, kernel);
//! - `report FILE`: the table of a combined results file written by
//!   `cargo xtask bench`, against the targets and the kubelet's figures.
//!
//! Progress goes to stderr; stdout carries nothing but the JSON (or table).

mod events;
mod plugins;
mod procfs;
mod report;
mod scenarios;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// Errors end the run with a one-line message; no scenario recovers from one.
pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Result<T = (), E = Error> = std::result::Result<T, E>;

#[derive(Debug, Parser)]
#[command(name = "kpm-loadgen", about = "Load generator for `cargo xtask bench`")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one scenario against a running `kpm run --root-dir DIR`.
    Run(RunArgs),
    /// Describe this machine as JSON.
    Machine,
    /// Print the table of a results file written by `cargo xtask bench`.
    Report {
        /// The combined results JSON.
        file: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The root directory kpm runs on: plugins go to `DIR/plugins_registry`,
    /// the status API is `DIR/kpm.sock`.
    #[arg(long, value_name = "DIR")]
    root: PathBuf,
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// kpm's process id, for its CPU time, RSS and open file descriptors
    /// (required by `steady` and `churn`, used by `burst`).
    #[arg(long, value_name = "PID")]
    kpm_pid: Option<u32>,
    /// Number of plugins [default: 50 staggered and deregister, 1000 otherwise].
    #[arg(long, value_name = "N")]
    plugins: Option<usize>,
    /// Time between two plugins of `staggered` and `deregister` [default: 37].
    #[arg(long, value_name = "MS")]
    interval_ms: Option<u64>,
    /// Sockets removed and re-created per second in `churn` [default: 100].
    #[arg(long, value_name = "N")]
    rate: Option<u32>,
    /// How long `steady` holds and `churn` churns [default: 30].
    #[arg(long, value_name = "S")]
    duration_secs: Option<u64>,
    /// The type of the plugins.
    #[arg(long, value_enum, default_value_t = plugins::Kind::Device)]
    plugin_type: plugins::Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Staggered,
    Burst,
    BurstInPlace,
    Steady,
    Churn,
    Deregister,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(&args),
        Command::Machine => Ok(report::machine().to_string()),
        Command::Report { file } => report::table(&file),
    };
    match result {
        Ok(output) => {
            println!("{output}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("kpm-loadgen: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The first three fields of `/proc/loadavg` (1, 5 and 15 minutes).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn run(args: &RunArgs) -> Result<String> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let ctx = scenarios::Context::new(&args.root, args.kpm_pid, args.plugin_type);
    let interval = Duration::from_millis(args.interval_ms.unwrap_or(37));
    let duration = Duration::from_secs(args.duration_secs.unwrap_or(30));
    let many = args.plugins.unwrap_or(1000);
    let few = args.plugins.unwrap_or(50);
    let load_before = load_average();
    let mut result = runtime.block_on(async {
        match args.scenario {
            Scenario::Staggered => scenarios::staggered(&ctx, few, interval).await,
            Scenario::Burst => scenarios::burst(&ctx, many).await,
            Scenario::BurstInPlace => scenarios::burst_in_place(&ctx, many).await,
            Scenario::Steady => scenarios::steady(&ctx, many, duration).await,
            Scenario::Churn => {
                scenarios::churn(&ctx, many, args.rate.unwrap_or(100), duration).await
            }
            Scenario::Deregister => scenarios::deregister(&ctx, few, interval).await,
        }
    })?;
    // Other work on the machine skews every figure: record how busy it was.
    if let Some(fields) = result.as_object_mut() {
        fields.insert("load_average_before".into(), load_before.into());
        fields.insert("load_average_after".into(), load_average().into());
        let plugin_type = match args.plugin_type {
            plugins::Kind::Device => kpm_registrar::DEVICE_PLUGIN,
            plugins::Kind::Csi => kpm_registrar::CSI_PLUGIN,
        };
        fields.insert("plugin_type".into(), plugin_type.into());
    }
    // Plugins still serving stop with the runtime.
    runtime.shutdown_timeout(Duration::from_secs(2));
    Ok(result.to_string())
}
