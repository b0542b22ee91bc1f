//! Property test: any `GetInfo` answer at all, passed through the checks a
//! registration makes (`check_info`, then the validation of the CSI, device
//! plugin and DRA handlers), is accepted or rejected with a reason; nothing
//! panics, and whatever is accepted keeps the bounds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;

use kpm::csi::{CsiConfig, CsiHandler, InMemoryNodeInfo};
use kpm::device::{DeviceConfig, DeviceManager};
use kpm::dra::{DraConfig, DraManager, InMemoryCleanup};
use kpm::{PluginDetails, PluginHandler};
use kpm_api::registration::v1::PluginInfo;
use proptest::prelude::*;

/// Strings as a hostile or broken plugin might send them.
fn text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        // Plausible names, versions and paths.
        "[a-z0-9./_-]{0,40}".prop_map(String::from),
        Just("nvidia.com/gpu".to_owned()),
        Just("/var/lib/kubelet/plugins/x/dra.sock".to_owned()),
        Just("v1.DRAPlugin".to_owned()),
        Just("1.0.0".to_owned()),
        // Anything, control characters and non-ASCII included.
        prop::collection::vec(any::<char>(), 0..max).prop_map(|c| c.into_iter().collect()),
        // Long runs.
        (0..4 * max).prop_map(|n| "a".repeat(n)),
        Just("../../etc/passwd".to_owned()),
    ]
}

fn answer() -> impl Strategy<Value = PluginInfo> {
    (
        prop_oneof![Just("CSIPlugin"), Just("DevicePlugin"), Just("DRAPlugin")]
            .prop_map(String::from),
        text(400),
        text(200),
        prop::collection::vec(text(80), 0..48),
    )
        .prop_map(|(r#type, name, endpoint, supported_versions)| PluginInfo {
            r#type,
            name,
            endpoint,
            supported_versions,
        })
}

proptest! {
    #[test]
    fn any_answer_is_judged_without_panicking(info in answer()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let handler: Arc<dyn PluginHandler> = match info.r#type.as_str() {
            "CSIPlugin" => {
                Arc::new(CsiHandler::try_new(
                    Arc::new(InMemoryNodeInfo::default()),
                    CsiConfig::default(),
                    kpm::transport::fd::budget().clone(),
                )
                .unwrap())
            }
            "DevicePlugin" => DeviceManager::try_new(DeviceConfig::default(), kpm::transport::fd::budget().clone()).unwrap(),
            _ => DraManager::try_new(
                DraConfig::default(),
                kpm::transport::fd::budget().clone(),
                Arc::new(InMemoryCleanup::default()),
                None,
            )
            .unwrap(),
        };
        if kpm::check_info(&info).is_err() {
            return Ok(());
        }
        // What the executor hands a handler: the socket for an empty endpoint.
        let socket = Path::new("/var/lib/kubelet/plugins_registry/x.sock");
        let endpoint = kpm::plugin_endpoint(&info, socket);
        let plugin = PluginDetails::new(info.name.clone(), endpoint, info.supported_versions.clone());
        let verdict = runtime.block_on(handler.validate(&plugin));
        if let Err(reason) = verdict {
            prop_assert!(!reason.to_string().is_empty());
        }
    }
}
