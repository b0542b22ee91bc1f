//! `soak`: well-behaved device plugins churned for minutes with misbehaving
//! plugins mixed in (`misbehave.rs`), while kpm's resident memory, open file
//! descriptors, threads, tokio tasks and operation-executor entries are
//! sampled; the verdict compares the end with a baseline taken after a
//! warm-up.
//!
//! The run: `plugins` device plugins register; then, until the warm-up is
//! over, `rate` of them are removed and re-created per second (round robin)
//! and a misbehaving plugin starts every `bad_interval` (the kinds in turn),
//! each living `bad_lifetime`; then the load pauses for the *baseline*; then
//! the load resumes until `duration` of it has passed; then it pauses again
//! for the *final* sample.
//!
//! A pause lets the running misbehaving plugins end and be cleaned up, then
//! waits until kpm has settled (every well-behaved plugin registered, as many
//! sockets as plugins, no executor entry) for at least [`QUIET_MIN`], so that
//! both quiescent samples see the same steady state: any difference is left
//! over from the load in between. Samples are also taken every `sample_every`
//! throughout, to show the figures over time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kpm_registrar::Registrar;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::misbehave::{self, Counters, Misbehaviour};
use crate::plugins::{self, Plugin, Timing};
use crate::scenarios::{Context, listed, register_all, socket_of};
use crate::stats::{float, ms, round, summary};
use crate::{Result, metrics, procfs, report};

/// The shortest pause before a quiescent sample, once the misbehaving
/// plugins are gone: kpm's calls to them time out within 1 s (`GetInfo`),
/// its connections close with them, retries stop with their sockets.
const QUIET_MIN: Duration = Duration::from_secs(5);
/// The longest: a kpm that has not settled by then fails the verdict.
const QUIET_MAX: Duration = Duration::from_secs(30);
/// How often a pause checks whether kpm has settled.
const SETTLE_POLL: Duration = Duration::from_millis(250);
/// The longest default warm-up.
const WARMUP_MAX: Duration = Duration::from_secs(60);
/// Allowed growth of RSS and of the live heap, in percent of the baseline.
const MEMORY_GROWTH_PERCENT: u64 = 5;

/// What `soak` does, from the command line.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) plugins: usize,
    /// Well-behaved plugins re-created per second.
    pub(crate) rate: u32,
    /// Time under load, warm-up included, pauses excluded.
    pub(crate) duration: Duration,
    /// `None`: see [`Settings::warmup`].
    pub(crate) warmup: Option<Duration>,
    pub(crate) sample_every: Duration,
    pub(crate) bad_interval: Duration,
    pub(crate) bad_lifetime: Duration,
    /// Started in turn, one every `bad_interval`; empty for none.
    pub(crate) misbehaviours: Vec<Misbehaviour>,
    pub(crate) metrics: SocketAddr,
}

impl Settings {
    /// The warm-up: as given, or a third of the duration up to a minute,
    /// but at least one round of every well-behaved plugin and of every
    /// misbehaviour (the first of each allocates what later ones reuse),
    /// in whole rounds of the misbehaviours (see [`whole_rounds`](Self::whole_rounds)).
    fn warmup(&self) -> Duration {
        let warmup = self.warmup.unwrap_or_else(|| {
            let plugins = u32::try_from(self.plugins).unwrap_or(u32::MAX);
            let churn_round = Duration::from_secs(1) * plugins / self.rate.max(1);
            (self.duration / 3).min(WARMUP_MAX).max(churn_round).max(self.bad_round())
        });
        self.whole_rounds(warmup)
    }

    /// The time under load after the baseline, in whole rounds.
    fn rest(&self, warmup: Duration) -> Duration {
        self.whole_rounds(self.duration.saturating_sub(warmup))
    }

    /// The time it takes to start one misbehaving plugin of each kind.
    fn bad_round(&self) -> Duration {
        self.bad_interval * u32::try_from(self.misbehaviours.len()).unwrap_or(u32::MAX)
    }

