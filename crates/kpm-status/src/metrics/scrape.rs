//! The metrics whose values are owned elsewhere (the manager, the handlers,
//! the runtime, the allocator), read afresh at each scrape.
//!
//! Each scrape builds its own [`Reading`] and encodes it; nothing is shared
//! between scrapes, so concurrent scrapers never see each other's half-built
//! families.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use kpm::transport::fd::{FdBudget, FdStats};

use super::encode::{counter, counter_family, gauge, gauge_family};
use super::heap::{HeapStats, encode_heap};
use kpm::kube::KubeStatus;
use kpm::{EventCounts, KubeletHandle, LivenessStats};

/// Encodes the scrape-time metrics from [`KubeletHandle`]; registered with the
/// registry as a collector.
#[derive(Debug)]
pub(super) struct Scraped {
    kubelet: KubeletHandle,
    heap: fn() -> Option<HeapStats>,
}

impl Scraped {
    pub(super) fn new(kubelet: KubeletHandle, heap: fn() -> Option<HeapStats>) -> Self {
        Self { kubelet, heap }
    }
}

impl Collector for Scraped {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        Reading::take(&self.kubelet, self.heap).encode(&mut encoder)
    }
}

/// One read of every source, as one scrape shows it.
struct Reading {
    events: EventCounts,
    backoff_skips: u64,
    rescans: u64,
    operations: usize,
    /// `None` when liveness is off.
    liveness: Option<LivenessStats>,
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
    /// `None` when kpm does not publish to the Kubernetes API.
    kube: Option<KubeReading>,
    fds: FdReading,
}

/// The fd budget and the fds open, as one scrape shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FdReading {
    budget: FdStats,
    /// `None` where `/proc/self/fd` cannot be read.
    open: Option<usize>,
}

impl FdReading {
    fn take(budget: &FdBudget) -> Self {
        Self { budget: budget.stats(), open: kpm::transport::fd::open_fds() }
    }

    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let budget = &self.budget;
        let as_u64 = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let levels = [
            ("limit", budget.limit),
            ("budget", Some(as_u64(budget.size))),
            ("in_use", Some(as_u64(budget.in_use))),
            ("open", self.open.map(as_u64)),
        ];
        gauge_family(
            encoder,
            "kpm_fd_budget",
            "File descriptors: the soft RLIMIT_NOFILE (limit; absent if unlimited), the share connections may hold, dialed or accepted (budget), the permits they hold (in_use), and every fd open in the process (open).",
            levels.into_iter().filter_map(|(state, value)| {
                Some(([("state", state)], i64::try_from(value?).unwrap_or(i64::MAX)))
            }),
        )?;
        counter(
            encoder,
            "kpm_fd_shortage",
            "Episodes of running out of file descriptors (EMFILE, ENFILE), waited out without failing any plugin.",
            budget.shortage_episodes,
        )?;
        counter(
            encoder,
            "kpm_fd_shortage_waits",
            "Waits for a file descriptor after EMFILE or ENFILE.",
            budget.shortage_waits,
        )?;
        counter(
            encoder,
            "kpm_fd_permit_waits",
            "Connections that waited for a permit of the fd budget.",
            budget.permit_waits,
        )?;
        counter(
            encoder,
            "kpm_fd_optional_refused",
            "Optional long-lived fds (liveness connections, pidfds) refused to keep a quarter of the budget free.",
            budget.optional_refused,
        )?;
        counter(
            encoder,
            "kpm_fd_shed_connections",
            "Idle connections to kpm's servers closed, longest idle first, because the fd budget ran short.",
            budget.shed_connections,
        )
    }
}

