//! What a node's doctor publishes through the Kubernetes API: its Node
//! condition ([`CONDITION_TYPE`]) and Events on the Node.
//!
//! - **The condition** is written with server-side apply under
//!   [`FIELD_MANAGER`], to `nodes/status`: the conditions are a list map
//!   keyed by type, so the apply owns this one condition and never touches
//!   the kubelet's (`Ready`, `MemoryPressure`) or anyone else's. It is
//!   written when it changes, and otherwise once a heartbeat
//!   ([`PublishConfig::heartbeat`], 30 min), which refreshes
//!   `lastHeartbeatTime`; `lastTransitionTime` moves only when the status
//!   does. At start the Node's own copy is read back, so that a restarted
//!   doctor keeps both times and writes nothing new.
//! - **The report**, the node's [`KubeletPluginReport`],
//!   says the same typed, one entry per socket: created with the Node as
//!   owner, its status applied when it changes and at the heartbeat
//!   (`report`).
//! - **Events** ([`events`]) are aggregated and rate-limited.
//! - **Failures.** A write that fails (the API server down, a 403) is
//!   logged once per kind of failure, naming what could not be written,
//!   and tried again with backoff ([`PublishConfig::retry`], 1 s doubling
//!   to 2 min); the doctor meanwhile keeps judging. Once the API server
//!   answers, the current condition and the queued events go out.

pub(crate) mod config;
pub mod events;
mod report;
#[cfg(test)]
pub(crate) mod stand_in;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeCondition, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::time::Instant;
use tracing::{info, warn};

use kpm::Backoff;

use kpm_report::{CONDITION_TYPE, ConditionStatus, DOCTOR_STOPPED_REASON, KubeletPluginReport};

use crate::condition::{
    Conditions, FIELD_MANAGER, PluginConditionType, PluginsCondition, condition_apply,
};
use crate::standing::{Standing, status_of};
use config::MAX_RETRY;
pub use config::{PublishConfig, PublishConfigBuilder};
use events::{EVENT_NAMESPACE, EventRecorder, Write};
pub(crate) use events::{EventType, Occurrence};
pub use report::last_report;

