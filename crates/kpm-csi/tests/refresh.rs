//! The allocatable count's refresh (KEP-4876) on paused time, against fake
//! CSI drivers on Unix sockets: NodeGetInfo on the period, the sink told
//! only when the limit changed, failures keeping the last count, and no
//! refresh once the driver is gone or its period is.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kpm_cache::PluginDetails;
use kpm_cache::PluginEndpoint;
use kpm_cache::PluginHandler;
use kpm_csi::{
    CsiConfig, CsiHandler, DriverNodeInfo, InMemoryNodeInfo, NodeInfoError, NodeInfoSink,
};
use kpm_test_support::csi::{FakeCsiDriver as FakeDriver, Reply, Served, info, serve};
use kpm_test_support::{DEADLINE, wait_until};
use parking_lot::Mutex;
use tempfile::TempDir;
use tokio::time::Instant;
use tonic::Status;

/// An endpoint as a driver advertises it.
fn advertised(endpoint: impl Into<String>) -> PluginEndpoint {
    PluginEndpoint::Advertised(endpoint.into())
}

const DRIVER: &str = "csi.example.com";
const PERIOD: Duration = Duration::from_secs(10);

/// The in-memory sink, recording which calls reached it.
#[derive(Default)]
struct RecordingSink {
    memory: InMemoryNodeInfo,
    calls: Mutex<Vec<String>>,
}

#[async_trait]
impl NodeInfoSink for RecordingSink {
    async fn install_driver(
        &self,
        driver: &str,
        info: &DriverNodeInfo,
    ) -> Result<(), NodeInfoError> {
        self.calls.lock().push(format!("install {driver} {}", info.max_volumes_per_node));
        self.memory.install_driver(driver, info).await
    }

    async fn uninstall_driver(&self, driver: &str) -> Result<(), NodeInfoError> {
        self.calls.lock().push(format!("uninstall {driver}"));
        self.memory.uninstall_driver(driver).await
    }

    async fn update_allocatable(
        &self,
        driver: &str,
        info: &DriverNodeInfo,
    ) -> Result<(), NodeInfoError> {
        self.calls.lock().push(format!("update {driver} {}", info.max_volumes_per_node));
        self.memory.update_allocatable(driver, info).await
    }
}

struct Setup {
    dir: TempDir,
    sink: Arc<RecordingSink>,
    handler: CsiHandler,
}

fn setup(config: CsiConfig) -> Setup {
    let sink = Arc::new(RecordingSink::default());
    let handler = CsiHandler::try_new(
        sink.clone(),
        config.node_get_info_timeout(DEADLINE),
        kpm_transport::fd::budget().clone(),
    )
    .unwrap();
    Setup { dir: tempfile::tempdir().unwrap(), sink, handler }
}

fn refreshed_every_period() -> Setup {
    setup(CsiConfig::default().allocatable_update_period(DRIVER, PERIOD))
}

impl Setup {
    async fn serve(&self, script: Vec<Reply>, fallback: Reply) -> Served {
        serve(&self.dir.path().join("csi.sock"), FakeDriver::new(DRIVER, script, fallback)).await
    }

    async fn register(&self, served: &Served) {
        let versions = ["1.0.0".to_owned()];
        self.handler
            .register(&PluginDetails::new(DRIVER, advertised(served.endpoint()), versions))
            .await
            .unwrap();
    }

    fn sink_calls(&self) -> Vec<String> {
        self.sink.calls.lock().clone()
    }

    /// The CSINode entry's `allocatable.count`.
    fn count(&self) -> Option<i32> {
        self.sink.memory.snapshot().csinode.driver(DRIVER).and_then(|entry| entry.allocatable_count)
    }

    fn max_volumes(&self) -> Option<i64> {
        self.handler.drivers().get(DRIVER)?.node.map(|node| node.max_volumes_per_node)
    }

    fn refreshed_at(&self) -> Option<std::time::SystemTime> {
        self.handler.drivers().get(DRIVER)?.allocatable_refreshed_at
    }

