//! Helpers shared by kpm's tests, so that no test can flake on a busy
//! machine:
//!
//! - [`wait_until`] and [`within`] wait for an event through tokio time with a
//!   generous [`DEADLINE`], and work the same on paused time;
//! - [`blocking::wait_until`] and [`blocking::eventually`] poll from sync tests
//!   that drive the `kpm` binary as a process;
//! - [`with_clock_held`] and [`wait_with_clock_held`] keep a paused clock
//!   from moving while a test waits for sockets served on another thread,
//!   so that a test on paused time sees its timers fire at exact instants;
//! - [`OwnRuntime`] runs a fake plugin or driver on its own thread and tokio
//!   runtime, so that stopping it closes its connections the way a process
//!   exit does;
//! - [`free_port`] (and [`free_local_addr`]) gives a port for a server that binds it later, one that
//!   neither an outgoing connection nor another test's child can hold
//!   meanwhile;
//! - [`api_server`] is the one stand-in Kubernetes API server (the Node,
//!   its CSINode, ResourceSlices, watches, Events; a fleet's collections,
//!   paged and as tables), which kpm-kube's and kpm-doctor's tests serve in
//!   process to kube's client, the facade's behind kube's mock, and the
//!   CLI's over TCP;
//! - [`http`] is the one HTTP client of the tests and the load generator,
//!   over TCP or a Unix socket, and [`prometheus`] the one reader of kpm's
//!   metrics;
//! - `csi` (feature `csi`) is the fake CSI driver every crate's tests
//!   serve on a real Unix socket, its answers set by the test;
//! - `cri` (feature `cri`) is the fake container runtime (the CRI's
//!   `RuntimeService`, read-only calls) the doctor's tests ask who serves
//!   a socket;
//! - `registration` (feature `registration`) is the fake registration
//!   plugin (`pluginregistration.Registration`) every crate's tests serve
//!   the same way, its answers to `GetInfo` and `NotifyRegistrationStatus`
//!   set by the test.
//!
//! Only for the fakes does this crate depend on `kpm-api` and
//! `kpm-transport`, which use them in no test. (kpm-registrar's `stub` is
//! the well-behaved plugin of the example, `kpm demo` and the load
//! generator, not a test fake.)
//!
//! It is a dev-dependency everywhere but in the tools: kpm-e2e, whose
//! scenarios take their servers' ports as the tests do, and kpm-bench, which
//! reads kpm's metrics as the tests do; `cargo xtask tidy` refuses it as a
//! normal dependency elsewhere.
//!
//! A deadline here only bounds how long a broken test hangs: tests wait for
//! the event itself and never assert an upper bound on real time; a
//! negative (something that must not happen) is proven on paused time or by
//! the event that must come after it.
//!
//! # Panics
//!
//! Every wait panics, naming what it waited for, once the deadline has
//! passed; that fails the test that called it.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::missing_panics_doc,
    reason = "a helper that can wait no longer fails the test that called it (crate docs)"
)]

pub mod api_server;
#[cfg(feature = "cri")]
pub mod cri;
#[cfg(feature = "csi")]
pub mod csi;
pub mod http;
pub mod prometheus;
#[cfg(feature = "registration")]
pub mod registration;
#[cfg(any(feature = "csi", feature = "cri", feature = "registration"))]
mod server;

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// How long a test waits for something that must happen: far beyond any
/// wait on a loaded machine, so reaching it means the thing never happens.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// How often the polling helpers check their condition.
pub const POLL: Duration = Duration::from_millis(5);

/// Checks `condition` every [`POLL`] (tokio time) until it holds; panics
/// naming `what` once [`DEADLINE`] has passed. On paused time each poll
/// lets the runtime move on to its next timer.
pub async fn wait_until(what: impl Display, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {DEADLINE:?} waiting until {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// A loopback TCP port free a moment ago, for a server that binds it later:
/// a child process's `--metrics-addr`, an API server that comes up late,
/// etcd's and kube-apiserver's ports.
///
/// Two races made CI see `AddrInUse` when the server came to bind:
/// - Port 0 hands out one of the kernel's ephemeral ports, which any
///   outgoing TCP connection made meanwhile (a test running beside,
///   kube-apiserver dialing etcd) may take as its local port. So the port
///   is taken below the ephemeral range, where the kernel never picks one
///   by itself, and a counter keeps the calls of one process apart.
/// - A listener opened only to see whether the port is free lives on in any
///   child another test thread forks at that instant, until the child
///   execs. So the port is tried with a bound socket that never listens,
///   with `SO_REUSEADDR` as every server here sets it: a busy port fails
///   that bind, and a copy left in a child stops no server from binding
///   and listening.
///
/// # Panics
///
/// When no port below the ephemeral range can be bound.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOWEST: u32 = 10_000;
    let ephemeral = ephemeral_start();
    let span = ephemeral.saturating_sub(LOWEST).max(1);
    // Other programs may hold ports here too: start where this process's id
    // points, and skip the busy ones.
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let Ok(port) = u16::try_from(LOWEST + offset) else { continue };
        if try_port(port).is_ok() {
            return port;
        }
    }
    panic!("no free port in {LOWEST}..{ephemeral}");
}

