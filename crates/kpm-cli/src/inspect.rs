//! How `kpm probe`, `kpm doctor` and `kpm check` judge a socket: with the
//! kubelet `kpm run` would run, through its manager's inspection (the
//! register operation's own steps, registering nothing), and how an
//! inspection reads, step by step.

use std::path::Path;
use std::time::Duration;

use kpm::{Inspection, Kubelet, PluginKind, Step};

use crate::error::CliError;
use crate::setup::plugin_kind;

/// What `kpm probe` and `kpm doctor` judge with: the kubelet's handlers
/// but the disabled ones, and a bound on each call.
#[derive(Debug, clap::Args)]
pub(crate) struct JudgeArgs {
    /// Plugin types the kubelet runs without a handler, comma-separated.
    #[arg(
        long,
        value_parser = plugin_kind(),
        value_name = "TYPES",
        value_delimiter = ',',
        env = "KPM_DISABLE"
    )]
    pub(crate) disable: Vec<PluginKind>,
    /// How long dialing and each call may take, in seconds (`kpm doctor`
    /// gives GetInfo the kubelet's 1 s).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 5,
        value_parser = clap::value_parser!(u64).range(1..=crate::args::MAX_PERIOD_SECS)
    )]
    pub(crate) timeout: u64,
}

impl JudgeArgs {
    /// The bound on each call.
    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }
}

/// The kubelet `kpm run --root-dir root_dir --disable disabled` would run,
/// not running: `GetInfo` bounded by `get_info`, every other call by
/// `timeout`.
pub(crate) fn kubelet(
    root_dir: &Path,
    disabled: &[PluginKind],
    timeout: Duration,
    get_info: Duration,
) -> Result<Kubelet, CliError> {
    let host = kpm::transport::HostRoot::default();
    Ok(crate::run::kubelet(root_dir, disabled).inspect_only(timeout, get_info, host).build()?)
}

/// One step of an inspection as a report shows it.
pub(crate) struct StepLine {
    pub(crate) step: Step,
    pub(crate) took: Duration,
    /// What it found, or why it failed.
    pub(crate) outcome: Result<String, String>,
}

/// The steps of `inspection`, each with what it found; the last one failed
/// if the inspection did.
pub(crate) fn step_lines(inspection: &Inspection) -> Vec<StepLine> {
    let failed = inspection.failed_step();
    inspection
        .steps
        .iter()
        .map(|taken| {
            let outcome = match (&inspection.outcome, failed == Some(taken.step)) {
                (Err(err), true) => Err(err.reason()),
                _ => Ok(detail(inspection, taken.step)),
            };
            StepLine { step: taken.step, took: taken.took, outcome }
        })
        .collect()
}

/// What a step that passed found.
fn detail(inspection: &Inspection, step: Step) -> String {
    match (step, &inspection.info) {
        (Step::Dial, _) => {
            inspection.server_pid.map(|pid| format!("pid {pid}")).unwrap_or_default()
        }
        (Step::GetInfo, Some(info)) => format!(
            "type={} name={} endpoint={:?} versions={:?}",
            info.r#type, info.name, info.endpoint, info.supported_versions
        ),
        (Step::Handler, Some(info)) => format!("{} handler", info.r#type),
        (Step::Service, _) => {
            inspection.service.as_ref().map(ToString::to_string).unwrap_or_default()
        }
        _ => String::new(),
    }
}
