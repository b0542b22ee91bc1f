//! The incremental reconciler on paused time: a pass after an event looks
//! only at the sockets the event concerns, backoffs expire on time, changes
//! between two passes make one decision, and the periodic full pass heals
//! what no event reported.
//!
//! Sockets that nobody serves fail at once (the dial finds no file), with no
//! IO and no wall time; only the last test runs a real plugin.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kpm_cache::{
    DesiredState, PluginDetails, PluginEndpoint, PluginEvent, Registered, Registration,
};
use kpm_executor::{ExecutorConfig, ExponentialBackoff};
use kpm_reconciler::ReconcilerConfig;
use kpm_test_support::registration::serve;
use support::{Handler, HandlerScript, Manager, PluginScript};
use tokio::sync::broadcast::{Receiver, error::TryRecvError};
use tokio::time::{Instant, sleep, sleep_until};

const INITIAL: Duration = ExponentialBackoff::DEFAULT_INITIAL;
const MILLI: Duration = Duration::from_millis(1);

fn resync() -> Duration {
    ReconcilerConfig::default().reconcile_period
}

fn started_manager() -> Manager {
    let mut m = Manager::new(ExecutorConfig::default());
    m.start();
    m
}

/// Lets every ready task run (paused time only moves on when none is left),
/// then one millisecond more.
async fn settle() {
    sleep(MILLI).await;
}

/// The file names of the sockets of the registration attempts (each one
/// fails: `Rejected`) published since the previous call, in order.
fn attempts(events: &mut Receiver<PluginEvent>) -> Vec<String> {
    let mut sockets = Vec::new();
    loop {
        match events.try_recv() {
            Ok(PluginEvent::Rejected { socket, .. }) => {
                sockets.push(socket.file_name().unwrap().to_string_lossy().into_owned());
            }
            Ok(_) => {}
            Err(TryRecvError::Empty | TryRecvError::Closed) => return sockets,
            Err(TryRecvError::Lagged(n)) => panic!("missed {n} events"),
        }
    }
}

fn seen(events: &mut Receiver<PluginEvent>) -> Vec<PluginEvent> {
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        if matches!(event, PluginEvent::SocketSeen { .. }) {
            seen.push(event);
        }
    }
    seen
}

#[tokio::test(start_paused = true)]
async fn a_change_to_one_socket_leaves_the_others_alone() {
    let dir = tempfile::tempdir().unwrap();
    let [a, b, c] = ["a", "b", "c"].map(|name| dir.path().join(format!("{name}.sock")));
    let m = started_manager();
    let mut events = m.events.subscribe();
    let ops = m.reconciler.executor().operations();
    m.desired.add_or_update(&a).unwrap();
    m.desired.add_or_update(&b).unwrap();
    settle().await;
    let mut tried = attempts(&mut events);
    tried.sort();
    assert_eq!(tried, ["a.sock", "b.sock"]);
    let (a_due, b_due) = (ops.retry_at(&a).unwrap(), ops.retry_at(&b).unwrap());
    let skips = m.reconciler.backoff_skips();

    m.desired.add_or_update(&c).unwrap();
    settle().await;

    assert_eq!(attempts(&mut events), ["c.sock"]);
    // c was refused once, when its failure came back; a full pass would
    // have refused a and b twice more.
    assert_eq!(m.reconciler.backoff_skips(), skips + 1);
    assert_eq!((ops.retry_at(&a), ops.retry_at(&b)), (Some(a_due), Some(b_due)));
    assert!(ops.retry_at(&c).is_some());
    m.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_backoff_expiry_retries_exactly_the_due_socket_when_it_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let [a, b] = ["a", "b"].map(|name| dir.path().join(format!("{name}.sock")));
    let m = started_manager();
    let mut events = m.events.subscribe();
    let ops = m.reconciler.executor().operations();
    m.desired.add_or_update(&a).unwrap();
    settle().await;
    let a_due = ops.retry_at(&a).unwrap();
    sleep(Duration::from_millis(200)).await;
    m.desired.add_or_update(&b).unwrap();
    settle().await;
    let b_due = ops.retry_at(&b).unwrap();
    assert!(b_due > a_due);
    assert_eq!(attempts(&mut events), ["a.sock", "b.sock"]);

    sleep_until(a_due - MILLI).await;
    assert_eq!(attempts(&mut events), [] as [&str; 0], "nothing is due yet");

    sleep_until(a_due + MILLI).await;
    assert_eq!(attempts(&mut events), ["a.sock"]);
    assert_eq!(ops.retry_at(&a), Some(a_due + 2 * INITIAL), "a failed again at a_due");
    assert_eq!(ops.retry_at(&b), Some(b_due));

    sleep_until(b_due + MILLI).await;
    assert_eq!(attempts(&mut events), ["b.sock"]);
    assert_eq!(ops.retry_at(&b), Some(b_due + 2 * INITIAL));

    // A socket that goes away while it backs off is forgotten at once; its
    // stale retry time then passes with one idle look (a reconciler that
    // spun on it would keep paused time from ever moving on).
    m.desired.remove(&a);
    settle().await;
    assert_eq!(ops.status(&a), None);
    sleep_until(a_due + 2 * INITIAL + MILLI).await;
    sleep_until(b_due + 2 * INITIAL + MILLI).await;
    assert_eq!(attempts(&mut events), ["b.sock"]);
    m.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn changes_between_two_passes_make_one_decision() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.sock");
    let m = started_manager();
    let mut events = m.events.subscribe();
    settle().await;

    // No await in between: the reconciler sees the three in one batch.
    m.desired.add_or_update(&a).unwrap();
    m.desired.add_or_update(&a).unwrap();
    let last = m.desired.add_or_update(&a).unwrap();
    settle().await;

    assert_eq!(
        seen(&mut events),
        [PluginEvent::SocketSeen { socket: a.clone(), generation: last }]
    );
    let mut events = m.events.subscribe();
    m.desired.add_or_update(&a).unwrap();
    m.desired.remove(&a);
    settle().await;
    assert_eq!(attempts(&mut events), [] as [&str; 0], "gone before its pass: not tried");
    assert_eq!(m.reconciler.executor().operations().len(), 0);
    m.shutdown().await;
}

