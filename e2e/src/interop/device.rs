//! The device plugin scenarios: generic-device-plugin on `kubelet.sock`, and
//! Kubernetes' sample device plugin through the registry.

use std::fs;
use std::path::Path;
use std::time::Instant;

use super::processes::{null_devices, spawn_command, start_kpm, start_kpm_with, wait_for_list};
use super::{Env, STEP_TIMEOUT, STOP_TIMEOUT};
use crate::command::Result;
use crate::scenario::{find, wait_until};

pub(super) fn generic_device_plugin(env: &Env, root: &Path) -> Result {
    let kpm = start_kpm(env, root, "generic-device-plugin")?;
    let mut plugin = null_devices(env, "generic-device-plugin", root)?;
    let null = |list: &serde_json::Value| {
        find(&list["device_resources"], "resource", "squat.ai/null").cloned()
    };
    wait_for_list(&kpm, "squat.ai/null with 3 healthy devices", |list| {
        Ok(null(list).filter(|r| r["healthy"] == 3 && r["unhealthy"] == 0))
    })?;
    eprintln!("squat.ai/null: 3 healthy devices");
    plugin.stop(STOP_TIMEOUT)?;
    let exited = Instant::now();
    wait_for_list(&kpm, "squat.ai/null unhealthy after the plugin exited", |list| {
        Ok(null(list).filter(|r| r["healthy"] == 0 && r["unhealthy"] == 3))
    })?;
    eprintln!("squat.ai/null: 3 unhealthy devices {:?} after the plugin exited", exited.elapsed());
    kpm.stop()
}

/// `test/images/sample-device-plugin` of Kubernetes: its stub serves
/// `Registration` and `DevicePlugin` on one socket, so kpm's liveness probes
/// go over the `ListAndWatch` connection; the stub logs each `GetInfo`.
pub(super) fn sample_device_plugin(env: &Env, root: &Path) -> Result {
    const RESOURCE: &str = "example.com/resource";
    let kpm = start_kpm_with(env, root, "sample-device-plugin", &["--liveness-period", "1"])?;
    // While this file exists, the plugin does not `Register` on the
    // kubelet's own `kubelet.sock` (/var/lib/kubelet/device-plugins).
    let control = root.join("register-control");
    fs::write(&control, "")?;
    let mut plugin = spawn_command(
        env,
        "sample-device-plugin",
        "sample-device-plugin",
        std::process::Command::new(env.bin_dir.join("sample-device-plugin"))
            .env("PLUGIN_SOCK_DIR", root.join("plugins_registry"))
            .env("REGISTER_CONTROL_FILE", &control),
    )?;

    let pid = wait_for_list(&kpm, "the plugin registered with 2 healthy devices", |list| {
        let plugin = find(&list["plugins"], "name", RESOURCE);
        let devices = find(&list["device_resources"], "resource", RESOURCE);
        let healthy = devices.is_some_and(|r| r["healthy"] == 2 && r["unhealthy"] == 0);
        Ok(plugin
            .filter(|p| p["state"] == "registered" && healthy)
            .map(|p| p["server_pid"].clone()))
    })?;
    if pid != plugin.child.id() {
        return Err(format!("server_pid is {pid}, the plugin is {}", plugin.child.id()).into());
    }
    let get_infos = || -> Result<usize> {
        Ok(plugin.error_lines()?.iter().filter(|line| line.contains("\"GetInfo\"")).count())
    };
    // One `GetInfo` for the registration, then one probe a second: three
    // PINGs, then `GetInfo`.
    wait_until("3 GetInfo probes answered", STEP_TIMEOUT, || Ok(get_infos()? >= 4))?;
    let list = kpm.list()?;
    let registered = find(&list["plugins"], "name", RESOURCE);
    if !registered.is_some_and(|p| p["state"] == "registered" && p["server_pid"] == pid) {
        return Err(format!("not registered as before after the probes: {registered:?}").into());
    }
    eprintln!("{RESOURCE}: registered (server_pid {pid}), {} GetInfo calls answered", get_infos()?);

    plugin.kill();
    let killed = Instant::now();
    wait_for_list(&kpm, "the killed plugin deregistered, its devices unhealthy", |list| {
        let plugin = find(&list["plugins"], "name", RESOURCE);
        let devices = find(&list["device_resources"], "resource", RESOURCE);
        let gone = plugin.is_none_or(|p| p["state"] != "registered")
            && devices.is_some_and(|r| r["healthy"] == 0);
        Ok(gone.then_some(()))
    })?;
    eprintln!("{RESOURCE}: deregistered {:?} after SIGKILL", killed.elapsed());
    kpm.stop()
}
