//! `kpm-loadgen`: the load generator of `cargo xtask bench` and `cargo xtask soak`.
//!
//! Runs many `kpm-registrar` device plugins in one process against a running
//! `kpm run` and prints one JSON object of measurements on stdout:
//!
//! - `run --root DIR --scenario staggered|burst|burst-in-place|steady|churn|deregister|kill|hang
//!   [--kpm-pid PID] [--plugins N] [--interval-ms MS] [--rate N]
//!   [--duration-secs S] [--plugin-type device|csi] [--liveness-period-secs S]
//!   [--liveness-failures N]`: one scenario (see `scenarios.rs` and `exits.rs`), with the
//!   defaults of the issue unless told otherwise;
//! - `plugin --dir DIR --index N [--plugin-type device|csi]`: one plugin in this process,
//!   the plugin processes of `kill` and `hang`;
//! - `run --root DIR --scenario soak --kpm-pid PID --metrics-addr HOST:PORT [--plugins N]
//!   [--rate N] [--duration-secs S] [--warmup-secs S] [--sample-secs S] [--bad-interval-ms MS]
//!   [--bad-lifetime-ms MS] [--misbehaviours KIND,...]`: churn with misbehaving plugins mixed
//!   in, kpm sampled over time (see `soak/`); exits with status 3 when the verdict fails,
//!   the JSON printed all the same;
//! - `machine`: a description of this machine (CPUs, model, kernel);
//! - `report FILE`: the table of a combined results file written by
//!   `cargo xtask bench`, against the targets and the kubelet's figures, or
//!   the tables of a soak's results.
//!
//! Progress goes to stderr; stdout carries nothing but the JSON (or table).
//! kpm's CPU, RSS and descriptors are read from `/proc` (`procfs`). Not a
//! test: its figures go into `docs/performance.md` and `docs/reliability.md`.
//!
//! Modules depend one way: `stats`, `columns`, `procfs`, `metrics`,
//! `plugins` and `misbehave` at the bottom; `events` (the status API's
//! event stream) above them; `scenarios` and `exits` above that; `soak` and
//! `report` (which hands a soak's results to the soak's tables) on top.

mod columns;
mod events;
mod exits;
mod metrics;
mod misbehave;
mod plugins;
mod procfs;
mod report;
mod scenarios;
mod soak;
mod stats;

use std::net::SocketAddr;
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
    /// Serve one plugin in this process until killed; print `registered
    /// SOCKET` once kpm registered it (the plugin processes of `kill` and
    /// `hang`).
    Plugin {
        /// The registry directory.
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// Which plugin: its name and socket.
        #[arg(long, value_name = "N")]
        index: usize,
        /// The type of the plugin.
        #[arg(long, value_enum, default_value_t = plugins::Kind::Device)]
        plugin_type: plugins::Kind,
    },
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
    /// (required by `steady`, `churn` and `soak`, used by `burst`).
    #[arg(long, value_name = "PID")]
    kpm_pid: Option<u32>,
    /// Number of plugins [default: 50 staggered and deregister, 200 soak, 1000 otherwise].
    #[arg(long, value_name = "N")]
    plugins: Option<usize>,
    /// Time between two plugins of `staggered` and `deregister` [default: 37].
    #[arg(long, value_name = "MS")]
    interval_ms: Option<u64>,
    /// Sockets removed and re-created per second in `churn` and `soak`
    /// [default: 100 churn, 20 soak].
    #[arg(long, value_name = "N")]
    rate: Option<u32>,
    /// How long `steady` holds, `churn` churns and `soak` loads
    /// [default: 30, soak 600].
    #[arg(long, value_name = "S")]
    duration_secs: Option<u64>,
    /// kpm's Prometheus endpoint, `kpm run --metrics-addr` (required by `soak`).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<SocketAddr>,
    /// Load before the baseline sample of `soak` [default: a third of the
    /// duration, at most 60, at least one round of every plugin and misbehaviour].
    #[arg(long, value_name = "S")]
    warmup_secs: Option<u64>,
    /// Time between two samples of kpm in `soak`.
    #[arg(long, value_name = "S", default_value_t = 10)]
    sample_secs: u64,
    /// Time between two misbehaving plugins in `soak`.
    #[arg(long, value_name = "MS", default_value_t = 1500)]
    bad_interval_ms: u64,
    /// Lifetime of each misbehaving plugin in `soak`.
    #[arg(long, value_name = "MS", default_value_t = 4000)]
    bad_lifetime_ms: u64,
    /// The misbehaviours of `soak`, started in turn [default: all]; with
    /// `--bad-interval-ms 0`, none.
    #[arg(long, value_enum, value_name = "KINDS", value_delimiter = ',')]
    misbehaviours: Vec<misbehave::Misbehaviour>,
    /// The type of the plugins.
    #[arg(long, value_enum, default_value_t = plugins::Kind::Device)]
    plugin_type: plugins::Kind,
    /// kpm's `--liveness-period`, for the bound of `hang`.
    #[arg(long, value_name = "S", default_value_t = 30)]
    liveness_period_secs: u64,
    /// kpm's `--liveness-failures`, for the bound of `hang`.
    #[arg(long, value_name = "N", default_value_t = 3)]
    liveness_failures: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Staggered,
    Burst,
    BurstInPlace,
    Steady,
    Churn,
    Deregister,
    Kill,
    Hang,
    Soak,
}

/// The exit status of a run whose verdict failed (`soak`).
const VERDICT_FAILED: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(&args),
        Command::Plugin { dir, index, plugin_type } => {
            exits::serve_one(&dir, plugin_type, index).map(|out| (out, true))
        }
        Command::Machine => Ok((report::machine().to_string(), true)),
        Command::Report { file } => report::table(&file).map(|table| (table, true)),
    };
    match result {
        Ok((output, passed)) => {
            println!("{output}");
            if passed { ExitCode::SUCCESS } else { ExitCode::from(VERDICT_FAILED) }
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

/// Runs a scenario: its JSON, and whether its verdict (if it has one) passed.
fn run(args: &RunArgs) -> Result<(String, bool)> {
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
            Scenario::Kill => exits::kill(&ctx, few, interval).await,
            Scenario::Hang => {
                let period = Duration::from_secs(args.liveness_period_secs);
                exits::hang(&ctx, args.plugins.unwrap_or(10), period, args.liveness_failures).await
            }
            Scenario::Soak => soak::soak(&ctx, &soak_settings(args)?).await,
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
    let passed = result["verdict"]["pass"] != false;
    Ok((result.to_string(), passed))
}

fn soak_settings(args: &RunArgs) -> Result<soak::Settings> {
    let metrics = args.metrics_addr.ok_or("soak needs --metrics-addr")?;
    Ok(soak::Settings {
        plugins: args.plugins.unwrap_or(200),
        rate: args.rate.unwrap_or(20),
        duration: Duration::from_secs(args.duration_secs.unwrap_or(600)),
        warmup: args.warmup_secs.map(Duration::from_secs),
        sample_every: Duration::from_secs(args.sample_secs.max(1)),
        bad_interval: Duration::from_millis(args.bad_interval_ms.max(1)),
        bad_lifetime: Duration::from_millis(args.bad_lifetime_ms),
        misbehaviours: match (args.bad_interval_ms, args.misbehaviours.as_slice()) {
            (0, _) => Vec::new(),
            (_, []) => misbehave::Misbehaviour::ALL.to_vec(),
            (_, kinds) => kinds.to_vec(),
        },
        metrics,
    })
}