/// Why a write to the API server failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// Reading the Node (its uid and the condition already there).
    #[error("read Node {node}: {source}")]
    ReadNode {
        /// The node.
        node: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The Node does not exist; the doctor never creates it.
    #[error("Node {node} not found; the doctor waits for it and never creates it")]
    NodeNotFound {
        /// The node.
        node: String,
    },
    /// Applying the condition to `nodes/status`.
    #[error("write condition {CONDITION_TYPE} of Node {node}: {source}")]
    WriteCondition {
        /// The node.
        node: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Reading the node's report an earlier run wrote.
    #[error("read KubeletPluginReport {node}: {source}")]
    ReadReport {
        /// The node.
        node: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Creating the node's report or applying its status.
    #[error("write KubeletPluginReport {node}: {source}")]
    WriteReport {
        /// The node.
        node: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Creating an event or patching its series.
    #[error("write event {name} of Node {node}: {source}")]
    WriteEvent {
        /// The node.
        node: String,
        /// The event's name.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A request took longer than the request timeout.
    #[error("{step} for Node {node}: no answer within {timeout:?}")]
    Timeout {
        /// What was asked: `read Node`, `write condition`, `write event`,
        /// `read report`, `create report`, `write report`.
        step: &'static str,
        /// The node.
        node: String,
        /// The request timeout.
        timeout: Duration,
    },
}

impl PublishError {
    /// Whether trying again cannot help: the API server refused the write
    /// itself as invalid (an event whose series is gone, say).
    fn is_permanent(&self) -> bool {
        let (Self::WriteEvent { source, .. } | Self::WriteCondition { source, .. }) = self else {
            return false;
        };
        matches!(source, kube::Error::Api(status) if matches!(status.code, 400 | 404 | 409 | 422))
    }
}

/// What a publisher did: counts of API writes, read without a lock.
#[derive(Debug, Default)]
pub struct PublishStats {
    condition_writes: AtomicU64,
    report_writes: AtomicU64,
    event_writes: AtomicU64,
    failed_writes: AtomicU64,
    events_dropped: AtomicU64,
    failing: AtomicBool,
}

impl PublishStats {
    /// Condition writes the API server took.
    pub fn condition_writes(&self) -> u64 {
        self.condition_writes.load(Ordering::Relaxed)
    }

    /// Report creates and status applies the API server took.
    pub fn report_writes(&self) -> u64 {
        self.report_writes.load(Ordering::Relaxed)
    }

    /// Event creates and series patches the API server took.
    pub fn event_writes(&self) -> u64 {
        self.event_writes.load(Ordering::Relaxed)
    }

    /// Requests that failed.
    pub fn failed_writes(&self) -> u64 {
        self.failed_writes.load(Ordering::Relaxed)
    }

    /// Events dropped: refused as invalid, or pushed out of a full queue.
    pub fn events_dropped(&self) -> u64 {
        self.events_dropped.load(Ordering::Relaxed)
    }

    /// Whether the last attempt failed.
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }
}

/// The condition as published.
#[derive(Debug, Clone)]
struct Published {
    conditions: Conditions,
    /// When they were last written, on the clock that schedules heartbeats.
    written_at: Instant,
}

/// Publishes one node's condition and events; owned by the task that
/// judges the node ([`NodeWatch`](crate::NodeWatch), which also records
/// the Events of each change), which sets what to publish and calls
/// [`sync`](Self::sync), and waits until [`next_due`](Self::next_due).
#[derive(Debug)]
pub struct NodePublisher {
    node: String,
    config: PublishConfig,
    nodes: Api<Node>,
    reports: Api<KubeletPluginReport>,
    events_api: Api<Event>,
    recorder: EventRecorder,
    /// The Node's uid and condition have been read.
    started: bool,
    /// The Node's uid, which the Events name.
    regarding_uid: Option<String>,
    /// The conditions to write; none before the first pass.
    wanted: Conditions,
    published: Option<Published>,
    report: report::ReportState,
    retry_at: Option<Instant>,
    /// The waits between tries while writes fail; reset by a success.
    backoff: Backoff,
    /// The failure last logged: a new kind of failure is logged again.
    logged_failure: Option<String>,
    stats: Arc<PublishStats>,
}

impl NodePublisher {
    /// A publisher for Node `node` through `client`.
    pub fn new(client: kube::Client, node: impl Into<String>, config: PublishConfig) -> Self {
        let node = node.into();
        let regarding = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Node".to_owned()),
            name: Some(node.clone()),
            ..ObjectReference::default()
        };
        let instance = format!("{FIELD_MANAGER}-{node}");
        let backoff = Backoff::new(config.retries());
        Self {
            nodes: Api::all(client.clone()),
            reports: Api::all(client.clone()),
            events_api: Api::namespaced(client, EVENT_NAMESPACE),
            recorder: EventRecorder::new(config.events(), regarding, bounded_name(&instance)),
            node,
            config,
            started: false,
            regarding_uid: None,
            wanted: Conditions::new(),
            published: None,
            report: report::ReportState::default(),
            retry_at: None,
            backoff,
            logged_failure: None,
            stats: Arc::default(),
        }
    }

    /// What it publishes with.
    pub fn config(&self) -> &PublishConfig {
        &self.config
    }

    /// Its counts, shared.
    pub fn stats(&self) -> Arc<PublishStats> {
        Arc::clone(&self.stats)
    }

    /// What `outcome` comes to, to publish: the condition, and the report
    /// from the same outcome.
    pub(crate) fn set(&mut self, outcome: &Standing) {
        let condition = outcome.condition();
        let mut status = status_of(outcome, &condition, &Time(Timestamp::now()));
        if let Some(before) = self.report.latest() {
            status.keep_since(before);
        }
        self.report.wanted = Some(status);
        let plugins = self.config.plugin_conditions().iter().map(|plugin| {
            (plugin.condition_type().to_owned(), outcome.plugin_condition(plugin.plugin()))
        });
        let conditions: Vec<(String, PluginsCondition)> =
            [(CONDITION_TYPE.to_owned(), condition)].into_iter().chain(plugins).collect();
        self.set_conditions(conditions);
    }

    /// The conditions to publish, by type; each one's `lastTransitionTime`
    /// moves when its status differs from the one before.
    pub(crate) fn set_conditions(&mut self, conditions: Vec<(String, PluginsCondition)>) {
        let wanted = conditions
            .into_iter()
            .map(|(condition_type, condition)| {
                // The one before: the last set, else the one published
                // (by an earlier run too).
                let before = self.wanted.get(&condition_type).or_else(|| {
                    self.published.as_ref().and_then(|p| p.conditions.get(&condition_type))
                });
                let transition = match before {
                    Some((was, at)) if was.status == condition.status => *at,
                    _ => Timestamp::now(),
                };
                (condition_type, (condition, transition))
            })
            .collect();
        self.wanted = wanted;
    }

    /// Sets every condition `Unknown`, [`DOCTOR_STOPPED_REASON`], and tries
    /// once to write it: for a doctor that stops with its node (a
    /// shutdown, a reboot), so that no condition it wrote vouches for the
    /// node's plugins until a doctor judges them again. A doctor replaced
    /// by another (a rollout) leaves its conditions as they are.
    pub async fn stop(&mut self, why: &str) {
        let conditions = self
            .wanted
            .keys()
            .map(|condition_type| {
                let condition = PluginsCondition {
                    status: ConditionStatus::Unknown,
                    reason: DOCTOR_STOPPED_REASON.to_owned(),
                    message: format!(
                        "the doctor stopped ({why}): nothing judges this node's \
                                      plugins until a doctor runs again"
                    ),
                };
                (condition_type.clone(), condition)
            })
            .collect();
        self.set_conditions(conditions);
        self.retry_at = None;
        self.sync().await;
    }

    /// An event to publish.
    pub(crate) fn record(&mut self, occurrence: Occurrence) {
        self.recorder.record(occurrence);
    }

    /// When [`sync`](Self::sync) has something to do without a new
    /// condition or event: a retry, a heartbeat, an event's turn.
    pub fn next_due(&self) -> Option<Instant> {
        if let Some(retry_at) = self.retry_at {
            return Some(retry_at);
        }
        let heartbeat = self.published.as_ref().map(|p| p.written_at + self.config.heartbeat());
        let report = self.report.next_due(self.config.heartbeat());
        [heartbeat, report, self.recorder.next_due()].into_iter().flatten().min()
    }

    /// Makes the writes due now, unless a failure's backoff runs; a failure
    /// is logged (once per kind) and tried again later.
    pub async fn sync(&mut self) {
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        match self.write().await {
            Ok(()) => {
                self.retry_at = None;
                self.backoff.reset();
                self.stats.failing.store(false, Ordering::Relaxed);
                if self.logged_failure.take().is_some() {
                    info!(node = %self.node, "publishing to the API server again");
                }
            }
            Err(err) => {
                self.stats.failed_writes.fetch_add(1, Ordering::Relaxed);
                self.stats.failing.store(true, Ordering::Relaxed);
                // At most `MAX_RETRY`, so the sum cannot overflow.
                self.retry_at = Some(Instant::now() + self.backoff.next_delay());
                let text = failure_kind(&err);
                if self.logged_failure.as_deref() != Some(&text) {
                    warn!(
                        node = %self.node,
                        error = %kpm::api::error_chain(&err),
                        "cannot publish to the API server; judging goes on, and the current \
                         state is published once it can be"
                    );
                    self.logged_failure = Some(text);
                }
            }
        }
    }

    async fn write(&mut self) -> Result<(), PublishError> {
        if !self.started {
            self.adopt().await?;
            self.adopt_report().await?;
            self.started = true;
        }
        self.write_condition().await?;
        self.write_events().await?;
        self.write_report().await
    }

    /// Reads the Node: its uid, for events, and the condition an earlier
    /// run published, taken as published when it says what is wanted.
    async fn adopt(&mut self) -> Result<(), PublishError> {
        let node = self.node.clone();
        let read = self.within("read Node", self.nodes.get_opt(&node)).await?;
        let found = read.map_err(|source| PublishError::ReadNode { node: node.clone(), source })?;
        let Some(found) = found else { return Err(PublishError::NodeNotFound { node }) };
        self.regarding_uid = found.metadata.uid;
        let own: Vec<&str> = [CONDITION_TYPE]
            .into_iter()
            .chain(self.config.plugin_conditions().iter().map(PluginConditionType::condition_type))
            .collect();
        let existing: Vec<NodeCondition> = found
            .status
            .and_then(|status| status.conditions)
            .unwrap_or_default()
            .into_iter()
            .filter(|condition| own.contains(&condition.type_.as_str()))
            .collect();
        self.adopt_conditions(&existing);
        Ok(())
    }

    /// Takes the conditions an earlier run wrote as published, dated by
    /// the oldest heartbeat among them; a wanted one of the same status
    /// keeps its transition time.
    fn adopt_conditions(&mut self, existing: &[NodeCondition]) {
        let mut conditions = Conditions::new();
        let mut oldest: Option<Timestamp> = None;
        for condition in existing {
            let (Some(transition), Some(heartbeat)) =
                (&condition.last_transition_time, &condition.last_heartbeat_time)
            else {
                continue;
            };
            let adopted = PluginsCondition {
                status: ConditionStatus::from_api(&condition.status),
                reason: condition.reason.clone().unwrap_or_default(),
                message: condition.message.clone().unwrap_or_default(),
            };
            if let Some((wanted, at)) = self.wanted.get_mut(&condition.type_)
                && wanted.status == adopted.status
            {
                *at = transition.0;
            }
            oldest = Some(oldest.map_or(heartbeat.0, |oldest| oldest.min(heartbeat.0)));
            conditions.insert(condition.type_.clone(), (adopted, transition.0));
        }
        let Some(heartbeat) = oldest else { return };
        // The heartbeat's age, on the wall clock, dates the write.
        let age = Timestamp::now().duration_since(heartbeat);
        let age = Duration::try_from(age).unwrap_or_default().min(self.config.heartbeat());
        let written_at = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        self.published = Some(Published { conditions, written_at });
    }

    async fn write_condition(&mut self) -> Result<(), PublishError> {
        if self.wanted.is_empty() {
            return Ok(());
        }
        let due = match &self.published {
            None => true,
            Some(published) => {
                published.conditions != self.wanted
                    || Instant::now() >= published.written_at + self.config.heartbeat()
            }
        };
        if !due {
            return Ok(());
        }
        let patch = condition_apply(&self.node, &self.wanted, Timestamp::now());
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let node = self.node.clone();
        let written = self
            .within(
                "write condition",
                self.nodes.patch_status(&node, &params, &Patch::Apply(&patch)),
            )
            .await?;
        written.map_err(|source| PublishError::WriteCondition { node, source })?;
        self.stats.condition_writes.fetch_add(1, Ordering::Relaxed);
        self.published =
            Some(Published { conditions: self.wanted.clone(), written_at: Instant::now() });
        Ok(())
    }

    async fn write_events(&mut self) -> Result<(), PublishError> {
        while let Some(mut write) = self.recorder.next_write().cloned() {
            let name = write.name().to_owned();
            // An event recorded before the Node was read names its uid now.
            if let Write::Create(event) = &mut write
                && let Some(regarding) = &mut event.regarding
            {
                regarding.uid.clone_from(&self.regarding_uid);
            }
            let result = match &write {
                Write::Create(event) => {
                    let created = self
                        .within(
                            "write event",
                            self.events_api.create(&PostParams::default(), event),
                        )
                        .await?;
                    created.map(drop)
                }
                Write::Series { name, count, last_observed } => {
                    let patch = Write::series_patch(*count, *last_observed);
                    let patched = self
                        .within(
                            "write event",
                            self.events_api.patch(
                                name,
                                &PatchParams::default(),
                                &Patch::Merge(&patch),
                            ),
                        )
                        .await?;
                    patched.map(drop)
                }
            };
            match result.map_err(|source| PublishError::WriteEvent {
                node: self.node.clone(),
                name,
                source,
            }) {
                Ok(()) => {
                    self.stats.event_writes.fetch_add(1, Ordering::Relaxed);
                    self.recorder.sent();
                }
                Err(err) if err.is_permanent() => {
                    warn!(node = %self.node, error = %kpm::api::error_chain(&err), "event refused; dropped");
                    self.stats.events_dropped.fetch_add(1, Ordering::Relaxed);
                    self.recorder.sent();
                }
                Err(err) => return Err(err),
            }
        }
        self.stats.events_dropped.fetch_max(self.recorder.dropped, Ordering::Relaxed);
        Ok(())
    }

    /// `request`, or a timeout error naming `step`.
    async fn within<T>(
        &self,
        step: &'static str,
        request: impl Future<Output = T>,
    ) -> Result<T, PublishError> {
        let timeout = self.config.request_timeout();
        tokio::time::timeout(timeout, request).await.map_err(|_| PublishError::Timeout {
            step,
            node: self.node.clone(),
            timeout,
        })
    }
}

/// What makes two failures the same for the log: the step and the status
/// code or the kind of error, not the details that change each time.
fn failure_kind(err: &PublishError) -> String {
    let source = match err {
        PublishError::ReadNode { source, .. }
        | PublishError::WriteCondition { source, .. }
        | PublishError::ReadReport { source, .. }
        | PublishError::WriteReport { source, .. }
        | PublishError::WriteEvent { source, .. } => source,
        PublishError::NodeNotFound { .. } => return "not found".to_owned(),
        PublishError::Timeout { step, .. } => return format!("{step} timeout"),
    };
    let step = match err {
        PublishError::ReadNode { .. } => "read",
        PublishError::WriteCondition { .. } => "condition",
        PublishError::ReadReport { .. } | PublishError::WriteReport { .. } => "report",
        _ => "event",
    };
    match source {
        kube::Error::Api(status) => format!("{step} {}", status.code),
        _ => format!("{step} unreachable"),
    }
}

/// A `reportingInstance` is at most 128 characters.
fn bounded_name(name: &str) -> String {
    name.chars().take(128).collect()
}
