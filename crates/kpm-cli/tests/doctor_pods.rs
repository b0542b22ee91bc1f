//! `kpm doctor` names the pods behind the sockets: the real binary on a
//! host given with `--host-root` (its `/proc`, its files), whose container
//! runtime is a CRI server on a real Unix socket answering as containerd
//! does, with the container logs the kubelet keeps.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::{Path, PathBuf};

use kpm_registrar::Registrar;
use kpm_test_support::cri::{self, FakeContainer};
use serde_json::Value;

const POD: (&str, &str, &str) = ("kube-system", "csi-hostpath-node-x", "0b1c");
const REGISTRAR: &str = "node-driver-registrar";
const REGISTRY: &str = "/var/lib/kubelet/plugins_registry";
/// The socket node-driver-registrar leaves when it exits.
const LEFT: &str = "/var/lib/kubelet/plugins_registry/hostpath.csi.k8s.io-reg.sock";
/// Where its `--kubelet-registration-path` wrongly says the driver is.
const WRONG: &str = "/var/lib/kubelet/plugins/csi-hostpath/csi.sock";

/// A host whose kubelet (pid 4242, in the host's mount namespace) talks to
/// the container runtime at `/run/containerd/containerd.sock`.
struct Host {
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

impl Host {
    fn new() -> Self {
        let host = Self {
            dir: tempfile::tempdir().unwrap(),
            rt: tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap(),
        };
        host.process(1, &["/sbin/init"]);
        host.process(
            4242,
            &[
                "/usr/bin/kubelet",
                "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
            ],
        );
        std::fs::create_dir_all(host.at(REGISTRY)).unwrap();
        host
    }

    fn at(&self, on_host: &str) -> PathBuf {
        self.dir.path().join(on_host.trim_start_matches('/'))
    }

    fn process(&self, pid: u32, args: &[&str]) {
        support::fake_process(self.dir.path(), pid, args, &[], None);
    }

    /// The container runtime, keeping `containers`.
    fn runtime(&self, containers: Vec<FakeContainer>) -> cri::Served {
        let socket = self.at("/run/containerd/containerd.sock");
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        self.rt.block_on(cri::serve(&socket, containers))
    }