    /// `duration` rounded to whole rounds of the misbehaviours (at least
    /// one), so that both pauses follow the same sequence of misbehaviours:
    /// kpm keeps its last 1024 events, rejection reasons included, and the
    /// reason of a huge name is 2 MiB.
    fn whole_rounds(&self, duration: Duration) -> Duration {
        let round = self.bad_round();
        if round.is_zero() {
            return duration;
        }
        let rounds = ((duration + round / 2).as_nanos() / round.as_nanos()).max(1);
        round * u32::try_from(rounds).unwrap_or(u32::MAX)
    }
}

/// One reading of kpm (and of the load generator's own file descriptors).
#[derive(Debug, Clone)]
struct Sample {
    /// Since the start of the run.
    at: Duration,
    /// `load`, `pause`, `baseline` or `final`.
    phase: &'static str,
    rss_kb: u64,
    /// kpm's live heap (`kpm_heap_allocated_bytes`), in KiB.
    heap_kb: Option<u64>,
    fds: u64,
    threads: u64,
    tasks: Option<u64>,
    /// Connections liveness keeps between probes (`kpm_liveness_probe_connections`):
    /// one fd and two tasks each, bounded, and gone with their plugin.
    probe_connections: Option<u64>,
    operations: Option<u64>,
    /// Sockets in kpm's actual and desired state of the world.
    registered: u64,
    desired: u64,
    /// kpm's counters since it started.
    registrations: Option<u64>,
    rejections: Option<u64>,
    /// Socket files in the registry.
    sockets: u64,
    /// Misbehaving plugins running.
    misbehaving: usize,
    loadgen_fds: u64,
}

impl Sample {
    fn json(&self) -> Value {
        json!({
            "t_s": round(self.at.as_secs_f64(), 1),
            "phase": self.phase,
            "rss_mb": procfs::mb(self.rss_kb),
            "rss_kb": self.rss_kb,
            "heap_mb": self.heap_kb.map(procfs::mb),
            "heap_kb": self.heap_kb,
            "fds": self.fds,
            "threads": self.threads,
            "tokio_tasks": self.tasks,
            "probe_connections": self.probe_connections,
            "executor_entries": self.operations,
            "registered": self.registered,
            "desired": self.desired,
            "registrations_total": self.registrations,
            "rejections_total": self.rejections,
            "sockets": self.sockets,
            "misbehaving": self.misbehaving,
            "loadgen_fds": self.loadgen_fds,
        })
    }

    /// Every well-behaved plugin registered, nothing else in the registry or
    /// in kpm's state, no executor entry.
    fn settled(&self, plugins: usize) -> bool {
        let plugins = u64::try_from(plugins).unwrap_or(u64::MAX);
        self.registered == plugins
            && self.desired == plugins
            && self.sockets == plugins
            && self.operations == Some(0)
    }
}

/// Where to read kpm.
#[derive(Debug)]
struct Probe {
    pid: String,
    metrics: SocketAddr,
    registry: PathBuf,
    begin: Instant,
}

impl Probe {
    /// A sample; `None` if kpm is gone.
    async fn sample(&self, phase: &'static str, misbehaving: usize) -> Result<Option<Sample>> {
        let (kpm, scrape) = match (procfs::sample(&self.pid), metrics::scrape(self.metrics).await) {
            (Ok(kpm), Ok(scrape)) => (kpm, scrape),
            _ if !procfs::alive(&self.pid) => return Ok(None),
            (Err(err), _) | (_, Err(err)) => return Err(err),
        };
        let plugins = "plugin_manager_total_plugins";
        Ok(Some(Sample {
            at: self.begin.elapsed(),
            phase,
            rss_kb: kpm.rss_kb,
            heap_kb: scrape.sum("kpm_heap_allocated_bytes", None).map(|bytes| bytes / 1024),
            fds: kpm.fds,
            threads: kpm.threads,
            tasks: scrape.sum("kpm_tokio_tasks", None),
            probe_connections: scrape.sum("kpm_liveness_probe_connections", None),
            operations: scrape.sum("kpm_operations", None),
            registered: scrape.count(plugins, Some("state=\"actual_state_of_world\"")),
            desired: scrape.count(plugins, Some("state=\"desired_state_of_world\"")),
            registrations: scrape.sum("kpm_registrations_total", None),
            rejections: scrape.sum("kpm_rejections_total", None),
            sockets: count_sockets(&self.registry),
            misbehaving,
            loadgen_fds: procfs::sample("self")?.fds,
        }))
    }
}

