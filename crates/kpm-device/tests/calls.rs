//! The calls node agents make through the manager: `Allocate`,
//! `GetPreferredAllocation` and `PreStartContainer` reach the current
//! endpoint, honour the plugin's options and time out.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use kpm_cache::PluginDetails;
use kpm_cache::PluginEndpoint;
use kpm_cache::PluginHandler;
use kpm_device::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, DeviceConfig,
    DeviceError, DeviceManager, DevicePluginOptions, PreferredAllocationRequest,
};
use support::{Behaviour, DEADLINE, GPU, Served, healthy, serve, wait_for_counts};
use tempfile::TempDir;
use tonic::Status;

/// A device plugin as the plugin watcher finds it: served on its
/// registration socket, having advertised no endpoint.
fn on_socket(socket: impl Into<std::path::PathBuf>) -> PluginEndpoint {
    PluginEndpoint::RegistrationSocket(socket.into())
}

struct Setup {
    dir: TempDir,
    manager: Arc<DeviceManager>,
}

fn setup(config: DeviceConfig) -> Setup {
    Setup {
        dir: tempfile::tempdir().unwrap(),
        manager: DeviceManager::try_new(config, kpm_transport::fd::budget().clone()).unwrap(),
    }
}

fn fast() -> DeviceConfig {
    DeviceConfig::default().dial_timeout(DEADLINE).call_timeout(DEADLINE)
}

impl Setup {
    /// Serves a plugin with two healthy devices and registers it.
    async fn plugin(&self, file: &str, behaviour: Behaviour) -> Served {
        let served = serve(self.dir.path(), file, healthy(&["d1", "d2"]), behaviour).await;
        let handler: &dyn PluginHandler = &*self.manager;
        handler
            .register(&PluginDetails::new(
                GPU,
                on_socket(served.endpoint()),
                ["v1beta1".to_owned()],
            ))
            .await
            .unwrap();
        wait_for_counts(&self.manager, GPU, 2, 0).await;
        served
    }
}

fn with_options(pre_start_required: bool, get_preferred_allocation_available: bool) -> Behaviour {
    Behaviour {
        options: DevicePluginOptions { pre_start_required, get_preferred_allocation_available },
        ..Behaviour::default()
    }
}

fn allocate_request(ids: &[&str]) -> AllocateRequest {
    AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids.iter().map(|id| (*id).to_owned()).collect(),
        }],
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| (*item).to_owned()).collect()
}

#[tokio::test]
async fn allocate_reaches_the_plugin_and_returns_its_answer() {
    let setup = setup(fast());
    let plugin = setup.plugin("gpu.sock", Behaviour::default()).await;

    let response = setup.manager.allocate(GPU, allocate_request(&["d1", "d2"])).await.unwrap();

    assert_eq!(response.container_responses.len(), 1);
    assert_eq!(response.container_responses[0].envs["VENDOR_DEVICES"], "d1,d2");
    assert_eq!(*plugin.plugin.allocations.lock(), [allocate_request(&["d1", "d2"])]);
}

#[tokio::test]
async fn calls_go_to_the_endpoint_that_replaced_an_older_one() {
    let setup = setup(fast());
    let old = setup.plugin("old.sock", Behaviour::default()).await;
    let new = setup.plugin("new.sock", Behaviour::default()).await;

    setup.manager.allocate(GPU, allocate_request(&["d1"])).await.unwrap();

    assert_eq!(new.plugin.allocations.lock().len(), 1);
    assert!(old.plugin.allocations.lock().is_empty());
}

