//! The metrics whose values are owned elsewhere (the manager, the handlers,
//! the runtime, the allocator), read afresh at each scrape.
//!
//! Each scrape builds its own [`Reading`] and encodes it; nothing is shared
//! between scrapes, so concurrent scrapers never see each other's half-built
//! families.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, EncodeMetric,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::heap::{self, HeapStats};
use kpm::KubeletHandle;

/// Encodes the scrape-time metrics from [`KubeletHandle`]; registered with the
/// registry as a collector.
#[derive(Debug)]
pub(super) struct Scraped {
    kubelet: KubeletHandle,
}

impl Scraped {
    pub(super) fn new(kubelet: KubeletHandle) -> Self {
        Self { kubelet }
    }
}

impl Collector for Scraped {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        Reading::take(&self.kubelet).encode(&mut encoder)
    }
}

/// One read of every source, as one scrape shows it.
struct Reading {
    backoff_skips: u64,
    rescans: u64,
    operations: usize,
    /// `None` outside a tokio runtime.
    tasks: Option<usize>,
    /// `None` if jemalloc cannot tell.
    heap: Option<HeapStats>,
    /// `(socket path, state)`, one per socket in each state of the world.
    plugins: Vec<(String, &'static str)>,
    /// `(resource, health, devices)`.
    devices: Vec<(String, &'static str, usize)>,
    /// `(driver, connected, instances)`.
    dra_instances: Vec<(String, &'static str, usize)>,
}

impl Reading {
    /// Reads every source once. The only place the scrape reads them.
    fn take(kubelet: &KubeletHandle) -> Self {
        let manager = kubelet.manager();
        let stats = manager.stats();
        let desired = manager.desired_state().snapshot().into_iter().map(|p| p.socket_path);
        let actual = manager.actual_state().snapshot().into_iter().map(|p| p.socket_path);
        let plugins = desired
            .map(|socket| (socket, "desired_state_of_world"))
            .chain(actual.map(|socket| (socket, "actual_state_of_world")))
            .map(|(socket, state)| (socket.display().to_string(), state))
            .collect();
        let devices = kubelet
            .devices()
            .resources()
            .into_iter()
            .flat_map(|r| {
                [(r.resource.clone(), "healthy", r.healthy), (r.resource, "unhealthy", r.unhealthy)]
            })
            .collect();
        let dra_instances = kubelet
            .dra()
            .drivers()
            .into_iter()
            .flat_map(|driver| {
                let connected = driver.instances.iter().filter(|i| i.connected).count();
                let disconnected = driver.instances.len() - connected;
                [(driver.name.clone(), "true", connected), (driver.name, "false", disconnected)]
            })
            .collect();
        Self {
            backoff_skips: stats.backoff_skips,
            rescans: stats.rescans,
            operations: stats.operations,
            tasks: tokio::runtime::Handle::try_current()
                .ok()
                .map(|runtime| runtime.metrics().num_alive_tasks()),
            heap: heap::stats(),
            plugins,
            devices,
            dra_instances,
        }
    }

    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
        counter(
            encoder,
            "kpm_backoff_skips",
            "Operations not started because their socket was backing off.",
            self.backoff_skips,
        )?;
        counter(
            encoder,
            "kpm_watcher_rescans",
            "Full re-listings of the registry directory (overflow, periodic, requested).",
            self.rescans,
        )?;
        gauge(
            encoder,
            "kpm_operations",
            "Sockets the operation executor keeps an entry for (running, backing off, failed).",
            self.operations,
        )?;
        if let Some(tasks) = self.tasks {
            gauge(encoder, "kpm_tokio_tasks", "Tasks alive in kpm's async runtime.", tasks)?;
        }
        if let Some(heap) = self.heap {
            gauge(
                encoder,
                "kpm_heap_allocated_bytes",
                "Bytes kpm has allocated and not freed (the allocator's live heap).",
                heap.allocated,
            )?;
            gauge(
                encoder,
                "kpm_heap_resident_bytes",
                "Bytes in pages kpm's allocator keeps resident (live heap, metadata, freed pages not returned yet).",
                heap.resident,
            )?;
        }
        gauge_family(
            encoder,
            "plugin_manager_total_plugins",
            "Number of plugins in Plugin Manager.",
            self.plugins.iter().map(|(socket, state)| {
                ([("socket_path", socket.as_str()), ("state", state)], 1_usize)
            }),
        )?;
        gauge_family(
            encoder,
            "kpm_device_plugin_devices",
            "Devices of device-plugin resources, by health.",
            self.devices.iter().map(|(resource, health, devices)| {
                ([("resource", resource.as_str()), ("health", health)], *devices)
            }),
        )?;
        gauge_family(
            encoder,
            "kpm_dra_driver_instances",
            "Instances of DRA drivers, by connection state.",
            self.dra_instances.iter().map(|(driver, connected, instances)| {
                ([("driver", driver.as_str()), ("connected", connected)], *instances)
            }),
        )
    }
}

fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: impl EncodeCounterValue,
) -> fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn gauge(
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
fn gauge_family<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, usize)>,
) -> fmt::Result {
    let mut samples = samples.into_iter().peekable();
    if samples.peek().is_none() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}