/// Sockets under `dir`, hidden names excluded, as kpm counts them.
fn count_sockets(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => count_sockets(&entry.path()),
            Ok(kind) if kind.is_socket() => 1,
            _ => 0,
        })
        .sum()
}

/// The registration latencies of the plugins churned in one minute.
#[derive(Debug, Default)]
struct Minute {
    latencies: Vec<Duration>,
    failures: usize,
}

/// The state of a run.
struct Soak<'a> {
    ctx: &'a Context,
    settings: &'a Settings,
    probe: Probe,
    sampling: Interval,
    samples: Vec<Sample>,
    kpm_gone: bool,
    /// The well-behaved plugins, by index, and the next to re-create.
    registrars: Vec<Option<Registrar>>,
    next_plugin: usize,
    churned: usize,
    /// Re-created plugins waiting for their notification: minute, socket, timing.
    waiting: Vec<(u64, String, Timing)>,
    minutes: BTreeMap<u64, Minute>,
    churn_failures: Vec<String>,
    /// The misbehaving plugins running, their tallies by kind, the next to start.
    running: JoinSet<(Misbehaviour, Result)>,
    kinds: Vec<(Misbehaviour, Arc<Counters>)>,
    next_bad: u64,
    bad_errors: Vec<String>,
}

/// Runs the soak and returns its JSON, verdict included.
pub(crate) async fn soak(ctx: &Context, settings: &Settings) -> Result<Value> {
    let pid = ctx.kpm()?;
    let warmup = settings.warmup();
    if warmup >= settings.duration {
        return Err(format!(
            "soak: the warm-up ({warmup:?}) must be shorter than the duration ({:?})",
            settings.duration
        )
        .into());
    }
    let rest = settings.rest(warmup);
    let probe = Probe {
        pid,
        metrics: settings.metrics,
        registry: ctx.registry.clone(),
        begin: Instant::now(),
    };
    let (settled, _, all_notified) = register_all(ctx, settings.plugins).await?;
    let setup = json!({
        "registered": settled.latencies.len(),
        "all_notified_ms": all_notified.map(ms),
        "failures": listed(&settled.failures),
    });
    let mut sampling = tokio::time::interval(settings.sample_every);
    sampling.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut soak = Soak {
        ctx,
        settings,
        probe,
        sampling,
        samples: Vec::new(),
        kpm_gone: false,
        registrars: settled.registrars.into_iter().map(Some).collect(),
        next_plugin: 0,
        churned: 0,
        waiting: Vec::new(),
        minutes: BTreeMap::new(),
        churn_failures: Vec::new(),
        running: JoinSet::new(),
        kinds: settings.misbehaviours.iter().map(|&kind| (kind, Arc::default())).collect(),
        next_bad: 0,
        bad_errors: Vec::new(),
    };

    eprintln!("soak: warming up for {warmup:?}");
    soak.load(warmup).await?;
    let baseline = soak.pause("baseline").await?;
    eprintln!("soak: baseline taken; loading for {rest:?} more");
    soak.load(rest).await?;
    let last = soak.pause("final").await?;
    soak.finish().await;
    Ok(soak.results(warmup + rest, warmup, &setup, baseline.as_ref(), last.as_ref()))
}

