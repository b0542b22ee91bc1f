//! What identifies one incarnation of a socket file at a path, so that kpm
//! neither removes a `kubelet.sock` it did not create nor mistakes a
//! restarted plugin's new socket for the one it is connected to.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::SystemTime;

/// Device, inode and birth time of a file. The inode number alone is not
/// enough once the file is gone: ext4 hands a new file the inode of the one
/// just deleted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
    /// Birth time, where the file system records it.
    created: Option<SystemTime>,
    /// Inode change time (seconds, nanoseconds), for file systems without a
    /// birth time.
    changed: (i64, i64),
}

impl FileId {
    /// The identity of the file at `path` (not following a symlink), if it
    /// can be read.
    pub(crate) fn at(path: &Path) -> Option<Self> {
        std::fs::symlink_metadata(path).ok().map(|meta| Self::of(&meta))
    }

    fn of(meta: &Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            created: meta.created().ok(),
            changed: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Same device and inode, and the same birth time; or, where the file
    /// system records no birth time, the same inode change time (a `chmod`
    /// then makes the file look new, which errs on the side of caution).
    pub(crate) fn is_same_file(&self, other: &Self) -> bool {
        self.dev == other.dev
            && self.ino == other.ino
            && match (self.created, other.created) {
                (Some(mine), Some(theirs)) => mine == theirs,
                _ => self.changed == other.changed,
            }
    }

    /// Whether two optional identities name the same file; two unknown
    /// identities count as the same.
    pub(crate) fn same(a: Option<&Self>, b: Option<&Self>) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => a.is_same_file(b),
            (None, None) => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recreated_file_is_a_different_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sock");
        std::fs::write(&path, b"").unwrap();
        let first = FileId::at(&path).unwrap();
        assert!(first.is_same_file(&FileId::at(&path).unwrap()));
        std::fs::remove_file(&path).unwrap();
        // ext4 may hand the freed inode to the next file; let this one have it.
        let _other = std::fs::File::create(dir.path().join("other")).unwrap();
        std::fs::write(&path, b"").unwrap();
        assert!(!first.is_same_file(&FileId::at(&path).unwrap()));
        assert!(FileId::same(None, None));
        assert!(!FileId::same(Some(&first), None));
    }
}
