//! The plugin-socket directory watcher: keeps a [`kpm_cache::DesiredState`]
//! equal to the registration sockets under a registry directory
//! (`/var/lib/kubelet/plugins_registry`).
//!
//! [`Watcher::start`] creates the directory if missing, watches it
//! recursively with [`notify`] (inotify on Linux), lists the tree, and spawns
//! a tokio task that applies events:
//!
//! - a Unix socket created or renamed into the tree is added
//!   (`DesiredState::add_or_update`); one removed or renamed out is removed;
//!   a rename within the tree removes the old path and adds the new one;
//! - a new directory (created or renamed in) is watched and then listed, so
//!   that sockets created in it before its watch existed are found (notify 8
//!   reports neither them nor the sub-directories of a `mkdir -p`); a
//!   directory removed or renamed out takes every socket below it along;
//! - the registry directory itself removed or moved away: logged, re-created,
//!   watched again and listed. Its parent is watched (not recursively) for
//!   this: inotify reports the root's own removal on the root only once
//!   nothing holds it any more, and a plugin's listening socket in it does;
//! - a directory that cannot be watched (no read permission) costs only its
//!   own subtree: the rest of the tree is watched around it. A `chmod` that
//!   makes it readable is reported by its parent's watch: it is watched and
//!   listed then, and every resync tries it again in case that was missed.
//!
//! Events are hints. A path reported removed or renamed away that exists
//! again is looked at on disk instead (inotify reports a directory renamed
//! over an empty one as the old one's removal under the new name). On
//! notify's overflow signal (`Flag::Rescan`), when the
//! event queue of the task is full, on [`Watcher::rescan`] and every
//! [`WatcherConfig::resync_period`] (60 s by default) the tree is listed again
//! and diffed against DesiredState: missing sockets are added, vanished ones
//! removed, unchanged ones keep their generation. [`Watcher::stats`] counts
//! those re-listings. The watcher writes DesiredState only for paths under
//! its root.
//!
//! # Which paths count
//!
//! - **Sockets by file type**, never by name: a regular file named `x.sock`
//!   is ignored, a socket named `x` is registered.
//! - **Hidden names are ignored everywhere**: a path any of whose components
//!   below the root starts with `.` is never registered, at start-up and at
//!   runtime alike (upstream filtered only the base name, and only at
//!   runtime). Plugins can bind a hidden temporary name and rename it into
//!   place.
//! - **Symlinks are never followed** below the root (the root itself may be a
//!   symlink). A symlinked directory is not descended into, and a symlink to
//!   a socket is not registered: the registration socket must be created by
//!   the plugin inside the registry. Following links would let a link
//!   register a socket that lives elsewhere, whose removal produces no event
//!   here, so it would stay registered after its plugin is gone; and the key
//!   (the link's path) would not be the path the plugin reports.
//!
//! [`survey`] is the same walk for diagnosis, keeping what it ignores and
//! why: `kpm doctor` reports the registry with it, so the rule of what
//! counts as a registration socket lives here only.
//!
//! # Generations
//!
//! A new generation means "a new plugin incarnation: unregister and register
//! again", so the watcher calls `add_or_update` only for a socket *file* it
//! has not seen at that path: it remembers each socket's device, inode (and
//! birth time, where the filesystem reports it). A duplicate create event or
//! a listing that finds a known socket changes nothing; a socket deleted and
//! re-created, or atomically replaced by a rename over it (there is no
//! removal event for the replaced file), is a new file and gets a new
//! generation. An entry that disappeared from DesiredState behind the
//! watcher's back is added again.
//!
//! # Threads and errors
//!
//! notify's thread only forwards events into a bounded channel; all work
//! happens on the watcher task (file-system calls there are short, local and
//! blocking). Start-up failures are [`WatcherError`]s naming the path and the
//! step (an exhausted inotify limit is [`WatcherError::WatchLimit`], naming
//! the sysctl); once running, problems are logged with `tracing` and repaired
//! by rescans.

#![deny(missing_docs)]

mod error;
mod scan;
mod tree;
mod watcher;

pub use error::{MAX_USER_INSTANCES, MAX_USER_WATCHES, WatcherError};
pub use scan::{Ignored, RegistryEntry, survey};
pub use watcher::{DEFAULT_RESYNC_PERIOD, Watcher, WatcherConfig, WatcherStats};
