//! The public [`Watcher`]: start-up (every step returns a typed error) and
//! the task that applies events, overflow rescans and periodic resyncs.

use kpm_api::config::check_durations;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kpm_cache::DesiredState;
use notify::{Config, Event, RecommendedWatcher, RecursiveMode, Watcher as _};
use tokio::runtime::Handle;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::error::{WatcherError, create_watcher_error, watch_error};
use crate::tree::{Resync, Tree, create_root, watch_tree};

/// The default period of the safety-net resync.
pub const DEFAULT_RESYNC_PERIOD: Duration = Duration::from_secs(60);

/// Events buffered between notify's thread and the watcher task. When the
/// buffer is full, events are dropped and the tree is rescanned instead.
const EVENT_QUEUE: usize = 4096;

/// How the watcher behaves. Build it from [`Default`] with the setters;
/// the fields are public to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatcherConfig {
    /// How often the whole tree is listed again and diffed against
    /// DesiredState, to repair anything the events missed.
    /// [`Duration::ZERO`] turns the periodic resync off (overflow rescans
    /// and [`Watcher::rescan`] still work). At most
    /// [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION) (365 days).
    pub resync_period: Duration,
}

impl Default for WatcherConfig {
    fn default() -> Self {
        Self { resync_period: DEFAULT_RESYNC_PERIOD }
    }
}

impl WatcherConfig {
    /// Sets [`resync_period`](Self::resync_period) (default
    /// [`DEFAULT_RESYNC_PERIOD`], 60 s; zero: no periodic resync).
    #[must_use]
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.resync_period = period;
        self
    }

    /// Checks the ranges [`Watcher::start`] relies on: `resync_period` at
    /// most [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION) (zero is allowed: no periodic resync).
    pub fn validate(&self) -> Result<(), WatcherError> {
        Ok(check_durations(&[], &[("resync_period", self.resync_period)])?)
    }
}

/// What a [`Watcher`] has done, for metrics: [`Watcher::stats`]. Clones
/// share the counters, so one taken at start keeps counting.
#[derive(Debug, Clone, Default)]
pub struct WatcherStats {
    rescans: Arc<AtomicU64>,
}

impl WatcherStats {
    /// Full re-listings of the tree so far (start-up excluded): overflows,
    /// periodic resyncs and requested rescans.
    pub fn rescans(&self) -> u64 {
        self.rescans.load(Ordering::Relaxed)
    }

    pub(crate) fn count_rescan(&self) {
        self.rescans.fetch_add(1, Ordering::Relaxed);
    }
}

enum Command {
    /// Resync now and answer when done.
    Rescan(oneshot::Sender<()>),
}

/// Keeps a [`DesiredState`] equal to the registration sockets under a
/// registry directory. Started with [`Watcher::start`]; stopped with
/// [`Watcher::stop`] or by dropping it.
#[derive(Debug)]
pub struct Watcher {
    root: PathBuf,
    commands: mpsc::UnboundedSender<Command>,
    /// Dropping the sender (on `stop` or drop) ends the task.
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    stats: WatcherStats,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Rescan(_) => f.write_str("Rescan"),
        }
    }
}

impl Watcher {
    /// Starts watching `root`, in this order: `mkdir -p root` (mode 0750);
    /// create the inotify watcher; watch `root` recursively (a directory
    /// below that cannot be watched costs only its own subtree) and its
    /// parent, for the root's own removal; list the tree
    /// into `desired`; spawn the task that applies events on the current
    /// tokio runtime. A socket created during start-up is registered exactly
    /// once: the watch exists before the listing, and a socket seen by both
    /// is recognised by its inode.
    ///
    /// Every failure is returned, naming the path and the step; an exhausted
    /// inotify limit is [`WatcherError::WatchLimit`]. Nothing keeps running
    /// after an error.
    ///
    /// The config is checked first ([`WatcherConfig::validate`]). Must be
    /// called within a tokio runtime ([`WatcherError::NoRuntime`]
    /// otherwise). The creation and the listing run on the calling thread:
    /// short, blocking file-system calls, as a registry directory is small.
    pub fn start(
        root: impl Into<PathBuf>,
        desired: Arc<DesiredState>,
        config: WatcherConfig,
    ) -> Result<Self, WatcherError> {
        config.validate()?;
        let root = root.into();
        let runtime =
            Handle::try_current().map_err(|_| WatcherError::NoRuntime { path: root.clone() })?;
        let root = std::path::absolute(&root)
            .map_err(|source| WatcherError::ResolveRoot { path: root.clone(), source })?;

        create_root(&root)
            .map_err(|source| WatcherError::CreateRoot { path: root.clone(), source })?;

        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
        let overflow = Arc::new(Notify::new());
        let forward = forwarder(events_tx, Arc::clone(&overflow));
        let mut notify =
            RecommendedWatcher::new(forward, Config::default().with_follow_symlinks(false))
                .map_err(|source| create_watcher_error(&root, source))?;
        let mut unwatched = BTreeSet::new();
        watch_tree(&mut notify, &root, &mut unwatched)
            .map_err(|source| watch_error(&root, source))?;
        // inotify reports the root's own removal on the root only once the
        // last reference to it is gone, and a plugin's listening socket in it
        // is one; its parent reports the removal at once.
        if let Some(parent) = root.parent()
            && let Err(error) = notify.watch(parent, RecursiveMode::NonRecursive)
        {
            tracing::warn!(
                parent = %parent.display(), %error,
                "cannot watch the registry's parent; a removed registry is noticed by the resync"
            );
        }

        let stats = WatcherStats::default();
        let mut tree =
            Tree::new(root.clone(), desired, notify, unwatched).with_stats(stats.clone());
        tree.initial_scan().map_err(|source| WatcherError::List { path: root.clone(), source })?;
        tracing::info!(root = %root.display(), "watching registry directory");

        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (shutdown, shutdown_rx) = oneshot::channel();
        let task = runtime.spawn(run(tree, events_rx, overflow, commands_rx, shutdown_rx, config));
        Ok(Self { root, commands, shutdown: Some(shutdown), task: Some(task), stats })
    }

