//! Device health streaming (spec C.6): `NodeWatchResources` of the
//! `DRAResourceHealth` service (v1 or v1alpha1) on an instance's connection,
//! each message a full list of the driver's devices and their health, and
//! the expiry of that health.
//!
//! # Expiry
//!
//! A device's health holds for its `health_check_timeout_seconds`
//! ([`DEFAULT_HEALTH_TIMEOUT`] when 0 or negative, at most
//! [`MAX_CONFIG_DURATION`]) from the message that reported it; then it is
//! `Unknown`, its message cleared, until a report comes again. The stream's
//! task has one timer for all of the driver's devices, set to the earliest
//! deadline and moved as reports come ([`ExpiryTimer`]); with no deadline
//! it holds no timer at all. The kubelet only looks at the age of a report
//! when something reads it or the next message comes (kubernetes #140819,
//! PR #140883 open), so kpm's status and events change at the deadline
//! itself.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use kpm_api::constants::MAX_CONFIG_DURATION;
use kpm_api::dra_health::{v1, v1alpha1};
use kpm_cache::PluginEvent;
use tokio::time::{Instant, Sleep};
use tracing::{debug, info};

use crate::connection::Connection;
use crate::validate::HealthService;

/// Pause before a health stream that ended or failed is opened again.
pub(crate) const HEALTH_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// The kubelet's `DefaultHealthTimeout`: how long a device's reported health
/// holds when the driver sets no `health_check_timeout_seconds` (0, or a
/// negative value, which the kubelet ignores too).
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest health message kept; longer ones are cut to 1021 characters
/// and `...`, as the kubelet does.
const MAX_MESSAGE_CHARS: usize = 1024;

/// `Unknown`: the health of a device whose report expired.
const UNKNOWN: &str = "Unknown";

/// The health of one device, as the driver last streamed it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DeviceHealthStatus {
    /// The device's pool.
    pub pool: String,
    /// The device's name in its pool.
    pub device: String,
    /// `Healthy`, `Unhealthy` or `Unknown` (also for values this version of
    /// the API does not know, and once the report expired).
    pub health: String,
    /// The driver's explanation, at most 1024 characters; empty once the
    /// report expired.
    pub message: String,
    /// When kpm received the last report of the device (the node's clock:
    /// the report's own `last_updated_time` is the driver's, and is not
    /// used).
    #[cfg_attr(feature = "serde", serde(serialize_with = "kpm_api::json::rfc3339"))]
    pub reported_at: SystemTime,
    /// When `health` becomes `Unknown` unless a report comes first:
    /// `reported_at` plus the device's health check timeout. `None` once
    /// it has expired.
    #[cfg_attr(feature = "serde", serde(serialize_with = "kpm_api::json::rfc3339_opt"))]
    pub expires_at: Option<SystemTime>,
}

/// One device of a health message, converted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceReport {
    pool: String,
    device: String,
    health: &'static str,
    message: String,
    /// How long the health holds.
    timeout: Duration,
}

/// How long a health reported with `seconds` as its
/// `health_check_timeout_seconds` holds. The kubelet takes the default for
/// 0 and negative values and multiplies any other by a second with no
/// bound (Go's `Duration` wraps past 292 years); kpm bounds it by
/// [`MAX_CONFIG_DURATION`], so that a deadline can always be computed.
pub fn health_timeout(seconds: i64) -> Duration {
    match u64::try_from(seconds) {
        Ok(0) | Err(_) => DEFAULT_HEALTH_TIMEOUT,
        Ok(seconds) => Duration::from_secs(seconds).min(MAX_CONFIG_DURATION),
    }
}

fn truncate(message: String) -> String {
    if message.chars().count() <= MAX_MESSAGE_CHARS {
        return message;
    }
    let mut cut: String = message.chars().take(MAX_MESSAGE_CHARS - 3).collect();
    cut.push_str("...");
    cut
}

