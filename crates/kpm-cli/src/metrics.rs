//! Prometheus metrics of `kpm run`, served as text on `--metrics-addr`.
//!
//! - `plugin_manager_total_plugins{socket_path, state}`: the kubelet's gauge,
//!   1 per socket in `desired_state_of_world` and in `actual_state_of_world`;
//! - `kpm_registrations_total{type}`, `kpm_deregistrations_total{type}`,
//!   `kpm_rejections_total`, `kpm_retries_scheduled_total`,
//!   `kpm_unresponsive_total`: from the event stream;
//! - `kpm_registration_latency_seconds`: from a socket incarnation being seen
//!   to its plugin being registered;
//! - `kpm_backoff_skips_total`, `kpm_watcher_rescans_total`;
//! - `kpm_operations` (the executor's entries), `kpm_tokio_tasks` (tasks
//!   alive in the runtime) and `kpm_heap_allocated_bytes` (the live heap),
//!   which must stay flat under churn, and `kpm_heap_resident_bytes`;
//! - `kpm_device_plugin_devices{resource, health}` and
//!   `kpm_dra_driver_instances{driver, connected}`.
//!
//! Gauges are computed when scraped, from the same sources as the status API.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

use axum::extract::State;
use axum::routing::get;
use kpm::PluginEvent;
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;

