//! The writing of one metric or one family of them at a scrape: the
//! helpers the scrape-time collector and the allocator's figures share.

use std::fmt;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, EncodeMetric,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// One counter.
pub(super) fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: impl EncodeCounterValue,
) -> fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// One gauge.
pub(super) fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: impl EncodeGaugeValue,
) -> fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// A gauge with one sample per label set; left out when it has none, as the
/// registry leaves out an empty family.
pub(super) fn gauge_family<L: EncodeLabelSet, V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    family(encoder, name, help, samples.into_iter().map(|(l, v)| (l, ConstGauge::new(v))))
}

/// A counter with one sample per label set; left out when it has none.
pub(super) fn counter_family<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, u64)>,
) -> fmt::Result {
    family(encoder, name, help, samples.into_iter().map(|(l, v)| (l, ConstCounter::new(v))))
}

/// A family of `metrics`, one per label set, typed by the first; none when empty.
fn family<L: EncodeLabelSet, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    metrics: impl IntoIterator<Item = (L, M)>,
) -> fmt::Result {
    let mut metrics = metrics.into_iter().peekable();
    let Some((_, first)) = metrics.peek() else {
        return Ok(());
    };
    let mut family = encoder.encode_descriptor(name, help, None, first.metric_type())?;
    for (labels, metric) in metrics {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}