/// [`free_port`] as the address `127.0.0.1:PORT`, for a `--metrics-addr`.
pub fn free_local_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// The first port of the kernel's ephemeral range (Linux's default when it
/// cannot be read).
fn ephemeral_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A socket bound to `port` on loopback and not listening: it binds when a
/// server could bind the port now (see [`free_port`]).
fn try_port(port: u16) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)).into())?;
    Ok(socket)
}

/// A description computed only when shown: `what` for [`wait_until`] that
/// reports the state at the time of a timeout, not at the start of the wait.
pub fn lazy<F: Fn() -> String>(describe: F) -> impl Display {
    /// Shows what its function returns.
    struct Lazy<F>(F);
    impl<F: Fn() -> String> Display for Lazy<F> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&(self.0)())
        }
    }
    Lazy(describe)
}

/// Awaits `future`, panicking naming `what` if it is not done within
/// [`DEADLINE`] (tokio time). For waits on a watch channel, a notification or
/// an operation, where polling is not needed.
pub async fn within<F: IntoFuture>(what: impl Display, future: F) -> F::Output {
    tokio::time::timeout(DEADLINE, future)
        .await
        .unwrap_or_else(|_elapsed| panic!("timed out after {DEADLINE:?} waiting until {what}"))
}

/// Awaits `future` with tokio's clock held still if it is paused: a test on
/// paused time (`start_paused`) waiting for IO from another thread (a
/// plugin on an [`OwnRuntime`], a process) would otherwise let the clock
/// jump to its next timer whenever the runtime is idle. Held by a blocking
/// task, which keeps a paused clock from advancing by itself while it runs,
/// for at most [`DEADLINE`] of real time: a test that waits longer lets its
/// timers fire, and fails rather than hangs.
pub async fn with_clock_held<F: IntoFuture>(future: F) -> F::Output {
    let (release, released) = std::sync::mpsc::channel::<()>();
    let hold = tokio::task::spawn_blocking(move || {
        let _ = released.recv_timeout(DEADLINE);
    });
    let output = future.await;
    drop(release);
    hold.await.expect("the task holding the clock ends");
    output
}

/// Like [`blocking::wait_until`], polled on a blocking task: on paused time
/// the clock stands still until `condition` holds (see [`with_clock_held`]),
/// so that what the runtime does meanwhile happens at the instant the wait
/// started.
pub async fn wait_with_clock_held(
    what: impl Display + Send + 'static,
    condition: impl FnMut() -> bool + Send + 'static,
) {
    let waited = tokio::task::spawn_blocking(move || blocking::wait_until(what, condition)).await;
    if let Err(failed) = waited {
        std::panic::resume_unwind(failed.into_panic());
    }
}

/// Waits for sync tests, which drive `kpm` as a process and have no tokio
/// runtime of their own: polling on real time with the same deadline.
pub mod blocking {
    use std::fmt::Display;
    use std::time::Instant;

    use super::{DEADLINE, POLL};

    /// Checks `condition` every [`POLL`] until it holds; panics naming `what`
    /// once [`DEADLINE`] has passed.
    pub fn wait_until(what: impl Display, condition: impl FnMut() -> bool) {
        assert!(eventually(condition), "timed out after {DEADLINE:?} waiting until {what}");
    }

