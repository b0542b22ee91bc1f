//! The kernel's word that a plugin process exited: a pidfd, readable once the
//! process is gone (Linux 5.3), waited on through tokio like any socket.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use kpm_transport::fd::{self, FdBudget};
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::probe::{Reachability, reach};

/// Opens a pidfd; the real `pidfd_open(2)` except in tests that force a
/// kernel without it.
pub(crate) type OpenPidfd = fn(Pid) -> Result<OwnedFd, Errno>;

/// `pidfd_open(2)` with no flags.
pub(crate) fn pidfd_open(pid: Pid) -> Result<OwnedFd, Errno> {
    rustix::process::pidfd_open(pid, PidfdFlags::empty())
}

/// How watching a process ended.
#[derive(Debug)]
pub(crate) enum Exit {
    /// The process exited (or had already when the watch began).
    Exited,
    /// The kernel has no pidfds: nobody's exit can be watched.
    Unsupported,
    /// This process cannot be watched (no file descriptor left, no
    /// permission); its plugins are left to the probes.
    Unwatchable(io::Error),
}

/// Waits until process `pid` exits.
///
/// A pidfd is an optional holder of the fd budget: without a permit to
/// spare, or when the process has no fd left, the process is not watched.
///
/// A pid is only a number: the process that served `socket` may have exited
/// between kpm's connection and `pidfd_open`, and the number been reused. So
/// once the pidfd is open, the socket is checked: if nobody serves it any
/// more, the process the pid named is gone, whatever the pidfd now refers to.
pub(crate) async fn wait_for_exit(
    open: OpenPidfd,
    pid: u32,
    socket: &Path,
    budget: &FdBudget,
) -> Exit {
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        let error = io::Error::new(io::ErrorKind::InvalidInput, format!("pid {pid} out of range"));
        return Exit::Unwatchable(error);
    };
    let Some(_permit) = budget.try_acquire() else {
        let error = io::Error::other("no file descriptor to spare for a pidfd");
        return Exit::Unwatchable(error);
    };
    let pidfd = match open(pid) {
        Ok(fd) => fd,
        Err(Errno::SRCH) => return Exit::Exited,
        Err(Errno::NOSYS) => return Exit::Unsupported,
        Err(errno) => {
            let error = io::Error::from(errno);
            if fd::is_shortage(&error) {
                budget.shortage("pidfd");
            }
            return Exit::Unwatchable(error);
        }
    };
    // tokio deprecated its safe constructors because an arbitrary `AsRawFd`
    // may change or close its descriptor behind the reactor's back; an
    // `OwnedFd` cannot, which is the promise the unsafe replacement asks for.
    #[allow(deprecated)]
    let pidfd = match AsyncFd::with_interest(pidfd, Interest::READABLE) {
        Ok(fd) => fd,
        Err(err) => return Exit::Unwatchable(err),
    };
    if let Reachability::Gone(_) = reach(socket, budget).await {
        return Exit::Exited;
    }
    // Readable means exited; an error from the reactor means the same to us:
    // nothing more will come from this pidfd.
    let _ = pidfd.readable().await;
    Exit::Exited
}
