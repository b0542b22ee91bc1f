//! The CSI scenarios: node-driver-registrar with hostpathplugin, its
//! driver's own endpoint, and a CSI driver on Python grpcio.

use std::fs;
use std::path::Path;
use std::time::Instant;

use super::processes::{hostpath, peer, start_kpm, start_kpm_with, wait_for_list};
use super::{Env, STEP_TIMEOUT, STOP_TIMEOUT};
use crate::command::Result;
use crate::scenario::{self, find, wait_for, wait_until};

pub(super) fn node_driver_registrar(env: &Env, root: &Path) -> Result {
    let metrics = kpm_test_support::free_local_addr();
    let args = ["--liveness-period", "1", "--metrics-addr", &metrics];
    let kpm = start_kpm_with(env, root, "node-driver-registrar", &args)?;
    let csi_dir = root.join("plugins/csi-hostpath");
    fs::create_dir_all(&csi_dir)?;
    let csi_sock = csi_dir.join("csi.sock");
    let driver = hostpath(
        env,
        "node-driver-registrar",
        root,
        "hostpath.csi.k8s.io",
        &csi_sock,
        &["--maxvolumespernode=10"],
    )?;
    wait_until("hostpathplugin serves its socket", STEP_TIMEOUT, || Ok(csi_sock.exists()))?;
    let mut registrar = peer(
        env,
        "node-driver-registrar",
        "node-driver-registrar",
        &[
            &format!("--csi-address={}", csi_sock.display()),
            &format!("--kubelet-registration-path={}", csi_sock.display()),
            &format!("--plugin-registration-path={}", root.join("plugins_registry").display()),
        ],
    )?;

    let registered = wait_for_list(&kpm, "the driver registered with its node info", |list| {
        let plugin = find(&list["plugins"], "name", "hostpath.csi.k8s.io");
        let driver = find(&list["csi_drivers"], "name", "hostpath.csi.k8s.io");
        let ready = plugin.is_some_and(|p| p["state"] == "registered")
            && driver.is_some_and(|d| {
                d["node_id"] == "node-1"
                    && d["max_volumes"] == 10
                    && d["topology"].as_object().is_some_and(|t| !t.is_empty())
            });
        Ok(ready.then(|| driver.cloned()).flatten())
    })?;
    let topology = registered["topology"].as_object().cloned().unwrap_or_default();
    let list = kpm.list()?;
    for key in topology.keys() {
        if list["node"]["labels"].get(key).is_none() {
            return Err(format!("topology key {key} is not among the node labels").into());
        }
    }
    let csinode = find(&list["node"]["csinode"]["drivers"], "name", "hostpath.csi.k8s.io")
        .ok_or("no CSINode entry")?
        .clone();
    eprintln!(
        "registered: node id node-1, topology {topology:?}, max volumes 10, CSINode {csinode}"
    );
    probed_by_pings(&metrics, 2)?;

    registrar.stop(STOP_TIMEOUT)?;
    wait_for_list(&kpm, "the driver deregistered once the registrar exited", |list| {
        let gone = find(&list["plugins"], "name", "hostpath.csi.k8s.io").is_none()
            && find(&list["csi_drivers"], "name", "hostpath.csi.k8s.io").is_none();
        Ok(gone.then_some(()))
    })?;
    eprintln!("deregistered");
    drop(driver);
    kpm.stop()
}

/// Liveness against real gRPC servers (grpc-go's node-driver-registrar and
/// hostpathplugin, C-core's grpcio): a dozen probes a second apart, each a
/// PING to every socket but every fourth, a call (`GetInfo`,
/// `Identity/Probe`). None fails, and the `connections` dialled for them
/// are the only ones: both grpc-go and C-core close a connection at the
/// fourth PING between two responses (`too_many_pings`), which would show
/// as more dials.
fn probed_by_pings(metrics: &str, connections: u32) -> Result {
    // One scrape for all the figures, so that they agree with each other.
    let scraped = wait_for("12 liveness probes", STEP_TIMEOUT, || {
        let scraped = scenario::metrics(metrics)?;
        let probes = scraped.get("kpm_liveness_probes_total").copied().unwrap_or_default();
        Ok((probes >= 12).then_some(scraped))
    })?;
    let [probes, pings, calls, failures, dials] = [
        "kpm_liveness_probes_total",
        "kpm_liveness_pings_total",
        "kpm_liveness_probe_calls_total",
        "kpm_liveness_probe_failures_total",
        "kpm_liveness_probe_dials_total",
    ]
    .map(|name| scraped.get(name).copied().unwrap_or_default());
    if failures > 0 || dials != u64::from(connections) || calls * 2 > pings {
        return Err(format!(
            "{probes} probes: {pings} PINGs, {calls} calls, {failures} failures, {dials} dials \
             (expected no failure, {connections} dials, a call to 3 PINGs)"
        )
        .into());
    }
    eprintln!(
        "probed {probes} times: {pings} PINGs, {calls} calls, no failure, {dials} connections"
    );
    Ok(())
}

