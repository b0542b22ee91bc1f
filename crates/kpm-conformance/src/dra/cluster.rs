//! What the DRA checks read and write in the API server: the driver's
//! ResourceSlices, and the check's ResourceClaims, allocated as the 1.36
//! scheduler allocates them (its allocator,
//! `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating`,
//! with consumable capacity, KEP-5075, beta and on): a device that allows
//! multiple allocations gets a fresh share id per claim and, for each of
//! its capacities, what the claim consumes of it.
//!
//! What the scheduler would also write and the check does not: a
//! DeviceClass's config (the check's class does not exist), `adminAccess`
//! (never asked for), tolerations (no request has them), binding conditions
//! (a device's, waited on by the scheduler only), and partitions of
//! partitionable devices (the result names the device alike).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, CapacityRequirements, Device, DeviceAllocationResult, DeviceClaim,
    DeviceRequest, DeviceRequestAllocationResult, ExactDeviceRequest, ResourceClaim,
    ResourceClaimSpec, ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
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
pub(crate) const SLICE_POLL: Duration = Duration::from_millis(500);

/// A device of the driver's slices, to allocate a claim from.
#[derive(Debug, Clone, Default)]
pub(crate) struct SliceDevice {
    pub(crate) pool: String,
    pub(crate) device: String,
    /// Whether it allows multiple allocations (`allowMultipleAllocations`):
    /// then each claim is a share of it, with its own share id.
    pub(crate) shareable: bool,
    /// What each share asks of its capacities (`capacity.requests`): the
    /// least its request policy allows, so that shares fit beside each
    /// other.
    pub(crate) requests: BTreeMap<String, Quantity>,
    /// What each share consumes of each capacity, as the allocator
    /// computes it (`consumable_capacity.go`): a request the policy allows
    /// as it is; without a request, the policy's default, else all of it.
    pub(crate) consumed: BTreeMap<String, Quantity>,
    /// Why a second share does not fit, when it does not.
    pub(crate) one_share_only: Option<String>,
}

impl SliceDevice {
    fn of(pool: &str, device: &Device) -> Self {
        let mut shared = Self {
            pool: pool.to_owned(),
            device: device.name.clone(),
            shareable: device.allow_multiple_allocations == Some(true),
            ..Self::default()
        };
        if !shared.shareable {
            return shared;
        }
        for (name, capacity) in device.capacity.iter().flatten() {
            let policy = capacity.request_policy.as_ref();
            let least = policy.and_then(|policy| {
                let range = policy.valid_range.as_ref().map(|range| range.min.clone());
                range.or_else(|| {
                    let values = policy.valid_values.iter().flatten();
                    values.min_by(|a, b| quantity::value(a).total_cmp(&quantity::value(b))).cloned()
                })
            });
            let consumed = match least {
                Some(least) => {
                    shared.requests.insert(name.clone(), least.clone());
                    least
                }
                None => {
                    policy.and_then(|p| p.default.clone()).unwrap_or_else(|| capacity.value.clone())
                }
            };
            if quantity::value(&consumed) * 2.0 > quantity::value(&capacity.value) {
                shared.one_share_only = Some(format!(
                    "a share consumes {} of its {name} {}: no room for a second",
                    consumed.0, capacity.value.0
                ));
            }
            shared.consumed.insert(name.clone(), consumed);
        }
        shared
    }

    /// `pool/device`, and `(shareable)` when it is.
    pub(crate) fn describe(&self) -> String {
        let shared = if self.shareable { " (shareable)" } else { "" };
        format!("{}/{}{shared}", self.pool, self.device)
    }
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

pub(crate) fn device_count(slice: &ResourceSlice) -> usize {
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
/// allocates from. A shareable one first, for the shared-device check.
fn first_device(slices: &[ResourceSlice]) -> Option<SliceDevice> {
    let newest = slices.iter().max_by_key(|slice| slice.spec.pool.generation)?;
    let devices = newest.spec.devices.as_ref()?;
    let first = devices
        .iter()
        .find(|device| device.allow_multiple_allocations == Some(true))
        .or_else(|| devices.first())?;
    Some(SliceDevice::of(&newest.spec.pool.name, first))
}

/// The check's ResourceClaims, allocated: one to a device of the driver,
/// one to a device of another driver, and, when the driver's device is
/// shareable, a second share of it.
#[derive(Debug)]
pub(crate) struct Claims {
    pub(crate) ours: Made,
    pub(crate) other: Made,
    /// The second claim on a shareable device.
    pub(crate) sharing: Option<Made>,
    /// The device the claims of the driver are allocated.
    pub(crate) device: SliceDevice,
}

/// A ResourceClaim made: what the kubelet sends of it, and its share of a
/// shareable device.
#[derive(Debug, Clone, Default)]
pub(crate) struct Made {
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) share: Option<String>,
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
        let mut claims =
            Self { ours, other: Made::default(), sharing: None, device: device.clone() };
        let other_device = SliceDevice {
            pool: "kpm-check".into(),
            device: "kpm-check-0".into(),
            ..SliceDevice::default()
        };
        let more = async {
            claims.other = allocated_claim(client, OTHER_DRIVER, &other_device, ctx).await?;
            if device.shareable && device.one_share_only.is_none() {
                claims.sharing = Some(allocated_claim(client, driver, device, ctx).await?);
            }
            Ok::<_, String>(())
        };
        if let Err(err) = more.await {
            claims.delete(client, ctx.bound).await;
            return Err(err);
        }
        Ok(claims)
    }