/// A plugin as if registered by someone else: no event tells the reconciler.
fn stray(socket: &Path, handler: &Arc<Handler>) -> Registered {
    let generation = DesiredState::new().add_or_update(socket).unwrap();
    let endpoint = PluginEndpoint::RegistrationSocket(socket.to_path_buf());
    let plugin = PluginDetails::new("stray", endpoint, ["v1beta1"]);
    let registration = Registration::new(socket, generation, "DevicePlugin", plugin, None);
    Registered::new(registration, Arc::clone(handler) as _)
}

#[tokio::test(start_paused = true)]
async fn the_periodic_pass_unregisters_what_no_event_reported_despite_other_events() {
    let dir = tempfile::tempdir().unwrap();
    let (gone, busy) = (dir.path().join("gone.sock"), dir.path().join("busy.sock"));
    let handler = Handler::new(HandlerScript::default());
    let started = Instant::now();
    let m = started_manager();
    settle().await;
    m.actual.add(stray(&gone, &handler)).unwrap();

    // Events on another socket keep waking the reconciler until just before
    // the resync: the safety net runs on its own schedule all the same.
    while Instant::now() + Duration::from_millis(500) < started + resync() {
        m.desired.add_or_update(&busy).unwrap();
        sleep(Duration::from_millis(500)).await;
    }
    sleep_until(started + resync() - MILLI).await;
    assert!(m.actual.contains(&gone), "only the periodic pass looks at it");
    assert!(handler.log().is_empty());

    sleep_until(started + resync() + MILLI).await;
    assert!(!m.actual.contains(&gone));
    assert_eq!(handler.log(), [format!("deregister stray {}", gone.display())]);
    m.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_periodic_pass_re_registers_a_plugin_removed_behind_its_back() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Handler::new(HandlerScript::default());
    let mut m = Manager::new(ExecutorConfig::default());
    m.reconciler.add_handler("DevicePlugin", handler.clone()).unwrap();
    m.start();
    let plugin = serve(&dir.path().join("p.sock"), PluginScript::device("p").plugin()).await;
    let socket = plugin.socket.clone();
    let generation = m.desired.add_or_update(&socket).unwrap();
    let registered = |m: &Manager| m.actual.contains_generation(&socket, generation);
    assert!(m.eventually(Duration::from_secs(5), registered).await);

    // ActualState has no journal: nothing wakes the reconciler for this.
    m.actual.remove(&socket);
    settle().await;
    assert!(!m.actual.contains(&socket));

    assert!(m.eventually(resync() + Duration::from_secs(1), registered).await);
    let registrations = handler.log().iter().filter(|call| call.starts_with("register")).count();
    assert_eq!(registrations, 2, "{:?}", handler.log());
    m.shutdown().await;
}