impl Soak<'_> {
    /// Churns and starts misbehaving plugins for `duration`, sampling.
    async fn load(&mut self, duration: Duration) -> Result {
        let interval = self.settings.bad_interval;
        // Half a tick early, so that the last misbehaving plugin started is
        // the last of a round (`Settings::whole_rounds`).
        let until = Instant::now() + duration.saturating_sub(interval / 2);
        let mut churn = tokio::time::interval(Duration::from_secs(1) / self.settings.rate.max(1));
        churn.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut bad = tokio::time::interval(interval);
        bad.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let misbehaving = !self.kinds.is_empty();
        while !self.kpm_gone {
            tokio::select! {
                () = tokio::time::sleep_until(until) => break,
                _ = churn.tick() => self.churn_next().await?,
                _ = bad.tick(), if misbehaving => self.start_misbehaving(),
                Some(joined) = self.running.join_next() => self.ended(joined),
                _ = self.sampling.tick() => self.sample("load").await?,
            }
        }
        Ok(())
    }

    /// Pauses the load until kpm has settled, then takes the sample `phase`.
    async fn pause(&mut self, phase: &'static str) -> Result<Option<Sample>> {
        eprintln!("soak: pausing for the {phase} sample");
        while !self.kpm_gone && !self.running.is_empty() {
            tokio::select! {
                Some(joined) = self.running.join_next() => self.ended(joined),
                _ = self.sampling.tick() => self.sample("pause").await?,
            }
        }
        let quiet_since = Instant::now();
        let mut poll = tokio::time::interval(SETTLE_POLL);
        while !self.kpm_gone {
            tokio::select! {
                _ = poll.tick() => {
                    let Some(now) = self.probe.sample("pause", 0).await? else {
                        self.kpm_gone = true;
                        break;
                    };
                    let quiet = quiet_since.elapsed();
                    if quiet >= QUIET_MAX || (quiet >= QUIET_MIN && now.settled(self.settings.plugins)) {
                        break;
                    }
                }
                _ = self.sampling.tick() => self.sample("pause").await?,
            }
        }
        if self.kpm_gone {
            return Ok(None);
        }
        self.collect(false).await;
        let sample = self.probe.sample(phase, 0).await?;
        match &sample {
            Some(sample) => self.samples.push(sample.clone()),
            None => self.kpm_gone = true,
        }
        Ok(sample)
    }

    /// A periodic sample, with the latencies that came in since the last.
    async fn sample(&mut self, phase: &'static str) -> Result {
        if let Some(sample) = self.probe.sample(phase, self.running.len()).await? {
            eprintln!(
                "soak: {:>5.0} s  RSS {:.1} MB, heap {} MB, {} fds, {} tasks, {} executor entries",
                sample.at.as_secs_f64(),
                procfs::mb(sample.rss_kb),
                sample.heap_kb.map_or_else(|| "-".to_owned(), |kb| procfs::mb(kb).to_string()),
                sample.fds,
                shown(sample.tasks),
                shown(sample.operations),
            );
            self.samples.push(sample);
        } else {
            eprintln!("soak: kpm is gone");
            self.kpm_gone = true;
        }
        self.collect(false).await;
        Ok(())
    }

    /// Re-creates the next well-behaved plugin.
    async fn churn_next(&mut self) -> Result {
        let index = self.next_plugin % self.registrars.len().max(1);
        self.next_plugin += 1;
        // Dropping the registrar unlinks its socket; the new one binds the same path.
        drop(self.registrars.get_mut(index).and_then(Option::take));
        let Plugin { registrar, timing } =
            plugins::start(&self.ctx.registry, self.ctx.kind, index).await?;
        let minute = self.probe.begin.elapsed().as_secs() / 60;
        self.waiting.push((minute, socket_of(&registrar), timing));
        if let Some(slot) = self.registrars.get_mut(index) {
            *slot = Some(registrar);
        }
        self.churned += 1;
        Ok(())
    }

    /// Starts the next misbehaving plugin.
    fn start_misbehaving(&mut self) {
        let count = u64::try_from(self.kinds.len()).unwrap_or(1);
        let slot = usize::try_from(self.next_bad % count).unwrap_or(0);
        let Some((kind, counters)) = self.kinds.get(slot) else { return };
        let (kind, counters) = (*kind, Arc::clone(counters));
        let (registry, seq) = (self.ctx.registry.clone(), self.next_bad);
        let lifetime = self.settings.bad_lifetime;
        self.running.spawn(async move {
            (kind, misbehave::run(kind, registry, seq, lifetime, counters).await)
        });
        self.next_bad += 1;
    }

    /// Records the end of a misbehaving plugin.
    fn ended(&mut self, joined: Result<(Misbehaviour, Result), tokio::task::JoinError>) {
        match joined {
            Ok((_, Ok(()))) => {}
            Ok((kind, Err(err))) => self.bad_errors.push(format!("{}: {err}", kind.label())),
            Err(err) => self.bad_errors.push(format!("misbehaving plugin task: {err}")),
        }
    }

    /// Files the outcome of the re-created plugins that have one (of all of
    /// them with `all`, waiting for the rest).
    async fn collect(&mut self, all: bool) {
        for (minute, socket, timing) in std::mem::take(&mut self.waiting) {
            if !all && !timing.notified.is_finished() {
                self.waiting.push((minute, socket, timing));
                continue;
            }
            let bucket = self.minutes.entry(minute).or_default();
            match timing.latency().await {
                Ok(latency) => bucket.latencies.push(latency),
                Err(reason) => {
                    bucket.failures += 1;
                    self.churn_failures.push(format!("{socket}: {reason}"));
                }
            }
        }
    }

    /// Ends the misbehaving plugins still running (if kpm died) and stops
    /// the well-behaved ones, so that every latency is in.
    async fn finish(&mut self) {
        while let Some(joined) = self.running.join_next().await {
            self.ended(joined);
        }
        self.registrars.clear();
        self.collect(true).await;
    }

    fn results(
        &self,
        loaded: Duration,
        warmup: Duration,
        setup: &Value,
        baseline: Option<&Sample>,
        last: Option<&Sample>,
    ) -> Value {
        let settings = self.settings;
        let minutes: Vec<Value> = self
            .minutes
            .iter()
            .map(|(minute, bucket)| {
                let mut value = summary(bucket.latencies.clone());
                if let Some(fields) = value.as_object_mut() {
                    fields.insert("minute".into(), (*minute).into());
                    fields.insert("not_registered".into(), bucket.failures.into());
                }
                value
            })
            .collect();
        let checks = checks(&Verdict {
            plugins: settings.plugins,
            kpm_alive: !self.kpm_gone,
            baseline,
            last,
            churn_failures: self.churn_failures.len(),
            bad_errors: self.bad_errors.len(),
        });
        let pass = checks.iter().all(|check| check["pass"] == true);
        json!({
            "scenario": "soak",
            "plugins": settings.plugins,
            "rate_per_s": settings.rate,
            "duration_s": settings.duration.as_secs_f64(),
            "load_s": loaded.as_secs_f64(),
            "warmup_s": warmup.as_secs_f64(),
            "sample_every_s": settings.sample_every.as_secs_f64(),
            "setup": setup,
            "churned": self.churned,
            "latency_by_minute": minutes,
            "churn_failure_count": self.churn_failures.len(),
            "churn_failures": listed(&self.churn_failures),
            "misbehaving": {
                "interval_ms": ms(settings.bad_interval),
                "lifetime_ms": ms(settings.bad_lifetime),
                "started": self.next_bad,
                "kinds": self.kinds.iter().map(|(kind, counters)| counters.json(*kind)).collect::<Vec<_>>(),
                "error_count": self.bad_errors.len(),
                "errors": listed(&self.bad_errors),
            },
            "kpm_alive": !self.kpm_gone,
            "samples": self.samples.iter().map(Sample::json).collect::<Vec<_>>(),
            "baseline": baseline.map(Sample::json),
            "final": last.map(Sample::json),
            "verdict": { "pass": pass, "checks": checks },
        })
    }
}

