//! A fake DRA driver: the DRA plugin service in v1, v1beta1 or both, and
//! optionally a resource health service, served by tonic on a Unix socket.
//!
//! Each served driver runs on its own thread with its own tokio runtime;
//! stopping it drops that runtime with every connection task, so the
//! client sees the connections close the way it does when a driver process
//! exits.

// A failed setup fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use kpm_api::dra::{v1, v1beta1};
use kpm_api::dra_health::{v1 as health_v1, v1alpha1 as health_v1alpha1};
use kpm_test_support::OwnRuntime;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Request, Response, Status};

/// Which DRA plugin services the fake serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serves {
    V1,
    V1beta1,
    Both,
}

/// Which health service the fake serves, and how its stream behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// `v1.DRAResourceHealth`: one update, then the stream stays open.
    V1,
    /// `v1alpha1.DRAResourceHealth`: one update, then the stream stays open.
    V1alpha1,
    /// `v1.DRAResourceHealth`: one update, then the stream ends.
    V1ThenEnd,
    /// `v1.DRAResourceHealth`: the updates sent with
    /// [`FakeDriver::send_health`], on the first stream.
    V1Sent,
}

/// One call the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// `v1` or `v1beta1`.
    pub version: &'static str,
    /// `NodePrepareResources` or `NodeUnprepareResources`.
    pub method: &'static str,
    /// The claim uids.
    pub claims: Vec<String>,
    /// The `grpc-timeout` the client sent.
    pub grpc_timeout: Option<String>,
}

/// The driver's behaviour and what it has seen.
pub struct FakeDriver {
    serves: Serves,
    health: Option<Health>,
    blocking: bool,
    calls: Mutex<Vec<Call>>,
    call_count: watch::Sender<usize>,
    watches: watch::Sender<usize>,
    /// The updates [`FakeDriver::send_health`] sends, for [`Health::V1Sent`].
    sent: mpsc::UnboundedSender<health_v1::NodeWatchResourcesResponse>,
    to_send: Mutex<Option<mpsc::UnboundedReceiver<health_v1::NodeWatchResourcesResponse>>>,
}

impl FakeDriver {
    pub fn new(serves: Serves) -> Arc<Self> {
        Self::build(serves, None, false)
    }

    /// A driver that also serves a health service.
    pub fn with_health(serves: Serves, health: Health) -> Arc<Self> {
        Self::build(serves, Some(health), false)
    }

    /// A driver whose calls never answer.
    pub fn blocking(serves: Serves) -> Arc<Self> {
        Self::build(serves, None, true)
    }

    fn build(serves: Serves, health: Option<Health>, blocking: bool) -> Arc<Self> {
        let (sent, to_send) = mpsc::unbounded_channel();
        Arc::new(Self {
            serves,
            health,
            blocking,
            calls: Mutex::new(Vec::new()),
            call_count: watch::Sender::new(0),
            watches: watch::Sender::new(0),
            sent,
            to_send: Mutex::new(Some(to_send)),
        })
    }

    /// Sends one update on the [`Health::V1Sent`] stream (kept until the
    /// stream is open): `(device, health, health_check_timeout_seconds,
    /// message)` of devices of `pool1`.
    pub fn send_health(&self, devices: &[(&str, health_v1::HealthStatus, i64, &str)]) {
        let devices = devices
            .iter()
            .map(|&(device, health, timeout, message)| health_v1::DeviceHealth {
                device: Some(health_v1::DeviceIdentifier {
                    pool_name: "pool1".into(),
                    device_name: device.into(),
                }),
                health: health.into(),
                last_updated_time: 1_700_000_000,
                health_check_timeout_seconds: timeout,
                message: message.into(),
            })
            .collect();
        self.sent.send(health_v1::NodeWatchResourcesResponse { devices }).unwrap();
    }

    /// The calls received so far.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }

    /// The `NodeWatchResources` calls that arrived so far.
    pub fn watch_count(&self) -> usize {
        *self.watches.borrow()
    }

    /// Waits until at least `n` `NodeWatchResources` calls have arrived.
    pub async fn wait_for_watches(&self, n: usize) {
        let mut watches = self.watches.subscribe();
        let what = format!("{n} NodeWatchResources calls arrive");
        kpm_test_support::within(what, watches.wait_for(|watches| *watches >= n)).await.unwrap();
    }

