//! Device health that expires, on paused time against a fake driver on a
//! real socket: a device's health holds for its timeout from the message
//! that reported it and is `Unknown` at that very instant, a fresh report
//! moves the deadline, and the one timer per driver exists only while a
//! device's health is due to expire.
//!
//! The driver runs on its own thread; every wait for what it sends holds
//! the paused clock still ([`with_clock_held`], [`wait_with_clock_held`]),
//! so the clock moves only when a test sleeps, and jumps from timer to
//! timer: a report is received at an instant the test knows exactly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use kpm_api::dra_health::v1::HealthStatus;
use kpm_cache::PluginDetails;
use kpm_cache::PluginEndpoint;
use kpm_cache::{EventBus, PluginEvent, PluginHandler};
use kpm_dra::{DeviceHealthStatus, DraConfig, DraManager, InMemoryCleanup};
use kpm_test_support::{DEADLINE, wait_with_clock_held, with_clock_held, within};
use support::{FakeDriver, Health, Served, Serves, serve, strings};
use tempfile::TempDir;
use tokio::sync::broadcast::{self, error::TryRecvError};
use tokio::time::{Instant, sleep_until};

/// An endpoint as a DRA driver advertises it.
fn advertised(endpoint: impl Into<String>) -> PluginEndpoint {
    PluginEndpoint::Advertised(endpoint.into())
}

const DRIVER: &str = "gpu.example.com";

struct Setup {
    dir: TempDir,
    manager: Arc<DraManager>,
    bus: EventBus,
    events: broadcast::Receiver<PluginEvent>,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let config = DraConfig::default().call_timeout(DEADLINE).root_dir(Some(dir.path().into()));
    let bus = EventBus::default();
    let events = bus.subscribe();
    let cleanup = Arc::new(InMemoryCleanup::default());
    let budget = kpm_transport::fd::budget().clone();
    let manager = DraManager::try_new(config, budget, cleanup, Some(bus.clone())).unwrap();
    Setup { dir, manager, bus, events }
}

impl Setup {
    /// Serves `driver` at `file` and registers it with `services`, the
    /// clock held.
    async fn serve_and_register(
        &self,
        file: &str,
        driver: &Arc<FakeDriver>,
        services: &[&str],
    ) -> Served {
        let served = serve(&self.dir.path().join(file), driver);
        let handler: &dyn PluginHandler = &*self.manager;
        let services = strings(services);
        with_clock_held(handler.register(&PluginDetails::new(
            DRIVER,
            advertised(served.endpoint()),
            services.clone(),
        )))
        .await
        .unwrap();
        served
    }

    /// A driver streaming the health the test sends, registered.
    async fn health_driver(&self) -> (Arc<FakeDriver>, Served) {
        let driver = FakeDriver::with_health(Serves::V1, Health::V1Sent);
        let served = self
            .serve_and_register("dra.sock", &driver, &["v1.DRAPlugin", "v1.DRAResourceHealth"])
            .await;
        (driver, served)
    }

    /// A driver streaming the health the test sends, registered, that
    /// reported `dev1` with `health`, `timeout_secs` and `message`: it
    /// and the instant the report was received, its event taken.
    async fn first_report(
        &mut self,
        health: HealthStatus,
        timeout_secs: i64,
        message: &str,
    ) -> (Arc<FakeDriver>, Served, Instant) {
        let (driver, served) = self.health_driver().await;
        driver.send_health(&[("dev1", health, timeout_secs, message)]);
        let reported = self.received(message).await;
        // Named as kpm names it: `Healthy`, `Unhealthy`.
        let name = format!("{health:?}");
        assert_eq!(self.change(), changed(&name, None, false), "its first report");
        (driver, served, reported)
    }

    fn devices(&self) -> Vec<DeviceHealthStatus> {
        devices(&self.manager)
    }

    /// `dev1`'s health and message.
    fn health(&self) -> (String, String) {
        let device = self.devices().into_iter().find(|device| device.device == "dev1").unwrap();
        (device.health, device.message)
    }

