//! Connection monitoring against fake DRA drivers that stop and restart:
//! rolling upgrades with fallback to the older instance, the cleanup grace
//! period, and device health streaming (ports of the kubelet's
//! `TestConnectionHandling`, the `manage-resource-slices` case of
//! `TestRegistrationHandler` and the health stream tests, spec C.7).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kpm_cache::PluginHandler;
use kpm_dra::{DeviceHealthStatus, DraConfig, DraDriverStatus, DraManager, InMemoryCleanup};
use support::{DEADLINE, FakeDriver, Health, Serves, claim, serve, strings, wait_until};
use tempfile::TempDir;
use tokio::time::Instant;

const DRIVER: &str = "gpu.example.com";

/// A drop must be noticed within this time.
const NOTICE: Duration = Duration::from_secs(1);

struct Setup {
    dir: TempDir,
    cleanup: Arc<InMemoryCleanup>,
    manager: Arc<DraManager>,
}

fn setup(cleanup_grace: Duration) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let cleanup = Arc::new(InMemoryCleanup::default());
    let config = DraConfig {
        call_timeout: DEADLINE,
        cleanup_grace,
        root_dir: Some(dir.path().to_path_buf()),
    };
    let manager = DraManager::new(config, cleanup.clone());
    Setup { dir, cleanup, manager }
}

impl Setup {
    fn endpoint(&self, file: &str) -> String {
        self.dir.path().join(file).display().to_string()
    }

    async fn register(&self, endpoint: &str, services: &[&str]) {
        let handler: &dyn PluginHandler = &*self.manager;
        let services = strings(services);
        handler.validate(DRIVER, endpoint, &services).await.unwrap();
        handler.register(DRIVER, endpoint, &services).await.unwrap();
    }

