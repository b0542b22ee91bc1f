//! `kpm doctor` on fixture nodes: one test per verdict, with real sockets,
//! real gRPC servers and the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use kpm_registrar::{Registrar, RegistrarBuilder};
use kpm_test_support::api_server;
use kpm_test_support::registration::{FakePlugin, Reply, info};
use serde_json::Value;
use support::kpm;
use tonic::Status;
use tonic::service::Routes;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
}

/// A kubelet root with an empty registry, and a runtime for its plugins.
struct Node {
    root: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

impl Node {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("plugins_registry")).unwrap();
        Self { root, rt: runtime() }
    }

    fn registry(&self) -> PathBuf {
        self.root.path().join("plugins_registry")
    }

    /// Serves `builder`'s plugin in the registry.
    fn plugin(&self, builder: RegistrarBuilder) -> Registrar {
        self.rt.block_on(builder.socket_dir(self.registry()).serve()).unwrap()
    }

    /// `kpm doctor -o json` on this root, no other root looked at; returns
    /// the exit code and the report.
    fn doctor(&self, extra: &[&str]) -> (i32, Value) {
        let root = self.root.path().to_str().unwrap();
        let nowhere = self.root.path().join("no-other-root");
        let mut args = vec!["doctor", "-o", "json", "--root-dir", root, "--timeout", "2"];
        args.extend(["--other-root", nowhere.to_str().unwrap()]);
        args.extend(extra);
        let out = kpm(&args);
        let report = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|err| panic!("{err}: {}", String::from_utf8_lossy(&out.stdout)));
        (out.status.code().unwrap(), report)
    }
}

/// The report's row for `path`.
fn row<'a>(report: &'a Value, path: &Path) -> &'a Value {
    let path = path.to_str().unwrap();
    report["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["path"] == path)
        .unwrap_or_else(|| panic!("no row for {path} in {report:#}"))
}

fn verdict(report: &Value, path: &Path) -> String {
    row(report, path)["verdict"].as_str().unwrap().to_owned()
}

#[test]
fn a_good_plugin_is_ok_with_what_serves_it() {
    let node = Node::new();
    let plugin = node.plugin(
        Registrar::builder(kpm::api::DEVICE_PLUGIN, "vendor.com/gpu")
            .routes(support::device_plugin(&[("gpu-0", "Healthy"), ("gpu-1", "Unhealthy")])),
    );
    let (code, report) = node.doctor(&[]);
    assert_eq!(code, 0, "{report:#}");
    let good = row(&report, plugin.socket_path());
    assert_eq!(good["verdict"], "ok");
    assert_eq!((&good["type"], &good["name"]), (&"DevicePlugin".into(), &"vendor.com/gpu".into()));
    assert!(good["reason"].as_str().unwrap().starts_with("2 devices, 1 healthy"), "{good:#}");
    assert_eq!(good["served_by"]["pid"], std::process::id(), "the registrar runs in this test");
    assert!(good["served_by"]["command"].as_str().unwrap().contains("doctor"), "{good:#}");
    let steps: Vec<&str> =
        good["steps"].as_array().unwrap().iter().map(|s| s["step"].as_str().unwrap()).collect();
    assert_eq!(steps, ["dial", "GetInfo", "check info", "handler", "validate", "service"]);
    assert!(plugin.statuses().is_empty(), "the doctor never notifies a plugin");
    assert_eq!(report["ok"], true);
}

