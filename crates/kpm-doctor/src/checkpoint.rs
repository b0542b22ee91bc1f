//! The kubelet device manager's checkpoint, `device-plugins/kubelet_internal_checkpoint`:
//! which resource a device plugin on `kubelet.sock` serves.
//!
//! A plugin registers its resource name through `kubelet.sock` and nothing on
//! the node keeps it but the kubelet. Its checkpoint does: after every device
//! list a plugin streams, the device manager writes `RegisteredDevices`, each
//! resource with the IDs of its healthy devices (`writeCheckpoint` in
//! `pkg/kubelet/cm/devicemanager/manager.go`). The plugin's own healthy
//! devices, from its first list, find the resource by those IDs.
//!
//! It is also what the kubelet remembers across its restarts: a kubelet
//! that starts reads the resources of the checkpoint and keeps each, with no
//! device, until its plugin registers again or 5 minutes have passed
//! (`readCheckpoint`), and `PodDeviceEntries` says which pod containers
//! hold which resource's devices.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::time::SystemTime;

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
    /// A nil slice is written as `null`.
    #[serde(rename = "PodDeviceEntries", default)]
    pod_device_entries: Option<Vec<PodDevicesEntry>>,
    /// A nil map is written as `null`.
    #[serde(rename = "RegisteredDevices")]
    registered_devices: Option<BTreeMap<String, Option<Vec<String>>>>,
}

/// A pod container's devices of one resource (`checkpoint.PodDevicesEntry`);
/// the device IDs and the plugin's answer are not read.
#[derive(Deserialize)]
struct PodDevicesEntry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    #[serde(rename = "ContainerName")]
    container_name: String,
    #[serde(rename = "ResourceName")]
    resource_name: String,
}

/// The device manager's checkpoint, as far as the doctor reads it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    /// Each resource the device manager held when it wrote the file.
    pub(crate) registered: RegisteredDevices,
    /// The pod containers holding devices, by resource: `POD-UID/CONTAINER`.
    pub(crate) holders: BTreeMap<String, BTreeSet<String>>,
    /// When the file was written (its modification time), when it can be
    /// told.
    pub(crate) written: Option<SystemTime>,
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
pub(crate) fn read(device_plugins: &Seen) -> Result<Option<Checkpoint>, String> {
    let file = device_plugins.join(FILE_NAME);
    let shown = file.on_host().display();
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(format!("{shown}: cannot be read: {err}")),
    };
    let mut checkpoint =
        parse(&text).map_err(|err| format!("{shown}: not a device manager checkpoint: {err}"))?;
    checkpoint.written = std::fs::metadata(&file).and_then(|meta| meta.modified()).ok();
    Ok(Some(checkpoint))
}

fn parse(text: &str) -> serde_json::Result<Checkpoint> {
    let file: File = serde_json::from_str(text)?;
    let resources = file.data.registered_devices.unwrap_or_default();
    let mut holders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in file.data.pod_device_entries.unwrap_or_default() {
        let holder = format!("{}/{}", entry.pod_uid, entry.container_name);
        holders.entry(entry.resource_name).or_default().insert(holder);
    }
    Ok(Checkpoint {
        registered: RegisteredDevices(
            resources
                .into_iter()
                .map(|(resource, ids)| (resource, ids.unwrap_or_default().into_iter().collect()))
                .collect(),
        ),
        holders,
        written: None,
    })
}

impl RegisteredDevices {
    /// Each resource, with its healthy devices' IDs.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &BTreeSet<String>)> {
        self.0.iter().map(|(resource, ids)| (resource.as_str(), ids))
    }

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

/// Checkpoints made in tests.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// The resources `resources` with their healthy devices' IDs.
    pub(crate) fn registered(resources: &[(&str, &[&str])]) -> RegisteredDevices {
        RegisteredDevices(
            resources
                .iter()
                .map(|(resource, ids)| {
                    ((*resource).to_owned(), ids.iter().map(|id| (*id).to_owned()).collect())
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint as kubelet v1.36's `checkpoint.New(...).MarshalCheckpoint()`
    /// writes it.
    const CHECKPOINT: &str = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"uid-1","ContainerName":"app","ResourceName":"vendor.com/gpu","DeviceIDs":{"-1":["gpu-0"]},"AllocResp":"CgA="},{"PodUID":"uid-2","ContainerName":"app","ResourceName":"vendor.com/gpu","DeviceIDs":{"-1":["gpu-1"]},"AllocResp":"CgA="}],"RegisteredDevices":{"squat.ai/null":["null-0","null-1","null-2"],"vendor.com/gpu":["gpu-0","gpu-1"],"vendor.com/nic":[],"example.com/a":["x"],"example.com/b":["x"]}},"Checksum":1234567}"#;

    fn ids(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|id| (*id).to_owned()).collect()
    }

    #[test]
    fn a_plugins_healthy_devices_find_its_resource() {
        let checkpoint = parse(CHECKPOINT).unwrap();
        let registered = &checkpoint.registered;
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
        // Who holds the devices of each resource.
        let holders: Vec<&str> =
            checkpoint.holders["vendor.com/gpu"].iter().map(String::as_str).collect();
        assert_eq!(holders, ["uid-1/app", "uid-2/app"]);
        assert!(!checkpoint.holders.contains_key("squat.ai/null"));
    }

    #[test]
    fn nil_maps_and_lists_are_empty() {
        let checkpoint =
            parse(r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":1}"#)
                .unwrap();
        assert_eq!(checkpoint, Checkpoint::default());
        let checkpoint =
            parse(r#"{"Data":{"RegisteredDevices":{"vendor.com/gpu":null}},"Checksum":1}"#)
                .unwrap();
        assert_eq!(checkpoint.registered.resource_of(&ids(&["gpu-0"])), Resource::NotHeld);
    }

    #[test]
    fn a_missing_file_is_none_and_a_broken_one_is_named_on_the_host() {
        let host = tempfile::tempdir().unwrap();
        let dir = crate::Host::under(host.path()).path(std::path::Path::new("/device-plugins"));
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(read(&dir), Ok(None));
        std::fs::write(dir.join(FILE_NAME), CHECKPOINT).unwrap();
        let modified = std::fs::metadata(dir.join(FILE_NAME)).unwrap().modified().unwrap();
        assert_eq!(read(&dir).unwrap().unwrap().written, Some(modified));
        std::fs::write(dir.join(FILE_NAME), "{").unwrap();
        let err = read(&dir).unwrap_err();
        assert!(
            err.starts_with("/device-plugins/kubelet_internal_checkpoint: not a device manager"),
            "{err}"
        );
    }
}
