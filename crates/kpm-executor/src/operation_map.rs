//! `OperationMap`: at most one operation per key (socket path) at a time, and
//! exponential backoff between failed attempts on a key. The semantics of the
//! kubelet's goroutinemap, minus its leaks and lost wake-ups.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kpm_cache::{ChangeSignal, Changes, EventBus, PluginEvent};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::isolation::panic_message;
use crate::{ExecutorError, ExponentialBackoff};

/// Runs operations keyed by socket path.
///
/// - A second [`start`](Self::start) on a key whose operation still runs
///   returns [`ExecutorError::AlreadyRunning`].
/// - After a failure, a start before the backoff expires returns
///   [`ExecutorError::Backoff`]; an error that [`is_permanent`](ExecutorError::is_permanent)
///   blocks the key until [`reset_backoff`](Self::reset_backoff) or
///   [`forget`](Self::forget) ([`ExecutorError::FailedPermanently`]).
/// - A success drops the key's entry, which resets its backoff.
/// - A panic inside an operation is caught and counted as a failure.
/// - Every completion (success, failure, panic) records its key in a journal
///   that one consumer, the reconciler, drains with
///   [`take_completed`](Self::take_completed).
#[derive(Debug, Clone)]
pub struct OperationMap {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    entries: Mutex<HashMap<PathBuf, Entry>>,
    backoff: ExponentialBackoff,
    /// Keys whose operation completed since the last `take_completed`.
    completed: Mutex<HashSet<PathBuf>>,
    completions: ChangeSignal,
    events: EventBus,
}

#[derive(Debug, Default)]
struct Entry {
    pending: bool,
    failure: Option<Failure>,
    /// Set by `reset_backoff` or `forget` while the operation runs: its
    /// outcome belongs to a socket incarnation that is gone, so it must not
    /// start a backoff for the next one.
    discard_outcome: bool,
}

/// What is known about a key's operations, for status reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationStatus {
    /// An operation is running.
    pub pending: bool,
    /// The error of the last failed operation, if the key is backing off or
    /// failed permanently.
    pub last_error: Option<String>,
    /// When the next attempt is permitted; `None` with an error: never (until
    /// the socket is re-created).
    pub retry_at: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Failure {
    wait: Duration,
    /// `None` for a permanent failure.
    retry_at: Option<Instant>,
    error: String,
}

impl Default for OperationMap {
    fn default() -> Self {
        Self::new(ExponentialBackoff::default())
    }
}

impl OperationMap {
    /// An empty map that backs off failed keys by `backoff`, publishing no
    /// events.
    pub fn new(backoff: ExponentialBackoff) -> Self {
        Self::with_events(backoff, EventBus::default())
    }

    /// Like [`new`](Self::new), publishing a [`PluginEvent::RetryScheduled`]
    /// on `events` after each failure that will be retried.
    pub fn with_events(backoff: ExponentialBackoff, events: EventBus) -> Self {
        Self {
            shared: Arc::new(Shared {
                entries: Mutex::new(HashMap::new()),
                backoff,
                completed: Mutex::new(HashSet::new()),
                completions: ChangeSignal::default(),
                events,
            }),
        }
    }

    /// Starts `operation` under `key` on the current tokio runtime, unless an
    /// operation on `key` is running or the key is backing off.
    pub fn start<F>(&self, key: &Path, operation: F) -> Result<(), ExecutorError>
    where
        F: Future<Output = Result<(), ExecutorError>> + Send + 'static,
    {
        {
            let mut entries = self.shared.entries.lock();
            let entry = entries.entry(key.to_path_buf()).or_default();
            if entry.pending {
                return Err(ExecutorError::AlreadyRunning { socket: key.to_path_buf() });
            }
            if let Some(failure) = &entry.failure {
                match failure.retry_at {
                    None => {
                        return Err(ExecutorError::FailedPermanently {
                            socket: key.to_path_buf(),
                            last_error: failure.error.clone(),
                        });
                    }
                    Some(until) if Instant::now() < until => {
                        return Err(ExecutorError::Backoff {
                            socket: key.to_path_buf(),
                            until,
                            wait: failure.wait,
                            last_error: failure.error.clone(),
                        });
                    }
                    Some(_) => {}
                }
            }
            entry.pending = true;
        }

        let shared = Arc::clone(&self.shared);
        let key = key.to_path_buf();
        // The inner task isolates panics: its JoinError carries them.
        let task = tokio::spawn(operation);
        tokio::spawn(async move {
            let outcome = match task.await {
                Ok(result) => result,
                Err(join) => Err(ExecutorError::Panicked {
                    socket: key.clone(),
                    message: panic_message(join),
                }),
            };
            shared.complete(&key, outcome);
        });
        Ok(())
    }

