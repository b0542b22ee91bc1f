//! The DRA scenarios: a killed driver's ResourceSlices removed after the
//! grace period, others kept (`dra`), and Kubernetes' own DRA test driver
//! (`dra-test-driver`).

use std::collections::BTreeSet;
use std::fs;
use std::time::{Duration, Instant};

use super::{Cluster, plugin};
use crate::command::Result;
use crate::kube_e2e::api::{create_slice, slices, slices_of};
use crate::kube_e2e::{ADMIN_TOKEN, DRA_GRACE_SECS, DRA_STAY_CHECK, Env, STEP_TIMEOUT};
use crate::scenario::{Process, find, wait_for, wait_until};

pub(super) fn dra(env: &Env, cluster: &mut Cluster) -> Result {
    let kpm = cluster.start_kpm(env, "dra")?;
    let api = &cluster.api;
    let mut a = plugin(&kpm, env, "dra-a", &["--type", "DRAPlugin", "--name", "a.example.com"])?;
    let b = plugin(&kpm, env, "dra-b", &["--type", "DRAPlugin", "--name", "b.example.com"])?;
    for plugin in [&a, &b] {
        plugin.wait_for_line("registered", STEP_TIMEOUT, |line| line == "registered: true")?;
    }
    // Created once both drivers are registered, as their own controllers
    // would, so that however kpm treats slices at its start they count here.
    create_slice(api, "node1-a-0", "a.example.com", "node1", 2)?;
    create_slice(api, "node1-a-1", "a.example.com", "node1", 2)?;
    create_slice(api, "node1-b-0", "b.example.com", "node1", 1)?;
    create_slice(api, "node2-a-0", "a.example.com", "node2", 1)?;
    eprintln!("a.example.com and b.example.com registered, 4 ResourceSlices created");

    a.kill();
    let killed = Instant::now();
    let stay: BTreeSet<String> = ["node1-b-0", "node2-a-0"].map(str::to_owned).into();
    wait_until("the node1 slices of a.example.com deleted", STEP_TIMEOUT + DRA_STAY_CHECK, || {
        Ok(slices(api)? == stay)
    })?;
    let gone = killed.elapsed();
    if gone < Duration::from_secs(DRA_GRACE_SECS) {
        return Err(format!(
            "a.example.com's slices went {gone:?} after the kill, within the grace period"
        )
        .into());
    }
    eprintln!("a.example.com killed: its node1 slices deleted after {gone:?}");
    // Nothing to wait for: the check is that nothing else happens.
    std::thread::sleep(DRA_STAY_CHECK);
    let left = slices(api)?;
    if left != stay {
        return Err(format!("{DRA_STAY_CHECK:?} later, slices {left:?}, expected {stay:?}").into());
    }
    eprintln!("{DRA_STAY_CHECK:?} later: {left:?} stay");
    drop(b);
    kpm.stop()
}

/// Kubernetes' own e2e DRA test driver (`dra-test-driver kubelet-plugin`,
/// `test/e2e/dra/test-driver`) against `kpm run --kubeconfig`: it
/// registers, publishes its ResourceSlices itself (as cluster admin: kpm's
/// token may not create slices), streams device health, and once it is
/// killed kpm deletes its slices of the node after the grace period.
pub(super) fn dra_test_driver(env: &Env, cluster: &mut Cluster) -> Result {
    const DRIVER: &str = "test-driver.cdi.k8s.io";
    let bin = env.dra_test_driver.as_ref().ok_or("no --dra-test-driver")?;
    let kpm = cluster.start_kpm(env, "dra-test-driver")?;
    let admin = cluster.kubeconfig("admin-kubeconfig", ADMIN_TOKEN)?.display().to_string();
    let registry = kpm.root.join("plugins_registry").display().to_string();
    // The helper binds its socket in <datadir>/<driver>, which the kubelet's
    // pod spec mounts: it must exist.
    fs::create_dir_all(kpm.root.join("plugins").join(DRIVER))?;
    let datadir = kpm.root.join("plugins").display().to_string();
    let cdi = cluster.dir.path().join("cdi").display().to_string();
    let log = |suffix: &str| env.out.join(format!("dra-test-driver-driver.{suffix}"));
    let args = [
        "--kubeconfig",
        &admin,
        "--drivername",
        DRIVER,
        "kubelet-plugin",
        "--node-name",
        "node1",
        "--plugin-registration-path",
        &registry,
        "--datadir",
        &datadir,
        "--cdi-dir",
        &cdi,
        "--num-devices",
        "2",
    ];
    let mut driver = Process::spawn("dra-test-driver", bin, &args, &log("out"), &log("err"))?;
    let api = &cluster.api;
    let listed = wait_for("kpm lists the driver connected", STEP_TIMEOUT, || {
        let list = kpm.list()?;
        let driver = find(&list["dra_drivers"], "name", DRIVER).cloned();
        Ok(driver.filter(|d| d["instances"][0]["connected"] == true))
    })?;
    let published = wait_for("the driver's slices of node1", STEP_TIMEOUT, || {
        let ours: BTreeSet<String> = slices_of(api, DRIVER, "node1")?;
        Ok((!ours.is_empty()).then_some(ours))
    })?;
    eprintln!("registered ({}); it published {published:?}", listed["instances"][0]["version"]);

    driver.kill();
    let killed = Instant::now();
    wait_until("kpm deletes the driver's slices of node1", STEP_TIMEOUT + DRA_STAY_CHECK, || {
        Ok(slices_of(api, DRIVER, "node1")?.is_empty())
    })?;
    let gone = killed.elapsed();
    if gone < Duration::from_secs(DRA_GRACE_SECS) {
        return Err(format!("its slices went {gone:?} after the kill, within the grace").into());
    }
    eprintln!("killed: its slices deleted by kpm {gone:?} later (grace {DRA_GRACE_SECS}s)");
    kpm.stop()
}