/// What the verdict is drawn from.
#[derive(Debug)]
struct Verdict<'a> {
    plugins: usize,
    kpm_alive: bool,
    baseline: Option<&'a Sample>,
    last: Option<&'a Sample>,
    churn_failures: usize,
    bad_errors: usize,
}

/// The growth allowed over a count at baseline: 2 % or 10, whichever is
/// more. Quiescent counts should match exactly; the slack absorbs what comes
/// and goes by itself (a connection closing late, an idle blocking-pool
/// thread, the scrape's own connection), while a leak of one per misbehaving
/// plugin (400 in ten minutes) or per kind-round (30) is far above it.
fn slack(baseline: u64) -> u64 {
    (baseline / 50).max(10)
}

/// The checks of the verdict, each `{check, baseline, final, limit, pass}`.
fn checks(verdict: &Verdict<'_>) -> Vec<Value> {
    let check = |name: &str, baseline: Value, last: Value, limit: String, pass: bool| json!({ "check": name, "baseline": baseline, "final": last, "limit": limit, "pass": pass });
    let mut checks = vec![check(
        "kpm alive to the end",
        Value::Null,
        verdict.kpm_alive.into(),
        "alive".to_owned(),
        verdict.kpm_alive,
    )];
    let (Some(base), Some(last)) = (verdict.baseline, verdict.last) else {
        checks.push(check(
            "quiescent samples",
            verdict.baseline.is_some().into(),
            verdict.last.is_some().into(),
            "both taken".to_owned(),
            false,
        ));
        return checks;
    };
    let no_growth = |name: &str, base: Option<u64>, last: Option<u64>| match (base, last) {
        (Some(base), Some(last)) => {
            let limit = base + slack(base);
            check(name, base.into(), last.into(), format!("≤ {limit}"), last <= limit)
        }
        _ => check(name, base.into(), last.into(), "no data".to_owned(), false),
    };
    // What the connections kept for probes hold is theirs, not a leak.
    let kept = |sample: &Sample, each: u64| sample.probe_connections.unwrap_or(0) * each;
    let fds = |sample: &Sample| sample.fds.saturating_sub(kept(sample, 1));
    let tasks = |sample: &Sample| sample.tasks.map(|tasks| tasks.saturating_sub(kept(sample, 2)));
    checks.push(no_growth(
        "kpm open fds, beyond probe connections",
        Some(fds(base)),
        Some(fds(last)),
    ));
    checks.push(no_growth("kpm tokio tasks, beyond probe connections", tasks(base), tasks(last)));
    checks.push(no_growth("kpm threads", Some(base.threads), Some(last.threads)));
    let memory = |name: &str, base: Option<u64>, last: Option<u64>| match (base, last) {
        (Some(base), Some(last)) => {
            let limit = base + base * MEMORY_GROWTH_PERCENT / 100;
            let growth = 100.0 * (float(last) / float(base.max(1)) - 1.0);
            check(
                name,
                procfs::mb(base).into(),
                procfs::mb(last).into(),
                format!("≤ {} (+{MEMORY_GROWTH_PERCENT} %); {growth:+.1} %", procfs::mb(limit)),
                last <= limit,
            )
        }
        _ => check(name, Value::Null, Value::Null, "no data".to_owned(), false),
    };
    checks.push(memory("kpm RSS (MB)", Some(base.rss_kb), Some(last.rss_kb)));
    checks.push(memory("kpm live heap (MB)", base.heap_kb, last.heap_kb));
    let plugins = u64::try_from(verdict.plugins).unwrap_or(u64::MAX);
    checks.push(check(
        "well-behaved plugins registered",
        base.registered.into(),
        last.registered.into(),
        format!("= {plugins}"),
        last.registered == plugins,
    ));
    checks.push(check(
        "sockets in the registry / in kpm's desired state",
        format!("{} / {}", base.sockets, base.desired).into(),
        format!("{} / {}", last.sockets, last.desired).into(),
        format!("= {plugins} / {plugins}"),
        last.sockets == plugins && last.desired == plugins,
    ));
    // An entry exists while a socket's operation runs or after it failed;
    // success drops it. Once settled, only unregistered sockets may have one.
    let unregistered = last.sockets.saturating_sub(last.registered);
    checks.push(check(
        "kpm executor entries",
        base.operations.into(),
        last.operations.into(),
        format!("= sockets not registered ({unregistered})"),
        last.operations == Some(unregistered),
    ));
    checks.push(check(
        "churned plugins not registered",
        Value::Null,
        verdict.churn_failures.into(),
        "0".to_owned(),
        verdict.churn_failures == 0,
    ));
    checks.push(no_growth(
        "load generator open fds",
        Some(base.loadgen_fds),
        Some(last.loadgen_fds),
    ));
    checks.push(check(
        "misbehaving plugins set up as intended",
        Value::Null,
        format!("{} errors", verdict.bad_errors).into(),
        "0 errors".to_owned(),
        verdict.bad_errors == 0,
    ));
    checks
}

