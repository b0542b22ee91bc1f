//! The doctor's rows of DRA drivers made what the judged kubelet's minor
//! does with them, where it differs from the referee, whose DRA handler is
//! kpm's and so follows kubelets 1.34 and later. The rules are
//! [`kpm_minors`]'; a version the doctor cannot read a minor from (no API
//! server, a development build) is judged as the referee judges.

use kpm::api::{DRA_PLUGIN, DRA_V1_SERVICE, DRA_V1BETA1_SERVICE};
use kpm::dra::DraError;
use kpm::{ExecutorError, PluginKind};
use kpm_minors::{DRA_GATE, DraApi, DraHandling, SERVICES_AS_KPM, V1ALPHA4_SERVICE, dra_handling};
use kpm_report::Verdict;

use crate::judge::Row;

/// What the doctor knows of the judged kubelet that its DRA rules need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JudgedKubelet {
    /// Its minor of Kubernetes 1.x, from its Node.
    pub(crate) minor: u32,
    /// Whether its `DynamicResourceAllocation` gate is on, when its
    /// process was found (a gate it does not name is off before 1.34).
    pub(crate) dra_gate: Option<bool>,
}

/// The referee's row of a DRA driver's registration socket, made what
/// `kubelet` does with it. A kubelet without the DRA gate has no handler
/// for any driver; otherwise only rows the referee found fine, or refused
/// for their services alone, change: a driver it refused for its name or
/// endpoint is refused by every minor.
pub(crate) fn judge(row: &mut Row, outcome: &Result<(), ExecutorError>, kubelet: JudgedKubelet) {
    let minor = kubelet.minor;
    if minor >= SERVICES_AS_KPM || row.kind != Some(PluginKind::Dra) {
        return;
    }
    if kubelet.dra_gate == Some(false) {
        row.verdict = Verdict::Rejected;
        row.reason = format!(
            "kubelet 1.{minor} has no handler for {DRA_PLUGIN}: its {DRA_GATE} feature gate is \
             off, the default before 1.34"
        );
        row.hint = format!(
            "turn the gate on for the kubelet (--feature-gates={DRA_GATE}=true, or featureGates \
             in its config file) and the control plane, with resource.k8s.io/v1beta1 served \
             (v1alpha3 for 1.31); or upgrade the node to 1.34 or later, where DRA is on"
        );
        return;
    }
    let refused_for_services = outcome.as_ref().err().is_some_and(services_refused);
    if !(row.verdict == Verdict::Ok || refused_for_services) {
        return;
    }
    let kubelet = format!("kubelet 1.{minor}");
    match dra_handling(minor, &row.versions) {
        DraHandling::Refuses(why) => {
            row.verdict = Verdict::Rejected;
            row.reason = format!("{kubelet} refuses it: {why}");
            row.hint = "kubelet 1.31 reads a DRA driver's versions as semantic versions (1.0.0) \
                        and calls DRA v1alpha4 only, which drivers for 1.32 and later (and kpm) \
                        do not serve: run the driver's release for 1.31, or upgrade the kubelet"
                .into();
        }
        DraHandling::CallsUnserved => {
            row.verdict = Verdict::ServiceFailing;
            row.reason = format!(
                "{kubelet} registers it, then calls it on {}: kubelets 1.32 and 1.33 know \
                 {DRA_V1BETA1_SERVICE} and {V1ALPHA4_SERVICE}, not {DRA_V1_SERVICE}, and fall \
                 back to v1alpha4 for a driver offering neither ({})",
                DraApi::V1alpha4,
                row.versions.join(", ")
            );
            row.hint = format!(
                "every claim on this driver fails to prepare: have it offer and serve \
                 {DRA_V1BETA1_SERVICE} too (kpm-registrar's DRA plugins and the kubeletplugin \
                 helper of 1.34 and later do), or upgrade the kubelet to 1.34 or later"
            );
        }
        DraHandling::Calls(api @ DraApi::V1alpha4) => {
            row.verdict = Verdict::Ok;
            row.reason = format!("{kubelet} calls it on {api}, which the doctor does not inspect");
            row.hint = format!(
                "kubelets 1.34 and later refuse it: have it offer {DRA_V1BETA1_SERVICE} or \
                 {DRA_V1_SERVICE} before the kubelet is upgraded"
            );
        }
        // What 1.32 and 1.33 take besides v1alpha4, v1beta1, kpm takes too:
        // the referee's row stands.
        _ => {}
    }
}

