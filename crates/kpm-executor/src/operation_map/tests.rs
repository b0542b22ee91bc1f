//! Tests of [`OperationMap`]: the goroutinemap test catalogue (spec §5.10,
//! backoff flavour, since an `OperationMap` always backs off), then what goes
//! beyond upstream (reset, forget, permanent failures, completions), then two
//! property tests against a model of the map.
//!
//! Everything runs on paused tokio time: operations block on channels the test
//! releases, and backoffs are crossed with `tokio::time::advance`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tokio::sync::oneshot;
use tokio::time::{Instant, advance, timeout};

use super::OperationMap;
use crate::{ExecutorError, ExponentialBackoff};

const INITIAL: Duration = ExponentialBackoff::DEFAULT_INITIAL;
const MILLI: Duration = Duration::from_millis(1);
/// A bound far beyond any wait in these tests. On paused time, a timeout of
/// this length that fires costs nothing: the runtime jumps to it when idle.
const LONG: Duration = Duration::from_secs(3600);

type OpResult = Result<(), ExecutorError>;

fn key(name: &str) -> PathBuf {
    PathBuf::from(format!("/var/lib/kubelet/plugins_registry/{name}.sock"))
}

/// A failure that backs off (not permanent).
fn transient(socket: &Path) -> ExecutorError {
    ExecutorError::GetInfoTimeout { socket: socket.to_path_buf(), timeout: Duration::from_secs(1) }
}

fn not_a_registration_socket(socket: &Path) -> ExecutorError {
    ExecutorError::NotARegistrationSocket {
        socket: socket.to_path_buf(),
        message: "unknown service pluginregistration.Registration".to_owned(),
    }
}

fn unknown_plugin_type(socket: &Path) -> ExecutorError {
    ExecutorError::UnknownPluginType {
        socket: socket.to_path_buf(),
        plugin_type: "Frobnicator".to_owned(),
    }
}

fn succeeds() -> impl Future<Output = OpResult> + Send + 'static {
    std::future::ready(Ok(()))
}

fn fails(socket: &Path) -> impl Future<Output = OpResult> + Send + 'static {
    std::future::ready(Err(transient(socket)))
}

/// An operation that runs until the returned sender fires (or is dropped),
/// then returns `result`.
fn gated(
    result: OpResult,
) -> (oneshot::Sender<()>, impl Future<Output = OpResult> + Send + 'static) {
    let (release, gate) = oneshot::channel();
    (release, async move {
        gate.await.ok();
        result
    })
}

/// An operation that panics with `message` once released.
fn gated_panic(message: String) -> (oneshot::Sender<()>, impl Future<Output = OpResult> + Send) {
    let (release, gate) = oneshot::channel::<()>();
    (release, async move {
        gate.await.ok();
        panic!("{message}")
    })
}

/// The parts of a [`ExecutorError::Backoff`], or a panic naming what came instead.
fn expect_backoff(result: OpResult) -> (Instant, Duration, String) {
    match result {
        Err(ExecutorError::Backoff { until, wait, last_error, .. }) => (until, wait, last_error),
        other => panic!("expected a Backoff error, got {other:?}"),
    }
}

fn expect_failed_permanently(result: OpResult) -> String {
    match result {
        Err(ExecutorError::FailedPermanently { last_error, .. }) => last_error,
        other => panic!("expected a FailedPermanently error, got {other:?}"),
    }
}

/// `map.wait()`, failing the test instead of hanging when it does not return.
async fn wait_until_empty(map: &OperationMap) {
    timeout(LONG, map.wait()).await.expect("wait() did not return");
}

/// `map.wait_for_completion()`, failing the test instead of hanging when it
/// does not return.
async fn wait_until_idle(map: &OperationMap) {
    timeout(LONG, map.wait_for_completion()).await.expect("wait_for_completion() did not return");
}

/// Waits until the operation on `key` (if any) has completed.
async fn settled(map: &OperationMap, key: &Path) {
    let mut completions = map.completions();
    while map.is_pending(key) {
        completions.changed().await;
    }
}

