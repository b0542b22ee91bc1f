//! Runtime events with real files and sockets: creation, removal, renames
//! into, out of and within the tree, atomic replacement, new and removed
//! directories, and what must be ignored.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};

use common::{Fixture, make_socket};
use kpm_test_support::wait_until;
use kpm_watcher::WatcherConfig;

#[tokio::test]
async fn socket_created_after_start_is_added() {
    let f = Fixture::start_with(
        |root| fs::create_dir(root.join("sub")).unwrap(),
        WatcherConfig::default(),
    );
    make_socket(&f.path("a.sock"));
    make_socket(&f.path("sub/b"));
    f.wait_present(&f.path("a.sock")).await;
    f.wait_present(&f.path("sub/b")).await;
    f.settle().await;
    assert_eq!(f.paths(), f.expect(&["a.sock", "sub/b"]));
}

#[tokio::test]
async fn removed_socket_is_removed() {
    let f = Fixture::start_with(|root| make_socket(&root.join("a.sock")), WatcherConfig::default());
    f.wait_present(&f.path("a.sock")).await;
    fs::remove_file(f.path("a.sock")).unwrap();
    f.wait_absent(&f.path("a.sock")).await;
    assert!(f.desired.is_empty());
}

#[tokio::test]
async fn recreated_socket_gets_a_new_generation() {
    let f = Fixture::start();
    let socket = f.path("a.sock");
    make_socket(&socket);
    let first = f.wait_present(&socket).await;
    // Removed and re-created at once, before the watcher looks.
    fs::remove_file(&socket).unwrap();
    make_socket(&socket);
    let second = f.wait_newer(&socket, first).await;
    f.settle().await;
    assert_eq!(f.generation(&socket), Some(second), "one new generation, then stable");
}

#[tokio::test]
async fn hidden_entries_non_sockets_and_symlinks_created_at_runtime_are_ignored() {
    let f = Fixture::start();
    make_socket(&f.path(".hidden.sock"));
    fs::create_dir(f.path(".hidden-dir")).unwrap();
    make_socket(&f.path(".hidden-dir/a.sock"));
    fs::create_dir(f.path("visible")).unwrap();
    make_socket(&f.path("visible/.b.sock"));
    fs::create_dir_all(f.path("visible/.deeper/sub")).unwrap();
    make_socket(&f.path("visible/.deeper/sub/c.sock"));
    fs::write(f.path("x.sock"), "not a socket").unwrap();
    fs::write(f.path("visible/y.sock"), "not a socket").unwrap();
    make_socket(&f.outside("elsewhere.sock"));
    symlink(f.outside("elsewhere.sock"), f.path("link.sock")).unwrap();
    fs::create_dir(f.outside("dir")).unwrap();
    make_socket(&f.outside("dir/d.sock"));
    symlink(f.outside("dir"), f.path("linked-dir")).unwrap();
    f.settle().await;
    // A socket created in the symlinked directory after the link is not seen either.
    make_socket(&f.outside("dir/e.sock"));
    f.settle().await;
    f.watcher.rescan().await.unwrap();
    assert_eq!(f.paths(), f.expect(&[]));
}

#[tokio::test]
async fn socket_renamed_into_the_tree_is_added() {
    let f = Fixture::start();
    make_socket(&f.outside("a.sock"));
    fs::rename(f.outside("a.sock"), f.path("a.sock")).unwrap();
    f.wait_present(&f.path("a.sock")).await;
}

#[tokio::test]
async fn socket_renamed_out_of_the_tree_is_removed() {
    let f = Fixture::start_with(|root| make_socket(&root.join("a.sock")), WatcherConfig::default());
    f.wait_present(&f.path("a.sock")).await;
    fs::rename(f.path("a.sock"), f.outside("a.sock")).unwrap();
    f.wait_absent(&f.path("a.sock")).await;
    assert!(f.desired.is_empty());
}

#[tokio::test]
async fn socket_renamed_within_the_tree_moves() {
    let f = Fixture::start_with(
        |root| {
            make_socket(&root.join("a.sock"));
            fs::create_dir(root.join("sub")).unwrap();
        },
        WatcherConfig::default(),
    );
    let old = f.wait_present(&f.path("a.sock")).await;
    fs::rename(f.path("a.sock"), f.path("sub/b.sock")).unwrap();
    f.wait_absent(&f.path("a.sock")).await;
    let new = f.wait_present(&f.path("sub/b.sock")).await;
    assert!(new > old);
    f.settle().await;
    assert_eq!(f.generation(&f.path("sub/b.sock")), Some(new), "added once, not churned");
    assert_eq!(f.paths(), f.expect(&["sub/b.sock"]));
}