#[test]
fn hidden_names_and_other_files_are_ignored_but_not_failures() {
    let node = Node::new();
    let hidden = node.registry().join(".keep");
    let file = node.registry().join("driver-reg.sock");
    std::fs::write(&hidden, "").unwrap();
    std::fs::write(&file, "not a socket").unwrap();
    let (code, report) = node.doctor(&[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(verdict(&report, &hidden), "ignored");
    assert_eq!(verdict(&report, &file), "ignored");
    assert!(row(&report, &file)["reason"].as_str().unwrap().contains("not a socket"));
}

#[test]
fn a_one_shot_look_in_the_doctors_pod_takes_the_daemonsets_watch_environment() {
    // `kubectl exec … kpm doctor` in the DaemonSet's pod inherits
    // KPM_POD and KPM_PLUGIN_CONDITIONS, which only --watch uses.
    let node = Node::new();
    let root = node.root.path().to_str().unwrap();
    let out = Command::new(support::KPM)
        .args(["doctor", "-o", "json", "--root-dir", root, "--timeout", "2"])
        .args(["--other-root", node.root.path().join("no-other-root").to_str().unwrap()])
        .env("KPM_POD", "kpm-system/kpm-doctor-x")
        .env("KPM_PLUGIN_CONDITIONS", "example.com/dev,csi.example.com=example.com/Ready")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_socket_nobody_listens_on_is_stale() {
    let node = Node::new();
    let stale = node.registry().join("gone-reg.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let (code, report) = node.doctor(&[]);
    assert_eq!(code, 1);
    assert_eq!(verdict(&report, &stale), "stale");
    assert!(row(&report, &stale)["hint"].as_str().unwrap().contains("Remove it"));
    assert!(stale.exists(), "the doctor removes nothing");
}

#[test]
fn a_drivers_own_socket_in_the_registry_is_not_a_registration_server() {
    let node = Node::new();
    let socket = node.registry().join("csi.sock");
    let _driver = support::serve(
        &socket,
        kpm_registrar::stub::StubCsiDriver::new("csi.example.com", "n1").routes(),
    );
    let (code, report) = node.doctor(&[]);
    assert_eq!(code, 1);
    assert_eq!(verdict(&report, &socket), "not-a-registration-server");
    assert_eq!(
        row(&report, &socket)["served_by"]["pid"],
        std::process::id(),
        "who answered the dial"
    );
}

#[test]
fn a_get_info_slower_than_the_kubelets_second_is_slow() {
    let node = Node::new();
    let socket = node.registry().join("slow-reg.sock");
    // Answers after 2 s, and with a failure even then.
    let too_late = Reply::Fail(Status::unavailable("too late anyway"));
    let slow = FakePlugin::new(info(kpm::api::DEVICE_PLUGIN, "vendor.com/slow", &["v1beta1"]))
        .get_info([], Reply::After(Duration::from_secs(2), Box::new(too_late)));
    let _slow = support::serve(&socket, Routes::new(Arc::new(slow).service()));
    let (code, report) = node.doctor(&[]);
    assert_eq!(code, 1);
    assert_eq!(verdict(&report, &socket), "slow-get-info");
    assert!(row(&report, &socket)["hint"].as_str().unwrap().contains("1 s"));
}

#[test]
fn plugins_the_handlers_refuse_are_rejected_with_the_handlers_reason() {
    let node = Node::new();
    let unknown = node.plugin(Registrar::builder("FancyPlugin", "fancy").versions(["v1"]));
    let old_csi = node
        .plugin(Registrar::builder(kpm::api::CSI_PLUGIN, "old.example.com").versions(["0.3.0"]));
    let (code, report) = node.doctor(&[]);
    assert_eq!(code, 1);
    assert_eq!(verdict(&report, unknown.socket_path()), "rejected");
    let text = |path: &Path, key: &str| row(&report, path)[key].as_str().unwrap().to_owned();
    assert!(
        text(unknown.socket_path(), "reason")
            .contains("no handler registered for plugin type: FancyPlugin")
    );
    assert_eq!(verdict(&report, old_csi.socket_path()), "rejected");
    assert!(text(old_csi.socket_path(), "reason").contains("None of the versions specified"));
}

#[test]
fn of_two_csi_registrars_of_one_driver_the_lower_version_is_rejected() {
    let node = Node::new();
    let csi = node.root.path().join("plugins/csi.example.com/csi.sock");
    std::fs::create_dir_all(csi.parent().unwrap()).unwrap();
    let _driver = support::serve(
        &csi,
        kpm_registrar::stub::StubCsiDriver::new("csi.example.com", "n1").routes(),
    );
    let registrar = |version: &str, uid: &str| {
        node.plugin(
            Registrar::builder(kpm::api::CSI_PLUGIN, "csi.example.com")
                .versions([version])
                .endpoint(&csi)
                .rolling_update_uid(uid),
        )
    };
    let newer = registrar("1.2.0", "b");
    let older = registrar("1.0.0", "a");
    let (code, report) = node.doctor(&[]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(verdict(&report, newer.socket_path()), "ok");
    assert_eq!(verdict(&report, older.socket_path()), "rejected");
    assert!(
        row(&report, older.socket_path())["reason"]
            .as_str()
            .unwrap()
            .contains("equal or higher version")
    );
}

#[test]
fn an_endpoint_nobody_serves_is_unreachable_and_a_failing_service_is_failing() {
    let node = Node::new();
    let missing = node.root.path().join("plugins/missing/csi.sock");
    let csi = node.plugin(
        Registrar::builder(kpm::api::CSI_PLUGIN, "csi.example.com")
            .versions(["1.0.0"])
            .endpoint(&missing),
    );
    // A device plugin whose registration socket serves no DevicePlugin service.
    let device = node.plugin(Registrar::builder(kpm::api::DEVICE_PLUGIN, "vendor.com/gpu"));
    let (code, report) = node.doctor(&[]);
    assert_eq!(code, 1);
    assert_eq!(verdict(&report, csi.socket_path()), "endpoint-unreachable");
    assert!(
        row(&report, csi.socket_path())["reason"].as_str().unwrap().contains("missing/csi.sock")
    );
    assert_eq!(verdict(&report, device.socket_path()), "service-failing");
    assert!(
        row(&report, device.socket_path())["reason"].as_str().unwrap().contains("Unimplemented")
    );
}

#[test]
fn a_socket_file_deleted_while_its_plugin_listens_is_named_with_its_process() {
    // A host under a prefix, its /proc made of files: the kernel's table
    // of listening Unix sockets (pid 1's) names a registration socket whose
    // file is gone, and pid 77 holds that socket (its inode) open.
    let host = tempfile::tempdir().unwrap();
    let seen = |path: &str| host.path().join(path.trim_start_matches('/'));
    std::fs::create_dir_all(seen("/var/lib/kubelet/plugins_registry")).unwrap();
    support::fake_process(host.path(), 1, &["/sbin/init"], &[], None);
    let table = "Num RefCount Protocol Flags Type St Inode Path\n\
        0000000000000000: 00000002 00000000 00010000 0001 01 4242 \
        /var/lib/kubelet/plugins_registry/deleted-reg.sock\n";
    std::fs::create_dir_all(seen("/proc/1/net")).unwrap();
    std::fs::write(seen("/proc/1/net/unix"), table).unwrap();
    support::fake_process(host.path(), 77, &["/usr/bin/registrar", "--v=5"], &[], None);
    std::fs::create_dir_all(seen("/proc/77/fd")).unwrap();
    std::os::unix::fs::symlink("socket:[4242]", seen("/proc/77/fd/3")).unwrap();
    let (code, json) = support::doctor_on_host(host.path(), &["-o", "json"]);
    assert_eq!(code, 1, "{json}");
    let report: Value = serde_json::from_str(&json).unwrap();
    let socket = Path::new("/var/lib/kubelet/plugins_registry/deleted-reg.sock");
    assert_eq!(verdict(&report, socket), "deleted-but-listening");
    let holder = &row(&report, socket)["served_by"];
    assert_eq!(
        (&holder["pid"], &holder["command"]),
        (&77.into(), &"/usr/bin/registrar --v=5".into())
    );
}

#[test]
fn a_socket_listening_where_the_doctor_cannot_see_is_not_called_deleted() {
    // The kubelet and its plugins in another mount namespace: their sockets
    // listen, but their directories are not there to look in. Moving the
    // root away shows the same to the doctor.
    let node = Node::new();
    let socket = node.registry().join("elsewhere-reg.sock");
    let _listening = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let moved = node.root.path().with_extension("moved");
    std::fs::rename(node.root.path(), &moved).unwrap();
    let (code, report) = node.doctor(&[]);
    std::fs::rename(&moved, node.root.path()).unwrap();
    assert_eq!(code, 2, "{report:#}");
    assert_eq!(report["plugins"], serde_json::json!([]), "{report:#}");
}

/// Writes the kubelet device manager's checkpoint in `device-plugins/` of
/// `root`, with `registered` as its resources' healthy devices, as kubelet
/// v1.36 writes it.
fn write_checkpoint(root: &Path, registered: &Value) {
    let checkpoint = serde_json::json!({
        "Data": {"PodDeviceEntries": null, "RegisteredDevices": registered},
        "Checksum": 2_166_136_261_u32,
    });
    let dir = root.join("device-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kubelet_internal_checkpoint"), checkpoint.to_string()).unwrap();
}

#[test]
fn device_plugin_sockets_beside_kubelet_sock_are_judged_too() {
    let node = Node::new();
    let dir = node.root.path().join("device-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("gpu.sock");
    let _plugin = support::serve(&good, support::device_plugin(&[("gpu-0", "Healthy")]));
    let stale = dir.join("old.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let kubelet_sock = dir.join("kubelet.sock");
    drop(std::os::unix::net::UnixListener::bind(&kubelet_sock).unwrap());
    let (code, report) = node.doctor(&[]);
    assert_eq!(code, 1);
    assert_eq!(verdict(&report, &good), "ok");
    assert_eq!(row(&report, &good)["served_by"]["pid"], std::process::id());
    assert!(row(&report, &good)["reason"].as_str().unwrap().starts_with("1 devices, 1 healthy"));
    assert_eq!(verdict(&report, &stale), "stale");
    let rows = report["plugins"].as_array().unwrap();
    assert!(
        rows.iter().all(|row| row["path"] != kubelet_sock.to_str().unwrap()),
        "the kubelet's own"
    );
    // Without the kubelet's checkpoint, no resource is named, and that is said.
    assert!(row(&report, &good).get("name").is_none(), "{report:#}");
    let unseen = report["unseen"].to_string();
    assert!(unseen.contains("kubelet_internal_checkpoint: missing"), "{unseen}");
}

#[test]
fn the_kubelets_checkpoint_names_the_resource_of_a_plugin_on_kubelet_sock() {
    let node = Node::new();
    let dir = node.root.path().join("device-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let serve = |name: &str, devices: &[(&str, &str)]| {
        let socket = dir.join(name);
        (support::serve(&socket, support::device_plugin(devices)), socket)
    };
    let (_gpu, gpu) = serve("gpu.sock", &[("gpu-0", "Healthy"), ("gpu-1", "Unhealthy")]);
    let (_nic, nic) = serve("nic.sock", &[("nic-0", "Healthy"), ("nic-1", "Healthy")]);
    let (_fpga, fpga) = serve("fpga.sock", &[("fpga-0", "Healthy")]);
    let (_sick, sick) = serve("sick.sock", &[("x-0", "Unhealthy")]);
    write_checkpoint(
        node.root.path(),
        &serde_json::json!({"vendor.com/gpu": ["gpu-0"], "example.com/nic": ["nic-0"],
            "example.com/gone": null}),
    );
    let (code, report) = node.doctor(&[]);
    assert_eq!(code, 1, "{report:#}");
    let judged = |socket: &Path| {
        let row = row(&report, socket);
        (row["verdict"].as_str().unwrap().to_owned(), row["name"].as_str().map(str::to_owned))
    };
    assert_eq!(judged(&gpu), ("ok".into(), Some("vendor.com/gpu".into())));
    // The kubelet holds one of its two healthy devices.
    assert_eq!(judged(&nic), ("kubelet-mismatch".into(), Some("example.com/nic".into())));
    let reason = row(&report, &nic)["reason"].as_str().unwrap();
    assert!(reason.contains("lists 2 healthy") && reason.contains("holds 1"), "{reason}");
    // The kubelet holds none of its devices: it did not register it.
    assert_eq!(judged(&fpga), ("not-registered".into(), None));
    // Nothing healthy to tell it by.
    assert_eq!(judged(&sick), ("ok".into(), None));
    assert!(report["unseen"].as_array().unwrap().is_empty(), "{report:#}");
}

#[test]
fn a_registry_of_another_root_that_no_kubelet_watches_is_named() {
    let node = Node::new();
    let other = tempfile::tempdir().unwrap();
    let registry = other.path().join("plugins_registry");
    std::fs::create_dir_all(&registry).unwrap();
    let plugin = node.rt.block_on(
        Registrar::builder(kpm::api::DEVICE_PLUGIN, "vendor.com/gpu").socket_dir(&registry).serve(),
    );
    let _plugin = plugin.unwrap();
    let (code, report) = node.doctor(&["--other-root", other.path().to_str().unwrap()]);
    assert_eq!(code, 1, "{report:#}");
    let finding = &report["findings"][0];
    assert_eq!(finding["verdict"], "unwatched-registry");
    assert_eq!(finding["path"], registry.to_str().unwrap());
    assert!(finding["hint"].as_str().unwrap().contains(node.root.path().to_str().unwrap()));
}

/// A host's file system and `/proc` made of files, given to the doctor
/// with `--host-root`: nothing of this machine's processes is read.
struct FakeHost {
    dir: tempfile::TempDir,
}

impl FakeHost {
    /// A host whose `/proc` holds pid 1, in mount namespace 1.
    fn new() -> Self {
        let fake = Self { dir: tempfile::tempdir().unwrap() };
        fake.namespace(1, "mnt:[1]");
        fake
    }

    /// Where `on_host` is in this process.
    fn at(&self, on_host: &str) -> PathBuf {
        self.dir.path().join(on_host.trim_start_matches('/'))
    }

    fn namespace(&self, pid: u32, namespace: &str) {
        let ns = self.at(&format!("/proc/{pid}/ns"));
        std::fs::create_dir_all(&ns).unwrap();
        std::os::unix::fs::symlink(namespace, ns.join("mnt")).unwrap();
    }

    /// Process `pid` running `args` with `environ`: in the host's mount
    /// namespace when `files` is `None`, else in its own, its `/` at `files`.
    fn process(&self, pid: u32, args: &[&str], environ: &[&str], files: Option<&Path>) {
        support::fake_process(self.dir.path(), pid, args, environ, files);
    }

    /// `kpm doctor --host-root HOST ARGS`, no other root looked at: its
    /// exit code and output.
    fn doctor(&self, args: &[&str]) -> (i32, String) {
        support::doctor_on_host(self.dir.path(), args)
    }

    /// [`doctor`](Self::doctor) with `-o json`: the exit code, the
    /// report, and the report's text.
    fn report(&self, args: &[&str]) -> (i32, Value, String) {
        let (code, json) = self.doctor(&[&["-o", "json"][..], args].concat());
        let report = serde_json::from_str(&json).unwrap_or_else(|err| panic!("{err}: {json}"));
        (code, report, json)
    }
}

#[test]
fn without_root_dir_the_running_kubelets_root_is_judged() {
    let fake = FakeHost::new();
    let registry = fake.at("/data/kubelet/plugins_registry");
    std::fs::create_dir_all(&registry).unwrap();
    drop(std::os::unix::net::UnixListener::bind(registry.join("gone-reg.sock")).unwrap());
    // MicroK8s' kubelite reads the kubelet's flags from a file, with
    // variables of its environment.
    std::fs::write(fake.at("/kubelet-args"), "--kubeconfig=x\n--root-dir=${KPM_TEST_ROOT}\n")
        .unwrap();
    // One kubelet at a time, in the host's mount namespace: the doctor
    // takes its root.
    let cases = [
        ("kubelet", "/usr/bin/kubelet", "--root-dir=/data/kubelet", "the running kubelet"),
        (
            "kubelite",
            "/snap/microk8s/current/kubelite",
            "--kubelet-args-file=/kubelet-args",
            "the kubelet in the running kubelite",
        ),
        ("k3s", "/usr/local/bin/k3s", "agent", "the kubelet in the running k3s"),
    ];
    for (pid, (program, command, flag, from)) in (4242..).zip(cases) {
        let mut args = vec![command, flag];
        if program == "k3s" {
            args.extend(["--kubelet-arg", "root-dir=/data/kubelet"]);
        }
        fake.process(pid, &args, &["KPM_TEST_ROOT=/data/kubelet"], None);
        let (_, report, _) = fake.report(&[]);
        std::fs::remove_dir_all(fake.at(&format!("/proc/{pid}"))).unwrap();
        assert_eq!(report["root_dir"], "/data/kubelet", "{program}: {report:#}");
        assert_eq!(report["root_from"], format!("{from}, pid {pid}"));
        assert_eq!(report["judged_pid"], pid);
        assert_eq!(report["kubelets"][0]["program"], program);
        assert_eq!(report["kubelets"][0]["files"], "host");
        assert_eq!(
            verdict(&report, Path::new("/data/kubelet/plugins_registry/gone-reg.sock")),
            "stale"
        );
        assert!(report.get("choice").is_none(), "one kubelet, no choice: {report:#}");
    }
}

/// A host with two kubelets on `/var/lib/kubelet`: pid 10 in the host's
/// mount namespace, `--hostname-override=node-a`, with no registry; pid 20
/// in a container (kind), node `kind-worker` by its hostname, whose root
/// exists only under its `/proc/20/root`, with a registrar that crashed, a
/// CSI driver whose endpoint is gone, and a device plugin that serves on its
/// registration socket (no endpoint), and a DRA driver with no endpoint
/// either. Returns the host, the container's
/// `/`, the runtime that serves the plugins and the plugins.
fn two_kubelets() -> (FakeHost, tempfile::TempDir, tokio::runtime::Runtime, Vec<Registrar>) {
    let fake = FakeHost::new();
    fake.process(10, &["/usr/bin/kubelet", "--hostname-override=node-a"], &[], None);
    let kind = tempfile::tempdir().unwrap();
    let registry = kind.path().join("var/lib/kubelet/plugins_registry");
    std::fs::create_dir_all(&registry).unwrap();
    std::fs::create_dir_all(kind.path().join("etc")).unwrap();
    std::fs::write(kind.path().join("etc/hostname"), "kind-worker\n").unwrap();
    fake.process(
        20,
        &["/usr/bin/kubelet", "--config=/var/lib/kubelet/config.yaml"],
        &[],
        Some(kind.path()),
    );
    drop(std::os::unix::net::UnixListener::bind(registry.join("crashed-reg.sock")).unwrap());
    let rt = runtime();
    let csi = rt
        .block_on(
            Registrar::builder(kpm::api::CSI_PLUGIN, "csi.example.com")
                .versions(["1.0.0"])
                .socket_dir(&registry)
                .endpoint("/var/lib/kubelet/plugins/csi.example.com/csi.sock")
                .serve(),
        )
        .unwrap();
    let device = rt
        .block_on(
            Registrar::builder(kpm::api::DEVICE_PLUGIN, "vendor.com/gpu")
                .socket_dir(&registry)
                .routes(support::device_plugin(&[("gpu-0", "Healthy")]))
                .serve(),
        )
        .unwrap();
    // A DRA driver with no endpoint either, whose registration socket
    // serves no DRA service.
    let dra = rt
        .block_on(
            Registrar::builder(kpm::api::DRA_PLUGIN, "gpu.example.com")
                .versions([kpm::api::DRA_V1_SERVICE])
                .socket_dir(&registry)
                .serve(),
        )
        .unwrap();
    (fake, kind, rt, vec![csi, device, dra])
}

/// Every path in `text` is as the kubelet names it: neither the prefix the
/// doctor reads the host under nor a `/proc/PID/root` appears in it.
fn assert_kubelets_paths(what: &str, text: &str, fake: &FakeHost) {
    let prefix = fake.dir.path().to_str().unwrap();
    assert!(!text.contains(prefix), "{what} names {prefix}:\n{text}");
    assert!(!text.contains("/root/var/lib"), "{what} names a /proc/PID/root:\n{text}");
}

#[test]
fn of_two_kubelets_the_one_of_the_node_is_judged_through_its_proc_root() {
    let (fake, _kind, _rt, plugins) = two_kubelets();
    let (code, report, json) = fake.report(&["--node-name", "kind-worker"]);
    assert_kubelets_paths("the JSON report", &json, &fake);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(
        (&report["root_dir"], &report["judged_pid"]),
        (&"/var/lib/kubelet".into(), &20.into())
    );
    let kubelets: Vec<_> = report["kubelets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["pid"].clone(), k["files"].clone(), k["node_name"].clone()))
        .collect();
    assert_eq!(
        kubelets,
        [
            (10.into(), "host".into(), "node-a".into()),
            (20.into(), "proc-root".into(), "kind-worker".into())
        ]
    );
    let choice = report["choice"].as_str().unwrap();
    assert!(choice.starts_with("judged as node kind-worker: pid 20"), "{choice}");
    assert!(
        choice.contains(
            "other kubelets on this host: pid 10 (kubelet) root /var/lib/kubelet node node-a"
        ),
        "{choice}"
    );
    // Each row, reason and endpoint names the kubelet's paths.
    let crashed = row(&report, Path::new("/var/lib/kubelet/plugins_registry/crashed-reg.sock"));
    assert_eq!(crashed["verdict"], "stale");
    assert!(
        crashed["reason"]
            .as_str()
            .unwrap()
            .starts_with("dial /var/lib/kubelet/plugins_registry/crashed-reg.sock"),
        "{crashed:#}"
    );
    let on_host = |plugin: &Registrar| {
        let name = plugin.socket_path().file_name().unwrap();
        Path::new("/var/lib/kubelet/plugins_registry").join(name)
    };
    let csi = row(&report, &on_host(&plugins[0]));
    assert_eq!(csi["verdict"], "endpoint-unreachable", "{csi:#}");
    assert!(
        csi["reason"]
            .as_str()
            .unwrap()
            .contains(" /var/lib/kubelet/plugins/csi.example.com/csi.sock"),
        "{csi:#}"
    );
    // An advertised endpoint is shown as the plugin said it.
    assert_eq!(csi["endpoint"], "/var/lib/kubelet/plugins/csi.example.com/csi.sock", "{csi:#}");
    // No endpoint of its own: it is served on its registration socket.
    let device = row(&report, &on_host(&plugins[1]));
    assert_eq!(device["verdict"], "ok", "{device:#}");
    assert_eq!(device["endpoint"], on_host(&plugins[1]).to_str().unwrap());
    let dra = row(&report, &on_host(&plugins[2]));
    assert_eq!(dra["endpoint"], on_host(&plugins[2]).to_str().unwrap(), "{dra:#}");

    let (code, table) = fake.doctor(&["--node-name", "kind-worker"]);
    assert_eq!(code, 1, "{table}");
    assert_kubelets_paths("the table", &table, &fake);
    let mut lines = table.lines();
    assert_eq!(
        lines.next(),
        Some("kubelet root: /var/lib/kubelet (from the running kubelet, pid 20)")
    );
    assert!(lines.next().unwrap().starts_with("judged as node kind-worker: pid 20"), "{table}");
    assert!(
        table.contains(
            "stale: /var/lib/kubelet/plugins_registry/crashed-reg.sock\n  dial /var/lib/kubelet/"
        ),
        "{table}"
    );
}

#[test]
fn without_a_node_name_the_kubelet_whose_registry_can_be_read_is_judged_and_the_others_named() {
    let (fake, _kind, _rt, _plugins) = two_kubelets();
    let (code, report, json) = fake.report(&[]);
    assert_kubelets_paths("the JSON report", &json, &fake);
    assert_eq!(code, 1, "judged, not blind: {report:#}");
    assert_eq!(report["judged_pid"], 20, "{report:#}");
    let choice = report["choice"].as_str().unwrap();
    assert!(
        choice.starts_with("judged as the first whose registry can be read: pid 20"),
        "{choice}"
    );
    assert!(choice.ends_with("pick one with --node-name or --root-dir"), "{choice}");
    assert_eq!(
        verdict(&report, Path::new("/var/lib/kubelet/plugins_registry/crashed-reg.sock")),
        "stale"
    );
    // Asked for the other, it judges that one: whose registry is not there.
    let (code, report, json) = fake.report(&["--node-name", "node-a"]);
    assert_kubelets_paths("the JSON report", &json, &fake);
    assert_eq!(code, 2, "{report:#}");
    assert_eq!(report["judged_pid"], 10, "{report:#}");
    let why = report["blind"]["why"].as_str().unwrap();
    assert!(why.starts_with("/var/lib/kubelet/plugins_registry: cannot be listed"), "{why}");
}

#[test]
fn a_kubelet_whose_proc_root_cannot_be_read_is_read_on_the_host_and_that_is_said() {
    let fake = FakeHost::new();
    // Its namespace and /proc/PID/root unreadable, as for another user's
    // process; its root is on the host.
    let dir = fake.at("/proc/30");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cmdline"), "kubelet\0--root-dir=/data/kubelet\0").unwrap();
    std::fs::create_dir_all(fake.at("/data/kubelet/plugins_registry")).unwrap();
    let (code, report, json) = fake.report(&[]);
    assert_kubelets_paths("the JSON report", &json, &fake);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["kubelets"][0]["files"], "host-fallback");
    let unseen = report["unseen"].to_string();
    assert!(
        unseen.contains("/proc/30/root: cannot be read: No such file or directory"),
        "{unseen}"
    );
}

/// `kpm doctor` on `root`, as a table; its exit code and output.
fn doctor_table(root: &Path) -> (i32, String) {
    doctor_table_with(root, &[])
}

/// [`doctor_table`] with more arguments.
fn doctor_table_with(root: &Path, extra: &[&str]) -> (i32, String) {
    let nowhere = root.join("no-other-root");
    let mut args = vec![
        "doctor",
        "--root-dir",
        root.to_str().unwrap(),
        "--other-root",
        nowhere.to_str().unwrap(),
    ];
    args.extend(extra);
    let out = kpm(&args);
    (out.status.code().unwrap(), String::from_utf8(out.stdout).unwrap())
}

#[test]
fn a_root_without_a_registry_cannot_be_judged_and_says_what_to_try() {
    // A host where no kubelet runs.
    let fake = FakeHost::new();
    let (code, table) = fake.doctor(&["--root-dir", "/wrong"]);
    assert_eq!(code, 2, "{table}");
    let last = table.lines().rev().take(2).collect::<Vec<_>>();
    assert_eq!(
        last[1],
        "cannot judge this node: /wrong/plugins_registry: cannot be listed: No such file or \
         directory (os error 2)",
        "{table}"
    );
    assert!(last[0].starts_with("  try: ") && last[0].contains("--root-dir"), "{table}");
    assert!(last[0].contains("--host-root"), "{table}");
    assert!(!table.contains("0 ok"), "no all-clear: {table}");
    // The same as JSON: not ok, and why.
    let host = fake.dir.path().to_str().unwrap();
    let out = kpm(&["doctor", "-o", "json", "--host-root", host, "--root-dir", "/wrong"]);
    assert_eq!(out.status.code(), Some(2));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], false);
    assert!(report["blind"]["why"].as_str().unwrap().contains("cannot be listed"), "{report:#}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("kpm doctor: cannot judge this node: "), "{stderr}");
    // A kubelet with another root is named.
    fake.process(4242, &["kubelet", "--root-dir=/data/kubelet"], &[], None);
    let (code, table) = fake.doctor(&["--root-dir", "/wrong"]);
    assert_eq!(code, 2, "{table}");
    assert!(
        table.ends_with(
            "  try: the running kubelet, pid 4242 has root /data/kubelet: give that to \
             --root-dir, or leave --root-dir out\n"
        ),
        "{table}"
    );
}

#[test]
fn a_registry_that_cannot_be_listed_cannot_be_judged() {
    // A file where the registry should be: its listing fails, as an
    // unreadable directory's does for a user other than root.
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("plugins_registry"), b"").unwrap();
    let (code, table) = doctor_table(root.path());
    assert_eq!(code, 2, "{table}");
    assert!(
        table.contains("cannot judge this node: ") && table.contains("Not a directory"),
        "{table}"
    );
}

#[test]
fn an_empty_registry_is_judged_and_fine() {
    let node = Node::new();
    let (code, table) = doctor_table(node.root.path());
    assert_eq!(code, 0, "{table}");
    assert!(table.ends_with("0 entries: 0 ok, 0 failing\n"), "{table}");
}

#[test]
fn a_kubeconfig_that_cannot_be_read_cannot_be_judged() {
    let node = Node::new();
    let missing = node.root.path().join("no-kubeconfig");
    let out = kpm(&[
        "doctor",
        "--root-dir",
        node.root.path().to_str().unwrap(),
        "--kubeconfig",
        missing.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(missing.to_str().unwrap()), "{stderr}");
}

#[test]
fn an_api_server_that_cannot_be_reached_cannot_be_judged() {
    let node = Node::new();
    // A port nobody listens on: every read of the cluster fails.
    let closed = kpm_test_support::free_local_addr();
    let kubeconfig = node.root.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api_server::kubeconfig(&format!("http://{closed}"))).unwrap();
    let (code, report) =
        node.doctor(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node1"]);
    assert_eq!(code, 2, "{report:#}");
    let why = report["blind"]["why"].as_str().unwrap();
    assert!(why.starts_with("the API server could not be read about node node1: "), "{why}");
    assert!(report["blind"]["hint"].as_str().unwrap().contains("--kubeconfig"));
}

#[test]
fn the_table_puts_the_verdict_first_and_explains_each_failure() {
    let node = Node::new();
    let stale = node.registry().join("gone-reg.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let root = node.root.path().to_str().unwrap();
    let nowhere = node.root.path().join("no-other-root");
    let out = kpm(&["doctor", "--root-dir", root, "--other-root", nowhere.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let table = String::from_utf8(out.stdout).unwrap();
    let mut lines = table.lines();
    assert_eq!(lines.next(), Some(format!("kubelet root: {root} (from --root-dir)").as_str()));
    assert!(lines.next().unwrap().trim_start().starts_with("VERDICT"), "{table}");
    assert!(lines.next().unwrap().trim_start().starts_with("stale"), "{table}");
    assert!(table.contains(&format!("stale: {}\n", stale.display())), "{table}");
    assert!(table.contains("  fix: nothing listens on it"), "{table}");
    assert!(table.ends_with("1 entries: 0 ok, 1 failing\n"), "{table}");
}

// === Against the API server ===

/// A stand-in API server that shows node `node1`: a CSINode listing
/// `csi.example.com` (node id `n1`), `stale.csi.example.com` and
/// `moved.example.com` (node id `old-id`), a Node with 2 `vendor.com/gpu`
/// of which 1 allocatable, 1 `example.com/nic`, 4 `example.com/fpga` none
/// allocatable (a plugin that stopped), 1 `example.com/dongle` (advertised
/// by hand) and 0 `example.com/retired` (dropped), and ResourceSlices of
/// driver `gone.example.com`; with `forbid_csinodes`, every CSINode read is 403.
fn serve_api_server(rt: &tokio::runtime::Runtime, forbid_csinodes: bool) -> String {
    serve_api_server_of(rt, forbid_csinodes, "v1.36.2")
}

/// [`serve_api_server`] with a Node whose kubelet is `kubelet_version`.
fn serve_api_server_of(
    rt: &tokio::runtime::Runtime,
    forbid_csinodes: bool,
    kubelet_version: &'static str,
) -> String {
    use kpm_test_support::api_server::State;
    use serde_json::json;
    let csinode = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "node1"},
        "spec": {"drivers": [
            {"name": "csi.example.com", "nodeID": "n1"},
            {"name": "stale.csi.example.com", "nodeID": "node1"},
            {"name": "moved.example.com", "nodeID": "old-id"},
        ]},
    });
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node1", "annotations": {
            "csi.volume.kubernetes.io/nodeid": "{\"csi.example.com\":\"n1\",\"stale.csi.example.com\":\"node1\"}",
        }},
        "status": {
            "capacity": {"vendor.com/gpu": "2", "example.com/nic": "1", "cpu": "2",
                "example.com/fpga": "4", "example.com/dongle": "1", "example.com/retired": "0"},
            "allocatable": {"vendor.com/gpu": "1", "example.com/nic": "1", "cpu": "2",
                "example.com/fpga": "0", "example.com/dongle": "1", "example.com/retired": "0"},
            "nodeInfo": {"kubeletVersion": kubelet_version},
        },
    });
    let slice = |node: &str, driver: &str| {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-{driver}")},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
        })
    };
    // Another node's slice, which node1's doctor must not select: a
    // finding of [`ELSEWHERE`] would show it read the slices unselected.
    let slices = vec![slice("node1", "gone.example.com"), slice("node2", ELSEWHERE)];
    let refused = if forbid_csinodes { vec![("csinodes".to_owned(), 403)] } else { Vec::new() };
    let state =
        State { node: Some(node), csinode: Some(csinode), slices, refused, ..State::default() };
    let addr = api_server::serve(rt, 0, Arc::new(parking_lot::Mutex::new(state)));
    format!("http://{addr}")
}

