//! The removal of a resource whose endpoint went away: a tokio timer per
//! resource, started when the endpoint's stream ends or it is deregistered,
//! cancelled when a plugin registers again, and carrying a token so that
//! only the resource's latest timer may remove it. The kubelet checks the
//! grace period only when it next reads capacity; a timer removes the
//! resource when the period ends and lets the status say when.

use std::time::SystemTime;

use tokio::task::JoinHandle;
use tracing::info;

use super::{DeviceManager, Resource};

/// A pending removal, while a resource is in its grace period.
#[derive(Debug)]
pub(super) struct Removal {
    /// Which timer this is: a timer whose token is no longer the resource's
    /// pending removal does nothing when it fires.
    token: u64,
    /// When the timer fires, if representable.
    pub(super) at: Option<SystemTime>,
    /// The timer; aborting it cancels the removal.
    pub(super) timer: JoinHandle<()>,
}

impl DeviceManager {
    /// Starts the grace timer of a resource whose endpoint went away.
    pub(super) fn schedule_removal(&self, resource: &str, entry: &mut Resource) {
        if let Some(old) = entry.removal.take() {
            old.timer.abort();
        }
        let token = self.next_id();
        let grace = self.config.grace_period;
        let manager = self.this.clone();
        let name = resource.to_owned();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if let Some(manager) = manager.upgrade() {
                manager.expire(&name, token);
            }
        });
        entry.removal = Some(Removal { token, at: SystemTime::now().checked_add(grace), timer });
    }

    /// The grace timer `token` fired: removes the resource if that timer is
    /// still its pending removal and no endpoint has registered since.
    fn expire(&self, resource: &str, token: u64) {
        let mut state = self.state.lock();
        let due = state.resources.get(resource).is_some_and(|entry| {
            entry.current.is_none()
                && entry.removal.as_ref().is_some_and(|removal| removal.token == token)
        });
        if !due {
            return;
        }
        state.resources.remove(resource);
        drop(state);
        info!(
            resource,
            grace_period = ?self.config.grace_period,
            "device plugin resource removed: no endpoint registered within the grace period"
        );
        self.changed();
    }
}
