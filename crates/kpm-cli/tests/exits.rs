//! Plugin processes that exit, against `kpm run`: the kernel tells kpm (a
//! pidfd on the process that serves the registration socket), and kpm checks
//! the socket before it deregisters anything.
//!
//! The plugins here are real processes: this test binary started again with
//! the plugin's role in the environment (see [`main`]).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::float_cmp,
    reason = "a test; the metrics compared are counts"
)]

mod support;

use std::io::{BufRead, BufReader, Write as _};
use std::os::fd::{AsFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

use socket2::{Domain, SockAddr, Socket, Type};
use support::faults::{Scenario, csi_plugin, serve_plugin, serve_plugin_listener};
use support::trial;

const ROLE: &str = "KPM_TEST_PLUGIN_ROLE";
const SOCKET: &str = "KPM_TEST_PLUGIN_SOCKET";

/// Runs the tests, or, started by one of them, a plugin process.
fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        plugin_process(&role);
    }
    support::run_tests();
}

/// A plugin process serving `KPM_TEST_PLUGIN_SOCKET`, as `role`:
///
/// - `serve`: serves a CSI plugin on the socket;
/// - `serve-device`: serves a device plugin ([`DEVICE_PLUGIN`]) with one
///   device in the socket's directory;
/// - `listen-in-child`: binds the socket, has a child process call
///   `listen()` on it (so the kernel names the child as the server), then
///   serves on it once the child is listening, and prints the child's pid;
/// - `listen`: that child; the socket is its stdin.
fn plugin_process(role: &str) -> ! {
    let socket = PathBuf::from(std::env::var(SOCKET).unwrap());
    let plugin = csi_plugin("exit.example.com");
    let _served = match role {
        "serve" => serve_plugin(&plugin, &socket),
        "serve-device" => {
            let routes = support::device_plugin(&[("dev-0", "Healthy")]);
            let dir = socket.parent().unwrap().to_path_buf();
            // Serves until the process is killed.
            let _served = kpm_test_support::OwnRuntime::start(move || async move {
                let registrar = device_registrar(&dir).routes(routes).serve().await.unwrap();
                std::mem::forget(registrar);
            });
            println!("serving");
            std::io::stdout().flush().unwrap();
            park()
        }
        "listen-in-child" => {
            // Bound under a hidden name, which kpm ignores until it is listening.
            let hidden = socket.with_file_name(".binding.sock");
            let bound = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
            bound.bind(&SockAddr::unix(&hidden).unwrap()).unwrap();
            let stdin = OwnedFd::from(bound.try_clone().unwrap());
            // Not waited for: the test kills it, and this process with it.
            #[allow(clippy::zombie_processes)]
            let mut child = plugin_command("listen", &socket).stdin(stdin).spawn_piped();
            read_line(&mut BufReader::new(child.stdout.as_mut().unwrap()), "listening");
            println!("child {}", child.id());
            std::fs::rename(&hidden, &socket).unwrap();
            serve_plugin_listener(&plugin, OwnedFd::from(bound).into())
        }
        "listen" => {
            let stdin = std::io::stdin().as_fd().try_clone_to_owned().unwrap();
            Socket::from(stdin).listen(128).unwrap();
            println!("listening");
            park()
        }
        other => panic!("unknown role {other}"),
    };
    println!("serving");
    std::io::stdout().flush().unwrap();
    park()
}

/// Sleeps until killed.
fn park() -> ! {
    loop {
        std::thread::park();
    }
}

/// This test binary again, as a plugin process in `role`.
fn plugin_command(role: &str, socket: &Path) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.env(ROLE, role).env(SOCKET, socket).env("RUST_BACKTRACE", "1");
    command
}

trait SpawnPiped {
    /// Spawns with stdout piped to the caller and stderr inherited.
    fn spawn_piped(&mut self) -> Child;
}

impl SpawnPiped for Command {
    fn spawn_piped(&mut self) -> Child {
        self.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap()
    }
}

/// Reads `lines` up to a line with `prefix`; returns what follows it. One
/// reader serves every call on a stream: a reader dropped between calls
/// would take the lines it had buffered with it.
fn read_line(lines: &mut BufReader<&mut ChildStdout>, prefix: &str) -> String {
    loop {
        let mut line = String::new();
        assert_ne!(lines.read_line(&mut line).unwrap(), 0, "no {prefix:?} line before EOF");
        if let Some(rest) = line.strip_prefix(prefix) {
            return rest.trim().to_owned();
        }
    }
}

/// A plugin process in `role` serving `socket`, once it serves.
struct PluginProcess {
    child: Child,
    /// What the process printed before `serving` (the child's pid line).
    listener_pid: Option<u32>,
}

