//! Prometheus metrics of `kpm run`, served in the `OpenMetrics` text format on
//! `--metrics-addr`.
//!
//! - `plugin_manager_total_plugins{socket_path, state}`: the kubelet's gauge,
//!   1 per socket in `desired_state_of_world` and in `actual_state_of_world`;
//! - `kpm_registrations_total{type}`, `kpm_deregistrations_total{type}`,
//!   `kpm_rejections_total`, `kpm_retries_scheduled_total`,
//!   `kpm_unresponsive_total`, `kpm_dra_device_health_changes_total`:
//!   counted by the manager as they happen ([`kpm::EventCounts`]), exact
//!   however the event stream lags;
//! - `kpm_registration_latency_seconds`: from a socket incarnation being seen
//!   to its plugin being registered, from the event stream (it misses the
//!   registrations whose events a lag dropped);
//! - `kpm_backoff_skips_total`, `kpm_watcher_rescans_total`;
//! - `kpm_liveness_watched_processes`, `kpm_liveness_process_exits_total`,
//!   `kpm_liveness_probes_total`, `kpm_liveness_pings_total`,
//!   `kpm_liveness_probe_calls_total`, `kpm_liveness_probe_failures_total`,
//!   `kpm_liveness_probe_connections`, `kpm_liveness_probe_dials_total`,
//!   `kpm_liveness_watched_endpoints`,
//!   `kpm_liveness_endpoints_gone_total`;
//! - `kpm_operations` (the executor's entries), `kpm_tokio_tasks` (tasks
//!   alive in the runtime) and `kpm_heap_allocated_bytes` (the live heap),
//!   which must stay flat under churn; beside it the allocator's
//!   `kpm_heap_{active,metadata,resident,mapped,retained}_bytes` and, per
//!   arena, `kpm_heap_dirty_bytes{arena}`, `kpm_heap_muzzy_bytes{arena}` and
//!   `kpm_heap_thread_cache_bytes{arena}`;
//! - `kpm_device_plugin_devices{resource, health}` and
//!   `kpm_dra_driver_instances{driver, connected}`;
//! - `kpm_fd_budget{state}` (`limit`, `budget`, `in_use`, `open`),
//!   `kpm_fd_shortage_total` (episodes of `EMFILE`/`ENFILE`),
//!   `kpm_fd_shortage_waits_total`, `kpm_fd_permit_waits_total`,
//!   `kpm_fd_optional_refused_total` and `kpm_fd_shed_connections_total`
//!   (idle server connections closed when the budget ran short): the
//!   [fd budget](kpm::transport::fd).
//!
//! The histogram is updated where the event is handled
//! ([`Metrics::observe_latency`]); everything else, the event counters
//! included, is owned by the manager, the handlers, the runtime or the
//! allocator and read at each scrape by a collector (`scrape`), so that
//! concurrent scrapes share no mutable state.

mod encode;
mod heap;
mod pending;
mod scrape;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use kpm::PluginEvent;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use crate::StatusError;
pub use heap::{ArenaPages, HeapStats};
use kpm::KubeletHandle;
use pending::Pending;
use scrape::Scraped;

/// What `/metrics` serves: `prometheus_client`'s text encoding is `OpenMetrics`
/// (it ends with `# EOF`).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every metric: the latency histogram, fed from events, and a collector for
/// the rest.
#[derive(Debug)]
pub struct Metrics {
    /// Read-only once built: scrapes encode it concurrently.
    registry: Registry,
    latency: Histogram,
    kubelet: KubeletHandle,
}

impl Metrics {
    /// The metrics of `kubelet`, the allocator's figures read by `heap` at
    /// each scrape (the allocator is the binary's to choose: `None` where it
    /// cannot tell).
    pub fn new(kubelet: KubeletHandle, heap: fn() -> Option<HeapStats>) -> Arc<Self> {
        // 100 µs to ~3.3 min.
        let latency = Histogram::new(exponential_buckets(0.000_1, 4.0, 12));
        let mut registry = Registry::default();
        registry.register(
            "kpm_registration_latency_seconds",
            "Time from a socket incarnation being seen to its plugin being registered; from the event stream, so registrations whose events were dropped while the reader lagged are not observed",
            latency.clone(),
        );
        registry.register_collector(Box::new(Scraped::new(kubelet.clone(), heap)));
        Arc::new(Self { registry, latency, kubelet })
    }

    /// Observes registration latencies until the manager's event stream closes.
    pub async fn observe_latency(self: Arc<Self>) {
        let manager = &self.kubelet.manager();
        let mut events = manager.subscribe();
        let mut pending = Pending::default();
        loop {
            let event = match events.recv().await {
                Ok(event) => event,
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!(
                        missed,
                        "registration latency metrics fell behind the event stream"
                    );
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
                PluginEvent::Registered { socket, generation, .. } => {
                    if let Some(at) = pending.take(&socket, generation.get()) {
                        self.latency.observe(at.elapsed().as_secs_f64());
                    }
                }
                PluginEvent::Deregistered { socket, generation, .. } => {
                    pending.take(&socket, generation.get());
                }
                _ => {}
            }
        }
    }

