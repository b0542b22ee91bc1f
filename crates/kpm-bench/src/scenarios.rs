//! The five scenarios of the benchmark. Each runs against a fresh `kpm run`
//! and returns one JSON object of measurements.
//!
//! Registration latency is timed from just before a plugin's socket is bound
//! (`Registrar::serve`) to the arrival of `NotifyRegistrationStatus(true)`
//! at the plugin. Deregistration latency is timed from just before a
//! plugin's socket is removed (dropping its `Registrar` unlinks it) to the
//! arrival of the `deregistered` event for that socket on `/v1/events`: kpm
//! publishes that event after the handler's `deregister` returned, so this
//! bounds "socket removed → handler called" from above.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kpm_registrar::Registrar;
use serde_json::{Value, json};
use tokio::time::MissedTickBehavior;

use crate::plugins::{self, Plugin, Settled};
use crate::stats::{listed, ms, round, summary};
use crate::{Result, events, procfs};

/// Quiet time after the set-up of `steady`, `churn`, `deregister`, `kill`
/// and `hang`, so that kpm's follow-up work (device plugin streams) is done
/// before measuring.
pub(crate) const SETTLE: Duration = Duration::from_secs(2);

/// How long `deregister` waits for the last event.
pub(crate) const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where kpm is and how to read its process.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) registry: PathBuf,
    pub(crate) status_socket: PathBuf,
    kpm_pid: Option<u32>,
    pub(crate) kind: plugins::Kind,
    ticks_per_second: u64,
}

impl Context {
    pub(crate) fn new(root: &Path, kpm_pid: Option<u32>, kind: plugins::Kind) -> Self {
        Self {
            registry: plugins::registry_dir(root),
            status_socket: root.join("kpm.sock"),
            kpm_pid,
            kind,
            ticks_per_second: procfs::clock_ticks_per_second(),
        }
    }

    pub(crate) fn kpm(&self) -> Result<String> {
        self.kpm_pid
            .map(|pid| pid.to_string())
            .ok_or_else(|| "this scenario needs --kpm-pid".into())
    }
}

/// `count` plugins, one every `interval`: the latency of each.
pub(crate) async fn staggered(ctx: &Context, count: usize, interval: Duration) -> Result<Value> {
    let mut events = events::subscribe(&ctx.status_socket).await?;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut plugins = Vec::with_capacity(count);
    for index in 0..count {
        ticker.tick().await;
        plugins.push(plugins::start(&ctx.registry, ctx.kind, index).await?);
        progress(&format!("staggered: {}/{count} plugins", index + 1), index + 1, count);
    }
    let started: HashMap<String, Instant> =
        plugins.iter().map(|p| (socket_of(&p.registrar), p.timing.started)).collect();
    let settled = plugins::settle(plugins).await;

    // When kpm announced each socket as seen (an upper bound of watcher +
    // reconciler detection: it includes the event's way to us).
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    let mut pending = started;
    while !pending.is_empty() {
        let Ok(Some(event)) = tokio::time::timeout_at(deadline, events.recv()).await else {
            break;
        };
        if event.kind == "seen"
            && let Some(bound) = pending.remove(&event.socket)
        {
            seen.push(event.at.duration_since(bound));
        }
    }
    Ok(json!({
        "scenario": "staggered",
        "plugins": count,
        "interval_ms": ms(interval),
        "latency_ms": summary(settled.latencies.clone()),
        "bind_to_seen_event_ms": summary(seen),
        "failure_count": settled.failures.len(),
        "failures": listed(&settled.failures),
    }))
}