fn v1_devices(devices: Vec<v1::DeviceHealth>) -> Vec<DeviceReport> {
    devices
        .into_iter()
        .map(|health| {
            let id = health.device.unwrap_or_default();
            let status = match v1::HealthStatus::try_from(health.health) {
                Ok(v1::HealthStatus::Healthy) => "Healthy",
                Ok(v1::HealthStatus::Unhealthy) => "Unhealthy",
                Ok(v1::HealthStatus::Unknown) | Err(_) => UNKNOWN,
            };
            DeviceReport {
                pool: id.pool_name,
                device: id.device_name,
                health: status,
                message: truncate(health.message),
                timeout: health_timeout(health.health_check_timeout_seconds),
            }
        })
        .collect()
}

fn v1alpha1_devices(devices: Vec<v1alpha1::DeviceHealth>) -> Vec<DeviceReport> {
    v1_devices(devices.into_iter().map(Into::into).collect())
}

/// One device's health as kpm keeps it.
#[derive(Debug, Clone)]
struct Tracked {
    health: &'static str,
    message: String,
    reported_at: SystemTime,
    timeout: Duration,
    /// When the health expires; `None` once it has.
    deadline: Option<Instant>,
}

/// The devices of one driver, by (pool, device), and the events their
/// changes make.
#[derive(Debug, Default)]
pub(crate) struct DeviceHealthTable {
    devices: BTreeMap<(String, String), Tracked>,
}

impl DeviceHealthTable {
    /// Takes a message of `driver`'s stream, received at `now` (`wall` on
    /// the system clock): its devices replace the table's (a device it
    /// leaves out is removed), each valid until `now` plus its timeout. The
    /// deadline runs from the message's arrival, not from its
    /// `last_updated_time`, as in the kubelet: the node's clock and the
    /// driver's may differ. Returns a [`PluginEvent::DraDeviceHealthChanged`]
    /// for each device whose health is new or different.
    pub(crate) fn report(
        &mut self,
        driver: &str,
        reports: Vec<DeviceReport>,
        now: Instant,
        wall: SystemTime,
    ) -> Vec<PluginEvent> {
        let mut previous = std::mem::take(&mut self.devices);
        let mut changes = Vec::new();
        for report in reports {
            let key = (report.pool, report.device);
            let before = previous.remove(&key).map(|tracked| tracked.health);
            if before != Some(report.health) {
                debug!(
                    driver,
                    pool = key.0,
                    device = key.1,
                    health = report.health,
                    previous = before,
                    "DRA device health changed"
                );
                changes.push(change(driver, &key, report.health, before, false, &report.message));
            }
            let tracked = Tracked {
                health: report.health,
                message: report.message,
                reported_at: wall,
                timeout: report.timeout,
                // At most MAX_CONFIG_DURATION: cannot overflow.
                deadline: Some(now + report.timeout),
            };
            self.devices.insert(key, tracked);
        }
        changes
    }

    /// Expires every device whose deadline is at or before `now`: `Unknown`,
    /// its message cleared (as the kubelet reports a stale device). Returns
    /// the events of those that were not `Unknown` already.
    pub(crate) fn expire(&mut self, driver: &str, now: Instant) -> Vec<PluginEvent> {
        let mut changes = Vec::new();
        for (key, tracked) in &mut self.devices {
            if tracked.deadline.is_none_or(|deadline| deadline > now) {
                continue;
            }
            tracked.deadline = None;
            tracked.message.clear();
            if tracked.health == UNKNOWN {
                continue;
            }
            info!(
                driver,
                pool = key.0,
                device = key.1,
                previous = tracked.health,
                timeout = ?tracked.timeout,
                "no health report of the DRA device within its timeout; its health is Unknown"
            );
            changes.push(change(driver, key, UNKNOWN, Some(tracked.health), true, ""));
            tracked.health = UNKNOWN;
        }
        changes
    }

    /// The earliest deadline of a device, if any has one.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.devices.values().filter_map(|tracked| tracked.deadline).min()
    }

    /// The devices, sorted by pool and device.
    pub(crate) fn statuses(&self) -> Vec<DeviceHealthStatus> {
        self.devices
            .iter()
            .map(|((pool, device), tracked)| DeviceHealthStatus {
                pool: pool.clone(),
                device: device.clone(),
                health: tracked.health.to_owned(),
                message: tracked.message.clone(),
                reported_at: tracked.reported_at,
                expires_at: tracked.deadline.map(|_| tracked.reported_at + tracked.timeout),
            })
            .collect()
    }
}