/// The driver of another node's ResourceSlice.
const ELSEWHERE: &str = "elsewhere.example.com";

#[test]
fn with_a_kubeconfig_the_plugins_are_held_against_what_the_cluster_shows() {
    let node = Node::new();
    let kubeconfig = node.root.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api_server::kubeconfig(&serve_api_server(&node.rt, false)))
        .unwrap();
    let csi_driver = |name: &str, node_id: &str| {
        let socket = node.root.path().join(format!("plugins/{name}/csi.sock"));
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let served = support::serve(
            &socket,
            kpm_registrar::stub::StubCsiDriver::new(name, node_id).routes(),
        );
        let registrar = node.plugin(
            Registrar::builder(kpm::api::CSI_PLUGIN, name).versions(["1.0.0"]).endpoint(&socket),
        );
        (served, registrar)
    };
    let (_csi, registered) = csi_driver("csi.example.com", "n1");
    let (_missing, missing) = csi_driver("missing.example.com", "n1");
    let (_moved, moved) = csi_driver("moved.example.com", "new-id");
    let gpu = node.plugin(
        Registrar::builder(kpm::api::DEVICE_PLUGIN, "vendor.com/gpu")
            .routes(support::device_plugin(&[("gpu-0", "Healthy"), ("gpu-1", "Unhealthy")])),
    );
    // Two device plugins on kubelet.sock: one the kubelet's checkpoint names,
    // one it cannot (no healthy device), which has no capacity to look up.
    write_checkpoint(node.root.path(), &serde_json::json!({"example.com/nic": ["nic-0"]}));
    let nic = node.root.path().join("device-plugins/nic.sock");
    let _nic = support::serve(&nic, support::device_plugin(&[("nic-0", "Healthy")]));
    let sick = node.root.path().join("device-plugins/sick.sock");
    let _sick = support::serve(&sick, support::device_plugin(&[("x-0", "Unhealthy")]));
    let dra_socket = node.root.path().join("plugins/gpu.example.com/dra.sock");
    std::fs::create_dir_all(dra_socket.parent().unwrap()).unwrap();
    let _dra_service =
        support::serve(&dra_socket, kpm_registrar::stub::StubDraDriver::new().routes());
    let dra = node.plugin(
        Registrar::builder(kpm::api::DRA_PLUGIN, "gpu.example.com")
            .versions([kpm::api::DRA_V1_SERVICE])
            .endpoint(&dra_socket),
    );

    let (code, report) =
        node.doctor(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node1"]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["node"], "node1");
    let ok = row(&report, registered.socket_path());
    assert_eq!((&ok["verdict"], &ok["cluster"]), (&"ok".into(), &"CSINode: node id n1".into()));
    assert_eq!(verdict(&report, missing.socket_path()), "not-registered");
    assert!(
        row(&report, missing.socket_path())["hint"]
            .as_str()
            .unwrap()
            .contains("not found in the list of registered CSI drivers")
    );
    assert_eq!(verdict(&report, moved.socket_path()), "cluster-mismatch");
    let moved_reason = row(&report, moved.socket_path())["reason"].as_str().unwrap();
    assert!(moved_reason.contains("new-id") && moved_reason.contains("old-id"), "{moved_reason}");
    let gpu = row(&report, gpu.socket_path());
    assert_eq!(
        (&gpu["verdict"], &gpu["cluster"]),
        (&"ok".into(), &"Node capacity 2, allocatable 1".into())
    );
    let nic = row(&report, &nic);
    assert_eq!(
        (&nic["verdict"], &nic["name"], &nic["cluster"]),
        (&"ok".into(), &"example.com/nic".into(), &"Node capacity 1, allocatable 1".into())
    );
    let sick = row(&report, &sick);
    assert_eq!((&sick["verdict"], sick.get("cluster")), (&"ok".into(), None), "{sick:#}");
    assert_eq!(verdict(&report, dra.socket_path()), "not-published");
    let findings: Vec<(&str, &str)> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["verdict"].as_str().unwrap(), f["path"].as_str().unwrap()))
        .collect();
    assert!(findings.contains(&("stale-csi-node-entry", "csinodes/node1")), "{findings:?}");
    assert!(
        findings.contains(&("orphaned-slices", "resourceslices/gone.example.com")),
        "{findings:?}"
    );
    assert!(!findings.iter().any(|(_, path)| path.contains(ELSEWHERE)), "{findings:?}");
    // No socket left behind: an entry removed while the kubelet was down.
    let entry = finding(&report, "resourceslices/gone.example.com", "driver gone.example.com");
    assert!(entry.get("cause").is_none(), "{entry:#}");
    let entry = finding(&report, "csinodes/node1", "driver stale.csi.example.com");
    // The kubelet removes none on a restart: only the entry's removal does.
    let hint = entry["hint"].as_str().unwrap();
    assert!(
        hint.contains("kubectl edit csinode NODE") && hint.contains("restarts included"),
        "{entry:#}"
    );
    // The FPGAs none of which is allocatable may be the sick plugin's,
    // whose resource is not known: not held against anything.
    let unseen = report["unseen"].as_array().unwrap();
    assert_eq!(unseen.len(), 1, "{report:#}");
    let unseen = unseen[0].as_str().unwrap();
    assert!(unseen.contains("example.com/fpga") && unseen.contains("sick.sock"), "{unseen}");
    assert!(!findings.iter().any(|(verdict, _)| *verdict == "orphaned-capacity"), "{findings:?}");
}

