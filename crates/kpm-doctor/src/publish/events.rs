//! Events on the Node (`events.k8s.io/v1`), one for each plugin that enters
//! a failing verdict and one when it recovers (and for the node when the
//! doctor cannot judge it, and when it can again), aggregated and rate-limited
//! as client-go's event broadcaster and correlator do, so that a flapping
//! plugin cannot flood the API server:
//!
//! - **Series.** An event isomorphic to one sent less than
//!   [`EventConfig::series_window`] (6 min) ago (the same reason about the
//!   same plugin) is not sent again: the second makes the first a series
//!   (`series.count` 2, patched at once), later ones only count, and the
//!   count is patched every [`EventConfig::series_refresh`] (30 min), as
//!   `k8s.io/client-go/tools/events` does.
//! - **Rate.** Every create and patch takes a token of a bucket of
//!   [`EventConfig::burst`] (25) refilled one per [`EventConfig::refill`]
//!   (5 min): the defaults of client-go's spam filter. A write without a
//!   token waits for one.
//! - **Outages.** What could not be sent waits, in order, in a queue of at
//!   most [`MAX_QUEUED`] (the oldest dropped and counted beyond) and goes
//!   out once the API server answers.

use std::collections::{HashMap, VecDeque};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use std::time::Duration;
use tokio::time::Instant;

use crate::ConfigError;
use crate::standing::Standing;
use kpm::api::config::Bounds;
use kpm_report::{CANNOT_JUDGE_REASON, Verdict};

use crate::config::{MAX_PERIOD, PERIOD};

/// The namespace of events about a cluster-scoped object such as a Node,
/// as the kubelet records them.
pub const EVENT_NAMESPACE: &str = "default";

/// The `reportingController` of every event: the doctor's field manager.
pub const REPORTING_CONTROLLER: &str = crate::FIELD_MANAGER;

/// The `action` of every event.
pub const ACTION: &str = "Judge";

/// The reason of the event a plugin recovers with.
pub const RECOVERED_REASON: &str = "PluginRecovered";

/// The reason of the event a doctor that could not look at its node
/// ([`CANNOT_JUDGE_REASON`](kpm_report::CANNOT_JUDGE_REASON)) sees it again with.
pub const CAN_JUDGE_REASON: &str = "CanJudge";

/// The reason of the `Normal` Event when a flapping plugin holds still
/// again.
pub const STABLE_REASON: &str = "PluginStable";

/// The most actions kept while the API server cannot be reached; the
/// oldest goes first when more come.
pub const MAX_QUEUED: usize = 64;

/// The longest note the API server accepts (1 kB).
const MAX_NOTE_BYTES: usize = 1024;

/// How events are aggregated and rate-limited. [`Default`], else made by
/// [`builder`](Self::builder), whose [`build`](EventConfigBuilder::build)
/// checks each field once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventConfig {
    series_window: Duration,
    series_refresh: Duration,
    burst: u32,
    refill: Duration,
}

impl Default for EventConfig {
    fn default() -> Self {
        Self {
            series_window: Duration::from_secs(6 * 60),
            series_refresh: Duration::from_secs(30 * 60),
            burst: 25,
            refill: Duration::from_secs(5 * 60),
        }
    }
}

impl EventConfig {
    /// A builder from the defaults.
    pub fn builder() -> EventConfigBuilder {
        EventConfigBuilder(Self::default())
    }

    /// How long after its last occurrence an event still takes repeats into
    /// its series: 1 s to a day. Default 6 min (client-go's `finishTime`).
    pub fn series_window(&self) -> Duration {
        self.series_window
    }

    /// How often a series' count is patched: 1 s to a day. Default 30 min
    /// (client-go's `refreshTime`).
    pub fn series_refresh(&self) -> Duration {
        self.series_refresh
    }

    /// Writes allowed at once: 1 (none would never write) to
    /// [`MAX_BURST`]. Default 25 (client-go's spam filter).
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// Time for one more write to be allowed: 1 ms (a zero refill would
    /// be no limit) to a day. Default 5 min.
    pub fn refill(&self) -> Duration {
        self.refill
    }
}

