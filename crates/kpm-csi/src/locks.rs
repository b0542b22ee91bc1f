//! Serialising the calls for one driver name.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::OwnedMutexGuard;

/// One async lock per driver name, so that registrations and deregistrations
/// of one name (from different sockets) run one at a time: two sockets
/// reporting the same name and version cannot both pass validation.
#[derive(Debug, Default)]
pub(crate) struct NameLocks(parking_lot::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl NameLocks {
    pub(crate) async fn lock(&self, name: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.0.lock();
            // Locks nobody holds or waits for are dropped.
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
            Arc::clone(locks.entry(name.to_owned()).or_default())
        };
        lock.lock_owned().await
    }
}