    /// Waits until a refresh after `since` is recorded.
    async fn refreshed_after(&self, since: Option<std::time::SystemTime>) {
        wait_until("the refresh is recorded", || self.refreshed_at() > since).await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_count_is_refreshed_on_the_period_and_the_sink_told_only_of_a_change() {
    let setup = refreshed_every_period();
    let served =
        setup.serve(vec![info("n1", 7, &[]), info("n1", 7, &[])], info("n1", 9, &[])).await;
    let registered = Instant::now();
    setup.register(&served).await;
    assert_eq!(setup.count(), Some(7));
    let driver = setup.handler.drivers().get(DRIVER).unwrap();
    assert_eq!(driver.allocatable_update_period, Some(PERIOD));
    assert_eq!(driver.allocatable_refreshed_at, None);

    tokio::time::sleep_until(registered + PERIOD - Duration::from_millis(1)).await;
    assert_eq!(served.driver.calls(), 1, "no refresh before the period");

    served.driver.wait_for_calls(2).await;
    assert_eq!(
        registered.elapsed().as_secs(),
        PERIOD.as_secs(),
        "the first refresh is one period in"
    );
    setup.refreshed_after(None).await;
    assert_eq!(
        setup.sink_calls(),
        ["install csi.example.com 7"],
        "an unchanged count sends nothing"
    );

    served.driver.wait_for_calls(3).await;
    assert_eq!(registered.elapsed().as_secs(), 2 * PERIOD.as_secs());
    wait_until("the new count is published", || setup.count() == Some(9)).await;
    assert_eq!(setup.max_volumes(), Some(9));
    let third = setup.refreshed_at();

    served.driver.wait_for_calls(4).await;
    setup.refreshed_after(third).await;
    assert_eq!(
        setup.sink_calls(),
        ["install csi.example.com 7", "update csi.example.com 9"],
        "one update per change"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_refresh_keeps_the_last_count_until_one_succeeds() {
    let setup = refreshed_every_period();
    let failing = Reply::Fail(Status::unavailable("driver restarting"));
    let served =
        setup.serve(vec![info("n1", 7, &[]), failing.clone(), failing], info("n1", 5, &[])).await;
    setup.register(&served).await;

    served.driver.wait_for_calls(3).await;
    assert_eq!((setup.count(), setup.max_volumes()), (Some(7), Some(7)));
    assert_eq!(setup.refreshed_at(), None);

    served.driver.wait_for_calls(4).await;
    wait_until("the refresh after the failures publishes", || setup.count() == Some(5)).await;
    assert_eq!(setup.sink_calls(), ["install csi.example.com 7", "update csi.example.com 5"]);
}

#[tokio::test(start_paused = true)]
async fn a_deregistered_driver_is_not_refreshed() {
    let setup = refreshed_every_period();
    let served = setup.serve(Vec::new(), info("n1", 7, &[])).await;
    setup.register(&served).await;
    setup
        .handler
        .deregister(&PluginDetails::new(
            DRIVER,
            advertised(served.endpoint()),
            Vec::<String>::new(),
        ))
        .await;

    tokio::time::sleep(PERIOD * 5).await;
    assert_eq!(served.driver.calls(), 1, "only the registration's NodeGetInfo");
}

#[tokio::test(start_paused = true)]
async fn the_clusters_period_starts_raises_and_stops_the_refresh() {
    let setup = setup(CsiConfig::default());
    let served = setup.serve(Vec::new(), info("n1", 7, &[])).await;
    setup.register(&served).await;
    tokio::time::sleep(PERIOD * 3).await;
    assert_eq!(served.driver.calls(), 1, "no period, no refresh");

    // The API refuses less than 10 s; kpm raises it.
    let periods = setup.handler.allocatable_update_periods();
    let set_at = Instant::now();
    periods.set(DRIVER, Some(Duration::from_secs(3)));
    assert_eq!(
        setup.handler.drivers().get(DRIVER).unwrap().allocatable_update_period,
        Some(PERIOD)
    );
    served.driver.wait_for_calls(2).await;
    assert_eq!(set_at.elapsed().as_secs(), PERIOD.as_secs());

    periods.set(DRIVER, None);
    assert_eq!(setup.handler.drivers().get(DRIVER).unwrap().allocatable_update_period, None);
    tokio::time::sleep(PERIOD * 3).await;
    assert_eq!(served.driver.calls(), 2, "no refresh once the period is gone");
}

#[tokio::test(start_paused = true)]
async fn the_nodes_own_period_wins_over_the_clusters() {
    let setup = refreshed_every_period();
    let served = setup.serve(Vec::new(), info("n1", 7, &[])).await;
    setup.register(&served).await;
    let registered = Instant::now();
    setup.handler.allocatable_update_periods().set(DRIVER, Some(PERIOD * 6));

    served.driver.wait_for_calls(2).await;
    assert_eq!(registered.elapsed().as_secs(), PERIOD.as_secs());
}
