//! [`Exit`]: what a command came to, and the exit status that says it.

use std::process::ExitCode;

use crate::error::CliError;

/// What a command came to, as its exit status says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// 0: done; what it judged is fine.
    Ok,
    /// 1: what it judged fails (a probe, a doctor's or a check's verdict).
    Failing,
    /// [`CANNOT_JUDGE`]: it could not look where it was asked to.
    CannotJudge,
}

impl From<bool> for Exit {
    fn from(ok: bool) -> Self {
        if ok { Self::Ok } else { Self::Failing }
    }
}

/// The exit status of `kpm doctor` and `kpm check` when they could not look
/// where they were asked to, as clap's for a bad command line: nothing was
/// judged, so neither 0 nor 1 would be true.
const CANNOT_JUDGE: u8 = 2;

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        match exit {
            Exit::Ok => Self::SUCCESS,
            Exit::Failing => Self::FAILURE,
            Exit::CannotJudge => Self::from(CANNOT_JUDGE),
        }
    }
}

/// Says why a command stopped, and exits as `exit`.
pub(crate) fn fail(err: &CliError, exit: Exit) -> ExitCode {
    eprintln!("kpm: error: {err}");
    exit.into()
}
