//! The manager's state machine without sockets, on paused time: endpoints
//! are installed with a channel on a socket pair that is never used, and stream events
//! are fed in directly, as the `ListAndWatch` task would.

use std::time::{Duration, SystemTime};

use kpm_api::config::DurationOutOfRange;
use kpm_api::constants::MAX_CONFIG_DURATION;
use kpm_api::deviceplugin::v1beta1::{
    AllocateRequest, Device, ListAndWatchResponse, NumaNode, TopologyInfo,
};
use tokio::time::sleep;

use super::*;
use crate::config::tests::longest;

const GPU: &str = "vendor.com/gpu";
const GRACE: Duration = Duration::from_secs(300);

/// A manager on `config`, paying from the process-wide fd budget.
fn manager_with(config: DeviceConfig) -> Arc<DeviceManager> {
    DeviceManager::try_new(config, kpm_transport::fd::budget().clone()).unwrap()
}

fn manager() -> Arc<DeviceManager> {
    manager_with(DeviceConfig::default().grace_period(GRACE))
}

/// A channel on one end of a socket pair, which these tests never call.
async fn channel() -> UdsChannel {
    let (ours, _theirs) = tokio::net::UnixStream::pair().unwrap();
    UdsChannel::handshake(Path::new("pair"), ours).await.unwrap()
}

async fn install(manager: &DeviceManager, socket: &str) -> u64 {
    manager
        .install(GPU, Path::new(socket), None, DevicePluginOptions::default(), channel().await)
        .unwrap()
        .expect("a new endpoint")
}

fn devices(list: &[(&str, &str, &[i64])]) -> ListAndWatchResponse {
    ListAndWatchResponse {
        devices: list
            .iter()
            .map(|(id, health, numa)| Device {
                id: (*id).into(),
                health: (*health).into(),
                topology: (!numa.is_empty()).then(|| TopologyInfo {
                    nodes: numa.iter().map(|&id| NumaNode { id }).collect(),
                }),
            })
            .collect(),
    }
}

fn counts(manager: &DeviceManager) -> Option<(usize, usize)> {
    manager.resource(GPU).map(|status| (status.healthy, status.unhealthy))
}

