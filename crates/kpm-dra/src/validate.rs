//! `ValidatePlugin`'s checks (spec C.2, C.3): the driver name, the endpoint
//! and the advertised services, and the choice of the services to call.
//!
//! The name and endpoint come from the plugin's `GetInfo` answer, which is
//! untrusted: the checks keep a plugin from making the node agent dial an
//! arbitrary socket or from registering under a name that is not a driver
//! name.

use std::path::{Component, Path, PathBuf};

use kpm_api::constants::{
    DRA_HEALTH_V1_SERVICE, DRA_HEALTH_V1ALPHA1_SERVICE, DRA_SUPPORTED_SERVICES, DRA_V1_SERVICE,
    DRA_V1BETA1_SERVICE, MAX_SOCKET_PATH_BYTES,
};

use crate::error::DraError;

/// The longest driver name (`resource.DriverNameMaxLength`).
pub const MAX_DRIVER_NAME_LEN: usize = 63;

/// apimachinery's message for a value that is not a DNS-1123 subdomain.
const DNS1123_SUBDOMAIN_MESSAGE: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
     alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character \
     (e.g. 'example.com', regex used for validation is \
     '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// The DRA plugin service an instance is called on, chosen at registration
/// from the services it advertises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DraService {
    /// `v1.DRAPlugin` (gRPC service `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`).
    V1,
    /// `v1beta1.DRAPlugin` (gRPC service `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`),
    /// called through a conversion from and to the v1 messages.
    V1beta1,
}

impl DraService {
    /// The name a plugin advertises in its supported versions.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => DRA_V1_SERVICE,
            Self::V1beta1 => DRA_V1BETA1_SERVICE,
        }
    }

    /// The full gRPC method name of `NodePrepareResources` in this service.
    pub fn prepare_method(self) -> &'static str {
        match self {
            Self::V1 => "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            Self::V1beta1 => "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
        }
    }

    /// The full gRPC method name of `NodeUnprepareResources` in this service.
    pub fn unprepare_method(self) -> &'static str {
        match self {
            Self::V1 => "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
            Self::V1beta1 => {
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"
            }
        }
    }
}

impl std::fmt::Display for DraService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The DRA resource health service an instance streams device health from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HealthService {
    /// `v1.DRAResourceHealth`.
    V1,
    /// `v1alpha1.DRAResourceHealth`, identical to v1 on the wire.
    V1alpha1,
}

impl HealthService {
    /// The name a plugin advertises in its supported versions.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => DRA_HEALTH_V1_SERVICE,
            Self::V1alpha1 => DRA_HEALTH_V1ALPHA1_SERVICE,
        }
    }
}

impl std::fmt::Display for HealthService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Chooses the DRA service to call: `v1.DRAPlugin` when advertised, else
/// `v1beta1.DRAPlugin`. Other entries (health services, `1.0.0`-style
/// versions) are ignored.
///
/// The kubelet takes the first supported entry in the plugin's order; kpm
/// prefers v1 whatever the order, so a plugin listing v1beta1 first still
/// gets the newer API.
pub fn choose_service(services: &[String]) -> Result<DraService, DraError> {
    if services.is_empty() {
        return Err(DraError::NoServices);
    }
    let offered = |name: &str| services.iter().any(|service| service == name);
    if offered(DRA_V1_SERVICE) {
        Ok(DraService::V1)
    } else if offered(DRA_V1BETA1_SERVICE) {
        Ok(DraService::V1beta1)
    } else {
        Err(DraError::UnsupportedServices {
            services: services.to_vec(),
            supported: DRA_SUPPORTED_SERVICES.iter().map(|s| (*s).to_owned()).collect(),
        })
    }
}

/// The kubelet's `pickHealthService`: `v1.DRAResourceHealth` if advertised,
/// else `v1alpha1.DRAResourceHealth` if advertised, else none, whatever the
/// order of the list.
pub fn pick_health_service(services: &[String]) -> Option<HealthService> {
    let offered = |name: &str| services.iter().any(|service| service == name);
    if offered(DRA_HEALTH_V1_SERVICE) {
        Some(HealthService::V1)
    } else if offered(DRA_HEALTH_V1ALPHA1_SERVICE) {
        Some(HealthService::V1alpha1)
    } else {
        None
    }
}

