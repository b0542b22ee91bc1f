//! The stub DRA driver's `DRAResourceHealth` service, `v1alpha1` (the one
//! kubelets 1.31 to 1.36 open) and `v1`: the health of its devices on a
//! stream, whole every time, sent again on every change and renewed well
//! within the timeout it gives, unless told to misbehave.

use std::pin::Pin;
use std::time::Duration;

use kpm_api::dra_health::{v1 as health_v1, v1alpha1 as health_v1alpha1};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::{Misbehaviour, Misbehaviours};

/// How long the kubelet is told to trust a report (`health_check_timeout_seconds`):
/// its default, 30 s.
const TIMEOUT: Duration = Duration::from_secs(30);
/// How often the health is sent again without a change: a third of the
/// timeout, so that a late message still arrives in time.
const RENEWAL: Duration = Duration::from_secs(10);

/// A device's health as the stub reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reported {
    pool: String,
    device: String,
    healthy: bool,
}

/// Changes the health a stub DRA driver reports for its devices; made by
/// [`StubDraDriver::health`](super::StubDraDriver::health).
#[derive(Debug, Clone)]
pub struct DraDeviceHealth {
    tx: watch::Sender<Vec<Reported>>,
}

impl DraDeviceHealth {
    pub(super) fn new() -> Self {
        Self { tx: watch::Sender::new(Vec::new()) }
    }

    /// Reports `devices` of `pool`, each healthy, unless it reports some
    /// already.
    pub(super) fn report_healthy(&self, pool: &str, devices: &[&str]) {
        self.tx.send_if_modified(|reported| {
            if !reported.is_empty() {
                return false;
            }
            *reported = devices
                .iter()
                .map(|device| Reported {
                    pool: pool.to_owned(),
                    device: (*device).to_owned(),
                    healthy: true,
                })
                .collect();
            true
        });
    }

    /// Marks the first healthy device unhealthy and returns it as
    /// `pool/device`; `None` when none is healthy.
    pub fn fail_next(&self) -> Option<String> {
        let mut failed = None;
        self.tx.send_if_modified(|reported| {
            let device = reported.iter_mut().find(|device| device.healthy);
            failed = device.map(|device| {
                device.healthy = false;
                format!("{}/{}", device.pool, device.device)
            });
            failed.is_some()
        });
        failed
    }

    /// `routes` with both services added, on the health of these devices;
    /// `omitted` is a device left out of every message.
    pub(super) fn add_to(
        &self,
        routes: Routes,
        misbehaviours: &Misbehaviours,
        omitted: Option<&'static str>,
    ) -> Routes {
        let service =
            Health { devices: self.tx.clone(), misbehaviours: misbehaviours.clone(), omitted };
        routes
            .add_service(health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                service.clone(),
            ))
            .add_service(health_v1::dra_resource_health_server::DraResourceHealthServer::new(
                service,
            ))
    }
}

/// The service behind both versions.
#[derive(Debug, Clone)]
struct Health {
    /// Kept, so that the devices' list outlives every handle.
    devices: watch::Sender<Vec<Reported>>,
    misbehaviours: Misbehaviours,
    omitted: Option<&'static str>,
}

impl Health {
    /// The messages of one stream, as lists of devices: the health now,
    /// then again on each change and each renewal, until the watcher hangs up.
    fn watch(&self) -> ReceiverStream<Vec<Reported>> {
        let (tx, rx) = mpsc::channel(1);
        let mut devices = self.devices.subscribe();
        let misbehaviours = self.misbehaviours.clone();
        let omitted = self.omitted;
        let shown = move |mut list: Vec<Reported>| {
            list.retain(|device| Some(device.device.as_str()) != omitted);
            list
        };
        tokio::spawn(async move {
            // What a driver that sends no change keeps sending.
            let first = devices.borrow_and_update().clone();
            let mut sent = first.clone();
            if tx.send(shown(first.clone())).await.is_err()
                || misbehaviours.has(Misbehaviour::HealthStreamEnds)
            {
                return;
            }
            let renews = !misbehaviours.has(Misbehaviour::HealthNotRenewed);
            loop {
                // `None`: time to renew.
                let changed = if renews {
                    tokio::time::timeout(RENEWAL, devices.changed()).await.ok()
                } else {
                    Some(devices.changed().await)
                };
                if matches!(changed, Some(Err(_))) {
                    return;
                }
                let now = devices.borrow_and_update().clone();
                let message = if misbehaviours.has(Misbehaviour::HealthChangeNotSent) {
                    first.clone()
                } else if changed.is_some() && misbehaviours.has(Misbehaviour::HealthPartialUpdates)
                {
                    now.iter().filter(|device| !sent.contains(device)).cloned().collect()
                } else {
                    now.clone()
                };
                sent = now;
                if tx.send(shown(message)).await.is_err() {
                    return;
                }
            }
        });
        ReceiverStream::new(rx)
    }
}

/// Unix seconds now, as `last_updated_time` is.
fn unix_now() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |since| i64::try_from(since.as_secs()).unwrap_or(i64::MAX))
}

/// `DRAResourceHealth` of one API version, on [`Health::watch`].
macro_rules! watch_health {
    ($api:ident) => {
        #[tonic::async_trait]
        impl $api::dra_resource_health_server::DraResourceHealth for Health {
            type NodeWatchResourcesStream = Pin<
                Box<dyn Stream<Item = Result<$api::NodeWatchResourcesResponse, Status>> + Send>,
            >;

            async fn node_watch_resources(
                &self,
                _: Request<$api::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                let timeout = i64::try_from(TIMEOUT.as_secs()).unwrap_or(0);
                let messages = self.watch().map(move |devices| {
                    let devices = devices
                        .into_iter()
                        .map(|reported| $api::DeviceHealth {
                            device: Some($api::DeviceIdentifier {
                                pool_name: reported.pool,
                                device_name: reported.device,
                            }),
                            health: if reported.healthy {
                                $api::HealthStatus::Healthy
                            } else {
                                $api::HealthStatus::Unhealthy
                            } as i32,
                            last_updated_time: unix_now(),
                            health_check_timeout_seconds: timeout,
                            message: String::new(),
                        })
                        .collect();
                    Ok($api::NodeWatchResourcesResponse { devices })
                });
                Ok(Response::new(Box::pin(messages)))
            }
        }
    };
}

watch_health!(health_v1alpha1);
watch_health!(health_v1);
