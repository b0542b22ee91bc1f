//! Connection monitoring against fake DRA drivers that stop and restart:
//! rolling upgrades with fallback to the older instance, the cleanup grace
//! period, and device health streaming (ports of the kubelet's
//! `TestConnectionHandling`, the `manage-resource-slices` case of
//! `TestRegistrationHandler` and the health stream tests, spec C.7).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kpm_cache::PluginDetails;
use kpm_cache::PluginEndpoint;
use kpm_cache::PluginHandler;
use kpm_dra::{DeviceHealthStatus, DraConfig, DraDriverStatus, DraManager, InMemoryCleanup};
use kpm_test_support::{DEADLINE, wait_until};
use support::{FakeDriver, Health, Serves, claim, serve, strings};
use tempfile::TempDir;
use tokio::time::Instant;

/// An endpoint as a DRA driver advertises it.
fn advertised(endpoint: impl Into<String>) -> PluginEndpoint {
    PluginEndpoint::Advertised(endpoint.into())
}

const DRIVER: &str = "gpu.example.com";

struct Setup {
    dir: TempDir,
    cleanup: Arc<InMemoryCleanup>,
    manager: Arc<DraManager>,
}

fn setup(cleanup_grace: Duration) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let cleanup = Arc::new(InMemoryCleanup::default());
    let config = DraConfig::default()
        .call_timeout(DEADLINE)
        .cleanup_grace(cleanup_grace)
        .root_dir(Some(dir.path().to_path_buf()));
    let budget = kpm_transport::fd::budget().clone();
    let manager = DraManager::try_new(config, budget, cleanup.clone(), None).unwrap();
    Setup { dir, cleanup, manager }
}

impl Setup {
    fn endpoint(&self, file: &str) -> String {
        self.dir.path().join(file).display().to_string()
    }

    async fn register(&self, endpoint: &str, services: &[&str]) {
        let handler: &dyn PluginHandler = &*self.manager;
        let services = strings(services);
        handler
            .validate(&PluginDetails::new(DRIVER, advertised(endpoint), services.clone()))
            .await
            .unwrap();
        handler
            .register(&PluginDetails::new(DRIVER, advertised(endpoint), services.clone()))
            .await
            .unwrap();
    }

    async fn deregister(&self, endpoint: &str) {
        let handler: &dyn PluginHandler = &*self.manager;
        handler
            .deregister(&PluginDetails::new(DRIVER, advertised(endpoint), Vec::<String>::new()))
            .await;
    }

    fn status(&self) -> Option<DraDriverStatus> {
        self.manager.drivers().into_iter().find(|driver| driver.name == DRIVER)
    }

    fn connected(&self, endpoint: &str) -> Option<bool> {
        self.status()?.instances.into_iter().find(|i| i.endpoint == endpoint).map(|i| i.connected)
    }

    fn pending(&self) -> Option<SystemTime> {
        self.status().and_then(|status| status.cleanup_pending_until)
    }

    fn devices(&self) -> Vec<DeviceHealthStatus> {
        self.status().map(|status| status.devices).unwrap_or_default()
    }

    async fn wait_until_connected(&self, endpoint: &str, connected: bool) {
        wait_until(format_args!("{endpoint} is connected={connected}"), || {
            self.connected(endpoint) == Some(connected)
        })
        .await;
    }
}

/// Lets `span` of tokio time pass at once, then real time resumes: paused,
/// the runtime fires every timer due within `span` in order, running what
/// they wake, before this returns. A test proves with it that something
/// does *not* happen within `span` (a cleanup timer that was cancelled, or
/// never queued) without sleeping on real time. Only for stretches where no
/// task of the test's runtime waits for a live socket under a timeout: the
/// clock jumps while the runtime is idle.
async fn let_pass(span: Duration) {
    tokio::time::pause();
    tokio::time::sleep(span).await;
    tokio::time::resume();
}

/// [`let_pass`] until `time` has passed, plus a margin.
async fn let_pass_until(time: SystemTime, margin: Duration) {
    let left = time.duration_since(SystemTime::now()).unwrap_or_default();
    let_pass(left + margin).await;
}

