//! `kpm probe SOCKET`: what would happen if this socket appeared in the
//! registry, without registering it: the manager's inspection, the register
//! operation's own steps (dial, `GetInfo`, its bounds, the handler of its
//! type, the handler's validation), then the handler's read-only look at
//! the plugin's own service (CSI `NodeGetInfo`; a device plugin's options
//! and first `ListAndWatch` list; DRA, its negotiated service answering).
//! Exit 0 when it would register, 1 otherwise.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::error::CliError;
use crate::inspect::{self, JudgeArgs, StepLine};

#[derive(Debug, clap::Args)]
pub(crate) struct ProbeArgs {
    /// The registration socket to diagnose.
    socket: PathBuf,
    /// The kubelet root directory of the `kpm run` to judge by (DRA
    /// endpoints must be inside it).
    #[arg(long, value_name = "DIR", default_value = kpm::api::DEFAULT_ROOT_DIR, env = "KPM_ROOT_DIR")]
    root_dir: PathBuf,
    #[command(flatten)]
    judge: JudgeArgs,
}

pub(crate) async fn probe(args: ProbeArgs) -> Result<bool, CliError> {
    let timeout = args.judge.timeout();
    let kubelet = inspect::kubelet(&args.root_dir, &args.judge.disable, timeout, timeout)?;
    let inspection = kubelet.handle().manager().inspect(&args.socket).await;
    let mut report = format!("probe {}\n", args.socket.display());
    for StepLine { step, took, outcome } in inspect::step_lines(&inspection) {
        let (mark, detail) = match &outcome {
            Ok(detail) => ("ok  ", detail),
            Err(reason) => ("FAIL", reason),
        };
        let ms = took.as_secs_f64() * 1000.0;
        let line = format!("  {:<10} {mark} {ms:>8.1} ms  {detail}", step.name());
        let _ = writeln!(report, "{}", line.trim_end());
    }
    match (&inspection.outcome, inspection.failed_step()) {
        (Ok(()), _) => report.push_str("verdict: would register\n"),
        (Err(err), step) => {
            let at = step.map(|step| format!(" at {step}")).unwrap_or_default();
            let _ = writeln!(report, "verdict: would not register{at}: {}", err.reason());
        }
    }
    crate::output::print(&report)?;
    Ok(inspection.outcome.is_ok())
}