/// The checks of a driver name: not empty, at most 63 bytes, and a DNS-1123
/// subdomain once lowercased (the `ResourceSlice` driver-name rule).
pub fn validate_driver_name(driver: &str) -> Result<(), DraError> {
    let mut reasons = Vec::new();
    if driver.is_empty() {
        reasons.push("Required value".to_owned());
    } else {
        if driver.len() > MAX_DRIVER_NAME_LEN {
            reasons.push(format!("Too long: may not be more than {MAX_DRIVER_NAME_LEN} bytes"));
        }
        if !is_dns1123_subdomain(&driver.to_lowercase()) {
            reasons.push(format!(
                "Invalid value: {}: {DNS1123_SUBDOMAIN_MESSAGE}",
                crate::error::go_quote(driver)
            ));
        }
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(DraError::InvalidDriverName { driver: driver.to_owned(), reasons })
    }
}

/// The checks of an endpoint: not empty, absolute, short enough for a Unix
/// socket address and, when `root` is given, inside it after lexical
/// cleaning (`..` and `.` resolved, symlinks not followed).
pub fn validate_endpoint(endpoint: &str, root: Option<&Path>) -> Result<(), DraError> {
    if endpoint.is_empty() {
        return Err(DraError::EmptyEndpoint);
    }
    if !Path::new(endpoint).is_absolute() {
        return Err(DraError::RelativeEndpoint { endpoint: endpoint.to_owned() });
    }
    if endpoint.len() > MAX_SOCKET_PATH_BYTES {
        return Err(DraError::EndpointTooLong {
            endpoint: endpoint.to_owned(),
            len: endpoint.len(),
        });
    }
    if let Some(root) = root {
        let root = clean(&std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf()));
        let cleaned = clean(Path::new(endpoint));
        if cleaned == root || !cleaned.starts_with(&root) {
            return Err(DraError::EndpointOutsideRoot {
                endpoint: endpoint.to_owned(),
                root: root.display().to_string(),
            });
        }
    }
    Ok(())
}

/// `ValidatePlugin`: the driver name, the endpoint, then the services (the
/// errors of the last wrapped as the kubelet wraps them). Returns the chosen
/// services.
pub(crate) fn validate_plugin(
    driver: &str,
    endpoint: &str,
    services: &[String],
    root: Option<&Path>,
) -> Result<(DraService, Option<HealthService>), DraError> {
    validate_driver_name(driver)?;
    validate_endpoint(endpoint, root)?;
    let service = choose_service(services).map_err(|source| DraError::InvalidServices {
        driver: driver.to_owned(),
        endpoint: endpoint.to_owned(),
        source: Box::new(source),
    })?;
    Ok((service, pick_health_service(services)))
}

/// apimachinery's `IsDNS1123Subdomain`: at most 253 characters of
/// dot-separated labels, each of lowercase alphanumerics and `-`, starting
/// and ending with an alphanumeric.
fn is_dns1123_subdomain(value: &str) -> bool {
    let label_ok = |label: &str| {
        let bytes = label.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        bytes.first().is_some_and(alnum)
            && bytes.last().is_some_and(alnum)
            && bytes.iter().all(|b| alnum(b) || *b == b'-')
    };
    value.len() <= 253 && value.split('.').all(label_ok)
}

