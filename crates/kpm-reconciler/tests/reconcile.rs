//! The reconciler with the real executor and real plugins on Unix sockets:
//! the upstream reconciler tests, and what kpm does beyond them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kpm_cache::{Generation, PluginEndpoint, PluginEvent};
use kpm_executor::{ExecutorConfig, ExponentialBackoff};
use kpm_test_support::DEADLINE;
use kpm_test_support::registration::serve;
use support::{Handler, HandlerScript, Manager, PluginScript, starting, stop};

fn registered_with(m: &Manager, socket: &Path, generation: Generation) -> bool {
    m.actual.contains_generation(socket, generation) && m.actual.len() == 1
}

fn running_manager(handler: &Arc<Handler>) -> Manager {
    let mut m = Manager::new(ExecutorConfig::default());
    m.reconciler.add_handler("DevicePlugin", handler.clone()).unwrap();
    m.start();
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_to_do_leaves_both_states_empty() {
    let handler = Handler::new(HandlerScript::default());
    let m = running_manager(&handler);
    m.reconciler.reconcile();
    assert!(m.desired.is_empty() && m.actual.is_empty());
    assert!(m.reconciler.executor().operations().is_empty());
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desired_socket_is_registered() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Handler::new(HandlerScript::default());
    let m = running_manager(&handler);
    let served =
        serve(&dir.path().join("plugin.sock"), PluginScript::device("example-plugin").plugin())
            .await;

    let generation = m.desired.add_or_update(&served.socket).unwrap();

    assert!(m.eventually(DEADLINE, |m| registered_with(m, &served.socket, generation)).await);
    assert!(served.plugin.statuses()[0].plugin_registered);
    let socket = served.socket.display();
    assert_eq!(
        handler.log(),
        [format!("validate example-plugin {socket}"), format!("register example-plugin {socket}")]
    );
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_socket_is_deregistered() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Handler::new(HandlerScript::default());
    let m = running_manager(&handler);
    let plugin =
        serve(&dir.path().join("plugin.sock"), PluginScript::device("example-plugin").plugin())
            .await;
    let socket = plugin.socket.clone();
    let generation = m.desired.add_or_update(&socket).unwrap();
    assert!(m.eventually(DEADLINE, |m| registered_with(m, &socket, generation)).await);

    m.desired.remove(&socket);
    stop(plugin);

    assert!(m.eventually(DEADLINE, |m| m.actual.is_empty()).await);
    assert!(m.eventually(DEADLINE, |m| m.reconciler.executor().operations().is_empty()).await);
    assert_eq!(
        handler.log().last().unwrap(),
        &format!("deregister example-plugin {}", socket.display())
    );
    assert_eq!(handler.balance(&socket), (1, 1));
    assert!(handler.violations().is_empty(), "{:?}", handler.violations());
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_generation_is_unregistered_then_registered_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Handler::new(HandlerScript::default());
    let m = running_manager(&handler);
    let plugin =
        serve(&dir.path().join("plugin2.sock"), PluginScript::device("example-plugin2").plugin())
            .await;
    let first = m.desired.add_or_update(&plugin.socket).unwrap();
    assert!(m.eventually(DEADLINE, |m| registered_with(m, &plugin.socket, first)).await);

    let second = m.desired.add_or_update(&plugin.socket).unwrap();

    assert!(m.eventually(DEADLINE, |m| registered_with(m, &plugin.socket, second)).await);
    let socket = plugin.socket.display();
    assert_eq!(
        handler.log(),
        [
            format!("validate example-plugin2 {socket}"),
            format!("register example-plugin2 {socket}"),
            format!("deregister example-plugin2 {socket}"),
            format!("validate example-plugin2 {socket}"),
            format!("register example-plugin2 {socket}"),
        ]
    );
    assert!(handler.violations().is_empty(), "{:?}", handler.violations());
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_arrived_before_its_handler_registers_when_the_handler_is_added() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Manager::new(ExecutorConfig::default());
    m.start();
    let served =
        serve(&dir.path().join("early.sock"), PluginScript::device("early").plugin()).await;
    let generation = m.desired.add_or_update(&served.socket).unwrap();
    // Rejected: no handler for its type yet.
    assert!(m.eventually(DEADLINE, |_| !served.plugin.statuses().is_empty()).await);
    assert!(
        served.plugin.statuses()[0]
            .error
            .contains("no handler registered for plugin type: DevicePlugin")
    );

    let handler = Handler::new(HandlerScript::default());
    m.reconciler.add_handler("DevicePlugin", handler.clone()).unwrap();

    assert!(m.eventually(DEADLINE, |m| registered_with(m, &served.socket, generation)).await);
    assert!(served.plugin.statuses().last().unwrap().plugin_registered);
    m.shutdown().await;
}

/// The failed generation's backoff in the test below: an hour.
const BACKOFF: Duration = Duration::from_secs(3600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_generation_does_not_inherit_the_old_ones_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Handler::new(HandlerScript::default());
    // A backoff far beyond the deadline: registering within the deadline
    // proves the new generation did not wait it out, on any machine.
    let backoff = ExponentialBackoff::try_new(BACKOFF, BACKOFF * 2).unwrap();
    let mut m = Manager::new(ExecutorConfig::default().backoff(backoff));
    m.reconciler.add_handler("DevicePlugin", handler.clone()).unwrap();
    m.start();
    let socket = dir.path().join("flaky.sock");
    let broken = PluginScript::device("flaky").plugin().get_info([], starting());
    let plugin = serve(&socket, broken).await;
    m.desired.add_or_update(&socket).unwrap();
    let ops = m.reconciler.executor().operations();
    assert!(
        m.eventually(DEADLINE, |_| ops.retry_at(&socket).is_some()).await,
        "first attempt failed"
    );

    // The plugin restarts: a new socket file, a new incarnation.
    stop(plugin);
    let plugin = serve(&socket, PluginScript::device("flaky").plugin()).await;
    let generation = m.desired.add_or_update(&socket).unwrap();

    let registered = m.eventually(DEADLINE, |m| registered_with(m, &socket, generation)).await;
    assert!(registered, "status: {:?}", ops.status(&socket));
    drop(plugin);
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_tell_the_story_of_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Handler::new(HandlerScript::default());
    let m = running_manager(&handler);
    let mut events = m.events.subscribe();
    let plugin = serve(&dir.path().join("e.sock"), PluginScript::device("evented").plugin()).await;
    let socket = plugin.socket.clone();

    let generation = m.desired.add_or_update(&socket).unwrap();
    assert!(m.eventually(DEADLINE, |m| registered_with(m, &socket, generation)).await);
    m.desired.remove(&socket);
    stop(plugin);
    assert!(m.eventually(DEADLINE, |m| m.actual.is_empty()).await);

    // Events follow the state changes they describe: collect until the last one.
    let mut seen = Vec::new();
    while !matches!(seen.last(), Some(PluginEvent::Deregistered { .. })) {
        seen.push(tokio::time::timeout(DEADLINE, events.recv()).await.unwrap().unwrap());
    }
    let endpoint = PluginEndpoint::RegistrationSocket(socket.clone());
    assert_eq!(
        seen,
        [
            PluginEvent::SocketSeen { socket: socket.clone(), generation },
            PluginEvent::Registered {
                socket: socket.clone(),
                generation,
                plugin_type: "DevicePlugin".into(),
                name: "evented".into(),
                endpoint,
            },
            PluginEvent::Deregistered {
                socket: socket.clone(),
                generation,
                plugin_type: "DevicePlugin".into(),
                name: "evented".into(),
            },
        ]
    );
    m.shutdown().await;
}