#[tokio::test]
async fn atomic_replace_from_a_hidden_temporary_name_gives_a_new_generation() {
    let f = Fixture::start_with(|root| make_socket(&root.join("a.sock")), WatcherConfig::default());
    let socket = f.path("a.sock");
    let old = f.wait_present(&socket).await;
    make_socket(&f.path(".a.sock.tmp"));
    fs::rename(f.path(".a.sock.tmp"), &socket).unwrap();
    let new = f.wait_newer(&socket, old).await;
    f.settle().await;
    assert_eq!(f.generation(&socket), Some(new), "replaced once, not churned");
    assert_eq!(f.paths(), f.expect(&["a.sock"]));
}

#[tokio::test]
async fn atomic_replace_from_outside_the_tree_gives_a_new_generation() {
    let f = Fixture::start_with(|root| make_socket(&root.join("a.sock")), WatcherConfig::default());
    let socket = f.path("a.sock");
    let old = f.wait_present(&socket).await;
    make_socket(&f.outside("a.sock"));
    fs::rename(f.outside("a.sock"), &socket).unwrap();
    let new = f.wait_newer(&socket, old).await;
    f.settle().await;
    assert_eq!(f.generation(&socket), Some(new));
}

#[tokio::test]
async fn atomic_replace_from_a_visible_name_in_the_tree_moves_and_replaces() {
    let f = Fixture::start_with(|root| make_socket(&root.join("a.sock")), WatcherConfig::default());
    let socket = f.path("a.sock");
    let old = f.wait_present(&socket).await;
    make_socket(&f.path("a.sock.new"));
    f.wait_present(&f.path("a.sock.new")).await;
    fs::rename(f.path("a.sock.new"), &socket).unwrap();
    f.wait_absent(&f.path("a.sock.new")).await;
    f.wait_newer(&socket, old).await;
    f.settle().await;
    assert_eq!(f.paths(), f.expect(&["a.sock"]));
}

#[tokio::test]
async fn regular_file_renamed_over_a_socket_removes_it() {
    let f = Fixture::start_with(|root| make_socket(&root.join("a.sock")), WatcherConfig::default());
    f.wait_present(&f.path("a.sock")).await;
    fs::write(f.outside("a.sock"), "not a socket").unwrap();
    fs::rename(f.outside("a.sock"), f.path("a.sock")).unwrap();
    f.wait_absent(&f.path("a.sock")).await;
}

/// notify 8 adds the watch of a new directory only after reporting it: a
/// socket bound right after `mkdir` is not reported and must be listed.
#[tokio::test]
async fn socket_bound_right_after_mkdir_is_found() {
    let f = Fixture::start();
    let sockets: Vec<_> = (0..10).map(|i| f.path(&format!("dir-{i}/s.sock"))).collect();
    for socket in &sockets {
        fs::create_dir(socket.parent().unwrap()).unwrap();
        make_socket(socket);
    }
    for socket in &sockets {
        f.wait_present(socket).await;
    }
}

/// notify 8 reports only the top directory of a `mkdir -p`.
#[tokio::test]
async fn socket_bound_right_after_mkdir_p_is_found_and_the_new_directories_are_watched() {
    let f = Fixture::start();
    for i in 0..10 {
        fs::create_dir_all(f.path(&format!("a-{i}/b/c"))).unwrap();
        make_socket(&f.path(&format!("a-{i}/b/c/s.sock")));
    }
    for i in 0..10 {
        f.wait_present(&f.path(&format!("a-{i}/b/c/s.sock"))).await;
    }
    // The directories found by listing are watched too.
    make_socket(&f.path("a-0/b/later.sock"));
    make_socket(&f.path("a-9/b/c/later.sock"));
    f.wait_present(&f.path("a-0/b/later.sock")).await;
    f.wait_present(&f.path("a-9/b/c/later.sock")).await;
}

/// A directory renamed in is reported alone, without its contents.
#[tokio::test]
async fn directory_with_sockets_renamed_in_is_fully_registered() {
    let f = Fixture::start();
    fs::create_dir_all(f.outside("pkg/sub")).unwrap();
    make_socket(&f.outside("pkg/a.sock"));
    make_socket(&f.outside("pkg/sub/b.sock"));
    make_socket(&f.outside("pkg/.hidden.sock"));
    fs::rename(f.outside("pkg"), f.path("pkg")).unwrap();
    f.wait_present(&f.path("pkg/a.sock")).await;
    f.wait_present(&f.path("pkg/sub/b.sock")).await;
    // And it is watched from then on.
    make_socket(&f.path("pkg/sub/c.sock"));
    f.wait_present(&f.path("pkg/sub/c.sock")).await;
    f.settle().await;
    assert_eq!(f.paths(), f.expect(&["pkg/a.sock", "pkg/sub/b.sock", "pkg/sub/c.sock"]));
}

