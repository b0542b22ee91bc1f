//! A command the user gives `kpm check` to act on the plugin from outside
//! (`--health-change`), run by `sh -c` with the plugin's pid and the
//! check's paths in its environment.

use std::ffi::OsString;
use std::process::Stdio;
use std::time::Duration;

/// A shell command, with what it is told.
#[derive(Debug)]
pub(crate) struct Hook {
    command: String,
    env: Vec<(&'static str, OsString)>,
    bound: Duration,
}

impl Hook {
    /// `command` with `env` set, killed if it runs longer than `bound`.
    pub(crate) fn new(
        command: String,
        env: Vec<(&'static str, OsString)>,
        bound: Duration,
    ) -> Self {
        Self { command, env, bound }
    }

    /// Runs it to its end; `Err` says how it failed (`exited 1: …`).
    pub(crate) async fn run(&self) -> Result<(), String> {
        let mut command = tokio::process::Command::new("sh");
        command
            .arg("-c")
            .arg(&self.command)
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let shown = &self.command;
        let output = match tokio::time::timeout(self.bound, command.output()).await {
            Err(_) => return Err(format!("{shown:?} still ran after {:?}", self.bound)),
            Ok(Err(err)) => return Err(format!("{shown:?} did not start: {err}")),
            Ok(Ok(output)) => output,
        };
        if output.status.success() {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&output.stderr);
        Err(format!("{shown:?} {}: {}", output.status, said.trim()))
    }
}