/// The largest [`EventConfig::burst`].
pub const MAX_BURST: u32 = 10_000;

/// The range of [`EventConfig::burst`](crate::EventConfig::burst): 1 to [`MAX_BURST`].
pub const BURST: Bounds<u32> = Bounds::new(1, MAX_BURST, "between 1 and 10000");

/// The range of [`EventConfig::refill`](crate::EventConfig::refill): a millisecond to a day.
pub const REFILL: Bounds<Duration> =
    Bounds::new(Duration::from_millis(1), MAX_PERIOD, "between 1ms and 24h");

/// An [`EventConfig`] being set; [`build`](Self::build) checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventConfigBuilder(EventConfig);

impl EventConfigBuilder {
    /// Sets [`EventConfig::series_window`] (default 6 min).
    #[must_use]
    pub fn series_window(mut self, window: Duration) -> Self {
        self.0.series_window = window;
        self
    }

    /// Sets [`EventConfig::series_refresh`] (default 30 min).
    #[must_use]
    pub fn series_refresh(mut self, refresh: Duration) -> Self {
        self.0.series_refresh = refresh;
        self
    }

    /// Sets [`EventConfig::burst`] (default 25).
    #[must_use]
    pub fn burst(mut self, burst: u32) -> Self {
        self.0.burst = burst;
        self
    }

    /// Sets [`EventConfig::refill`] (default 5 min).
    #[must_use]
    pub fn refill(mut self, refill: Duration) -> Self {
        self.0.refill = refill;
        self
    }

    /// The config, once each field is in its range; the error names the
    /// first that is not.
    pub fn build(self) -> Result<EventConfig, ConfigError> {
        let EventConfig { series_window, series_refresh, burst, refill } = self.0;
        Ok(EventConfig {
            series_window: PERIOD.check("events.series_window", series_window)?,
            series_refresh: PERIOD.check("events.series_refresh", series_refresh)?,
            burst: BURST.check("events.burst", burst)?,
            refill: REFILL.check("events.refill", refill)?,
        })
    }
}

/// Whether an event reports trouble.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// A reference to the pod of `container`, for an Event's `related`.
fn pod_reference(container: &kpm_report::PodContainer) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        namespace: Some(container.namespace.clone()),
        name: Some(container.pod.clone()),
        uid: Some(container.uid.clone()),
        field_path: Some(format!("spec.containers{{{}}}", container.container)),
        ..ObjectReference::default()
    }
}

/// Something that happened to a plugin of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Occurrence {
    pub(crate) event_type: EventType,
    pub(crate) reason: String,
    /// The plugin's socket or the object, which with the reason makes
    /// occurrences isomorphic.
    pub(crate) about: String,
    pub(crate) note: String,
    /// The pod container the plugin runs in, when it is known: the
    /// Event's `related`, so that a search by the pod finds it.
    pub(crate) related: Option<kpm_report::PodContainer>,
}

/// A write to make.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Write {
    Create(Box<Event>),
    /// `series` of event `name`.
    Series {
        name: String,
        count: i32,
        last_observed: Timestamp,
    },
}

impl Write {
    /// The event's name, for logs.
    pub(crate) fn name(&self) -> &str {
        match self {
            Self::Create(event) => event.metadata.name.as_deref().unwrap_or_default(),
            Self::Series { name, .. } => name,
        }
    }

    /// The merge patch of a series write.
    pub(crate) fn series_patch(count: i32, last_observed: Timestamp) -> serde_json::Value {
        let series = EventSeries { count, last_observed_time: MicroTime(last_observed) };
        serde_json::json!({ "series": series })
    }
}

/// An event sent (or queued), as long as repeats can join its series.
#[derive(Debug)]
struct Sent {
    name: String,
    /// Occurrences so far, the first included.
    count: i32,
    last_observed: Timestamp,
    last_observed_at: Instant,
    /// The count the API server has.
    count_written: i32,
}

/// The events of one node: what to write, when, and what was dropped.
#[derive(Debug)]
pub(crate) struct EventRecorder {
    config: EventConfig,
    regarding: ObjectReference,
    instance: String,
    sent: HashMap<(String, String), Sent>,
    queue: VecDeque<Write>,
    tokens: f64,
    tokens_at: Instant,
    next_refresh: Instant,
    /// New events dropped for want of a token or of queue room.
    pub(crate) dropped: u64,
}