    /// Waits, the clock held, until the manager shows `message` for `dev1`:
    /// the report that carries it is taken at the instant this returns.
    async fn received(&self, message: &str) -> Instant {
        let manager = Arc::clone(&self.manager);
        let wanted = message.to_owned();
        wait_with_clock_held(format!("dev1 is reported with {message:?}"), move || {
            devices(&manager)
                .iter()
                .any(|device| device.device == "dev1" && device.message == wanted)
        })
        .await;
        Instant::now()
    }

    /// The health change published next, which must be there already.
    fn change(&mut self) -> (String, Option<String>, bool) {
        match self.events.try_recv() {
            Ok(PluginEvent::DraDeviceHealthChanged {
                driver,
                device,
                health,
                previous,
                expired,
                ..
            }) => {
                assert_eq!((driver.as_str(), device.as_str()), (DRIVER, "dev1"));
                (health, previous, expired)
            }
            other => panic!("expected a health change, got {other:?}"),
        }
    }

    fn no_change(&mut self) {
        assert!(matches!(self.events.try_recv(), Err(TryRecvError::Empty)), "no more events");
    }

    /// The expiry the timer publishes at the instant the test woke at: the
    /// timer's task was woken with the test's, so it runs before the
    /// runtime could move the clock.
    async fn expiry(&mut self) -> (String, Option<String>, bool) {
        let woke = Instant::now();
        let event = within("the expiry is published", self.events.recv()).await.unwrap();
        assert_eq!(Instant::now(), woke, "published at the deadline");
        let PluginEvent::DraDeviceHealthChanged { health, previous, expired, message, .. } = event
        else {
            panic!("expected a health change, got {event:?}");
        };
        assert_eq!(message, "", "an expired device's message is cleared");
        (health, previous, expired)
    }
}

fn devices(manager: &DraManager) -> Vec<DeviceHealthStatus> {
    let drivers = manager.drivers();
    drivers.into_iter().find(|driver| driver.name == DRIVER).map(|d| d.devices).unwrap_or_default()
}

fn changed(health: &str, previous: Option<&str>, expired: bool) -> (String, Option<String>, bool) {
    (health.to_owned(), previous.map(str::to_owned), expired)
}

fn healthy(message: &str) -> (String, String) {
    ("Healthy".to_owned(), message.to_owned())
}

#[tokio::test(start_paused = true)]
async fn reported_health_becomes_unknown_exactly_at_its_deadline() {
    let mut setup = setup();
    let (_driver, _served, reported) = setup.first_report(HealthStatus::Healthy, 10, "fine").await;
    let status = &setup.devices()[0];
    assert_eq!(status.expires_at, Some(status.reported_at + Duration::from_secs(10)));
    assert_eq!(setup.manager.health_timers(), 1);

    sleep_until(reported + Duration::from_millis(9_999)).await;
    assert_eq!(setup.health(), healthy("fine"));
    setup.no_change();

    sleep_until(reported + Duration::from_secs(10)).await;
    assert_eq!(setup.expiry().await, changed("Unknown", Some("Healthy"), true));
    assert_eq!(setup.health(), ("Unknown".to_owned(), String::new()));
    assert_eq!(setup.devices()[0].expires_at, None);
    assert_eq!(setup.manager.health_timers(), 0, "nothing left to expire: no timer");

    // Much later: nothing more happens.
    sleep_until(reported + Duration::from_secs(3600)).await;
    setup.no_change();
    assert_eq!(setup.bus.counts().device_health_changes, 2, "published once per change");
}

