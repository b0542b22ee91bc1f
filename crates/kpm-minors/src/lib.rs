//! What each kubelet minor kpm was checked against does with a plugin
//! where it differs from kpm's own kubelet, whose handlers follow kubelets
//! 1.34 and later (`docs/kubelet-minors.md`, from each minor's source and
//! run beside each by `cargo xtask node-e2e --kubelet-dir`). `kpm doctor`
//! judges a node's kubelet by these rules and `kpm check` holds a plugin to
//! every minor by them; they live here, below both, so that the two cannot
//! disagree.
//!
//! - [`dra_handling`]: the API a kubelet calls a DRA driver on, taken from
//!   the driver's `GetInfo` supported versions: 1.34 and later take the
//!   first of `v1.DRAPlugin` and `v1beta1.DRAPlugin` in the driver's order
//!   and refuse a driver offering neither; 1.32 and 1.33 take
//!   `v1beta1.DRAPlugin`, else fall back to DRA v1alpha4 (`v1alpha3.Node`)
//!   without an error, so a driver offering `v1.DRAPlugin` alone registers
//!   and then fails every claim; 1.31 reads the list as semantic versions
//!   and calls v1alpha4 only;
//! - [`slice_wipe_delay`]: how long after a driver went a kubelet wipes the
//!   driver's ResourceSlices of the node: at once up to 1.32, after 30 s
//!   from 1.33;
//! - [`DRA_GATE`]: before 1.34 a kubelet has a DRA handler only with that
//!   feature gate, off by default.
//!
//! [`CHECKED_MINORS`] are the minors these rules were checked against.
//!
//! ```
//! use kpm_minors::{DraApi, DraHandling, dra_handling};
//!
//! let offered = ["v1.DRAPlugin".to_owned()];
//! assert_eq!(dra_handling(36, &offered), DraHandling::Calls(DraApi::V1));
//! // 1.33 registers it, then calls it on DRA v1alpha4, which it does not serve.
//! assert_eq!(dra_handling(33, &offered), DraHandling::CallsUnserved);
//! ```

use std::time::Duration;

use kpm::api::{DRA_SUPPORTED_SERVICES, DRA_V1_SERVICE, DRA_V1BETA1_SERVICE};
use kpm::dra::DraError;
pub use kpm_report::{CHECKED_MINORS, minor};

/// The first minor whose kubelet takes the services as kpm's handler does.
pub const SERVICES_AS_KPM: u32 = 34;
/// The first minor whose kubelet reads service names, and speaks
/// `v1beta1.DRAPlugin`: the first whose DRA a driver of today is expected
/// to serve.
pub const V1BETA1_FROM: u32 = 32;
/// The kubelet's feature gate for DRA, on by default from 1.34.
pub const DRA_GATE: &str = "DynamicResourceAllocation";
/// The first minor whose kubelet waits before wiping a driver's slices.
const WIPE_DELAYED: u32 = 33;
/// The service name 1.32 and 1.33 know for the DRA v1alpha4 API.
pub const V1ALPHA4_SERVICE: &str = "v1alpha3.NodeService";

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
pub enum DraHandling {
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
pub fn dra_handling(minor: u32, services: &[String]) -> DraHandling {
    match api_taken(minor, services) {
        Err(why) => DraHandling::Refuses(why),
        Ok(DraApi::V1alpha4) if services.iter().any(|v| v == DRA_V1_SERVICE) => {
            DraHandling::CallsUnserved
        }
        Ok(api) => DraHandling::Calls(api),
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
pub fn slice_wipe_delay(version: Option<&str>) -> Option<Duration> {
    match version.and_then(minor) {
        Some(minor) if minor < WIPE_DELAYED => None,
        _ => Some(kpm::dra::DEFAULT_CLEANUP_GRACE),
    }
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
}
