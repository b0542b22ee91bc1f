//! Flap damping: a socket or finding that comes back to a state it was
//! in within [`FlapConfig::window`] [`FlapConfig::changes`] times is
//! [`Verdict::Flapping`], a failure, until it has held still for
//! [`FlapConfig::hold`]. Coming back is what is counted, not every change:
//! a plugin that restarts once passes through stale, gone and not yet
//! registered on its way back to ok, and comes back twice at most (to not
//! registered and to ok), whatever it passed through; one that comes and
//! goes comes back on every cycle. Alerting does the same with hysteresis
//! (Prometheus' `for:`, Nagios' flap detection): a plugin that comes and
//! goes every few seconds is neither a storm of writes nor invisible, and
//! once flapping, what is published stays put until it is stable again.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use crate::ConfigError;
use crate::config::PERIOD;
use crate::standing::{Failing, Socket, Standing};
use kpm_report::Verdict;

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
        Self { window: Duration::from_secs(120), changes: 3, hold: Duration::from_secs(60) }
    }
}

impl FlapConfig {
    /// Flapping is coming back to a state `changes` times within `window`
    /// (0: never), until `hold` without a change; the window and the hold are each between 1 s
    /// and a day.
    pub fn try_new(window: Duration, changes: u32, hold: Duration) -> Result<Self, ConfigError> {
        Self::builder().window(window).changes(changes).hold(hold).build()
    }

    /// A builder from the defaults.
    pub fn builder() -> FlapConfigBuilder {
        FlapConfigBuilder(Self::default())
    }

    /// How far back comings back are counted: 1 s to a day. Default 2 min.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// How many times coming back to a state it was in within the window
    /// make it flapping; 0 turns damping off. Default 3: a plugin
    /// restarting once (2 at most) is not flapping, one restarting again
    /// within the window is.
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

    /// Sets [`FlapConfig::changes`] (default 3; 0: no damping).
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
        let FlapConfig { window, changes, hold } = self.0;
        Ok(FlapConfig {
            window: PERIOD.check("flaps.window", window)?,
            changes,
            hold: PERIOD.check("flaps.hold", hold)?,
        })
    }
}

/// What a path was seen as in a pass: its verdict, or gone.
type State = Option<Verdict>;

