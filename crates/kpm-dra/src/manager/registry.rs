//! The registry of drivers: `ValidatePlugin`, `RegisterPlugin` and
//! `DeRegisterPlugin` on a driver's instances, the choice of the instance
//! calls go to (`GetPlugin`), and the queueing of the cleanups of drivers
//! that left resources behind.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use kpm_api::gotext::error_chain;
use parking_lot::Mutex;
use tracing::{debug, info, trace};

use super::{DraManager, Instance, State, monitor};
use crate::connection::Connection;
use crate::error::DraError;
use crate::validate::{HealthService, validate_plugin};

impl DraManager {
    /// `ValidatePlugin`: the driver name, the endpoint and the advertised
    /// services. No side effects.
    pub fn validate_plugin(
        &self,
        driver: &str,
        endpoint: &str,
        services: &[String],
    ) -> Result<(), DraError> {
        debug!(driver, endpoint, services = services.join(","), "validating DRA driver plugin");
        validate_plugin(driver, endpoint, services, self.root_dir())?;
        Ok(())
    }

    /// `RegisterPlugin`: validates again, dials the endpoint (a failure is
    /// not an error: the instance starts disconnected and its monitor keeps
    /// trying), adds the instance after the driver's others, starts its
    /// monitor and updates the driver's cleanup and health stream.
    pub(crate) async fn register_plugin(
        &self,
        driver: &str,
        endpoint: &str,
        services: &[String],
    ) -> Result<(), DraError> {
        let (service, health_service) =
            validate_plugin(driver, endpoint, services, self.root_dir())?;
        self.shared.state.lock().check_can_add(driver, endpoint)?;

        let connection = Arc::new(Connection::new(Path::new(endpoint), self.shared.reach.clone()));
        match connection.reconnect().await {
            Ok(true) => {}
            Ok(false) => {
                info!(
                    driver,
                    endpoint, "the DRA driver plugin accepted the connection but sent nothing yet"
                );
            }
            Err(err) => {
                info!(
                    driver,
                    endpoint,
                    error = error_chain(&err),
                    "cannot connect to the DRA driver plugin yet; will keep trying"
                );
            }
        }

        let shared = &self.shared;
        let mut state = shared.state.lock();
        state.check_can_add(driver, endpoint)?;
        state.next_id += 1;
        let connected = connection.is_connected();
        let instance = Arc::new(Instance {
            id: state.next_id,
            driver: driver.to_owned(),
            endpoint: endpoint.to_owned(),
            service,
            health_service,
            registered_at: SystemTime::now(),
            connection,
            monitor: Mutex::new(None),
        });
        let instances = state.drivers.entry(driver.to_owned()).or_default();
        instances.push(Arc::clone(&instance));
        let count = instances.len();
        *instance.monitor.lock() =
            crate::spawn(monitor::run(Arc::downgrade(shared), Arc::clone(&instance), connected));
        info!(
            driver,
            endpoint,
            %service,
            health_service = health_service.map(HealthService::as_str),
            connected,
            instances = count,
            "registered DRA driver plugin"
        );
        shared.sync(&mut state, driver);
        Ok(())
    }

    /// `DeRegisterPlugin`: removes the instance at `endpoint` only (a no-op
    /// if there is none), stops its monitor and updates the driver's
    /// cleanup and health stream; its connection is closed.
    pub(crate) fn deregister_plugin(&self, driver: &str, endpoint: &str) {
        let removed = {
            let mut state = self.shared.state.lock();
            let Some(instances) = state.drivers.get_mut(driver) else {
                debug!(driver, endpoint, "DRA driver is not registered; nothing to deregister");
                return;
            };
            let Some(index) = instances.iter().position(|i| i.endpoint == endpoint) else {
                debug!(
                    driver,
                    endpoint,
                    "DRA driver is not registered at this endpoint; nothing to deregister"
                );
                return;
            };
            let removed = instances.remove(index);
            let remaining = instances.len();
            if remaining == 0 {
                state.drivers.remove(driver);
            }
            if let Some(monitor) = removed.monitor.lock().take() {
                monitor.abort();
            }
            info!(driver, endpoint, remaining, "deregistered DRA driver plugin");
            if !state.shut_down {
                self.shared.sync(&mut state, driver);
            }
            removed
        };
        // Closes the connection (once no call in flight uses it), outside the lock.
        drop(removed);
    }

    /// The kubelet wipes all of the node's ResourceSlices when it starts;
    /// kpm gives their drivers the grace period first: it asks the cleanup
    /// which drivers have published resources for this node and queues the
    /// cleanup of each one that has not registered, so that a driver
    /// registering within the grace period keeps its slices. Call it once,
    /// at start, within a tokio runtime (`Kubelet::run` does).
    pub async fn clean_up_leftovers(&self) {
        let drivers = self.shared.timers.cleanup().published_drivers().await;
        let state = self.shared.state.lock();
        if state.shut_down {
            return;
        }
        for driver in drivers.iter().filter(|driver| !state.drivers.contains_key(*driver)) {
            info!(driver, "the DRA driver has resources on this node but is not registered");
            self.shared.timers.update(driver, false);
        }
    }

    /// `GetPlugin`: the instance calls go to.
    pub(super) fn serving(&self, driver: &str) -> Result<Arc<Instance>, DraError> {
        if driver.is_empty() {
            return Err(DraError::EmptyDriverName);
        }
        let state = self.shared.state.lock();
        if state.shut_down {
            return Err(DraError::ShutDown);
        }
        let instances = state
            .drivers
            .get(driver)
            .ok_or_else(|| DraError::NotRegistered { driver: driver.to_owned() })?;
        // The newest connected instance, else the newest. After a restart of
        // the node agent the registration order is random; usually the
        // newest is the most recently started.
        let serving = instances
            .iter()
            .rev()
            .find(|instance| instance.connection.is_connected())
            .or_else(|| instances.last())
            .cloned()
            .ok_or_else(|| DraError::NotRegistered { driver: driver.to_owned() })?;
        trace!(driver, endpoint = serving.endpoint, "serving DRA driver instance");
        Ok(serving)
    }

    fn root_dir(&self) -> Option<&Path> {
        self.shared.config.root_dir.as_deref()
    }
}

impl State {
    /// The manager takes registrations and this (driver, endpoint) is new.
    fn check_can_add(&self, driver: &str, endpoint: &str) -> Result<(), DraError> {
        if self.shut_down {
            return Err(DraError::ShutDown);
        }
        let taken = self
            .drivers
            .get(driver)
            .is_some_and(|instances| instances.iter().any(|i| i.endpoint == endpoint));
        if taken {
            return Err(DraError::AlreadyRegistered {
                driver: driver.to_owned(),
                endpoint: endpoint.to_owned(),
            });
        }
        Ok(())
    }
}
