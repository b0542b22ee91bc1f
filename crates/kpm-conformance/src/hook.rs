//! A hook of the config ([`Hook`]) called on the running plugin: a shell
//! command by `sh -c` with the plugin's pid and the run's paths in its
//! environment, or a function of this process; bounded either way.

use std::process::Stdio;
use std::time::Duration;

use crate::plugin::Hook;

/// A hook, with what it is told.
#[derive(Debug)]
pub(crate) struct HookCall {
    hook: Hook,
    env: Vec<(&'static str, String)>,
    bound: Duration,
}

impl HookCall {
    /// `hook` with `env` set (a shell command's), stopped if it runs longer
    /// than `bound`.
    pub(crate) fn new(hook: Hook, env: Vec<(&'static str, String)>, bound: Duration) -> Self {
        Self { hook, env, bound }
    }

    /// Runs it to its end; `Err` says how it failed (`exited 1: …`).
    pub(crate) async fn run(&self) -> Result<(), String> {
        let command = match &self.hook {
            Hook::InProcess(act) => {
                return tokio::time::timeout(self.bound, act())
                    .await
                    .map_err(|_| format!("the hook still ran after {:?}", self.bound))?;
            }
            Hook::Shell(command) => command,
        };
        let mut shell = tokio::process::Command::new("sh");
        shell
            .arg("-c")
            .arg(command)
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = match tokio::time::timeout(self.bound, shell.output()).await {
            Err(_) => return Err(format!("{command:?} still ran after {:?}", self.bound)),
            Ok(Err(err)) => return Err(format!("{command:?} did not start: {err}")),
            Ok(Ok(output)) => output,
        };
        if output.status.success() {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&output.stderr);
        Err(format!("{command:?} {}: {}", output.status, said.trim()))
    }
}