/// A CSI driver on Python grpcio, gRPC C-core's server (its ping policy:
/// two strikes, a PING sooner than 5 min after the last one a strike, a
/// response clears them), serving registration, CSI Identity and Node on
/// one socket: registered with its node info, probed a dozen times over
/// one connection with no failure, deregistered when it stops.
pub(super) fn grpcio_driver(env: &Env, root: &Path) -> Result {
    const SCENARIO: &str = "grpcio-driver";
    const DRIVER: &str = "grpcio.example.com";
    let metrics = kpm_test_support::free_local_addr();
    let args = ["--liveness-period", "1", "--metrics-addr", &metrics];
    let kpm = start_kpm_with(env, root, SCENARIO, &args)?;
    let registry = root.join("plugins_registry").display().to_string();
    let mut driver =
        peer(env, SCENARIO, "grpcio-csi-driver", &["--registry", &registry, "--name", DRIVER])?;
    driver.wait_for_line("it was told registered", STEP_TIMEOUT, |line| {
        line == format!("notified {DRIVER} true")
    })?;
    let registered = wait_for_list(&kpm, "its node info", |list| {
        let driver = find(&list["csi_drivers"], "name", DRIVER);
        Ok(driver.filter(|d| d["node_id"] == "node-1" && d["max_volumes"] == 3).cloned())
    })?;
    eprintln!("registered: {registered}");
    probed_by_pings(&metrics, 1)?;
    driver.stop(STOP_TIMEOUT)?;
    wait_for_list(&kpm, "the driver deregistered once it stopped", |list| {
        Ok(find(&list["plugins"], "name", DRIVER).is_none().then_some(()))
    })?;
    eprintln!("deregistered");
    kpm.stop()
}

/// kubernetes #132660 under the real pair: hostpathplugin's `csi.sock` is
/// removed while it and node-driver-registrar keep running. kpm
/// deregisters the driver at once and holds it, never telling
/// node-driver-registrar `false` (it exits on that). hostpathplugin,
/// restarted, binds `csi.sock` again, and the driver is registered again
/// through the same node-driver-registrar process.
pub(super) fn csi_endpoint(env: &Env, root: &Path) -> Result {
    const SCENARIO: &str = "csi-endpoint";
    let kpm = start_kpm(env, root, SCENARIO)?;
    let csi_dir = root.join("plugins/csi-hostpath");
    fs::create_dir_all(&csi_dir)?;
    let csi_sock = csi_dir.join("csi.sock");
    let name = "hostpath.csi.k8s.io";
    let mut driver = hostpath(env, SCENARIO, root, name, &csi_sock, &[])?;
    wait_until("hostpathplugin serves its socket", STEP_TIMEOUT, || Ok(csi_sock.exists()))?;
    let mut registrar = peer(
        env,
        SCENARIO,
        "node-driver-registrar",
        &[
            &format!("--csi-address={}", csi_sock.display()),
            &format!("--kubelet-registration-path={}", csi_sock.display()),
            &format!("--plugin-registration-path={}", root.join("plugins_registry").display()),
        ],
    )?;
    let listed = |list: &serde_json::Value| find(&list["csi_drivers"], "name", name).is_some();
    wait_for_list(&kpm, "the driver registered", |list| Ok(listed(list).then_some(())))?;

    fs::remove_file(&csi_sock)?;
    let removed = Instant::now();
    let reason = wait_for_list(&kpm, "the driver deregistered and held", |list| {
        let held = list["plugins"].as_array().into_iter().flatten().find(|p| p["state"] == "held");
        Ok(held.filter(|_| !listed(list)).map(|p| p["last_error"].to_string()))
    })?;
    eprintln!(
        "csi.sock removed: deregistered and held after {} ms ({reason})",
        removed.elapsed().as_millis()
    );

    driver.stop(STOP_TIMEOUT)?;
    let _driver = hostpath(env, SCENARIO, root, name, &csi_sock, &[])?;
    let restarted = Instant::now();
    wait_for_list(&kpm, "the driver registered again", |list| Ok(listed(list).then_some(())))?;
    eprintln!(
        "hostpathplugin restarted: registered again {} ms after it started",
        restarted.elapsed().as_millis()
    );
    if let Some(status) = registrar.child.try_wait()? {
        return Err(format!("node-driver-registrar exited meanwhile: {status}").into());
    }
    let told = registrar.error_lines()?;
    let told: Vec<&String> =
        told.iter().filter(|line| line.contains("Received NotifyRegistrationStatus")).collect();
    if told.len() != 2 || !told.iter().all(|line| line.contains("plugin_registered:true")) {
        return Err(format!("node-driver-registrar was told: {told:#?}").into());
    }
    eprintln!("node-driver-registrar, still the same process, was told registered twice");
    registrar.stop(STOP_TIMEOUT)?;
    kpm.stop()
}
