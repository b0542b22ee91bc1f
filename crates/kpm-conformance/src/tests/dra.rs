//! A DRA driver's checks, with the stand-in API server: its slices read
//! back, a claim allocated from them prepared, prepared again, unprepared,
//! a claim never prepared unprepared, a claim of another driver sent along,
//! on both services.

use kpm::dra::DraService;
use kpm_registrar::stub::Misbehaviour;

use serde_json::json;

use super::{Kind, Quirk, Scripted, an_hour_ago, assert_check, check, resource_slice};
use crate::{Check, Mark};

#[tokio::test(start_paused = true)]
async fn a_conformant_dra_driver_passes_every_claim_check_and_its_claims_go() {
    let scripted = Scripted::dra_publishing();
    let state = scripted.api_state().unwrap();
    let report = check(scripted).await;
    assert_check(&report, Check::ResourceSlices, Mark::Pass, "1 devices");
    for service in [DraService::V1, DraService::V1beta1] {
        let shared = Check::SharedDevice(service);
        for claim_check in Check::of_service(service).into_iter().filter(|c| *c != shared) {
            assert_check(&report, claim_check, Mark::Pass, "");
        }
        assert_check(&report, shared, Mark::Skip, "dev-0: it does not allow multiple allocations");
        let prepare = Check::NodePrepareResources(service);
        assert_check(&report, prepare, Mark::Pass, "kpm-check-node/dev-0");
        assert_check(&report, prepare, Mark::Pass, "a valid CDI spec");
        assert_check(&report, Check::NodeUnprepareResources(service), Mark::Pass, "removed");
    }
    assert!(report.conformant(), "{}", report.text());
    assert!(state.lock().claims.is_empty(), "the check's claims are left");
}

#[tokio::test(start_paused = true)]
async fn without_an_api_server_the_claim_checks_skip() {
    let report = check(Scripted::dra()).await;
    assert_check(&report, Check::ResourceSlices, Mark::Skip, "--kubeconfig");
    for service in [DraService::V1, DraService::V1beta1] {
        assert_check(&report, Check::NodePrepareResources(service), Mark::Skip, "answered none");
        assert_check(&report, Check::UnprepareUnknownClaim(service), Mark::Pass, "");
        assert_check(&report, Check::ClaimOfAnotherDriver(service), Mark::Skip, "");
    }
}

#[tokio::test(start_paused = true)]
async fn resource_slices_fails_without_a_slice_and_warns_on_an_old_one() {
    let report = check(Scripted::dra_with_api(Vec::new(), None)).await;
    assert_check(&report, Check::ResourceSlices, Mark::Fail, "no ResourceSlice of gpu.example.com");
    let old = vec![resource_slice(Some(&an_hour_ago()), &json!({"name": "dev-0"}))];
    let report = check(Scripted::dra_with_api(old, None)).await;
    assert_check(
        &report,
        Check::ResourceSlices,
        Mark::Warn,
        "none written since the driver started",
    );
}

