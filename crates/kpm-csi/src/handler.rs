//! The `CSIPlugin` handler: the kubelet's CSI `RegistrationHandler`
//! (spec A.4-A.6, A.9).

use std::sync::Arc;

use async_trait::async_trait;
use kpm_cache::{HandlerError, PluginDetails, PluginHandler, ServiceReport};
use kpm_transport::Reach;
use tokio::sync::OwnedMutexGuard;
use tracing::{debug, info, warn};

use crate::client;
use crate::config::CsiConfig;
use crate::error::CsiError;
use crate::locks::NameLocks;
use crate::node_info::NodeInfoSink;
use crate::refresh::{AllocatableUpdatePeriods, Updater};
use crate::store::{CsiDriver, CsiDrivers, DriverNodeInfo};
use crate::version::Version;
use crate::version_rules::highest_supported_version;

/// The handler for `CSIPlugin` plugins. See the [crate docs](crate) for the
/// steps and where they differ from the kubelet.
#[derive(Debug)]
pub struct CsiHandler {
    sink: Arc<dyn NodeInfoSink>,
    config: CsiConfig,
    drivers: Arc<CsiDrivers>,
    locks: Arc<NameLocks>,
    reach: Reach,
    updater: Arc<Updater>,
}

impl CsiHandler {
    /// A handler with an empty drivers store that publishes node info to
    /// `sink` and calls `NodeGetInfo` with permits of the budget of `reach`
    /// (an [`FdBudget`](kpm_transport::fd::FdBudget) alone: on the host
    /// itself). `config` is checked here, once ([`CsiConfig::validate`]).
    pub fn try_new(
        sink: Arc<dyn NodeInfoSink>,
        config: CsiConfig,
        reach: impl Into<Reach>,
    ) -> Result<Self, CsiError> {
        config.validate()?;
        let reach = reach.into();
        let drivers = Arc::<CsiDrivers>::default();
        let locks = Arc::<NameLocks>::default();
        let updater = Arc::new(Updater::new(
            Arc::clone(&sink),
            Arc::clone(&drivers),
            Arc::clone(&locks),
            reach.clone(),
            config.clone(),
        ));
        Ok(Self { sink, config, drivers, locks, reach, updater })
    }

    /// Where the cluster's allocatable update periods (CSIDriver
    /// `nodeAllocatableUpdatePeriodSeconds`) reach the handler.
    pub fn allocatable_update_periods(&self) -> AllocatableUpdatePeriods {
        AllocatableUpdatePeriods::new(Arc::clone(&self.updater))
    }

    /// The registered drivers, shared with the handler, read-only: only the
    /// handler's registrations write them.
    pub fn drivers(&self) -> Arc<CsiDrivers> {
        Arc::clone(&self.drivers)
    }

    /// The handler's settings.
    pub fn config(&self) -> &CsiConfig {
        &self.config
    }