#[tokio::test(start_paused = true)]
async fn devices_go_unhealthy_at_once_and_the_resource_goes_after_the_grace_period() {
    let manager = manager();
    let id = install(&manager, "/dp/a.sock").await;
    assert!(manager.update_devices(
        GPU,
        id,
        devices(&[("d1", "Healthy", &[]), ("d2", "Healthy", &[])])
    ));
    assert_eq!(counts(&manager), Some((2, 0)));
    let before = SystemTime::now();

    manager.endpoint_gone(GPU, id, "stream ended");

    let status = manager.resource(GPU).unwrap();
    assert_eq!((status.healthy, status.unhealthy), (0, 2));
    assert!(status.devices.iter().all(|device| device.health == "Unhealthy"));
    assert_eq!(status.endpoint, "");
    let removal_at = status.removal_at.expect("removal is scheduled");
    assert!(removal_at >= before + GRACE, "{removal_at:?}");
    assert!(matches!(
        manager.allocate(GPU, AllocateRequest::default()).await,
        Err(DeviceError::NoEndpoint { .. })
    ));

    sleep(Duration::from_secs(299)).await;
    assert_eq!(counts(&manager), Some((0, 2)), "still there just before the grace period ends");
    sleep(Duration::from_secs(2)).await;
    assert_eq!(manager.resource(GPU), None);
    assert!(matches!(
        manager.allocate(GPU, AllocateRequest::default()).await,
        Err(DeviceError::UnknownResource { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_registration_within_the_grace_period_cancels_the_removal() {
    let manager = manager();
    let old = install(&manager, "/dp/a.sock").await;
    manager.update_devices(GPU, old, devices(&[("d1", "Healthy", &[])]));
    manager.endpoint_gone(GPU, old, "stream ended");

    sleep(GRACE / 2).await;
    let new = install(&manager, "/dp/b.sock").await;
    let status = manager.resource(GPU).unwrap();
    assert_eq!(status.removal_at, None);
    assert_eq!(status.endpoint, "/dp/b.sock");
    // The old devices stay until the new endpoint reports its own.
    assert_eq!(counts(&manager), Some((0, 1)));
    assert!(manager.update_devices(GPU, new, devices(&[("d1", "Healthy", &[])])));
    assert_eq!(counts(&manager), Some((1, 0)));

    sleep(GRACE).await;
    assert_eq!(counts(&manager), Some((1, 0)), "the cancelled timer did not fire");
}

#[tokio::test(start_paused = true)]
async fn an_earlier_grace_timer_never_removes_a_resource_that_went_away_again_later() {
    let manager = manager();
    let first = install(&manager, "/dp/a.sock").await;
    manager.endpoint_gone(GPU, first, "stream ended");
    sleep(Duration::from_secs(290)).await;
    let second = install(&manager, "/dp/a.sock").await;
    sleep(Duration::from_secs(5)).await;
    manager.endpoint_gone(GPU, second, "stream ended");

    // The first grace period would have ended here.
    sleep(Duration::from_secs(10)).await;
    assert!(manager.resource(GPU).is_some());
    sleep(GRACE).await;
    assert!(manager.resource(GPU).is_none());
}

#[tokio::test(start_paused = true)]
async fn events_of_a_replaced_endpoint_do_not_touch_its_successor() {
    let manager = manager();
    let old = install(&manager, "/dp/a.sock").await;
    let new = install(&manager, "/dp/b.sock").await;

    assert!(!manager.update_devices(GPU, old, devices(&[("old", "Healthy", &[])])));
    manager.endpoint_gone(GPU, old, "stream ended");
    assert!(!manager.disconnect(GPU, Path::new("/dp/a.sock")));

    let status = manager.resource(GPU).unwrap();
    assert_eq!(status.endpoint, "/dp/b.sock");
    assert_eq!(status.removal_at, None);
    assert!(manager.update_devices(GPU, new, devices(&[("new", "Healthy", &[])])));
    sleep(GRACE * 2).await;
    assert_eq!(counts(&manager), Some((1, 0)));
}

#[tokio::test(start_paused = true)]
async fn updates_replace_the_device_set_and_sort_devices_and_numa_nodes() {
    let manager = manager();
    let id = install(&manager, "/dp/a.sock").await;
    manager.update_devices(
        GPU,
        id,
        devices(&[
            ("d3", "Unhealthy", &[1]),
            ("d1", "Healthy", &[1, 0, 1]),
            ("d2", "Unknown", &[]),
        ]),
    );
    let status = manager.resource(GPU).unwrap();
    assert_eq!((status.healthy, status.unhealthy), (1, 2), "any health but Healthy is unhealthy");
    let summary: Vec<_> = status
        .devices
        .iter()
        .map(|d| (d.id.as_str(), d.health.as_str(), d.numa_nodes.clone()))
        .collect();
    assert_eq!(
        summary,
        [("d1", "Healthy", vec![0, 1]), ("d2", "Unknown", vec![]), ("d3", "Unhealthy", vec![1])]
    );

    manager.update_devices(GPU, id, devices(&[("d9", "Healthy", &[])]));
    let ids: Vec<_> = manager.resource(GPU).unwrap().devices.into_iter().map(|d| d.id).collect();
    assert_eq!(ids, ["d9"]);
}

#[tokio::test(start_paused = true)]
async fn deregistering_the_current_endpoint_starts_the_grace_period_and_a_stale_one_is_a_noop() {
    let manager = manager();
    let id = install(&manager, "/dp/a.sock").await;
    manager.update_devices(GPU, id, devices(&[("d1", "Healthy", &[]), ("d2", "Healthy", &[])]));

    assert!(!manager.disconnect(GPU, Path::new("/dp/other.sock")));
    assert!(!manager.disconnect("vendor.com/fpga", Path::new("/dp/a.sock")));
    let status = manager.resource(GPU).unwrap();
    assert_eq!((status.healthy, status.removal_at), (2, None));

    assert!(manager.disconnect(GPU, Path::new("/dp/a.sock")));
    let status = manager.resource(GPU).unwrap();
    assert_eq!((status.healthy, status.unhealthy), (0, 2));
    assert!(status.removal_at.is_some());
    // A late update of the deregistered endpoint is ignored.
    assert!(!manager.update_devices(GPU, id, devices(&[("d1", "Healthy", &[])])));
    sleep(GRACE + Duration::from_secs(1)).await;
    assert!(manager.resources().is_empty());
}

#[tokio::test(start_paused = true)]
async fn shutdown_refuses_new_endpoints_and_runs_no_grace_timers() {
    let manager = manager();
    let id = install(&manager, "/dp/a.sock").await;
    manager.update_devices(GPU, id, devices(&[("d1", "Healthy", &[])]));
    manager.shutdown().await;
    manager.shutdown().await;

    let status = manager.resource(GPU).unwrap();
    assert_eq!((status.endpoint.as_str(), status.healthy, status.unhealthy), ("", 0, 1));
    assert_eq!(status.removal_at, None);
    let err = manager
        .install(
            GPU,
            Path::new("/dp/b.sock"),
            None,
            DevicePluginOptions::default(),
            channel().await,
        )
        .unwrap_err();
    assert!(matches!(err, DeviceError::ShutDown { .. }), "{err}");
    sleep(GRACE * 2).await;
    assert!(manager.resource(GPU).is_some());
}

#[tokio::test(start_paused = true)]
async fn every_change_is_signalled() {
    let manager = manager();
    let mut changes = manager.changes();
    let id = install(&manager, "/dp/a.sock").await;
    assert!(changes.has_changed().unwrap());
    changes.mark_unchanged();
    manager.update_devices(GPU, id, devices(&[("d1", "Healthy", &[])]));
    assert!(changes.has_changed().unwrap());
    changes.mark_unchanged();
    manager.endpoint_gone(GPU, id, "stream ended");
    assert!(changes.has_changed().unwrap());
    changes.mark_unchanged();
    tokio::time::timeout(GRACE * 2, changes.changed()).await.unwrap().unwrap();
    assert!(manager.resources().is_empty(), "the removal was signalled");
}

#[test]
fn an_invalid_config_makes_no_manager() {
    let config = DeviceConfig::default().grace_period(Duration::MAX);
    let refused = DeviceManager::try_new(config, kpm_transport::fd::budget().clone()).unwrap_err();
    assert!(
        matches!(
            refused,
            DeviceConfigError::DurationOutOfRange(DurationOutOfRange { field: "grace_period", .. })
        ),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("grace_period"), "{refused}");
}

#[tokio::test(start_paused = true)]
async fn the_longest_grace_period_removes_the_resource_after_it() {
    let manager = manager_with(longest());
    for round in 0..3 {
        let id = install(&manager, &format!("/dp/{round}.sock")).await;
        manager.endpoint_gone(GPU, id, "stream ended");
        let removal_at = manager.resource(GPU).unwrap().removal_at;
        assert!(removal_at.is_some(), "the removal time is representable");
        sleep(MAX_CONFIG_DURATION.checked_sub(Duration::from_secs(1)).unwrap()).await;
        assert!(manager.resource(GPU).is_some(), "still there just before the grace period ends");
        sleep(Duration::from_secs(2)).await;
        assert_eq!(manager.resource(GPU), None);
    }
}
