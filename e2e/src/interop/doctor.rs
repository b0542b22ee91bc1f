//! `kpm doctor` beside the kubelet's own plugin manager and device manager.

use std::fs;
use std::path::Path;

use super::processes::{
    hostpath, null_devices, peer, spawn, spawn_command, start_kpm_with, wait_for_list,
};
use super::{Env, STEP_TIMEOUT, STOP_TIMEOUT};
use crate::command::Result;
use crate::scenario::{self, Process, find, wait_until};

/// The scenario of [`doctor_beside_the_kubelet`] and [`registrar_killed`],
/// which name its programs' logs.
const BESIDE_THE_KUBELET: &str = "doctor";

/// `kpm doctor` beside the kubelet's own plugin manager: node-driver-registrar
/// with hostpathplugin and a DRA kubelet-plugin registered with it,
/// generic-device-plugin registered on a `kubelet.sock` (served by a `kpm
/// run` whose registry is elsewhere), a stale socket and a CSI driver's own
/// socket placed in the registry. Every verdict must be right, and the
/// doctor must not have notified anyone. Then the registrar is killed
/// ([`registrar_killed`]).
pub(super) fn doctor_beside_the_kubelet(env: &Env, root: &Path) -> Result {
    let registry = root.join("plugins_registry");
    fs::create_dir_all(&registry)?;
    let manager = peer(
        env,
        BESIDE_THE_KUBELET,
        "kubelet-pluginmanager",
        &["--registry-dir", &registry.display().to_string()],
    )?;
    manager.wait_for_line("the plugin manager started", STEP_TIMEOUT, |line| line == "started")?;
    let kubelet_sock = start_kpm_with(
        env,
        root,
        BESIDE_THE_KUBELET,
        &["--registry-dir", &root.join("kpm-registry").display().to_string()],
    )?;

    let csi_sock = root.join("plugins/csi-hostpath/csi.sock");
    fs::create_dir_all(csi_sock.parent().ok_or("no parent")?)?;
    let _driver = hostpath(env, BESIDE_THE_KUBELET, root, "hostpath.csi.k8s.io", &csi_sock, &[])?;
    wait_until("hostpathplugin serves its socket", STEP_TIMEOUT, || Ok(csi_sock.exists()))?;
    let registrar = peer(
        env,
        BESIDE_THE_KUBELET,
        "node-driver-registrar",
        &[
            &format!("--csi-address={}", csi_sock.display()),
            &format!("--kubelet-registration-path={}", csi_sock.display()),
            &format!("--plugin-registration-path={}", registry.display()),
        ],
    )?;
    manager.wait_for_line("the kubelet registered the CSI driver", STEP_TIMEOUT, |line| {
        line.starts_with("register CSIPlugin hostpath.csi.k8s.io ")
    })?;
    let dra = peer(
        env,
        BESIDE_THE_KUBELET,
        "dra-kubeletplugin",
        &[
            "--driver-name",
            "dra.example.com",
            "--node-name",
            "node-1",
            "--registrar-dir",
            &registry.display().to_string(),
            "--plugin-dir",
            &root.join("plugins/dra.example.com").display().to_string(),
        ],
    )?;
    dra.wait_for_line("the helper told registered", STEP_TIMEOUT, |line| {
        line == "registration status: true"
    })?;
    let _devices = null_devices(env, BESIDE_THE_KUBELET, root)?;
    wait_for_list(&kubelet_sock, "squat.ai/null registered on kubelet.sock", |list| {
        Ok(find(&list["device_resources"], "resource", "squat.ai/null")
            .filter(|r| r["healthy"] == 3)
            .cloned())
    })?;
    let stale = registry.join("gone.example.com-reg.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale)?);
    let misplaced = registry.join("csi.sock");
    let _misplaced_driver =
        hostpath(env, BESIDE_THE_KUBELET, root, "misplaced.csi.k8s.io", &misplaced, &[])?;
    wait_until("the misplaced driver serves its socket", STEP_TIMEOUT, || Ok(misplaced.exists()))?;

    let notified = |registrar: &Process| -> Result<usize> {
        Ok(registrar
            .error_lines()?
            .iter()
            .filter(|line| line.contains("NotifyRegistrationStatus"))
            .count())
    };
    let before = notified(&registrar)?;
    let report = doctor_failing(env, root)?;
    expect_doctor_verdicts(&report, &registry, &stale, &misplaced)?;
    let after = notified(&registrar)?;
    if after != before {
        return Err(format!(
            "node-driver-registrar was notified {} more time(s) while kpm doctor ran",
            after - before
        )
        .into());
    }
    eprintln!(
        "doctor: every verdict right; node-driver-registrar notified {before} time(s) before, none by the doctor"
    );
    registrar_killed(env, &manager, registrar, &registry, root)?;
    kubelet_sock.stop()
}

/// node-driver-registrar killed with SIGKILL beside the kubelet's plugin
/// manager: its registration socket stays, and so does the registration
/// (the manager deregisters on the socket's removal only, issue 37); `kpm
/// doctor` calls the socket `stale`.
fn registrar_killed(
    env: &Env,
    manager: &Process,
    mut registrar: Process,
    registry: &Path,
    root: &Path,
) -> Result {
    let socket = registry.join("hostpath.csi.k8s.io-reg.sock");
    registrar.kill();
    if !socket.exists() {
        return Err(format!("{} went with its registrar's SIGKILL", socket.display()).into());
    }
    // A plugin registered after the kill: the manager's reconciler has
    // passed over the killed driver's socket by the time it registers it.
    let args = [
        "--dir",
        &registry.display().to_string(),
        "--type",
        "CSIPlugin",
        "--name",
        "after.example.com",
    ];
    let _after = spawn(env, BESIDE_THE_KUBELET, "example_plugin", &env.example_plugin, &args)?;
    manager.wait_for_line(
        "the kubelet registered a plugin after the kill",
        STEP_TIMEOUT,
        |line| line.starts_with("register CSIPlugin after.example.com "),
    )?;
    let deregistered = manager
        .lines()?
        .into_iter()
        .find(|line| line.starts_with("deregister CSIPlugin hostpath.csi.k8s.io "));
    if let Some(line) = deregistered {
        return Err(
            format!("the kubelet deregistered the killed registrar's driver: {line}").into()
        );
    }
    let report = doctor_failing(env, root)?;
    scenario::expect_verdict(&report, &socket, "stale")?;
    eprintln!(
        "doctor: node-driver-registrar killed, the kubelet keeps hostpath.csi.k8s.io registered and \
         kpm doctor calls {} stale",
        socket.display()
    );
    Ok(())
}

/// `kpm doctor` beside the kubelet's own device manager (its test binary,
/// run on `ROOT/device-plugins/kubelet.sock`): generic-device-plugin
/// registers there, and the doctor names its socket's resource from the
/// checkpoint the manager writes; kpm-registrar's example device plugin,
/// serving in `device-plugins/` without registering, is `not-registered`.
pub(super) fn doctor_beside_the_device_manager(env: &Env, root: &Path) -> Result {
    const SCENARIO: &str = "doctor-device-manager";
    const NAME: &str = "kubelet-devicemanager";
    let mut manager = spawn_command(
        env,
        SCENARIO,
        NAME,
        std::process::Command::new(env.bin_dir.join(NAME))
            .args(["-test.run", "TestKpmPeerDeviceManager", "-test.v"])
            .env("KPM_PEER_ROOT", root),
    )?;
    manager.wait_for_line("it serves kubelet.sock", STEP_TIMEOUT, |line| line == "serving")?;
    let _devices = null_devices(env, SCENARIO, root)?;
    manager.wait_for_line("squat.ai/null is registered", STEP_TIMEOUT, |line| {
        line.starts_with("capacity ") && line.contains("squat.ai/null=3")
    })?;
    let device_plugins = root.join("device-plugins");
    let dir = device_plugins.display().to_string();
    let args = ["--dir", &dir, "--type", "DevicePlugin", "--name", "vendor.com/gpu"];
    let _unregistered = spawn(env, SCENARIO, "example_plugin", &env.example_plugin, &args)?;
    let unregistered = device_plugins.join("vendor.com_gpu-reg.sock");
    wait_until("the example plugin serves", STEP_TIMEOUT, || Ok(unregistered.exists()))?;

    fs::create_dir_all(root.join("plugins_registry"))?;
    let report = doctor_failing(env, root)?;
    let named = find(&report["plugins"], "name", "squat.ai/null")
        .ok_or_else(|| format!("no row named squat.ai/null: {report}"))?;
    if named["verdict"] != "ok" || named["found_in"] != "device-plugins" {
        return Err(format!("generic-device-plugin's row: {named}").into());
    }
    scenario::expect_verdict(&report, &unregistered, "not-registered")?;
    eprintln!(
        "doctor: {} named squat.ai/null by the device manager's checkpoint; the unregistered \
         plugin not-registered",
        named["path"]
    );
    manager.stop(STOP_TIMEOUT)
}

/// `kpm doctor -o json` of the kubelet at `root` (and of no other), which
/// must find something failing (exit 1).
fn doctor_failing(env: &Env, root: &Path) -> Result<serde_json::Value> {
    let nowhere = root.join("no-other-root").display().to_string();
    scenario::doctor(
        &env.kpm,
        &["--root-dir", &root.display().to_string(), "--other-root", &nowhere],
        1,
    )
}

/// The verdicts [`doctor_beside_the_kubelet`] expects of `kpm doctor`.
fn expect_doctor_verdicts(
    report: &serde_json::Value,
    registry: &Path,
    stale: &Path,
    misplaced: &Path,
) -> Result {
    scenario::expect_verdict(report, &registry.join("hostpath.csi.k8s.io-reg.sock"), "ok")?;
    let dra_socket = find(&report["plugins"], "name", "dra.example.com")
        .ok_or_else(|| format!("no row for dra.example.com: {report}"))?;
    if dra_socket["verdict"] != "ok" {
        return Err(format!("the DRA driver is {}: {dra_socket}", dra_socket["verdict"]).into());
    }
    scenario::expect_verdict(report, stale, "stale")?;
    scenario::expect_verdict(report, misplaced, "not-a-registration-server")?;
    let device = find(&report["plugins"], "found_in", "device-plugins")
        .ok_or_else(|| format!("no row for generic-device-plugin's socket: {report}"))?;
    if device["verdict"] != "ok"
        || !device["reason"].as_str().is_some_and(|r| r.starts_with("3 devices, 3 healthy"))
    {
        return Err(format!("generic-device-plugin's socket: {device}").into());
    }
    Ok(())
}