#[tokio::test]
async fn a_rolling_upgrade_serves_from_the_newest_instance_and_falls_back_when_it_exits() {
    let setup = setup(Duration::from_secs(30));
    let (old_driver, new_driver) = (FakeDriver::new(Serves::V1), FakeDriver::new(Serves::V1));
    let old = serve(&setup.dir.path().join("gpu.example.com-uid1.sock"), &old_driver);
    setup.register(&old.endpoint(), &["v1.DRAPlugin"]).await;
    let new = serve(&setup.dir.path().join("gpu.example.com-uid2.sock"), &new_driver);
    setup.register(&new.endpoint(), &["v1.DRAPlugin"]).await;
    let (old_endpoint, new_endpoint) = (old.endpoint(), new.endpoint());

    setup.manager.prepare(DRIVER, vec![claim("a")]).await.unwrap();
    assert_eq!((old_driver.calls().len(), new_driver.calls().len()), (0, 1), "the newer serves");

    // The drop is noticed with no call made: the connection's own pending
    // read sees it close (how soon is not asserted: real time is not bounded).
    new.stop();
    setup.wait_until_connected(&new_endpoint, false).await;
    assert_eq!(setup.connected(&old_endpoint), Some(true));
    setup.manager.prepare(DRIVER, vec![claim("b")]).await.unwrap();
    assert_eq!(old_driver.calls()[0].claims, ["b"], "the older one serves");
    assert_eq!(setup.pending(), None, "an instance is still connected: no cleanup");

    setup.deregister(&new_endpoint).await;
    let endpoints: Vec<_> =
        setup.status().unwrap().instances.into_iter().map(|i| i.endpoint).collect();
    assert_eq!(endpoints, [old_endpoint]);
    setup.manager.unprepare(DRIVER, vec![claim("b")]).await.unwrap();
    assert_eq!(old_driver.calls().len(), 2);
    assert!(setup.cleanup.wiped().is_empty());
}

#[tokio::test]
async fn a_newer_instance_serves_again_once_it_reconnects() {
    let setup = setup(Duration::from_secs(30));
    let (old_driver, new_driver) = (FakeDriver::new(Serves::V1), FakeDriver::new(Serves::V1));
    let _old = serve(&setup.dir.path().join("old.sock"), &old_driver);
    setup.register(&setup.endpoint("old.sock"), &["v1.DRAPlugin"]).await;
    let new = serve(&setup.dir.path().join("new.sock"), &new_driver);
    setup.register(&new.endpoint(), &["v1.DRAPlugin"]).await;
    let new_endpoint = new.endpoint();

    new.stop();
    setup.wait_until_connected(&new_endpoint, false).await;
    let _new = serve(&setup.dir.path().join("new.sock"), &new_driver);
    setup.wait_until_connected(&new_endpoint, true).await;
    setup.manager.prepare(DRIVER, vec![claim("a")]).await.unwrap();
    assert_eq!((old_driver.calls().len(), new_driver.calls().len()), (0, 1));
}

#[tokio::test]
async fn a_connection_restored_within_the_grace_period_cancels_the_cleanup() {
    // TestConnectionHandling: no-wipe-on-reconnect.
    let grace = Duration::from_millis(1500);
    let setup = setup(grace);
    let driver = FakeDriver::new(Serves::V1beta1);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    let endpoint = served.endpoint();
    setup.register(&endpoint, &["v1beta1.DRAPlugin"]).await;
    assert_eq!(setup.pending(), None);

    served.stop();
    setup.wait_until_connected(&endpoint, false).await;
    let until = setup.pending().expect("a cleanup is pending while nothing is connected");
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    setup.wait_until_connected(&endpoint, true).await;
    assert_eq!(setup.pending(), None, "the reconnect cancelled the cleanup");

    // The cancelled timer would have fired at `until`: tokio time passes it
    // at once, with the connection idle.
    let_pass_until(until, Duration::from_millis(300)).await;
    assert!(setup.cleanup.wiped().is_empty(), "no cleanup after the original deadline");
    setup.manager.prepare(DRIVER, vec![claim("a")]).await.unwrap();
    assert_eq!(driver.calls().len(), 1);
    drop(served);
}

