//! A change counter that many tasks can wait on without polling and without
//! missing a wake-up (the goroutinemap condition variable woke only one).

use tokio::sync::watch;

/// The sending side, owned by a cache: every mutation calls [`ChangeSignal::bump`].
#[derive(Debug)]
pub struct ChangeSignal {
    tx: watch::Sender<u64>,
}

/// A subscription: [`Changes::changed`] returns once the cache has changed
/// since the subscription was made or since the previous `changed` returned.
#[derive(Debug, Clone)]
pub struct Changes {
    rx: watch::Receiver<u64>,
}

impl Default for ChangeSignal {
    fn default() -> Self {
        Self { tx: watch::Sender::new(0) }
    }
}

impl ChangeSignal {
    /// Records one change and wakes every subscriber.
    pub fn bump(&self) {
        self.tx.send_modify(|count| *count = count.wrapping_add(1));
    }

    /// A subscription that wakes on the changes made after this call.
    pub fn subscribe(&self) -> Changes {
        Changes { rx: self.tx.subscribe() }
    }

    /// How many changes were recorded so far (wrapping).
    pub fn count(&self) -> u64 {
        *self.tx.borrow()
    }
}

impl Changes {
    /// Waits for the next change. Changes made while nobody waited are not
    /// lost: they are coalesced into one wake-up.
    pub async fn changed(&mut self) {
        // The sender lives as long as the cache; if the cache is gone there is
        // nothing left to wait for, so park forever instead of spinning.
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn changes_are_coalesced_and_never_missed() {
        let signal = ChangeSignal::default();
        let mut a = signal.subscribe();
        let mut b = signal.subscribe();
        signal.bump();
        signal.bump();
        // Both subscribers see the change (broadcast, not signal-one).
        a.changed().await;
        b.changed().await;
        // Two bumps made before the wait count as one wake-up.
        let waited = tokio::time::timeout(std::time::Duration::from_secs(1), a.changed()).await;
        assert!(waited.is_err(), "no further change was made");
    }
}
