//! Prometheus metrics of `kpm run`, served in the `OpenMetrics` text format on
//! `--metrics-addr`.
//!
//! - `plugin_manager_total_plugins{socket_path, state}`: the kubelet's gauge,
//!   1 per socket in `desired_state_of_world` and in `actual_state_of_world`;
//! - `kpm_registrations_total{type}`, `kpm_deregistrations_total{type}`,
//!   `kpm_rejections_total`, `kpm_retries_scheduled_total`,
//!   `kpm_unresponsive_total`: from the event stream;
//! - `kpm_registration_latency_seconds`: from a socket incarnation being seen
//!   to its plugin being registered;
//! - `kpm_backoff_skips_total`, `kpm_watcher_rescans_total`;
//! - `kpm_liveness_watched_processes`, `kpm_liveness_process_exits_total`,
//!   `kpm_liveness_probes_total`, `kpm_liveness_probe_failures_total`,
//!   `kpm_liveness_probe_connections`;
//! - `kpm_operations` (the executor's entries), `kpm_tokio_tasks` (tasks
//!   alive in the runtime) and `kpm_heap_allocated_bytes` (the live heap),
//!   which must stay flat under churn, and `kpm_heap_resident_bytes`;
//! - `kpm_device_plugin_devices{resource, health}` and
//!   `kpm_dra_driver_instances{driver, connected}`;
//! - `kpm_fd_budget{state}` (`limit`, `budget`, `in_use`, `open`),
//!   `kpm_fd_shortage_total` (episodes of `EMFILE`/`ENFILE`),
//!   `kpm_fd_shortage_waits_total`, `kpm_fd_permit_waits_total`,
//!   `kpm_fd_optional_refused_total` and `kpm_fd_shed_connections_total`
//!   (idle server connections closed when the budget ran short): the
//!   [fd budget](kpm_api::fd).
//!
//! The event counters and the histogram are updated where the event is
//! handled ([`Metrics::count_events`]); everything else is owned by the
//! manager, the handlers, the runtime or the allocator and read at each
//! scrape by a collector ([`scrape`]), so that concurrent scrapes share no
//! mutable state.

mod pending;
mod scrape;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use kpm::PluginEvent;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use crate::CliError;
use kpm::KubeletHandle;
use pending::Pending;
use scrape::Scraped;

/// What `/metrics` serves: `prometheus_client`'s text encoding is `OpenMetrics`
/// (it ends with `# EOF`).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TypeLabels {
    r#type: String,
}

/// Every metric: those counted from events, and a collector for the rest.
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Read-only once built: scrapes encode it concurrently.
    registry: Registry,
    registrations: Family<TypeLabels, Counter>,
    deregistrations: Family<TypeLabels, Counter>,
    rejections: Counter,
    retries: Counter,
    unresponsive: Counter,
    latency: Histogram,
    kubelet: KubeletHandle,
}

impl Metrics {
    pub(crate) fn new(kubelet: KubeletHandle) -> Arc<Self> {
        let registrations = Family::<TypeLabels, Counter>::default();
        let deregistrations = Family::<TypeLabels, Counter>::default();
        let rejections = Counter::default();
        let retries = Counter::default();
        let unresponsive = Counter::default();
        // 100 µs to ~3.3 min.
        let latency = Histogram::new(exponential_buckets(0.000_1, 4.0, 12));
        let mut registry = Registry::default();
        registry.register(
            "kpm_registrations",
            "Plugins registered, by type",
            registrations.clone(),
        );
        registry.register(
            "kpm_deregistrations",
            "Plugins deregistered, by type",
            deregistrations.clone(),
        );
        registry.register(
            "kpm_rejections",
            "Registration attempts that failed (the plugin was told why where possible)",
            rejections.clone(),
        );
        registry.register(
            "kpm_retries_scheduled",
            "Failed operations whose retry waits for a backoff",
            retries.clone(),
        );
        registry.register(
            "kpm_unresponsive",
            "Registered plugins that stopped answering liveness probes and were registered anew",
            unresponsive.clone(),
        );
        registry.register(
            "kpm_registration_latency_seconds",
            "Time from a socket incarnation being seen to its plugin being registered",
            latency.clone(),
        );
        registry.register_collector(Box::new(Scraped::new(kubelet.clone())));
        Arc::new(Self {
            registry,
            registrations,
            deregistrations,
            rejections,
            retries,
            unresponsive,
            latency,
            kubelet,
        })
    }

    /// Counts events until the manager's event stream closes.
    pub(crate) async fn count_events(self: Arc<Self>) {
        let manager = &self.kubelet.manager();
        let mut events = manager.subscribe();
        let mut pending = Pending::default();
        loop {
            let event = match events.recv().await {
                Ok(event) => event,
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "metrics fell behind the event stream");
                    continue;
                }
                Err(RecvError::Closed) => return,
            };
            match event {
                PluginEvent::SocketSeen { socket, generation } => {
                    pending.seen(socket, generation.get(), Instant::now(), |socket| {
                        manager.desired_state().contains(socket)
                    });
                }
                PluginEvent::Registered { socket, generation, plugin_type, .. } => {
                    self.registrations.get_or_create(&TypeLabels { r#type: plugin_type }).inc();
                    if let Some(at) = pending.take(&socket, generation.get()) {
                        self.latency.observe(at.elapsed().as_secs_f64());
                    }
                }
                PluginEvent::Rejected { .. } => {
                    self.rejections.inc();
                }
                PluginEvent::Deregistered { socket, generation, plugin_type, .. } => {
                    pending.take(&socket, generation.get());
                    self.deregistrations.get_or_create(&TypeLabels { r#type: plugin_type }).inc();
                }
                PluginEvent::RetryScheduled { .. } => {
                    self.retries.inc();
                }
                PluginEvent::Unresponsive { .. } => {
                    self.unresponsive.inc();
                }
                // Events newer than these metrics count nothing yet.
                _ => {}
            }
        }
    }

    /// The metrics in the `OpenMetrics` text format ([`CONTENT_TYPE`]).
    pub(crate) fn render(&self) -> String {
        let mut text = String::new();
        if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::error!(error = %err, "cannot encode metrics");
        }
        text
    }
}

/// Serves `/metrics` and `/healthz` on `addr` until the task is aborted,
/// closing connections that send no request within `handshake_timeout`.
pub(crate) async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    handshake_timeout: std::time::Duration,
) -> Result<tokio::task::JoinHandle<()>, CliError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| CliError::MetricsAddr { addr, source })?;
    let listener = crate::listener::HttpListener::new(
        kpm_api::uds::Http1Incoming::new(listener).handshake_timeout(handshake_timeout),
    );
    let router = axum::Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<Metrics>>| async move {
                ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], m.render())
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .with_state(metrics);
    tracing::info!(%addr, "metrics listening");
    Ok(tokio::spawn(async move {
        if let Err(err) = crate::listener::serve(listener, router).await {
            tracing::error!(%addr, error = %err, "metrics server stopped");
        }
    }))
}
