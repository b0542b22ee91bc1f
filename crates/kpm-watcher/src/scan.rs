//! Listing the registry tree: which paths are registration sockets, and the
//! identity of each socket file. Never follows symlinks below the root.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use kpm_api::FileId;

/// Whether `path` is below `root` and no component below `root` starts with
/// a dot. Paths outside the root and the root itself are not eligible.
pub(crate) fn is_eligible(root: &Path, path: &Path) -> bool {
    let Ok(relative) = path.strip_prefix(root) else { return false };
    let mut components = relative.components().peekable();
    if components.peek().is_none() {
        return false;
    }
    components.all(|component| match component {
        Component::Normal(name) => !is_hidden_name(name.as_bytes()),
        // `..` could climb out of the root; `.` never survives `components()`.
        _ => false,
    })
}

fn is_hidden_name(name: &[u8]) -> bool {
    name.first() == Some(&b'.')
}

/// The registration sockets found below a directory.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Every visible socket, with its identity.
    pub(crate) sockets: BTreeMap<PathBuf, FileId>,
    /// Directories (or entries) that could not be read: what was registered
    /// below them is unknown, so a diff must not remove it.
    pub(crate) unreadable: Vec<PathBuf>,
}

impl Listing {
    /// Whether `path` lies below (or at) a directory that could not be read.
    pub(crate) fn is_unknown(&self, path: &Path) -> bool {
        self.unreadable.iter().any(|dir| path.starts_with(dir))
    }
}

/// Lists `dir` recursively: sockets by file type (never by name), skipping
/// hidden names, not descending into symlinked directories and ignoring
/// symlinks to sockets. Fails only if `dir` itself cannot be read; problems
/// below it are logged and recorded in [`Listing::unreadable`].
pub(crate) fn list(dir: &Path) -> io::Result<Listing> {
    let mut listing = Listing::default();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let entries = match fs::read_dir(&current) {
            Ok(entries) => entries,
            Err(error) if current == dir => return Err(error),
            // Removed while we walked: its removal event follows.
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => {
                tracing::warn!(dir = %current.display(), %error, "cannot list directory");
                listing.unreadable.push(current);
                continue;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(error) => {
                    tracing::warn!(dir = %current.display(), %error, "cannot read directory entry");
                    listing.unreadable.push(current.clone());
                    continue;
                }
            };
            if is_hidden_name(entry.file_name().as_bytes()) {
                continue;
            }
            let path = entry.path();
            // `DirEntry::metadata` is an lstat: symlinks are reported as such.
            let metadata = match entry.metadata() {
                Ok(metadata) => metadata,
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => {
                    tracing::warn!(socket = %path.display(), %error, "cannot stat directory entry");
                    listing.unreadable.push(path);
                    continue;
                }
            };
            let file_type = metadata.file_type();
            if file_type.is_dir() {
                pending.push(path);
            } else if file_type.is_socket() {
                listing.sockets.insert(path, FileId::of(&metadata));
            } else {
                tracing::trace!(path = %path.display(), "ignoring non-socket");
            }
        }
    }
    Ok(listing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eligibility_filters_hidden_components_below_the_root_only() {
        let root = Path::new("/var/lib/.kubelet/plugins_registry");
        for path in ["a.sock", "dir/a.sock", "dir/sub/a.sock", "a.b.sock", "dir."] {
            assert!(is_eligible(root, &root.join(path)), "{path}");
        }
        for path in [".a.sock", ".dir/a.sock", "dir/.a.sock", "dir/.sub/a.sock", "..", "x/../y"] {
            assert!(!is_eligible(root, &root.join(path)), "{path}");
        }
        assert!(!is_eligible(root, root), "the root itself");
        assert!(!is_eligible(root, Path::new("/var/lib/kubelet/other.sock")), "outside");
        assert!(!is_eligible(root, Path::new("/var/lib/.kubelet/plugins_registry2/a.sock")));
    }

    #[test]
    fn listing_a_missing_directory_fails() {
        let dir = tempfile::tempdir().unwrap();
        let error = list(&dir.path().join("missing")).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
    }
}
