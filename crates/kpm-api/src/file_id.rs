//! The identity of one file, as opposed to one path: what tells a socket
//! re-created at the same path from the one seen (bound, connected to,
//! registered) before.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt as _;
use std::time::SystemTime;

/// Identifies one incarnation of a file at a path, so that a socket
/// re-created there (a restarted plugin, another server) is not taken for
/// the one seen before. Two `FileId`s are equal when they name the same file.
///
/// Device and inode, plus a stamp: the inode number alone is not enough once
/// the file is gone, as ext4 hands a new file the inode of the one just
/// deleted. The stamp is the birth time where the file system records one.
/// Without it, a non-directory falls back to its inode change time (a `chmod`
/// then makes the file look new, which errs on the side of caution); a
/// directory has no stamp, since its change time moves with every entry
/// added or removed.
///
/// Built from metadata the caller read ([`FileId::of`]), since this crate
/// does no IO; `kpm_transport::file_id_at` reads it from a path. The
/// watcher tells a new socket from a re-listed one by it, the device
/// manager a re-registered endpoint file from the connected one, liveness
/// an endpoint replaced under a registered plugin, and
/// `kpm_transport::BoundSocket` the file it bound from a successor's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    dev: u64,
    ino: u64,
    stamp: Stamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Stamp {
    Born(SystemTime),
    /// Inode change time (seconds, nanoseconds).
    Changed(i64, i64),
    None,
}

impl FileId {
    /// The identity of the file `meta` describes.
    pub fn of(meta: &Metadata) -> Self {
        let stamp = match meta.created() {
            Ok(born) => Stamp::Born(born),
            Err(_) if meta.is_dir() => Stamp::None,
            Err(_) => Stamp::Changed(meta.ctime(), meta.ctime_nsec()),
        };
        Self { dev: meta.dev(), ino: meta.ino(), stamp }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// What `kpm_transport::file_id_at` does.
    fn at(path: &Path) -> Option<FileId> {
        std::fs::symlink_metadata(path).ok().map(|meta| FileId::of(&meta))
    }

    #[test]
    fn a_recreated_file_is_a_different_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sock");
        std::fs::write(&path, b"").unwrap();
        let first = at(&path).unwrap();
        assert_eq!(Some(first), at(&path));
        std::fs::remove_file(&path).unwrap();
        // ext4 may hand the freed inode to the next file; let this one have it.
        let _other = std::fs::File::create(dir.path().join("other")).unwrap();
        std::fs::write(&path, b"").unwrap();
        assert_ne!(Some(first), at(&path));
    }

    #[test]
    fn a_directory_stays_itself_while_entries_come_and_go() {
        let dir = tempfile::tempdir().unwrap();
        let before = at(dir.path()).unwrap();
        std::fs::write(dir.path().join("entry"), b"").unwrap();
        std::fs::remove_file(dir.path().join("entry")).unwrap();
        assert_eq!(Some(before), at(dir.path()));
    }
}