impl PluginProcess {
    fn start(role: &str, socket: &Path) -> Self {
        let mut child = plugin_command(role, socket).spawn_piped();
        let mut stdout = BufReader::new(child.stdout.as_mut().unwrap());
        let listener_pid =
            (role == "listen-in-child").then(|| read_line(&mut stdout, "child ").parse().unwrap());
        read_line(&mut stdout, "serving");
        Self { child, listener_pid }
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(pid) = self.listener_pid {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    }
}

/// The pid `kpm list` shows as serving `socket`.
fn server_pid(s: &Scenario, socket: &Path) -> Option<u64> {
    s.plugin(socket).unwrap()["server_pid"].as_u64()
}

trial!(a_killed_plugin_process_is_deregistered_without_any_probe, || {
    let s = Scenario::start_with(&["--liveness-period", "0"]);
    let socket = s.socket("killed.sock");
    let mut plugin = PluginProcess::start("serve", &socket);
    let registered = s.events.wait_first("registered", &socket);
    assert_eq!(server_pid(&s, &socket), Some(u64::from(plugin.child.id())));
    assert_eq!(s.metric("kpm_liveness_watched_processes"), 1.0);

    plugin.kill();
    let unresponsive = s.events.wait_first("unresponsive", &socket);
    let reason = unresponsive["reason"].as_str().unwrap();
    assert!(reason.contains("exited") && reason.contains("refused"), "{unresponsive}");
    assert_eq!(unresponsive["generation"], registered["generation"]);
    let deregistered = s.events.wait_first("deregistered", &socket);
    assert_eq!(deregistered["generation"], registered["generation"]);
    assert_eq!(s.metric("kpm_liveness_probes_total"), 0.0, "no probe ran");
    assert_eq!(s.metric("kpm_liveness_process_exits_total"), 1.0);

    std::fs::remove_file(&socket).unwrap();
    s.check(&[]);
    assert_eq!(s.events.kind_of("deregistered", &socket).len(), 1);
});

trial!(a_socket_kept_by_the_parent_stays_registered_when_the_listening_child_exits, || {
    let s = Scenario::start_with(&["--liveness-period", "0"]);
    let socket = s.socket("forked.sock");
    let plugin = PluginProcess::start("listen-in-child", &socket);
    let child = plugin.listener_pid.unwrap();
    s.events.wait_first("registered", &socket);
    // The kernel names the process that called listen(), not the one answering.
    assert_eq!(server_pid(&s, &socket), Some(u64::from(child)));

    assert!(Command::new("kill").args(["-KILL", &child.to_string()]).status().unwrap().success());
    support::wait_until("kpm checked the socket", || {
        s.kpm.log().contains("the socket is still served")
    });
    assert_eq!(s.metric("kpm_liveness_process_exits_total"), 1.0);
    assert!(s.events.kind_of("unresponsive", &socket).is_empty());
    s.check(&[(&socket, "registered")]);
});

trial!(a_plugin_kpm_cannot_see_the_pid_of_is_left_to_the_probes, || {
    let Some(unshare) = unshare_pid() else { return };
    let s =
        Scenario::start_wrapped(&unshare, &["--liveness-period", "1", "--liveness-failures", "2"]);
    let socket = s.socket("hidden.sock");
    let mut plugin = PluginProcess::start("serve", &socket);
    let registered = s.events.wait_first("registered", &socket);
    assert_eq!(server_pid(&s, &socket), None);
    assert_eq!(s.metric("kpm_liveness_watched_processes"), 0.0);

    plugin.kill();
    let unresponsive = s.events.wait_first("unresponsive", &socket);
    assert_eq!(unresponsive["generation"], registered["generation"]);
    assert_eq!(unresponsive["failures"], 2, "found by a probe: {unresponsive}");
    s.events.wait_first("deregistered", &socket);
    assert_eq!(s.metric("kpm_liveness_process_exits_total"), 0.0);
});

/// The device plugin of role `serve-device`.
const DEVICE_PLUGIN: &str = "exit.example.com/dev";

fn device_registrar(dir: &Path) -> kpm_registrar::RegistrarBuilder {
    kpm_registrar::Registrar::builder(kpm_registrar::DEVICE_PLUGIN, DEVICE_PLUGIN).socket_dir(dir)
}

/// `unshare --pid --fork --kill-child`, if this machine permits it: kpm in a
/// pid namespace of its own sees no process outside it, and the kernel
/// reports pid 0 for the plugins. Needs `CAP_SYS_ADMIN`.
fn unshare_pid() -> Option<[&'static str; 4]> {
    let unshare = ["unshare", "--pid", "--fork", "--kill-child"];
    let permitted = Command::new(unshare[0])
        .args(&unshare[1..])
        .arg("true")
        .status()
        .is_ok_and(|status| status.success());
    if !permitted {
        eprintln!("skipped: `unshare --pid --fork` is not permitted here");
    }
    permitted.then_some(unshare)
}

trial!(a_device_plugin_kpm_cannot_see_the_pid_of_is_found_by_its_stream, || {
    let Some(unshare) = unshare_pid() else { return };
    // No probes: only the end of the ListAndWatch stream can tell.
    let s = Scenario::start_wrapped(&unshare, &["--liveness-period", "0"]);
    let socket = device_registrar(&s.registry()).socket_path().unwrap();
    let mut plugin = PluginProcess::start("serve-device", &socket);
    let registered = s.events.wait_first("registered", &socket);
    assert_eq!(server_pid(&s, &socket), None);

    plugin.kill();
    let unresponsive = s.events.wait_first("unresponsive", &socket);
    assert_eq!(unresponsive["generation"], registered["generation"]);
    let reason = unresponsive["reason"].as_str().unwrap();
    // A listener killed with connections queued resets them: kpm's own
    // check may be one of those, as likely as refused on a loaded machine.
    let gone = ["refused", "reset by peer", "closed at once"];
    assert!(
        reason.contains("connection to") && gone.iter().any(|why| reason.contains(why)),
        "{unresponsive}"
    );
    s.events.wait_first("deregistered", &socket);
    assert_eq!(s.metric("kpm_liveness_probes_total"), 0.0, "no probe ran");
});
