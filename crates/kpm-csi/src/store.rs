//! The registered CSI drivers (spec A.2, the kubelet's `DriversStore`): one
//! entry per driver name, where other CSI code finds a driver's socket.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;

use crate::error::CsiError;
use crate::version::Version;

/// What a driver's NodeGetInfo returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverNodeInfo {
    /// `node_id`: how the driver names this node. Never empty once installed.
    pub node_id: String,
    /// `max_volumes_per_node`: 0 means no limit reported.
    pub max_volumes_per_node: i64,
    /// `accessible_topology.segments`; empty when the driver reports none.
    pub topology: BTreeMap<String, String>,
}

/// `node_id=… max_volumes=… topology={…}`, as `kpm probe` shows it.
impl std::fmt::Display for DriverNodeInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "node_id={} max_volumes={} topology={:?}",
            self.node_id, self.max_volumes_per_node, self.topology
        )
    }
}

/// A registered CSI driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiDriver {
    /// The driver name, as the plugin reported it.
    pub name: String,
    /// The driver's CSI endpoint as the plugin reported it (a Unix socket
    /// path, possibly with a `unix://` prefix; see [`kpm_api::endpoint_path`]).
    pub endpoint: String,
    /// The highest supported version among those the plugin reported.
    pub version: Version,
    /// What NodeGetInfo returned, once registration got that far; its
    /// `max_volumes_per_node` follows the refreshes.
    pub node: Option<DriverNodeInfo>,
    /// How often its allocatable count is refreshed, if it is (see
    /// [`CsiConfig::allocatable_update_period`](crate::CsiConfig::allocatable_update_period)).
    pub allocatable_update_period: Option<Duration>,
    /// When its `NodeGetInfo` last answered a refresh.
    pub allocatable_refreshed_at: Option<SystemTime>,
}

impl CsiDriver {
    /// A driver just stored by a registration: no node info yet, not refreshed.
    pub(crate) fn new(name: &str, endpoint: &str, version: Version) -> Self {
        Self {
            name: name.to_owned(),
            endpoint: endpoint.to_owned(),
            version,
            node: None,
            allocatable_update_period: None,
            allocatable_refreshed_at: None,
        }
    }
}

/// `{"name", "endpoint", "version", "node_id", "topology", "max_volumes",
/// "allocatable_update_period_s", "allocatable_refreshed_at"}`: the node
/// info flattened, `null` (the topology `{}`) until NodeGetInfo answered;
/// the refresh's period in seconds and its last answer (RFC 3339), `null`
/// without refreshes.
#[cfg(feature = "serde")]
impl serde::Serialize for CsiDriver {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let node = self.node.as_ref();
        let mut fields = serializer.serialize_struct("CsiDriver", 8)?;
        fields.serialize_field("name", &self.name)?;
        fields.serialize_field("endpoint", &self.endpoint)?;
        fields.serialize_field("version", &self.version)?;
        fields.serialize_field("node_id", &node.map(|n| &n.node_id))?;
        fields.serialize_field("topology", &node.map_or(&BTreeMap::new(), |n| &n.topology))?;
        fields.serialize_field("max_volumes", &node.map(|n| n.max_volumes_per_node))?;
        let period = self.allocatable_update_period.map(|period| period.as_secs());
        fields.serialize_field("allocatable_update_period_s", &period)?;
        let refreshed = self.allocatable_refreshed_at.map(kpm_api::json::Rfc3339);
        fields.serialize_field("allocatable_refreshed_at", &refreshed)?;
        fields.end()
    }
}

/// The registered CSI drivers by name. Thread-safe; shared between the
/// [`CsiHandler`](crate::CsiHandler) that writes it and the consumers that
/// look drivers up, for whom it is read-only: only the handler's
/// registrations and deregistrations change it.
///
/// ```compile_fail
/// # fn holder(drivers: &kpm_csi::CsiDrivers) {
/// drivers.delete("csi.example.com");
/// # }
/// ```
#[derive(Debug, Default)]
pub struct CsiDrivers {
    drivers: RwLock<BTreeMap<String, CsiDriver>>,
}

impl CsiDrivers {
    /// The driver registered under `name`.
    pub fn get(&self, name: &str) -> Option<CsiDriver> {
        self.drivers.read().get(name).cloned()
    }

    /// Every registered driver, sorted by name.
    pub fn list(&self) -> Vec<CsiDriver> {
        self.drivers.read().values().cloned().collect()
    }

    /// The number of registered drivers.
    pub fn len(&self) -> usize {
        self.drivers.read().len()
    }

    /// Whether no driver is registered.
    pub fn is_empty(&self) -> bool {
        self.drivers.read().is_empty()
    }