impl EventRecorder {
    /// The recorder of events about `regarding` (the Node), reported by
    /// `instance`.
    pub(crate) fn new(config: EventConfig, regarding: ObjectReference, instance: String) -> Self {
        let now = Instant::now();
        Self {
            config,
            regarding,
            instance,
            sent: HashMap::new(),
            queue: VecDeque::new(),
            tokens: f64::from(config.burst),
            tokens_at: now,
            next_refresh: now + config.series_refresh,
            dropped: 0,
        }
    }

    /// Records `occurrence`: a new event, a series' second occurrence or a
    /// count.
    pub(crate) fn record(&mut self, occurrence: Occurrence) {
        let now = Instant::now();
        self.finish_series(now);
        let key = (occurrence.reason.clone(), occurrence.about.clone());
        let observed = Timestamp::now();
        if let Some(sent) = self.sent.get_mut(&key) {
            sent.count = sent.count.saturating_add(1);
            sent.last_observed = observed;
            sent.last_observed_at = now;
            if sent.count == 2 {
                let write =
                    Write::Series { name: sent.name.clone(), count: 2, last_observed: observed };
                sent.count_written = 2;
                self.push(write);
            }
            return;
        }
        let name = format!(
            "{}.{:x}",
            self.regarding.name.as_deref().unwrap_or_default(),
            observed.as_nanosecond()
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(EVENT_NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(observed)),
            reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            action: Some(ACTION.to_owned()),
            reason: Some(occurrence.reason),
            regarding: Some(self.regarding.clone()),
            related: occurrence.related.as_ref().map(pod_reference),
            note: Some(bounded(&occurrence.note, MAX_NOTE_BYTES)),
            type_: Some(occurrence.event_type.as_str().to_owned()),
            ..Event::default()
        };
        self.sent.insert(
            key,
            Sent {
                name,
                count: 1,
                last_observed: observed,
                last_observed_at: now,
                count_written: 1,
            },
        );
        self.push(Write::Create(Box::new(event)));
    }

    fn push(&mut self, write: Write) {
        if self.queue.len() >= MAX_QUEUED {
            self.queue.pop_front();
            self.dropped += 1;
        }
        self.queue.push_back(write);
    }

    /// Forgets series whose last occurrence is older than the window,
    /// after queueing their last count.
    fn finish_series(&mut self, now: Instant) {
        let window = self.config.series_window;
        let mut finished = Vec::new();
        self.sent.retain(|_, sent| {
            let open = now.saturating_duration_since(sent.last_observed_at) < window;
            if !open && sent.count > sent.count_written {
                finished.push(Write::Series {
                    name: sent.name.clone(),
                    count: sent.count,
                    last_observed: sent.last_observed,
                });
            }
            open
        });
        for write in finished {
            self.push(write);
        }
    }

    /// Queues the counts of every series that changed, when a refresh is due.
    fn refresh_series(&mut self, now: Instant) {
        if now < self.next_refresh {
            return;
        }
        self.next_refresh = now + self.config.series_refresh;
        let mut writes = Vec::new();
        for sent in self.sent.values_mut().filter(|sent| sent.count > sent.count_written) {
            sent.count_written = sent.count;
            writes.push(Write::Series {
                name: sent.name.clone(),
                count: sent.count,
                last_observed: sent.last_observed,
            });
        }
        for write in writes {
            self.push(write);
        }
    }

    /// The next write to make now, if a token allows; it leaves the queue
    /// only by [`sent`](Self::sent), so that one that fails is tried again.
    pub(crate) fn next_write(&mut self) -> Option<&Write> {
        let now = Instant::now();
        self.finish_series(now);
        self.refresh_series(now);
        self.refill(now);
        if self.tokens < 1.0 {
            return None;
        }
        self.queue.front()
    }

    /// The front write went through, or was refused for good.
    pub(crate) fn sent(&mut self) {
        self.queue.pop_front();
        self.tokens -= 1.0;
    }