    /// Writes `lines` as the runtime logs a run, `TIME STREAM F LINE`.
    fn log(&self, container: &FakeContainer, lines: &[&str]) {
        let path = self.at(&container.status.log_path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut text = String::new();
        for line in lines {
            text.push_str("2026-11-28T14:11:22.997515000Z stderr F ");
            text.push_str(line);
            text.push('\n');
        }
        std::fs::write(path, text).unwrap();
    }

    fn doctor(&self, args: &[&str]) -> (i32, String) {
        support::doctor_on_host(self.dir.path(), args)
    }

    fn report(&self) -> (i32, Value) {
        let (code, json) = self.doctor(&["-o", "json"]);
        (code, serde_json::from_str(&json).unwrap_or_else(|err| panic!("{err}: {json}")))
    }
}

fn row<'a>(report: &'a Value, path: &str) -> &'a Value {
    report["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["path"] == path)
        .unwrap_or_else(|| panic!("no row for {path} in {report:#}"))
}

/// node-driver-registrar v2.17's last words when the kubelet refuses the
/// driver socket it advertises, as it printed them (with this test's path).
fn refused_lines() -> [String; 4] {
    [
        r#"I1128 14:11:22.100000       1 node_register.go:56] "Starting Registration Server" socketPath="/registration/hostpath.csi.k8s.io-reg.sock""#.to_owned(),
        r#"I1128 14:11:22.100100       1 node_register.go:66] "Registration Server started" socketPath="/registration/hostpath.csi.k8s.io-reg.sock""#.to_owned(),
        format!(
            r#"I1128 14:11:22.997515       1 main.go:102] "Received NotifyRegistrationStatus call" status="error:\"RegisterPlugin error -- plugin registration failed with err: rpc error: code = Unavailable desc = connection error: desc = \\\"transport: Error while dialing: dial unix {WRONG}: connect: no such file or directory\\\"\"""#
        ),
        format!(
            r#"E1128 14:11:22.997589       1 main.go:104] "Registration process failed with error, restarting registration container" err="RegisterPlugin error -- plugin registration failed with err: rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial unix {WRONG}: connect: no such file or directory\"""#
        ),
    ]
}

#[test]
fn a_crash_looping_registrar_with_a_wrong_registration_path_is_named_with_its_fix() {
    let host = Host::new();
    drop(std::os::unix::net::UnixListener::bind(host.at(LEFT)).unwrap());
    let latest = FakeContainer::new(&"a7".repeat(32), POD, REGISTRAR, 7)
        .exited(1, "Error", 1_795_000_000_000_000_000)
        .mount("/registration", REGISTRY);
    let before = FakeContainer::new(&"a6".repeat(32), POD, REGISTRAR, 6)
        .exited(1, "Error", 1_794_999_000_000_000_000)
        .mount("/registration", REGISTRY);
    let driver = FakeContainer::new(&"d0".repeat(32), POD, "hostpath", 0)
        .mount("/csi", "/var/lib/kubelet/plugins/csi-hostpath.example");
    let lines = refused_lines();
    host.log(&latest, &lines.each_ref().map(String::as_str));
    let runtime = host.runtime(vec![latest, before, driver]);

    let (code, report) = host.report();
    assert_eq!(code, 1, "{report:#}");
    let left = row(&report, LEFT);
    assert_eq!(left["verdict"], "endpoint-unreachable", "{left:#}");
    assert_eq!(left["endpoint"], WRONG);
    let reason = left["reason"].as_str().unwrap();
    assert!(reason.contains(WRONG), "{reason}");
    let hint = left["hint"].as_str().unwrap();
    assert!(hint.contains("--kubelet-registration-path"), "{hint}");
    let pod = &left["pod"];
    assert_eq!((&pod["namespace"], &pod["pod"]), (&"kube-system".into(), &POD.1.into()));
    assert_eq!((&pod["container"], &pod["restarts"]), (&REGISTRAR.into(), &7.into()));
    assert_eq!(pod["state"], "Terminated");
    assert_eq!(pod["lastTermination"]["exitCode"], 1);
    assert_eq!(pod["lastTermination"]["reason"], "Error");
    assert!(left["said"].as_str().unwrap().contains("Registration process failed"), "{left:#}");
    assert!(
        runtime.runtime.status_calls.lock().iter().all(|id| !id.starts_with("d0")),
        "a running container that never restarted is not asked about"
    );

    let (_, table) = host.doctor(&[]);
    assert!(
        table.contains("kube-system/csi-hostpath-node-x (node-driver-registrar, 7 restarts)"),
        "{table}"
    );
    assert!(
        table.contains("kubectl -n kube-system logs csi-hostpath-node-x -c node-driver-registrar"),
        "{table}"
    );
    assert!(table.contains("it said: E1128"), "{table}");
}

#[test]
fn a_socket_left_by_a_container_that_said_nothing_known_is_stale_and_names_the_pod() {
    let host = Host::new();
    drop(std::os::unix::net::UnixListener::bind(host.at(LEFT)).unwrap());
    let latest = FakeContainer::new(&"b1".repeat(32), POD, REGISTRAR, 1)
        .exited(137, "OOMKilled", 1_795_000_000_000_000_000)
        .mount("/registration", REGISTRY);
    host.log(&latest, &[r#"I1128 "Starting Registration Server" socketPath="/registration/hostpath.csi.k8s.io-reg.sock""#]);
    let _runtime = host.runtime(vec![latest]);
    let (_, report) = host.report();
    let left = row(&report, LEFT);
    assert_eq!(left["verdict"], "stale", "{left:#}");
    assert_eq!(left["pod"]["lastTermination"]["reason"], "OOMKilled");
    assert!(left["hint"].as_str().unwrap().contains("-c node-driver-registrar"), "{left:#}");
    assert!(left.get("said").is_none());
}

#[test]
fn a_live_plugin_is_named_by_the_container_its_process_runs_in() {
    let host = Host::new();
    let rt = &host.rt;
    let plugin: Registrar = rt
        .block_on(
            Registrar::builder(kpm::api::CSI_PLUGIN, "live.csi.example.com")
                .socket_dir(host.at(REGISTRY))
                .endpoint(Path::new(WRONG))
                .serve(),
        )
        .unwrap();
    // This test's process serves the socket: its cgroup names a container.
    let id = "c2".repeat(32);
    let pid = std::process::id();
    host.process(pid, &["/csi-node-driver-registrar"]);
    let cgroup = format!("0::/kubepods/besteffort/pod0b1c/{id}\n");
    std::fs::write(host.at(&format!("/proc/{pid}/cgroup")), cgroup).unwrap();
    let running = FakeContainer::new(&id, POD, REGISTRAR, 2);
    let oom = FakeContainer::new(&"c1".repeat(32), POD, REGISTRAR, 1).exited(
        137,
        "OOMKilled",
        1_795_000_000_000_000_000,
    );
    let _runtime = host.runtime(vec![running, oom]);
    let (_, report) = host.report();
    let served = row(
        &report,
        &format!("{REGISTRY}/{}", plugin.socket_path().file_name().unwrap().to_str().unwrap()),
    );
    let pod = &served["pod"];
    assert_eq!((&pod["restarts"], &pod["state"]), (&2.into(), &"Running".into()), "{served:#}");
    assert_eq!(pod["lastTermination"]["reason"], "OOMKilled");
    assert_eq!(pod["lastTermination"]["exitCode"], 137);
}

#[test]
fn a_runtime_that_cannot_be_asked_is_said_and_judges_nothing_otherwise() {
    let host = Host::new();
    drop(std::os::unix::net::UnixListener::bind(host.at(LEFT)).unwrap());
    let (_, report) = host.report();
    assert_eq!(row(&report, LEFT)["verdict"], "stale");
    let unseen: Vec<&str> =
        report["unseen"].as_array().unwrap().iter().map(|what| what.as_str().unwrap()).collect();
    assert!(
        unseen.iter().any(|what| what
            .starts_with("dial the container runtime at /run/containerd/containerd.sock")
            && what.ends_with("the pods behind the sockets are not named")),
        "{unseen:?}"
    );
}

/// A pod that should serve a socket and never binds one: its last
/// words, as each program prints them, and what the doctor's fix says.
const NEVER_SERVES: &[(&str, &str, &str)] = &[
    // node-driver-registrar v2.11+ gives up on the driver's socket after 30 s.
    (
        REGISTRY,
        r#"E1128 14:00:30.000000       1 main.go:167] "Error connecting to CSI driver" err="context deadline exceeded""#,
        "--csi-address",
    ),
    // v2.9 to v2.10, in their own words.
    (
        REGISTRY,
        "E1128 14:10:01.120443       1 main.go:170] error retreiving CSI driver name: rpc error: code = DeadlineExceeded desc = context deadline exceeded",
        "--csi-address",
    ),
    // A registration socket's path over sun_path's 107 bytes.
    (
        REGISTRY,
        r#"E1128 14:10:02.340695       1 node_register.go:59] "Failed to listen on socket" err="listen unix /registration/s3.csi.aws.com-reg.sock: bind: invalid argument""#,
        "107 bytes",
    ),
    // A device plugin's, in device-plugins/.
    (
        "/var/lib/kubelet/device-plugins",
        "E0423 09:13:28.819373       1 manager.go:125] Failed to serve fpga.intel.com/6952: listen unix /var/lib/kubelet/device-plugins/fpga.sock: bind: invalid argument",
        "107 bytes",
    ),
];

#[test]
fn a_pod_that_never_binds_its_socket_is_named_with_why_from_its_last_words() {
    for (mounted, said, fix) in NEVER_SERVES {
        let host = Host::new();
        let waiting = FakeContainer::new(&"e3".repeat(32), POD, REGISTRAR, 3)
            .exited(1, "Error", 1_795_000_000_000_000_000)
            .mount("/registration", mounted);
        host.log(&waiting, &[r#"I1128 14:00:01.000000       1 connection.go:253] "Still connecting" address="unix:///csi/csi.sock""#, said]);
        // A doctor's pod sees the whole host, read-only: never one to serve.
        let doctor =
            FakeContainer::new(&"f1".repeat(32), ("kpm-system", "kpm-doctor-x", "9f"), "kpm", 1)
                .exited(0, "Completed", 1)
                .read_only_mount("/host", "/");
        // A pod being deleted: its registrar removed its socket and exited 0.
        let deleted =
            FakeContainer::new(&"d9".repeat(32), ("csi", "csi-node-old", "u9"), REGISTRAR, 0)
                .exited(0, "Completed", 1)
                .mount("/registration", REGISTRY);
        let _runtime = host.runtime(vec![waiting, doctor, deleted]);
        let (code, report) = host.report();
        assert_eq!(code, 1, "{said}: {report:#}");
        let findings = report["findings"].as_array().unwrap();
        assert_eq!(findings.len(), 1, "{said}: {report:#}");
        let finding = &findings[0];
        assert_eq!(finding["verdict"], "pod-without-socket");
        assert_eq!(finding["path"], "pods/kube-system/csi-hostpath-node-x");
        let reason = finding["reason"].as_str().unwrap();
        assert!(
            reason.contains("container node-driver-registrar (terminated, 3 restarts"),
            "{reason}"
        );
        assert!(reason.contains(&format!("mounts {mounted} at /registration")), "{reason}");
        assert!(finding["hint"].as_str().unwrap().contains(fix), "{said}: {finding:#}");
    }
}

/// A pod that should serve a socket changes no file the watch sees when
/// it starts crash-looping: the watch's looks list the runtime's
/// containers again and judge the node at once, not at the period.
#[test]
fn the_watch_judges_at_once_when_a_container_ends() {
    let host = Host::new();
    let runtime = host.runtime(vec![]);
    let log = host.dir.path().join("doctor.log");
    let mut doctor = std::process::Command::new(support::KPM)
        .args(["doctor", "--watch", "--host-root"])
        .arg(host.dir.path())
        .args([
            "--other-root",
            "/nowhere",
            "--timeout",
            "2",
            "--look-every",
            "1",
            "--period",
            "3600",
        ])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let listed = || runtime.runtime.list_calls.load(std::sync::atomic::Ordering::SeqCst);
    support::wait_until("a pass and a look", || listed() >= 2);
    let waiting = FakeContainer::new(&"e3".repeat(32), POD, REGISTRAR, 1)
        .exited(1, "Error", 1_795_000_000_000_000_000)
        .mount("/registration", REGISTRY);
    host.log(
        &waiting,
        &[r#"E1128 "Error connecting to CSI driver" err="context deadline exceeded""#],
    );
    runtime.runtime.containers.lock().push(waiting);
    support::wait_until("the pod without a socket told", || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("PodWithoutSocket"))
    });
    doctor.kill().unwrap();
    doctor.wait().unwrap();
}