fn shown(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| value.to_string())
}

/// A JSON value as a table cell: strings unquoted, `-` for null.
fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The tables of a soak's results: samples over time, latency by minute,
/// misbehaving plugins, verdict.
pub(crate) fn table(results: &Value) -> String {
    let field = |value: &Value, key: &str| cell(&value[key]);
    let list = |key: &str| results[key].as_array().cloned().unwrap_or_default();
    let mut out = format!(
        "kpm soak: {} plugins, {} re-created per second, a misbehaving plugin every {} ms \
         living {} ms; {} s under load (warm-up {} s), sampled every {} s\n\n",
        field(results, "plugins"),
        field(results, "rate_per_s"),
        cell(&results["misbehaving"]["interval_ms"]),
        cell(&results["misbehaving"]["lifetime_ms"]),
        field(results, "load_s"),
        field(results, "warmup_s"),
        field(results, "sample_every_s"),
    );
    let keys = [
        "t_s",
        "phase",
        "rss_mb",
        "heap_mb",
        "fds",
        "threads",
        "tokio_tasks",
        "executor_entries",
        "registered",
        "sockets",
        "registrations_total",
        "rejections_total",
        "misbehaving",
        "loadgen_fds",
    ];
    let headers = [
        "T (S)",
        "PHASE",
        "RSS MB",
        "HEAP MB",
        "FDS",
        "THREADS",
        "TASKS",
        "EXECUTOR",
        "REGISTERED",
        "SOCKETS",
        "REGISTRATIONS",
        "REJECTIONS",
        "MISBEHAVING",
        "LOADGEN FDS",
    ];
    let rows: Vec<Vec<String>> = list("samples")
        .iter()
        .map(|sample| keys.iter().map(|key| field(sample, key)).collect())
        .collect();
    out.push_str(&report::columns(&headers, &rows));

    out.push_str("\n\nregistration latency of the re-created plugins, by minute (ms):\n");
    let rows: Vec<Vec<String>> = list("latency_by_minute")
        .iter()
        .map(|minute| {
            ["minute", "count", "p50", "p99", "max", "not_registered"]
                .iter()
                .map(|key| field(minute, key))
                .collect()
        })
        .collect();
    let headers = ["MINUTE", "COUNT", "P50", "P99", "MAX", "NOT REGISTERED"];
    out.push_str(&report::columns(&headers, &rows));

    out.push_str("\n\nmisbehaving plugins:\n");
    let kinds = results["misbehaving"]["kinds"].as_array().cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = kinds
        .iter()
        .map(|kind| {
            ["kind", "instances", "get_info_calls", "notified_registered", "notified_rejected"]
                .iter()
                .map(|key| field(kind, key))
                .collect()
        })
        .collect();
    let headers = ["KIND", "INSTANCES", "GETINFO CALLS", "NOTIFIED OK", "NOTIFIED REJECTED"];
    out.push_str(&report::columns(&headers, &rows));
    for error in results["misbehaving"]["errors"].as_array().into_iter().flatten() {
        let _ = write!(out, "\n  error: {}", cell(error));
    }
    for failure in list("churn_failures") {
        let _ = write!(out, "\n  not registered: {}", cell(&failure));
    }

    out.push_str(&verdict_table(&results["verdict"]));
    out
}