/// Whether the referee refused a driver for the services it offers.
fn services_refused(err: &ExecutorError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(err) = cause {
        if let Some(DraError::InvalidServices { .. }) = err.downcast_ref::<DraError>() {
            return true;
        }
        cause = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn list(services: &[&str]) -> Vec<String> {
        services.iter().map(|&s| s.to_owned()).collect()
    }

    /// A kubelet of `minor` whose DRA gate is on.
    fn gated(minor: u32) -> JudgedKubelet {
        JudgedKubelet { minor, dra_gate: Some(true) }
    }

    #[test]
    fn a_kubelet_before_1_34_without_the_dra_gate_refuses_every_driver() {
        for minor in [31, 32, 33] {
            let mut row = dra_row(Verdict::Ok, &["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
            judge(&mut row, &Ok(()), JudgedKubelet { minor, dra_gate: Some(false) });
            assert_eq!(row.verdict, Verdict::Rejected);
            assert!(row.reason.contains("DynamicResourceAllocation feature gate is off"));
        }
        // 1.34 on, DRA is on whatever the gate says; a gate not known is not guessed.
        for kubelet in [
            JudgedKubelet { minor: 34, dra_gate: Some(false) },
            JudgedKubelet { minor: 33, dra_gate: None },
        ] {
            let mut row = dra_row(Verdict::Ok, &["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
            judge(&mut row, &Ok(()), kubelet);
            assert_eq!(row.verdict, Verdict::Ok, "{kubelet:?}");
        }
    }

    fn dra_row(verdict: Verdict, versions: &[&str]) -> Row {
        let mut row =
            Row::new(verdict, std::path::Path::new("/r/gpu.sock"), "registry", "seen".into());
        row.kind = Some(PluginKind::Dra);
        row.name = Some("gpu.example.com".into());
        row.versions = list(versions);
        row
    }

    #[test]
    fn a_v1_only_driver_beside_1_33_registers_and_fails_its_claims() {
        let mut row = dra_row(Verdict::Ok, &["v1.DRAPlugin"]);
        judge(&mut row, &Ok(()), gated(33));
        assert_eq!(row.verdict, Verdict::ServiceFailing);
        assert!(row.reason.contains("kubelet 1.33 registers it, then calls it on v1alpha3.Node"));
        assert!(row.hint.contains("v1beta1.DRAPlugin too"), "{}", row.hint);
    }

    #[test]
    fn a_driver_offering_both_services_is_fine_from_1_32_on() {
        for minor in [32, 33, 34, 36] {
            let mut row = dra_row(Verdict::Ok, &["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
            judge(&mut row, &Ok(()), gated(minor));
            assert_eq!((row.verdict, row.reason.as_str()), (Verdict::Ok, "seen"), "1.{minor}");
        }
    }

    #[test]
    fn kubelet_1_31_refuses_a_driver_offering_service_names() {
        let mut row = dra_row(Verdict::Ok, &["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
        judge(&mut row, &Ok(()), gated(31));
        assert_eq!(row.verdict, Verdict::Rejected);
        assert!(row.reason.starts_with("kubelet 1.31 refuses it: none of the versions"));
    }

    #[test]
    fn a_driver_refused_for_a_v1alpha4_offer_is_called_on_v1alpha4_by_1_32_and_1_33() {
        let refused = |versions: &[&str]| {
            Err(ExecutorError::Validate {
                socket: "/r/gpu.sock".into(),
                name: "gpu.example.com".into(),
                source: Box::new(DraError::InvalidServices {
                    driver: "gpu.example.com".into(),
                    endpoint: "/r/gpu.sock".into(),
                    source: Box::new(DraError::UnsupportedServices {
                        services: list(versions),
                        supported: list(&["v1.DRAPlugin", "v1beta1.DRAPlugin"]),
                    }),
                }),
            })
        };
        let mut row = dra_row(Verdict::Rejected, &["v1alpha3.NodeService"]);
        judge(&mut row, &refused(&["v1alpha3.NodeService"]), gated(32));
        assert_eq!(row.verdict, Verdict::Ok);
        assert!(row.reason.contains("kubelet 1.32 calls it on v1alpha3.Node"), "{}", row.reason);
        assert!(row.hint.contains("1.34 and later refuse it"), "{}", row.hint);

        // A refusal for something else is every minor's.
        let mut row = dra_row(Verdict::Rejected, &["v1alpha3.NodeService"]);
        let other = Err(ExecutorError::Validate {
            socket: "/r/gpu.sock".into(),
            name: "GPU".into(),
            source: Box::new(DraError::NoServices),
        });
        judge(&mut row, &other, gated(32));
        assert_eq!(row.verdict, Verdict::Rejected);
    }

    #[test]
    fn rows_of_other_types_and_other_failures_are_left_as_the_referee_judged() {
        let mut row = dra_row(Verdict::Stale, &["v1.DRAPlugin"]);
        judge(&mut row, &Ok(()), gated(33));
        assert_eq!(row.verdict, Verdict::Stale);
        let mut row = dra_row(Verdict::Ok, &["v1.DRAPlugin"]);
        row.kind = Some(PluginKind::Csi);
        judge(&mut row, &Ok(()), gated(31));
        assert_eq!((row.verdict, row.reason.as_str()), (Verdict::Ok, "seen"));
    }
}