fn change(
    driver: &str,
    (pool, device): &(String, String),
    health: &str,
    previous: Option<&str>,
    expired: bool,
    message: &str,
) -> PluginEvent {
    PluginEvent::DraDeviceHealthChanged {
        driver: driver.to_owned(),
        pool: pool.clone(),
        device: device.clone(),
        health: health.to_owned(),
        previous: previous.map(str::to_owned),
        expired,
        message: message.to_owned(),
    }
}

/// Where a health stream's task puts what it receives, and its timer's
/// work: each call returns the earliest deadline of the driver's devices
/// afterwards, which the timer is set to.
pub(crate) trait DeviceHealthSink: Send + Sync + 'static {
    /// A message's devices, received now.
    fn report(&self, devices: Vec<DeviceReport>) -> Option<Instant>;
    /// The timer fired: expire what is due now.
    fn expire(&self) -> Option<Instant>;
    /// The earliest deadline of the devices kept (through a handover from
    /// an older instance), when the task starts.
    fn next_deadline(&self) -> Option<Instant>;
}

/// How many expiry timers are armed, over all drivers.
#[derive(Debug, Clone, Default)]
pub(crate) struct TimerCount(Arc<AtomicUsize>);

impl TimerCount {
    /// Read only by tests (`DraManager::health_timers`).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// A driver's one expiry timer: a sleep re-armed to the earliest deadline,
/// and none at all without one. Counted in its [`TimerCount`] while armed,
/// until it is disarmed or dropped (with its task).
#[derive(Debug)]
struct ExpiryTimer {
    sleep: Option<Pin<Box<Sleep>>>,
    count: TimerCount,
}

impl ExpiryTimer {
    fn new(count: TimerCount) -> Self {
        Self { sleep: None, count }
    }

    fn set(&mut self, deadline: Option<Instant>) {
        match (deadline, &mut self.sleep) {
            (Some(deadline), Some(sleep)) => sleep.as_mut().reset(deadline),
            (Some(deadline), None) => {
                self.count.0.fetch_add(1, Ordering::Relaxed);
                self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline)));
            }
            (None, Some(_)) => self.disarm(),
            (None, None) => {}
        }
    }

    fn is_armed(&self) -> bool {
        self.sleep.is_some()
    }

    /// Completes when the armed deadline is reached; never when disarmed.
    async fn fired(&mut self) {
        match &mut self.sleep {
            Some(sleep) => sleep.as_mut().await,
            None => std::future::pending().await,
        }
    }

    fn disarm(&mut self) {
        if self.sleep.take().is_some() {
            self.count.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for ExpiryTimer {
    fn drop(&mut self) {
        self.disarm();
    }
}

/// Runs `work` to completion, expiring devices whenever the timer fires
/// meanwhile.
async fn expiring<T>(
    work: impl Future<Output = T>,
    timer: &mut ExpiryTimer,
    sink: &impl DeviceHealthSink,
) -> T {
    let mut work = std::pin::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return done,
            () = timer.fired() => timer.set(sink.expire()),
        }
    }
}

/// Whether a stream that failed with `status` should not be opened again:
/// the driver does not implement the service after all (the kubelet's
/// `healthStreamTerminated`). Any other failure is retried.
pub(crate) fn ended_for_good(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unimplemented
}

