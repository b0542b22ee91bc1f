//! Unit tests of the per-socket decision and of the order of a batch; the
//! behaviour over time is in `tests/`.

use std::time::SystemTime;

use kpm_cache::HandlerError;

use super::*;

struct NoopHandler;

#[async_trait::async_trait]
impl PluginHandler for NoopHandler {
    async fn validate(&self, _: &str, _: &str, _: &[String]) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn register(&self, _: &str, _: &str, _: &[String]) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn deregister(&self, _: &str, _: &str) {}
}

fn reconciler(desired: &Arc<DesiredState>, actual: &Arc<ActualState>) -> Reconciler {
    Reconciler::new(
        Arc::clone(desired),
        Arc::clone(actual),
        OperationExecutor::default(),
        EventBus::default(),
        ReconcilerConfig::default(),
    )
}

fn registered(socket: &Path, generation: Generation) -> PluginInfo {
    PluginInfo {
        socket_path: socket.to_path_buf(),
        generation,
        plugin_type: "DevicePlugin".into(),
        name: "test".into(),
        endpoint: socket.display().to_string(),
        versions: vec!["v1beta1".into()],
        registered_at: SystemTime::now(),
        handler: Arc::new(NoopHandler),
    }
}

/// The action's kind and generation, comparable in assertions.
fn kind(action: &Action) -> (&'static str, Option<Generation>) {
    match action {
        Action::Unregister(info) => ("unregister", Some(info.generation)),
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
        Some(Action::Reregister(old, _)) => assert_eq!(old.generation, first),
        other => panic!("expected a re-registration, got {other:?}"),
    }

    desired.remove(socket);
    assert_eq!(r.decide(socket).as_ref().map(kind), Some(("unregister", Some(first))));
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
