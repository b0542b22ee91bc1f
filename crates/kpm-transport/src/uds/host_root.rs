//! Where this process sees the host's `/`, and what opening a socket there
//! takes.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kpm_api::FileId;

use crate::fd::FdBudget;

/// Where this process sees the host's `/`: at `/` itself (the default), or
/// under a prefix, for a process in a pod that mounts the host elsewhere
/// (`/host`, as `kubectl debug node/NAME` does).
///
/// Every socket path kpm is given, and every endpoint a plugin advertises,
/// is a path on the host, and every layer keeps and names it so: only the
/// opening of the file (a [`Dialer`](crate::Dialer)'s connect,
/// [`file_id_at`](Self::file_id_at)) goes through the prefix, so that
/// records, errors and logs name what the kubelet names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostRoot {
    /// `None` for `/`: nothing is moved.
    prefix: Option<Arc<Path>>,
}

impl HostRoot {
    /// The host seen with its `/` at `dir`; `/` is the host itself.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        let dir: PathBuf = dir.into();
        let prefix = (dir != Path::new("/")).then(|| Arc::from(dir));
        Self { prefix }
    }

    /// Where the host's `/` is in this process.
    pub fn dir(&self) -> &Path {
        self.prefix.as_deref().unwrap_or_else(|| Path::new("/"))
    }

    /// Where this process opens `on_host`, a path on the host. A relative
    /// path is not moved: the kubelet opens it from its own directory, which
    /// no prefix names. A path that starts with the prefix's name is moved
    /// too: on the host, `/host/…` is a path like any other.
    pub fn reach<'a>(&self, on_host: &'a Path) -> Cow<'a, Path> {
        match (&self.prefix, on_host.strip_prefix("/")) {
            (Some(prefix), Ok(relative)) => Cow::Owned(prefix.join(relative)),
            _ => Cow::Borrowed(on_host),
        }
    }

    /// The identity of the file at `on_host` (see
    /// [`file_id_at`](crate::file_id_at)), read where this process reaches it.
    pub fn file_id_at(&self, on_host: &Path) -> Option<FileId> {
        super::file_id_at(&self.reach(on_host))
    }
}

/// What opening a connection to a socket takes: the
/// [fd budget](crate::fd) it pays from, and where the host's `/` is.
/// Layers that dial are given one; an [`FdBudget`] alone is one on the
/// host itself.
#[derive(Debug, Clone)]
pub struct Reach {
    budget: FdBudget,
    host: HostRoot,
}

impl Reach {
    /// Connections paid from `budget`, to sockets of the host seen at `host`.
    pub fn new(budget: FdBudget, host: HostRoot) -> Self {
        Self { budget, host }
    }

    /// The budget connections pay from.
    pub fn budget(&self) -> &FdBudget {
        &self.budget
    }

    /// Where the host's `/` is.
    pub fn host(&self) -> &HostRoot {
        &self.host
    }
}

impl From<FdBudget> for Reach {
    fn from(budget: FdBudget) -> Self {
        Self::new(budget, HostRoot::default())
    }
}

impl From<&FdBudget> for Reach {
    fn from(budget: &FdBudget) -> Self {
        Self::from(budget.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_path_is_opened_under_the_prefix() {
        let host = HostRoot::at("/host");
        let cases = [
            (
                "/var/lib/kubelet/plugins/csi.example.com/csi.sock",
                "/host/var/lib/kubelet/plugins/csi.example.com/csi.sock",
            ),
            // A host path that starts with the root's name is still the
            // host's: nothing is taken for already moved.
            (
                "/host/var/lib/kubelet/plugins/x/csi.sock",
                "/host/host/var/lib/kubelet/plugins/x/csi.sock",
            ),
            ("/hostile/a.sock", "/host/hostile/a.sock"),
            ("dra.sock", "dra.sock"),
        ];
        for (on_host, reached) in cases {
            assert_eq!(host.reach(Path::new(on_host)), Path::new(reached), "{on_host}");
        }
    }

    #[test]
    fn the_host_itself_moves_nothing() {
        for host in [HostRoot::default(), HostRoot::at("/")] {
            assert_eq!(host.dir(), Path::new("/"));
            let path = Path::new("/var/lib/kubelet/plugins_registry/a.sock");
            assert!(matches!(host.reach(path), Cow::Borrowed(p) if p == path));
        }
    }
}
