//! The fault suite's tools: kpm-test-support's fake registration plugin,
//! whose answers each test scripts, served as a plugin process would serve
//! it, the `kpm watch -o json` stream collected in the background, a `kpm
//! run` with metrics, and [`Scenario::check`], the checks every fault
//! scenario ends with.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use kpm_test_support::blocking::eventually;
use kpm_test_support::free_local_addr;
use kpm_test_support::prometheus;
use kpm_test_support::registration::{FakePlugin, Reply, info};
use parking_lot::Mutex;
use serde_json::Value;

use super::{KPM, Kpm, Served, serve, wait_until};

// === Plugins served as processes ===

/// A well-behaved CSI driver's registration plugin called `name`, version
/// 1.0.0, with no endpoint of its own: served with a stub CSI driver on the
/// same socket, so that the CSI handler's NodeGetInfo passes.
pub fn csi_plugin(name: &str) -> Arc<FakePlugin> {
    Arc::new(FakePlugin::new(info(kpm_api::constants::CSI_PLUGIN, name, &["1.0.0"])))
}

/// Serves `plugin` on `socket` (bound on return) as its process would, with
/// a stub CSI driver next to it.
pub fn serve_plugin(plugin: &Arc<FakePlugin>, socket: &Path) -> Served {
    serve(socket, routes(plugin))
}

/// Serves `plugin` on a listening socket made by the test.
pub fn serve_plugin_listener(plugin: &Arc<FakePlugin>, listener: UnixListener) -> Served {
    super::serve_listener(listener, routes(plugin))
}

/// Like [`serve_plugin`], but any user may connect (mode 0666), for a kpm
/// that runs unprivileged: bound under a hidden name, which kpm ignores,
/// opened up, then renamed into place.
pub fn serve_plugin_open(plugin: &Arc<FakePlugin>, socket: &Path) -> Served {
    use std::os::unix::fs::PermissionsExt;
    let name = socket.file_name().unwrap().to_str().unwrap();
    let hidden = socket.with_file_name(format!(".{name}.binding"));
    let served = serve_plugin(plugin, &hidden);
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::rename(&hidden, socket).unwrap();
    served
}

/// Like [`serve_plugin`], as a process that dies while it is told it is
/// registered: its server stops in the middle of that call, every
/// connection drops, and its socket file stays behind.
pub fn serve_crashing_when_told(plugin: &Arc<FakePlugin>, socket: &Path) -> Served {
    // The call is in flight until the process is gone.
    plugin.set_notify(Reply::Hang);
    let served = serve_plugin(plugin, socket);
    let (plugin, stopper) = (Arc::clone(plugin), served.stopper());
    std::thread::spawn(move || {
        // A plugin never told fails the test's own waits.
        if eventually(|| plugin.statuses().iter().any(|status| status.plugin_registered)) {
            stopper.stop();
        }
    });
    served
}

fn routes(plugin: &Arc<FakePlugin>) -> tonic::service::Routes {
    kpm_registrar::stub::StubCsiDriver::new(plugin.name(), "node-1")
        .routes()
        .add_service(Arc::clone(plugin).service())
}

/// A socket that accepts connections, reads what the client sends until it
/// pauses (the preface and the start of a call), then closes the connection
/// without a word: a plugin dying in the middle of a call, every time.
pub struct Hangup {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Hangup {
    pub fn serve(socket: &Path) -> Self {
        let listener = UnixListener::bind(socket).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, accepted) = (Arc::clone(&stop), Arc::clone(&accepted));
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(mut stream) = stream else { continue };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                    let mut buf = [0; 4096];
                    // The client's request is in once it goes quiet.
                    while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                }
            })
        };
        Self { socket: socket.to_path_buf(), stop, accepted, thread: Some(thread) }
    }

    /// Connections accepted (and dropped) so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Hangup {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop; fails only if the socket file is gone, in
        // which case the thread is left blocked until the process exits.
        if std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
            && let Some(thread) = self.thread.take()
        {
            thread.join().unwrap();
        }
    }
}

// === The event stream ===