    async fn record<T>(
        &self,
        version: &'static str,
        method: &'static str,
        request: &Request<T>,
        claims: Vec<String>,
    ) {
        let grpc_timeout = request
            .metadata()
            .get("grpc-timeout")
            .map(|value| value.to_str().unwrap_or_default().to_owned());
        self.calls.lock().push(Call { version, method, claims, grpc_timeout });
        self.call_count.send_modify(|count| *count += 1);
        if self.blocking {
            std::future::pending::<()>().await;
        }
    }

    fn device(uid: &str) -> (String, String, Vec<String>) {
        ("pool1".into(), format!("dev-{uid}"), vec![format!("vendor.example.com/gpu={uid}")])
    }
}

struct V1Plugin(Arc<FakeDriver>);
struct V1beta1Plugin(Arc<FakeDriver>);
struct V1Health(Arc<FakeDriver>);
struct V1alpha1Health(Arc<FakeDriver>);

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for V1Plugin {
    async fn node_prepare_resources(
        &self,
        request: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let uids: Vec<String> = request.get_ref().claims.iter().map(|c| c.uid.clone()).collect();
        self.0.record("v1", "NodePrepareResources", &request, uids.clone()).await;
        let mut response = v1::NodePrepareResourcesResponse::default();
        for uid in uids {
            let (pool_name, device_name, cdi_device_ids) = FakeDriver::device(&uid);
            let device = v1::Device {
                request_names: vec!["gpu".into()],
                pool_name,
                device_name,
                cdi_device_ids,
                share_id: Some("share-1".into()),
            };
            response.claims.insert(
                uid,
                v1::NodePrepareResourceResponse { devices: vec![device], error: String::new() },
            );
        }
        Ok(Response::new(response))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let uids: Vec<String> = request.get_ref().claims.iter().map(|c| c.uid.clone()).collect();
        self.0.record("v1", "NodeUnprepareResources", &request, uids.clone()).await;
        let claims = uids
            .into_iter()
            .map(|uid| (uid, v1::NodeUnprepareResourceResponse { error: String::new() }))
            .collect();
        Ok(Response::new(v1::NodeUnprepareResourcesResponse { claims }))
    }
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for V1beta1Plugin {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let uids: Vec<String> = request.get_ref().claims.iter().map(|c| c.uid.clone()).collect();
        self.0.record("v1beta1", "NodePrepareResources", &request, uids.clone()).await;
        let mut response = v1beta1::NodePrepareResourcesResponse::default();
        for uid in uids {
            let (pool_name, device_name, cdi_device_ids) = FakeDriver::device(&uid);
            let device = v1beta1::Device {
                request_names: vec!["gpu".into()],
                pool_name,
                device_name,
                cdi_device_ids,
            };
            response.claims.insert(
                uid,
                v1beta1::NodePrepareResourceResponse {
                    devices: vec![device],
                    error: String::new(),
                },
            );
        }
        Ok(Response::new(response))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let uids: Vec<String> = request.get_ref().claims.iter().map(|c| c.uid.clone()).collect();
        self.0.record("v1beta1", "NodeUnprepareResources", &request, uids.clone()).await;
        let claims = uids
            .into_iter()
            .map(|uid| (uid, v1beta1::NodeUnprepareResourceResponse { error: String::new() }))
            .collect();
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse { claims }))
    }
}

type HealthStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// One update, then either the end of the stream or nothing more.
fn one_update<T: Send + 'static>(update: T, end: bool) -> HealthStream<T> {
    let first = tokio_stream::once(Ok(update));
    if end { Box::pin(first) } else { Box::pin(first.chain(tokio_stream::pending())) }
}