    /// The metrics in the `OpenMetrics` text format (`CONTENT_TYPE`).
    pub fn render(&self) -> String {
        let mut text = String::new();
        if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::error!(error = %err, "cannot encode metrics");
        }
        text
    }
}

/// Serves `metrics`' `/metrics` and `/healthz` on `addr` until the task is
/// aborted, closing connections that send no request within
/// `handshake_timeout`.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    handshake_timeout: std::time::Duration,
) -> Result<tokio::task::JoinHandle<()>, StatusError> {
    let budget = metrics.kubelet.manager().fd_budget().clone();
    serve_registry(addr, move || metrics.render(), budget, handshake_timeout).await
}

/// Serves what `render` gives (the `OpenMetrics` text of a registry) on
/// `addr`'s `/metrics`, and `/healthz`, until the task is aborted; each
/// connection pays from `budget`.
pub async fn serve_registry(
    addr: SocketAddr,
    render: impl Fn() -> String + Send + Sync + 'static,
    budget: kpm::transport::fd::FdBudget,
    handshake_timeout: std::time::Duration,
) -> Result<tokio::task::JoinHandle<()>, StatusError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| StatusError::MetricsAddr { addr, source })?;
    let listener = crate::listener::HttpListener::new(
        kpm::transport::Http1Incoming::new(listener)
            .handshake_timeout(handshake_timeout)
            .budget(budget),
    );
    let render: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(render);
    let router = axum::Router::new()
        .route(
            "/metrics",
            get(|State(render): State<Arc<dyn Fn() -> String + Send + Sync>>| async move {
                ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], render())
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .with_state(render);
    tracing::info!(%addr, "metrics listening");
    Ok(tokio::spawn(async move {
        if let Err(err) = crate::listener::serve(listener, router).await {
            tracing::error!(%addr, error = %err, "metrics server stopped");
        }
    }))
}

#[cfg(test)]
mod tests {
    use kpm::BasicHandler;
    use kpm_registrar::Registrar;
    use kpm_test_support::{lazy, wait_until};

    use super::*;

    const TEST_TYPE: &str = "TestPlugin";

    /// The value of `series` (name and labels) in `metrics`' text.
    fn sample(metrics: &Metrics, series: &str) -> Option<u64> {
        let text = metrics.render();
        text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn event_counters_are_exact_while_the_event_stream_lags() {
        const PLUGINS: u64 = 32;
        let root = tempfile::tempdir().unwrap();
        let registry = root.path().join(kpm::api::PLUGINS_REGISTRY_DIR_NAME);
        // A stream that keeps one event: every burst makes its readers lag.
        let kubelet = kpm::Kubelet::builder()
            .root_dir(root.path())
            .manager(|m| m.event_capacity(1))
            .build()
            .unwrap();
        let handle = kubelet.handle();
        handle.manager().add_handler(TEST_TYPE, Arc::new(BasicHandler::new(TEST_TYPE))).unwrap();
        let metrics = Metrics::new(handle.clone(), || None);
        let latency = tokio::spawn(Arc::clone(&metrics).observe_latency());
        // Every plugin is there at start, so they register in one burst.
        let mut plugins = Vec::new();
        for n in 0..PLUGINS {
            let plugin = Registrar::builder(TEST_TYPE, format!("plugin-{n}"))
                .versions(["1.0.0"])
                .socket_dir(&registry);
            plugins.push(plugin.serve().await.unwrap());
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(kubelet.run(async { drop(stopped.await) }));

        let registrations = format!("kpm_registrations_total{{type=\"{TEST_TYPE}\"}}");
        wait_until(lazy(|| format!("{registrations} {PLUGINS}:\n{}", metrics.render())), || {
            sample(&metrics, &registrations) == Some(PLUGINS)
        })
        .await;
        for plugin in plugins {
            plugin.shutdown().await.unwrap();
        }
        let deregistrations = format!("kpm_deregistrations_total{{type=\"{TEST_TYPE}\"}}");
        wait_until(lazy(|| format!("{deregistrations} {PLUGINS}:\n{}", metrics.render())), || {
            sample(&metrics, &deregistrations) == Some(PLUGINS)
        })
        .await;
        assert_eq!(sample(&metrics, &registrations), Some(PLUGINS));
        assert_eq!(sample(&metrics, "kpm_rejections_total"), Some(0));
        assert_eq!(sample(&metrics, "kpm_dra_device_health_changes_total"), Some(0));

        drop(stop);
        running.await.unwrap().unwrap();
        latency.abort();
    }
}
