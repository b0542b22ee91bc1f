//! What the judged kubelet does with a DRA driver where its minor differs
//! from the referee, whose DRA handler is kpm's and so follows kubelets
//! 1.34 and later (`docs/kubelet-minors.md`, from each minor's source and
//! run beside each by `cargo xtask node-e2e --kubelet-dir`):
//!
//! - the API it calls a driver on, taken from the driver's `GetInfo`
//!   supported versions: 1.34 and later take the first of `v1.DRAPlugin`
//!   and `v1beta1.DRAPlugin` in the driver's order and refuse a driver
//!   offering neither; 1.32 and 1.33 take `v1beta1.DRAPlugin`, else fall
//!   back to DRA v1alpha4 (`v1alpha3.Node`) without an error, so a driver
//!   offering `v1.DRAPlugin` alone registers and then fails every claim;
//!   1.31 reads the list as semantic versions and calls v1alpha4 only;
//! - how long after a driver went it wipes the driver's ResourceSlices of
//!   the node: at once up to 1.32, after 30 s from 1.33;
//! - whether it has a DRA handler at all: before 1.34 only with the
//!   `DynamicResourceAllocation` feature gate, off by default.
//!
//! A version the doctor cannot read a minor from (no API server, a
//! development build) is judged as the referee judges.

use std::time::Duration;

use kpm::api::{DRA_PLUGIN, DRA_SUPPORTED_SERVICES, DRA_V1_SERVICE, DRA_V1BETA1_SERVICE};
use kpm::dra::DraError;
use kpm::{ExecutorError, PluginKind};

use kpm_report::Verdict;

use crate::judge::Row;

/// The first minor whose kubelet takes the services as kpm's handler does.
const SERVICES_AS_KPM: u32 = 34;
/// The first minor whose kubelet reads service names, and speaks
/// `v1beta1.DRAPlugin`.
const V1BETA1_FROM: u32 = 32;
/// The kubelet's feature gate for DRA, on by default from 1.34.
pub(crate) const DRA_GATE: &str = "DynamicResourceAllocation";
/// The first minor whose kubelet waits before wiping a driver's slices.
const WIPE_DELAYED: u32 = 33;
/// The service name 1.32 and 1.33 know for the DRA v1alpha4 API.
const V1ALPHA4_SERVICE: &str = "v1alpha3.NodeService";

/// What the doctor knows of the judged kubelet that its DRA rules need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JudgedKubelet {
    /// Its minor of Kubernetes 1.x, from its Node.
    pub(crate) minor: u32,
    /// Whether its `DynamicResourceAllocation` gate is on, when its
    /// process was found (a gate it does not name is off before 1.34).
    pub(crate) dra_gate: Option<bool>,
}

/// The API a kubelet calls a DRA driver on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DraApi {
    /// `v1.DRAPlugin`.
    V1,
    /// `v1beta1.DRAPlugin`.
    V1beta1,
    /// DRA v1alpha4, whose gRPC service is `v1alpha3.Node`: kpm does not
    /// speak it.
    V1alpha4,
}

impl std::fmt::Display for DraApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::V1 => DRA_V1_SERVICE,
            Self::V1beta1 => DRA_V1BETA1_SERVICE,
            Self::V1alpha4 => "v1alpha3.Node (DRA v1alpha4)",
        })
    }
}

/// What a kubelet of one minor does with a DRA driver, by the services
/// the driver offers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DraOutcome {
    /// It calls the driver on this API.
    Calls(DraApi),
    /// It registers the driver, then calls it on v1alpha4, which a driver
    /// offering `v1.DRAPlugin` (and not `v1beta1.DRAPlugin`) is for kubelets
    /// 1.34 and later, and does not serve: every claim fails to prepare.
    CallsUnserved,
    /// It refuses the driver, for this reason (the kubelet's words).
    Refuses(String),
}

/// What the kubelet of 1.`minor` does with a DRA driver offering
/// `services` in its `GetInfo` supported versions (its DRA gate on).
pub fn dra_outcome(minor: u32, services: &[String]) -> DraOutcome {
    match api_taken(minor, services) {
        Err(why) => DraOutcome::Refuses(why),
        Ok(DraApi::V1alpha4) if services.iter().any(|v| v == DRA_V1_SERVICE) => {
            DraOutcome::CallsUnserved
        }
        Ok(api) => DraOutcome::Calls(api),
    }
}