    /// `ValidatePlugin`: checks the versions against the version rules and
    /// the store. No side effects.
    pub fn validate_driver(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<Version, CsiError> {
        info!(plugin = name, endpoint, versions = versions.join(","), "validating CSI driver");
        self.validate_versions("ValidatePlugin", name, versions).map_err(|source| {
            CsiError::Validation {
                name: name.to_owned(),
                endpoint: endpoint.to_owned(),
                source: Box::new(source),
            }
        })
    }

    /// `RegisterPlugin`: validates again, stores the driver, asks it for its
    /// node info and publishes that. On error the driver is removed from the
    /// store and from the node info (also an older registration of the same
    /// name, as in the kubelet).
    pub(crate) async fn register_driver(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), CsiError> {
        info!(plugin = name, endpoint, "registering CSI driver");
        let lock = self.locks.lock(name).await;
        let version = self.validate_versions("RegisterPlugin", name, versions)?;
        self.drivers.set(CsiDriver::new(name, endpoint, version.clone()));
        let mut pending = PendingRegistration {
            name,
            drivers: &self.drivers,
            sink: &self.sink,
            updater: &self.updater,
            lock: Some(lock),
            finished: false,
        };
        let result = match self.install(name, endpoint).await {
            Ok(node) => {
                info!(
                    plugin = name,
                    endpoint,
                    %version,
                    node_id = node.node_id,
                    "registered CSI driver"
                );
                self.drivers.set_node_info(name, endpoint, node);
                self.updater.sync(name);
                Ok(())
            }
            Err(err) => {
                warn!(
                    plugin = name,
                    endpoint,
                    error = %err,
                    "registering CSI driver failed; removing it"
                );
                self.unregister_driver(name).await;
                Err(err)
            }
        };
        pending.finished = true;
        result
    }

    /// `DeRegisterPlugin`: removes the driver from the store and the node
    /// info, but only if it is registered at `endpoint`: the deregistration
    /// of a socket that a newer registration of the same name has replaced
    /// leaves the newer one alone (the kubelet ignores the endpoint).
    pub(crate) async fn deregister_driver(&self, name: &str, endpoint: &str) {
        let _lock = self.locks.lock(name).await;
        if self.drivers.delete_if_endpoint(name, endpoint).is_some() {
            info!(plugin = name, endpoint, "deregistering CSI driver");
            self.updater.sync(name);
            self.uninstall(name).await;
        } else {
            debug!(
                plugin = name,
                endpoint,
                registered_endpoint = self.drivers.get(name).map(|driver| driver.endpoint),
                "CSI driver is not registered at this endpoint; nothing to deregister"
            );
        }
    }

    /// `validateVersions`: the highest supported version, which must be
    /// strictly higher than that of a driver registered under the same name.
    fn validate_versions(
        &self,
        caller: &'static str,
        name: &str,
        versions: &[String],
    ) -> Result<Version, CsiError> {
        if !is_csi_driver_name(name) {
            return Err(CsiError::InvalidDriverName { caller, name: name.to_owned() });
        }
        if versions.is_empty() {
            return Err(CsiError::EmptyVersions { caller, name: name.to_owned() });
        }
        let highest = highest_supported_version(versions).map_err(|source| {
            CsiError::UnsupportedVersions {
                caller,
                name: name.to_owned(),
                versions: versions.to_vec(),
                source: Box::new(source),
            }
        })?;
        if let Some(existing) = self.drivers.get(name)
            && existing.version >= highest
        {
            return Err(CsiError::HigherVersionRegistered {
                caller,
                name: name.to_owned(),
                existing: existing.version,
            });
        }
        Ok(highest)
    }

    /// NodeGetInfo, then `InstallCSIDriver`.
    async fn install(&self, name: &str, endpoint: &str) -> Result<DriverNodeInfo, CsiError> {
        let node = self.node_info(endpoint).await?;
        self.sink.install_driver(name, &node).await?;
        Ok(node)
    }

    /// NodeGetInfo, refused without a node id.
    async fn node_info(&self, endpoint: &str) -> Result<DriverNodeInfo, CsiError> {
        let node =
            client::node_get_info(endpoint, self.config.node_get_info_timeout, self.reach.clone())
                .await?;
        if node.node_id.is_empty() {
            return Err(CsiError::EmptyNodeId);
        }
        Ok(node)
    }

    /// `unregisterDriver`: forgets the driver, whatever its endpoint.
    async fn unregister_driver(&self, name: &str) {
        self.drivers.delete(name);
        self.updater.sync(name);
        self.uninstall(name).await;
    }

    async fn uninstall(&self, name: &str) {
        if let Err(err) = self.sink.uninstall_driver(name).await {
            warn!(plugin = name, error = %err, "removing CSI driver node info failed");
        }
    }
}

/// The refreshes end with the handler (their tasks hold only the parts
/// they use).
impl Drop for CsiHandler {
    fn drop(&mut self) {
        self.updater.stop_all();
    }
}

#[async_trait]
impl PluginHandler for CsiHandler {
    async fn validate(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        self.validate_driver(&plugin.name, &plugin.endpoint.target(), &plugin.versions)?;
        Ok(())
    }