/// The Kubernetes publishers' books, as one scrape shows them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct KubeReading {
    /// `(verb, resource, outcome, count)`.
    requests: Vec<(&'static str, &'static str, String, u64)>,
    /// `(kind, seconds since the epoch)` of the kinds that synced.
    last_sync: Vec<(&'static str, f64)>,
    /// What the API server does not hold yet: how many, per kind.
    pending: Vec<(&'static str, i64)>,
    /// Since when the oldest of them is wanted, in seconds since the epoch.
    oldest_pending_since: Option<f64>,
}

impl From<KubeStatus> for KubeReading {
    fn from(status: KubeStatus) -> Self {
        Self {
            requests: status
                .requests
                .into_iter()
                .map(|r| (r.verb, r.resource, r.outcome, r.count))
                .collect(),
            last_sync: status
                .objects
                .into_iter()
                .filter_map(|(kind, sync)| Some((kind.as_str(), unix_seconds(sync.last_success?))))
                .collect(),
            pending: kpm::kube::ObjectKind::ALL
                .iter()
                .map(|kind| {
                    let count = status.pending.iter().filter(|p| p.kind == *kind).count();
                    (kind.as_str(), i64::try_from(count).unwrap_or(i64::MAX))
                })
                .collect(),
            oldest_pending_since: status
                .pending
                .iter()
                .map(|p| unix_seconds(p.since))
                .reduce(f64::min),
        }
    }
}

impl KubeReading {
    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
        counter_family(
            encoder,
            "kpm_kube_requests",
            "Requests to the Kubernetes API server, by verb, resource and outcome (success, an HTTP status code, error, timeout).",
            self.requests.iter().map(|(verb, resource, outcome, count)| {
                ([("verb", *verb), ("resource", *resource), ("outcome", outcome.as_str())], *count)
            }),
        )?;
        gauge_family(
            encoder,
            "kpm_kube_last_sync_timestamp_seconds",
            "When kpm last wrote (or found up to date) an object of this kind, in seconds since the epoch.",
            self.last_sync.iter().map(|(kind, at)| ([("kind", *kind)], *at)),
        )?;
        gauge_family(
            encoder,
            "kpm_kube_pending_publications",
            "What kpm wants the API server to hold and it does not yet (a CSI driver, a device resource, a ResourceSlice wipe), by the kind of object it is pending on.",
            self.pending.iter().map(|(kind, count)| ([("kind", *kind)], *count)),
        )?;
        match self.oldest_pending_since {
            Some(since) => gauge(
                encoder,
                "kpm_kube_oldest_pending_publication_timestamp_seconds",
                "Since when kpm wants the oldest pending publication, in seconds since the epoch; absent when none is pending (alert on time() minus it).",
                since,
            ),
            None => Ok(()),
        }
    }
}

/// Seconds since the epoch; 0 for a time before it.
fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64()
}

impl Reading {
    /// Reads every source once. The only place the scrape reads them.
    fn take(kubelet: &KubeletHandle, heap: fn() -> Option<HeapStats>) -> Self {
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
            events: stats.events,
            backoff_skips: stats.backoff_skips,
            rescans: stats.rescans,
            operations: stats.operations,
            liveness: stats.liveness,
            tasks: tokio::runtime::Handle::try_current()
                .ok()
                .map(|runtime| runtime.metrics().num_alive_tasks()),
            heap: heap(),
            plugins,
            devices,
            dra_instances,
            kube: kubelet.kubernetes().map(KubeReading::from),
            fds: FdReading::take(kubelet.manager().fd_budget()),
        }
    }

    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
        encode_events(&self.events, encoder)?;
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
        if let Some(liveness) = &self.liveness {
            encode_liveness(liveness, encoder)?;
        }
        if let Some(tasks) = self.tasks {
            gauge(encoder, "kpm_tokio_tasks", "Tasks alive in kpm's async runtime.", tasks)?;
        }
        if let Some(heap) = &self.heap {
            encode_heap(heap, encoder)?;
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
        )?;
        self.fds.encode(encoder)?;
        match &self.kube {
            Some(kube) => kube.encode(encoder),
            None => Ok(()),
        }
    }
}

/// One `{type}` sample per plugin type.
fn by_type(counts: &BTreeMap<String, u64>) -> impl Iterator<Item = ([(&str, &str); 1], u64)> {
    counts.iter().map(|(plugin_type, count)| ([("type", plugin_type.as_str())], *count))
}

/// What liveness did: watched processes and endpoints, exits, probes.
fn encode_liveness(liveness: &LivenessStats, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
    gauge(
        encoder,
        "kpm_liveness_watched_processes",
        "Plugin processes watched for exit (pidfds).",
        liveness.watched_processes,
    )?;
    counter(
        encoder,
        "kpm_liveness_process_exits",
        "Watched plugin processes that exited.",
        liveness.exits,
    )?;
    counter(
        encoder,
        "kpm_liveness_probes",
        "Liveness probes made, one per plugin and period.",
        liveness.probes,
    )?;
    counter(encoder, "kpm_liveness_pings", "HTTP/2 PINGs liveness probes sent.", liveness.pings)?;
    counter(
        encoder,
        "kpm_liveness_probe_calls",
        "gRPC calls liveness probes made (GetInfo, a CSI driver's Identity/Probe).",
        liveness.probe_calls,
    )?;
    counter(
        encoder,
        "kpm_liveness_probe_failures",
        "Liveness probes that failed.",
        liveness.failed_probes,
    )?;
    gauge(
        encoder,
        "kpm_liveness_probe_connections",
        "Connections kept open between liveness probes, for plugins no handler holds one to.",
        liveness.probe_connections,
    )?;
    counter(
        encoder,
        "kpm_liveness_probe_dials",
        "Connections dialled for liveness probes.",
        liveness.probe_dials,
    )?;
    gauge(
        encoder,
        "kpm_liveness_watched_endpoints",
        "Plugin endpoints (service sockets) watched on the filesystem.",
        liveness.watched_endpoints,
    )?;
    counter(
        encoder,
        "kpm_liveness_endpoints_gone",
        "Plugins deregistered because their endpoint socket was removed or replaced.",
        liveness.endpoints_gone,
    )?;
    Ok(())
}

