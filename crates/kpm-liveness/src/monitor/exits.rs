//! Exits and dropped connections: the process serving each followed
//! plugin's socket is watched with a pidfd (see [`crate::exits`]); when it
//! exits, or a connection a handler holds to the plugin drops, the socket
//! is checked at once, and a socket nobody serves any more has its plugin
//! registered anew. One still served is left to the probes.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use kpm_cache::Generation;
use tokio::task::AbortHandle;

use super::{Done, State};
use crate::exits::{Exit, wait_for_exit};
use crate::probe::{Reachability, reach};

/// When a dropped connection's socket still answered, how long before it is
/// looked at once more: a process being killed drops its connections first
/// and may close its listener a while later on a loaded machine.
const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// A watched process and the sockets it serves.
#[derive(Debug)]
pub(super) struct Watched {
    sockets: HashSet<PathBuf>,
    watch: AbortHandle,
}

impl State<'_> {
    /// Whether exits are to be watched: asked for, and the kernel has pidfds.
    pub(super) fn exits_watchable(&self) -> bool {
        self.monitor.config.watch_exits && !self.monitor.counters.no_pidfd.load(Ordering::Relaxed)
    }

    /// Adds `socket` to the sockets of process `pid`, watching it if new.
    pub(super) fn watch(&mut self, pid: u32, socket: &Path) {
        if let Some(watched) = self.watched.get_mut(&pid) {
            watched.sockets.insert(socket.to_path_buf());
            return;
        }
        let (open, checked) = (self.monitor.open_pidfd, socket.to_path_buf());
        let budget = self.monitor.budget.clone();
        let watch = self.tasks.spawn(async move {
            let exit = wait_for_exit(open, pid, &checked, &budget).await;
            Done::Exited { pid, exit }
        });
        let sockets = HashSet::from([socket.to_path_buf()]);
        self.watched.insert(pid, Watched { sockets, watch });
        self.count_watched();
    }

    /// Removes `socket` from the sockets of process `pid`; the watch ends
    /// with its last socket.
    pub(super) fn unwatch(&mut self, pid: u32, socket: &Path) {
        let Some(watched) = self.watched.get_mut(&pid) else { return };
        watched.sockets.remove(socket);
        if watched.sockets.is_empty() {
            watched.watch.abort();
            self.watched.remove(&pid);
            self.count_watched();
        }
    }

    fn count_watched(&self) {
        self.monitor.counters.watched_processes.store(self.watched.len(), Ordering::Relaxed);
    }

    /// Process `pid` exited: check each of its sockets.
    pub(super) fn exited(&mut self, pid: u32, exit: Exit) {
        let Some(watched) = self.watched.remove(&pid) else { return };
        self.count_watched();
        for socket in &watched.sockets {
            if let Some(followed) = self.followed.get_mut(socket) {
                followed.pid = None;
            }
        }
        match exit {
            Exit::Exited => {
                self.monitor.counters.exits.fetch_add(1, Ordering::Relaxed);
                for socket in watched.sockets {
                    let Some(followed) = self.followed.get(&socket) else { continue };
                    let generation = followed.generation;
                    self.check(socket, generation, format!("its process {pid} exited"), None);
                }
            }
            Exit::Unsupported => {
                if !self.monitor.counters.no_pidfd.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "this kernel has no pidfd_open (Linux 5.3): plugin exits are noticed \
                         by the liveness probes only"
                    );
                }
                // Every other watch ends the same way: stop them now.
                for (_, watched) in self.watched.drain() {
                    watched.watch.abort();
                }
                for followed in self.followed.values_mut() {
                    followed.pid = None;
                }
                self.count_watched();
            }
            Exit::Unwatchable(error) => tracing::info!(
                pid, sockets = watched.sockets.len(), %error,
                "cannot watch a plugin process; its plugins are left to the liveness probes"
            ),
        }
    }

    /// Checks whether `socket` is still served, because of `cause`: at once,
    /// and, if it is and this is the first look, once more after
    /// [`RECHECK_AFTER`]; with `after`, only that once more.
    fn check(
        &mut self,
        socket: PathBuf,
        generation: Generation,
        cause: String,
        after: Option<Duration>,
    ) {
        let budget = self.monitor.budget.clone();
        self.tasks.spawn(async move {
            if let Some(after) = after {
                tokio::time::sleep(after).await;
            }
            let reachability = reach(&socket, &budget).await;
            Done::Reached { socket, generation, cause, reachability, again: after.is_none() }
        });
    }

    /// What a check of `socket` because of `cause` found: a socket gone
    /// has its plugin renewed; one still served is looked at once more if
    /// `again`, and otherwise left to the probes.
    pub(super) fn reached(
        &mut self,
        socket: PathBuf,
        generation: Generation,
        cause: String,
        reachability: Reachability,
        again: bool,
    ) {
        self.monitor.counters.socket_checks.fetch_add(1, Ordering::Relaxed);
        match reachability {
            Reachability::Gone(why) => {
                self.renew(&socket, generation, 0, format!("{cause}; {why}"));
            }
            Reachability::Served if again => {
                self.check(socket, generation, cause, Some(RECHECK_AFTER));
            }
            Reachability::Served => tracing::info!(
                socket = %socket.display(), %cause,
                "the socket is still served; left to the probes"
            ),
        }
    }

    /// A connection to `endpoint` dropped: checks the registration socket of
    /// every plugin served there.
    pub(super) fn suspect(&mut self, endpoint: &Path) {
        let served = self.served_at.get(endpoint).into_iter().flatten();
        let itself = self.followed.contains_key(endpoint).then(|| endpoint.to_path_buf());
        let suspects: HashSet<PathBuf> = served.cloned().chain(itself).collect();
        for socket in suspects {
            let Some(followed) = self.followed.get(&socket) else { continue };
            let generation = followed.generation;
            let cause = format!("its connection to {} dropped", endpoint.display());
            self.check(socket, generation, cause, None);
        }
    }
}