#[tokio::test]
async fn a_driver_that_stays_away_beyond_the_grace_period_is_cleaned_up_exactly_once() {
    // TestConnectionHandling: wipe-on-disconnect.
    let grace = Duration::from_millis(300);
    let setup = setup(grace);
    let driver = FakeDriver::new(Serves::V1);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    let endpoint = served.endpoint();
    setup.register(&endpoint, &["v1.DRAPlugin"]).await;

    let stopped = Instant::now();
    served.stop();
    wait_until("the driver is cleaned up", || !setup.cleanup.wiped().is_empty()).await;
    // Never before the grace period; how much later is not bounded.
    let waited = stopped.elapsed();
    assert!(waited >= grace, "cleaned up after {waited:?}, within the {grace:?} grace period");
    assert_eq!(setup.pending(), None);

    // Three more grace periods of tokio time, while the monitor keeps
    // redialing the dead socket (each dial fails at once): no second cleanup.
    let_pass(grace * 3).await;
    assert_eq!(setup.cleanup.wiped(), [DRIVER], "exactly once");
    assert_eq!(setup.connected(&endpoint), Some(false), "the instance stays registered");

    // It comes back later: connected again, nothing more to clean up.
    let _served = serve(&setup.dir.path().join("dra.sock"), &driver);
    setup.wait_until_connected(&endpoint, true).await;
    assert_eq!(setup.pending(), None);
    setup.manager.prepare(DRIVER, vec![claim("a")]).await.unwrap();
}

#[tokio::test]
async fn the_last_instance_deregistered_is_cleaned_up_after_the_grace_period() {
    // registration_test: manage-resource-slices (wipe after deregistration).
    let grace = Duration::from_millis(300);
    let setup = setup(grace);
    let driver = FakeDriver::new(Serves::V1);
    let first = serve(&setup.dir.path().join("first.sock"), &driver);
    let second = serve(&setup.dir.path().join("second.sock"), &driver);
    setup.register(&first.endpoint(), &["v1.DRAPlugin"]).await;
    setup.register(&second.endpoint(), &["v1.DRAPlugin"]).await;

    setup.deregister(&second.endpoint()).await;
    assert_eq!(setup.pending(), None, "one instance is left");
    setup.deregister(&first.endpoint()).await;
    let status = setup.status().expect("listed while its cleanup is pending");
    assert!(status.instances.is_empty());
    assert!(status.cleanup_pending_until.is_some());

    wait_until("the driver is cleaned up", || !setup.cleanup.wiped().is_empty()).await;
    assert_eq!(setup.cleanup.wiped(), [DRIVER]);
    assert!(setup.manager.drivers().is_empty(), "gone once cleaned up");
}

#[tokio::test]
async fn an_instance_registered_before_its_driver_is_up_connects_when_it_comes_up() {
    let setup = setup(Duration::from_secs(30));
    let endpoint = setup.endpoint("late.sock");
    setup.register(&endpoint, &["v1.DRAPlugin"]).await;
    assert_eq!(setup.connected(&endpoint), Some(false));
    assert!(setup.pending().is_some(), "queued like the kubelet's add()");

    let driver = FakeDriver::new(Serves::V1);
    // The monitor redials every 250 ms; the wait proves it connects, how
    // soon is not asserted.
    let _served = serve(&setup.dir.path().join("late.sock"), &driver);
    setup.wait_until_connected(&endpoint, true).await;
    assert_eq!(setup.pending(), None);
    setup.manager.prepare(DRIVER, vec![claim("a")]).await.unwrap();
    assert_eq!(driver.calls().len(), 1);
}

#[tokio::test]
async fn shutdown_cancels_pending_cleanups_and_closes_connections() {
    let grace = Duration::from_millis(300);
    let setup = setup(grace);
    let driver = FakeDriver::new(Serves::V1);
    let served = serve(&setup.dir.path().join("up.sock"), &driver);
    setup.register(&served.endpoint(), &["v1.DRAPlugin"]).await;
    let other = "other.example.com";
    let handler: &dyn PluginHandler = &*setup.manager;
    let down = setup.endpoint("down.sock");
    handler
        .register(&PluginDetails::new(other, advertised(&down), strings(&["v1.DRAPlugin"])))
        .await
        .unwrap();
    assert!(
        setup
            .manager
            .drivers()
            .iter()
            .any(|d| d.name == other && d.cleanup_pending_until.is_some())
    );

    setup.manager.shutdown().await;
    assert!(setup.manager.drivers().is_empty());
    // Past the pending cleanup's time in tokio time: it never fires.
    let_pass(grace * 3).await;
    assert!(setup.cleanup.wiped().is_empty(), "the pending cleanup was cancelled");
    drop(served);
}