/// The manager's counts of what happened to plugins.
fn encode_events(events: &EventCounts, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
    counter_family(
        encoder,
        "kpm_registrations",
        "Plugins registered, by type.",
        by_type(&events.registrations),
    )?;
    counter_family(
        encoder,
        "kpm_deregistrations",
        "Plugins deregistered, by type.",
        by_type(&events.deregistrations),
    )?;
    counter(
        encoder,
        "kpm_rejections",
        "Registration attempts that failed (the plugin was told why where possible).",
        events.rejections,
    )?;
    counter(
        encoder,
        "kpm_retries_scheduled",
        "Failed operations whose retry waits for a backoff.",
        events.retries_scheduled,
    )?;
    counter(
        encoder,
        "kpm_unresponsive",
        "Registered plugins that stopped answering liveness probes and were registered anew.",
        events.unresponsive,
    )?;
    counter(
        encoder,
        "kpm_dra_device_health_changes",
        "Changes of a DRA device's health: first reports, other health, expired reports.",
        events.device_health_changes,
    )
}
#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;

    /// A collector of a fixed reading.
    #[derive(Debug)]
    struct Fixed(KubeReading);

    impl Collector for Fixed {
        fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
            self.0.encode(&mut encoder)
        }
    }

    fn render(reading: KubeReading) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Fixed(reading)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn kube_requests_are_counters_and_syncs_and_pending_publications_gauges() {
        let reading = KubeReading {
            requests: vec![
                ("get", "nodes", "404".to_owned(), 2),
                ("patch", "nodes/status", "success".to_owned(), 3),
            ],
            last_sync: vec![("Node status", 1_700_000_000.5)],
            pending: vec![("CSINode", 0), ("Node status", 2)],
            oldest_pending_since: Some(1_700_000_100.25),
        };
        let text = render(reading);
        for line in [
            "# TYPE kpm_kube_requests counter",
            "kpm_kube_requests_total{verb=\"get\",resource=\"nodes\",outcome=\"404\"} 2",
            "kpm_kube_requests_total{verb=\"patch\",resource=\"nodes/status\",outcome=\"success\"} 3",
            "# TYPE kpm_kube_last_sync_timestamp_seconds gauge",
            "kpm_kube_last_sync_timestamp_seconds{kind=\"Node status\"} 1700000000.5",
            "kpm_kube_pending_publications{kind=\"CSINode\"} 0",
            "kpm_kube_pending_publications{kind=\"Node status\"} 2",
            "kpm_kube_oldest_pending_publication_timestamp_seconds 1700000100.25",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
    }

    /// A collector of a fixed fd reading.
    #[derive(Debug)]
    struct FixedFds(FdReading);

    impl Collector for FixedFds {
        fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
            self.0.encode(&mut encoder)
        }
    }

    #[test]
    fn the_fd_budget_is_gauges_and_its_shortages_counters() {
        let budget = FdStats {
            limit: Some(128),
            size: 90,
            in_use: 12,
            shortage_episodes: 1,
            shortage_waits: 7,
            permit_waits: 40,
            optional_refused: 2,
            shed_connections: 5,
        };
        let mut registry = Registry::default();
        registry.register_collector(Box::new(FixedFds(FdReading { budget, open: Some(30) })));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "# TYPE kpm_fd_budget gauge",
            "kpm_fd_budget{state=\"limit\"} 128",
            "kpm_fd_budget{state=\"budget\"} 90",
            "kpm_fd_budget{state=\"in_use\"} 12",
            "kpm_fd_budget{state=\"open\"} 30",
            "kpm_fd_shortage_total 1",
            "kpm_fd_shortage_waits_total 7",
            "kpm_fd_permit_waits_total 40",
            "kpm_fd_optional_refused_total 2",
            "kpm_fd_shed_connections_total 5",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
        // Unlimited: no limit sample.
        let mut registry = Registry::default();
        let unlimited = FdStats { limit: None, ..budget };
        registry
            .register_collector(Box::new(FixedFds(FdReading { budget: unlimited, open: None })));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains("state=\"limit\"") && !text.contains("state=\"open\""), "{text}");
    }

    #[test]
    fn nothing_is_exported_before_any_request_or_sync() {
        assert_eq!(render(KubeReading::default()), "# EOF\n");
    }

    #[test]
    fn times_before_the_epoch_are_zero() {
        assert!(unix_seconds(UNIX_EPOCH - std::time::Duration::from_secs(1)).abs() < f64::EPSILON);
        assert!(
            (unix_seconds(UNIX_EPOCH + std::time::Duration::from_millis(1500)) - 1.5).abs() < 1e-9
        );
    }
}
