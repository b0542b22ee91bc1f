//! What the DRA steps read and write in the API server: the driver's
//! ResourceSlices, and the check's ResourceClaims, allocated as the
//! scheduler allocates them.

use std::time::Duration;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceClaim, DeviceRequest,
    DeviceRequestAllocationResult, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
    ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kpm_api::dra::v1;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tokio::time::Instant;

use super::DraContext;
use crate::outcome::Outcome;

/// The namespace the check's ResourceClaims are made in.
pub(crate) const NAMESPACE: &str = "default";
/// The generated name's prefix of the check's ResourceClaims.
pub(crate) const CLAIM_PREFIX: &str = "kpm-check-";
/// The request of the check's ResourceClaims.
const REQUEST: &str = "kpm-check";
/// The DeviceClass the claims name (the API server does not look it up;
/// the check allocates, not the scheduler).
const DEVICE_CLASS: &str = "kpm-check";
/// The driver the "claim of another driver" is allocated to.
pub(crate) const OTHER_DRIVER: &str = "kpm-check.other.example.com";
/// How often the ResourceSlices are read while waiting for them.
const SLICE_POLL: Duration = Duration::from_millis(500);

/// A device of the driver's slices, to allocate a claim from.
#[derive(Debug, Clone)]
pub(crate) struct SliceDevice {
    pub(crate) pool: String,
    pub(crate) device: String,
}

/// Reads the driver's ResourceSlices of the node until one has a device,
/// for at most the bound.
pub(crate) async fn resource_slices(
    client: &kube::Client,
    driver: &str,
    ctx: &DraContext<'_>,
) -> (Outcome, Option<SliceDevice>) {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let fields = format!("spec.driver={driver},spec.nodeName={}", ctx.node);
    let params = ListParams::default().fields(&fields);
    let started = Instant::now();
    let deadline = started + ctx.bound;
    let mut last = String::from("no answer yet");
    // Slices with devices, all written before the driver started: used if
    // no newer come (a driver that found its slices right need not write).
    let mut stale: Option<Vec<ResourceSlice>> = None;
    loop {
        match tokio::time::timeout_at(deadline, api.list(&params)).await {
            Ok(Ok(answer)) => {
                let slices: Vec<ResourceSlice> =
                    answer.items.into_iter().filter(|slice| device_count(slice) > 0).collect();
                if slices.iter().any(|slice| written_since(slice, ctx.started)) {
                    let took = started.elapsed();
                    let shown = describe_slices(&slices, ctx.node);
                    let outcome = Outcome::passed(format!(
                        "{shown}; read back after {} ms",
                        took.as_millis()
                    ));
                    return (outcome, first_device(&slices));
                }
                last = format!(
                    "{} slices with devices, none written since the driver started",
                    slices.len()
                );
                stale = (!slices.is_empty()).then_some(slices);
            }
            Ok(Err(err)) => last = format!("listing them: {err}"),
            Err(_) => {}
        }
        if Instant::now() + SLICE_POLL >= deadline {
            let Some(slices) = stale else {
                return (
                    Outcome::failed(format!(
                        "no ResourceSlice of {driver} with a device for node {} within {:?} (field \
                         selector {fields}; last: {last}): the scheduler has nothing to allocate",
                        ctx.node, ctx.bound
                    )),
                    None,
                );
            };
            let outcome = Outcome::warned(format!(
                "{}, but none written since the driver started {:?} ago: are they this driver's, \
                 or left by an earlier run?",
                describe_slices(&slices, ctx.node),
                ctx.bound
            ));
            return (outcome, first_device(&slices));
        }
        tokio::time::sleep(SLICE_POLL).await;
    }
}

fn device_count(slice: &ResourceSlice) -> usize {
    slice.spec.devices.as_ref().map_or(0, Vec::len)
}

/// Whether the API server recorded a write of `slice` at or after `since`
/// (its creation or an update in its managed fields), to the second.
fn written_since(slice: &ResourceSlice, since: Timestamp) -> bool {
    let since = since.as_second();
    let created = slice.metadata.creation_timestamp.iter().map(|time| time.0);
    let updated = slice
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.time.as_ref().map(|time| time.0));
    created.chain(updated).any(|time| time.as_second() >= since)
}

/// `N of node NODE: NAME (pool P generation G, D devices), …; T devices`.
fn describe_slices(slices: &[ResourceSlice], node: &str) -> String {
    let shown: Vec<String> = slices
        .iter()
        .map(|slice| {
            format!(
                "{} (pool {} generation {}, {} devices)",
                slice.metadata.name.as_deref().unwrap_or("?"),
                slice.spec.pool.name,
                slice.spec.pool.generation,
                device_count(slice)
            )
        })
        .collect();
    let devices: usize = slices.iter().map(device_count).sum();
    format!("{} of node {node}: {}; {devices} devices", slices.len(), shown.join(", "))
}