    /// Checks `condition` every [`POLL`] until it holds or [`DEADLINE`] has
    /// passed; whether it held. For callers that explain a timeout themselves.
    pub fn eventually(mut condition: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if condition() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Tasks on their own thread and current-thread tokio runtime, ended like an
/// exiting process: stopping drops the runtime with every task on it, so
/// every connection they accepted closes. (Aborting a tonic server task
/// would leave its accepted connections running.)
#[derive(Debug)]
pub struct OwnRuntime {
    stopper: Stopper,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Stops an [`OwnRuntime`] from anywhere, even from one of its own tasks (a
/// plugin that exits in the middle of a call).
#[derive(Debug, Clone)]
pub struct Stopper(Arc<Notify>);

impl Stopper {
    /// Asks the runtime to stop; it does once its thread wakes up.
    pub fn stop(&self) {
        // A stored permit: a stop before the runtime waits is not lost.
        self.0.notify_one();
    }
}

impl OwnRuntime {
    /// Starts the thread and runtime, runs `setup` on it to completion (bind
    /// the socket, spawn the server), and returns once it has: whatever
    /// `setup` bound is ready. The tasks it spawned run until stopped. A
    /// panic in `setup` is raised here.
    pub fn start<F, Fut>(setup: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let stopper = Stopper(Arc::new(Notify::new()));
        let stop = Arc::clone(&stopper.0);
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime for the service");
            runtime.block_on(setup());
            let _ = ready_tx.send(());
            runtime.block_on(stop.notified());
            // Dropping the runtime drops every task on it, with its sockets.
            drop(runtime);
        });
        if ready.recv().is_err() {
            // `setup` panicked: the thread is gone, show why.
            match thread.join() {
                Err(panic) => std::panic::resume_unwind(panic),
                Ok(()) => panic!("the runtime's thread ended before its setup did"),
            }
        }
        Self { stopper, thread: Some(thread) }
    }

    /// A handle that stops the runtime, for use from anywhere.
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// Stops the runtime and waits until every task on it is dropped.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stopper.stop();
        if let Some(thread) = self.thread.take() {
            let joined = thread.join();
            if let Err(panic) = joined
                && !std::thread::panicking()
            {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests {
    //! The helpers themselves, on paused time where they use tokio time.

    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn free_ports_differ_lie_below_the_ephemeral_range_and_can_be_bound() {
        let ephemeral = ephemeral_start();
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        for port in ports {
            assert!((10_000..ephemeral).contains(&u32::from(port)), "{port} not below {ephemeral}");
            drop(std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)).unwrap());
        }
    }

    #[test]
    fn a_port_tried_and_still_held_elsewhere_can_be_bound_and_listened_on() {
        // As if the try's socket had been copied into a child forked by
        // another thread and not yet exec'd.
        let port = free_port();
        let copy = try_port(port).unwrap();
        let server = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)).unwrap();
        std::net::TcpStream::connect(server.local_addr().unwrap()).unwrap();
        drop(copy);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_until_returns_once_the_condition_holds() {
        let start = tokio::time::Instant::now();
        let mut checks = 0;
        wait_until("the third check", || {
            checks += 1;
            checks == 3
        })
        .await;
        assert_eq!(start.elapsed(), POLL * 2, "two polls between three checks");
    }

    #[tokio::test(start_paused = true)]
    async fn wait_until_fails_naming_what_after_the_deadline() {
        let start = tokio::time::Instant::now();
        let waited = tokio::spawn(wait_until("pigs fly", || false)).await;
        let panic = waited.expect_err("it panics").into_panic();
        let message = panic.downcast_ref::<String>().expect("a formatted message");
        assert_eq!(*message, format!("timed out after {DEADLINE:?} waiting until pigs fly"));
        assert!(start.elapsed() >= DEADLINE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_clock_stands_still_while_another_thread_works() {
        let start = tokio::time::Instant::now();
        // A timer that an idle runtime would jump to.
        let timer = tokio::spawn(tokio::time::sleep(Duration::from_secs(5)));
        let (done, other_thread) = tokio::sync::oneshot::channel();
        let worker = std::thread::spawn(move || {
            std::thread::sleep(POLL * 4);
            done.send(()).unwrap();
        });
        with_clock_held(other_thread).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);

        let flag = Arc::new(AtomicBool::new(false));
        let set = Arc::clone(&flag);
        std::thread::spawn(move || {
            std::thread::sleep(POLL * 4);
            set.store(true, Ordering::SeqCst);
        });
        wait_with_clock_held("the flag is set", move || flag.load(Ordering::SeqCst)).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(!timer.is_finished());
        worker.join().unwrap();
        // Not held, the clock moves on to the timer at once.
        timer.await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[test]
    fn lazy_describes_the_state_when_shown() {
        let state = std::cell::Cell::new(1);
        let what = lazy(|| format!("state {}", state.get()));
        state.set(2);
        assert_eq!(what.to_string(), "state 2");
    }

    #[tokio::test(start_paused = true)]
    async fn within_returns_the_output_or_fails_naming_what() {
        assert_eq!(within("ready", async { 7 }).await, 7);
        let waited = tokio::spawn(within("never", std::future::pending::<()>())).await;
        let panic = waited.expect_err("it panics").into_panic();
        let message = panic.downcast_ref::<String>().expect("a formatted message");
        assert!(message.ends_with("waiting until never"), "{message}");
    }

    #[test]
    fn blocking_eventually_says_whether_the_condition_held() {
        let mut checks = 0;
        assert!(blocking::eventually(|| {
            checks += 1;
            checks == 2
        }));
        blocking::wait_until("at once", || true);
    }

    #[test]
    fn own_runtime_runs_its_tasks_until_stopped_then_drops_them() {
        /// Sets its flag when dropped.
        struct Dropped(Arc<AtomicBool>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let ran = Arc::new(AtomicUsize::new(0));
        let runtime = {
            let (dropped, ran) = (Arc::clone(&dropped), Arc::clone(&ran));
            OwnRuntime::start(move || async move {
                ran.fetch_add(1, Ordering::SeqCst);
                // Made here and moved in: dropped with the task whether or
                // not the task was ever polled.
                let guard = Dropped(dropped);
                tokio::spawn(async move {
                    let _guard = guard;
                    std::future::pending::<()>().await;
                });
            })
        };
        assert_eq!(ran.load(Ordering::SeqCst), 1, "setup ran before start returned");
        assert!(!dropped.load(Ordering::SeqCst));
        runtime.stopper().stop();
        runtime.stop();
        assert!(dropped.load(Ordering::SeqCst), "the task was dropped with the runtime");
    }

    #[test]
    fn a_panic_in_setup_is_raised_by_start() {
        let started = std::panic::catch_unwind(|| {
            OwnRuntime::start(|| async { panic!("cannot bind") });
        });
        let panic = started.expect_err("start panics");
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"cannot bind"));
    }
}
