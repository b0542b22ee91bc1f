//! What a device plugin must look like to be accepted: the API version, an
//! extended resource name (apimachinery's `IsExtendedResourceName`, spec
//! B.3, [`kpm_api::is_extended_resource_name`]) and, on the `kubelet.sock` path, an endpoint that stays inside the
//! device-plugins directory.

use std::path::Path;

use kpm_api::constants::DEVICE_PLUGIN_VERSION;
use kpm_api::is_extended_resource_name;

use crate::error::DeviceError;

/// `ValidatePlugin` of the plugin-watcher path: one of `versions` is exactly
/// `v1beta1`, and `name` is an extended resource name. The endpoint is not
/// checked (as in the kubelet).
pub fn validate_plugin(name: &str, versions: &[String]) -> Result<(), DeviceError> {
    if !versions.iter().any(|version| version == DEVICE_PLUGIN_VERSION) {
        return Err(DeviceError::UnsupportedVersions { versions: versions.to_vec() });
    }
    if !is_extended_resource_name(name) {
        return Err(DeviceError::InvalidPluginName { name: name.to_owned() });
    }
    Ok(())
}

/// Checks a `Register` request, in the kubelet's order (version, then
/// resource name), then that its endpoint is a plain file name in `dir`.
pub fn validate_register_request(
    version: &str,
    resource: &str,
    endpoint: &str,
    dir: &Path,
) -> Result<(), DeviceError> {
    if version != DEVICE_PLUGIN_VERSION {
        return Err(DeviceError::UnsupportedVersion { version: version.to_owned() });
    }
    if !is_extended_resource_name(resource) {
        return Err(DeviceError::InvalidResourceName { resource: resource.to_owned() });
    }
    if !is_socket_file_name(endpoint) {
        return Err(DeviceError::InvalidEndpoint {
            endpoint: endpoint.to_owned(),
            dir: dir.to_path_buf(),
        });
    }
    Ok(())
}

/// A single, non-empty path component other than `.` and `..`: joined to the
/// device-plugins directory it names a file directly inside it. (The
/// kubelet joins any endpoint, so `../x.sock` escapes; fix #138382 was open.)
fn is_socket_file_name(endpoint: &str) -> bool {
    !endpoint.is_empty()
        && endpoint != "."
        && endpoint != ".."
        && !endpoint.contains('/')
        && !endpoint.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_plugin_needs_v1beta1_exactly_and_an_extended_resource_name() {
        let versions = |list: &[&str]| list.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>();
        validate_plugin("vendor.com/gpu", &versions(&["v1alpha1", "v1beta1"])).unwrap();
        for bad in [&["v1beta"][..], &["V1beta1"], &["v1beta1 "], &[]] {
            let err = validate_plugin("vendor.com/gpu", &versions(bad)).unwrap_err();
            assert!(matches!(err, DeviceError::UnsupportedVersions { .. }), "{bad:?}: {err}");
        }
        let err = validate_plugin("gpu", &versions(&["v1beta1"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid name of device plugin socket: the ResourceName \"gpu\" is invalid"
        );
        // The version is checked first.
        let err = validate_plugin("gpu", &versions(&["v1"])).unwrap_err();
        assert!(matches!(err, DeviceError::UnsupportedVersions { .. }), "{err}");
    }

    #[test]
    fn register_requests_need_a_socket_file_name_inside_the_directory() {
        let dir = Path::new("/var/lib/kubelet/device-plugins");
        let check = |endpoint: &str| {
            validate_register_request("v1beta1", "vendor.com/gpu", endpoint, dir).is_ok()
        };
        for good in ["gpu.sock", "vendor-gpu-1.sock", "..hidden", ".sock", "a..b"] {
            assert!(check(good), "{good}");
        }
        for bad in ["", ".", "..", "../x.sock", "a/b.sock", "/abs/x.sock", "x.sock/", "a\0b"] {
            assert!(!check(bad), "{bad:?}");
        }
        let err = validate_register_request("v1beta1", "vendor.com/gpu", "/abs.sock", dir)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "invalid endpoint \"/abs.sock\": must be a socket file name inside \
             /var/lib/kubelet/device-plugins"
        );
    }

    #[test]
    fn register_requests_are_checked_version_first_then_name_then_endpoint() {
        let dir = Path::new("/dp");
        let err = |v: &str, r: &str, e: &str| {
            validate_register_request(v, r, e, dir).unwrap_err().to_string()
        };
        assert_eq!(
            err("v1alpha", "gpu", "../x"),
            "requested API version \"v1alpha\" is not supported by kubelet. \
             Supported version is [\"v1beta1\"]"
        );
        assert_eq!(err("v1beta1", "gpu", "../x"), "the ResourceName \"gpu\" is invalid");
        assert_eq!(
            err("v1beta1", "vendor.com/gpu", "../x"),
            "invalid endpoint \"../x\": must be a socket file name inside /dp"
        );
    }
}