/// Streams the health of the driver's devices from `connection` into
/// `sink` until the task is aborted, reopening the stream
/// [`HEALTH_RETRY_INTERVAL`] after it ends or fails, and stopping for good
/// on `Unimplemented`; meanwhile, and after that until every device kept
/// has expired, expires devices at their deadlines.
pub(crate) async fn watch(
    driver: String,
    endpoint: String,
    service: HealthService,
    connection: Arc<Connection>,
    sink: impl DeviceHealthSink,
    timers: TimerCount,
) {
    let mut timer = ExpiryTimer::new(timers);
    timer.set(sink.next_deadline());
    loop {
        match stream(&connection, service, &sink, &mut timer).await {
            Ok(()) => debug!(driver, endpoint, %service, "health stream ended; reopening it"),
            Err(status) if ended_for_good(&status) => {
                info!(
                    driver,
                    endpoint,
                    %service,
                    error = status.message(),
                    "the DRA driver does not implement its health service; not streaming health"
                );
                break;
            }
            Err(status) => debug!(
                driver,
                endpoint,
                %service,
                code = ?status.code(),
                error = status.message(),
                "health stream failed; reopening it"
            ),
        }
        expiring(tokio::time::sleep(HEALTH_RETRY_INTERVAL), &mut timer, &sink).await;
    }
    // No more reports: what an older instance reported still expires.
    while timer.is_armed() {
        timer.fired().await;
        timer.set(sink.expire());
    }
}

/// One `NodeWatchResources` stream, open until it ends or fails.
async fn stream(
    connection: &Connection,
    service: HealthService,
    sink: &impl DeviceHealthSink,
    timer: &mut ExpiryTimer,
) -> Result<(), tonic::Status> {
    let channel = connection.channel()?;
    let mut stream = expiring(Opened::open(channel, service), timer, sink).await?;
    while let Some(devices) = expiring(stream.next(), timer, sink).await? {
        timer.set(sink.report(devices));
    }
    Ok(())
}

/// An open stream of either version.
enum Opened {
    V1(tonic::Streaming<v1::NodeWatchResourcesResponse>),
    V1alpha1(tonic::Streaming<v1alpha1::NodeWatchResourcesResponse>),
}

impl Opened {
    async fn open(
        channel: kpm_transport::UdsChannel,
        service: HealthService,
    ) -> Result<Self, tonic::Status> {
        let limit = kpm_api::constants::MAX_PLUGIN_MESSAGE_BYTES;
        Ok(match service {
            HealthService::V1 => Self::V1(
                v1::dra_resource_health_client::DraResourceHealthClient::new(channel)
                    .max_decoding_message_size(limit)
                    .node_watch_resources(v1::NodeWatchResourcesRequest {})
                    .await?
                    .into_inner(),
            ),
            HealthService::V1alpha1 => Self::V1alpha1(
                v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(channel)
                    .max_decoding_message_size(limit)
                    .node_watch_resources(v1alpha1::NodeWatchResourcesRequest {})
                    .await?
                    .into_inner(),
            ),
        })
    }

