//! The plugin manager from the outside, as the kubelet's plugin manager test
//! drives it: plugins appear in nested directories of the registry, are
//! validated and registered, and are deregistered when they stop.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use kpm::{HandlerError, PluginDetails, PluginEvent, PluginHandler, PluginManager, PluginState};
use kpm_registrar::Registrar;
use kpm_test_support::{DEADLINE, wait_until};
use parking_lot::Mutex;

/// Records `validate|register|deregister <name> <endpoint>`.
#[derive(Default)]
struct RecordingHandler(Mutex<Vec<String>>);

impl RecordingHandler {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock())
    }
}

#[async_trait::async_trait]
impl PluginHandler for RecordingHandler {
    async fn validate(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let (name, endpoint) = (plugin.name.as_str(), &plugin.endpoint);
        self.0.lock().push(format!("validate {name} {endpoint}"));
        Ok(())
    }
    async fn register(&self, plugin: &PluginDetails) -> Result<(), HandlerError> {
        let (name, endpoint) = (plugin.name.as_str(), &plugin.endpoint);
        self.0.lock().push(format!("register {name} {endpoint}"));
        Ok(())
    }
    async fn deregister(&self, plugin: &PluginDetails) {
        let (name, endpoint) = (plugin.name.as_str(), &plugin.endpoint);
        self.0.lock().push(format!("deregister {name} {endpoint}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_in_nested_directories_register_and_deregister() {
    let root = tempfile::tempdir().unwrap();
    let registry = root.path().join("plugins_registry");
    let handler = Arc::new(RecordingHandler::default());
    let manager = PluginManager::builder()
        .registry_dir(&registry)
        .handler(kpm::api::DEVICE_PLUGIN, handler.clone())
        .build()
        .unwrap();
    let handle = manager.handle();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(manager.run(async { drop(stopped.await) }));
    wait_until("the registry directory is created", || registry.is_dir()).await;

    // Plugins in the root, in 0/ and in 0/1/, one after the other.
    let mut dir = registry.clone();
    for i in 0..3 {
        if i > 0 {
            dir = dir.join((i - 1).to_string());
            std::fs::create_dir(&dir).unwrap();
        }
        let name = format!("example-plugin-{i}");
        let plugin = Registrar::builder(kpm::api::DEVICE_PLUGIN, &name)
            .versions(["v1beta1", "v1beta2"])
            .socket_dir(&dir)
            .serve()
            .await
            .unwrap();
        let socket = plugin.socket_path().display().to_string();

        let status = plugin.wait_for_status(DEADLINE).await.unwrap();
        assert!(status.plugin_registered, "{status:?}");
        assert_eq!(
            handler.take(),
            [format!("validate {name} {socket}"), format!("register {name} {socket}")]
        );
        // The plugin is told before it is recorded as registered.
        let registered = |s: &kpm::PluginStatus| {
            s.state == PluginState::Registered && s.plugin().is_some_and(|p| p.name == name)
        };
        wait_until(
            "it is listed registered",
            || matches!(handle.status().as_slice(), [s] if registered(s)),
        )
        .await;

        plugin.shutdown().await.unwrap();
        let mut log = Vec::new();
        wait_until("the handler is told", || {
            log.extend(handler.take());
            !log.is_empty()
        })
        .await;
        assert_eq!(log, [format!("deregister {name} {socket}")]);
        wait_until("it is gone from the status", || handle.status().is_empty()).await;
    }

    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_added_while_running_picks_up_waiting_plugins_and_events_say_so() {
    let root = tempfile::tempdir().unwrap();
    let registry = root.path().join("plugins_registry");
    let manager = PluginManager::builder().registry_dir(&registry).build().unwrap();
    let handle = manager.handle();
    let mut events = handle.subscribe();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(manager.run(async { drop(stopped.await) }));
    wait_until("the registry directory is created", || registry.is_dir()).await;

    let plugin = Registrar::builder(kpm::api::CSI_PLUGIN, "csi.example.com")
        .socket_dir(&registry)
        .serve()
        .await
        .unwrap();
    let rejected = plugin.wait_for_status(DEADLINE).await.unwrap();
    assert!(!rejected.plugin_registered);
    assert!(
        rejected.error.contains("no handler registered for plugin type: CSIPlugin"),
        "{rejected:?}"
    );
    // No handler for its type: only a new socket can change that, or a handler.
    wait_until("it is listed failed", || {
        handle.status().first().is_some_and(|s| s.state == PluginState::Failed)
    })
    .await;

    handle
        .add_handler(kpm::api::CSI_PLUGIN, Arc::new(kpm::BasicHandler::new(kpm::api::CSI_PLUGIN)))
        .unwrap();
    let mut status = plugin.status();
    let registered = tokio::time::timeout(
        DEADLINE,
        status.wait_for(|s| s.as_ref().is_some_and(|s| s.plugin_registered)),
    )
    .await;
    assert!(registered.is_ok(), "registered once the handler is there");

    let mut kinds = Vec::new();
    while kinds.last() != Some(&"registered") {
        let event = tokio::time::timeout(DEADLINE, events.recv()).await.unwrap().unwrap();
        kinds.push(match event {
            PluginEvent::SocketSeen { .. } => "seen",
            PluginEvent::Rejected { .. } => "rejected",
            PluginEvent::Registered { .. } => "registered",
            PluginEvent::Deregistered { .. } => "deregistered",
            PluginEvent::RetryScheduled { .. } => "retry",
            PluginEvent::Unresponsive { .. } => "unresponsive",
            other => panic!("an event this test does not know: {other:?}"),
        });
    }
    assert_eq!(kinds, ["seen", "rejected", "registered"]);
    plugin.shutdown().await.unwrap();
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
}

/// The handle is taken before `run` starts the watcher, and still reads the
/// rescans of the watcher `run` starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handle_counts_the_rescans_of_the_running_watcher() {
    let root = tempfile::tempdir().unwrap();
    let registry = root.path().join("plugins_registry");
    let manager = PluginManager::builder()
        .registry_dir(&registry)
        .resync_period(std::time::Duration::from_millis(20))
        .build()
        .unwrap();
    let handle = manager.handle();
    assert_eq!(handle.stats().rescans, 0, "nothing is watched before run");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(manager.run(async { drop(stopped.await) }));
    wait_until("periodic resyncs are counted", || handle.stats().rescans >= 2).await;
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
}
