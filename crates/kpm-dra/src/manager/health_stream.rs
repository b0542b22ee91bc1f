//! Who streams a driver's device health: the newest instance owns the
//! driver's [`HealthStream`], a new owner starts a new generation, and
//! [`HealthSink`] lets the stream's task (in
//! [`crate::health`]) change the devices only while its generation owns
//! them, publishing each change on the manager's event bus.

use std::sync::{Arc, Weak};
use std::time::SystemTime;

use tokio::time::Instant;
use tracing::debug;

use super::{HealthStream, Shared, State};
use crate::health::{self, DeviceHealthSink, DeviceHealthTable, DeviceReport};

impl Shared {
    /// Hands the driver's health stream to its newest instance: a new
    /// generation streams from it if it has a health service (the devices
    /// seen so far stay until it reports, and expire as they would have);
    /// without one, or without instances, the devices are dropped, and
    /// with them their expiry timer. There is no fallback to an older
    /// instance's health service.
    pub(super) fn update_health(self: &Arc<Self>, state: &mut State, driver: &str) {
        let newest = state.drivers.get(driver).and_then(|instances| instances.last()).cloned();
        let Some(newest) = newest else {
            if let Some(stream) = state.health.remove(driver)
                && let Some(task) = stream.task
            {
                task.abort();
            }
            return;
        };
        if state.health.get(driver).is_some_and(|stream| stream.owner == newest.id) {
            return;
        }
        let (generation, devices) = match state.health.remove(driver) {
            Some(old) => {
                if let Some(task) = old.task {
                    task.abort();
                }
                (old.generation + 1, old.devices)
            }
            None => (1, DeviceHealthTable::default()),
        };
        let stream = match newest.health_service {
            Some(service) => {
                debug!(driver, endpoint = newest.endpoint, %service, generation, "streaming device health");
                let sink = HealthSink {
                    shared: Arc::downgrade(self),
                    driver: driver.to_owned(),
                    generation,
                };
                let task = crate::spawn(health::watch(
                    newest.driver.clone(),
                    newest.endpoint.clone(),
                    service,
                    Arc::clone(&newest.connection),
                    sink,
                    self.health_timers.clone(),
                ));
                HealthStream { owner: newest.id, generation, task, devices }
            }
            None => HealthStream {
                owner: newest.id,
                generation,
                task: None,
                devices: DeviceHealthTable::default(),
            },
        };
        state.health.insert(driver.to_owned(), stream);
    }
}

/// The devices of one generation of a driver's health stream, as its task
/// sees them: reports and expiries of an older generation change nothing.
#[derive(Debug)]
struct HealthSink {
    shared: Weak<Shared>,
    driver: String,
    generation: u64,
}

impl HealthSink {
    /// Applies `change` to the devices, if this generation still owns them,
    /// and publishes its events (under the lock, so in order); the earliest
    /// deadline afterwards.
    fn apply(
        &self,
        change: impl FnOnce(&mut DeviceHealthTable, &str) -> Vec<kpm_cache::PluginEvent>,
    ) -> Option<Instant> {
        let shared = self.shared.upgrade()?;
        let mut state = shared.state.lock();
        let stream = state
            .health
            .get_mut(&self.driver)
            .filter(|stream| stream.generation == self.generation)?;
        for event in change(&mut stream.devices, &self.driver) {
            shared.events.publish(event);
        }
        stream.devices.next_deadline()
    }
}

impl DeviceHealthSink for HealthSink {
    fn report(&self, devices: Vec<DeviceReport>) -> Option<Instant> {
        let (now, wall) = (Instant::now(), SystemTime::now());
        self.apply(|table, driver| table.report(driver, devices, now, wall))
    }

    fn expire(&self) -> Option<Instant> {
        let now = Instant::now();
        self.apply(|table, driver| table.expire(driver, now))
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.apply(|_, _| Vec::new())
    }
}