/// The verdict and its checks.
fn verdict_table(verdict: &Value) -> String {
    let field = |value: &Value, key: &str| cell(&value[key]);
    let pass = verdict["pass"] == true;
    let mut out = format!("\n\nverdict: {}\n", if pass { "PASS" } else { "FAIL" });
    let rows: Vec<Vec<String>> = verdict["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|check| {
            let result = if check["pass"] == true { "ok" } else { "FAILED" };
            vec![
                field(check, "check"),
                field(check, "baseline"),
                field(check, "final"),
                field(check, "limit"),
                result.to_owned(),
            ]
        })
        .collect();
    out.push_str(&report::columns(&["CHECK", "BASELINE", "FINAL", "LIMIT", "RESULT"], &rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(fds: u64, tasks: u64, rss_kb: u64) -> Sample {
        Sample {
            at: Duration::from_secs(60),
            phase: "baseline",
            rss_kb,
            heap_kb: Some(rss_kb / 2),
            fds,
            threads: 3,
            tasks: Some(tasks),
            probe_connections: Some(0),
            operations: Some(0),
            registered: 200,
            desired: 200,
            registrations: Some(400),
            rejections: Some(30),
            sockets: 200,
            misbehaving: 0,
            loadgen_fds: 420,
        }
    }

    fn failed(checks: &[Value]) -> Vec<String> {
        checks.iter().filter(|c| c["pass"] != true).map(|c| c["check"].to_string()).collect()
    }

    #[test]
    fn the_verdict_allows_small_noise_and_catches_growth() {
        let base = sample(230, 700, 20_000);
        let verdict = |last: &Sample| {
            checks(&Verdict {
                plugins: 200,
                kpm_alive: true,
                baseline: Some(&base),
                last: Some(last),
                churn_failures: 0,
                bad_errors: 0,
            })
        };
        assert!(failed(&verdict(&sample(240, 714, 21_000))).is_empty());
        assert_eq!(
            failed(&verdict(&sample(241, 700, 20_000))),
            ["\"kpm open fds, beyond probe connections\""]
        );
        assert_eq!(
            failed(&verdict(&sample(230, 715, 20_000))),
            ["\"kpm tokio tasks, beyond probe connections\""]
        );
        // Twenty more connections kept for probes: one fd and two tasks each.
        let kept = Sample { probe_connections: Some(20), ..sample(250, 740, 20_000) };
        assert!(failed(&verdict(&kept)).is_empty());
        assert_eq!(failed(&verdict(&sample(230, 700, 21_001))), ["\"kpm RSS (MB)\""]);
        let heap_grew = Sample { heap_kb: Some(10_501), ..sample(230, 700, 20_000) };
        assert_eq!(failed(&verdict(&heap_grew)), ["\"kpm live heap (MB)\""]);
        let leaked = Sample { operations: Some(3), ..sample(230, 700, 20_000) };
        assert_eq!(failed(&verdict(&leaked)), ["\"kpm executor entries\""]);
        let stuck = Sample { registered: 199, ..sample(230, 700, 20_000) };
        assert_eq!(
            failed(&verdict(&stuck)),
            ["\"well-behaved plugins registered\"", "\"kpm executor entries\""]
        );
        let died = checks(&Verdict {
            plugins: 200,
            kpm_alive: false,
            baseline: Some(&base),
            last: None,
            churn_failures: 0,
            bad_errors: 0,
        });
        assert_eq!(failed(&died), ["\"kpm alive to the end\"", "\"quiescent samples\""]);
    }

    #[test]
    fn the_default_warmup_covers_a_round_of_everything() {
        let settings = Settings {
            plugins: 200,
            rate: 20,
            duration: Duration::from_secs(600),
            warmup: None,
            sample_every: Duration::from_secs(10),
            bad_interval: Duration::from_millis(1500),
            bad_lifetime: Duration::from_secs(4),
            misbehaviours: Misbehaviour::ALL.to_vec(),
            metrics: SocketAddr::from(([127, 0, 0, 1], 9464)),
        };
        // A round is 13 kinds every 1.5 s: 19.5 s.
        let round = Duration::from_millis(19_500);
        assert_eq!(settings.warmup(), round * 3);
        assert_eq!(settings.rest(round * 3), round * 28);
        let short = Settings { duration: Duration::from_secs(60), ..settings.clone() };
        assert_eq!(short.warmup(), round);
        assert_eq!(short.rest(round), round * 2);
        let given = Settings { warmup: Some(Duration::from_secs(5)), ..settings.clone() };
        assert_eq!(given.warmup(), round);
        let calm = Settings { misbehaviours: Vec::new(), ..settings };
        assert_eq!(calm.warmup(), Duration::from_secs(60));
        assert_eq!(calm.rest(Duration::from_secs(60)), Duration::from_secs(540));
    }

    #[test]
    fn sockets_are_counted_in_subdirectories_but_not_hidden_ones() {
        let dir = std::env::temp_dir().join(format!("kpm-soak-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::create_dir_all(dir.join(".hidden")).unwrap();
        let _a = std::os::unix::net::UnixListener::bind(dir.join("a.sock")).unwrap();
        let _b = std::os::unix::net::UnixListener::bind(dir.join("sub/b.sock")).unwrap();
        let _c = std::os::unix::net::UnixListener::bind(dir.join(".hidden/c.sock")).unwrap();
        std::fs::write(dir.join("not-a-socket"), b"").unwrap();
        assert_eq!(count_sockets(&dir), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