/// `kpm watch -o json`, collected by a background thread.
pub struct Events {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Events {
    /// Follows the events of the `kpm run` on `root`; returns once the
    /// stream is subscribed, from when on nothing is missed.
    pub fn follow(root: &Path) -> Self {
        let mut child = Command::new(KPM)
            .args(["watch", "-o", "json", "--root-dir"])
            .arg(root)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let lines = Arc::new(Mutex::new(Vec::new()));
        let collected = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                collected.lock().push(serde_json::from_str(&line).unwrap());
            }
        });
        let events = Self { child, lines };
        events.wait_for("the event stream is subscribed", |all| {
            all.first().is_some_and(|e| e["event"] == "subscribed")
        });
        events
    }

    pub fn all(&self) -> Vec<Value> {
        self.lines.lock().clone()
    }

    /// The events of `socket`, in order.
    pub fn of(&self, socket: &Path) -> Vec<Value> {
        let socket = socket.display().to_string();
        self.all().into_iter().filter(|e| e["socket"] == socket.as_str()).collect()
    }

    /// The events of kind `kind` of `socket`, in order.
    pub fn kind_of(&self, kind: &str, socket: &Path) -> Vec<Value> {
        self.of(socket).into_iter().filter(|e| e["event"] == kind).collect()
    }

    /// Polls until `condition` holds for every event so far; returns them.
    pub fn wait_for(&self, what: &str, mut condition: impl FnMut(&[Value]) -> bool) -> Vec<Value> {
        wait_until(what, || condition(&self.lines.lock()));
        self.all()
    }

    /// Waits for the `n`th event (1-based) of kind `kind` of `socket`.
    pub fn wait_nth(&self, n: usize, kind: &str, socket: &Path) -> Value {
        let what = format!("{kind} event #{n} of {}", socket.display());
        wait_until(&what, || self.kind_of(kind, socket).len() >= n);
        self.kind_of(kind, socket)[n - 1].clone()
    }

    /// Waits for the first event of kind `kind` of `socket`.
    pub fn wait_first(&self, kind: &str, socket: &Path) -> Value {
        self.wait_nth(1, kind, socket)
    }

    /// Where the first event of kind `kind` of `socket` is in the stream.
    pub fn position(&self, kind: &str, socket: &Path) -> Option<usize> {
        let socket = socket.display().to_string();
        self.all().iter().position(|e| e["event"] == kind && e["socket"] == socket.as_str())
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An event's time.
pub fn event_time(event: &Value) -> SystemTime {
    humantime::parse_rfc3339(event["time"].as_str().unwrap()).unwrap()
}

// === A kpm under test ===

/// Tasks `kpm_tokio_tasks` may stay above its baseline: connections of the
/// scrape itself and of status requests still closing.
const TASK_SLACK: f64 = 2.0;

/// Tasks each connection liveness keeps between probes runs (hyper's
/// connection and its dispatch): they live as long as their plugin is
/// registered, counted by `kpm_liveness_probe_connections`.
const TASKS_PER_KEPT_CONNECTION: f64 = 2.0;

/// How a [`Scenario`] starts `kpm run`.
#[derive(Clone, Copy)]
enum Launch<'a> {
    AsIs,
    /// As nobody, if the tests run as root.
    Unprivileged,
    /// Through another program.
    Wrapped(&'a [&'a str]),
}

/// A `kpm run` on its own temp root, with metrics on a free port and its
/// event stream followed from the start.
pub struct Scenario {
    pub kpm: Kpm,
    /// kpm runs as nobody while the tests run as root.
    unprivileged: bool,
    pub events: Events,
    metrics_addr: String,
    baseline_tasks: f64,
    /// (socket, generation) registered before the event stream was followed.
    registered_at_start: HashSet<(String, u64)>,
    fresh_plugins: AtomicUsize,
    root: tempfile::TempDir,
}

impl Scenario {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// `kpm run` with extra `args`.
    pub fn start_with(args: &[&str]) -> Self {
        Self::start_prepared(args, |_| ()).0
    }

    /// Runs `prepare` on the registry directory (created, empty), then starts
    /// `kpm run` with extra `args`; returns what `prepare` returned.
    pub fn start_prepared<T>(args: &[&str], prepare: impl FnOnce(&Path) -> T) -> (Self, T) {
        Self::launch(args, Launch::AsIs, prepare)
    }

    /// `kpm run` with extra `args`, started by `wrapper` (see
    /// [`Kpm::start_wrapped`]).
    pub fn start_wrapped(wrapper: &[&str], args: &[&str]) -> Self {
        Self::launch(args, Launch::Wrapped(wrapper), |_| ()).0
    }

    /// Like [`start_prepared`](Self::start_prepared), with kpm running as
    /// nobody if the tests run as root (see [`Kpm::start_unprivileged`]).
    /// Serve plugins with [`serve`](Self::serve) (or [`serve_plugin_open`]
    /// in `prepare`) so that kpm can connect to them.
    pub fn start_unprivileged<T>(args: &[&str], prepare: impl FnOnce(&Path) -> T) -> (Self, T) {
        Self::launch(args, Launch::Unprivileged, prepare)
    }

