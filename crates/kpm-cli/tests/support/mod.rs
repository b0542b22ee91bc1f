//! A `kpm run` process for end-to-end tests, and polling with deadlines.
//! `faults` adds misbehaving plugins and the checks of the fault suite.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod faults;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};

pub use kpm_test_support::blocking::wait_until;
use kpm_test_support::{OwnRuntime, Stopper};
use serde_json::Value;

pub const KPM: &str = env!("CARGO_BIN_EXE_kpm");

/// A test of a binary that is started again as plugin processes
/// (`harness = false`), registered by [`trial!`] where it is defined.
pub struct Trial {
    pub name: &'static str,
    pub run: fn(),
}

inventory::collect!(Trial);

/// Defines the test `name` of a `harness = false` binary, running `body`
/// (a closure), and registers it for [`run_tests`]: defined and listed in
/// one place, no test can be left out of the run. Unused by the binaries
/// with libtest's own harness, as `run_tests` is.
#[allow(unused_macros)]
macro_rules! trial {
    ($name:ident, $body:expr) => {
        fn $name() {
            let body: fn() = $body;
            body();
        }
        inventory::submit! { $crate::support::Trial { name: stringify!($name), run: $name } }
    };
}
#[allow(unused_imports)]
pub(crate) use trial;

/// Runs the [`trial!`]s of this binary, by name, with libtest's command
/// line and output.
pub fn run_tests() -> ! {
    let mut tests: Vec<&Trial> = inventory::iter::<Trial>.into_iter().collect();
    tests.sort_by_key(|test| test.name);
    let trials = tests
        .into_iter()
        .map(|test| {
            let run = test.run;
            libtest_mimic::Trial::test(test.name, move || {
                run();
                Ok(())
            })
        })
        .collect();
    libtest_mimic::run(&libtest_mimic::Arguments::from_args(), trials).exit();
}

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
        Self::spawn(Command::new(KPM), root, args)
    }

    /// Like [`start_with`](Self::start_with), under `ulimit -n <nofile>`
    /// (soft and hard limit alike, as a container runtime sets them).
    pub fn start_with_nofile(root: &Path, nofile: u32, args: &[&str]) -> Self {
        let script = format!("ulimit -n {nofile} && exec \"$0\" \"$@\"");
        Self::start_wrapped(&["sh", "-c", &script], root, args)
    }

    /// Like [`start_with`](Self::start_with), but when the tests run as root
    /// (and `setpriv` is there) kpm runs as user nobody, so that file
    /// permissions apply to it; `root` is handed over to nobody. Returns
    /// whether kpm runs unprivileged.
    pub fn start_unprivileged(root: &Path, args: &[&str]) -> (Self, bool) {
        let drop_root = euid() == 0
            && Command::new("setpriv")
                .args([&format!("--reuid={NOBODY}"), &format!("--regid={NOBODY}")])
                .args(["--clear-groups", "--", "true"])
                .status()
                .is_ok_and(|status| status.success());
        if !drop_root {
            return (Self::start_with(root, args), false);
        }
        std::os::unix::fs::chown(root, Some(NOBODY), Some(NOBODY)).unwrap();
        let mut setpriv = Command::new("setpriv");
        setpriv.args([&format!("--reuid={NOBODY}"), &format!("--regid={NOBODY}")]).args([
            "--clear-groups",
            "--",
            KPM,
        ]);
        (Self::spawn(setpriv, root, args), true)
    }

    /// `<wrapper…> kpm run --root-dir <root> <args>`: kpm started by another
    /// program, such as `unshare`.
    pub fn start_wrapped(wrapper: &[&str], root: &Path, args: &[&str]) -> Self {
        let (program, wrapper_args) = wrapper.split_first().unwrap();
        let mut command = Command::new(program);
        command.args(wrapper_args).arg(KPM);
        Self::spawn(command, root, args)
    }

    fn spawn(mut command: Command, root: &Path, args: &[&str]) -> Self {
        let log = std::fs::File::create(root.join("kpm.log")).unwrap();
        let child = command
            .args(["run", "--root-dir"])
            .arg(root)
            .args(args)
            .env("RUST_LOG", "debug")
            // Publishing to an API server is only on where a test asks for it.
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut kpm = Self { child, root: root.to_path_buf() };
        wait_until("the status API answers", || {
            if let Some(status) = kpm.child.try_wait().unwrap() {
                panic!("kpm run exited at start-up ({status}):\n{}", kpm.log());
            }
            kpm.list().is_some()
        });
        kpm
    }

    pub fn registry(&self) -> PathBuf {
        self.root.join("plugins_registry")
    }

    /// `<root>/device-plugins/kubelet.sock`, once it is served: kpm serves it
    /// right after the status API, so a loaded machine may see one first.
    pub fn kubelet_sock(&self) -> PathBuf {
        let path = self.root.join("device-plugins").join("kubelet.sock");
        wait_until("kubelet.sock is served", || path.exists());
        path
    }

    /// `kpm list -o json`, parsed; `None` while the API does not answer.
    pub fn list(&self) -> Option<Value> {
        let out = kpm(&["list", "-o", "json", "--root-dir", self.root.to_str().unwrap()]);
        out.status.success().then(|| serde_json::from_slice(&out.stdout).unwrap())
    }

    pub fn plugins(&self) -> Vec<Value> {
        self.list().unwrap()["plugins"].as_array().unwrap().clone()
    }

    /// `GET /v1/plugins` on the status socket, in-process: what `kpm list -o
    /// json` prints, cheap enough to poll every few milliseconds.
    pub fn status(&self) -> Value {
        let mut stream = std::os::unix::net::UnixStream::connect(self.root.join("kpm.sock"))
            .unwrap_or_else(|err| panic!("kpm's status socket: {err}\n{}", self.log()));
        // A status API that accepts but never answers fails the test, not hangs it.
        stream.set_read_timeout(Some(kpm_test_support::DEADLINE)).unwrap();
        serde_json::from_str(&kpm_test_support::http::get_on(&mut stream, "/v1/plugins")).unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What kpm logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("kpm.log")).unwrap_or_default()
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