    /// Stores `driver` under its name, replacing any entry of that name.
    pub(crate) fn set(&self, driver: CsiDriver) {
        self.drivers.write().insert(driver.name.clone(), driver);
    }

    /// Removes the driver registered under `name`, if any, and returns it.
    pub(crate) fn delete(&self, name: &str) -> Option<CsiDriver> {
        self.drivers.write().remove(name)
    }

    /// Removes every driver.
    #[cfg(test)]
    pub(crate) fn clear(&self) {
        self.drivers.write().clear();
    }

    /// The endpoint of the driver registered under `name`, with the kubelet's
    /// errors for an empty or unknown name (`newCsiDriverClient`).
    pub fn endpoint(&self, name: &str) -> Result<String, CsiError> {
        if name.is_empty() {
            return Err(CsiError::EmptyDriverName);
        }
        self.drivers
            .read()
            .get(name)
            .map(|driver| driver.endpoint.clone())
            .ok_or_else(|| CsiError::DriverNotFound { name: name.to_owned() })
    }

    /// Removes the driver registered under `name` only if it is registered at
    /// `endpoint`; returns it if it was removed.
    pub(crate) fn delete_if_endpoint(&self, name: &str, endpoint: &str) -> Option<CsiDriver> {
        let mut drivers = self.drivers.write();
        if drivers.get(name).is_some_and(|driver| driver.endpoint == endpoint) {
            drivers.remove(name)
        } else {
            None
        }
    }

    /// Records what NodeGetInfo returned for the driver registered under
    /// `name` at `endpoint`; false if no such entry exists (any more).
    pub(crate) fn set_node_info(&self, name: &str, endpoint: &str, info: DriverNodeInfo) -> bool {
        match self.drivers.write().get_mut(name) {
            Some(driver) if driver.endpoint == endpoint => {
                driver.node = Some(info);
                true
            }
            _ => false,
        }
    }

    /// Changes the driver registered under `name`, if any.
    pub(crate) fn update(&self, name: &str, change: impl FnOnce(&mut CsiDriver)) {
        if let Some(driver) = self.drivers.write().get_mut(name) {
            change(driver);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver(name: &str, endpoint: &str, version: &str) -> CsiDriver {
        CsiDriver::new(name, endpoint, version.parse().unwrap())
    }

    /// Upstream `TestDriversStore`.
    #[test]
    fn drivers_store_gets_sets_deletes_and_clears() {
        let store = CsiDrivers::default();
        assert_eq!(store.get("a"), None, "absent key");

        let a = driver("a", "/a.sock", "1.0.0");
        store.set(a.clone());
        assert_eq!(store.get("a"), Some(a.clone()), "set then get");

        assert_eq!(store.delete("a"), Some(a.clone()));
        assert_eq!(store.get("a"), None, "deleted");
        assert_eq!(store.delete("a"), None, "deleting an absent key is a no-op");

        store.set(a);
        store.clear();
        assert_eq!(store.get("a"), None, "cleared");
        assert!(store.is_empty());
    }

    #[test]
    fn set_overwrites_and_list_is_sorted_by_name() {
        let store = CsiDrivers::default();
        store.set(driver("b", "/b.sock", "1.0.0"));
        store.set(driver("a", "/a.sock", "1.0.0"));
        store.set(driver("b", "/b2.sock", "1.1.0"));
        let listed = store.list();
        assert_eq!(listed.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(listed[1].endpoint, "/b2.sock");
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn endpoint_lookup_reports_the_kubelets_errors() {
        let store = CsiDrivers::default();
        store.set(driver("a", "/a.sock", "1.0.0"));
        assert_eq!(store.endpoint("a").unwrap(), "/a.sock");
        assert_eq!(store.endpoint("").unwrap_err().to_string(), "driver name is empty");
        assert_eq!(
            store.endpoint("b").unwrap_err().to_string(),
            "driver name b not found in the list of registered CSI drivers"
        );
    }

    #[test]
    fn conditional_updates_only_touch_the_entry_at_that_endpoint() {
        let store = CsiDrivers::default();
        store.set(driver("a", "/new.sock", "1.1.0"));
        let info = DriverNodeInfo {
            node_id: "n".into(),
            max_volumes_per_node: 0,
            topology: BTreeMap::new(),
        };
        assert!(!store.set_node_info("a", "/old.sock", info.clone()));
        assert_eq!(store.delete_if_endpoint("a", "/old.sock"), None);
        assert!(store.set_node_info("a", "/new.sock", info.clone()));
        assert_eq!(store.get("a").unwrap().node, Some(info));
        assert!(store.delete_if_endpoint("a", "/new.sock").is_some());
        assert!(store.is_empty());
    }
}
