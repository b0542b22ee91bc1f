//! A DRA driver's checks, with the stand-in API server: its slices read
//! back, a claim allocated from them prepared, prepared again, unprepared,
//! a claim never prepared unprepared, a claim of another driver sent along,
//! on both services.

use kpm::dra::DraService;
use kpm_registrar::stub::Misbehaviour;

use super::{Scripted, an_hour_ago, assert_check, check, resource_slice};
use crate::{Check, Mark};

#[tokio::test(start_paused = true)]
async fn a_conformant_dra_driver_passes_every_claim_check_and_its_claims_go() {
    let scripted = Scripted::dra_with_api(Vec::new(), true);
    let state = scripted.api_state().unwrap();
    let report = check(scripted).await;
    assert_check(&report, Check::ResourceSlices, Mark::Pass, "1 devices");
    for service in [DraService::V1, DraService::V1beta1] {
        for claim_check in Check::of_service(service) {
            assert_check(&report, claim_check, Mark::Pass, "");
        }
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
    let report = check(Scripted::dra_with_api(Vec::new(), false)).await;
    assert_check(&report, Check::ResourceSlices, Mark::Fail, "no ResourceSlice of gpu.example.com");
    let old = vec![resource_slice(Some(&an_hour_ago()))];
    let report = check(Scripted::dra_with_api(old, false)).await;
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
    ];
    for (misbehaviour, broken, mark, said) in rules {
        let scripted = Scripted::dra_with_api(Vec::new(), true).misbehave(misbehaviour);
        let state = scripted.api_state().unwrap();
        let report = check(scripted).await;
        assert_check(&report, broken, mark, said);
        assert_eq!(report.conformant(), mark != Mark::Fail, "{misbehaviour}:\n{}", report.text());
        assert!(state.lock().claims.is_empty(), "{misbehaviour}: the check's claims are left");
    }
}