// === The goroutinemap catalogue (spec §5.10) ===

#[tokio::test(start_paused = true)]
async fn single_start_runs_the_operation() {
    let map = OperationMap::default();
    let (ran, has_run) = oneshot::channel();
    let result = map.start(&key("a"), async move {
        ran.send(()).ok();
        Ok(())
    });
    assert!(result.is_ok(), "{result:?}");
    has_run.await.expect("the operation ran");
    wait_until_empty(&map).await;
    assert!(map.is_empty());
}

#[tokio::test(start_paused = true)]
async fn two_starts_on_different_keys_both_run() {
    let map = OperationMap::default();
    let (release_a, op_a) = gated(Ok(()));
    let (release_b, op_b) = gated(Ok(()));
    map.start(&key("a"), op_a).unwrap();
    map.start(&key("b"), op_b).unwrap();
    assert!(map.is_pending(&key("a")) && map.is_pending(&key("b")));
    assert_eq!(map.len(), 2);

    release_a.send(()).unwrap();
    release_b.send(()).unwrap();
    wait_until_empty(&map).await;
    assert!(map.is_empty());
}

#[tokio::test(start_paused = true)]
async fn second_start_after_first_completes_runs() {
    let map = OperationMap::default();
    let a = key("a");
    map.start(&a, succeeds()).unwrap();
    wait_until_idle(&map).await;
    assert!(map.is_empty(), "a success leaves no entry");

    let before = Instant::now();
    map.start(&a, succeeds()).unwrap();
    wait_until_empty(&map).await;
    assert_eq!(Instant::now(), before, "no backoff after a success");
}

#[tokio::test(start_paused = true)]
async fn second_start_after_first_panics_waits_out_the_backoff() {
    let map = OperationMap::default();
    let a = key("a");
    let (release, op) = gated_panic("first operation panics".to_owned());
    map.start(&a, op).unwrap();
    release.send(()).unwrap();
    wait_until_idle(&map).await;

    let failed_at = Instant::now();
    let (until, wait, _) = expect_backoff(map.start(&a, succeeds()));
    assert_eq!((until, wait), (failed_at + INITIAL, INITIAL));

    advance(INITIAL.saturating_sub(MILLI)).await;
    expect_backoff(map.start(&a, succeeds()));

    // A retry is permitted at exactly `until`.
    advance(MILLI).await;
    map.start(&a, succeeds()).unwrap();
    wait_until_empty(&map).await;
    assert!(map.is_empty());
}

#[tokio::test(start_paused = true)]
async fn second_start_while_first_runs_is_already_running() {
    let map = OperationMap::default();
    let a = key("a");
    let (release, op) = gated(Ok(()));
    map.start(&a, op).unwrap();

    let err = map.start(&a, succeeds()).unwrap_err();
    match &err {
        ExecutorError::AlreadyRunning { socket } => assert_eq!(socket, &a),
        other => panic!("expected AlreadyRunning, got {other:?}"),
    }
    assert!(err.to_string().contains("already running"), "{err}");
    assert!(map.is_pending(&a));

    release.send(()).unwrap();
    wait_until_empty(&map).await;
}

#[tokio::test(start_paused = true)]
async fn third_start_after_first_completes_runs() {
    let map = OperationMap::default();
    let a = key("a");
    let (release, op) = gated(Ok(()));
    map.start(&a, op).unwrap();
    assert!(matches!(map.start(&a, succeeds()), Err(ExecutorError::AlreadyRunning { .. })));

    release.send(()).unwrap();
    wait_until_idle(&map).await;
    map.start(&a, succeeds()).unwrap();
    wait_until_empty(&map).await;
    assert!(map.is_empty());
}

#[tokio::test(start_paused = true)]
async fn wait_on_an_empty_map_returns_at_once() {
    let map = OperationMap::default();
    let before = Instant::now();
    wait_until_empty(&map).await;
    wait_until_idle(&map).await;
    assert_eq!(Instant::now(), before);
}