    fn launch<T>(args: &[&str], how: Launch<'_>, prepare: impl FnOnce(&Path) -> T) -> (Self, T) {
        let root = tempfile::tempdir().unwrap();
        let registry = root.path().join(kpm_api::constants::PLUGINS_REGISTRY_DIR_NAME);
        std::fs::create_dir(&registry).unwrap();
        let prepared = prepare(&registry);
        let metrics_addr = free_local_addr();
        let mut all_args = vec!["--metrics-addr", metrics_addr.as_str()];
        all_args.extend_from_slice(args);
        let (kpm, unprivileged) = match how {
            Launch::AsIs => (Kpm::start_with(root.path(), &all_args), false),
            Launch::Unprivileged => Kpm::start_unprivileged(root.path(), &all_args),
            Launch::Wrapped(wrapper) => {
                (Kpm::start_wrapped(wrapper, root.path(), &all_args), false)
            }
        };
        let events = Events::follow(root.path());
        let mut scenario = Self {
            unprivileged,
            kpm,
            events,
            metrics_addr,
            baseline_tasks: 0.0,
            registered_at_start: HashSet::new(),
            fresh_plugins: AtomicUsize::new(0),
            root,
        };
        scenario.baseline_tasks = scenario.metric("kpm_tokio_tasks");
        scenario.registered_at_start = scenario.registered_now();
        (scenario, prepared)
    }

    /// Whether kpm runs as nobody while the tests run as root.
    pub fn unprivileged(&self) -> bool {
        self.unprivileged
    }

