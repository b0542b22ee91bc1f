//! The kubelet device manager's checkpoint, `device-plugins/kubelet_internal_checkpoint`:
//! which resource a device plugin on `kubelet.sock` serves.
//!
//! A plugin registers its resource name through `kubelet.sock` and nothing on
//! the node keeps it but the kubelet. Its checkpoint does: after every device
//! list a plugin streams, the device manager writes `RegisteredDevices`, each
//! resource with the IDs of its healthy devices (`writeCheckpoint` in
//! `pkg/kubelet/cm/devicemanager/manager.go`). The plugin's own healthy
//! devices, from its first list, find the resource by those IDs.

use std::collections::{BTreeMap, BTreeSet};
use std::io;

use serde::Deserialize;

use crate::host::Seen;

/// The checkpoint's file name in `device-plugins/`.
pub(crate) const FILE_NAME: &str = "kubelet_internal_checkpoint";

/// The file as the kubelet writes it (`checkpoint.Data`); the checksum and
/// the pods' allocations are not read.
#[derive(Deserialize)]
struct File {
    #[serde(rename = "Data")]
    data: Data,
}

#[derive(Deserialize)]
struct Data {
    /// A nil map is written as `null`.
    #[serde(rename = "RegisteredDevices")]
    registered_devices: Option<BTreeMap<String, Option<Vec<String>>>>,
}

/// Each resource the kubelet's device manager holds, with its healthy
/// devices' IDs.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct RegisteredDevices(BTreeMap<String, BTreeSet<String>>);

/// Which resource a plugin's healthy devices are, by the checkpoint.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Resource<'a> {
    /// The resource whose healthy devices are exactly the plugin's.
    Same(&'a str),
    /// The one resource that holds some of the plugin's healthy devices,
    /// with the healthy devices the kubelet holds: its view lags the
    /// plugin's list.
    Differs(&'a str, &'a BTreeSet<String>),
    /// No resource holds any of them: the kubelet does not have the plugin.
    NotHeld,
    /// It cannot be told: the plugin has no healthy device, or several
    /// resources match.
    Unknown,
}

/// The checkpoint of `device_plugins` (the directory); `Ok(None)` when there
/// is none (no kubelet ran its device manager there); `Err` names the file,
/// on the host, and what failed.
pub(crate) fn read(device_plugins: &Seen) -> Result<Option<RegisteredDevices>, String> {
    let file = device_plugins.join(FILE_NAME);
    let shown = file.on_host().display();
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(format!("{shown}: cannot be read: {err}")),
    };
    parse(&text).map(Some).map_err(|err| format!("{shown}: not a device manager checkpoint: {err}"))
}

fn parse(text: &str) -> serde_json::Result<RegisteredDevices> {
    let file: File = serde_json::from_str(text)?;
    let resources = file.data.registered_devices.unwrap_or_default();
    Ok(RegisteredDevices(
        resources
            .into_iter()
            .map(|(resource, ids)| (resource, ids.unwrap_or_default().into_iter().collect()))
            .collect(),
    ))
}

impl RegisteredDevices {
    /// The resource whose healthy devices are `healthy` (a plugin's, by ID).
    pub(crate) fn resource_of(&self, healthy: &BTreeSet<String>) -> Resource<'_> {
        if healthy.is_empty() {
            return Resource::Unknown;
        }
        let same: Vec<&str> = self
            .0
            .iter()
            .filter(|(_, held)| *held == healthy)
            .map(|(resource, _)| resource.as_str())
            .collect();
        let overlapping: Vec<(&str, &BTreeSet<String>)> = self
            .0
            .iter()
            .filter(|(_, held)| !held.is_disjoint(healthy))
            .map(|(resource, held)| (resource.as_str(), held))
            .collect();
        match (same.as_slice(), overlapping.as_slice()) {
            ([resource], _) => Resource::Same(resource),
            ([], []) => Resource::NotHeld,
            ([], [(resource, held)]) => Resource::Differs(resource, held),
            _ => Resource::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint as kubelet v1.36's `checkpoint.New(...).MarshalCheckpoint()`
    /// writes it.
    const CHECKPOINT: &str = r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"squat.ai/null":["null-0","null-1","null-2"],"vendor.com/gpu":["gpu-0","gpu-1"],"vendor.com/nic":[],"example.com/a":["x"],"example.com/b":["x"]}},"Checksum":1234567}"#;

    fn ids(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|id| (*id).to_owned()).collect()
    }

    #[test]
    fn a_plugins_healthy_devices_find_its_resource() {
        let registered = parse(CHECKPOINT).unwrap();
        let held = ids(&["gpu-0", "gpu-1"]);
        let cases = [
            (ids(&["null-2", "null-0", "null-1"]), Resource::Same("squat.ai/null")),
            (ids(&["gpu-0", "gpu-1"]), Resource::Same("vendor.com/gpu")),
            // A device the kubelet does not hold healthy yet.
            (ids(&["gpu-0", "gpu-1", "gpu-2"]), Resource::Differs("vendor.com/gpu", &held)),
            (ids(&["gpu-1"]), Resource::Differs("vendor.com/gpu", &held)),
            (ids(&["fpga-0"]), Resource::NotHeld),
            // Nothing healthy to tell by, or two resources alike.
            (ids(&[]), Resource::Unknown),
            (ids(&["x"]), Resource::Unknown),
        ];
        for (healthy, expected) in cases {
            assert_eq!(registered.resource_of(&healthy), expected, "{healthy:?}");
        }
    }

    #[test]
    fn nil_maps_and_lists_are_empty() {
        let registered =
            parse(r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":1}"#)
                .unwrap();
        assert_eq!(registered, RegisteredDevices::default());
        let registered =
            parse(r#"{"Data":{"RegisteredDevices":{"vendor.com/gpu":null}},"Checksum":1}"#)
                .unwrap();
        assert_eq!(registered.resource_of(&ids(&["gpu-0"])), Resource::NotHeld);
    }

    #[test]
    fn a_missing_file_is_none_and_a_broken_one_is_named_on_the_host() {
        let host = tempfile::tempdir().unwrap();
        let dir = crate::Host::under(host.path()).path(std::path::Path::new("/device-plugins"));
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(read(&dir), Ok(None));
        std::fs::write(dir.join(FILE_NAME), "{").unwrap();
        let err = read(&dir).unwrap_err();
        assert!(
            err.starts_with("/device-plugins/kubelet_internal_checkpoint: not a device manager"),
            "{err}"
        );
    }
}