/// Where the node's kubelet (its Node's `nodeInfo.kubeletVersion`) does
/// otherwise than the referee, the report says what it does: kubelets 1.32
/// and 1.33 register a DRA driver offering `v1.DRAPlugin` alone and call it
/// on v1alpha4, 1.31 takes semantic versions only, and kubelets before
/// 1.33 wipe a gone driver's slices at once.
#[test]
fn the_verdicts_on_dra_drivers_follow_the_minor_of_the_nodes_kubelet() {
    let cases = [
        ("v1.36.2", "not-published", "not-published", "grace period (30s)"),
        ("v1.33.13", "service-failing", "not-published", "grace period (30s)"),
        ("v1.32.13", "service-failing", "not-published", "as soon as the driver deregisters"),
        ("v1.31.14", "rejected", "rejected", "as soon as the driver deregisters"),
    ];
    for (kubelet, v1_only, both, wipe) in cases {
        let node = Node::new();
        let kubeconfig = node.root.path().join("kubeconfig");
        let api = serve_api_server_of(&node.rt, false, kubelet);
        std::fs::write(&kubeconfig, api_server::kubeconfig(&api)).unwrap();
        let driver = |name: &str, versions: &[&str]| {
            let socket = node.root.path().join(format!("plugins/{name}/dra.sock"));
            std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
            let served =
                support::serve(&socket, kpm_registrar::stub::StubDraDriver::new().routes());
            let builder = Registrar::builder(kpm::api::DRA_PLUGIN, name).endpoint(&socket);
            let builder = if versions.is_empty() {
                builder
            } else {
                builder.versions(versions.iter().copied())
            };
            (served, node.plugin(builder))
        };
        let (_served, v1) = driver("v1.example.com", &["v1.DRAPlugin"]);
        // kpm-registrar's default: v1.DRAPlugin and v1beta1.DRAPlugin.
        let (_served, default) = driver("both.example.com", &[]);

        let (_, report) =
            node.doctor(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node1"]);
        assert_eq!(report["kubelet_version"], kubelet);
        assert_eq!(verdict(&report, v1.socket_path()), v1_only, "{kubelet}: {report:#}");
        assert_eq!(verdict(&report, default.socket_path()), both, "{kubelet}: {report:#}");
        let minor = &kubelet[..5];
        if v1_only != "not-published" {
            let reason = row(&report, v1.socket_path())["reason"].as_str().unwrap();
            assert!(reason.starts_with(&format!("kubelet {}", &minor[1..])), "{reason}");
        }
        let kept = finding(&report, "resourceslices/gone.example.com", "driver gone.example.com");
        assert!(kept["hint"].as_str().unwrap().contains(wipe), "{kubelet}: {kept:#}");
    }
}

/// Before 1.34, a kubelet has a DRA handler only with the
/// `DynamicResourceAllocation` feature gate, off by default: the doctor reads
/// the gates from the running kubelet's flags (and its config file).
#[test]
fn a_kubelet_before_1_34_without_the_dra_gate_refuses_dra_drivers() {
    let rt = runtime();
    let api = serve_api_server_of(&rt, false, "v1.33.13");
    let gate_on = "--feature-gates=Other=false,DynamicResourceAllocation=true";
    for (gates, expected) in [(None, "rejected"), (Some(gate_on), "not-published")] {
        let fake = FakeHost::new();
        let registry = fake.at("/data/kubelet/plugins_registry");
        std::fs::create_dir_all(&registry).unwrap();
        let kubeconfig = fake.at("/kubeconfig");
        std::fs::write(&kubeconfig, api_server::kubeconfig(&api)).unwrap();
        let mut args = vec!["/usr/bin/kubelet", "--root-dir=/data/kubelet"];
        args.extend(gates);
        fake.process(4242, &args, &[], None);
        let dra = rt
            .block_on(
                Registrar::builder(kpm::api::DRA_PLUGIN, "gpu.example.com")
                    .socket_dir(&registry)
                    .routes(kpm_registrar::stub::StubDraDriver::new().routes())
                    .serve(),
            )
            .unwrap();
        let (_, report, _) =
            fake.report(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node1"]);
        let socket = Path::new("/data/kubelet/plugins_registry")
            .join(dra.socket_path().file_name().unwrap());
        assert_eq!(verdict(&report, &socket), expected, "{gates:?}: {report:#}");
        if gates.is_none() {
            let reason = row(&report, &socket)["reason"].as_str().unwrap();
            assert!(
                reason.contains(
                    "kubelet 1.33 has no handler for DRAPlugin: its \
                                 DynamicResourceAllocation feature gate is off"
                ),
                "{reason}"
            );
        }
    }
}

/// The report's finding about `path` whose reason names `what`.
fn finding<'a>(report: &'a Value, path: &str, what: &str) -> &'a Value {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|finding| {
            finding["path"] == path && finding["reason"].as_str().unwrap().contains(what)
        })
        .unwrap_or_else(|| panic!("no finding about {what} in {path}: {report:#}"))
}