    /// The key's state; `None` if nothing runs and nothing failed.
    pub fn status(&self, key: &Path) -> Option<OperationStatus> {
        let entries = self.shared.entries.lock();
        let entry = entries.get(key)?;
        Some(OperationStatus {
            pending: entry.pending,
            last_error: entry.failure.as_ref().map(|failure| failure.error.clone()),
            retry_at: entry.failure.as_ref().and_then(|failure| failure.retry_at),
        })
    }

    /// Whether an operation on `key` is running.
    pub fn is_pending(&self, key: &Path) -> bool {
        self.shared.entries.lock().get(key).is_some_and(|entry| entry.pending)
    }

    /// When the key's backoff expires, if it is backing off (not running, not
    /// permanently failed).
    pub fn retry_at(&self, key: &Path) -> Option<Instant> {
        let entries = self.shared.entries.lock();
        let entry = entries.get(key).filter(|entry| !entry.pending)?;
        entry.failure.as_ref().and_then(|failure| failure.retry_at)
    }

    /// Clears the key's backoff, so that the next start runs at once. Used when
    /// a socket path gets a new incarnation: it must not inherit the old
    /// one's failures. If an operation is running, its outcome is discarded.
    pub fn reset_backoff(&self, key: &Path) {
        let mut entries = self.shared.entries.lock();
        match entries.get_mut(key) {
            Some(entry) if entry.pending => {
                entry.failure = None;
                entry.discard_outcome = true;
            }
            Some(_) => {
                entries.remove(key);
            }
            None => {}
        }
    }

    /// Drops everything known about a key whose socket is gone, so that
    /// vanished sockets leave no entries behind. A running operation finishes,
    /// then its entry is dropped whatever the outcome.
    pub fn forget(&self, key: &Path) {
        self.reset_backoff(key);
    }

    /// Number of keys with a running or failed operation.
    pub fn len(&self) -> usize {
        self.shared.entries.lock().len()
    }

    /// Whether no key has a running or failed operation.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A subscription that wakes whenever an operation completes.
    pub fn completions(&self) -> Changes {
        self.shared.completions.subscribe()
    }

    /// Drains the journal: every key whose operation completed since the
    /// previous call, once each, in no particular order. The journal is
    /// written after the key's entry and before [`completions`](Self::completions)
    /// wakes, so a consumer that drains after each wake-up sees every outcome.
    /// There must be one consumer only (the reconciler): another one would
    /// take its completions away. Undrained, it holds at most one entry per key.
    pub fn take_completed(&self) -> Vec<PathBuf> {
        self.shared.completed.lock().drain().collect()
    }

    /// Waits until no key has an entry: every operation finished and none
    /// is backing off.
    pub async fn wait(&self) {
        self.wait_until(HashMap::is_empty).await;
    }

    /// Waits until no operation is running; failed entries may remain.
    pub async fn wait_for_completion(&self) {
        self.wait_until(|entries| entries.values().all(|entry| !entry.pending)).await;
    }

    async fn wait_until(&self, done: impl Fn(&HashMap<PathBuf, Entry>) -> bool) {
        // Subscribe before checking, so a completion in between is not missed.
        let mut completions = self.completions();
        while !done(&self.shared.entries.lock()) {
            completions.changed().await;
        }
    }
}

impl Shared {
    fn complete(&self, key: &Path, outcome: Result<(), ExecutorError>) {
        {
            let mut entries = self.entries.lock();
            let Some(entry) = entries.get_mut(key) else { return };
            match outcome {
                Ok(()) => {
                    entries.remove(key);
                }
                Err(_) if entry.discard_outcome => {
                    entries.remove(key);
                }
                Err(error) => {
                    let wait = self.backoff.next(entry.failure.as_ref().map(|f| f.wait));
                    // `wait` is at most the backoff's max, itself at most
                    // MAX_CONFIG_DURATION: the sum cannot overflow.
                    let retry_at = (!error.is_permanent()).then(|| Instant::now() + wait);
                    if retry_at.is_some() {
                        tracing::warn!(
                            socket = %key.display(), ?wait, %error,
                            "operation failed; no retries permitted until the backoff expires"
                        );
                        self.events.publish(PluginEvent::RetryScheduled {
                            socket: key.to_path_buf(),
                            after: wait,
                        });
                    } else {
                        tracing::warn!(
                            socket = %key.display(), %error,
                            "operation failed permanently for this socket incarnation"
                        );
                    }
                    *entry = Entry {
                        pending: false,
                        failure: Some(Failure { wait, retry_at, error: error.to_string() }),
                        discard_outcome: false,
                    };
                }
            }
        }
        self.completed.lock().insert(key.to_path_buf());
        self.completions.bump();
    }
}

#[cfg(test)]
mod tests;