#[tokio::test(start_paused = true)]
async fn wait_returns_after_the_only_operation_is_released() {
    let map = OperationMap::default();
    let (release, op) = gated(Ok(()));
    map.start(&key("a"), op).unwrap();

    assert!(timeout(LONG, map.wait()).await.is_err(), "wait returned while an operation runs");

    // A waiter that is already parked is woken by the completion.
    let waiter = tokio::spawn({
        let map = map.clone();
        async move { map.wait().await }
    });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    release.send(()).unwrap();
    timeout(LONG, waiter).await.expect("wait returned").unwrap();
    assert!(map.is_empty());
}

#[tokio::test(start_paused = true)]
async fn wait_for_completion_returns_while_a_failed_entry_remains() {
    let map = OperationMap::default();
    let a = key("a");
    let (release, op) = gated(Err(transient(&a)));
    map.start(&a, op).unwrap();

    let waiter = tokio::spawn({
        let map = map.clone();
        async move { map.wait_for_completion().await }
    });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    release.send(()).unwrap();
    timeout(LONG, waiter).await.expect("wait_for_completion returned").unwrap();

    assert_eq!(map.len(), 1, "the failed entry remains");
    assert!(!map.is_pending(&a));
    assert!(timeout(LONG, map.wait()).await.is_err(), "wait returned with a failed entry left");
}

/// The nestedpendingoperations test: a retry of a failing operation is told
/// to back off, with the error of the failed attempt.
#[tokio::test(start_paused = true)]
async fn retry_of_a_failing_operation_gets_backoff_with_its_last_error() {
    let map = OperationMap::default();
    let a = key("a");
    map.start(&a, fails(&a)).unwrap();
    wait_until_idle(&map).await;

    let err = map.start(&a, succeeds()).unwrap_err();
    let text = err.to_string();
    let (_, wait, last_error) = expect_backoff(Err(err));
    assert_eq!(wait, INITIAL);
    assert_eq!(last_error, transient(&a).to_string());
    assert!(text.contains("no retries permitted"), "{text}");
    assert!(text.contains(&last_error), "{text}");
}

// === Beyond upstream ===

#[tokio::test(start_paused = true)]
async fn reset_backoff_on_a_failed_key_lets_the_next_start_run_at_once() {
    let map = OperationMap::default();
    let a = key("a");
    map.start(&a, fails(&a)).unwrap();
    wait_until_idle(&map).await;
    advance(INITIAL).await;
    map.start(&a, fails(&a)).unwrap();
    wait_until_idle(&map).await;
    assert_eq!(expect_backoff(map.start(&a, succeeds())).1, 2 * INITIAL);

    map.reset_backoff(&a);
    assert!(map.is_empty());
    assert_eq!(map.retry_at(&a), None);

    // The next start runs at once, and its failure backs off from scratch.
    map.start(&a, fails(&a)).unwrap();
    wait_until_idle(&map).await;
    assert_eq!(map.retry_at(&a), Some(Instant::now() + INITIAL));
}

#[tokio::test(start_paused = true)]
async fn reset_backoff_while_running_keeps_the_failure_from_starting_a_backoff() {
    let map = OperationMap::default();
    let a = key("a");
    map.start(&a, fails(&a)).unwrap();
    wait_until_idle(&map).await;
    advance(INITIAL).await;

    let (release, op) = gated(Err(transient(&a)));
    map.start(&a, op).unwrap();
    map.reset_backoff(&a);
    assert!(map.is_pending(&a), "a reset does not stop the running operation");
    assert!(
        matches!(map.start(&a, succeeds()), Err(ExecutorError::AlreadyRunning { .. })),
        "a reset does not permit a second operation on the key"
    );

    release.send(()).unwrap();
    wait_until_idle(&map).await;
    assert_eq!(map.len(), 0, "the discarded failure left an entry");
    assert_eq!(map.retry_at(&a), None);
    map.start(&a, succeeds()).unwrap();
    wait_until_empty(&map).await;
}