use crate::CliError;
use kpm::KubeletHandle as Sources;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PluginLabels {
    socket_path: String,
    state: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TypeLabels {
    r#type: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DeviceLabels {
    resource: String,
    health: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DraLabels {
    driver: String,
    connected: String,
}

/// Every metric, and the sources of the scrape-time gauges.
pub(crate) struct Metrics {
    registry: Mutex<Registry>,
    plugins: Family<PluginLabels, Gauge>,
    devices: Family<DeviceLabels, Gauge>,
    dra_instances: Family<DraLabels, Gauge>,
    registrations: Family<TypeLabels, Counter>,
    deregistrations: Family<TypeLabels, Counter>,
    rejections: Counter,
    retries: Counter,
    unresponsive: Counter,
    backoff_skips: Counter,
    rescans: Counter,
    operations: Gauge,
    tasks: Gauge,
    heap_allocated: Gauge,
    heap_resident: Gauge,
    latency: Histogram,
    sources: Sources,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub(crate) fn new(sources: Sources) -> Arc<Self> {
        let metrics = Self {
            registry: Mutex::new(Registry::default()),
            plugins: Family::default(),
            devices: Family::default(),
            dra_instances: Family::default(),
            registrations: Family::default(),
            deregistrations: Family::default(),
            rejections: Counter::default(),
            retries: Counter::default(),
            unresponsive: Counter::default(),
            backoff_skips: Counter::default(),
            rescans: Counter::default(),
            operations: Gauge::default(),
            tasks: Gauge::default(),
            heap_allocated: Gauge::default(),
            heap_resident: Gauge::default(),
            // 100 µs to ~3.3 min.
            latency: Histogram::new(exponential_buckets(0.000_1, 4.0, 12)),
            sources,
        };
        {
            let mut registry = metrics.registry.lock();
            registry.register(
                "plugin_manager_total_plugins",
                "Number of plugins in Plugin Manager",
                metrics.plugins.clone(),
            );
            registry.register(
                "kpm_registrations",
                "Plugins registered, by type",
                metrics.registrations.clone(),
            );
            registry.register(
                "kpm_deregistrations",
                "Plugins deregistered, by type",
                metrics.deregistrations.clone(),
            );
            registry.register(
                "kpm_rejections",
                "Registration attempts that failed (the plugin was told why where possible)",
                metrics.rejections.clone(),
            );
            registry.register(
                "kpm_retries_scheduled",
                "Failed operations whose retry waits for a backoff",
                metrics.retries.clone(),
            );
            registry.register(
                "kpm_unresponsive",
                "Registered plugins that stopped answering liveness probes and were registered anew",
                metrics.unresponsive.clone(),
            );
            registry.register(
                "kpm_backoff_skips",
                "Operations not started because their socket was backing off",
                metrics.backoff_skips.clone(),
            );
            registry.register(
                "kpm_watcher_rescans",
                "Full re-listings of the registry directory (overflow, periodic, requested)",
                metrics.rescans.clone(),
            );
            registry.register(
                "kpm_operations",
                "Sockets the operation executor keeps an entry for (running, backing off, failed)",
                metrics.operations.clone(),
            );
            registry.register(
                "kpm_tokio_tasks",
                "Tasks alive in kpm's async runtime",
                metrics.tasks.clone(),
            );
            registry.register(
                "kpm_heap_allocated_bytes",
                "Bytes kpm has allocated and not freed (the allocator's live heap)",
                metrics.heap_allocated.clone(),
            );
            registry.register(
                "kpm_heap_resident_bytes",
                "Bytes in pages kpm's allocator keeps resident (live heap, metadata, freed pages not returned yet)",
                metrics.heap_resident.clone(),
            );
            registry.register(
                "kpm_registration_latency_seconds",
                "Time from a socket incarnation being seen to its plugin being registered",
                metrics.latency.clone(),
            );
            registry.register(
                "kpm_device_plugin_devices",
                "Devices of device-plugin resources, by health",
                metrics.devices.clone(),
            );
            registry.register(
                "kpm_dra_driver_instances",
                "Instances of DRA drivers, by connection state",
                metrics.dra_instances.clone(),
            );
        }
        Arc::new(metrics)
    }

    /// Counts events until the manager's event stream closes.
    pub(crate) async fn count_events(self: Arc<Self>) {
        let mut events = self.sources.manager().subscribe();
        let mut seen: HashMap<(PathBuf, u64), Instant> = HashMap::new();
        loop {
            let event = match events.recv().await {
                Ok(event) => event,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "metrics fell behind the event stream");
                    continue;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            match event {
                PluginEvent::SocketSeen { socket, generation } => {
                    seen.insert((socket, generation.get()), Instant::now());
                }
                PluginEvent::Registered { socket, generation, plugin_type, .. } => {
                    self.registrations.get_or_create(&TypeLabels { r#type: plugin_type }).inc();
                    if let Some(at) = seen.remove(&(socket, generation.get())) {
                        self.latency.observe(at.elapsed().as_secs_f64());
                    }
                }
                PluginEvent::Rejected { .. } => {
                    self.rejections.inc();
                }
                PluginEvent::Deregistered { socket, generation, plugin_type, .. } => {
                    seen.remove(&(socket, generation.get()));
                    self.deregistrations.get_or_create(&TypeLabels { r#type: plugin_type }).inc();
                }
                PluginEvent::RetryScheduled { .. } => {
                    self.retries.inc();
                }
                PluginEvent::Unresponsive { .. } => {
                    self.unresponsive.inc();
                }
            }
            // Incarnations that never registered are dropped with their socket.
            let manager = &self.sources.manager();
            seen.retain(|(socket, _), _| manager.desired_state().contains(socket));
        }
    }

    /// The metrics in the Prometheus text format.
    pub(crate) fn render(&self) -> String {
        self.refresh_gauges();
        let mut text = String::new();
        if let Err(err) =
            prometheus_client::encoding::text::encode(&mut text, &self.registry.lock())
        {
            tracing::error!(error = %err, "cannot encode metrics");
        }
        text
    }

    fn refresh_gauges(&self) {
        let manager = &self.sources.manager();
        // The manager keeps these counts; mirror them into the counters.
        let counts = manager.stats();
        for (counter, total) in
            [(&self.backoff_skips, counts.backoff_skips), (&self.rescans, counts.rescans)]
        {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        self.operations.set(i64::try_from(counts.operations).unwrap_or(i64::MAX));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let tasks = runtime.metrics().num_alive_tasks();
            self.tasks.set(i64::try_from(tasks).unwrap_or(i64::MAX));
        }
        if let Some(heap) = crate::heap::stats() {
            self.heap_allocated.set(i64::try_from(heap.allocated).unwrap_or(i64::MAX));
            self.heap_resident.set(i64::try_from(heap.resident).unwrap_or(i64::MAX));
        }
        self.plugins.clear();
        let states = [
            (
                "desired_state_of_world",
                manager
                    .desired_state()
                    .snapshot()
                    .into_iter()
                    .map(|p| p.socket_path)
                    .collect::<Vec<_>>(),
            ),
            (
                "actual_state_of_world",
                manager.actual_state().snapshot().into_iter().map(|p| p.socket_path).collect(),
            ),
        ];
        for (state, sockets) in states {
            for socket in sockets {
                let labels = PluginLabels {
                    socket_path: socket.display().to_string(),
                    state: state.to_owned(),
                };
                self.plugins.get_or_create(&labels).set(1);
            }
        }
        self.devices.clear();
        for resource in self.sources.devices().resources() {
            for (health, count) in
                [("healthy", resource.healthy), ("unhealthy", resource.unhealthy)]
            {
                let labels =
                    DeviceLabels { resource: resource.resource.clone(), health: health.into() };
                self.devices.get_or_create(&labels).set(i64::try_from(count).unwrap_or(i64::MAX));
            }
        }
        self.dra_instances.clear();
        for driver in self.sources.dra().drivers() {
            for connected in [true, false] {
                let count = driver.instances.iter().filter(|i| i.connected == connected).count();
                let labels =
                    DraLabels { driver: driver.name.clone(), connected: connected.to_string() };
                self.dra_instances
                    .get_or_create(&labels)
                    .set(i64::try_from(count).unwrap_or(i64::MAX));
            }
        }
    }
}

/// Serves `/metrics` and `/healthz` on `addr` until the task is aborted.
pub(crate) async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
) -> Result<tokio::task::JoinHandle<()>, CliError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| CliError::MetricsAddr { addr, source })?;
    let router = axum::Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<Metrics>>| async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    m.render(),
                )
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .with_state(metrics);
    tracing::info!(%addr, "metrics listening");
    Ok(tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, router).await {
            tracing::error!(%addr, error = %err, "metrics server stopped");
        }
    }))
}
