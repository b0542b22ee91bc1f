//! Property test: random sequences of file-system operations on a real
//! registry directory (sockets, regular files, directories created, removed
//! and renamed in, out and within the tree, hidden names, symlinks and
//! symlink loops), made as fast as the test can, then DesiredState must
//! converge to exactly the visible sockets on disk, and the watcher must
//! still be watching.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use common::Fixture;
use kpm_test_support::{lazy, wait_until};
use kpm_watcher::WatcherConfig;
use proptest::prelude::*;

/// Directories the operations work in, relative to the registry root.
const DIRS: [&str; 6] = ["", "a", "a/b", "a/b/c", ".hidden", "d"];
const NAMES: [&str; 4] = ["p.sock", "q", ".dot.sock", "r.sock"];

#[derive(Debug, Clone)]
enum Op {
    Socket(usize, usize),
    File(usize, usize),
    Remove(usize, usize),
    Mkdir(usize),
    RemoveDir(usize),
    Rename((usize, usize), (usize, usize)),
    RenameDir(usize, usize),
    /// Moves a directory out of the tree and back under another name.
    OutAndIn(usize, usize),
    /// A symlink to the root (a loop) or to a socket.
    Symlink(usize, usize, bool),
}

fn op() -> impl Strategy<Value = Op> {
    let dir = 0..DIRS.len();
    let name = 0..NAMES.len();
    prop_oneof![
        5 => (dir.clone(), name.clone()).prop_map(|(d, n)| Op::Socket(d, n)),
        1 => (dir.clone(), name.clone()).prop_map(|(d, n)| Op::File(d, n)),
        3 => (dir.clone(), name.clone()).prop_map(|(d, n)| Op::Remove(d, n)),
        3 => dir.clone().prop_map(Op::Mkdir),
        1 => dir.clone().prop_map(Op::RemoveDir),
        2 => ((dir.clone(), name.clone()), (dir.clone(), name.clone()))
            .prop_map(|(from, to)| Op::Rename(from, to)),
        1 => (dir.clone(), dir.clone()).prop_map(|(from, to)| Op::RenameDir(from, to)),
        1 => (dir.clone(), dir.clone()).prop_map(|(from, to)| Op::OutAndIn(from, to)),
        1 => (dir, name, any::<bool>()).prop_map(|(d, n, to_root)| Op::Symlink(d, n, to_root)),
    ]
}

/// Applies `op`; failures (a missing parent, a name taken) are part of the game.
fn apply(f: &Fixture, op: &Op) {
    let at = |d: usize, n: usize| f.path(DIRS[d]).join(NAMES[n]);
    let _ = match op {
        // Bound and closed at once: the socket file stays.
        Op::Socket(d, n) => UnixListener::bind(at(*d, *n)).map(drop),
        Op::File(d, n) => fs::write(at(*d, *n), b"not a socket"),
        Op::Remove(d, n) => fs::remove_file(at(*d, *n)),
        Op::Mkdir(d) => fs::create_dir_all(f.path(DIRS[*d])),
        Op::RemoveDir(d) if *d > 0 => fs::remove_dir_all(f.path(DIRS[*d])),
        Op::Rename((fd, fname), (td, tname)) => fs::rename(at(*fd, *fname), at(*td, *tname)),
        Op::RenameDir(from, to) if *from > 0 && *to > 0 => {
            fs::rename(f.path(DIRS[*from]), f.path(DIRS[*to]))
        }
        Op::OutAndIn(from, to) if *from > 0 && *to > 0 => {
            let outside = f.outside("moved");
            fs::rename(f.path(DIRS[*from]), &outside)
                .and_then(|()| fs::rename(&outside, f.path(DIRS[*to])))
        }
        Op::Symlink(d, n, to_root) => {
            let target = if *to_root { f.root.clone() } else { f.path("p.sock") };
            std::os::unix::fs::symlink(target, at(*d, *n))
        }
        // The root itself is not removed or renamed here (the resync tests do that).
        Op::RemoveDir(_) | Op::RenameDir(..) | Op::OutAndIn(..) => Ok(()),
    };
}

/// The visible sockets under `dir`, as the watcher should see them: no
/// hidden names, symlinks not followed.
fn sockets_on_disk(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_socket() {
            found.push(entry.path());
        } else if kind.is_dir() {
            sockets_on_disk(&entry.path(), found);
        }
    }
}

async fn scenario(ops: Vec<Op>) {
    let f = Fixture::start_with(|_| {}, WatcherConfig::default());
    for op in &ops {
        apply(&f, op);
    }
    let mut expected = Vec::new();
    sockets_on_disk(&f.root, &mut expected);
    expected.sort();
    // The usual generous deadline, although shrinking a failure re-runs it
    // often: a shorter one would fail on a busy machine.
    let what = lazy(|| {
        format!(
            "DesiredState holds the disk's {expected:?} (it holds {:?}) after {ops:?}",
            f.paths()
        )
    });
    wait_until(what, || f.paths() == expected).await;
    // Still watching: a new socket at the root is seen.
    f.settle().await;
}

proptest! {
    // Real inotify and real files: fewer cases than the in-memory
    // properties, whatever PROPTEST_CASES says.
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn desired_state_converges_to_the_sockets_on_disk(ops in prop::collection::vec(op(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(scenario(ops));
    }
}
