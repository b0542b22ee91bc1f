//! A CSI driver's checks: the kubelet's registration and node-info path.

use kpm_registrar::stub::Misbehaviour;

use super::{Kind, Scripted, assert_check, check};
use crate::{Check, Mark};

#[tokio::test(start_paused = true)]
async fn a_conformant_csi_driver_passes_every_csi_check() {
    let report = check(Scripted::csi()).await;
    assert_check(&report, Check::NodeIdStable, Mark::Pass, "\"node-1\" on 3 calls");
    assert_check(&report, Check::TopologyKeys, Mark::Pass, "topology.example.com/node");
    assert_check(&report, Check::GetPluginInfoName, Mark::Pass, "\"csi.example.com\"");
    assert_check(&report, Check::NodeGetCapabilities, Mark::Pass, "answered");
}

#[tokio::test(start_paused = true)]
async fn each_csi_check_fails_on_its_misbehaviour() {
    let rules = [
        (Scripted::csi().misbehave(Misbehaviour::NodeIdChanges), Check::NodeIdStable, "on 3 calls"),
        (
            Scripted::csi().misbehave(Misbehaviour::PluginInfoNameDiffers),
            Check::GetPluginInfoName,
            "registered as",
        ),
        (
            Scripted::csi().misbehave(Misbehaviour::NoNodeCapabilities),
            Check::NodeGetCapabilities,
            "Unimplemented",
        ),
        (
            Scripted::new(Kind::Csi("bad key", "x")),
            Check::TopologyKeys,
            "\"bad key\" is not a label key",
        ),
    ];
    for (scripted, broken, said) in rules {
        let report = check(scripted).await;
        assert_check(&report, broken, Mark::Fail, said);
    }
}