/// Go's `filepath.Clean` for the purpose of a containment check: `.` and
/// empty components dropped, `..` removing the previous component (never
/// climbing above the root).
fn clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Prefix(prefix) => out.push(prefix.as_os_str()),
            Component::RootDir => out.push(Component::RootDir.as_os_str()),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() && !out.has_root() {
                    out.push("..");
                }
            }
            Component::Normal(name) => out.push(name),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|item| (*item).to_owned()).collect()
    }

    #[test]
    fn pick_health_service_prefers_v1_whatever_the_order() {
        // Port of TestPickHealthService.
        let cases: [(&[&str], Option<HealthService>); 5] = [
            (&["v1beta1.DRAPlugin"], None),
            (&[], None),
            (&["v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"], Some(HealthService::V1alpha1)),
            (&["v1beta1.DRAPlugin", "v1.DRAResourceHealth"], Some(HealthService::V1)),
            (&["v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"], Some(HealthService::V1)),
        ];
        for (services, want) in cases {
            assert_eq!(pick_health_service(&list(services)), want, "{services:?}");
        }
    }

    #[test]
    fn choose_service_prefers_v1_and_ignores_entries_it_does_not_know() {
        assert_eq!(choose_service(&list(&["v1.DRAPlugin"])).unwrap(), DraService::V1);
        assert_eq!(choose_service(&list(&["v1beta1.DRAPlugin"])).unwrap(), DraService::V1beta1);
        assert_eq!(
            choose_service(&list(&["v1beta1.DRAPlugin", "v1.DRAPlugin"])).unwrap(),
            DraService::V1
        );
        assert_eq!(
            choose_service(&list(&["v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"])).unwrap(),
            DraService::V1beta1
        );
        assert_eq!(
            choose_service(&[]).unwrap_err().to_string(),
            "empty list of supported gRPC services (aka supported versions)"
        );
        assert_eq!(
            choose_service(&list(&["1.0.0", "some-other-service"])).unwrap_err().to_string(),
            "none of services supported by the plugin ([\"1.0.0\" \"some-other-service\"]) are \
             supported by the kubelet ([\"v1.DRAPlugin\" \"v1beta1.DRAPlugin\"])"
        );
    }

    #[test]
    fn driver_names_must_be_short_lowercased_dns_subdomains() {
        for good in ["dra.example.com", "Dra.Example.Com", "a", "gpu-1.vendor.io", &"a".repeat(63)]
        {
            validate_driver_name(good).unwrap_or_else(|err| panic!("{good}: {err}"));
        }
        let text = |name: &str| validate_driver_name(name).unwrap_err().to_string();
        assert_eq!(text(""), "invalid DRA driver name \"\": Required value");
        assert!(text("../evil").starts_with("invalid DRA driver name \"../evil\": Invalid value"));
        assert!(text("evil driver").contains("a lowercase RFC 1123 subdomain"));
        assert_eq!(
            text(&"a".repeat(64)),
            format!(
                "invalid DRA driver name \"{}\": Too long: may not be more than 63 bytes",
                "a".repeat(64)
            )
        );
        for bad in ["-a", "a-", "a..b", ".a", "a_b", "é.com"] {
            assert!(validate_driver_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn endpoints_must_be_absolute_short_and_inside_the_root_when_one_is_given() {
        let root = Some(Path::new("/var/lib/kubelet"));
        validate_endpoint("/anywhere/dra.sock", None).unwrap();
        validate_endpoint("/var/lib/kubelet/plugins/x/../dra.sock", root).unwrap();
        validate_endpoint("/var/lib/kubelet/./dra.sock", root).unwrap();
        let text =
            |endpoint: &str, root| validate_endpoint(endpoint, root).unwrap_err().to_string();
        assert_eq!(text("", None), "empty DRA plugin endpoint");
        assert_eq!(
            text("plugin.sock", None),
            "DRA plugin endpoint \"plugin.sock\" must be an absolute path"
        );
        let longest = format!("/{}", "a".repeat(MAX_SOCKET_PATH_BYTES - 1));
        validate_endpoint(&longest, None).unwrap();
        let too_long = format!("must not be longer than {MAX_SOCKET_PATH_BYTES} bytes");
        assert!(text(&format!("{longest}a"), None).contains(&too_long));
        assert_eq!(
            text("/var/lib/kubelet", root),
            "DRA plugin endpoint \"/var/lib/kubelet\" is not inside the kubelet root directory \
             \"/var/lib/kubelet\""
        );
        assert!(text("/var/lib/kubeletx/dra.sock", root).contains("is not inside"));
        assert!(text("/var/lib/kubelet/../kubelet2/dra.sock", root).contains("is not inside"));
        // The root itself is cleaned too.
        let messy_root = Some(Path::new("/var/lib/./kubelet/"));
        validate_endpoint("/var/lib/kubelet/plugins/dra.sock", messy_root).unwrap();
    }

    #[test]
    fn cleaning_is_lexical_like_go_filepath_clean() {
        let cleaned = |path: &str| clean(Path::new(path)).display().to_string();
        assert_eq!(cleaned("/var/lib/kubelet/../../etc/passwd"), "/var/etc/passwd");
        assert_eq!(cleaned("/../../a"), "/a");
        assert_eq!(cleaned("/a/./b//c/.."), "/a/b");
        assert_eq!(cleaned("a/../../b"), "../b");
    }
}