    pub(crate) async fn delete(&self, client: &kube::Client, bound: Duration) {
        let made = [Some(&self.ours), Some(&self.other), self.sharing.as_ref()];
        for claim in made.into_iter().flatten().filter(|claim| !claim.name.is_empty()) {
            delete_claim(client, &claim.name, bound).await;
        }
    }
}

/// Creates a ResourceClaim asking for one device and writes its
/// `status.allocation` through the status subresource, as the scheduler
/// does: the device's result (a share of it with a fresh share id and
/// what it consumes, when it is shareable) and a node selector for the
/// node. Writing an allocation takes `update` on `resourceclaims/binding`
/// from 1.36 (`DRAResourceClaimGranularStatusAuthorization`).
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
                        capacity: (!device.requests.is_empty()).then(|| CapacityRequirements {
                            requests: Some(device.requests.clone()),
                        }),
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
    let share = device.shareable.then(random_uid);
    let mut allocated = created;
    allocated.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(vec![DeviceRequestAllocationResult {
                    request: REQUEST.into(),
                    driver: driver.into(),
                    pool: device.pool.clone(),
                    device: device.device.clone(),
                    share_id: share.clone(),
                    consumed_capacity: (device.shareable && !device.consumed.is_empty())
                        .then(|| device.consumed.clone()),
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
    Ok(Made { name, uid, share })
}

/// A random UUID (version 4), as the scheduler makes a share id and the
/// API server makes a uid.
pub(crate) fn random_uid() -> String {
    let bits = fastrand::u128(..);
    // The version (4) and the variant (10xx) bits, as RFC 4122 sets them.
    let bits = (bits & !(0xf << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
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

/// Quantities as numbers, enough to tell whether two shares fit in a
/// capacity: a decimal with a binary (`Ki`…`Ei`), decimal (`k`…`E`,
/// `m`, `u`, `n`) or exponent (`e3`) suffix.
mod quantity {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    /// Its value; NaN when it does not read as a quantity.
    pub(super) fn value(quantity: &Quantity) -> f64 {
        let text = quantity.0.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-')))
            .unwrap_or(text.len());
        let (number, suffix) = text.split_at(split);
        let Ok(number) = number.parse::<f64>() else { return f64::NAN };
        let scale = match suffix {
            "" => 1.0,
            "Ki" => 1024f64,
            "Mi" => 1024f64.powi(2),
            "Gi" => 1024f64.powi(3),
            "Ti" => 1024f64.powi(4),
            "Pi" => 1024f64.powi(5),
            "Ei" => 1024f64.powi(6),
            "n" => 1e-9,
            "u" => 1e-6,
            "m" => 1e-3,
            "k" => 1e3,
            "M" => 1e6,
            "G" => 1e9,
            "T" => 1e12,
            "P" => 1e15,
            "E" => 1e18,
            exponent => match exponent.strip_prefix(['e', 'E']).map(str::parse::<i32>) {
                Some(Ok(power)) => 10f64.powi(power),
                _ => return f64::NAN,
            },
        };
        number * scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_random_uid_is_a_version_4_uuid() {
        let uid = random_uid();
        let parts: Vec<usize> = uid.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{uid}");
        assert!(uid.chars().all(|c| c.is_ascii_digit() || matches!(c, 'a'..='f' | '-')), "{uid}");
        assert_eq!(&uid[14..15], "4", "{uid}");
        assert!(matches!(&uid[19..20], "8" | "9" | "a" | "b"), "{uid}");
        assert_ne!(random_uid(), uid);
    }

    #[test]
    fn quantities_read_as_the_api_writes_them() {
        for (text, value) in [
            ("100", 100.0),
            ("80Gi", 80.0 * 1024f64.powi(3)),
            ("500m", 0.5),
            ("1e3", 1000.0),
            ("2k", 2000.0),
        ] {
            let read = quantity::value(&Quantity(text.into()));
            assert!((read - value).abs() <= value.abs() * 1e-12, "{text}: {read}");
        }
        assert!(quantity::value(&Quantity("lots".into())).is_nan());
    }

    /// dra-example-driver's shareable GPU: a policy per capacity whose
    /// default is all of it; each share asks the least, and two fit.
    #[test]
    fn each_share_asks_the_least_its_policy_allows() {
        let device: Device = serde_json::from_value(serde_json::json!({
            "name": "gpu-0", "allowMultipleAllocations": true,
            "capacity": {
                "memory": {"value": "80Gi", "requestPolicy": {"default": "80Gi",
                    "validRange": {"min": "1Gi", "step": "1Gi", "max": "80Gi"}}},
                "compute": {"value": "100", "requestPolicy": {"default": "100",
                    "validValues": ["50", "10", "100"]}},
                "counters": {"value": "4"},
            }
        }))
        .unwrap_or_default();
        let shared = SliceDevice::of("pool", &device);
        let shown = |map: &BTreeMap<String, Quantity>| -> Vec<(String, String)> {
            map.iter().map(|(name, q)| (name.clone(), q.0.clone())).collect()
        };
        assert_eq!(
            shown(&shared.requests),
            [("compute".into(), "10".into()), ("memory".into(), "1Gi".into())]
        );
        assert_eq!(shown(&shared.consumed).len(), 3);
        // No policy, no request: a share consumes all 4 counters.
        assert_eq!(shared.consumed["counters"].0, "4");
        assert!(shared.one_share_only.as_deref().is_some_and(|why| why.contains("counters")));
        assert_eq!(shared.describe(), "pool/gpu-0 (shareable)");
    }
}