    /// When something will be due without a new occurrence: a token for a
    /// queued write, a series refresh, a series to finish.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        let token = (!self.queue.is_empty()).then(|| {
            let missing = (1.0 - self.tokens).max(0.0);
            self.tokens_at + self.config.refill.mul_f64(missing)
        });
        let counts_pending = self.sent.values().any(|sent| sent.count > sent.count_written);
        let refresh = counts_pending.then_some(self.next_refresh);
        let finish = self
            .sent
            .values()
            .filter(|sent| sent.count > sent.count_written)
            .map(|sent| sent.last_observed_at + self.config.series_window)
            .min();
        [token, refresh, finish].into_iter().flatten().min()
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.tokens_at);
        let refill = self.config.refill.as_secs_f64().max(f64::MIN_POSITIVE);
        self.tokens =
            (self.tokens + elapsed.as_secs_f64() / refill).min(f64::from(self.config.burst));
        self.tokens_at = now;
    }
}

/// `text` cut to at most `bytes` bytes on a character boundary.
fn bounded(text: &str, bytes: usize) -> String {
    if text.len() <= bytes {
        return text.to_owned();
    }
    let mut end = bytes.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// What the Events about the whole node are about, rather than a socket or
/// an object: with the reason, it makes them isomorphic.
const NODE: &str = "node";

/// The Events from `before` to `now`. A blind pass tells of no
/// recovery: what it does not see, it cannot call fixed.
pub(crate) fn transitions(now: &Standing, before: &Standing) -> Vec<Occurrence> {
    let mut occurrences = Vec::new();
    match (&before.blind, &now.blind) {
        (None, Some(blind)) => occurrences.push(Occurrence {
            event_type: EventType::Warning,
            reason: CANNOT_JUDGE_REASON.to_owned(),
            about: NODE.to_owned(),
            note: format!("cannot judge this node: {}; try: {}", blind.why, blind.hint),
            related: None,
        }),
        (Some(was), None) => occurrences.push(Occurrence {
            event_type: EventType::Normal,
            reason: CAN_JUDGE_REASON.to_owned(),
            about: NODE.to_owned(),
            note: format!("the node is judged again; before: {}", was.why),
            related: None,
        }),
        _ => {}
    }
    for (path, failing) in &now.failing {
        if before.failing.get(path).is_some_and(|was| was.verdict == failing.verdict) {
            continue;
        }
        occurrences.push(Occurrence {
            event_type: EventType::Warning,
            reason: failing.verdict.reason(),
            about: path.display().to_string(),
            note: format!(
                "{} ({}{}) is {}: {}",
                failing.subject,
                path.display(),
                failing.pod.as_ref().map_or_else(String::new, |pod| format!(", {pod}")),
                failing.verdict.name(),
                failing.reason
            ),
            related: failing.pod.clone(),
        });
    }
    if now.blind.is_some() {
        return occurrences;
    }
    for (path, was) in &before.failing {
        let verdict_now = now.failing.get(path).map(|failing| failing.verdict);
        if was.verdict == Verdict::Flapping && verdict_now != Some(Verdict::Flapping) {
            let settled = match (verdict_now, now.sockets.get(path)) {
                (Some(verdict), _) => verdict.name(),
                (None, Some(socket)) => socket.verdict.name(),
                (None, None) => "gone",
            };
            occurrences.push(Occurrence {
                event_type: EventType::Normal,
                reason: STABLE_REASON.to_owned(),
                about: path.display().to_string(),
                note: format!(
                    "{} ({}) holds still again after flapping: {settled}",
                    was.subject,
                    path.display()
                ),
                related: was.pod.clone(),
            });
            continue;
        }
        if verdict_now.is_some() {
            continue;
        }
        occurrences.push(Occurrence {
            event_type: EventType::Normal,
            reason: RECOVERED_REASON.to_owned(),
            about: path.display().to_string(),
            note: format!(
                "{} ({}) is no longer {}",
                was.subject,
                path.display(),
                was.verdict.name()
            ),
            related: was.pod.clone(),
        });
    }
    occurrences
}

#[cfg(test)]
mod tests;
