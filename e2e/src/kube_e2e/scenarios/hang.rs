//! The `hang` scenario: a CSI driver that stops answering while its process
//! lives (SIGSTOP), beside `kpm doctor --watch` as shipped (its looks every
//! 30 s, its period 5 min), on the real kube-apiserver: the Node's condition
//! is `False` within 60 s, and `True` again once the driver goes on
//! (SIGCONT). The times are printed.

use std::fs;
use std::time::{Duration, Instant};

use super::Cluster;
use super::fleet::{condition, start_doctor, start_kubelet};
use crate::command::Result;
use crate::kube_e2e::{DOCTOR_TOKEN, Env, KPM_TOKEN, STEP_TIMEOUT};
use crate::scenario::{Process, wait_until};

/// How soon a hung plugin must be named.
const NAMED_WITHIN: Duration = Duration::from_secs(60);
const NODE: &str = "hang-1";
const DRIVER: &str = "hung.example.com";

pub(super) fn hang(env: &Env, cluster: &mut Cluster) -> Result {
    let kpm_config = cluster.kubeconfig("kubeconfig", KPM_TOKEN)?;
    let doctor_config = cluster.kubeconfig("doctor-kubeconfig", DOCTOR_TOKEN)?;
    cluster.create_node(NODE)?;
    let root = cluster.dir.path().join(NODE);
    fs::create_dir_all(root.join("plugins_registry"))?;
    let _kubelet = start_kubelet(env, &root, NODE, &kpm_config)?;
    let heartbeat = Duration::from_secs(30 * 60);
    let _doctor = start_doctor(env, cluster, &root, NODE, &doctor_config, heartbeat, &[])?;
    let registry = root.join("plugins_registry").display().to_string();
    let args = ["--dir", &registry, "--type", "CSIPlugin", "--name", DRIVER, "--node-id", NODE];
    let log = |suffix: &str| env.out.join(format!("hang-{DRIVER}.{suffix}"));
    let driver = Process::spawn(DRIVER, &env.example_plugin, &args, &log("out"), &log("err"))?;
    driver.wait_for_line("its socket served", STEP_TIMEOUT, |line| line.starts_with("serving "))?;
    let api = &cluster.api;
    let healthy = || Ok(condition(api, NODE).is_ok_and(|c| c["status"] == "True"));
    wait_until(&format!("{NODE}'s condition True"), STEP_TIMEOUT, healthy)?;
    // The doctor's first look is due up to 30 s after its last pass.
    driver.signal("STOP")?;
    let stopped = Instant::now();
    wait_until(&format!("{NODE}'s hung driver named"), NAMED_WITHIN + STEP_TIMEOUT, || {
        Ok(condition(api, NODE).is_ok_and(|c| c["status"] == "False"))
    })?;
    let named = stopped.elapsed();
    let said = condition(api, NODE)?;
    eprintln!(
        "{DRIVER} stopped (SIGSTOP): {NODE} False after {named:?}, {}: {}",
        said["reason"], said["message"]
    );
    if named > NAMED_WITHIN {
        return Err(format!("the hung driver was named after {named:?}, not within 60 s").into());
    }
    driver.signal("CONT")?;
    let resumed = Instant::now();
    wait_until(&format!("{NODE} True once the driver goes on"), Duration::from_secs(90), healthy)?;
    eprintln!("{DRIVER} resumed (SIGCONT): {NODE} True after {:?}", resumed.elapsed());
    Ok(())
}
