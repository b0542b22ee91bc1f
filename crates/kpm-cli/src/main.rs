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
//! could not look (an error of theirs included). One `Exit` per command
//! decides it.

// Doc comments on the clap types are the command's help text, read in a terminal.
#![allow(clippy::doc_markdown)]

mod args;
mod check;
mod cli;
#[cfg(feature = "demo")]
mod demo;
#[cfg(test)]
mod doc_commands;
mod doctor;
mod error;
mod exit;
mod heap;
mod inspect;
mod list;
mod output;
mod probe;
mod run;
mod setup;
mod watch;

use std::process::ExitCode;

use cli::Command;
use error::CliError;
use exit::{Exit, fail};

fn main() -> ExitCode {
    let cli = cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(heap::flush_thread_cache_when_idle)
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return fail(&CliError::Runtime(err), Exit::Failing),
    };
    // Failing: the command ran and its answer is "no" (a probe verdict).
    // A command that judges cannot say "no" when it could not look: its
    // error has an exit status of its own.
    let judges = matches!(cli.command, Command::Doctor(_) | Command::Check(_));
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await.map(|()| Exit::Ok),
            Command::List { root, output } => {
                list::list(&root.status_socket(), output).await.map(|()| Exit::Ok)
            }
            Command::Watch { root, output } => {
                watch::watch(&root.status_socket(), output).await.map(|()| Exit::Ok)
            }
            Command::Probe(args) => probe::probe(args).await.map(Exit::from),
            Command::Doctor(args) => doctor::doctor(args).await,
            Command::Check(args) => check::check(args).await.map(Exit::from),
            #[cfg(feature = "demo")]
            Command::Demo => demo::demo().await.map(|()| Exit::Ok),
        }
    });
    match result {
        Ok(exit) => exit.into(),
        Err(err) if judges => fail(&err, Exit::CannotJudge),
        Err(err) => fail(&err, Exit::Failing),
    }
}
