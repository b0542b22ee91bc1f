//! Device health streaming (spec C.6): `NodeWatchResources` of the
//! `DRAResourceHealth` service (v1 or v1alpha1) on an instance's connection,
//! each message a full list of the driver's devices and their health.

use std::sync::Arc;
use std::time::Duration;

use kpm_api::dra_health::{v1, v1alpha1};
use tracing::{debug, info};

use crate::connection::Connection;
use crate::validate::HealthService;

/// Pause before a health stream that ended or failed is opened again.
pub(crate) const HEALTH_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// The longest health message kept; longer ones are cut to 1021 characters
/// and `...`, as the kubelet does.
const MAX_MESSAGE_CHARS: usize = 1024;

/// The health of one device, as the driver last streamed it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DeviceHealthStatus {
    /// The device's pool.
    pub pool: String,
    /// The device's name in its pool.
    pub device: String,
    /// `Healthy`, `Unhealthy` or `Unknown` (also for values this version of
    /// the API does not know).
    pub health: String,
    /// The driver's explanation, at most 1024 characters.
    pub message: String,
}

impl DeviceHealthStatus {
    fn new(pool: String, device: String, health: &'static str, message: String) -> Self {
        Self { pool, device, health: health.to_owned(), message: truncate(message) }
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

fn v1_devices(devices: Vec<v1::DeviceHealth>) -> Vec<DeviceHealthStatus> {
    let mut out: Vec<DeviceHealthStatus> = devices
        .into_iter()
        .map(|health| {
            let id = health.device.unwrap_or_default();
            let status = match v1::HealthStatus::try_from(health.health) {
                Ok(v1::HealthStatus::Healthy) => "Healthy",
                Ok(v1::HealthStatus::Unhealthy) => "Unhealthy",
                Ok(v1::HealthStatus::Unknown) | Err(_) => "Unknown",
            };
            DeviceHealthStatus::new(id.pool_name, id.device_name, status, health.message)
        })
        .collect();
    out.sort_by(|a, b| (&a.pool, &a.device).cmp(&(&b.pool, &b.device)));
    out
}

fn v1alpha1_devices(devices: Vec<v1alpha1::DeviceHealth>) -> Vec<DeviceHealthStatus> {
    // The same message in another package: convert field by field.
    v1_devices(
        devices
            .into_iter()
            .map(|health| v1::DeviceHealth {
                device: health.device.map(|id| v1::DeviceIdentifier {
                    pool_name: id.pool_name,
                    device_name: id.device_name,
                }),
                health: health.health,
                last_updated_time: health.last_updated_time,
                health_check_timeout_seconds: health.health_check_timeout_seconds,
                message: health.message,
            })
            .collect(),
    )
}

/// Whether a stream that failed with `status` should not be opened again:
/// the driver does not implement the service after all (the kubelet's
/// `healthStreamTerminated`). Any other failure is retried.
pub(crate) fn ended_for_good(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unimplemented
}

/// Streams the health of the driver's devices from `connection` into
/// `update` until the task is aborted, reopening the stream
/// [`HEALTH_RETRY_INTERVAL`] after it ends or fails, and stopping for good
/// on `Unimplemented`.
pub(crate) async fn watch(
    driver: String,
    endpoint: String,
    service: HealthService,
    connection: Arc<Connection>,
    update: impl Fn(Vec<DeviceHealthStatus>) + Send + Sync + 'static,
) {
    loop {
        let result = match (connection.channel(), service) {
            (Err(status), _) => Err(status),
            (Ok(channel), HealthService::V1) => stream_v1(channel, &update).await,
            (Ok(channel), HealthService::V1alpha1) => stream_v1alpha1(channel, &update).await,
        };
        match result {
            Ok(()) => debug!(driver, endpoint, %service, "health stream ended; reopening it"),
            Err(status) if ended_for_good(&status) => {
                info!(
                    driver,
                    endpoint,
                    %service,
                    error = status.message(),
                    "the DRA driver does not implement its health service; not streaming health"
                );
                return;
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
        tokio::time::sleep(HEALTH_RETRY_INTERVAL).await;
    }
}

async fn stream_v1(
    channel: kpm_transport::UdsChannel,
    update: &impl Fn(Vec<DeviceHealthStatus>),
) -> Result<(), tonic::Status> {
    let mut client = v1::dra_resource_health_client::DraResourceHealthClient::new(channel)
        .max_decoding_message_size(kpm_api::constants::MAX_PLUGIN_MESSAGE_BYTES);
    let mut stream =
        client.node_watch_resources(v1::NodeWatchResourcesRequest {}).await?.into_inner();
    while let Some(message) = stream.message().await? {
        update(v1_devices(message.devices));
    }
    Ok(())
}

async fn stream_v1alpha1(
    channel: kpm_transport::UdsChannel,
    update: &impl Fn(Vec<DeviceHealthStatus>),
) -> Result<(), tonic::Status> {
    let mut client = v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(channel)
        .max_decoding_message_size(kpm_api::constants::MAX_PLUGIN_MESSAGE_BYTES);
    let mut stream =
        client.node_watch_resources(v1alpha1::NodeWatchResourcesRequest {}).await?.into_inner();
    while let Some(message) = stream.message().await? {
        update(v1alpha1_devices(message.devices));
    }
    Ok(())
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

    #[test]
    fn device_health_is_named_sorted_and_truncated() {
        let devices = v1_devices(vec![
            health("pool2", "dev1", 2, "fan failed"),
            health("pool1", "dev2", 7, ""),
            health("pool1", "dev1", 1, &"x".repeat(2000)),
        ]);
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
    fn only_unimplemented_ends_a_health_stream_for_good() {
        // The decision of TestHealthStreamUnimplemented.
        assert!(!ended_for_good(&tonic::Status::unavailable("temporary")));
        assert!(!ended_for_good(&tonic::Status::internal("stream reset")));
        assert!(ended_for_good(&tonic::Status::unimplemented(
            "unknown service v1.DRAResourceHealth"
        )));
    }
}