/// The API the kubelet of `minor` calls a driver offering `services` on,
/// or its reason for refusing the driver.
fn api_taken(minor: u32, services: &[String]) -> Result<DraApi, String> {
    let offered = |name: &str| services.iter().any(|service| service == name);
    if services.is_empty() {
        return Err("empty list for supported versions".into());
    }
    match minor {
        SERVICES_AS_KPM.. => services
            .iter()
            .find_map(|service| match service.as_str() {
                DRA_V1_SERVICE => Some(DraApi::V1),
                DRA_V1BETA1_SERVICE => Some(DraApi::V1beta1),
                _ => None,
            })
            // The kubelet's words are kpm's handler's.
            .ok_or_else(|| {
                DraError::UnsupportedServices {
                    services: services.to_vec(),
                    supported: DRA_SUPPORTED_SERVICES.map(str::to_owned).to_vec(),
                }
                .to_string()
            }),
        V1BETA1_FROM..SERVICES_AS_KPM if offered(DRA_V1BETA1_SERVICE) => Ok(DraApi::V1beta1),
        V1BETA1_FROM..SERVICES_AS_KPM => Ok(DraApi::V1alpha4),
        _ => kpm::csi::highest_supported_version(services)
            .map(|_| DraApi::V1alpha4)
            .map_err(|err| format!("none of the versions are supported: {err}")),
    }
}

/// How long after a driver went the kubelet of `version` (its Node's
/// `kubeletVersion`) wipes its ResourceSlices of the node: `None` when at
/// once; the newer kubelets' delay, kpm's own, when the version names no
/// minor (none known, a development build).
pub(crate) fn slice_wipe_delay(version: Option<&str>) -> Option<Duration> {
    match version.and_then(kpm_report::minor) {
        Some(minor) if minor < WIPE_DELAYED => None,
        _ => Some(kpm::dra::DEFAULT_CLEANUP_GRACE),
    }
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
    match dra_outcome(minor, &row.versions) {
        DraOutcome::Refuses(why) => {
            row.verdict = Verdict::Rejected;
            row.reason = format!("{kubelet} refuses it: {why}");
            row.hint = "kubelet 1.31 reads a DRA driver's versions as semantic versions (1.0.0) \
                        and calls DRA v1alpha4 only, which drivers for 1.32 and later (and kpm) \
                        do not serve: run the driver's release for 1.31, or upgrade the kubelet"
                .into();
        }
        DraOutcome::CallsUnserved => {
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
        DraOutcome::Calls(api @ DraApi::V1alpha4) => {
            row.verdict = Verdict::Ok;
            row.reason = format!("{kubelet} calls it on {api}, which the doctor does not inspect");
            row.hint = format!(
                "kubelets 1.34 and later refuse it: have it offer {DRA_V1BETA1_SERVICE} or \
                 {DRA_V1_SERVICE} before the kubelet is upgraded"
            );
        }
        // What 1.32 and 1.33 take besides v1alpha4, v1beta1, kpm takes too:
        // the referee's row stands.
        DraOutcome::Calls(_) => {}
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

    /// Each minor's `GetInfo` rule, from its source (`docs/kubelet-minors.md`).
    #[test]
    fn each_minor_takes_the_api_its_source_takes() {
        let both = list(&["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
        let beta_first = list(&["v1beta1.DRAPlugin", "v1.DRAPlugin"]);
        let v1 = list(&["v1.DRAPlugin"]);
        let alpha = list(&["v1alpha3.NodeService"]);
        let semver = list(&["1.0.0"]);
        let cases = [
            // 1.34 on: the plugin's order, and nothing else.
            (36, &both, Ok(DraApi::V1)),
            (34, &beta_first, Ok(DraApi::V1beta1)),
            (35, &alpha, Err("none of services supported")),
            (34, &semver, Err("none of services supported")),
            // 1.32, 1.33: v1beta1 whatever the order; anything else v1alpha4.
            (33, &both, Ok(DraApi::V1beta1)),
            (32, &v1, Ok(DraApi::V1alpha4)),
            (33, &alpha, Ok(DraApi::V1alpha4)),
            (32, &semver, Ok(DraApi::V1alpha4)),
            // 1.31: semantic versions, v1alpha4 only.
            (31, &semver, Ok(DraApi::V1alpha4)),
            (31, &both, Err("none of the versions are supported")),
        ];
        for (minor, services, expected) in cases {
            let taken = api_taken(minor, services);
            match expected {
                Ok(api) => assert_eq!(taken, Ok(api), "1.{minor} {services:?}"),
                Err(why) => {
                    let err = taken.unwrap_err();
                    assert!(err.contains(why), "1.{minor} {services:?}: {err}");
                }
            }
        }
        for minor in [31, 33, 36] {
            assert!(api_taken(minor, &[]).unwrap_err().contains("empty list"));
        }
    }

    /// The wipe of a gone driver's slices: at once on 1.31 and 1.32, 30 s
    /// later from 1.33 (`wipingDelay`), as node-e2e's `dra` measured.
    #[test]
    fn kubelets_from_1_33_wait_before_wiping_a_drivers_slices() {
        assert_eq!(slice_wipe_delay(Some("v1.31.14")), None);
        assert_eq!(slice_wipe_delay(Some("v1.32.13")), None);
        for version in ["v1.33.13", "v1.34.9", "v1.35.6", "v1.36.2"] {
            assert_eq!(slice_wipe_delay(Some(version)), Some(Duration::from_secs(30)));
        }
        // Not known: the newer kubelets' delay.
        for version in [None, Some("v0.0.0-master+8e16b12fda5b")] {
            assert_eq!(slice_wipe_delay(version), Some(Duration::from_secs(30)));
        }
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