// === Device health ===

#[tokio::test]
async fn device_health_streamed_by_the_newest_instance_appears_in_the_status() {
    // TestPlugin_WatchResources, through the status.
    let setup = setup(Duration::from_secs(30));
    let driver = FakeDriver::with_health(Serves::V1, Health::V1);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    setup.register(&served.endpoint(), &["v1.DRAPlugin", "v1.DRAResourceHealth"]).await;
    wait_until("device health is streamed", || !setup.devices().is_empty()).await;
    let devices = setup.devices();
    let shown: Vec<_> = devices
        .iter()
        .map(|d| (d.pool.as_str(), d.device.as_str(), d.health.as_str(), d.message.as_str()))
        .collect();
    assert_eq!(shown, [("pool1", "dev1", "Healthy", "all good")]);
    // The driver's 30 s timeout, from when kpm received the report.
    assert_eq!(devices[0].expires_at, Some(devices[0].reported_at + Duration::from_secs(30)));
    let instance = &setup.status().unwrap().instances[0];
    assert_eq!(instance.health_service.as_deref(), Some("v1.DRAResourceHealth"));
    // TestGRPCConnIsReused, health_api_reuses_connection.
    setup.manager.prepare(DRIVER, vec![claim("a")]).await.unwrap();
    assert_eq!(served.accepted(), 1, "health and calls share the connection");
}

#[tokio::test]
async fn a_v1alpha1_health_stream_is_read_too() {
    let setup = setup(Duration::from_secs(30));
    let driver = FakeDriver::with_health(Serves::V1beta1, Health::V1alpha1);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    setup.register(&served.endpoint(), &["v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]).await;
    wait_until("device health is streamed", || !setup.devices().is_empty()).await;
    let devices = setup.devices();
    assert_eq!(
        (devices[0].health.as_str(), devices[0].message.as_str()),
        ("Unhealthy", "fan failed")
    );
}

#[tokio::test]
async fn a_health_stream_that_ends_is_opened_again() {
    let setup = setup(Duration::from_secs(30));
    let driver = FakeDriver::with_health(Serves::V1, Health::V1ThenEnd);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver);
    setup.register(&served.endpoint(), &["v1.DRAPlugin", "v1.DRAResourceHealth"]).await;
    driver.wait_for_watches(2).await;
    assert_eq!(setup.devices()[0].health, "Healthy", "the last update stays");
}

#[tokio::test]
async fn health_follows_the_newest_instance_without_falling_back_to_an_older_one() {
    // TestHealthStreamUsesLatestPlugin and
    // TestHealthStreamDoesNotFallBackFromPreferredPlugin.
    let setup = setup(Duration::from_secs(30));
    let with_health = FakeDriver::with_health(Serves::V1, Health::V1);
    let old = serve(&setup.dir.path().join("old.sock"), &with_health);
    setup.register(&old.endpoint(), &["v1.DRAPlugin", "v1.DRAResourceHealth"]).await;
    wait_until("device health is streamed", || !setup.devices().is_empty()).await;

    let without = FakeDriver::new(Serves::V1);
    let new = serve(&setup.dir.path().join("new.sock"), &without);
    setup.register(&new.endpoint(), &["v1.DRAPlugin"]).await;
    assert!(setup.devices().is_empty(), "the newest has no health service: no fallback");

    // Removing the newest hands the stream back to the remaining instance.
    setup.deregister(&new.endpoint()).await;
    with_health.wait_for_watches(2).await;
    wait_until("device health is streamed again", || !setup.devices().is_empty()).await;

    setup.deregister(&old.endpoint()).await;
    assert!(setup.devices().is_empty());
}
