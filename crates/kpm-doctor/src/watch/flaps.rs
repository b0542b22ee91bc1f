//! Flap damping: a socket or finding whose verdict, or presence, changes
//! more than [`FlapConfig::changes`] times within [`FlapConfig::window`] is
//! [`Verdict::Flapping`], a failure, until it has held still for
//! [`FlapConfig::hold`]. Alerting does the same with hysteresis
//! (Prometheus' `for:`, Nagios' flap detection): a plugin that comes and
//! goes every few seconds is neither a storm of writes nor invisible, and
//! once flapping, what is published stays put until it is stable again.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use crate::ConfigError;
use crate::config::{MAX_PERIOD, bounded};
use crate::judge::Verdict;
use crate::outcome::{Failing, Outcome, Socket};

/// How a flapping plugin is told and damped. [`Default`], else made by
/// [`try_new`](Self::try_new) or [`builder`](Self::builder), which check
/// each field once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FlapConfig {
    window: Duration,
    changes: u32,
    hold: Duration,
}

impl Default for FlapConfig {
    fn default() -> Self {
        Self { window: Duration::from_secs(120), changes: 4, hold: Duration::from_secs(60) }
    }
}

impl FlapConfig {
    /// Flapping is `changes` changes within `window` (0: never), until
    /// `hold` without one; the window and the hold are each between 1 s
    /// and a day.
    pub fn try_new(window: Duration, changes: u32, hold: Duration) -> Result<Self, ConfigError> {
        Self::builder().window(window).changes(changes).hold(hold).build()
    }

    /// A builder from the defaults.
    pub fn builder() -> FlapConfigBuilder {
        FlapConfigBuilder(Self::default())
    }

    /// How far back changes are counted: 1 s to a day. Default 2 min.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// How many changes within the window make it flapping; 0 turns
    /// damping off. Default 4: a plugin restarting once (gone, back) is
    /// not flapping, one restarting twice within the window is.
    pub fn changes(&self) -> u32 {
        self.changes
    }

    /// How long it must hold still before it is judged as it is again:
    /// 1 s to a day. Default 1 min.
    pub fn hold(&self) -> Duration {
        self.hold
    }
}

/// A [`FlapConfig`] being set; [`build`](Self::build) checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlapConfigBuilder(FlapConfig);

impl FlapConfigBuilder {
    /// Sets [`FlapConfig::window`] (default 2 min).
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.0.window = window;
        self
    }

    /// Sets [`FlapConfig::changes`] (default 4; 0: no damping).
    #[must_use]
    pub fn changes(mut self, changes: u32) -> Self {
        self.0.changes = changes;
        self
    }

    /// Sets [`FlapConfig::hold`] (default 1 min).
    #[must_use]
    pub fn hold(mut self, hold: Duration) -> Self {
        self.0.hold = hold;
        self
    }

    /// The config, once each field is in its range; the error names the
    /// first that is not.
    pub fn build(self) -> Result<FlapConfig, ConfigError> {
        let range = Duration::from_secs(1)..=MAX_PERIOD;
        let FlapConfig { window, changes, hold } = self.0;
        Ok(FlapConfig {
            window: bounded("flaps.window", window, &range, "between 1s and 24h")?,
            changes,
            hold: bounded("flaps.hold", hold, &range, "between 1s and 24h")?,
        })
    }
}

/// What a path was seen as in a pass: its verdict, or gone.
type State = Option<Verdict>;

/// One path's history.
#[derive(Debug)]
struct History {
    state: State,
    /// When its state changed, within the window.
    changes: VecDeque<Instant>,
    /// When its state last changed, counted or not.
    last_change: Option<Instant>,
    /// How it showed while present: kept, so that while it flaps it is
    /// shown the same way whether it is there or not.
    socket: Option<Socket>,
    failing: Option<Failing>,
    /// Set while flapping: the changes counted when it began.
    flapping: Option<usize>,
}

/// The histories of the node's paths.
#[derive(Debug)]
pub(crate) struct Flaps {
    config: FlapConfig,
    paths: BTreeMap<PathBuf, History>,
}

impl Flaps {
    pub(crate) fn new(config: FlapConfig) -> Self {
        Self { config, paths: BTreeMap::new() }
    }

    /// Counts what changed from the pass before to `seen`, at `now`. A
    /// blind pass sees nothing and changes nothing.
    pub(crate) fn observe(&mut self, seen: &Outcome, now: Instant) {
        if self.config.changes == 0 || seen.blind.is_some() {
            return;
        }
        let paths: BTreeSet<PathBuf> = seen
            .sockets
            .keys()
            .chain(seen.failing.keys())
            .chain(self.paths.keys())
            .cloned()
            .collect();
        for path in paths {
            let socket = seen.sockets.get(&path);
            let failing = seen.failing.get(&path);
            let state = socket.map(|s| s.verdict).or_else(|| failing.map(|f| f.verdict));
            let history = self.paths.entry(path).or_insert_with(|| History {
                state: None,
                changes: VecDeque::new(),
                last_change: None,
                socket: None,
                failing: None,
                flapping: None,
            });
            if let Some(socket) = socket {
                history.socket = Some(socket.clone());
            }
            if let Some(failing) = failing {
                history.failing = Some(failing.clone());
            }
            if history.state != state {
                history.state = state;
                history.changes.push_back(now);
                history.last_change = Some(now);
            }
            let window = self.config.window;
            while history.changes.front().is_some_and(|at| now.duration_since(*at) > window) {
                history.changes.pop_front();
            }
            let still =
                history.last_change.is_none_or(|at| now.duration_since(at) >= self.config.hold);
            if history.flapping.is_some() && still {
                history.flapping = None;
                history.changes.clear();
            } else if history.flapping.is_none()
                && history.changes.len() >= self.config.changes as usize
            {
                history.flapping = Some(history.changes.len());
            }
        }
        // A path gone and still, and not flapping, is forgotten.
        self.paths.retain(|_, history| {
            history.state.is_some() || history.flapping.is_some() || !history.changes.is_empty()
        });
    }

    /// `seen` as published: each flapping path fails as
    /// [`Verdict::Flapping`], shown as it was when present, whatever it is
    /// now.
    pub(crate) fn damp(&self, mut seen: Outcome) -> Outcome {
        if seen.blind.is_some() {
            return seen;
        }
        for (path, history) in &self.paths {
            let Some(changes) = history.flapping else { continue };
            let reason = format!(
                "it changed {changes} times within {}; judged as it is once it holds still for {}",
                humantime::format_duration(self.config.window),
                humantime::format_duration(self.config.hold),
            );
            if let Some(socket) = &history.socket {
                seen.sockets.insert(
                    path.clone(),
                    Socket { verdict: Verdict::Flapping, reason: reason.clone(), ..socket.clone() },
                );
            }
            let (subject, name) = match (&history.failing, &history.socket) {
                (Some(failing), _) => (failing.subject.clone(), failing.name.clone()),
                (None, Some(socket)) => (socket.subject(path), socket.name.clone()),
                (None, None) => continue,
            };
            seen.failing.insert(
                path.clone(),
                Failing { verdict: Verdict::Flapping, subject, name, reason, cause: None },
            );
        }
        seen
    }

    /// When the next flapping path will have held still long enough: the
    /// node is judged again then, so that it is published at once.
    pub(crate) fn next_stable(&self) -> Option<Instant> {
        self.paths
            .values()
            .filter(|history| history.flapping.is_some())
            .filter_map(|history| history.last_change.map(|at| at + self.config.hold))
            .min()
    }
}