#[tokio::test]
async fn removed_directory_removes_its_sockets() {
    let f = Fixture::start_with(
        |root| {
            fs::create_dir_all(root.join("d/e")).unwrap();
            make_socket(&root.join("d/a.sock"));
            make_socket(&root.join("d/e/b.sock"));
            make_socket(&root.join("kept.sock"));
        },
        WatcherConfig::default(),
    );
    assert_eq!(f.desired.len(), 3);
    fs::remove_dir_all(f.path("d")).unwrap();
    f.wait_absent(&f.path("d/a.sock")).await;
    f.wait_absent(&f.path("d/e/b.sock")).await;
    assert_eq!(f.paths(), f.expect(&["kept.sock"]));
}

#[tokio::test]
async fn directory_renamed_out_removes_its_sockets_and_is_no_longer_watched() {
    let f = Fixture::start_with(
        |root| {
            fs::create_dir_all(root.join("d/e")).unwrap();
            make_socket(&root.join("d/a.sock"));
            make_socket(&root.join("d/e/b.sock"));
        },
        WatcherConfig::default(),
    );
    fs::rename(f.path("d"), f.outside("d")).unwrap();
    wait_until("the moved directory's sockets are removed", || f.desired.is_empty()).await;
    make_socket(&f.outside("d/e/c.sock"));
    f.settle().await;
    assert!(f.desired.is_empty(), "{:?}", f.paths());
}

#[tokio::test]
async fn directory_renamed_within_the_tree_moves_its_sockets() {
    let f = Fixture::start_with(
        |root| {
            fs::create_dir_all(root.join("d/e")).unwrap();
            make_socket(&root.join("d/a.sock"));
            make_socket(&root.join("d/e/b.sock"));
        },
        WatcherConfig::default(),
    );
    fs::rename(f.path("d"), f.path("moved")).unwrap();
    f.wait_present(&f.path("moved/a.sock")).await;
    f.wait_present(&f.path("moved/e/b.sock")).await;
    f.wait_absent(&f.path("d/a.sock")).await;
    f.wait_absent(&f.path("d/e/b.sock")).await;
    make_socket(&f.path("moved/e/c.sock"));
    f.wait_present(&f.path("moved/e/c.sock")).await;
    f.settle().await;
    assert_eq!(f.paths(), f.expect(&["moved/a.sock", "moved/e/b.sock", "moved/e/c.sock"]));
}

/// Known weakness 10 upstream: duplicate create events and re-listings must
/// not give an unchanged socket a new generation (a needless re-registration).
#[tokio::test]
async fn duplicate_events_and_relistings_do_not_churn_generations() {
    let f = Fixture::start_with(
        |root| {
            fs::create_dir(root.join("sub")).unwrap();
            make_socket(&root.join("a.sock"));
            make_socket(&root.join("sub/b.sock"));
        },
        WatcherConfig::default(),
    );
    let before = f.desired.snapshot();
    for socket in ["a.sock", "sub/b.sock"] {
        fs::set_permissions(f.path(socket), fs::Permissions::from_mode(0o600)).unwrap();
    }
    // A new sibling directory is listed; so is a directory renamed in.
    fs::create_dir(f.path("sub/new")).unwrap();
    fs::create_dir(f.outside("moved-in")).unwrap();
    fs::rename(f.outside("moved-in"), f.path("sub/moved-in")).unwrap();
    fs::remove_dir(f.path("sub/new")).unwrap();
    f.watcher.rescan().await.unwrap();
    f.settle().await;
    f.watcher.rescan().await.unwrap();
    assert_eq!(f.desired.snapshot(), before);
}

/// Found by the random-tree property test: renaming a directory over an
/// empty one makes inotify report the old directory's removal under the
/// new name, after the rename.
#[tokio::test]
async fn directory_renamed_over_an_empty_directory_keeps_its_sockets() {
    let f = Fixture::start_with(
        |root| {
            fs::create_dir_all(root.join("a/b/c")).unwrap();
            fs::create_dir(root.join("d")).unwrap();
            make_socket(&root.join("a/b/c/q"));
        },
        WatcherConfig::default(),
    );
    f.wait_present(&f.path("a/b/c/q")).await;
    fs::rename(f.path("a/b"), f.path("d")).unwrap();
    f.wait_present(&f.path("d/c/q")).await;
    f.settle().await;
    assert_eq!(f.paths(), f.expect(&["d/c/q"]));
}
