//! The node events a DRA driver must come through: its ResourceSlices
//! wiped, as a kubelet wipes a driver's slices when it does not come back
//! in time after a restart (at once on 1.31 and 1.32; after 30 s from
//! 1.33), and a reboot, after which the kubelet prepares its checkpoint's
//! claims again on a driver that restarted, its CDI directory (a tmpfs,
//! `/var/run/cdi`) emptied.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kpm::dra::DraService;
use kube::api::{Api, DeleteParams, ListParams};
use tokio::time::Instant;

use super::call::{Call, Prepared};
use super::cluster::{Claims, Made, SLICE_POLL, SliceDevice, device_count, resource_slices};
use super::{DraContext, judge_prepare};
use crate::outcome::{Evidence, Outcome};

/// How long the kubelet plugin helper waits after a slice of its pool
/// changes or goes before it syncs the pool (`DefaultSyncDelay`,
/// `resourceslice/resourceslicecontroller.go`): a driver on it publishes
/// its wiped slices again this late, by design, so the wait is this plus
/// the bound.
const HELPER_SYNC_DELAY: Duration = Duration::from_secs(30);

/// Wipes the driver's ResourceSlices of the node, as the kubelet wipes
/// them, and waits for the driver to publish them again: without them the
/// scheduler has nothing to allocate on the node, for good.
pub(crate) async fn slices_after_wipe(
    client: &kube::Client,
    driver: &str,
    node: &str,
    bound: Duration,
) -> Outcome {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let fields = format!("spec.driver={driver},spec.nodeName={node}");
    let params = ListParams::default().fields(&fields);
    let delete = DeleteParams::default();
    match tokio::time::timeout(bound, api.delete_collection(&delete, &params)).await {
        Err(_) => return Outcome::failed(format!("wiping its slices took over {bound:?}")),
        Ok(Err(err)) => return Outcome::failed(format!("wipe its slices ({fields}): {err}")),
        Ok(Ok(_)) => {}
    }
    let wiped_at = Instant::now();
    let waited = HELPER_SYNC_DELAY + bound;
    let deadline = wiped_at + waited;
    loop {
        if let Ok(Ok(slices)) = tokio::time::timeout_at(deadline, api.list(&params)).await {
            let devices: usize = slices.items.iter().map(device_count).sum();
            if devices > 0 {
                let mut evidence = Evidence::default();
                evidence
                    .add(
                        crate::Mark::Pass,
                        format!(
                            "{} slices with {devices} devices published again {} ms after the wipe",
                            slices.items.len(),
                            wiped_at.elapsed().as_millis()
                        ),
                    )
                    .took(wiped_at.elapsed());
                return evidence.outcome("");
            }
        }
        if Instant::now() + SLICE_POLL >= deadline {
            return Outcome::failed(format!(
                "no slice of {driver} for node {node} within {waited:?} of the wipe: the scheduler \
                 has nothing to allocate there until the driver restarts"
            ));
        }
        tokio::time::sleep(SLICE_POLL).await;
    }
}

/// A claim of the driver prepared before a reboot, kept for the driver
/// to prepare again once it is back.
#[derive(Debug)]
pub(crate) struct Kept {
    claims: Claims,
    service: DraService,
    /// Its first answer.
    before: Prepared,
}

impl Kept {
    /// The claims kept, for them to be deleted.
    pub(crate) fn claims(&self) -> &Claims {
        &self.claims
    }
}

/// Allocates a claim from the driver's slices and prepares it on the
/// first service it offers, to be prepared again after the reboot.
pub(crate) async fn keep_prepared(
    driver: &str,
    endpoint: &Path,
    services: &[String],
    ctx: &DraContext<'_>,
) -> Result<Kept, String> {
    let client = ctx.api.ok_or("give --kubeconfig: the claim is a ResourceClaim")?;
    let service =
        *super::offered(services).first().ok_or("it offers no DRA service kubelets call")?;
    let (_, device) = resource_slices(client, driver, ctx).await;
    let device: SliceDevice = device.ok_or("no ResourceSlice device to allocate a claim from")?;
    let claims = Claims::create(client, driver, &device, ctx).await?;
    let endpoint = endpoint.to_string_lossy();
    let call = Call { dra: ctx.dra, driver, endpoint: &endpoint, service };
    let prepared = call.prepare(vec![claims.ours.claim()]).await;
    let before = match prepared.map(|mut answers| answers.remove(&claims.ours.uid)) {
        Ok(Some(prepared)) if prepared.error.is_empty() => prepared,
        failed => {
            claims.delete(client, ctx.bound).await;
            return Err(format!(
                "preparing claim {} before the reboot: {failed:?}",
                claims.ours.name
            ));
        }
    };
    Ok(Kept { claims, service, before })
}

/// The kept claim prepared again by the driver started anew after the
/// reboot: as before, its CDI ids resolving in the specs of the emptied
/// CDI directory; then unprepared.
pub(crate) async fn after_reboot(
    kept: &Kept,
    driver: &str,
    endpoint: &Path,
    ctx: &DraContext<'_>,
) -> Outcome {
    let ours: &Made = &kept.claims.ours;
    let endpoint = endpoint.to_string_lossy();
    let call = Call { dra: ctx.dra, driver, endpoint: &endpoint, service: kept.service };
    let again = call.prepare(vec![ours.claim()]).await;
    let (outcome, _) = judge_prepare(&again, ours, &kept.claims.device, ctx.cdi_dir);
    let mut findings = match outcome {
        Outcome::Passed(evidence) | Outcome::Warned(evidence) | Outcome::Failed(evidence) => {
            evidence
        }
        skipped => return skipped,
    };
    if let Ok(answers) = &again
        && let Some(after) = answers.get(&ours.uid)
        && after.error.is_empty()
        && after != &kept.before
    {
        findings.warn(format!(
            "another answer than before the reboot: {} (before: {}): the kubelet takes the last",
            after.describe(),
            kept.before.describe()
        ));
    }
    let _ = call.unprepare(vec![ours.claim()]).await;
    findings.outcome("")
}