    /// The next message's devices; `None` at the end of the stream.
    /// Cancel-safe: a message is taken only when it is returned.
    async fn next(&mut self) -> Result<Option<Vec<DeviceReport>>, tonic::Status> {
        Ok(match self {
            Self::V1(stream) => stream.message().await?.map(|message| v1_devices(message.devices)),
            Self::V1alpha1(stream) => {
                stream.message().await?.map(|message| v1alpha1_devices(message.devices))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(pool: &str, device: &str, status: i32, message: &str) -> v1::DeviceHealth {
        v1::DeviceHealth {
            device: Some(v1::DeviceIdentifier {
                pool_name: pool.into(),
                device_name: device.into(),
            }),
            health: status,
            last_updated_time: 0,
            health_check_timeout_seconds: 0,
            message: message.into(),
        }
    }

    fn report(device: &str, health: &'static str, timeout_secs: u64) -> DeviceReport {
        DeviceReport {
            pool: "pool1".into(),
            device: device.into(),
            health,
            message: format!("{device} {health}"),
            timeout: Duration::from_secs(timeout_secs),
        }
    }

    /// (device, health, previous, expired) of each change.
    fn changes(events: &[PluginEvent]) -> Vec<(&str, &str, Option<&str>, bool)> {
        events
            .iter()
            .map(|event| match event {
                PluginEvent::DraDeviceHealthChanged {
                    device, health, previous, expired, ..
                } => (device.as_str(), health.as_str(), previous.as_deref(), *expired),
                other => panic!("not a health change: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn device_health_is_named_sorted_and_truncated() {
        let mut table = DeviceHealthTable::default();
        let reports = v1_devices(vec![
            health("pool2", "dev1", 2, "fan failed"),
            health("pool1", "dev2", 7, ""),
            health("pool1", "dev1", 1, &"x".repeat(2000)),
        ]);
        table.report("d", reports, Instant::now(), SystemTime::UNIX_EPOCH);
        let devices = table.statuses();
        let names: Vec<_> = devices
            .iter()
            .map(|d| (d.pool.as_str(), d.device.as_str(), d.health.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("pool1", "dev1", "Healthy"),
                ("pool1", "dev2", "Unknown"),
                ("pool2", "dev1", "Unhealthy")
            ]
        );
        assert_eq!(devices[0].message.chars().count(), 1024);
        assert!(devices[0].message.ends_with("x..."));
        assert_eq!(devices[2].message, "fan failed");
    }

    #[test]
    fn the_timeout_is_the_default_unless_positive_and_at_most_a_year() {
        assert_eq!(health_timeout(0), DEFAULT_HEALTH_TIMEOUT);
        assert_eq!(health_timeout(-5), DEFAULT_HEALTH_TIMEOUT);
        assert_eq!(health_timeout(i64::MIN), DEFAULT_HEALTH_TIMEOUT);
        assert_eq!(health_timeout(10), Duration::from_secs(10));
        assert_eq!(health_timeout(i64::MAX), MAX_CONFIG_DURATION);
        // The longest deadline can be computed.
        let _ = Instant::now() + health_timeout(i64::MAX);
        let mut with_timeout = health("p", "d", 1, "");
        with_timeout.health_check_timeout_seconds = 10;
        assert_eq!(v1_devices(vec![with_timeout])[0].timeout, Duration::from_secs(10));
    }

    #[test]
    fn reports_and_expiries_change_health_once_each() {
        let mut table = DeviceHealthTable::default();
        let start = Instant::now();
        let wall = SystemTime::UNIX_EPOCH;
        let first = vec![report("a", "Healthy", 10), report("b", "Unknown", 5)];
        assert_eq!(
            changes(&table.report("d", first, start, wall)),
            [("a", "Healthy", None, false), ("b", "Unknown", None, false)]
        );
        assert_eq!(table.next_deadline(), Some(start + Duration::from_secs(5)));
        assert_eq!(table.statuses()[0].expires_at, Some(wall + Duration::from_secs(10)));

        // b is Unknown already: it expires without a change.
        assert!(table.expire("d", start + Duration::from_secs(5)).is_empty());
        assert_eq!(table.statuses()[1].expires_at, None);
        assert_eq!(table.statuses()[1].message, "", "an expired message is cleared");
        assert_eq!(table.next_deadline(), Some(start + Duration::from_secs(10)));

        // The same health again moves the deadline, with no change.
        let later = start + Duration::from_secs(8);
        assert!(table.report("d", vec![report("a", "Healthy", 10)], later, wall).is_empty());
        assert_eq!(table.statuses().len(), 1, "a device left out is removed");
        assert!(table.expire("d", start + Duration::from_secs(10)).is_empty(), "moved");
        let deadline = later + Duration::from_secs(10);
        assert!(table.expire("d", deadline - Duration::from_nanos(1)).is_empty());
        assert_eq!(
            changes(&table.expire("d", deadline)),
            [("a", "Unknown", Some("Healthy"), true)]
        );
        assert!(table.expire("d", deadline).is_empty(), "once");
        assert_eq!(table.next_deadline(), None);
        let status = &table.statuses()[0];
        assert_eq!((status.health.as_str(), status.message.as_str()), ("Unknown", ""));

        let again = vec![report("a", "Unhealthy", 10)];
        assert_eq!(
            changes(&table.report("d", again, deadline, wall)),
            [("a", "Unhealthy", Some("Unknown"), false)]
        );
    }

    #[test]
    fn only_unimplemented_ends_a_health_stream_for_good() {
        // The decision of TestHealthStreamUnimplemented.
        assert!(!ended_for_good(&tonic::Status::unavailable("temporary")));
        assert!(!ended_for_good(&tonic::Status::internal("stream reset")));
        assert!(ended_for_good(&tonic::Status::unimplemented(
            "unknown service v1.DRAResourceHealth"
        )));
    }
}