    async fn register(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let endpoint = plugin.endpoint.target();
        Ok(self.register_driver(&plugin.name, &endpoint, &plugin.versions).await?)
    }

    async fn deregister(&self, plugin: &PluginDetails) {
        self.deregister_driver(&plugin.name, &plugin.endpoint.target()).await;
    }

    /// The driver's NodeGetInfo, as registration would call and check it.
    async fn inspect(
        &self,
        plugin: &PluginDetails,
    ) -> Result<Option<Box<dyn ServiceReport>>, HandlerError> {
        Ok(Some(Box::new(self.node_info(&plugin.endpoint.target()).await?)))
    }
}

/// A registration between storing the driver and its outcome, holding the
/// name's lock. Dropped before it is `finished` (the register future was
/// cancelled), it removes the driver from the store and, in a task that
/// keeps holding the lock, from the node info: nothing stays half-registered.
struct PendingRegistration<'a> {
    name: &'a str,
    drivers: &'a CsiDrivers,
    sink: &'a Arc<dyn NodeInfoSink>,
    updater: &'a Arc<Updater>,
    lock: Option<OwnedMutexGuard<()>>,
    finished: bool,
}

impl Drop for PendingRegistration<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        warn!(plugin = self.name, "registering CSI driver was cancelled; removing it");
        self.drivers.delete(self.name);
        self.updater.sync(self.name);
        let lock = self.lock.take();
        let sink = Arc::clone(self.sink);
        let name = self.name.to_owned();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _lock = lock;
                if let Err(err) = sink.uninstall_driver(&name).await {
                    warn!(plugin = name, error = %err, "removing CSI driver node info failed");
                }
            });
        }
    }
}

/// The CSI spec's rule for a driver name: domain-name notation, at most 63
/// characters, alphanumerics with `-` and `.` between.
fn is_csi_driver_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'.')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

#[cfg(test)]
mod tests {
    //! Ports of the kubelet's `TestValidatePlugin` and
    //! `TestValidatePluginExistingDriver`.

    use super::*;
    use crate::InMemoryNodeInfo;

    const ENDPOINT: &str = "/var/log/kubelet/plugins_registry/myplugin/csi.sock";

    fn handler() -> CsiHandler {
        CsiHandler::try_new(
            Arc::new(InMemoryNodeInfo::default()),
            CsiConfig::default(),
            kpm_transport::fd::budget().clone(),
        )
        .unwrap()
    }

    fn list(csv: &str) -> Vec<String> {
        if csv.is_empty() { Vec::new() } else { csv.split(',').map(str::to_owned).collect() }
    }

    fn driver(name: &str, endpoint: &str, versions: &str) -> CsiDriver {
        CsiDriver::new(name, endpoint, highest_supported_version(&list(versions)).unwrap())
    }

    #[test]
    fn validate_plugin_accepts_exactly_the_lists_with_a_one_x_version() {
        let handler = handler();
        let passing = [
            "v1.0.0",
            "0.2.0,v1.0.0",
            "0.2.0,v1.2.3",
            "v1.2.3,v0.3.0",
            "v1.2.3,v0.3.0,2.0.1",
            "v1.2.3,4.9.12,v0.3.0,2.0.1",
            "v1.2.3,boo,v0.3.0,2.0.1",
        ];
        for versions in passing {
            handler
                .validate_driver("test.plugin", ENDPOINT, &list(versions))
                .unwrap_or_else(|err| panic!("{versions}: {err}"));
        }
        let failing = ["0.3.0", "0.2.0", "0.2.0,v0.3.0", "4.9.12,2.0.1", "", "var,boo,foo"];
        for versions in failing {
            let err =
                handler.validate_driver("test.plugin", ENDPOINT, &list(versions)).unwrap_err();
            assert!(
                err.to_string().starts_with(&format!(
                    "validation failed for CSI Driver test.plugin at endpoint {ENDPOINT}: \
                     kubernetes.io/csi: ValidatePlugin for CSI driver \"test.plugin\" failed. "
                )),
                "{versions}: {err}"
            );
        }
        assert!(handler.drivers().is_empty(), "validation has no side effects");
    }

