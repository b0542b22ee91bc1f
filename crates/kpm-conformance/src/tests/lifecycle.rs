//! The checks every plugin goes through: registration, `GetInfo`, its
//! type's checks, the kubelet minors, socket names, the kubelet's restart,
//! SIGTERM and its own restart.

use std::time::Duration;

use kpm_registrar::stub::Misbehaviour;

use super::{Kind, Quirk, Scripted, assert_check, check};
use crate::{Check, Mark};

/// The checks made on every plugin that registers.
const EVERY_PLUGIN: [Check; 6] = [
    Check::Registers,
    Check::GetInfoWithin1s,
    Check::TypeChecks,
    Check::SocketNames,
    Check::KubeletRestart,
    Check::Sigterm,
];

#[tokio::test(start_paused = true)]
async fn a_conformant_plugin_passes_every_check_it_is_given() {
    let report = check(Scripted::device().with(Quirk::HealthChange)).await;
    for check in EVERY_PLUGIN.into_iter().chain([Check::PluginRestart]) {
        assert_check(&report, check, Mark::Pass, "");
    }
    assert_check(
        &report,
        Check::Registers,
        Mark::Pass,
        "DevicePlugin vendor.com/gpu at plugins_registry/vendor.com_gpu-reg.sock",
    );
    assert_check(&report, Check::TypeChecks, Mark::Pass, "3 devices");
    assert_check(&report, Check::KubeletMinors, Mark::Skip, "no DRA driver");
    assert_check(&report, Check::PluginRestart, Mark::Pass, "vendor.com/gpu: 3 healthy again");
    assert!(report.conformant(), "{}", report.text());
    assert_eq!(report.tally().failed, 0);
}

#[tokio::test(start_paused = true)]
async fn registers_fails_when_the_kubelet_cannot_register_the_plugin() {
    let slow = Scripted { get_info_delay: Duration::from_millis(1500), ..Scripted::device() };
    let report = check(slow).await;
    assert_check(&report, Check::Registers, Mark::Fail, "GetInfo timed out after 1s");
    for check in EVERY_PLUGIN.into_iter().skip(1) {
        assert_check(&report, check, Mark::Skip, "the plugin never registered");
    }
    assert!(!report.conformant());
}

/// The second look, on a kubelet of its own, times `GetInfo`: under the
/// paused clock, the plugin's delay to the millisecond.
#[tokio::test(start_paused = true)]
async fn get_info_within_1s_is_timed_on_each_registration_socket() {
    let report =
        check(Scripted { get_info_delay: Duration::from_millis(300), ..Scripted::csi() }).await;
    assert_check(&report, Check::GetInfoWithin1s, Mark::Pass, "answered in 300.");
    let finding = &report.outcome(Check::GetInfoWithin1s).unwrap().evidence().findings()[0];
    assert!(finding.took.is_some_and(|took| took >= Duration::from_millis(300)), "{finding:?}");
    assert!(
        matches!(&finding.subject, Some(crate::Subject::Socket(path)) if path.ends_with("csi.example.com-reg.sock"))
    );
    // Through `kubelet.sock` alone there is no `GetInfo`.
    let report = check(Scripted::new(Kind::KubeletSock)).await;
    assert_check(&report, Check::GetInfoWithin1s, Mark::Skip, "kubelet.sock only");
}

/// A device plugin on `kubelet.sock` whose first list never comes: its
/// service fails the inspection the device manager makes.
#[tokio::test(start_paused = true)]
async fn type_checks_fail_where_the_handler_refuses_the_plugins_service() {
    let report =
        check(Scripted::new(Kind::KubeletSock).misbehave(Misbehaviour::NoDeviceList)).await;
    assert_check(&report, Check::Registers, Mark::Pass, "on kubelet.sock");
    assert_check(&report, Check::TypeChecks, Mark::Fail, "vendor.com/gpu:");
}

#[tokio::test(start_paused = true)]
async fn kubelet_minors_holds_a_dra_driver_to_every_minor() {
    let report = check(Scripted::dra()).await;
    assert_check(
        &report,
        Check::KubeletMinors,
        Mark::Pass,
        "kubelets 1.34-1.36 call v1.DRAPlugin, 1.32-1.33 call v1beta1.DRAPlugin, 1.31 refuse it",
    );
    let report = check(Scripted::new(Kind::Dra(&["v1.DRAPlugin"]))).await;
    assert_check(
        &report,
        Check::KubeletMinors,
        Mark::Fail,
        "1.32-1.33 register it, then call v1alpha3.Node (DRA v1alpha4)",
    );
    // kpm's own kubelet, like 1.34 and later, takes it.
    assert_check(&report, Check::TypeChecks, Mark::Pass, "");
}

#[tokio::test(start_paused = true)]
async fn socket_names_warns_off_the_convention() {
    let report = check(Scripted::csi()).await;
    assert_check(&report, Check::SocketNames, Mark::Pass, "csi.example.com-reg.sock");
    let report = check(Scripted { socket_name: Some("dp.1234"), ..Scripted::csi() }).await;
    assert_check(
        &report,
        Check::SocketNames,
        Mark::Warn,
        "dp.1234 should be csi.example.com-reg.sock",
    );
    assert!(report.conformant(), "a warning only:\n{}", report.text());
}

#[tokio::test(start_paused = true)]
async fn kubelet_restart_fails_when_the_plugin_does_not_register_again() {
    let report = check(Scripted::new(Kind::KubeletSock)).await;
    assert_check(&report, Check::KubeletRestart, Mark::Pass, "kubelet.sock re-created");
    let once = Scripted::new(Kind::KubeletSock).with(Quirk::NoReregister);
    let report = check(once).await;
    assert_check(&report, Check::KubeletRestart, Mark::Fail, "not registered again");
}

#[tokio::test(start_paused = true)]
async fn sigterm_fails_when_the_plugin_leaves_its_socket() {
    let report = check(Scripted::device().with(Quirk::NoCleanup)).await;
    assert_check(&report, Check::Sigterm, Mark::Fail, "but left");
    assert_check(&report, Check::Sigterm, Mark::Fail, "vendor.com_gpu-reg.sock");
}

#[tokio::test(start_paused = true)]
async fn plugin_restart_holds_a_csi_driver_to_its_node_id() {
    let report = check(Scripted::csi()).await;
    assert_check(&report, Check::PluginRestart, Mark::Pass, "node id \"node-1\" kept");
    let report = check(Scripted::csi().misbehave(Misbehaviour::NodeIdChanges)).await;
    assert_check(&report, Check::PluginRestart, Mark::Fail, "after its restart");
}
