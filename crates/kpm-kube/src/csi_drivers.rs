//! The cluster's CSIDriver objects, followed for their
//! `spec.nodeAllocatableUpdatePeriodSeconds` (KEP-4876, GA in 1.36): each
//! driver's period goes to the CSI handler, which refreshes the allocatable
//! count of the drivers registered on this node (the kubelet's
//! `csiNodeUpdater`, fed by its CSIDriver informer).
//!
//! kube-runtime's watcher lists, watches, lists again after a lost watch
//! and backs off on errors; a driver missing from a new list, or deleted,
//! loses its period.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::storage::v1::CSIDriver;
use kpm_csi::AllocatableUpdatePeriods;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio_stream::StreamExt as _;
use tracing::{debug, info, warn};

use crate::KubeError;
use crate::api::NodeApi;
use crate::status::ObjectKind;

/// Feeds every CSIDriver's period to `periods` until the future is dropped.
pub(crate) async fn follow(api: Arc<NodeApi>, periods: AllocatableUpdatePeriods) {
    let drivers: Api<CSIDriver> = Api::all(api.client.clone());
    let mut events =
        std::pin::pin!(watcher::watcher(drivers, watcher::Config::default()).default_backoff());
    let mut known: HashMap<String, Duration> = HashMap::new();
    let mut listed: HashSet<String> = HashSet::new();
    let mut failing = false;
    while let Some(event) = events.next().await {
        let event = match api
            .record(ObjectKind::CsiDriver, event.map_err(KubeError::WatchCsiDrivers))
        {
            Ok(event) => event,
            Err(err) => {
                if !failing {
                    warn!(node = api.node, error = %err, "following CSIDrivers failed; retrying");
                }
                failing = true;
                continue;
            }
        };
        if std::mem::take(&mut failing) {
            info!(node = api.node, "following CSIDrivers again");
        }
        match event {
            Event::Init => listed.clear(),
            Event::InitApply(driver) => {
                if let Some(name) = apply(&mut known, &periods, &driver) {
                    listed.insert(name);
                }
            }
            Event::InitDone => {
                let gone: Vec<String> =
                    known.keys().filter(|name| !listed.contains(*name)).cloned().collect();
                for name in gone {
                    forget(&mut known, &periods, &name);
                }
            }
            Event::Apply(driver) => {
                apply(&mut known, &periods, &driver);
            }
            Event::Delete(driver) => {
                if let Some(name) = driver.metadata.name {
                    forget(&mut known, &periods, &name);
                }
            }
        }
    }
}

/// Records `driver`'s period, telling `periods` if it changed; returns its name.
fn apply(
    known: &mut HashMap<String, Duration>,
    periods: &AllocatableUpdatePeriods,
    driver: &CSIDriver,
) -> Option<String> {
    let name = driver.metadata.name.clone()?;
    match period(driver) {
        Some(period) => {
            if known.insert(name.clone(), period) != Some(period) {
                debug!(plugin = name, ?period, "CSIDriver sets an allocatable update period");
                periods.set(&name, Some(period));
            }
        }
        None => forget(known, periods, &name),
    }
    Some(name)
}

fn forget(known: &mut HashMap<String, Duration>, periods: &AllocatableUpdatePeriods, name: &str) {
    if known.remove(name).is_some() {
        debug!(plugin = name, "CSIDriver no longer sets an allocatable update period");
        periods.set(name, None);
    }
}

/// `nodeAllocatableUpdatePeriodSeconds`, if set and positive (the API
/// refuses less than 10; the handler raises what it gets to that).
fn period(driver: &CSIDriver) -> Option<Duration> {
    let seconds = driver.spec.node_allocatable_update_period_seconds?;
    u64::try_from(seconds).ok().filter(|seconds| *seconds > 0).map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::storage::v1::CSIDriverSpec;

    use super::*;

    fn driver(seconds: Option<i64>) -> CSIDriver {
        CSIDriver {
            spec: CSIDriverSpec {
                node_allocatable_update_period_seconds: seconds,
                ..CSIDriverSpec::default()
            },
            ..CSIDriver::default()
        }
    }

    #[test]
    fn only_a_positive_number_of_seconds_is_a_period() {
        assert_eq!(period(&driver(Some(60))), Some(Duration::from_secs(60)));
        assert_eq!(period(&driver(Some(0))), None);
        assert_eq!(period(&driver(Some(-5))), None);
        assert_eq!(period(&driver(None)), None);
    }
}