#[test]
fn an_entry_the_cluster_keeps_for_a_stale_socket_names_that_socket_and_its_fix() {
    // A registrar killed with SIGKILL leaves its socket behind, and the
    // kubelet keeps the driver registered: CSINode lists it, its
    // ResourceSlices stay.
    let node = Node::new();
    let kubeconfig = node.root.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api_server::kubeconfig(&serve_api_server(&node.rt, false)))
        .unwrap();
    let csi = node.registry().join("stale.csi.example.com-reg.sock");
    let dra = node.registry().join("gone.example.com-1111-reg.sock");
    for socket in [&csi, &dra] {
        drop(std::os::unix::net::UnixListener::bind(socket).unwrap());
    }
    let (code, report) =
        node.doctor(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node1"]);
    assert_eq!(code, 1);
    assert_eq!((verdict(&report, &csi), verdict(&report, &dra)), ("stale".into(), "stale".into()));
    let cases = [
        ("csinodes/node1", "stale.csi.example.com", &csi),
        ("resourceslices/gone.example.com", "gone.example.com", &dra),
    ];
    for (path, driver, socket) in cases {
        let entry = finding(&report, path, &format!("driver {driver}"));
        let socket = socket.to_str().unwrap();
        assert_eq!(entry["cause"], socket, "{entry:#}");
        let (reason, hint) = (entry["reason"].as_str().unwrap(), entry["hint"].as_str().unwrap());
        assert!(
            reason.contains(&format!("its registration socket {socket} is still in the registry")),
            "{reason}"
        );
        assert!(hint.contains(&format!("remove {socket}")), "{hint}");
        assert!(!hint.contains("restart the kubelet"), "not the kubelet's doing: {hint}");
    }
    // The FPGAs of a device plugin that stopped: kept for the kubelet's
    // grace period, whatever its socket. A resource advertised by hand
    // (allocatable) or dropped (0) is no finding.
    let kept = finding(&report, "nodes/node1", "resource example.com/fpga");
    assert_eq!(kept["verdict"], "orphaned-capacity", "{kept:#}");
    assert!(kept.get("cause").is_none(), "{kept:#}");
    let hint = kept["hint"].as_str().unwrap();
    assert!(hint.contains("start the device plugin") && hint.contains("within 5m"), "{hint}");
    let capacity_findings =
        report["findings"].as_array().unwrap().iter().filter(|f| f["path"] == "nodes/node1");
    assert_eq!(capacity_findings.count(), 1, "{report:#}");
    // The JSON keeps every finding, the caused ones with their cause.
    assert_eq!(report["findings"].as_array().unwrap().len(), 5, "{report:#}");
    // The table shows what is kept for a socket under its row, as part of
    // its failure: two sockets fail, and three findings stand on their own
    // (two CSINode entries and the FPGAs no socket explains).
    let (_, table) = doctor_table_with(
        node.root.path(),
        &["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node1"],
    );
    assert!(
        table.ends_with("\n2 entries: 0 ok, 2 failing; 3 finding(s) about the node\n"),
        "{table}"
    );
    for (socket, kept) in [
        (&csi, "stale-csi-node-entry: csinodes/node1"),
        (&dra, "orphaned-slices: resourceslices/gone.example.com"),
    ] {
        let row = format!("stale: {}\n", socket.display());
        let explained = table.split(&row).nth(1).and_then(|rest| rest.split("\n\n").next());
        let kept = format!("\n  kept for it: {kept}\n    ");
        assert!(explained.is_some_and(|block| block.contains(&kept)), "{kept} in {table}");
    }
    assert!(
        table
            .contains("    fix: restart the driver's registrar (node-driver-registrar), or remove"),
        "{table}"
    );
}

#[test]
fn what_the_api_server_forbids_is_named_not_fatal() {
    let node = Node::new();
    let kubeconfig = node.root.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api_server::kubeconfig(&serve_api_server(&node.rt, true))).unwrap();
    let gpu = node.plugin(
        Registrar::builder(kpm::api::DEVICE_PLUGIN, "vendor.com/gpu")
            .routes(support::device_plugin(&[("gpu-0", "Healthy"), ("gpu-1", "Unhealthy")])),
    );
    let (_, report) =
        node.doctor(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node1"]);
    assert_eq!(verdict(&report, gpu.socket_path()), "ok");
    let unseen = report["unseen"].as_array().unwrap();
    assert!(
        unseen.iter().any(|what| what.as_str().unwrap().starts_with("CSINode node1: ")
            && what.as_str().unwrap().contains("forbidden")),
        "{unseen:?}"
    );
}
