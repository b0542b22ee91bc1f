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

/// Opens a pidfd; the real [`open_pidfd`] except in tests that force a
/// kernel without pidfds.
pub(crate) type OpenPidfd = fn(u32) -> io::Result<AsyncFd<OwnedFd>>;

/// A pidfd of process `pid` (`pidfd_open(2)`, Linux 5.3), registered with
/// tokio's reactor: readable once the process has exited, at once if it
/// already had. kpm's liveness monitor and `kpm doctor --watch` wait for
/// plugin exits with it; holding it costs one file descriptor and nothing
/// else. Must be called within a tokio runtime with IO enabled.
///
/// A pid is only a number: the process may be gone and the number reused
/// before this call. A caller that must know it is the same process checks
/// something the process held (liveness checks the plugin's socket).
///
/// # Errors
///
/// `InvalidInput` for pid 0 or one beyond `i32`; otherwise the kernel's
/// error, whose [`io::Error::raw_os_error`] tells: `ESRCH` the process is
/// gone, `ENOSYS` the kernel has no pidfds, `EMFILE`/`ENFILE` no file
/// descriptor left, `EPERM`/`EACCES` not allowed.
pub fn open_pidfd(pid: u32) -> io::Result<AsyncFd<OwnedFd>> {
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("pid {pid} out of range")));
    };
    let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::empty())?;
    // tokio deprecated its safe constructors because an arbitrary `AsRawFd`
    // may change or close its descriptor behind the reactor's back; an
    // `OwnedFd` cannot, which is the promise the unsafe replacement asks for.
    #[allow(deprecated)]
    AsyncFd::with_interest(pidfd, Interest::READABLE)
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
    let Some(_permit) = budget.try_acquire() else {
        let error = io::Error::other("no file descriptor to spare for a pidfd");
        return Exit::Unwatchable(error);
    };
    let pidfd = match open(pid) {
        Ok(fd) => fd,
        Err(error) => {
            return match Errno::from_io_error(&error) {
                Some(Errno::SRCH) => Exit::Exited,
                Some(Errno::NOSYS) => Exit::Unsupported,
                _ => {
                    if fd::is_shortage(&error) {
                        budget.shortage("pidfd");
                    }
                    Exit::Unwatchable(error)
                }
            };
        }
    };
    if let Reachability::Gone(_) = reach(socket, budget).await {
        return Exit::Exited;
    }
    // Readable means exited; an error from the reactor means the same to us:
    // nothing more will come from this pidfd.
    let _ = pidfd.readable().await;
    Exit::Exited
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;

    #[tokio::test]
    async fn a_pidfd_is_readable_once_its_process_exits() {
        for pid in [0, u32::MAX] {
            let error = open_pidfd(pid).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{pid}: {error}");
        }
        let mut child = Command::new("sleep").arg("60").stdin(Stdio::null()).spawn().unwrap();
        let pidfd = match open_pidfd(child.id()) {
            Err(error) if Errno::from_io_error(&error) == Some(Errno::NOSYS) => {
                child.kill().unwrap();
                child.wait().unwrap();
                return;
            }
            opened => opened.unwrap(),
        };
        child.kill().unwrap();
        let mut ready = pidfd.readable().await.unwrap();
        ready.retain_ready();
        // Reaped, the pid names nobody: the kernel says so.
        child.wait().unwrap();
        let error = open_pidfd(child.id()).unwrap_err();
        assert_eq!(Errno::from_io_error(&error), Some(Errno::SRCH), "{error}");
    }
}