#[tokio::test(start_paused = true)]
async fn a_fresh_report_moves_the_deadline() {
    let mut setup = setup();
    let (driver, _served, reported) = setup.first_report(HealthStatus::Healthy, 10, "fine").await;

    sleep_until(reported + Duration::from_secs(8)).await;
    driver.send_health(&[("dev1", HealthStatus::Healthy, 10, "still fine")]);
    let again = setup.received("still fine").await;
    assert_eq!(again, reported + Duration::from_secs(8));
    setup.no_change();

    // The first report's deadline passes: the second one holds.
    sleep_until(reported + Duration::from_secs(10)).await;
    assert_eq!(setup.health(), healthy("still fine"));
    sleep_until(reported + Duration::from_millis(17_999)).await;
    assert_eq!(setup.health(), healthy("still fine"));
    setup.no_change();

    sleep_until(reported + Duration::from_secs(18)).await;
    assert_eq!(setup.expiry().await, changed("Unknown", Some("Healthy"), true));

    // A report after the expiry is a change again, with a deadline again.
    driver.send_health(&[("dev1", HealthStatus::Unhealthy, 10, "fan failed")]);
    setup.received("fan failed").await;
    assert_eq!(setup.change(), changed("Unhealthy", Some("Unknown"), false));
    assert_eq!(setup.manager.health_timers(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_device_without_a_timeout_expires_after_the_default_30_seconds() {
    let mut setup = setup();
    let (_driver, _served, reported) =
        setup.first_report(HealthStatus::Unhealthy, 0, "fan failed").await;
    let status = &setup.devices()[0];
    assert_eq!(status.expires_at, Some(status.reported_at + kpm_dra::DEFAULT_HEALTH_TIMEOUT));

    sleep_until(reported + Duration::from_millis(29_999)).await;
    assert_eq!(setup.health(), ("Unhealthy".to_owned(), "fan failed".to_owned()));
    sleep_until(reported + Duration::from_secs(30)).await;
    assert_eq!(setup.expiry().await, changed("Unknown", Some("Unhealthy"), true));
}

#[tokio::test(start_paused = true)]
async fn a_timer_exists_only_while_a_device_health_can_expire() {
    let mut setup = setup();
    // A driver with no health service: no timer, ever.
    let plain = FakeDriver::new(Serves::V1);
    let plain_served = setup.serve_and_register("plain.sock", &plain, &["v1.DRAPlugin"]).await;
    assert_eq!(setup.manager.health_timers(), 0);
    let handler: &dyn PluginHandler = &*setup.manager;
    handler
        .deregister(&PluginDetails::new(
            DRIVER,
            advertised(plain_served.endpoint()),
            Vec::<String>::new(),
        ))
        .await;

    // A health stream with no devices reported yet: none either.
    let (driver, served) = setup.health_driver().await;
    let streaming = Arc::clone(&driver);
    wait_with_clock_held("the health stream is open", move || streaming.watch_count() == 1).await;
    assert_eq!(setup.manager.health_timers(), 0);
    driver.send_health(&[("dev1", HealthStatus::Healthy, 10, "fine")]);
    let reported = setup.received("fine").await;
    assert_eq!(setup.manager.health_timers(), 1, "one for the device");

    // The driver goes: its devices, and their timer, go with it.
    handler
        .deregister(&PluginDetails::new(
            DRIVER,
            advertised(served.endpoint()),
            Vec::<String>::new(),
        ))
        .await;
    assert!(setup.devices().is_empty());
    let manager = Arc::clone(&setup.manager);
    wait_with_clock_held("the stream's task and its timer are dropped", move || {
        manager.health_timers() == 0
    })
    .await;
    assert_eq!(setup.change(), changed("Healthy", None, false));
    sleep_until(reported + Duration::from_secs(60)).await;
    setup.no_change();
}

#[tokio::test(start_paused = true)]
async fn a_new_owner_of_the_stream_takes_over_the_timer_of_the_devices_it_keeps() {
    let mut setup = setup();
    let (_old, _old_served, reported) = setup.first_report(HealthStatus::Healthy, 10, "fine").await;

    // A newer instance owns the stream from 2 s on; it reports nothing.
    sleep_until(reported + Duration::from_secs(2)).await;
    let new = FakeDriver::with_health(Serves::V1, Health::V1Sent);
    let _new_served =
        setup.serve_and_register("new.sock", &new, &["v1.DRAPlugin", "v1.DRAResourceHealth"]).await;
    let streaming = Arc::clone(&new);
    wait_with_clock_held("the new stream is open", move || streaming.watch_count() == 1).await;
    assert_eq!(setup.manager.health_timers(), 1, "the old owner's timer went with its task");
    assert_eq!(setup.health(), healthy("fine"), "kept through the handover");

    // What the old owner reported expires when it would have.
    sleep_until(reported + Duration::from_millis(9_999)).await;
    setup.no_change();
    sleep_until(reported + Duration::from_secs(10)).await;
    assert_eq!(setup.expiry().await, changed("Unknown", Some("Healthy"), true));
    setup.no_change();
}
