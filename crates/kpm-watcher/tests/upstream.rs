//! Port of the kubelet's `pluginwatcher/plugin_watcher_test.go` (watcher and
//! desired state only). Upstream serves gRPC example plugins; the watcher
//! only looks at socket files, so listening Unix sockets stand in for them.
//! Stopping a plugin closes its listener and deletes its socket file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs;
use std::os::unix::net::UnixListener;
use std::path::Path;

use common::{Fixture, serve};
use kpm_test_support::wait_until;
use kpm_watcher::WatcherConfig;

/// Stops a test plugin the way upstream's example plugin does.
fn stop(listener: UnixListener, socket: &Path) {
    drop(listener);
    fs::remove_file(socket).unwrap();
}

/// `TestPluginRegistration`: ten sequential rounds of register, then stop.
#[tokio::test]
async fn plugin_registration() {
    let f = Fixture::start();
    for i in 0..10 {
        let socket = f.path(&format!("plugin-{i}.sock"));
        let plugin = serve(&socket);
        f.wait_present(&socket).await;
        assert_eq!(f.desired.len(), 1, "round {i}");
        stop(plugin, &socket);
        f.wait_absent(&socket).await;
        assert_eq!(f.desired.len(), 0, "round {i}");
    }
}

/// `TestPluginRegistrationSameName`: ten plugins (upstream: all with the same
/// name, which DesiredState does not know) on distinct sockets.
#[tokio::test]
async fn plugin_registration_same_name() {
    let f = Fixture::start();
    let mut plugins = Vec::new();
    for i in 0..10 {
        let socket = f.path(&format!("plugin-{i}.sock"));
        plugins.push(serve(&socket));
        f.wait_present(&socket).await;
        assert_eq!(f.desired.len(), i + 1);
    }
}

/// `TestPluginReRegistration`: ten cycles of remove, wait, re-create on the
/// same path, wait; each incarnation has a strictly newer generation.
#[tokio::test]
async fn plugin_re_registration() {
    let f = Fixture::start();
    let socket = f.path("plugin-reregistration.sock");
    let mut plugin = serve(&socket);
    let mut last = f.wait_present(&socket).await;
    for i in 0..10 {
        stop(plugin, &socket);
        f.wait_absent(&socket).await;
        plugin = serve(&socket);
        let generation = f.wait_present(&socket).await;
        assert_eq!(f.desired.len(), 1, "cycle {i}");
        assert!(generation > last, "cycle {i}: {generation} is not newer than {last}");
        last = generation;
    }
}

/// `TestPluginRegistrationAtKubeletStart`: ten plugins serving before the
/// watcher starts are all found.
#[tokio::test]
async fn plugin_registration_at_kubelet_start() {
    let mut plugins = Vec::new();
    let f = Fixture::start_with(
        |root| {
            for i in 0..10 {
                plugins.push(serve(&root.join(format!("plugin-{i}.sock"))));
            }
        },
        WatcherConfig::default(),
    );
    wait_until("all ten plugins are registered", || f.desired.len() == 10).await;
    for i in 0..10 {
        assert!(f.desired.contains(&f.path(&format!("plugin-{i}.sock"))), "plugin {i}");
    }
}