#[tokio::test(start_paused = true)]
async fn forget_drops_a_failed_entry() {
    let map = OperationMap::default();
    let keys = [key("a"), key("b"), key("c")];
    for k in &keys {
        map.start(k, fails(k)).unwrap();
    }
    wait_until_idle(&map).await;
    assert_eq!(map.len(), 3);

    for (i, k) in keys.iter().enumerate() {
        map.forget(k);
        assert_eq!(map.len(), 2 - i);
    }
    assert!(map.is_empty());
    assert!(keys.iter().all(|k| map.retry_at(k).is_none()));
    timeout(LONG, map.wait()).await.expect("nothing is left to wait for");
}

#[tokio::test(start_paused = true)]
async fn forget_while_running_drops_the_entry_once_the_operation_fails() {
    let map = OperationMap::default();
    let a = key("a");
    let (release, op) = gated(Err(transient(&a)));
    map.start(&a, op).unwrap();
    map.forget(&a);
    assert_eq!(map.len(), 1, "the running operation keeps its entry");

    release.send(()).unwrap();
    timeout(LONG, map.wait()).await.expect("the failed entry was dropped");
    map.start(&a, succeeds()).unwrap();
    wait_until_empty(&map).await;
}

#[tokio::test(start_paused = true)]
async fn permanent_error_blocks_the_key_until_reset_backoff() {
    let map = OperationMap::default();
    let permanent: [fn(&Path) -> ExecutorError; 2] =
        [not_a_registration_socket, unknown_plugin_type];
    for (i, error) in permanent.into_iter().enumerate() {
        let k = key(&format!("permanent-{i}"));
        assert!(error(&k).is_permanent());
        map.start(&k, std::future::ready(Err(error(&k)))).unwrap();
        wait_until_idle(&map).await;
        assert_eq!(map.retry_at(&k), None, "a permanent failure has no retry time");

        let last_error = expect_failed_permanently(map.start(&k, succeeds()));
        assert_eq!(last_error, error(&k).to_string());
        advance(Duration::from_secs(5 * 3600)).await;
        expect_failed_permanently(map.start(&k, succeeds()));

        map.reset_backoff(&k);
        map.start(&k, succeeds()).unwrap();
        wait_until_empty(&map).await;
    }
}

#[tokio::test(start_paused = true)]
async fn forget_also_unblocks_a_permanently_failed_key() {
    let map = OperationMap::default();
    let a = key("a");
    map.start(&a, std::future::ready(Err(not_a_registration_socket(&a)))).unwrap();
    wait_until_idle(&map).await;
    expect_failed_permanently(map.start(&a, succeeds()));
    map.forget(&a);
    assert!(map.is_empty());
    map.start(&a, succeeds()).unwrap();
    wait_until_empty(&map).await;
}

#[tokio::test(start_paused = true)]
async fn backoff_doubles_on_consecutive_failures_and_a_success_resets_it() {
    let map = OperationMap::default();
    let a = key("a");
    map.start(&a, fails(&a)).unwrap();
    wait_until_idle(&map).await;
    assert_eq!(map.retry_at(&a), Some(Instant::now() + INITIAL));

    advance(INITIAL).await;
    map.start(&a, fails(&a)).unwrap();
    assert_eq!(map.retry_at(&a), None, "a running key is not backing off");
    wait_until_idle(&map).await;
    assert_eq!(map.retry_at(&a), Some(Instant::now() + 2 * INITIAL));
    assert_eq!(expect_backoff(map.start(&a, succeeds())).1, 2 * INITIAL);

    advance(2 * INITIAL).await;
    map.start(&a, succeeds()).unwrap();
    wait_until_idle(&map).await;
    assert!(map.is_empty(), "a success removes the entry");
    assert_eq!(map.retry_at(&a), None);

    map.start(&a, fails(&a)).unwrap();
    wait_until_idle(&map).await;
    assert_eq!(map.retry_at(&a), Some(Instant::now() + INITIAL), "the backoff starts afresh");
}

