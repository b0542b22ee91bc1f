//! Bounds on a `GetInfo` answer, checked before any handler sees it: the
//! answer comes from whatever process owns a socket in the registry
//! directory, so it is untrusted input. Handlers add their own rules (name
//! formats, versions); these only keep garbage out of logs, caches and events.

use kpm_api::constants::{
    MAX_PLUGIN_NAME_BYTES, MAX_PLUGIN_TYPE_BYTES, MAX_SOCKET_PATH_BYTES, MAX_SUPPORTED_VERSIONS,
    MAX_VERSION_BYTES,
};
use std::path::Path;

use kpm_api::gotext::go_quote;
use kpm_api::registration::v1::PluginInfo;
use kpm_cache::PluginEndpoint;

/// Where the plugin that answered `info` on its registration socket `socket`
/// (as this process reaches it) serves: the endpoint it advertised, as it
/// sent it, or, when it advertised none, the registration socket itself
/// (the kubelet's rule).
pub fn plugin_endpoint(info: &PluginInfo, socket: &Path) -> PluginEndpoint {
    if info.endpoint.is_empty() {
        PluginEndpoint::RegistrationSocket(socket.to_path_buf())
    } else {
        PluginEndpoint::Advertised(info.endpoint.clone())
    }
}

/// Checks a `GetInfo` answer: type and name present, every string bounded
/// and free of control characters, the version list bounded. The error is a
/// reason fit for the plugin's `NotifyRegistrationStatus(false, ...)`.
pub fn check_info(info: &PluginInfo) -> Result<(), String> {
    check_field("plugin type", &info.r#type, MAX_PLUGIN_TYPE_BYTES, true)?;
    check_field("plugin name", &info.name, MAX_PLUGIN_NAME_BYTES, true)?;
    check_field("endpoint", &info.endpoint, MAX_SOCKET_PATH_BYTES, false)?;
    let versions = info.supported_versions.len();
    if versions > MAX_SUPPORTED_VERSIONS {
        return Err(format!(
            "{versions} supported versions, at most {MAX_SUPPORTED_VERSIONS} allowed"
        ));
    }
    for version in &info.supported_versions {
        check_field("supported version", version, MAX_VERSION_BYTES, true)?;
    }
    Ok(())
}

fn check_field(what: &str, value: &str, max_bytes: usize, required: bool) -> Result<(), String> {
    if required && value.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if value.len() > max_bytes {
        return Err(format!("{what} is {} bytes long, at most {max_bytes} allowed", value.len()));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("{what} {} contains a control character", go_quote(value)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn info(plugin_type: &str, name: &str, endpoint: &str, versions: &[&str]) -> PluginInfo {
        PluginInfo {
            r#type: plugin_type.into(),
            name: name.into(),
            endpoint: endpoint.into(),
            supported_versions: versions.iter().map(|v| (*v).to_owned()).collect(),
        }
    }

    /// Who gave the endpoint stays known: an advertised one is kept as it
    /// was sent, even when it names the registration socket or looks like
    /// a path under a host root.
    #[test]
    fn the_endpoint_is_the_advertised_one_else_the_registration_socket() {
        let socket = Path::new("/host/var/lib/kubelet/plugins_registry/gpu-reg.sock");
        let advertised = |endpoint: &str| PluginEndpoint::Advertised(endpoint.to_owned());
        let cases = [
            ("", PluginEndpoint::RegistrationSocket(socket.to_path_buf())),
            ("unix:///csi/csi.sock", advertised("unix:///csi/csi.sock")),
            ("/host/csi.sock", advertised("/host/csi.sock")),
            (
                "/host/var/lib/kubelet/plugins_registry/gpu-reg.sock",
                advertised("/host/var/lib/kubelet/plugins_registry/gpu-reg.sock"),
            ),
        ];
        for (sent, endpoint) in cases {
            let answer = info("DevicePlugin", "gpu", sent, &["v1beta1"]);
            assert_eq!(plugin_endpoint(&answer, socket), endpoint, "{sent:?}");
        }
    }

    #[test]
    fn real_plugins_pass() {
        let plugins = [
            info(
                "CSIPlugin",
                "hostpath.csi.k8s.io",
                "/var/lib/kubelet/plugins/h/csi.sock",
                &["1.0.0"],
            ),
            info("DevicePlugin", "nvidia.com/gpu", "", &["v1beta1"]),
            info(
                "DRAPlugin",
                "gpu.example.com",
                "/var/lib/kubelet/plugins/g/dra.sock",
                &["v1.DRAPlugin", "v1beta1.DRAPlugin"],
            ),
            // Longest allowed everywhere.
            info(
                &"t".repeat(MAX_PLUGIN_TYPE_BYTES),
                &format!("{}/{}", "p".repeat(253), "n".repeat(63)),
                &format!("/{}", "e".repeat(MAX_SOCKET_PATH_BYTES - 1)),
                &vec!["v".repeat(MAX_VERSION_BYTES).as_str(); MAX_SUPPORTED_VERSIONS],
            ),
        ];
        for plugin in plugins {
            assert_eq!(check_info(&plugin), Ok(()), "{plugin:?}");
        }
    }

    #[test]
    fn garbage_is_rejected_with_a_reason_that_names_the_field() {
        let huge = "x".repeat(1024 * 1024);
        let many: Vec<String> = (0..10_000).map(|i| format!("v{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let cases = [
            (info("", "a", "", &[]), "plugin type is empty"),
            (info("CSIPlugin", "", "", &[]), "plugin name is empty"),
            (
                info("CSIPlugin", &huge, "", &[]),
                "plugin name is 1048576 bytes long, at most 317 allowed",
            ),
            (
                info("CSIPlugin", "a\nb", "", &[]),
                r#"plugin name "a\nb" contains a control character"#,
            ),
            (
                info("CSIPlugin", "a", &"/e".repeat(54), &[]),
                "endpoint is 108 bytes long, at most 107 allowed",
            ),
            (
                info("CSIPlugin", "a", "/x\0", &[]),
                r#"endpoint "/x\x00" contains a control character"#,
            ),
            (info("CSIPlugin", "a", "", &many), "10000 supported versions, at most 32 allowed"),
            (info("CSIPlugin", "a", "", &["1.0", ""]), "supported version is empty"),
            (
                info(&"T".repeat(64), "a", "", &[]),
                "plugin type is 64 bytes long, at most 63 allowed",
            ),
        ];
        for (plugin, reason) in cases {
            assert_eq!(check_info(&plugin), Err(reason.to_owned()));
        }
    }

    proptest! {
        /// Any answer at all is either accepted within the bounds or rejected
        /// with a bounded reason; nothing panics.
        #[test]
        fn any_answer_is_judged_without_panicking(
            plugin_type in ".{0,80}",
            name in prop_oneof![".{0,400}", "[a-z./-]{0,400}"],
            endpoint in ".{0,120}",
            versions in prop::collection::vec(".{0,70}", 0..40),
        ) {
            let answer = PluginInfo {
                r#type: plugin_type, name, endpoint, supported_versions: versions,
            };
            match check_info(&answer) {
                Ok(()) => {
                    prop_assert!(!answer.r#type.is_empty() && answer.r#type.len() <= MAX_PLUGIN_TYPE_BYTES);
                    prop_assert!(!answer.name.is_empty() && answer.name.len() <= MAX_PLUGIN_NAME_BYTES);
                    prop_assert!(answer.supported_versions.len() <= MAX_SUPPORTED_VERSIONS);
                    prop_assert!(!answer.name.chars().any(char::is_control));
                }
                // Values are quoted only when short enough to be in bounds.
                Err(reason) => prop_assert!(reason.len() < 2048, "{reason}"),
            }
        }
    }
}