    /// Serves `plugin` on `socket` so that kpm can connect, whoever it runs as.
    pub fn serve(&self, plugin: &Arc<FakePlugin>, socket: &Path) -> Served {
        if self.unprivileged {
            serve_plugin_open(plugin, socket)
        } else {
            serve_plugin(plugin, socket)
        }
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    pub fn registry(&self) -> PathBuf {
        self.kpm.registry()
    }

    /// `name` in the registry directory.
    pub fn socket(&self, name: &str) -> PathBuf {
        self.registry().join(name)
    }

    pub fn metrics(&self) -> HashMap<String, f64> {
        prometheus::scrape(&self.metrics_addr)
    }

    /// One series of `/metrics`.
    pub fn metric(&self, series: &str) -> f64 {
        let metrics = self.metrics();
        *metrics.get(series).unwrap_or_else(|| panic!("no {series} in {metrics:?}"))
    }

    /// `socket_path -> state` of every plugin the status API lists.
    pub fn states(&self) -> BTreeMap<String, String> {
        self.plugins()
            .iter()
            .map(|p| {
                (p["socket_path"].as_str().unwrap().into(), p["state"].as_str().unwrap().into())
            })
            .collect()
    }

    /// The `plugins` of the status API.
    pub fn plugins(&self) -> Vec<Value> {
        self.kpm.status()["plugins"].as_array().unwrap().clone()
    }

    /// The plugin listed for `socket`.
    pub fn plugin(&self, socket: &Path) -> Option<Value> {
        let socket = socket.display().to_string();
        self.plugins().into_iter().find(|p| p["socket_path"] == socket.as_str())
    }

    /// Names of the CSI drivers the CSI handler has registered.
    pub fn csi_drivers(&self) -> Vec<String> {
        let status = self.kpm.status();
        status["csi_drivers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Polls until the status API lists exactly `expected` (socket, state).
    pub fn wait_for_states(&self, expected: &[(&Path, &str)]) {
        let expected: BTreeMap<String, String> =
            expected.iter().map(|(s, state)| (s.display().to_string(), (*state).into())).collect();
        let mut last = BTreeMap::new();
        let converged = eventually(|| {
            last = self.states();
            last == expected
        });
        assert!(converged, "not converged: listed {last:#?}, expected {expected:#?}");
    }

    /// Polls until `socket` is listed in `state`; returns its listing.
    pub fn wait_for_state(&self, socket: &Path, state: &str) -> Value {
        let mut found = None;
        wait_until(format!("{} is {state}", socket.display()), || {
            found = self.plugin(socket).filter(|p| p["state"] == state);
            found.is_some()
        });
        found.unwrap()
    }

    /// kpm's peak resident memory so far, in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.kpm.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// The checks every scenario ends with, once its faults are in place or
    /// cleaned up; `expected` is every socket still present and its state.
    /// - still serving: a fresh, well-behaved plugin registers and leaves,
    ///   and `kpm list` answers;
    /// - convergence: the listing is exactly `expected`;
    /// - exactly once: every registration whose incarnation is no longer
    ///   registered was deregistered once, nothing else was deregistered;
    /// - no leaks: one executor entry per failing socket (`kpm_operations`),
    ///   and `kpm_tokio_tasks` back near its baseline, beyond the tasks of
    ///   the connections liveness keeps to registered plugins.
    pub fn check(&self, expected: &[(&Path, &str)]) {
        self.fresh_plugin_registers_and_leaves();
        assert!(self.kpm.list().is_some(), "kpm list answers\n{}", self.kpm.log());
        self.wait_for_states(expected);
        self.check_exactly_once();
        let failing = expected.iter().filter(|(_, state)| *state != "registered").count();
        let failing = f64::from(u32::try_from(failing).unwrap());
        let mut last = HashMap::new();
        let settled = eventually(|| {
            last = self.metrics();
            let kept = last.get("kpm_liveness_probe_connections").copied().unwrap_or_default();
            last.get("kpm_operations") == Some(&failing)
                && last["kpm_tokio_tasks"]
                    <= self.baseline_tasks + TASK_SLACK + kept * TASKS_PER_KEPT_CONNECTION
        });
        assert!(
            settled,
            "kpm_operations {:?} (expected {failing}), kpm_tokio_tasks {:?} (baseline {}, \
             kept probe connections {:?})",
            last.get("kpm_operations"),
            last.get("kpm_tokio_tasks"),
            self.baseline_tasks,
            last.get("kpm_liveness_probe_connections"),
        );
    }

    fn fresh_plugin_registers_and_leaves(&self) {
        let n = self.fresh_plugins.fetch_add(1, Ordering::SeqCst);
        let socket = self.socket(&format!("fresh-{n}.sock"));
        let plugin = csi_plugin(&format!("fresh-{n}.example.com"));
        let served = self.serve(&plugin, &socket);
        let status = plugin.wait_for_status(1);
        assert!(status.plugin_registered, "a fresh plugin registers: {status:?}");
        self.wait_for_state(&socket, "registered");
        served.stop();
        std::fs::remove_file(&socket).unwrap();
        self.events.wait_first("deregistered", &socket);
    }

    /// Every `registered` (socket, generation) no longer registered has
    /// exactly one `deregistered`, after it; nothing else is deregistered.
    /// A registration that happened before the stream was followed may show
    /// both in the first listing and as an event.
    fn check_exactly_once(&self) {
        let registered_now = self.registered_now();
        let ended = |events: &[Value]| {
            let deregistered: HashSet<_> = events
                .iter()
                .filter(|e| e["event"] == "deregistered")
                .map(|e| key(e, "socket"))
                .collect();
            events
                .iter()
                .filter(|e| e["event"] == "registered")
                .map(|e| key(e, "socket"))
                .chain(self.registered_at_start.iter().cloned())
                .all(|k| registered_now.contains(&k) || deregistered.contains(&k))
        };
        let mut events = Vec::new();
        let all_ended = eventually(|| {
            events = self.events.all();
            ended(&events)
        });
        assert!(all_ended, "a registration ended without its deregistration:\n{events:#?}");
        assert!(!events.iter().any(|e| e["event"] == "lagged"), "the event stream lagged");
        // Where each registration is in the stream; 0 if before it.
        let mut registered: HashMap<(String, u64), usize> =
            self.registered_at_start.iter().map(|k| (k.clone(), 0)).collect();
        let mut deregistered = HashSet::new();
        for (at, event) in events.iter().enumerate() {
            let kind = event["event"].as_str().unwrap();
            if kind == "registered" {
                let k = key(event, "socket");
                let before = registered.insert(k.clone(), at);
                assert!(
                    before.is_none() || self.registered_at_start.contains(&k),
                    "registered twice: {k:?}"
                );
            } else if kind == "deregistered" {
                let k = key(event, "socket");
                assert!(
                    registered.get(&k).is_some_and(|r| *r < at),
                    "deregistered without being registered: {k:?}\n{events:#?}"
                );
                assert!(deregistered.insert(k.clone()), "deregistered twice: {k:?}");
            }
        }
    }
}

impl Drop for Scenario {
    /// A failed scenario shows kpm's log (the temp root goes with the test).
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.kpm.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n");
            eprintln!("--- the last {LOG_TAIL} lines of kpm.log ---\n{tail}");
        }
    }
}

/// Lines of kpm's log shown when a scenario fails.
const LOG_TAIL: usize = 200;

impl Scenario {
    /// `(socket, generation)` of every plugin listed as registered.
    fn registered_now(&self) -> HashSet<(String, u64)> {
        self.plugins()
            .iter()
            .filter(|p| p["state"] == "registered")
            .map(|p| key(p, "socket_path"))
            .collect()
    }
}

/// `(socket, generation)` of an event or a listed plugin.
fn key(value: &Value, socket_field: &str) -> (String, u64) {
    (value[socket_field].as_str().unwrap().to_owned(), value["generation"].as_u64().unwrap())
}
