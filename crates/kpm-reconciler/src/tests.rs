//! Unit tests of the per-socket decision and of the order of a batch; the
//! behaviour over time is in `tests/`.

use kpm_api::constants::MAX_CONFIG_DURATION;
use kpm_cache::{HandlerError, PluginDetails, PluginEndpoint, Registration};
use kpm_executor::ExecutorConfig;

use super::*;

struct NoopHandler;

#[async_trait::async_trait]
impl PluginHandler for NoopHandler {
    async fn validate(&self, _: &PluginDetails) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn register(&self, _: &PluginDetails) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn deregister(&self, _: &PluginDetails) {}
}

/// An executor with the default config, dialling from the process-wide budget.
fn executor() -> OperationExecutor {
    let budget = kpm_transport::fd::budget().clone();
    OperationExecutor::try_new(ExecutorConfig::default(), budget, EventBus::default()).unwrap()
}

fn reconciler(desired: &Arc<DesiredState>, actual: &Arc<ActualState>) -> Reconciler {
    Reconciler::try_new(
        ReconcilerConfig::default(),
        Arc::clone(desired),
        Arc::clone(actual),
        executor(),
        EventBus::default(),
    )
    .unwrap()
}

fn registered(socket: &Path, generation: Generation) -> Registered {
    let endpoint = PluginEndpoint::RegistrationSocket(socket.to_path_buf());
    let plugin = PluginDetails::new("test", endpoint, ["v1beta1"]);
    Registered::new(
        Registration::new(socket, generation, "DevicePlugin", plugin, None),
        Arc::new(NoopHandler),
    )
}

/// The action's kind and generation, comparable in assertions.
fn kind(action: &Action) -> (&'static str, Option<Generation>) {
    match action {
        Action::Unregister(old) => ("unregister", Some(old.registration.generation)),
        Action::Reregister(_, generation) => ("reregister", Some(*generation)),
        Action::Register(generation) => ("register", Some(*generation)),
        Action::Forget => ("forget", None),
    }
}

#[test]
fn each_socket_is_decided_from_its_two_generations() {
    let (desired, actual) = (Arc::new(DesiredState::new()), Arc::new(ActualState::new()));
    let r = reconciler(&desired, &actual);
    let socket = Path::new("/r/p.sock");
    assert_eq!(r.decide(socket).as_ref().map(kind), Some(("forget", None)));

    let first = desired.add_or_update(socket).unwrap();
    assert_eq!(r.decide(socket).as_ref().map(kind), Some(("register", Some(first))));

    actual.add(registered(socket, first)).unwrap();
    assert!(r.decide(socket).is_none(), "in sync");

    let second = desired.add_or_update(socket).unwrap();
    assert_eq!(r.decide(socket).as_ref().map(kind), Some(("reregister", Some(second))));
    match r.decide(socket) {
        Some(Action::Reregister(old, _)) => assert_eq!(old.registration.generation, first),
        other => panic!("expected a re-registration, got {other:?}"),
    }

    desired.remove(socket);
    assert_eq!(r.decide(socket).as_ref().map(kind), Some(("unregister", Some(first))));
}

#[test]
fn a_held_socket_is_deregistered_and_not_registered_until_released() {
    let (desired, actual) = (Arc::new(DesiredState::new()), Arc::new(ActualState::new()));
    let r = reconciler(&desired, &actual);
    let socket = Path::new("/r/p.sock");
    let first = desired.add_or_update(socket).unwrap();
    actual.add(registered(socket, first)).unwrap();
    assert!(desired.hold(socket, first, "its endpoint is gone".into()));
    assert_eq!(r.decide(socket).as_ref().map(kind), Some(("unregister", Some(first))));

    actual.remove(socket);
    assert_eq!(r.decide(socket).as_ref().map(kind), Some(("forget", None)), "nothing to register");

    let released = desired.release(socket, first).unwrap();
    assert_eq!(r.decide(socket).as_ref().map(kind), Some(("register", Some(released))));
}

#[test]
fn a_batch_unregisters_before_it_registers_each_phase_in_path_order() {
    let (desired, actual) = (Arc::new(DesiredState::new()), Arc::new(ActualState::new()));
    let r = reconciler(&desired, &actual);
    let path = |name: &str| PathBuf::from(format!("/r/{name}.sock"));
    // In sync: no action.
    let a = desired.add_or_update(&path("a")).unwrap();
    actual.add(registered(&path("a"), a)).unwrap();
    // Gone: unregister.
    actual.add(registered(&path("c"), a)).unwrap();
    // Re-created: re-register.
    let d_old = desired.add_or_update(&path("d")).unwrap();
    actual.add(registered(&path("d"), d_old)).unwrap();
    let d = desired.add_or_update(&path("d")).unwrap();
    // New, and sorting before every other path: register, but after the others.
    let zero = desired.add_or_update(&path("0")).unwrap();
    let b = desired.add_or_update(&path("b")).unwrap();

    let sockets: HashSet<PathBuf> = ["e", "d", "c", "b", "a", "0"].map(path).into();
    let plan: Vec<(PathBuf, _)> =
        r.plan(sockets).iter().map(|(socket, action)| (socket.clone(), kind(action))).collect();
    assert_eq!(
        plan,
        [
            (path("c"), ("unregister", Some(a))),
            (path("d"), ("reregister", Some(d))),
            (path("0"), ("register", Some(zero))),
            (path("b"), ("register", Some(b))),
            (path("e"), ("forget", None)),
        ]
    );
}

