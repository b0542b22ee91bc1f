//! The claims beside the driver's own: one allocated to another driver,
//! sent along with ours, and a second share of a shareable device.

use std::path::Path;

use super::call::{Call, Prepared, judge_uids};
use super::cluster::{Claims, OTHER_DRIVER};
use crate::cdi;
use crate::outcome::{Evidence, Outcome};

/// One prepare with the driver's claim and a claim allocated to another
/// driver. The kubelet sends a driver only the claims with results for it
/// (a claim's drivers are those of its allocation's results), so nothing
/// here fails a pod: every finding is a warning.
pub(super) async fn claim_of_another_driver(call: &Call<'_>, claims: &Claims) -> Outcome {
    let (ours, other) = (&claims.ours, &claims.other);
    let mut findings = Evidence::default();
    let never = "(the kubelet never sends a driver a claim without results for it)";
    match call.prepare(vec![ours.claim(), other.claim()]).await {
        Err(err) => findings
            .warn(format!("{err}: the whole call failed for the other driver's claim {never}")),
        Ok(answers) => {
            match answers.get(&ours.uid) {
                Some(prepared) if prepared.error.is_empty() => {
                    findings.pass(format!("ours prepared: {}", prepared.describe()));
                }
                Some(prepared) => {
                    findings.warn(format!("ours failed alongside: {:?} {never}", prepared.error));
                }
                None => findings.warn(format!("no answer for ours {never}")),
            }
            match answers.get(&other.uid) {
                None => findings.pass(format!("the claim of {OTHER_DRIVER} left out")),
                Some(prepared) if !prepared.error.is_empty() => {
                    findings
                        .pass(format!("the claim of {OTHER_DRIVER} refused: {:?}", prepared.error));
                }
                Some(prepared) if prepared.devices.is_empty() => {
                    findings.pass(format!("the claim of {OTHER_DRIVER} prepared with no devices"));
                }
                Some(prepared) => findings.warn(format!(
                    "the claim of {OTHER_DRIVER} prepared with devices {} {never}",
                    prepared.describe()
                )),
            }
        }
    }
    // Both go again, errors here being the previous checks' to judge.
    let _ = call.unprepare(vec![ours.claim(), other.claim()]).await;
    findings.outcome("")
}

/// Two claims sharing the driver's device, as two pods' claims on a device
/// that allows multiple allocations (KEP-5075): each prepared on its own
/// call, each answered without an error, kept apart (distinct CDI ids:
/// the same ids give both containers one device with nothing apart, which
/// the kubelet does not mind), and the first unprepared while the second
/// still needs its CDI devices (a container of the second pod that starts
/// again must find them).
pub(super) async fn shared_device(call: &Call<'_>, claims: &Claims, cdi_dir: &Path) -> Outcome {
    let Some(sharing) = &claims.sharing else {
        let why = claims
            .device
            .one_share_only
            .clone()
            .unwrap_or_else(|| "it does not allow multiple allocations".to_owned());
        return Outcome::skipped(format!("{}: {why}", claims.device.describe()));
    };
    let ours = &claims.ours;
    let shares = [ours, sharing].map(|claim| claim.share.clone().unwrap_or_default());
    let mut findings = Evidence::default();
    let mut answered: Vec<Prepared> = Vec::new();
    for claim in [ours, sharing] {
        match call.prepare(vec![claim.claim()]).await {
            Err(err) => {
                findings.fail(format!("claim {}: {err}: the kubelet fails its pod", claim.name));
            }
            Ok(answers) => {
                judge_uids(&answers, &[claim.uid.as_str()], &mut findings);
                match answers.get(&claim.uid) {
                    Some(prepared) if prepared.error.is_empty() => answered.push(prepared.clone()),
                    Some(prepared) => findings.fail(format!(
                        "claim {} (share {}) failed: {:?}: the kubelet fails its pod",
                        claim.name,
                        claim.share.as_deref().unwrap_or_default(),
                        prepared.error
                    )),
                    None => {}
                }
            }
        }
    }
    if let [first, second] = answered.as_slice() {
        findings.pass(format!(
            "shares {} and {} of {} prepared: {}; {}",
            shares[0],
            shares[1],
            claims.device.describe(),
            first.describe(),
            second.describe()
        ));
        let ids = |prepared: &Prepared| -> Vec<String> { prepared.cdi_ids().cloned().collect() };
        if !ids(first).is_empty() && ids(first) == ids(second) {
            findings.warn(format!(
                "both shares got the CDI ids {:?}: their containers get one device with nothing \
                 apart (the kubelet passes the ids on as they are)",
                ids(first)
            ));
        }
        // The first pod goes; the second's devices must stay.
        if let Err(err) = call.unprepare(vec![ours.claim()]).await {
            findings.fail(format!("unprepare claim {}: {err}", ours.name));
        } else {
            let specs = cdi::read_dir(cdi_dir).unwrap_or_default();
            for id in ids(second) {
                let defined = cdi::parse_device_id(&id)
                    .is_ok_and(|(kind, name)| specs.iter().any(|spec| spec.defines(kind, name)));
                if defined {
                    findings.pass(format!(
                        "{id} still resolves once claim {} is unprepared",
                        ours.name
                    ));
                } else {
                    findings.fail(format!(
                        "{id}, of claim {}, no longer resolves once claim {} is unprepared: a \
                             container of the other pod that starts again cannot get its device",
                        sharing.name, ours.name
                    ));
                }
            }
        }
    }
    let _ = call.unprepare(vec![ours.claim(), sharing.claim()]).await;
    findings.outcome("")
}