    #[test]
    fn driver_names_follow_the_csi_spec() {
        let handler = handler();
        for name in ["hostpath.csi.k8s.io", "ebs.csi.aws.com", "A", "x-1.Y", &"a".repeat(63)] {
            handler
                .validate_driver(name, ENDPOINT, &list("1.0.0"))
                .unwrap_or_else(|err| panic!("{name}: {err}"));
        }
        for name in ["", "a/b", "../etc", "a\nb", "-a", "a.", "a b", &"a".repeat(64)] {
            let err = handler.validate_driver(name, ENDPOINT, &list("1.0.0")).unwrap_err();
            assert!(err.to_string().contains("The name must be at most 63 characters"), "{err}");
        }
    }

    #[test]
    fn validate_plugin_errors_carry_the_kubelets_texts() {
        let handler = handler();
        let text = |versions: &str| {
            handler
                .validate_driver("test.plugin", ENDPOINT, &list(versions))
                .unwrap_err()
                .to_string()
        };
        let prefix = format!(
            "validation failed for CSI Driver test.plugin at endpoint {ENDPOINT}: \
             kubernetes.io/csi: ValidatePlugin for CSI driver \"test.plugin\" failed."
        );
        assert_eq!(
            text(""),
            format!("{prefix} Plugin returned an empty list for supported versions")
        );
        assert_eq!(
            text("0.2.0,v0.3.0"),
            format!(
                "{prefix} None of the versions specified [\"0.2.0\" \"v0.3.0\"] are supported. \
                 err=highest supported version reported is 0.3.0, must be v1.x"
            )
        );
        assert_eq!(
            text("var,boo"),
            format!(
                "{prefix} None of the versions specified [\"var\" \"boo\"] are supported. \
                 err=could not find a highest supported version from versions ([var boo]) \
                 reported: could not parse \"var\" as version"
            )
        );
        handler.drivers().set(driver("test.plugin", ENDPOINT, "v1.2.0"));
        assert_eq!(
            text("v1.2"),
            format!(
                "{prefix} Another driver with the same name is already registered with a higher \
                 supported version: \"1.2.0\""
            )
        );
    }

    #[test]
    fn validate_plugin_with_an_existing_driver_needs_another_name_or_a_higher_version() {
        struct Case {
            name: &'static str,
            existing: CsiDriver,
            driver: (&'static str, &'static str, &'static str),
            pass: bool,
        }
        let cases = [
            Case {
                name: "(a) different name, same version",
                existing: driver("test.plugin", ENDPOINT, "v1.0.0"),
                driver: ("test.plugin2", ENDPOINT, "v1.0.0"),
                pass: true,
            },
            Case {
                name: "(b) same name, same version",
                existing: driver("test.plugin", ENDPOINT, "v1.0.0"),
                driver: ("test.plugin", ENDPOINT, "v1.0.0"),
                pass: false,
            },
            Case {
                name: "(c) same name, higher version",
                existing: driver(
                    "test.plugin",
                    "/var/log/kubelet/plugins/myplugin/csi.sock",
                    "v0.3.0,v0.2.0,v1.0.0",
                ),
                driver: ("test.plugin", ENDPOINT, "v1.0.1"),
                pass: true,
            },
        ];
        let handler = handler();
        for case in cases {
            handler.drivers().clear();
            handler.drivers().set(case.existing);
            let (name, endpoint, versions) = case.driver;
            let result = handler.validate_driver(name, endpoint, &list(versions));
            assert_eq!(result.is_ok(), case.pass, "{}: {result:?}", case.name);
        }
    }

    #[test]
    fn the_default_node_get_info_timeout_is_the_kubelets_two_minutes() {
        assert_eq!(CsiConfig::default().node_get_info_timeout, std::time::Duration::from_secs(120));
        assert_eq!(handler().config(), &CsiConfig::default());
    }
}
