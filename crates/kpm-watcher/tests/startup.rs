//! Start-up: the initial listing, the creation of the registry directory,
//! start-up errors, the race between listing and watching, and stopping.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::sync::{Arc, Barrier};

use common::{Fixture, make_socket};
use kpm_cache::DesiredState;
use kpm_test_support::wait_until;
use kpm_watcher::{Watcher, WatcherConfig, WatcherError};

#[tokio::test]
async fn existing_sockets_are_registered_at_start() {
    let f = Fixture::start_with(
        |root| {
            fs::create_dir_all(root.join("sub/deeper")).unwrap();
            make_socket(&root.join("a.sock"));
            make_socket(&root.join("sub/no-extension"));
            make_socket(&root.join("sub/deeper/c.sock"));
        },
        WatcherConfig::default(),
    );
    // The listing is part of start: no waiting needed.
    assert_eq!(f.paths(), f.expect(&["a.sock", "sub/no-extension", "sub/deeper/c.sock"]));
}

#[tokio::test]
async fn hidden_entries_non_sockets_and_symlinks_are_ignored_at_start() {
    let f = Fixture::start_with(
        |root| {
            let outside = root.parent().unwrap().join("outside");
            make_socket(&root.join("a.sock"));
            make_socket(&root.join(".hidden.sock"));
            fs::create_dir_all(root.join(".hidden-dir")).unwrap();
            make_socket(&root.join(".hidden-dir/b.sock"));
            fs::create_dir_all(root.join("sub/.hidden")).unwrap();
            make_socket(&root.join("sub/.hidden/c.sock"));
            fs::write(root.join("x.sock"), "not a socket").unwrap();
            fs::write(root.join("sub/y.sock"), "not a socket").unwrap();
            make_socket(&outside.join("elsewhere.sock"));
            symlink(outside.join("elsewhere.sock"), root.join("link.sock")).unwrap();
            symlink(root.join("a.sock"), root.join("alias.sock")).unwrap();
            fs::create_dir(outside.join("dir")).unwrap();
            make_socket(&outside.join("dir/d.sock"));
            symlink(outside.join("dir"), root.join("linked-dir")).unwrap();
        },
        WatcherConfig::default(),
    );
    assert_eq!(f.paths(), f.expect(&["a.sock"]));
    f.settle().await;
    f.watcher.rescan().await.unwrap();
    assert_eq!(f.paths(), f.expect(&["a.sock"]));
}

#[tokio::test]
async fn missing_root_is_created_with_its_parents() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("var/lib/kubelet/plugins_registry");
    let desired = Arc::new(DesiredState::new());
    let watcher = Watcher::start(root.clone(), Arc::clone(&desired), WatcherConfig::default())
        .expect("start creates the registry directory");
    assert_eq!(watcher.root(), root);
    let metadata = fs::metadata(&root).unwrap();
    assert!(metadata.is_dir());
    let mode = metadata.permissions().mode() & 0o7777;
    assert_eq!(mode & !0o750, 0, "mode {mode:o} is 0750 less the umask");

    make_socket(&root.join("a.sock"));
    wait_until("a socket in the created root is registered", || {
        desired.contains(&root.join("a.sock"))
    })
    .await;
}

#[tokio::test]
async fn root_that_cannot_be_created_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    fs::write(&file, "").unwrap();
    for root in [file.join("plugins_registry"), file.clone()] {
        let error =
            Watcher::start(root.clone(), Arc::new(DesiredState::new()), WatcherConfig::default())
                .expect_err("a root under (or at) a regular file cannot be created");
        assert!(
            matches!(error, WatcherError::CreateRoot { ref path, .. } if *path == root),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(text.contains(&root.display().to_string()), "{text}");
        assert!(text.contains("creating root"), "{text}");
    }
}

#[test]
fn start_outside_a_tokio_runtime_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("plugins_registry");
    let error =
        Watcher::start(root.clone(), Arc::new(DesiredState::new()), WatcherConfig::default())
            .expect_err("no runtime to spawn on");
    assert!(matches!(error, WatcherError::NoRuntime { .. }), "{error:?}");
    assert!(!root.exists(), "nothing was done");
}

/// Known problem 2: a socket created while the watcher starts (between the
/// watch and the listing, or during either) is registered exactly once.
#[tokio::test]
async fn sockets_created_during_start_are_registered_exactly_once() {
    const SOCKETS: usize = 40;
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("plugins_registry");
        fs::create_dir(&root).unwrap();
        let paths: Vec<_> = (0..SOCKETS)
            .map(|i| {
                if i >= SOCKETS / 2 && i % 2 == 0 {
                    root.join(format!("late/s-{i}.sock"))
                } else {
                    root.join(format!("s-{i}.sock"))
                }
            })
            .collect();
        let go = Arc::new(Barrier::new(2));
        let binder = {
            let (go, root, paths) = (Arc::clone(&go), root.clone(), paths.clone());
            std::thread::spawn(move || {
                go.wait();
                for (i, path) in paths.iter().enumerate() {
                    if i == SOCKETS / 2 {
                        fs::create_dir(root.join("late")).unwrap();
                    }
                    make_socket(path);
                }
            })
        };
        let desired = Arc::new(DesiredState::new());
        go.wait();
        let watcher =
            Watcher::start(root.clone(), Arc::clone(&desired), WatcherConfig::default()).unwrap();
        binder.join().unwrap();
        let f = Fixture { dir, root, desired, watcher };
        wait_until(format_args!("round {round}: every socket is registered"), || {
            paths.iter().all(|path| f.desired.contains(path))
        })
        .await;
        f.settle().await;

        // Generations count from 1 and every add takes the next one: if each
        // socket was added exactly once, its generations are exactly 1..=N.
        let mut generations: Vec<u64> =
            paths.iter().map(|path| f.generation(path).unwrap().get()).collect();
        generations.sort_unstable();
        let once: Vec<u64> = (1..=SOCKETS as u64).collect();
        assert_eq!(generations, once, "round {round}: a socket was added more than once");

        let before = f.desired.snapshot();
        f.watcher.rescan().await.unwrap();
        assert_eq!(f.desired.snapshot(), before, "round {round}: a rescan churned generations");
    }
}

#[tokio::test]
async fn stop_ends_the_task_and_keeps_desired_state() {
    let f = Fixture::start_with(|root| make_socket(&root.join("a.sock")), WatcherConfig::default());
    let Fixture { dir: _dir, root, desired, watcher } = f;
    let holders = Arc::strong_count(&desired);
    watcher.stop().await;
    assert_eq!(Arc::strong_count(&desired), holders - 1, "the task released DesiredState");
    assert!(desired.contains(&root.join("a.sock")));
}

#[tokio::test]
async fn dropping_the_watcher_stops_it() {
    let f = Fixture::start();
    let Fixture { dir: _dir, root: _, desired, watcher } = f;
    let holders = Arc::strong_count(&desired);
    drop(watcher);
    wait_until("the task releases DesiredState", || Arc::strong_count(&desired) == holders - 1)
        .await;
}