#[tokio::test(start_paused = true)]
async fn backoff_follows_a_custom_policy_up_to_its_cap() {
    let policy =
        ExponentialBackoff::try_new(Duration::from_millis(100), Duration::from_millis(250))
            .unwrap();
    let map = OperationMap::new(policy);
    let a = key("a");
    for expected in [100, 200, 250, 250] {
        map.start(&a, fails(&a)).unwrap();
        wait_until_idle(&map).await;
        let wait = map.retry_at(&a).unwrap() - Instant::now();
        assert_eq!(wait, Duration::from_millis(expected));
        advance(wait).await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_longest_backoff_is_added_to_the_clock_without_overflow() {
    let longest = kpm_api::constants::MAX_CONFIG_DURATION;
    let map = OperationMap::new(ExponentialBackoff::try_new(longest, longest).unwrap());
    let a = key("a");
    for _ in 0..3 {
        map.start(&a, fails(&a)).unwrap();
        wait_until_idle(&map).await;
        assert_eq!(map.retry_at(&a), Some(Instant::now() + longest));
        advance(longest.checked_sub(MILLI).unwrap()).await;
        let (until, wait, _) = expect_backoff(map.start(&a, succeeds()));
        assert_eq!((until - Instant::now(), wait), (MILLI, longest));
        advance(MILLI).await;
    }
}

#[tokio::test(start_paused = true)]
async fn completions_wake_on_completion() {
    let map = OperationMap::default();
    let a = key("a");
    let mut completions = map.completions();
    let (release, op) = gated(Ok(()));
    map.start(&a, op).unwrap();
    assert!(timeout(LONG, completions.changed()).await.is_err(), "woke before a completion");

    release.send(()).unwrap();
    timeout(LONG, completions.changed()).await.expect("a success wakes");
    assert!(!map.is_pending(&a));

    let (release, op) = gated(Err(transient(&a)));
    map.start(&a, op).unwrap();
    release.send(()).unwrap();
    timeout(LONG, completions.changed()).await.expect("a failure wakes");
    assert_eq!(map.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn take_completed_drains_every_outcome_once() {
    let map = OperationMap::default();
    let (a, b, c, d) = (key("a"), key("b"), key("c"), key("d"));
    assert!(map.take_completed().is_empty());
    map.start(&a, succeeds()).unwrap();
    map.start(&b, fails(&b)).unwrap();
    map.start(&c, async { panic!("operation panics on purpose") }).unwrap();
    let (release, op) = gated(Err(transient(&d)));
    map.start(&d, op).unwrap();
    settled(&map, &a).await;
    // A second completion on a key before the drain is recorded once.
    map.start(&a, succeeds()).unwrap();
    settled(&map, &a).await;
    settled(&map, &b).await;
    settled(&map, &c).await;

    let mut completed = map.take_completed();
    completed.sort();
    assert_eq!(completed, [a.clone(), b, c], "a running key has not completed");
    assert!(map.take_completed().is_empty(), "a drain empties the journal");

    // An outcome that is discarded is still a completion.
    map.forget(&d);
    release.send(()).unwrap();
    settled(&map, &d).await;
    assert_eq!(map.status(&d), None);
    assert_eq!(map.take_completed(), [d]);
    // Refused starts run nothing, so they complete nothing.
    map.start(&a, fails(&a)).unwrap();
    settled(&map, &a).await;
    assert_eq!(map.take_completed(), [a.as_path()]);
    expect_backoff(map.start(&a, succeeds()));
    assert!(map.take_completed().is_empty());
}

#[tokio::test(start_paused = true)]
async fn panic_message_appears_in_the_stored_error() {
    let map = OperationMap::default();
    let (a, b) = (key("a"), key("b"));
    // A `&'static str` payload and a `String` payload.
    map.start(&a, async { panic!("disk on fire") }).unwrap();
    let (release, op) = gated_panic(format!("code {}", 42));
    map.start(&b, op).unwrap();
    release.send(()).unwrap();
    wait_until_idle(&map).await;
    assert_eq!(map.len(), 2, "a panic counts as a failure");

    for (k, message) in [(&a, "disk on fire"), (&b, "code 42")] {
        let (_, wait, last_error) = expect_backoff(map.start(k, succeeds()));
        assert_eq!(wait, INITIAL);
        let expected = ExecutorError::Panicked { socket: k.clone(), message: message.to_owned() };
        assert_eq!(last_error, expected.to_string());
    }
}

// === Property tests ===

const KEYS: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Succeed,
    Fail,
    FailPermanently,
    Panic,
}

#[derive(Debug, Clone)]
enum Action {
    /// Start an operation with this outcome; `held` ones wait for a `Release`.
    Start {
        key: usize,
        outcome: Outcome,
        held: bool,
    },
    Release {
        key: usize,
    },
    ResetBackoff {
        key: usize,
    },
    Forget {
        key: usize,
    },
    Advance {
        millis: u64,
    },
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        3 => Just(Outcome::Succeed),
        3 => Just(Outcome::Fail),
        1 => Just(Outcome::FailPermanently),
        1 => Just(Outcome::Panic),
    ]
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        5 => (0..KEYS, outcome(), any::<bool>())
            .prop_map(|(key, outcome, held)| Action::Start { key, outcome, held }),
        2 => (0..KEYS).prop_map(|key| Action::Release { key }),
        1 => (0..KEYS).prop_map(|key| Action::ResetBackoff { key }),
        1 => (0..KEYS).prop_map(|key| Action::Forget { key }),
        2 => prop_oneof![0u64..=1_000, 0u64..=130_000].prop_map(|millis| Action::Advance { millis }),
    ]
}

/// Counts the operations running on one key, and every operation that ended.
#[derive(Debug, Clone, Default)]
struct Probe {
    running: Arc<AtomicUsize>,
    overlap: Arc<AtomicBool>,
    finished: Arc<AtomicUsize>,
}

/// Held while an operation runs; dropped when it ends, also by a panic.
struct Running(Probe);

impl Probe {
    fn enter(&self) -> Running {
        if self.running.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlap.store(true, Ordering::SeqCst);
        }
        Running(self.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        self.0.finished.fetch_add(1, Ordering::SeqCst);
    }
}

async fn operation(
    socket: PathBuf,
    outcome: Outcome,
    gate: Option<oneshot::Receiver<()>>,
    probe: Probe,
) -> OpResult {
    let _running = probe.enter();
    if let Some(gate) = gate {
        gate.await.ok();
    }
    match outcome {
        Outcome::Succeed => Ok(()),
        Outcome::Fail => Err(transient(&socket)),
        Outcome::FailPermanently => Err(not_a_registration_socket(&socket)),
        Outcome::Panic => panic!("operation on {} panics on purpose", socket.display()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ModelFailure {
    wait: Duration,
    /// `None` for a permanent failure.
    retry_at: Option<Instant>,
}

/// What the map should know about one key.
#[derive(Debug, Default)]
struct ModelKey {
    running: bool,
    /// The release of a running held operation, and how it will end.
    held: Option<(oneshot::Sender<()>, Outcome)>,
    failure: Option<ModelFailure>,
    discard: bool,
    /// An operation completed since the journal was last drained.
    completed: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum Expected {
    Started,
    AlreadyRunning,
    Backoff { until: Instant, wait: Duration },
    FailedPermanently,
}

impl ModelKey {
    fn expect_start(&self, now: Instant) -> Expected {
        match self.failure {
            _ if self.running => Expected::AlreadyRunning,
            Some(ModelFailure { retry_at: None, .. }) => Expected::FailedPermanently,
            Some(ModelFailure { retry_at: Some(until), wait }) if now < until => {
                Expected::Backoff { until, wait }
            }
            _ => Expected::Started,
        }
    }

    fn complete(&mut self, outcome: Outcome, now: Instant, backoff: &ExponentialBackoff) {
        self.running = false;
        self.completed = true;
        if outcome == Outcome::Succeed || self.discard {
            self.failure = None;
            self.discard = false;
            return;
        }
        let wait = backoff.next(self.failure.map(|failure| failure.wait));
        let retry_at = (outcome != Outcome::FailPermanently).then(|| now + wait);
        self.failure = Some(ModelFailure { wait, retry_at });
    }

    fn reset(&mut self) {
        self.failure = None;
        self.discard = self.running;
    }

    fn has_entry(&self) -> bool {
        self.running || self.failure.is_some()
    }

    fn retry_at(&self) -> Option<Instant> {
        if self.running { None } else { self.failure.and_then(|failure| failure.retry_at) }
    }
}

fn observed(result: &OpResult) -> Expected {
    match result {
        Ok(()) => Expected::Started,
        Err(ExecutorError::AlreadyRunning { .. }) => Expected::AlreadyRunning,
        Err(ExecutorError::Backoff { until, wait, .. }) => {
            Expected::Backoff { until: *until, wait: *wait }
        }
        Err(ExecutorError::FailedPermanently { .. }) => Expected::FailedPermanently,
        Err(other) => panic!("start returned an unexpected error: {other}"),
    }
}

/// Waits, within a bound, until the operation on `key` has completed.
async fn settle(map: &OperationMap, key: &Path) -> Result<(), TestCaseError> {
    prop_assert!(
        timeout(LONG, settled(map, key)).await.is_ok(),
        "the operation on {} never completed",
        key.display()
    );
    Ok(())
}

fn check_model(
    map: &OperationMap,
    keys: &[PathBuf],
    model: &mut [ModelKey],
    probes: &[Probe],
) -> Result<(), TestCaseError> {
    for ((key, state), probe) in keys.iter().zip(model.iter()).zip(probes) {
        prop_assert!(!probe.overlap.load(Ordering::SeqCst), "two operations ran on {key:?}");
        prop_assert_eq!(map.is_pending(key), state.running, "is_pending({:?})", key);
        prop_assert_eq!(map.retry_at(key), state.retry_at(), "retry_at({:?})", key);
    }
    prop_assert_eq!(map.len(), model.iter().filter(|state| state.has_entry()).count());
    let mut completed = map.take_completed();
    completed.sort();
    let expected: Vec<PathBuf> = keys
        .iter()
        .zip(model.iter_mut())
        .filter_map(|(key, state)| std::mem::take(&mut state.completed).then(|| key.clone()))
        .collect();
    prop_assert_eq!(completed, expected, "take_completed");
    Ok(())
}

async fn run_against_model(actions: Vec<Action>) -> Result<(), TestCaseError> {
    let map = OperationMap::default();
    let backoff = ExponentialBackoff::default();
    let keys: Vec<PathBuf> = (0..KEYS).map(|i| key(&format!("k{i}"))).collect();
    let probes: Vec<Probe> = (0..KEYS).map(|_| Probe::default()).collect();
    let mut model: Vec<ModelKey> = (0..KEYS).map(|_| ModelKey::default()).collect();
    let mut started = 0;

    for action in actions {
        match action {
            Action::Start { key: k, outcome, held } => {
                let expected = model[k].expect_start(Instant::now());
                let (release, gate) = if held {
                    let (release, gate) = oneshot::channel();
                    (Some(release), Some(gate))
                } else {
                    (None, None)
                };
                let result = map
                    .start(&keys[k], operation(keys[k].clone(), outcome, gate, probes[k].clone()));
                prop_assert_eq!(observed(&result), expected, "start on {:?}", keys[k]);
                if result.is_ok() {
                    started += 1;
                    model[k].running = true;
                    if let Some(release) = release {
                        model[k].held = Some((release, outcome));
                    } else {
                        settle(&map, &keys[k]).await?;
                        model[k].complete(outcome, Instant::now(), &backoff);
                    }
                }
            }
            Action::Release { key: k } => {
                if let Some((release, outcome)) = model[k].held.take() {
                    release.send(()).ok();
                    settle(&map, &keys[k]).await?;
                    model[k].complete(outcome, Instant::now(), &backoff);
                }
            }
            Action::ResetBackoff { key: k } => {
                map.reset_backoff(&keys[k]);
                model[k].reset();
            }
            Action::Forget { key: k } => {
                map.forget(&keys[k]);
                model[k].reset();
            }
            Action::Advance { millis } => advance(Duration::from_millis(millis)).await,
        }
        check_model(&map, &keys, &mut model, &probes)?;
    }

    // Every operation that started completes once released.
    let mut outcomes = Vec::new();
    for state in &mut model {
        outcomes.push(state.held.take().map(|(release, outcome)| {
            release.send(()).ok();
            outcome
        }));
    }
    prop_assert!(timeout(LONG, map.wait_for_completion()).await.is_ok(), "an operation hung");
    for (state, outcome) in model.iter_mut().zip(outcomes) {
        if let Some(outcome) = outcome {
            state.complete(outcome, Instant::now(), &backoff);
        }
    }
    check_model(&map, &keys, &mut model, &probes)?;
    let finished: usize = probes.iter().map(|probe| probe.finished.load(Ordering::SeqCst)).sum();
    prop_assert_eq!(finished, started, "operations started vs. ended");
    Ok(())
}

/// One consecutive-failure experiment step: how the attempt ends, how far
/// into the backoff (in percent) an early retry is tried, and how long to
/// wait beyond the backoff.
type Step = (Outcome, u32, u64);

async fn observe_backoff_waits(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let map = OperationMap::default();
    let a = key("a");
    let probe = Probe::default();
    let mut previous: Option<Duration> = None;
    for (outcome, early_percent, extra_millis) in steps {
        map.start(&a, operation(a.clone(), outcome, None, probe.clone()))
            .map_err(|err| TestCaseError::fail(format!("start refused: {err}")))?;
        settle(&map, &a).await?;
        if outcome == Outcome::Succeed {
            prop_assert!(map.is_empty(), "a success resets the backoff");
            previous = None;
            continue;
        }
        let wait = map.retry_at(&a).expect("a transient failure backs off") - Instant::now();
        prop_assert!(wait >= Duration::from_millis(500), "{:?} below 500 ms", wait);
        prop_assert!(wait <= Duration::from_secs(122), "{:?} above 122 s", wait);
        if let Some(previous) = previous {
            prop_assert!(wait >= previous, "{:?} after {:?}", wait, previous);
            prop_assert_eq!(wait, (previous * 2).min(Duration::from_secs(122)));
        }
        previous = Some(wait);

        let early = wait * early_percent / 100;
        advance(early).await;
        let (_, told, _) = expect_backoff(map.start(&a, succeeds()));
        prop_assert_eq!(told, wait);
        advance(wait.saturating_sub(early) + Duration::from_millis(extra_millis)).await;
    }
    Ok(())
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("build a tokio runtime")
}

proptest! {
    #[test]
    fn operations_on_one_key_never_overlap_and_match_the_model(
        actions in prop::collection::vec(action(), 1..30),
    ) {
        paused_runtime().block_on(run_against_model(actions))?;
    }

    #[test]
    fn consecutive_failure_waits_are_monotone_and_bounded(
        steps in prop::collection::vec(
            (
                prop_oneof![4 => Just(Outcome::Fail), 2 => Just(Outcome::Panic), 1 => Just(Outcome::Succeed)],
                0u32..100,
                0u64..2_000,
            ),
            1..25,
        ),
    ) {
        paused_runtime().block_on(observe_backoff_waits(steps))?;
    }
}