/// `count` plugins appearing at once: the time until all were notified.
///
/// The sockets are bound in a hidden staging directory under the registry
/// (kpm ignores hidden names), then renamed into the registry one after the
/// other, which takes a few milliseconds for 1000: binding them in place
/// takes this process hundreds of milliseconds on two shared cores, which
/// would time the load generator rather than kpm (see `burst_in_place`).
/// The clock starts just before the first rename.
pub(crate) async fn burst(ctx: &Context, count: usize) -> Result<Value> {
    let staging = ctx.registry.join(plugins::STAGING_DIR);
    let (plugins, bind_all) = plugins::start_many(&staging, ctx.kind, count).await?;
    let mut moved = Vec::with_capacity(count);
    let kpm_before = ctx.kpm_pid.map(|pid| procfs::sample(&pid.to_string())).transpose()?;
    let begin = Instant::now();
    for plugin in &plugins {
        let from = plugin.registrar.socket_path();
        let to = ctx.registry.join(from.file_name().unwrap_or_default());
        std::fs::rename(from, &to)
            .map_err(|err| format!("rename {} to {}: {err}", from.display(), to.display()))?;
        moved.push(to);
    }
    let renamed = begin.elapsed();
    eprintln!("{count} plugins bound in {bind_all:?}, renamed into the registry in {renamed:?}");
    let mut latencies = Vec::with_capacity(count);
    let mut failures = Vec::new();
    let mut last = None;
    let mut registrars = Vec::with_capacity(count);
    for (Plugin { registrar, timing }, socket) in plugins.into_iter().zip(&moved) {
        match timing.arrival().await {
            Ok(at) => {
                latencies.push(at.saturating_duration_since(begin));
                last = last.max(Some(at));
            }
            Err(reason) => failures.push(plugins::failure(socket, &reason)),
        }
        registrars.push(registrar);
    }
    let all_notified = last.map(|at| at.duration_since(begin));
    eprintln!(
        "{} registered, {} failed, last notified after {all_notified:?}",
        latencies.len(),
        failures.len()
    );
    let kpm = match (ctx.kpm_pid, kpm_before) {
        (Some(pid), Some(before)) => {
            let after = procfs::sample(&pid.to_string())?;
            json!({
                "cpu": procfs::cpu(&before, &after, ctx.ticks_per_second),
                "memory": procfs::memory(&after),
            })
        }
        _ => Value::Null,
    };
    // The registrars only know the staging paths: remove the sockets here.
    for socket in &moved {
        let _ = std::fs::remove_file(socket);
    }
    drop(registrars);
    Ok(json!({
        "scenario": "burst",
        "plugins": count,
        "bind_staged_ms": ms(bind_all),
        "rename_all_ms": ms(renamed),
        "all_notified_ms": all_notified.map(ms),
        "registered": latencies.len(),
        "latency_ms": summary(latencies),
        "failure_count": failures.len(),
        "failures": listed(&failures),
        "kpm": kpm,
    }))
}

/// `count` plugins binding their sockets in the registry as fast as this
/// process can: the time from the first bind to the last notification.
pub(crate) async fn burst_in_place(ctx: &Context, count: usize) -> Result<Value> {
    let kpm_before = ctx.kpm_pid.map(|pid| procfs::sample(&pid.to_string())).transpose()?;
    let (settled, bind_all, all_notified) = register_all(ctx, count).await?;
    let kpm = match (ctx.kpm_pid, kpm_before) {
        (Some(pid), Some(before)) => {
            let after = procfs::sample(&pid.to_string())?;
            json!({
                "cpu": procfs::cpu(&before, &after, ctx.ticks_per_second),
                "memory": procfs::memory(&after),
            })
        }
        _ => Value::Null,
    };
    Ok(json!({
        "scenario": "burst-in-place",
        "plugins": count,
        "bind_all_ms": ms(bind_all),
        "all_notified_ms": all_notified.map(ms),
        "registered": settled.latencies.len(),
        "latency_ms": summary(settled.latencies.clone()),
        "failure_count": settled.failures.len(),
        "failures": listed(&settled.failures),
        "kpm": kpm,
    }))
}

/// `count` registered plugins held for `duration`: kpm's CPU use and memory.
pub(crate) async fn steady(ctx: &Context, count: usize, duration: Duration) -> Result<Value> {
    let pid = ctx.kpm()?;
    let (settled, _, all_notified) = register_all(ctx, count).await?;
    tokio::time::sleep(SETTLE).await;
    let (kpm_start, own_start) = (procfs::sample(&pid)?, procfs::sample("self")?);
    eprintln!("steady: holding {} plugins for {duration:?}", settled.registrars.len());
    tokio::time::sleep(duration).await;
    let (kpm_end, own_end) = (procfs::sample(&pid)?, procfs::sample("self")?);
    Ok(json!({
        "scenario": "steady",
        "plugins": count,
        "registered": settled.latencies.len(),
        "setup_all_notified_ms": all_notified.map(ms),
        "failure_count": settled.failures.len(),
        "failures": listed(&settled.failures),
        "kpm": {
            "cpu": procfs::cpu(&kpm_start, &kpm_end, ctx.ticks_per_second),
            "start": procfs::memory(&kpm_start),
            "end": procfs::memory(&kpm_end),
        },
        "loadgen": {
            "cpu": procfs::cpu(&own_start, &own_end, ctx.ticks_per_second),
            "end": procfs::memory(&own_end),
        },
    }))
}