#[test]
fn due_retries_are_taken_once_and_later_ones_stay() {
    let now = Instant::now();
    let second = Duration::from_secs(1);
    let mut state = State::default();
    for (at, name) in [(now, "a"), (now - second, "b"), (now + second, "c"), (now, "b")] {
        state.retries.insert((at, PathBuf::from(name)));
    }
    let mut dirty = HashSet::new();
    state.take_due(now, &mut dirty);
    assert_eq!(dirty, ["a", "b"].map(PathBuf::from).into());
    assert_eq!(state.retries.len(), 1);
    state.take_due(now, &mut dirty);
    assert_eq!(dirty.len(), 2, "nothing more is due");
    assert_eq!(state.retries.first(), Some(&(now + second, PathBuf::from("c"))));
}

#[test]
fn reconcile_periods_beyond_the_bound_are_refused() {
    for too_long in [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        MAX_CONFIG_DURATION + Duration::from_nanos(1),
    ] {
        let error = ReconcilerConfig::default().reconcile_period(too_long).validate().unwrap_err();
        assert!(
            matches!(error, ReconcilerError::InvalidConfig(kpm_api::config::DurationOutOfRange { field: "reconcile_period", value, .. }) if value == too_long),
            "{error}"
        );
        assert!(error.to_string().contains("reconcile_period"), "{error}");
        let (desired, actual) = (Arc::new(DesiredState::new()), Arc::new(ActualState::new()));
        let config = ReconcilerConfig::default().reconcile_period(too_long);
        let refused = Reconciler::try_new(config, desired, actual, executor(), EventBus::default());
        assert_eq!(refused.map(drop).unwrap_err(), error);
    }
    for fine in [Duration::ZERO, Duration::from_secs(10), MAX_CONFIG_DURATION] {
        assert_eq!(
            ReconcilerConfig::default().reconcile_period(fine).validate(),
            Ok(()),
            "{fine:?}"
        );
    }
}

/// Runs a reconciler with `reconcile_period` on paused time, registers a plugin
/// behind its back (no event reports it: only a periodic full pass finds
/// it), lets `wait` pass and says whether the plugin was unregistered.
async fn stray_found_after(reconcile_period: Duration, wait: Duration) -> bool {
    let (desired, actual) = (Arc::new(DesiredState::new()), Arc::new(ActualState::new()));
    let mut r = reconciler(&desired, &actual);
    // Set behind `try_new`'s back: `run` must not panic on a period that
    // `validate` would refuse (past the clock's range) either.
    r.config.reconcile_period = reconcile_period;
    let r = Arc::new(r);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let r = Arc::clone(&r);
        async move {
            r.run(async {
                let _ = stopped.await;
            })
            .await;
        }
    });
    // Lets the first full pass run.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let stray = Path::new("/r/stray.sock");
    let generation = DesiredState::new().add_or_update(stray).unwrap();
    actual.add(registered(stray, generation)).unwrap();

    tokio::time::advance(wait).await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    r.executor().operations().wait_for_completion().await;
    let found = !actual.contains(stray);
    drop(stop);
    running.await.unwrap();
    found
}

#[tokio::test(start_paused = true)]
async fn the_longest_reconcile_period_runs_its_full_pass() {
    assert!(stray_found_after(MAX_CONFIG_DURATION, MAX_CONFIG_DURATION).await);
}

#[tokio::test(start_paused = true)]
async fn periods_past_the_clock_or_zero_run_no_periodic_pass_and_do_not_panic() {
    for period in [Duration::MAX, Duration::from_secs(u64::MAX), Duration::ZERO] {
        assert!(!stray_found_after(period, 3 * MAX_CONFIG_DURATION).await, "{period:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn full_passes_over_sockets_in_sync_are_skipped_until_a_state_changes() {
    let (desired, actual) = (Arc::new(DesiredState::new()), Arc::new(ActualState::new()));
    let r = reconciler(&desired, &actual);
    let socket = Path::new("/r/a.sock");
    let generation = desired.add_or_update(socket).unwrap();
    actual.add(registered(socket, generation)).unwrap();
    r.reconcile();
    r.reconcile();
    assert_eq!(r.full_passes_skipped(), 1, "the second pass would have found what the first did");

    // Registered behind the reconciler's back: no journal reports it.
    let stray = Path::new("/r/stray.sock");
    let other = DesiredState::new().add_or_update(stray).unwrap();
    actual.add(registered(stray, other)).unwrap();
    r.reconcile();
    assert_eq!(r.full_passes_skipped(), 1, "ActualState changed: the pass must look");
    r.executor().operations().wait_for_completion().await;
    assert!(!actual.contains(stray));

    // The pass that forgets the finished operation acted; the one after it
    // finds everything in sync, and the next is skipped again.
    for _ in 0..3 {
        r.reconcile();
    }
    assert_eq!(r.full_passes_skipped(), 2);
    assert!(actual.contains(socket));
}