    async fn deregister(&self, endpoint: &str) {
        let handler: &dyn PluginHandler = &*self.manager;
        handler.deregister(DRIVER, endpoint).await;
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

    async fn wait_until_connected(&self, endpoint: &str, connected: bool) -> Duration {
        let start = Instant::now();
        wait_until(&format!("{endpoint} is connected={connected}"), || {
            self.connected(endpoint) == Some(connected)
        })
        .await;
        start.elapsed()
    }
}

/// Sleeps until `time` has passed, plus a margin.
async fn sleep_past(time: SystemTime, margin: Duration) {
    let left = time.duration_since(SystemTime::now()).unwrap_or_default();
    tokio::time::sleep(left + margin).await;
}

#[tokio::test]
async fn a_rolling_upgrade_serves_from_the_newest_instance_and_falls_back_when_it_exits() {
    let setup = setup(Duration::from_secs(30));
    let (old_driver, new_driver) = (FakeDriver::new(Serves::V1), FakeDriver::new(Serves::V1));
    let old = serve(&setup.dir.path().join("gpu.example.com-uid1.sock"), &old_driver).await;
    setup.register(&old.endpoint(), &["v1.DRAPlugin"]).await;
    let new = serve(&setup.dir.path().join("gpu.example.com-uid2.sock"), &new_driver).await;
    setup.register(&new.endpoint(), &["v1.DRAPlugin"]).await;
    let (old_endpoint, new_endpoint) = (old.endpoint(), new.endpoint());

    setup.manager.prepare(DRIVER, vec![claim("a")]).await.unwrap();
    assert_eq!((old_driver.calls().len(), new_driver.calls().len()), (0, 1), "the newer serves");

    new.stop();
    let noticed = setup.wait_until_connected(&new_endpoint, false).await;
    assert!(noticed < NOTICE, "the drop was noticed after {noticed:?}");
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
    let _old = serve(&setup.dir.path().join("old.sock"), &old_driver).await;
    setup.register(&setup.endpoint("old.sock"), &["v1.DRAPlugin"]).await;
    let new = serve(&setup.dir.path().join("new.sock"), &new_driver).await;
    setup.register(&new.endpoint(), &["v1.DRAPlugin"]).await;
    let new_endpoint = new.endpoint();

    new.stop();
    setup.wait_until_connected(&new_endpoint, false).await;
    let _new = serve(&setup.dir.path().join("new.sock"), &new_driver).await;
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
    let served = serve(&setup.dir.path().join("dra.sock"), &driver).await;
    let endpoint = served.endpoint();
    setup.register(&endpoint, &["v1beta1.DRAPlugin"]).await;
    assert_eq!(setup.pending(), None);

    served.stop();
    setup.wait_until_connected(&endpoint, false).await;
    let until = setup.pending().expect("a cleanup is pending while nothing is connected");
    let served = serve(&setup.dir.path().join("dra.sock"), &driver).await;
    let reconnected = setup.wait_until_connected(&endpoint, true).await;
    assert!(reconnected < NOTICE * 2, "the reconnect was noticed after {reconnected:?}");
    assert_eq!(setup.pending(), None, "the reconnect cancelled the cleanup");

    sleep_past(until, Duration::from_millis(300)).await;
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
    let served = serve(&setup.dir.path().join("dra.sock"), &driver).await;
    let endpoint = served.endpoint();
    setup.register(&endpoint, &["v1.DRAPlugin"]).await;

    let stopped = Instant::now();
    served.stop();
    wait_until("the driver is cleaned up", || !setup.cleanup.wiped().is_empty()).await;
    let waited = stopped.elapsed();
    assert!(waited >= grace && waited < grace + NOTICE * 2, "cleaned up after {waited:?}");
    assert_eq!(setup.pending(), None);

    tokio::time::sleep(grace * 3).await;
    assert_eq!(setup.cleanup.wiped(), [DRIVER], "exactly once");
    assert_eq!(setup.connected(&endpoint), Some(false), "the instance stays registered");

    // It comes back later: connected again, nothing more to clean up.
    let _served = serve(&setup.dir.path().join("dra.sock"), &driver).await;
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
    let first = serve(&setup.dir.path().join("first.sock"), &driver).await;
    let second = serve(&setup.dir.path().join("second.sock"), &driver).await;
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
    let _served = serve(&setup.dir.path().join("late.sock"), &driver).await;
    let noticed = setup.wait_until_connected(&endpoint, true).await;
    assert!(noticed < NOTICE * 2, "the driver coming up was noticed after {noticed:?}");
    assert_eq!(setup.pending(), None);
    setup.manager.prepare(DRIVER, vec![claim("a")]).await.unwrap();
    assert_eq!(driver.calls().len(), 1);
}

#[tokio::test]
async fn shutdown_cancels_pending_cleanups_and_closes_connections() {
    let grace = Duration::from_millis(300);
    let setup = setup(grace);
    let driver = FakeDriver::new(Serves::V1);
    let served = serve(&setup.dir.path().join("up.sock"), &driver).await;
    setup.register(&served.endpoint(), &["v1.DRAPlugin"]).await;
    let other = "other.example.com";
    let handler: &dyn PluginHandler = &*setup.manager;
    let down = setup.endpoint("down.sock");
    handler.register(other, &down, &strings(&["v1.DRAPlugin"])).await.unwrap();
    assert!(
        setup
            .manager
            .drivers()
            .iter()
            .any(|d| d.name == other && d.cleanup_pending_until.is_some())
    );

    setup.manager.shutdown().await;
    assert!(setup.manager.drivers().is_empty());
    tokio::time::sleep(grace * 3).await;
    assert!(setup.cleanup.wiped().is_empty(), "the pending cleanup was cancelled");
    drop(served);
}

// === Device health ===

#[tokio::test]
async fn device_health_streamed_by_the_newest_instance_appears_in_the_status() {
    // TestPlugin_WatchResources, through the status.
    let setup = setup(Duration::from_secs(30));
    let driver = FakeDriver::with_health(Serves::V1, Health::V1);
    let served = serve(&setup.dir.path().join("dra.sock"), &driver).await;
    setup.register(&served.endpoint(), &["v1.DRAPlugin", "v1.DRAResourceHealth"]).await;
    wait_until("device health is streamed", || !setup.devices().is_empty()).await;
    assert_eq!(
        setup.devices(),
        [DeviceHealthStatus {
            pool: "pool1".into(),
            device: "dev1".into(),
            health: "Healthy".into(),
            message: "all good".into(),
        }]
    );
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
    let served = serve(&setup.dir.path().join("dra.sock"), &driver).await;
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
    let served = serve(&setup.dir.path().join("dra.sock"), &driver).await;
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
    let old = serve(&setup.dir.path().join("old.sock"), &with_health).await;
    setup.register(&old.endpoint(), &["v1.DRAPlugin", "v1.DRAResourceHealth"]).await;
    wait_until("device health is streamed", || !setup.devices().is_empty()).await;

    let without = FakeDriver::new(Serves::V1);
    let new = serve(&setup.dir.path().join("new.sock"), &without).await;
    setup.register(&new.endpoint(), &["v1.DRAPlugin"]).await;
    assert!(setup.devices().is_empty(), "the newest has no health service: no fallback");

    // Removing the newest hands the stream back to the remaining instance.
    setup.deregister(&new.endpoint()).await;
    with_health.wait_for_watches(2).await;
    wait_until("device health is streamed again", || !setup.devices().is_empty()).await;

    setup.deregister(&old.endpoint()).await;
    assert!(setup.devices().is_empty());
}
