//! The monitor task of an instance's connection: it reports every change
//! to the manager, which re-syncs the driver (its cleanup and health
//! stream) and reports a drop as a hangup, and redials while the
//! connection is down.

use std::sync::{Arc, Weak};

use kpm_api::gotext::error_chain;
use tracing::{debug, info, trace};

use super::{Instance, Shared};
use crate::connection::RECONNECT_INTERVAL;

/// Watches one instance's connection: reports every change to the manager
/// (which re-syncs the driver) and, while it is down, dials again every
/// [`RECONNECT_INTERVAL`]. `reported` is the state the registration synced.
pub(super) async fn run(shared: Weak<Shared>, instance: Arc<Instance>, reported: bool) {
    let mut live = instance.connection.subscribe();
    let mut reported = reported;
    let mut failures: u64 = 0;
    loop {
        let connected = *live.borrow_and_update() > 0;
        if connected != reported {
            reported = connected;
            let Some(shared) = shared.upgrade() else { return };
            shared.connection_changed(&instance, connected);
        }
        if connected {
            failures = 0;
            if live.changed().await.is_err() {
                return;
            }
            continue;
        }
        let (driver, endpoint) = (instance.driver.as_str(), instance.endpoint.as_str());
        match instance.connection.reconnect().await {
            Ok(true) => continue,
            Ok(false) => {
                debug!(driver, endpoint, "reconnected, but the DRA driver plugin sent nothing");
            }
            Err(error) if failures == 0 => {
                debug!(
                    driver,
                    endpoint,
                    error = error_chain(&error),
                    "reconnecting failed; retrying"
                );
            }
            Err(error) => {
                trace!(
                    driver,
                    endpoint,
                    error = error_chain(&error),
                    "reconnecting failed; retrying"
                );
            }
        }
        failures += 1;
        tokio::time::sleep(RECONNECT_INTERVAL).await;
    }
}

impl Shared {
    /// A monitor saw the instance's connection come or go.
    fn connection_changed(self: &Arc<Self>, instance: &Instance, connected: bool) {
        let mut state = self.state.lock();
        let registered = state
            .drivers
            .get(&instance.driver)
            .is_some_and(|instances| instances.iter().any(|i| i.id == instance.id));
        if state.shut_down || !registered {
            return;
        }
        let (driver, endpoint) = (instance.driver.as_str(), instance.endpoint.as_str());
        if connected {
            info!(driver, endpoint, "connected to DRA driver plugin");
        } else {
            info!(driver, endpoint, "lost the connection to DRA driver plugin");
            self.hangups.report(endpoint);
        }
        self.sync(&mut state, driver);
    }
}