#[tonic::async_trait]
impl health_v1::dra_resource_health_server::DraResourceHealth for V1Health {
    type NodeWatchResourcesStream = HealthStream<health_v1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<health_v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        self.0.watches.send_modify(|watches| *watches += 1);
        if self.0.health == Some(Health::V1Sent) {
            let Some(sent) = self.0.to_send.lock().take() else {
                return Err(Status::unavailable("the sent updates went to the first stream"));
            };
            return Ok(Response::new(Box::pin(UnboundedReceiverStream::new(sent).map(Ok))));
        }
        let update = health_v1::NodeWatchResourcesResponse {
            devices: vec![health_v1::DeviceHealth {
                device: Some(health_v1::DeviceIdentifier {
                    pool_name: "pool1".into(),
                    device_name: "dev1".into(),
                }),
                health: health_v1::HealthStatus::Healthy.into(),
                last_updated_time: 1_700_000_000,
                health_check_timeout_seconds: 30,
                message: "all good".into(),
            }],
        };
        Ok(Response::new(one_update(update, self.0.health == Some(Health::V1ThenEnd))))
    }
}

#[tonic::async_trait]
impl health_v1alpha1::dra_resource_health_server::DraResourceHealth for V1alpha1Health {
    type NodeWatchResourcesStream = HealthStream<health_v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<health_v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        self.0.watches.send_modify(|watches| *watches += 1);
        let update = health_v1alpha1::NodeWatchResourcesResponse {
            devices: vec![health_v1alpha1::DeviceHealth {
                device: Some(health_v1alpha1::DeviceIdentifier {
                    pool_name: "pool1".into(),
                    device_name: "dev1".into(),
                }),
                health: health_v1alpha1::HealthStatus::Unhealthy.into(),
                last_updated_time: 1_700_000_000,
                health_check_timeout_seconds: 30,
                message: "fan failed".into(),
            }],
        };
        Ok(Response::new(one_update(update, false)))
    }
}

/// A served fake driver; stopped (its connections closed) when dropped.
pub struct Served {
    pub socket: PathBuf,
    pub driver: Arc<FakeDriver>,
    accepted: Arc<watch::Sender<usize>>,
    runtime: OwnRuntime,
}

impl Served {
    /// The socket path as a string, the way a plugin reports its endpoint.
    pub fn endpoint(&self) -> String {
        self.socket.display().to_string()
    }

    /// The number of connections the driver has accepted.
    pub fn accepted(&self) -> usize {
        *self.accepted.borrow()
    }

    /// Stops the driver like an exiting process: every connection is closed.
    pub fn stop(self) {
        self.runtime.stop();
    }
}

/// Serves `driver` on `socket` (a stale socket file is replaced) on its own
/// runtime; returns once the socket listens.
pub fn serve(socket: &Path, driver: &Arc<FakeDriver>) -> Served {
    let accepted = Arc::new(watch::Sender::new(0_usize));
    let runtime = {
        let socket = socket.to_path_buf();
        let driver = Arc::clone(driver);
        let accepted = Arc::clone(&accepted);
        OwnRuntime::start(move || async move {
            let incoming = kpm_transport::bind(&socket).await.unwrap().map(move |stream| {
                accepted.send_modify(|accepted| *accepted += 1);
                stream
            });
            let mut router =
                tonic::transport::Server::builder().add_routes(tonic::service::Routes::default());
            if matches!(driver.serves, Serves::V1 | Serves::Both) {
                router = router.add_service(v1::dra_plugin_server::DraPluginServer::new(V1Plugin(
                    Arc::clone(&driver),
                )));
            }
            if matches!(driver.serves, Serves::V1beta1 | Serves::Both) {
                router = router.add_service(v1beta1::dra_plugin_server::DraPluginServer::new(
                    V1beta1Plugin(Arc::clone(&driver)),
                ));
            }
            match driver.health {
                Some(Health::V1 | Health::V1ThenEnd | Health::V1Sent) => {
                    router = router.add_service(
                        health_v1::dra_resource_health_server::DraResourceHealthServer::new(
                            V1Health(Arc::clone(&driver)),
                        ),
                    );
                }
                Some(Health::V1alpha1) => {
                    router = router.add_service(
                        health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                            V1alpha1Health(Arc::clone(&driver)),
                        ),
                    );
                }
                None => {}
            }
            tokio::spawn(router.serve_with_incoming(incoming));
        })
    };
    Served { socket: socket.to_path_buf(), driver: Arc::clone(driver), accepted, runtime }
}

/// A claim with this uid.
pub fn claim(uid: &str) -> v1::Claim {
    v1::Claim { namespace: "default".into(), uid: uid.into(), name: format!("claim-{uid}") }
}

/// The strings as owned strings.
pub fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| (*item).to_owned()).collect()
}