/// `count` registered plugins, `rate` of them removed and re-created per
/// second (round robin) for `duration`: registration latency of the new
/// sockets, and kpm's memory and file descriptors before and after.
pub(crate) async fn churn(
    ctx: &Context,
    count: usize,
    rate: u32,
    duration: Duration,
) -> Result<Value> {
    let pid = ctx.kpm()?;
    let (settled, _, all_notified) = register_all(ctx, count).await?;
    tokio::time::sleep(SETTLE).await;
    let kpm_start = procfs::sample(&pid)?;

    let period = Duration::from_secs(1) / rate.max(1);
    let cycles = usize::try_from(u128::from(rate) * duration.as_millis() / 1000)?;
    let mut registrars: Vec<Option<Registrar>> = settled.registrars.into_iter().map(Some).collect();
    let mut timings = Vec::with_capacity(cycles);
    let mut ticker = tokio::time::interval(period);
    let per_second = usize::try_from(rate.max(1))?;
    let mut rss_series = vec![procfs::mb(kpm_start.rss_kb)];
    let begin = Instant::now();
    for cycle in 0..cycles {
        ticker.tick().await;
        if cycle > 0 && cycle.is_multiple_of(per_second) {
            rss_series.push(procfs::mb(procfs::sample(&pid)?.rss_kb));
        }
        let index = cycle % count.max(1);
        // Dropping the registrar unlinks its socket at once (its server
        // stops in the background); the new one binds the same path.
        drop(registrars.get_mut(index).and_then(Option::take));
        let Plugin { registrar, timing } = plugins::start(&ctx.registry, ctx.kind, index).await?;
        timings.push((socket_of(&registrar), timing));
        if let Some(slot) = registrars.get_mut(index) {
            *slot = Some(registrar);
        }
        progress(&format!("churn: {} cycles", cycle + 1), cycle + 1, cycles);
    }
    let churned = begin.elapsed();
    let kpm_churned = procfs::sample(&pid)?;

    let mut latencies = Vec::with_capacity(timings.len());
    let mut failures = Vec::new();
    for (socket, timing) in timings {
        match timing.latency().await {
            Ok(latency) => latencies.push(latency),
            Err(reason) => failures.push(format!("{socket}: {reason}")),
        }
    }
    // Let the old incarnations' connections close before counting.
    tokio::time::sleep(SETTLE).await;
    let kpm_end = procfs::sample(&pid)?;
    rss_series.push(procfs::mb(kpm_churned.rss_kb));
    rss_series.push(procfs::mb(kpm_end.rss_kb));
    let growth = |start: u64, end: u64| {
        round(100.0 * (crate::stats::float(end) / crate::stats::float(start.max(1)) - 1.0), 2)
    };
    Ok(json!({
        "scenario": "churn",
        "plugins": count,
        "rate_per_s": rate,
        "cycles": cycles,
        "achieved_rate_per_s": round(crate::stats::float(u64::try_from(cycles)?) / churned.as_secs_f64(), 1),
        "setup_all_notified_ms": all_notified.map(ms),
        "latency_ms": summary(latencies),
        "failure_count": failures.len(),
        "failures": listed(&failures),
        "kpm": {
            "cpu_during_churn": procfs::cpu(&kpm_start, &kpm_churned, ctx.ticks_per_second),
            "start": procfs::memory(&kpm_start),
            "end": procfs::memory(&kpm_end),
            "rss_growth_percent": growth(kpm_start.rss_kb, kpm_end.rss_kb),
            "fd_growth": i128::from(kpm_end.fds) - i128::from(kpm_start.fds),
            "rss_mb_every_second": rss_series,
        },
    }))
}

/// `count` registered plugins removed one every `interval`: the time until
/// kpm reports each deregistered.
pub(crate) async fn deregister(ctx: &Context, count: usize, interval: Duration) -> Result<Value> {
    let (settled, _, _) = register_all(ctx, count).await?;
    if !settled.failures.is_empty() {
        return Err(format!("set-up failed: {}", settled.failures.join("; ")).into());
    }
    tokio::time::sleep(SETTLE).await;
    let mut events = events::subscribe(&ctx.status_socket).await?;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut removed = HashMap::new();
    for registrar in settled.registrars {
        ticker.tick().await;
        removed.insert(socket_of(&registrar), Instant::now());
        drop(registrar);
    }
    let seen = events::deregistrations(&mut events, removed, EVENT_TIMEOUT).await;
    Ok(seen.added_to(json!({
        "scenario": "deregister",
        "plugins": count,
        "interval_ms": ms(interval),
    })))
}

/// Starts `count` plugins at once and waits for all of them: the outcome,
/// the time to bind them all, and the time from the first bind to the last
/// notification.
pub(crate) async fn register_all(
    ctx: &Context,
    count: usize,
) -> Result<(Settled, Duration, Option<Duration>)> {
    let begin = Instant::now();
    let (plugins, bind_all) = plugins::start_many(&ctx.registry, ctx.kind, count).await?;
    eprintln!("{count} plugins bound in {bind_all:?}; waiting for their registration");
    let settled = plugins::settle(plugins).await;
    let all_notified = settled.last.map(|last| last.duration_since(begin));
    eprintln!(
        "{} registered, {} failed, last notified after {all_notified:?}",
        settled.latencies.len(),
        settled.failures.len()
    );
    Ok((settled, bind_all, all_notified))
}

pub(crate) fn socket_of(registrar: &Registrar) -> String {
    registrar.socket_path().display().to_string()
}

/// A progress line on stderr every tenth of the way.
fn progress(line: &str, done: usize, total: usize) {
    if total >= 10 && done.is_multiple_of(total / 10) {
        eprintln!("{line}");
    }
}