/// Each claim rule broken by the stub's misbehaviour, on v1 (v1beta1 is
/// the same driver behind another service).
#[tokio::test(start_paused = true)]
async fn each_claim_check_fails_on_its_misbehaviour() {
    let v1 = DraService::V1;
    let rules = [
        (
            Misbehaviour::CdiIdUnresolved,
            Check::NodePrepareResources(v1),
            Mark::Fail,
            "is in no CDI spec",
        ),
        (
            Misbehaviour::CdiSpecInvalid,
            Check::NodePrepareResources(v1),
            Mark::Fail,
            "the CDI package refuses the spec",
        ),
        (
            Misbehaviour::PrepareAnswersUnsentClaim,
            Check::NodePrepareResources(v1),
            Mark::Fail,
            "it was not sent",
        ),
        (
            Misbehaviour::PrepareAnswersDifferently,
            Check::PrepareAgain(v1),
            Mark::Warn,
            "a different answer",
        ),
        (
            Misbehaviour::UnprepareLeavesSpec,
            Check::NodeUnprepareResources(v1),
            Mark::Warn,
            "still defines",
        ),
        (
            Misbehaviour::UnprepareUnknownFails,
            Check::UnprepareUnknownClaim(v1),
            Mark::Fail,
            "is not prepared",
        ),
        (
            Misbehaviour::PreparesForeignClaim,
            Check::ClaimOfAnotherDriver(v1),
            Mark::Warn,
            "prepared with devices",
        ),
        (
            Misbehaviour::LatePrepareFails,
            Check::PrepareAfterUnprepare(v1),
            Mark::Fail,
            "was unprepared",
        ),
        (
            Misbehaviour::ReprepareWithoutSpec,
            Check::PrepareAfterReboot,
            Mark::Fail,
            "is in no CDI spec",
        ),
    ];
    for (misbehaviour, broken, mark, said) in rules {
        let scripted = Scripted::dra_publishing().misbehave(misbehaviour);
        let state = scripted.api_state().unwrap();
        let report = check(scripted).await;
        assert_check(&report, broken, mark, said);
        assert_eq!(report.conformant(), mark != Mark::Fail, "{misbehaviour}:\n{}", report.text());
        assert!(state.lock().claims.is_empty(), "{misbehaviour}: the check's claims are left");
    }
}