/// A device of the newest generation of a pool: the one the scheduler
/// allocates from.
fn first_device(slices: &[ResourceSlice]) -> Option<SliceDevice> {
    let newest = slices.iter().max_by_key(|slice| slice.spec.pool.generation)?;
    let first = newest.spec.devices.as_ref()?.first()?;
    Some(SliceDevice { pool: newest.spec.pool.name.clone(), device: first.name.clone() })
}

/// The check's ResourceClaims, allocated: one to a device of the driver,
/// one to a device of another driver.
#[derive(Debug)]
pub(crate) struct Claims {
    pub(crate) ours: Made,
    pub(crate) other: Made,
    /// The device the claim of the driver is allocated.
    pub(crate) device: SliceDevice,
}

/// A ResourceClaim made: what the kubelet sends of it.
#[derive(Debug, Clone)]
pub(crate) struct Made {
    pub(crate) name: String,
    pub(crate) uid: String,
}

impl Made {
    pub(crate) fn claim(&self) -> v1::Claim {
        v1::Claim { namespace: NAMESPACE.into(), uid: self.uid.clone(), name: self.name.clone() }
    }
}

impl Claims {
    /// Creates both claims and allocates them as the scheduler does.
    pub(crate) async fn create(
        client: &kube::Client,
        driver: &str,
        device: &SliceDevice,
        ctx: &DraContext<'_>,
    ) -> Result<Self, String> {
        let ours = allocated_claim(client, driver, device, ctx).await?;
        let other_device = SliceDevice { pool: "kpm-check".into(), device: "kpm-check-0".into() };
        let other = match allocated_claim(client, OTHER_DRIVER, &other_device, ctx).await {
            Ok(other) => other,
            Err(err) => {
                delete_claim(client, &ours.name, ctx.bound).await;
                return Err(err);
            }
        };
        Ok(Self { ours, other, device: device.clone() })
    }

    pub(crate) async fn delete(&self, client: &kube::Client, bound: Duration) {
        delete_claim(client, &self.ours.name, bound).await;
        delete_claim(client, &self.other.name, bound).await;
    }
}

/// Creates a ResourceClaim asking for one device and writes its
/// `status.allocation` through the status subresource, as the scheduler
/// does: the device's result and a node selector for the node.
async fn allocated_claim(
    client: &kube::Client,
    driver: &str,
    device: &SliceDevice,
    ctx: &DraContext<'_>,
) -> Result<Made, String> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let claim = ResourceClaim {
        metadata: ObjectMeta { generate_name: Some(CLAIM_PREFIX.into()), ..ObjectMeta::default() },
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: REQUEST.into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: DEVICE_CLASS.into(),
                        ..ExactDeviceRequest::default()
                    }),
                    ..DeviceRequest::default()
                }]),
                ..DeviceClaim::default()
            }),
        },
        status: None,
    };
    let created = tokio::time::timeout(ctx.bound, api.create(&PostParams::default(), &claim))
        .await
        .map_err(|_| format!("creating a ResourceClaim took over {:?}", ctx.bound))?
        .map_err(|err| format!("create a ResourceClaim in {NAMESPACE}: {err}"))?;
    let name = created.metadata.name.clone().unwrap_or_default();
    let uid = created.metadata.uid.clone().unwrap_or_default();
    let mut allocated = created;
    allocated.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(vec![DeviceRequestAllocationResult {
                    request: REQUEST.into(),
                    driver: driver.into(),
                    pool: device.pool.clone(),
                    device: device.device.clone(),
                    ..DeviceRequestAllocationResult::default()
                }]),
                config: None,
            }),
            node_selector: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![ctx.node.into()]),
                    }]),
                    match_expressions: None,
                }],
            }),
            allocation_timestamp: None,
        }),
        ..ResourceClaimStatus::default()
    });
    let written = tokio::time::timeout(
        ctx.bound,
        api.replace_status(&name, &PostParams::default(), &allocated),
    )
    .await
    .map_err(|_| format!("allocating ResourceClaim {name} took over {:?}", ctx.bound))
    .and_then(|result| {
        result.map_err(|err| format!("allocate ResourceClaim {name} (status): {err}"))
    });
    if let Err(err) = written {
        delete_claim(client, &name, ctx.bound).await;
        return Err(err);
    }
    Ok(Made { name, uid })
}

/// Deletes a claim of the check; a failure is only logged, the run's
/// outcome does not hang on it.
async fn delete_claim(client: &kube::Client, name: &str, bound: Duration) {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    match tokio::time::timeout(bound, api.delete(name, &DeleteParams::default())).await {
        Ok(Ok(_)) => {}
        Ok(Err(err)) => {
            tracing::warn!(claim = name, %err, "cannot delete the check's ResourceClaim");
        }
        Err(_) => tracing::warn!(claim = name, "deleting the check's ResourceClaim timed out"),
    }
}
