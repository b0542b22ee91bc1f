//! A device plugin's checks, each broken by the stub's misbehaviour: the
//! check that judges it fails (or warns, where the kubelet copes), and the
//! other device checks are unmoved.

use kpm_registrar::stub::Misbehaviour;

use super::{Kind, Quirk, Scripted, assert_check, assert_none_failed, check};
use crate::{Check, Mark};

/// The device plugin's checks, in the order they run.
const DEVICE_CHECKS: [Check; 7] = [
    Check::ListAndWatch,
    Check::Allocate,
    Check::AllocateUnknownId,
    Check::GetPreferredAllocation,
    Check::PreStartContainer,
    Check::HealthChange,
    Check::StreamStaysOpen,
];

/// `(misbehaviour, the check, its mark, what its evidence says)`.
const RULES: [(Misbehaviour, Check, Mark, &str); 9] = [
    (Misbehaviour::NoDeviceList, Check::ListAndWatch, Mark::Fail, "no list within"),
    (Misbehaviour::DuplicateIds, Check::ListAndWatch, Mark::Fail, "ids listed more than once"),
    (Misbehaviour::AllocateNoResponse, Check::Allocate, Mark::Fail, "no container response"),
    (Misbehaviour::AllocateMissingDevice, Check::Allocate, Mark::Fail, "is not on the host"),
    (Misbehaviour::AllocateUnknownIds, Check::AllocateUnknownId, Mark::Warn, "was allocated"),
    (
        Misbehaviour::PreferredIgnoresMustInclude,
        Check::GetPreferredAllocation,
        Mark::Warn,
        "gpu-2 was a must",
    ),
    (
        Misbehaviour::PreStartFails,
        Check::PreStartContainer,
        Mark::Fail,
        "the container does not start",
    ),
    (
        Misbehaviour::PartialUpdates,
        Check::HealthChange,
        Mark::Fail,
        "left out [\"gpu-1\", \"gpu-2\"]",
    ),
    (Misbehaviour::StreamEnds, Check::StreamStaysOpen, Mark::Fail, "ended the ListAndWatch stream"),
];

#[tokio::test(start_paused = true)]
async fn a_conformant_device_plugin_passes_every_device_check() {
    let report = check(Scripted::device().with(Quirk::HealthChange)).await;
    for check in DEVICE_CHECKS {
        assert_check(&report, check, Mark::Pass, "");
    }
    assert_check(&report, Check::ListAndWatch, Mark::Pass, "3 devices, 3 healthy");
    assert_check(
        &report,
        Check::Allocate,
        Mark::Pass,
        "gpu-0: 1 env, 1 device /dev/null→/dev/gpu-0 rw",
    );
    assert_check(&report, Check::HealthChange, Mark::Pass, "gpu-0 Healthy→Unhealthy");
    // Without a way to change a device's health, that check is skipped.
    let report = check(Scripted::device()).await;
    assert_check(&report, Check::HealthChange, Mark::Skip, "no --health-change");
}

#[tokio::test(start_paused = true)]
async fn each_device_check_fails_on_its_misbehaviour() {
    for (misbehaviour, broken, mark, said) in RULES {
        let scripted = Scripted::device().with(Quirk::HealthChange);
        let report = check(scripted.misbehave(misbehaviour)).await;
        assert_check(&report, broken, mark, said);
        let others: Vec<Check> =
            DEVICE_CHECKS.into_iter().filter(|check| *check != broken).collect();
        assert_none_failed(&report, &others);
        assert_eq!(report.conformant(), mark != Mark::Fail, "{misbehaviour}:\n{}", report.text());
    }
}

/// NVIDIA/k8s-device-plugin#426: devices unhealthy after the kubelet's
/// restart, for good.
#[tokio::test(start_paused = true)]
async fn devices_after_kubelet_restart_fails_when_they_stay_unhealthy() {
    let report = check(Scripted::device()).await;
    assert_check(
        &report,
        Check::DevicesAfterKubeletRestart,
        Mark::Pass,
        "vendor.com/gpu: 3 healthy again",
    );
    let report = check(Scripted::device().with(Quirk::UnhealthyAfterKubeletRestart)).await;
    assert_check(
        &report,
        Check::DevicesAfterKubeletRestart,
        Mark::Fail,
        "vendor.com/gpu: 0 healthy 5s after the kubelet's restart, 3 before",
    );
    // Not a plugin of devices: nothing to hold.
    let report = check(Scripted::csi()).await;
    assert_check(&report, Check::DevicesAfterKubeletRestart, Mark::Skip, "no device plugin");
}

/// On a registration socket: an in-process plugin on `kubelet.sock` keeps
/// its `ListAndWatch` stream past its stop (its server's connections
/// outlive the server), which no process does; the binary's tests run one.
#[tokio::test(start_paused = true)]
async fn rolling_update_passes_when_each_instance_has_sockets_of_its_own() {
    let report = check(Scripted::device().with(Quirk::SocketPerInstance)).await;
    assert_check(&report, Check::RollingUpdate, Mark::Pass, "the second instance serves");
    assert_check(&report, Check::RollingUpdate, Mark::Pass, "3 healthy once the first");
}

#[tokio::test(start_paused = true)]
async fn rolling_update_warns_when_a_second_instance_cannot_start_beside_the_first() {
    for scripted in [Scripted::device(), Scripted::new(Kind::KubeletSock)] {
        let report = check(scripted).await;
        assert_check(&report, Check::RollingUpdate, Mark::Warn, "NVIDIA/k8s-device-plugin#1792");
    }
}

/// A second instance that takes the first's registration socket over,
/// and the first's exit that removes it: the resource goes.
#[tokio::test(start_paused = true)]
async fn rolling_update_fails_when_the_first_instance_takes_the_resource_along() {
    let report = check(Scripted::device().with(Quirk::StealsSocket)).await;
    assert_check(&report, Check::RollingUpdate, Mark::Fail, "the first's socket path");
    assert_check(&report, Check::RollingUpdate, Mark::Fail, "3 before: the node's allocatable");
}