#[tokio::test]
async fn an_allocate_error_of_the_plugin_names_the_resource_and_socket() {
    let setup = setup(fast());
    let behaviour = Behaviour {
        allocate_error: Some(Status::resource_exhausted("d1 is taken")),
        ..Behaviour::default()
    };
    let plugin = setup.plugin("gpu.sock", behaviour).await;

    let err = setup.manager.allocate(GPU, allocate_request(&["d1"])).await.unwrap_err();

    assert!(matches!(err, DeviceError::Allocate { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "Allocate on device plugin {GPU} at {}: rpc error: code = ResourceExhausted \
             desc = d1 is taken",
            plugin.endpoint()
        )
    );
}

#[tokio::test]
async fn a_plugin_that_does_not_answer_allocate_in_time_gets_a_timeout() {
    let timeout = Duration::from_millis(200);
    let setup = setup(fast().call_timeout(timeout));
    let behaviour = Behaviour { hang_allocate: true, ..Behaviour::default() };
    let plugin = setup.plugin("gpu.sock", behaviour).await;

    let err = setup.manager.allocate(GPU, allocate_request(&["d1"])).await.unwrap_err();

    match &err {
        DeviceError::Timeout { call, timeout: waited, .. } => {
            assert_eq!((*call, *waited), ("Allocate", timeout));
        }
        other => panic!("unexpected error: {other}"),
    }
    assert_eq!(
        err.to_string(),
        format!(
            "Allocate on device plugin {GPU} at {}: no answer within 200ms (context deadline exceeded)",
            plugin.endpoint()
        )
    );
}

#[tokio::test]
async fn get_preferred_allocation_is_called_only_when_the_plugin_offers_it() {
    let setup = setup(fast());
    let request = PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_i_ds: strings(&["d1", "d2", "d3"]),
            must_include_device_i_ds: strings(&["d3"]),
            allocation_size: 2,
        }],
    };

    let without = setup.plugin("without.sock", with_options(false, false)).await;
    let err = setup.manager.get_preferred_allocation(GPU, request.clone()).await.unwrap_err();
    assert!(matches!(err, DeviceError::PreferredAllocationUnavailable { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "device plugin {GPU} at {} does not offer GetPreferredAllocation \
             (get_preferred_allocation_available is false)",
            without.endpoint()
        )
    );
    assert!(without.plugin.preferred.lock().is_empty());

    let with = setup.plugin("with.sock", with_options(false, true)).await;
    let response = setup.manager.get_preferred_allocation(GPU, request.clone()).await.unwrap();
    assert_eq!(response.container_responses[0].device_i_ds, strings(&["d3", "d1"]));
    assert_eq!(*with.plugin.preferred.lock(), [request]);
}

#[tokio::test]
async fn pre_start_container_is_called_only_when_the_plugin_requires_it() {
    let setup = setup(fast());
    let without = setup.plugin("without.sock", with_options(false, true)).await;
    setup.manager.pre_start_container(GPU, strings(&["d1"])).await.unwrap();
    assert!(without.plugin.pre_starts.lock().is_empty());

    let with = setup.plugin("with.sock", with_options(true, false)).await;
    setup.manager.pre_start_container(GPU, strings(&["d1", "d2"])).await.unwrap();
    assert_eq!(*with.plugin.pre_starts.lock(), [strings(&["d1", "d2"])]);
}

#[tokio::test]
async fn calls_for_an_unknown_or_disconnected_resource_fail_with_a_typed_error() {
    let setup = setup(fast());
    let err = setup.manager.allocate(GPU, allocate_request(&["d1"])).await.unwrap_err();
    assert!(matches!(err, DeviceError::UnknownResource { .. }), "{err}");
    assert_eq!(err.to_string(), format!("no device plugin is registered for resource {GPU}"));

    let plugin = setup.plugin("gpu.sock", with_options(true, true)).await;
    plugin.crash();
    wait_for_counts(&setup.manager, GPU, 0, 2).await;

    let err = setup.manager.pre_start_container(GPU, strings(&["d1"])).await.unwrap_err();
    assert!(matches!(err, DeviceError::NoEndpoint { .. }), "{err}");
    assert_eq!(err.to_string(), format!("the device plugin of resource {GPU} is not connected"));
    let err = setup
        .manager
        .get_preferred_allocation(GPU, PreferredAllocationRequest::default())
        .await
        .unwrap_err();
    assert!(matches!(err, DeviceError::NoEndpoint { .. }), "{err}");
}
