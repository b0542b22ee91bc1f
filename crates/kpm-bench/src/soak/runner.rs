//! The soak's run: the load, the pauses, the samples, and its results
//! (drawn into a verdict by [`report`](super::report)).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kpm_registrar::Registrar;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::report::{Allocator, Sample, Verdict, checks};
use crate::misbehave::{self, Counters, Misbehaviour};
use crate::plugins::{self, Plugin, Timing};
use crate::scenarios::{Context, register_all, socket_of};
use crate::stats::{listed, ms, summary};
use crate::{Result, metrics, procfs};

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

impl Sample {
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
        let kib =
            |figure: &str| scrape.sum(&format!("kpm_heap_{figure}_bytes"), None).map(|b| b / 1024);
        Ok(Some(Sample {
            at: self.begin.elapsed(),
            phase,
            rss_kb: kpm.rss_kb,
            rss_anon_kb: kpm.rss_anon_kb,
            rss_file_kb: kpm.rss_file_kb,
            heap_kb: kib("allocated"),
            allocator: Allocator {
                active_kb: kib("active"),
                metadata_kb: kib("metadata"),
                resident_kb: kib("resident"),
                mapped_kb: kib("mapped"),
                retained_kb: kib("retained"),
                dirty_kb: kib("dirty"),
                muzzy_kb: kib("muzzy"),
                cached_kb: kib("thread_cache"),
                arenas: scrape.count("kpm_heap_dirty_bytes", None),
            },
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
            samples: &self.samples,
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

fn shown(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

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
