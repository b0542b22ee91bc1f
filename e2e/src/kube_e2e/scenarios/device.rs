//! The device plugin scenarios: devices as the Node's capacity and
//! allocatable (`device-plugin`), and what an earlier run published, kept
//! or removed after a restart (`device-leftovers`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Cluster, plugin, requests};
use crate::command::Result;
use crate::kube_e2e::{DEVICE_GRACE_SECS, DRA_STAY_CHECK, Env, STEP_TIMEOUT};
use crate::scenario::wait_until;

pub(super) fn device_plugin(env: &Env, cluster: &mut Cluster) -> Result {
    let kpm = cluster.start_kpm(env, "device-plugin")?;
    let before = requests(&kpm)?;
    let plugin = plugin(
        &kpm,
        env,
        "device-plugin",
        &["--type", "DevicePlugin", "--name", "example.com/gpu", "--devices", "3"],
    )?;
    let api = &cluster.api;
    let gpus = |node: &Value| {
        (
            node["status"]["capacity"]["example.com/gpu"].clone(),
            node["status"]["allocatable"]["example.com/gpu"].clone(),
        )
    };
    wait_until("Node node1 with 3 example.com/gpu, all allocatable", STEP_TIMEOUT, || {
        Ok(gpus(&api.get("/api/v1/nodes/node1")?) == (json!("3"), json!("3")))
    })?;
    eprintln!("example.com/gpu: capacity 3, allocatable 3");
    plugin.signal("USR1")?;
    plugin.wait_for_line("a device turned unhealthy", STEP_TIMEOUT, |line| {
        line.starts_with("unhealthy: ")
    })?;
    wait_until("allocatable 2 of capacity 3", STEP_TIMEOUT, || {
        Ok(gpus(&api.get("/api/v1/nodes/node1")?) == (json!("3"), json!("2")))
    })?;
    eprintln!("example.com/gpu: one unhealthy device, capacity 3, allocatable 2");
    let after = requests(&kpm)?;
    println!(
        "device-plugin: kpm made {} API request(s) ({before} before the plugin, {after} after)",
        after - before
    );
    drop(plugin);
    kpm.stop()
}

/// What an earlier run published, after kpm restarts: the device resource
/// of a plugin that is still there goes on with no flap (never zero, never
/// missing); one whose plugin is gone stays until the device grace, then
/// goes.
pub(super) fn device_leftovers(env: &Env, cluster: &mut Cluster) -> Result {
    let api = &cluster.api;
    let gpus = || -> Result<Value> {
        Ok(api.get("/api/v1/nodes/node1")?["status"]["capacity"]["example.com/gpu"].clone())
    };
    let kpm = cluster.start_kpm(env, "device-leftovers-1")?;
    let args = ["--type", "DevicePlugin", "--name", "example.com/gpu", "--devices", "2"];
    let plugin = plugin(&kpm, env, "device-leftovers", &args)?;
    wait_until("Node node1 with 2 example.com/gpu", STEP_TIMEOUT, || Ok(gpus()? == json!("2")))?;
    kpm.stop()?;

    // The plugin stays: the restarted kpm registers it again.
    let kpm = cluster.start_kpm(env, "device-leftovers-2")?;
    let watched = Instant::now();
    let mut seen = BTreeSet::new();
    while watched.elapsed() < Duration::from_secs(DEVICE_GRACE_SECS + 2) {
        seen.insert(gpus()?.to_string());
        std::thread::sleep(Duration::from_millis(100));
    }
    if seen.len() != 1 || !seen.contains("\"2\"") {
        return Err(format!("with its plugin back, the capacity was {seen:?}").into());
    }
    eprintln!(
        "kpm restarted with the plugin: capacity always 2 over {}s (the grace and more)",
        DEVICE_GRACE_SECS + 2
    );
    kpm.stop()?;
    drop(plugin);

    // The plugin is gone: its capacity stays for the grace, then goes.
    let kpm = cluster.start_kpm(env, "device-leftovers-3")?;
    let started = Instant::now();
    wait_until("the leftover capacity removed", STEP_TIMEOUT + DRA_STAY_CHECK, || {
        if started.elapsed() < Duration::from_secs(DEVICE_GRACE_SECS - 1) && gpus()? != json!("2") {
            return Err("the leftover capacity changed within the grace".into());
        }
        Ok(gpus()?.is_null())
    })?;
    eprintln!(
        "kpm restarted without the plugin: capacity 2 kept, then removed {:?} after the start (grace {DEVICE_GRACE_SECS}s)",
        started.elapsed()
    );
    kpm.stop()
}
