//! The kubelet's own plugin manager registering kpm-registrar's plugins.

use std::fs;
use std::path::Path;

use super::processes::{peer, spawn};
use super::{Env, STEP_TIMEOUT, STOP_TIMEOUT};
use crate::command::Result;

pub(super) fn kubelet_plugin_manager(env: &Env, root: &Path) -> Result {
    let registry = root.join("plugins_registry");
    fs::create_dir_all(&registry)?;
    let manager = peer(
        env,
        "kubelet-plugin-manager",
        "kubelet-pluginmanager",
        &["--registry-dir", &registry.display().to_string()],
    )?;
    manager.wait_for_line("the plugin manager started", STEP_TIMEOUT, |line| line == "started")?;
    let plugins = [
        ("CSIPlugin", "csi.example.com"),
        ("DevicePlugin", "vendor.com/gpu"),
        ("DRAPlugin", "dra.example.com"),
    ];
    let mut running = Vec::new();
    for (plugin_type, name) in plugins {
        let plugin = spawn(
            env,
            "kubelet-plugin-manager",
            &format!("example_plugin-{plugin_type}"),
            &env.example_plugin,
            &["--dir", &registry.display().to_string(), "--type", plugin_type, "--name", name],
        )?;
        plugin.wait_for_line("the plugin told registered", STEP_TIMEOUT, |line| {
            line == "registered: true"
        })?;
        let registered = format!("register {plugin_type} {name} ");
        manager.wait_for_line("the kubelet registered it", STEP_TIMEOUT, |line| {
            line.starts_with(&registered)
        })?;
        eprintln!(
            "{plugin_type} {name}: registered by the kubelet's plugin manager, told registered: true"
        );
        running.push((plugin_type, name, plugin));
    }
    for (plugin_type, name, mut plugin) in running {
        plugin.stop(STOP_TIMEOUT)?;
        let deregistered = format!("deregister {plugin_type} {name} ");
        manager.wait_for_line("the kubelet deregistered it", STEP_TIMEOUT, |line| {
            line.starts_with(&deregistered)
        })?;
        eprintln!("{plugin_type} {name}: deregistered once it stopped");
    }
    Ok(())
}