    /// The registry directory, made absolute.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The watcher's counters, shared: a clone keeps counting after the
    /// watcher is stopped or dropped (and then stays still).
    pub fn stats(&self) -> WatcherStats {
        self.stats.clone()
    }

    /// Lists the whole tree again and diffs it against DesiredState now,
    /// as the periodic resync does; returns when that is done.
    pub async fn rescan(&self) -> Result<(), WatcherError> {
        let stopped = || WatcherError::Stopped { path: self.root.clone() };
        let (done, done_rx) = oneshot::channel();
        self.commands.send(Command::Rescan(done)).map_err(|_| stopped())?;
        done_rx.await.map_err(|_| stopped())
    }

    /// Stops the task and releases the inotify watches; returns when the
    /// task has ended. DesiredState keeps its entries.
    pub async fn stop(mut self) {
        drop(self.shutdown.take());
        if let Some(task) = self.task.take() {
            // The task never panics; a cancelled one (runtime shutting down) is stopped too.
            let _ = task.await;
        }
    }
}

/// The event handler run on notify's thread: it only forwards. A full queue
/// means events are lost, which the task repairs with a rescan.
fn forwarder(
    events: mpsc::Sender<notify::Result<Event>>,
    overflow: Arc<Notify>,
) -> impl FnMut(notify::Result<Event>) + Send + 'static {
    move |event| {
        if let Err(mpsc::error::TrySendError::Full(_)) = events.try_send(event) {
            overflow.notify_one();
        }
    }
}

async fn run(
    mut tree: Tree,
    mut events: mpsc::Receiver<notify::Result<Event>>,
    overflow: Arc<Notify>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    mut shutdown: oneshot::Receiver<()>,
    config: WatcherConfig,
) {
    let resync_period = config.resync_period;
    // `start` validated the period: `now + period` cannot overflow.
    let mut periodic = (!resync_period.is_zero()).then(|| {
        let mut interval = tokio::time::interval_at(Instant::now() + resync_period, resync_period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        interval
    });
    loop {
        // Rare work first, so that an event storm cannot starve a rescan.
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            () = overflow.notified() => tree.resync(Resync::Overflow),
            Some(Command::Rescan(done)) = commands.recv() => {
                tree.resync(Resync::Requested);
                let _ = done.send(());
            }
            () = tick(periodic.as_mut()) => tree.resync(Resync::Periodic),
            Some(event) = events.recv() => match event {
                Ok(event) => tree.handle_event(&event),
                Err(error) => tree.handle_error(&error),
            },
        }
    }
    tracing::debug!(?tree, "watcher stopped");
}

async fn tick(interval: Option<&mut Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_asks_for_a_rescan_instead_of_blocking() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let (tx, mut rx) = mpsc::channel(1);
            let overflow = Arc::new(Notify::new());
            let mut forward = forwarder(tx, Arc::clone(&overflow));
            forward(Ok(Event::default()));
            forward(Ok(Event::default())); // dropped: the queue holds one
            let asked = tokio::time::timeout(Duration::from_secs(5), overflow.notified()).await;
            assert!(asked.is_ok(), "overflow was signalled");
            assert!(rx.recv().await.is_some());
            assert!(rx.try_recv().is_err(), "the second event was dropped");
        });
    }

    #[test]
    fn default_resync_period_is_a_minute() {
        assert_eq!(WatcherConfig::default().resync_period, Duration::from_secs(60));
    }
}
