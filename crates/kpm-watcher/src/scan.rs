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
    walk(dir, |path, entry| match entry {
        Walked::Socket(id) => {
            listing.sockets.insert(path, id);
        }
        Walked::Ignored(why) => tracing::trace!(path = %path.display(), %why, "ignoring"),
        Walked::Unreadable(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot read registry entry");
            listing.unreadable.push(path);
        }
    })?;
    Ok(listing)
}

/// What the watcher makes of an entry below the registry directory, as
/// [`survey`] reports it.
#[derive(Debug)]
#[non_exhaustive]
pub enum RegistryEntry {
    /// A Unix socket with a visible name: a registration socket.
    Socket,
    /// Ignored, and why (a hidden name, a symlink, not a socket).
    Ignored(Ignored),
    /// A directory or entry that could not be read: what is below it is
    /// unknown.
    Unreadable(io::Error),
}

/// Why the watcher ignores an entry of the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ignored {
    /// Its name (or a directory's it is in) starts with a dot.
    Hidden,
    /// A symlink: never followed below the registry directory.
    Symlink,
    /// Neither a socket nor a directory (a regular file, a fifo...).
    NotASocket,
}

impl std::fmt::Display for Ignored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Hidden => "its name starts with a dot",
            Self::Symlink => "a symlink, not followed",
            Self::NotASocket => "not a socket",
        })
    }
}

/// Every entry below `dir` with what the watcher makes of it: the same
/// walk that finds registration sockets, keeping what it ignores (a hidden
/// directory is reported, not entered). Fails only if `dir` itself cannot
/// be read. For diagnosis (`kpm doctor`).
pub fn survey(dir: &Path) -> io::Result<Vec<(PathBuf, RegistryEntry)>> {
    let mut entries = Vec::new();
    walk(dir, |path, entry| {
        entries.push((
            path,
            match entry {
                Walked::Socket(_) => RegistryEntry::Socket,
                Walked::Ignored(why) => RegistryEntry::Ignored(why),
                Walked::Unreadable(error) => RegistryEntry::Unreadable(error),
            },
        ));
    })?;
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(entries)
}

/// An entry found by [`walk`].
enum Walked {
    Socket(FileId),
    Ignored(Ignored),
    Unreadable(io::Error),
}

/// Walks `dir` recursively, telling `found` about every entry but
/// directories it enters; entries removed meanwhile are skipped.
fn walk(dir: &Path, mut found: impl FnMut(PathBuf, Walked)) -> io::Result<()> {
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let entries = match fs::read_dir(&current) {
            Ok(entries) => entries,
            Err(error) if current == dir => return Err(error),
            // Removed while we walked: its removal event follows.
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => {
                found(current, Walked::Unreadable(error));
                continue;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(error) => {
                    found(current.clone(), Walked::Unreadable(error));
                    continue;
                }
            };
            let path = entry.path();
            if is_hidden_name(entry.file_name().as_bytes()) {
                found(path, Walked::Ignored(Ignored::Hidden));
                continue;
            }
            // `DirEntry::metadata` is an lstat: symlinks are reported as such.
            let metadata = match entry.metadata() {
                Ok(metadata) => metadata,
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => {
                    found(path, Walked::Unreadable(error));
                    continue;
                }
            };
            let file_type = metadata.file_type();
            if file_type.is_dir() {
                pending.push(path);
            } else if file_type.is_socket() {
                found(path, Walked::Socket(FileId::of(&metadata)));
            } else if file_type.is_symlink() {
                found(path, Walked::Ignored(Ignored::Symlink));
            } else {
                found(path, Walked::Ignored(Ignored::NotASocket));
            }
        }
    }
    Ok(())
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
