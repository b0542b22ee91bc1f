//! The metrics of a node's doctor, read at each scrape from the last pass
//! and the publisher's counts (a prometheus-client collector):
//!
//! - `kpm_doctor_plugins{verdict, type}`: entries of the last pass per
//!   verdict and plugin type. `type` is `CSIPlugin`, `DevicePlugin`,
//!   `DRAPlugin`, `other` (any other type a plugin reports) or `none` (not
//!   told: a stale socket, a finding about the node); so the family has at
//!   most 19 × 5 series, however many sockets a node has: there is no label
//!   per socket.
//! - `kpm_doctor_cannot_judge`: 1 while the last pass could not look
//!   (the condition `Unknown`), when `kpm_doctor_plugins` may be empty: no
//!   entry failing is then no all-clear.
//! - `kpm_doctor_last_pass_timestamp_seconds`, `kpm_doctor_passes_total`;
//! - `kpm_doctor_api_writes_total{kind}` (`condition`, `event`),
//!   `kpm_doctor_api_write_failures_total`, `kpm_doctor_events_dropped_total`
//!   and `kpm_doctor_api_failing` (1 while the last write failed).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::Diagnosis;
use crate::publish::PublishStats;
use kpm_report::Verdict;

/// What the last pass found, for the metrics.
#[derive(Debug, Default, Clone)]
struct LastPass {
    counts: BTreeMap<(Verdict, &'static str), u64>,
    blind: bool,
    at_seconds: f64,
    passes: u64,
}

/// The doctor's metrics: fed by each pass, read by each scrape.
#[derive(Debug, Clone, Default)]
pub struct DoctorMetrics {
    last: Arc<Mutex<LastPass>>,
    publish: Arc<Mutex<Option<Arc<PublishStats>>>>,
}

impl DoctorMetrics {
    /// Registers the doctor's metrics with `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }

    /// Counts `report`'s entries, as of now.
    pub fn observe(&self, report: &Diagnosis) {
        let mut counts = BTreeMap::new();
        let rows = report.plugins.iter().map(|row| (row.verdict, type_label(row)));
        let findings = report.findings.iter().map(|finding| (finding.verdict, "none"));
        for key in rows.chain(findings) {
            *counts.entry(key).or_insert(0) += 1;
        }
        let at_seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64());
        let mut last = self.last.lock();
        last.counts = counts;
        last.blind = report.blind.is_some();
        last.at_seconds = at_seconds;
        last.passes += 1;
    }

    /// Reads the publisher's counts from now on.
    pub fn publisher(&self, stats: Arc<PublishStats>) {
        *self.publish.lock() = Some(stats);
    }
}

/// The `type` label of a row, one of a closed set: its kind's plugin
/// type, `other` for a plugin that told a type the kubelet has no handler
/// for, `none` for a socket that told nothing.
fn type_label(row: &crate::Row) -> &'static str {
    match (row.kind, &row.name) {
        (Some(kind), _) => kind.plugin_type(),
        (None, Some(_)) => "other",
        (None, None) => "none",
    }
}

impl Collector for DoctorMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let last = self.last.lock().clone();
        {
            let mut family = encoder.encode_descriptor(
                "kpm_doctor_plugins",
                "Entries of the node's last pass per verdict and plugin type (none: not told).",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for ((verdict, plugin_type), count) in &last.counts {
                let labels = [("verdict", verdict.name()), ("type", plugin_type)];
                ConstGauge::new(i64::try_from(*count).unwrap_or(i64::MAX))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        let blind = ConstGauge::new(i64::from(last.blind));
        blind.encode(encoder.encode_descriptor(
            "kpm_doctor_cannot_judge",
            "1 while the last pass could not look where the node's plugins live (the condition Unknown).",
            None,
            blind.metric_type(),
        )?)?;
        let gauge = ConstGauge::new(last.at_seconds);
        gauge.encode(encoder.encode_descriptor(
            "kpm_doctor_last_pass_timestamp_seconds",
            "When the node was last judged, in seconds since the epoch.",
            None,
            gauge.metric_type(),
        )?)?;
        counter(&mut encoder, "kpm_doctor_passes", "Passes over the node.", last.passes)?;
        let Some(publish) = self.publish.lock().clone() else { return Ok(()) };
        let writes = [
            ("condition", publish.condition_writes()),
            ("report", publish.report_writes()),
            ("event", publish.event_writes()),
        ];
        let counter_type = ConstCounter::new(0_u64).metric_type();
        {
            let mut family = encoder.encode_descriptor(
                "kpm_doctor_api_writes",
                "Writes the API server took: the Node condition, the KubeletPluginReport, Events (creates and series).",
                None,
                counter_type,
            )?;
            for (kind, count) in writes {
                ConstCounter::new(count).encode(family.encode_family(&[("kind", kind)])?)?;
            }
        }
        counter(
            &mut encoder,
            "kpm_doctor_api_write_failures",
            "API requests that failed; each is tried again with backoff.",
            publish.failed_writes(),
        )?;
        counter(
            &mut encoder,
            "kpm_doctor_events_dropped",
            "Events dropped: refused as invalid, or pushed out of the queue during an outage.",
            publish.events_dropped(),
        )?;
        let failing = ConstGauge::new(i64::from(publish.failing()));
        failing.encode(encoder.encode_descriptor(
            "kpm_doctor_api_failing",
            "1 while the last write to the API server failed.",
            None,
            failing.metric_type(),
        )?)
    }
}

fn counter(encoder: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: u64) -> fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}