/// dra-example-driver's shareable GPU, small: 8Gi of memory, shares of at
/// least 1Gi, all of it by default.
fn shareable_gpu() -> serde_json::Value {
    json!({"name": "dev-0", "allowMultipleAllocations": true, "capacity": {"memory": {
        "value": "8Gi",
        "requestPolicy": {"default": "8Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
    }}})
}

/// Two claims share the device as the scheduler would have them: each
/// asks 1Gi and consumes it, each with a share id of its own; the driver
/// keeps them apart.
#[tokio::test(start_paused = true)]
async fn two_claims_share_a_shareable_device_with_distinct_share_ids() {
    let scripted = Scripted::dra_with_api(Vec::new(), Some(shareable_gpu()));
    let read = std::sync::Arc::clone(&scripted.api.as_ref().unwrap().read);
    let report = check(scripted).await;
    for service in [DraService::V1, DraService::V1beta1] {
        assert_check(
            &report,
            Check::SharedDevice(service),
            Mark::Pass,
            "still resolves once claim",
        );
        assert_check(&report, Check::NodePrepareResources(service), Mark::Pass, "");
    }
    // Each claim of the driver read with one share id, its own.
    let mut shares: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for (name, results) in read.lock().iter() {
        for result in results.as_array().into_iter().flatten() {
            if result["driver"] != super::DRA_DRIVER {
                continue;
            }
            assert_eq!(result["consumedCapacity"], json!({"memory": "1Gi"}), "{result}");
            assert_eq!(result["device"], "dev-0");
            let share = result["shareID"].as_str().unwrap().to_owned();
            shares.entry(name.clone()).or_default().insert(share);
        }
    }
    assert!(shares.len() >= 2 && shares.values().all(|ids| ids.len() == 1), "{shares:?}");
    let distinct: std::collections::BTreeSet<&String> = shares.values().flatten().collect();
    assert_eq!(distinct.len(), shares.len(), "a share id a claim: {shares:?}");
    assert!(report.conformant(), "{}", report.text());
}

/// A driver with one CDI spec per device, removed when either share goes:
/// the shares get the same CDI ids (a warning), and the other share's
/// device is gone while its pod still runs (a failure).
#[tokio::test(start_paused = true)]
async fn shared_device_fails_when_one_share_takes_the_others_device_along() {
    let scripted = Scripted::dra_with_api(Vec::new(), Some(shareable_gpu()))
        .misbehave(Misbehaviour::SpecPerDevice);
    let report = check(scripted).await;
    let shared = Check::SharedDevice(DraService::V1);
    assert_check(&report, shared, Mark::Fail, "no longer resolves once claim");
    assert_check(&report, shared, Mark::Fail, "both shares got the CDI ids");
    assert!(!report.conformant());
}

/// The node events a conformant driver comes through: its slices wiped
/// and published again, a claim prepared again after the reboot with its
/// CDI spec back.
#[tokio::test(start_paused = true)]
async fn a_conformant_dra_driver_comes_through_a_wipe_and_a_reboot() {
    let report = check(Scripted::dra_publishing()).await;
    assert_check(&report, Check::SlicesAfterWipe, Mark::Pass, "published again");
    assert_check(&report, Check::PrepareAfterReboot, Mark::Pass, "a valid CDI spec");
    for service in [DraService::V1, DraService::V1beta1] {
        assert_check(&report, Check::PrepareAfterUnprepare(service), Mark::Pass, "prepared");
    }
    // Without an API server there is no claim to keep, nor slices.
    let report = check(Scripted::dra()).await;
    assert_check(&report, Check::SlicesAfterWipe, Mark::Skip, "--kubeconfig");
    assert_check(&report, Check::PrepareAfterReboot, Mark::Skip, "--kubeconfig");
}

/// kubernetes-sigs/dra-example-driver#330: slices wiped by a restarting
/// kubelet and never published again.
#[tokio::test(start_paused = true)]
async fn slices_after_wipe_fails_when_the_driver_does_not_publish_them_again() {
    let mut scripted = Scripted::dra_publishing();
    if let Some(api) = scripted.api.as_mut() {
        api.republishes = false;
    }
    let report = check(scripted).await;
    assert_check(&report, Check::SlicesAfterWipe, Mark::Fail, "no slice of gpu.example.com");
}

#[tokio::test(start_paused = true)]
async fn dra_resource_health_watches_the_prepared_device_renewed_and_changed() {
    let report = check(Scripted::dra_publishing().serving_health().with(Quirk::HealthChange)).await;
    for said in [
        "v1alpha1.DRAResourceHealth: kpm-check-node/dev-0 (prepared) is reported",
        "v1.DRAResourceHealth: kpm-check-node/dev-0 (prepared) is reported",
        "kpm-check-node/dev-1 renewed 10000 ms after its report (timeout 30s)",
        "kpm-check-node/dev-0 HEALTHY→UNHEALTHY 0 ms after the hook, in the whole list",
    ] {
        assert_check(&report, Check::ResourceHealth, Mark::Pass, said);
    }
    // A driver with no health service: nothing to watch.
    let report = check(Scripted::dra_publishing()).await;
    assert_check(&report, Check::ResourceHealth, Mark::Skip, "advertises no DRAResourceHealth");
}

/// Each health rule broken: a warning (the kubelet only shows health), so a
/// strict run fails.
#[tokio::test(start_paused = true)]
async fn dra_resource_health_warns_on_each_misbehaviour() {
    let rules = [
        (Misbehaviour::HealthStreamEnds, "the driver ended the stream"),
        (Misbehaviour::HealthOmitsDevice, "dev-0 (prepared) is not reported"),
        (Misbehaviour::HealthNotRenewed, "not reported again within its timeout 30s"),
        (Misbehaviour::HealthChangeNotSent, "no health change within"),
        (Misbehaviour::HealthPartialUpdates, "came in a message without"),
    ];
    for (misbehaviour, said) in rules {
        let scripted = Scripted::dra_publishing()
            .serving_health()
            .with(Quirk::HealthChange)
            .misbehave(misbehaviour);
        let report = check(scripted).await;
        assert_check(&report, Check::ResourceHealth, Mark::Warn, said);
    }
}

#[tokio::test(start_paused = true)]
async fn dra_resource_health_warns_on_what_is_advertised_and_not_served_and_back() {
    let advertised_only = Scripted::new(Kind::Dra(&["v1.DRAPlugin", "v1.DRAResourceHealth"]));
    let report = check(advertised_only).await;
    assert_check(
        &report,
        Check::ResourceHealth,
        Mark::Warn,
        "advertises v1.DRAResourceHealth only",
    );
    assert_check(&report, Check::ResourceHealth, Mark::Warn, "is advertised, but answered");
    let unadvertised = Scripted::new(Kind::Dra(&["v1.DRAPlugin"])).serving_health();
    let report = check(unadvertised).await;
    assert_check(&report, Check::ResourceHealth, Mark::Warn, "without advertising it");
}
