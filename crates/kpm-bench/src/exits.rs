//! Plugins that die or hang, each in a process of its own (this binary's
//! `plugin` command), against kpm's liveness:
//!
//! - `kill`: plugins killed with SIGKILL one by one; the time from the kill
//!   to kpm's `deregistered` event (the kernel reports the exit, kpm finds
//!   the socket refusing);
//! - `hang`: plugins stopped with SIGSTOP all at once; the time until each
//!   is deregistered, against `period × failures + period` of the probes.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::ValueEnum as _;
use rustix::process::{Pid, Signal, kill_process};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::MissedTickBehavior;

use crate::plugins::{self, Kind};
use crate::scenarios::{Context, EVENT_TIMEOUT, SETTLE};
use crate::stats::ms;
use crate::{Result, events};

/// How long a plugin process may take to be registered.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(20);

/// What the `plugin` command prints once kpm registered it.
const REGISTERED: &str = "registered";

/// The `plugin` command: serves plugin `index` of `kind` in `dir`, prints
/// [`REGISTERED`] and its socket once kpm said so, and serves until killed.
pub(crate) fn serve_one(dir: &Path, kind: Kind, index: usize) -> Result<String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let plugin = plugins::start(dir, kind, index).await?;
        plugin.timing.latency().await?;
        println!("{REGISTERED} {}", plugin.registrar.socket_path().display());
        std::future::pending::<()>().await;
        Ok(String::new())
    })
}

/// A plugin process, registered.
struct Process {
    child: Child,
    socket: String,
}

/// Starts `count` plugin processes and waits until kpm registered each.
async fn start(ctx: &Context, count: usize) -> Result<Vec<Process>> {
    let exe = std::env::current_exe()?;
    let kind = ctx.kind.to_possible_value().ok_or("a plugin type without a name")?;
    let mut processes = Vec::with_capacity(count);
    for index in 0..count {
        let mut child = Command::new(&exe)
            .arg("plugin")
            .arg("--dir")
            .arg(&ctx.registry)
            .args(["--index", &index.to_string(), "--plugin-type", kind.get_name()])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(REGISTER_TIMEOUT, lines.next_line()).await;
        let socket = match &line {
            Ok(Ok(Some(line))) => line.strip_prefix(REGISTERED).map(|s| s.trim().to_owned()),
            _ => None,
        };
        let socket =
            socket.ok_or_else(|| format!("plugin process {index} was not registered: {line:?}"))?;
        processes.push(Process { child, socket });
    }
    Ok(processes)
}

/// `count` plugin processes killed with SIGKILL one every `interval`.
pub(crate) async fn kill(ctx: &Context, count: usize, interval: Duration) -> Result<Value> {
    let processes = start(ctx, count).await?;
    tokio::time::sleep(SETTLE).await;
    let mut events = events::subscribe(&ctx.status_socket).await?;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut killed = HashMap::new();
    let mut dead = Vec::with_capacity(count);
    for mut process in processes {
        ticker.tick().await;
        killed.insert(process.socket, Instant::now());
        process.child.start_kill()?;
        dead.push(process.child);
    }
    let seen = events::deregistrations(&mut events, killed, EVENT_TIMEOUT).await;
    for mut child in dead {
        let _ = child.wait().await;
    }
    Ok(seen.added_to(json!({
        "scenario": "kill",
        "plugins": count,
        "interval_ms": ms(interval),
    })))
}

/// `count` plugin processes stopped with SIGSTOP at once, with kpm probing
/// every `period` and giving up after `failures` failed probes.
pub(crate) async fn hang(
    ctx: &Context,
    count: usize,
    period: Duration,
    failures: u32,
) -> Result<Value> {
    let processes = start(ctx, count).await?;
    tokio::time::sleep(SETTLE).await;
    let mut events = events::subscribe(&ctx.status_socket).await?;
    let mut stopped = HashMap::new();
    for process in &processes {
        let pid = process.child.id().ok_or("a plugin process exited")?;
        send(pid, Signal::STOP)?;
        stopped.insert(process.socket.clone(), Instant::now());
    }
    let bound = period * (failures + 1);
    let seen = events::deregistrations(&mut events, stopped, bound + EVENT_TIMEOUT).await;
    for mut process in processes {
        if let Some(pid) = process.child.id() {
            send(pid, Signal::CONT)?;
        }
        let _ = process.child.kill().await;
    }
    Ok(seen.added_to(json!({
        "scenario": "hang",
        "plugins": count,
        "liveness_period_ms": ms(period),
        "liveness_failures": failures,
        "bound_ms": ms(bound),
    })))
}

/// Sends `signal` to process `pid`.
fn send(pid: u32, signal: Signal) -> Result {
    let raw = i32::try_from(pid).ok().and_then(Pid::from_raw).ok_or("pid out of range")?;
    kill_process(raw, signal).map_err(|err| format!("signal {signal:?} to {pid}: {err}").into())
}
