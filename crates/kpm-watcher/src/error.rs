//! The one error type of the watcher crate. Every variant names the registry
//! path and the step that failed, but a refused config, which names its field.

use std::io;
use std::path::{Path, PathBuf};

/// The inotify limit on watches per user; `inotify_add_watch` fails with
/// `ENOSPC` (notify's `ErrorKind::MaxFilesWatch`) when it is reached.
pub const MAX_USER_WATCHES: &str = "fs.inotify.max_user_watches";

/// The inotify limit on instances per user; `inotify_init` fails with `EMFILE`
/// when it (or the process's open-files limit) is reached.
pub const MAX_USER_INSTANCES: &str = "fs.inotify.max_user_instances";

/// `EMFILE` on Linux (every architecture).
const EMFILE: i32 = 24;

/// Errors of the watcher. All of them are start-up errors: once running, the
/// watcher logs problems and repairs them with rescans instead of stopping.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WatcherError {
    /// A duration of the [`WatcherConfig`](crate::WatcherConfig) is out of
    /// range; see [`WatcherConfig::validate`](crate::WatcherConfig::validate).
    #[error("invalid watcher config: {0}")]
    InvalidConfig(#[from] kpm_api::config::DurationOutOfRange),

    /// `Watcher::start` was called outside a tokio runtime.
    #[error("start watching {}: no tokio runtime to run the watcher on", path.display())]
    NoRuntime {
        /// The registry directory.
        path: PathBuf,
    },

    /// The current directory was needed to make a relative root absolute.
    #[error("start watching {}: resolving the relative path: {source}", path.display())]
    ResolveRoot {
        /// The registry directory.
        path: PathBuf,
        /// The failing call's error.
        #[source]
        source: io::Error,
    },

    /// `mkdir -p` of the registry directory failed, or it is not a directory.
    #[error("error (re-)creating root {}: {source}", path.display())]
    CreateRoot {
        /// The registry directory.
        path: PathBuf,
        /// The failing call's error.
        #[source]
        source: io::Error,
    },

    /// Creating the inotify instance failed for a reason other than a limit.
    #[error("watch {}: creating the file watcher: {source}", path.display())]
    CreateWatcher {
        /// The registry directory.
        path: PathBuf,
        /// notify's error.
        #[source]
        source: notify::Error,
    },

    /// Adding the recursive watch on the registry directory failed for a
    /// reason other than a limit.
    #[error("watch {}: adding the watch: {source}", path.display())]
    Watch {
        /// The registry directory.
        path: PathBuf,
        /// notify's error.
        #[source]
        source: notify::Error,
    },

    /// An inotify limit is exhausted. `limit` is the sysctl to raise
    /// ([`MAX_USER_WATCHES`] or [`MAX_USER_INSTANCES`]). Nothing is left
    /// half-started: the watches added so far are released.
    #[error(
        "watch {}: inotify limit {limit} reached (raise it with `sysctl {limit}=N`)",
        path.display()
    )]
    WatchLimit {
        /// The registry directory.
        path: PathBuf,
        /// The sysctl to raise.
        limit: &'static str,
    },

    /// Listing the registry directory at start failed.
    #[error("list {}: {source}", path.display())]
    List {
        /// The registry directory.
        path: PathBuf,
        /// The failing call's error.
        #[source]
        source: io::Error,
    },

    /// The watcher's task has ended (it was stopped, or its runtime shut down).
    #[error("watcher of {} is not running", path.display())]
    Stopped {
        /// The registry directory.
        path: PathBuf,
    },
}

/// The inotify limit a notify error reports, if any.
pub(crate) fn exhausted_limit(error: &notify::Error) -> Option<&'static str> {
    match &error.kind {
        notify::ErrorKind::MaxFilesWatch => Some(MAX_USER_WATCHES),
        notify::ErrorKind::Io(io) if io.raw_os_error() == Some(EMFILE) => Some(MAX_USER_INSTANCES),
        _ => None,
    }
}

/// Maps a failure to create the notify watcher.
pub(crate) fn create_watcher_error(path: &Path, source: notify::Error) -> WatcherError {
    match exhausted_limit(&source) {
        Some(limit) => WatcherError::WatchLimit { path: path.to_path_buf(), limit },
        None => WatcherError::CreateWatcher { path: path.to_path_buf(), source },
    }
}

/// Maps a failure to add the watch on the registry directory.
pub(crate) fn watch_error(path: &Path, source: notify::Error) -> WatcherError {
    match exhausted_limit(&source) {
        Some(limit) => WatcherError::WatchLimit { path: path.to_path_buf(), limit },
        None => WatcherError::Watch { path: path.to_path_buf(), source },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = "/var/lib/kubelet/plugins_registry";

    #[test]
    fn enospc_on_add_watch_names_max_user_watches() {
        let source = notify::Error::new(notify::ErrorKind::MaxFilesWatch).add_path(ROOT.into());
        let error = watch_error(Path::new(ROOT), source);
        assert!(
            matches!(error, WatcherError::WatchLimit { limit: MAX_USER_WATCHES, ref path } if path == Path::new(ROOT)),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(text.contains("fs.inotify.max_user_watches"), "{text}");
        assert!(text.contains(ROOT), "{text}");
    }

    #[test]
    fn emfile_on_inotify_init_names_max_user_instances() {
        let source = notify::Error::io(io::Error::from_raw_os_error(EMFILE));
        let error = create_watcher_error(Path::new(ROOT), source);
        assert!(
            matches!(error, WatcherError::WatchLimit { limit: MAX_USER_INSTANCES, .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("fs.inotify.max_user_instances"), "{error}");
    }

    #[test]
    fn other_failures_keep_their_step_and_source() {
        let source = notify::Error::new(notify::ErrorKind::PathNotFound);
        let error = watch_error(Path::new(ROOT), source);
        assert!(matches!(error, WatcherError::Watch { .. }), "{error:?}");
        assert!(
            error.to_string().starts_with(&format!("watch {ROOT}: adding the watch")),
            "{error}"
        );

        let source = notify::Error::io(io::Error::from_raw_os_error(12)); // ENOMEM
        let error = create_watcher_error(Path::new(ROOT), source);
        assert!(matches!(error, WatcherError::CreateWatcher { .. }), "{error:?}");
    }
}