/// User and group id of nobody.
pub const NOBODY: u32 = 65_534;

/// The effective user id of the tests, from the kernel (no file of the
/// host's is read).
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Runs `kpm <args>` to completion.
pub fn kpm(args: &[&str]) -> Output {
    Command::new(KPM).args(args).output().unwrap()
}

/// Process `pid` of a fake host's `/proc` (the host's `/` at `host`),
/// running `args` with `environ`: in the host's mount namespace (`mnt:[1]`)
/// when `files` is `None`, else in its own, its `/` at `files`.
pub fn fake_process(host: &Path, pid: u32, args: &[&str], environ: &[&str], files: Option<&Path>) {
    let dir = host.join(format!("proc/{pid}"));
    std::fs::create_dir_all(dir.join("ns")).unwrap();
    let nul_separated =
        |list: &[&str]| list.iter().flat_map(|arg| [*arg, "\0"]).collect::<String>();
    std::fs::write(dir.join("cmdline"), nul_separated(args)).unwrap();
    std::fs::write(dir.join("environ"), nul_separated(environ)).unwrap();
    let namespace = match files {
        None => "mnt:[1]".to_owned(),
        Some(files) => {
            std::os::unix::fs::symlink(files, dir.join("root")).unwrap();
            format!("mnt:[{pid}]")
        }
    };
    std::os::unix::fs::symlink(namespace, dir.join("ns/mnt")).unwrap();
}

/// `kpm doctor --host-root HOST ARGS` (the host's `/` at `host`), no other
/// root looked at: its exit code and output.
pub fn doctor_on_host(host: &Path, args: &[&str]) -> (i32, String) {
    let host = host.to_str().unwrap();
    let mut all = vec!["doctor", "--host-root", host, "--other-root", "/nowhere", "--timeout", "2"];
    all.extend(args);
    let out = kpm(&all);
    (out.status.code().unwrap(), String::from_utf8(out.stdout).unwrap())
}

// === Plugin services ===

/// The routes of a stub device plugin reporting `(id, health)` devices.
pub fn device_plugin(devices: &[(&str, &str)]) -> tonic::service::Routes {
    kpm_registrar::stub::StubDevicePlugin::new(devices.iter().copied()).0.routes()
}

/// A service on its own thread and tokio runtime ([`OwnRuntime`]), so that
/// stopping it closes its connections the way a process exit does.
pub struct Served(OwnRuntime);

impl Served {
    /// Stops the service and drops every connection it had; the socket file
    /// stays, as after a crash.
    pub fn stop(self) {
        self.0.stop();
    }

    /// Stops the service from anywhere, even from inside one of its own
    /// calls (a plugin that exits in the middle of a call).
    pub fn stopper(&self) -> Stopper {
        self.0.stopper()
    }
}

/// Serves `routes` on `socket` (bound before this returns) until stopped.
pub fn serve(socket: &Path, routes: tonic::service::Routes) -> Served {
    let socket = socket.to_path_buf();
    serve_incoming(routes, move || async move { kpm::transport::bind(&socket).await.unwrap() })
}

/// Serves `routes` on a listening socket made elsewhere.
pub fn serve_listener(
    listener: std::os::unix::net::UnixListener,
    routes: tonic::service::Routes,
) -> Served {
    listener.set_nonblocking(true).unwrap();
    serve_incoming(routes, move || async move {
        kpm::transport::Incoming::new(tokio::net::UnixListener::from_std(listener).unwrap())
    })
}

fn serve_incoming<F>(
    routes: tonic::service::Routes,
    incoming: impl FnOnce() -> F + Send + 'static,
) -> Served
where
    F: Future<Output = kpm::transport::Incoming>,
{
    Served(OwnRuntime::start(move || async move {
        let incoming = incoming().await;
        let server =
            tonic::transport::Server::builder().add_routes(routes).serve_with_incoming(incoming);
        tokio::spawn(server);
    }))
}
