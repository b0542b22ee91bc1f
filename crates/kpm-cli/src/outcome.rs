//! What a command came to, and the exit status that says it.

use std::process::ExitCode;

use crate::error::CliError;

/// What a command came to, as its exit status says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
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
pub(crate) fn fail(err: &CliError, outcome: Outcome) -> ExitCode {
    eprintln!("kpm: error: {err}");
    outcome.into()
}