/// One path's history.
#[derive(Debug)]
struct History {
    state: State,
    /// When it was last in each state.
    visited: BTreeMap<State, Instant>,
    /// When it came back to a state, within the window.
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
    pub(crate) fn observe(&mut self, seen: &Standing, now: Instant) {
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
                visited: BTreeMap::new(),
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
            let window = self.config.window;
            if history.state != state {
                history.visited.insert(history.state, now);
                if history.visited.get(&state).is_some_and(|at| now.duration_since(*at) <= window) {
                    history.changes.push_back(now);
                }
                history.state = state;
                history.last_change = Some(now);
            }
            history.visited.insert(state, now);
            history.visited.retain(|_, at| now.duration_since(*at) <= window);
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
    pub(crate) fn damp(&self, mut seen: Standing) -> Standing {
        if seen.blind.is_some() {
            return seen;
        }
        for (path, history) in &self.paths {
            let Some(changes) = history.flapping else { continue };
            let reason = format!(
                "it came back to a state it was in {changes} times within {}; judged as it is once it holds still for {}",
                humantime::format_duration(self.config.window),
                humantime::format_duration(self.config.hold),
            );
            if let Some(socket) = &history.socket {
                seen.sockets.insert(
                    path.clone(),
                    Socket { verdict: Verdict::Flapping, reason: reason.clone(), ..socket.clone() },
                );
            }
            // A finding keeps its cause while it flaps: a CSINode entry a
            // flapping socket keeps is that socket's failure, not one more.
            let (subject, name, cause, pod) = match (&history.failing, &history.socket) {
                (Some(failing), _) => (
                    failing.subject.clone(),
                    failing.name.clone(),
                    failing.cause.clone(),
                    failing.pod.clone(),
                ),
                (None, Some(socket)) => {
                    (socket.subject(path), socket.name.clone(), None, socket.pod.clone())
                }
                (None, None) => continue,
            };
            seen.failing.insert(
                path.clone(),
                Failing { verdict: Verdict::Flapping, subject, name, reason, cause, pod },
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::Diagnosis;
    use crate::judge::Row;

    const SOCKET: &str = "/r/plugins_registry/csi.example.com-reg.sock";

    fn seen(verdict: Option<Verdict>) -> Standing {
        let rows = verdict
            .map(|verdict| Row::new(verdict, Path::new(SOCKET), "registry", "x".to_owned()))
            .into_iter()
            .collect();
        Standing::of(&Diagnosis::of_parts(rows, Vec::new(), None))
    }

    fn flapping(flaps: &Flaps) -> bool {
        flaps.damp(seen(None)).failing.values().any(|f| f.verdict == Verdict::Flapping)
    }

    #[tokio::test(start_paused = true)]
    async fn a_restart_through_stale_and_not_registered_is_not_flapping_two_are() {
        let mut flaps = Flaps::new(FlapConfig::default());
        let restart = [
            Some(Verdict::Ok),
            Some(Verdict::Stale),
            None,
            Some(Verdict::NotRegistered),
            Some(Verdict::Ok),
        ];
        for state in restart {
            flaps.observe(&seen(state), Instant::now());
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert!(!flapping(&flaps), "one restart comes back twice");
        for state in restart.into_iter().skip(1) {
            flaps.observe(&seen(state), Instant::now());
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert!(flapping(&flaps), "a second within the window makes it flapping");
        // Still for the hold: judged as it is again.
        tokio::time::advance(FlapConfig::default().hold).await;
        flaps.observe(&seen(Some(Verdict::Ok)), Instant::now());
        assert!(!flapping(&flaps));
    }

    /// The registrar killed again and again: its socket goes stale and the
    /// CSINode entry it keeps goes with it, both flap, and the node still
    /// counts one failure, the socket's.
    #[tokio::test(start_paused = true)]
    async fn a_finding_keeps_its_cause_while_both_flap() {
        use crate::Finding;
        let entry = Path::new("csinodes/node1");
        let pass = |stale: bool| {
            let verdict = if stale { Verdict::Stale } else { Verdict::Ok };
            let row = Row::new(verdict, Path::new(SOCKET), "registry", "x".to_owned());
            let findings = stale
                .then(|| Finding {
                    verdict: Verdict::StaleCsiNodeEntry,
                    path: entry.to_path_buf(),
                    name: Some("csi.example.com".to_owned()),
                    reason: "no live plugin serves it".to_owned(),
                    hint: String::new(),
                    cause: Some(PathBuf::from(SOCKET)),
                })
                .into_iter()
                .collect();
            Standing::of(&Diagnosis::of_parts(vec![row], findings, None))
        };
        let mut flaps = Flaps::new(FlapConfig::default());
        for stale in [false, true, false, true, false, true, false, true] {
            flaps.observe(&pass(stale), Instant::now());
            tokio::time::advance(Duration::from_secs(2)).await;
        }
        for now_stale in [false, true] {
            let damped = flaps.damp(pass(now_stale));
            let flapping: Vec<&Path> = damped
                .failing
                .iter()
                .filter(|(_, failing)| failing.verdict == Verdict::Flapping)
                .map(|(path, _)| path.as_path())
                .collect();
            assert_eq!(flapping, [Path::new(SOCKET), entry], "both flap");
            assert_eq!(damped.failing[entry].cause.as_deref(), Some(Path::new(SOCKET)));
            let condition = damped.condition();
            assert!(condition.message.starts_with("1 failing: "), "{}", condition.message);
        }
    }

    #[test]
    fn out_of_range_settings_are_refused_by_name() {
        let second = Duration::from_secs(1);
        assert!(FlapConfig::try_new(second, 3, second).is_ok());
        let refused = |window, hold| match FlapConfig::try_new(window, 4, hold) {
            Err(ConfigError::OutOfRange(refused)) => refused.field,
            other => panic!("{other:?}"),
        };
        assert_eq!(refused(Duration::ZERO, second), "flaps.window");
        assert_eq!(refused(second, Duration::from_secs(2 * 24 * 3600)), "flaps.hold");
    }
}
