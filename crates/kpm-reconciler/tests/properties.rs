//! Property tests: random scripts of socket create / remove / re-create,
//! misbehaving plugins and handlers, and a late handler, run against the real
//! reconciler and executor with real plugins on Unix sockets, on paused tokio
//! time (backoffs of minutes take no wall time).
//!
//! Each script runs twice: with the periodic full pass, and with events
//! alone driving the reconciler.
//!
//! Invariants:
//! - eventually ActualState holds exactly the desired sockets whose plugins
//!   behave, each with its desired generation;
//! - per socket the handler sees only validate → register → deregister
//!   sequences, never two calls at once;
//! - every registration is deregistered exactly once when its socket goes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::PathBuf;
use std::time::Duration;

use kpm_executor::ExecutorConfig;
use kpm_reconciler::ReconcilerConfig;
use kpm_test_support::registration::{self, Served};
use proptest::prelude::*;
use support::{Handler, HandlerScript, Manager, PluginScript, stop};

const SLOTS: usize = 3;
/// Longer than the sum of every backoff a behaving script can cause.
const CONVERGENCE: Duration = Duration::from_secs(15 * 60);
/// A resync period no scenario reaches: twice the two convergence waits.
const NO_RESYNC: Duration = Duration::from_secs(4 * 15 * 60);

#[derive(Debug, Clone)]
enum Action {
    /// Create the slot's socket, or re-create it (a new plugin incarnation).
    Create(usize, PluginScript),
    Remove(usize),
    AddHandler,
    Wait(Duration),
}

fn plugin_script() -> impl Strategy<Value = PluginScript> {
    (
        prop_oneof![9 => Just("DevicePlugin"), 1 => Just("UnknownPlugin")],
        prop_oneof![Just("a"), Just("b"), Just("c"), Just("rejected")],
        0usize..3,
        prop::bool::weighted(0.1),
        0usize..2,
    )
        .prop_map(|(plugin_type, name, get_info_failures, hang, notify_failures)| {
            PluginScript {
                plugin_type: plugin_type.into(),
                name: name.into(),
                get_info_failures,
                hang,
                notify_failures,
            }
        })
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (0..SLOTS, plugin_script()).prop_map(|(slot, script)| Action::Create(slot, script)),
        2 => (0..SLOTS).prop_map(Action::Remove),
        1 => Just(Action::AddHandler),
        3 => (0u64..3000).prop_map(|ms| Action::Wait(Duration::from_millis(ms))),
    ]
}

fn handler_script() -> impl Strategy<Value = HandlerScript> {
    (0usize..3, 0usize..3).prop_map(|(validate_failures, register_failures)| HandlerScript {
        reject: vec!["rejected".into()],
        validate_failures,
        register_failures,
    })
}

fn behaves(script: &PluginScript) -> bool {
    script.plugin_type == "DevicePlugin" && !script.hang && script.name != "rejected"
}

async fn scenario(
    actions: Vec<Action>,
    handler_script: HandlerScript,
    config: ReconcilerConfig,
) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let sockets: Vec<PathBuf> = (0..SLOTS).map(|i| dir.path().join(format!("p{i}.sock"))).collect();
    let handler = Handler::new(handler_script);
    let mut m = Manager::with_reconciler(ExecutorConfig::default(), config);
    m.start();
    let mut plugins: Vec<Option<(Served, PluginScript)>> = (0..SLOTS).map(|_| None).collect();
    let mut handler_added = false;

    for action in actions {
        match action {
            Action::Create(slot, script) => {
                if let Some((old, _)) = plugins[slot].take() {
                    stop(old);
                }
                let plugin = registration::serve(&sockets[slot], script.plugin()).await;
                m.desired.add_or_update(&sockets[slot]).unwrap();
                plugins[slot] = Some((plugin, script));
            }
            Action::Remove(slot) => {
                if let Some((plugin, _)) = plugins[slot].take() {
                    m.desired.remove(&sockets[slot]);
                    stop(plugin);
                }
            }
            Action::AddHandler if !handler_added => {
                m.reconciler.add_handler("DevicePlugin", handler.clone()).unwrap();
                handler_added = true;
            }
            Action::AddHandler => {}
            Action::Wait(duration) => tokio::time::sleep(duration).await,
        }
    }
    if !handler_added {
        m.reconciler.add_handler("DevicePlugin", handler.clone()).unwrap();
    }

    // Eventually exactly the behaving plugins are registered, in their current generation.
    let expected: Vec<(PathBuf, _)> = plugins
        .iter()
        .zip(&sockets)
        .filter(|(plugin, _)| plugin.as_ref().is_some_and(|(_, script)| behaves(script)))
        .map(|(_, socket)| (socket.clone(), m.desired.generation(socket).unwrap()))
        .collect();
    let converged = m
        .eventually(CONVERGENCE, |m| {
            m.actual.len() == expected.len()
                && expected.iter().all(|(socket, g)| m.actual.contains_generation(socket, *g))
        })
        .await;
    let registered: Vec<_> = m.actual.snapshot().into_iter().map(|p| p.socket_path).collect();
    prop_assert!(converged, "expected {expected:?}, registered {registered:?}");
    // ActualState changes before the handler hears of a deregistration: let
    // running operations finish before looking at the handler.
    m.reconciler.executor().operations().wait_for_completion().await;
    let in_handler: Vec<String> = expected.iter().map(|(s, _)| s.display().to_string()).collect();
    prop_assert_eq!(handler.registered(), in_handler);
    prop_assert!(handler.violations().is_empty(), "{:?}", handler.violations());

    // Every socket goes: every registration is deregistered exactly once.
    for (slot, plugin) in plugins.iter_mut().enumerate() {
        if let Some((plugin, _)) = plugin.take() {
            m.desired.remove(&sockets[slot]);
            stop(plugin);
        }
    }
    let drained = m
        .eventually(CONVERGENCE, |m| {
            m.actual.is_empty() && m.reconciler.executor().operations().is_empty()
        })
        .await;
    prop_assert!(drained, "left: {:?}", m.actual.snapshot());
    for socket in &sockets {
        let (registrations, deregistrations) = handler.balance(socket);
        prop_assert_eq!(registrations, deregistrations, "{}", socket.display());
    }
    prop_assert!(handler.violations().is_empty(), "{:?}", handler.violations());
    m.shutdown().await;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn reconciler_converges_and_keeps_the_handler_protocol(
        actions in prop::collection::vec(action(), 1..20),
        handler_script in handler_script(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(scenario(actions, handler_script, ReconcilerConfig::default()))?;
    }

    /// The same without the periodic full pass (a resync period far beyond
    /// the convergence bound): events alone must bring every socket home,
    /// or the safety net would hide a lost one.
    #[test]
    fn reconciler_converges_on_events_alone(
        actions in prop::collection::vec(action(), 1..20),
        handler_script in handler_script(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let config = ReconcilerConfig::default().reconcile_period(NO_RESYNC);
        runtime.block_on(scenario(actions, handler_script, config))?;
    }
}
