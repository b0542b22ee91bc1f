//! A `kpm run` process for end-to-end tests, and polling with deadlines.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const KPM: &str = env!("CARGO_BIN_EXE_kpm");
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A running `kpm run --root-dir <root>`, killed on drop. Its log goes to
/// `<root>/kpm.log` (a pipe nobody reads could fill up and stall it).
pub struct Kpm {
    child: Child,
    pub root: PathBuf,
}

impl Kpm {
    pub fn start(root: &Path) -> Self {
        Self::start_with(root, &[])
    }

    /// `kpm run --root-dir <root> <args>`.
    pub fn start_with(root: &Path, args: &[&str]) -> Self {
        let log = std::fs::File::create(root.join("kpm.log")).unwrap();
        let child = Command::new(KPM)
            .args(["run", "--root-dir"])
            .arg(root)
            .args(args)
            .env("RUST_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let kpm = Self { child, root: root.to_path_buf() };
        kpm.wait_for("the status API answers", |_| true);
        kpm
    }

    pub fn registry(&self) -> PathBuf {
        self.root.join("plugins_registry")
    }

    /// `kpm list -o json`, parsed; `None` while the API does not answer.
    pub fn list(&self) -> Option<Value> {
        let out = kpm(&["list", "-o", "json", "--root-dir", self.root.to_str().unwrap()]);
        out.status.success().then(|| serde_json::from_slice(&out.stdout).unwrap())
    }

    pub fn plugins(&self) -> Vec<Value> {
        self.list().unwrap()["plugins"].as_array().unwrap().clone()
    }

    /// Polls `kpm list` until `condition` holds; returns that listing.
    pub fn wait_for(&self, what: &str, mut condition: impl FnMut(&Value) -> bool) -> Value {
        let mut found = None;
        wait_until(what, || {
            found = self.list().filter(|list| condition(list));
            found.is_some()
        });
        found.unwrap()
    }

    /// Sends SIGTERM and waits; returns the exit status and the log.
    pub fn terminate(mut self) -> (ExitStatus, String) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = self.child.wait().unwrap();
        (status, std::fs::read_to_string(self.root.join("kpm.log")).unwrap())
    }
}

impl Drop for Kpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `kpm <args>` to completion.
pub fn kpm(args: &[&str]) -> Output {
    Command::new(KPM).args(args).output().unwrap()
}

/// Polls `condition` every 10 ms until it holds; fails the test after [`DEADLINE`].
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

// === Plugin services ===

/// The routes of a stub device plugin reporting `(id, health)` devices.
pub fn device_plugin(devices: &[(&str, &str)]) -> tonic::service::Routes {
    kpm_registrar::stub::StubDevicePlugin::new(devices.iter().copied()).0.routes()
}

/// A service running on its own thread and tokio runtime, so that stopping it
/// closes its connections the way a process exit does (aborting a tonic
/// server task would leave accepted connections running).
pub struct Served {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    /// Stops the service and drops every connection it had.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Serves `routes` on `socket` (bound before this returns) until stopped.
pub fn serve(socket: &Path, routes: tonic::service::Routes) -> Served {
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let (bound_tx, bound) = std::sync::mpsc::channel();
    let socket = socket.to_path_buf();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let incoming = runtime.block_on(kpm_api::uds::bind(&socket)).unwrap();
        let server =
            tonic::transport::Server::builder().add_routes(routes).serve_with_incoming(incoming);
        runtime.spawn(server);
        bound_tx.send(()).unwrap();
        // Runs the server until `stop` is dropped, then drops the runtime
        // with every connection task on it.
        let _ =
            runtime.block_on(async { tokio::task::spawn_blocking(move || stopped.recv()).await });
        runtime.shutdown_background();
    });
    bound.recv().unwrap();
    Served { stop: Some(stop), thread: Some(thread) }
}
