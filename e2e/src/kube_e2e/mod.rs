//! `cargo xtask kube-e2e --apiserver BIN --etcd BIN [--manifest FILE] [--only
//! SCENARIO] [--release]`: `kpm run` against a real kube-apiserver and etcd on
//! loopback. `--release` builds kpm as shipped, for the timed scenarios
//! (`fleet-scale`); the checks use the debug build.
//! Without either program it says what it skipped and succeeds; a check that
//! fails names its step, and the logs of every process are in
//! `target/kube-e2e`.
//!
//! Each scenario gets a cluster of its own in `/tmp/kpm-kube-XXXX`: etcd,
//! kube-apiserver with certificates made here (CA, serving certificate for
//! 127.0.0.1 and localhost, service-account key), a static token file with an
//! admin (`system:masters`) and kpm's service account, and RBAC authorization.
//! The `ServiceAccount`, `ClusterRole` and `ClusterRoleBinding` of the manifest
//! (`deploy/run/daemonset.yaml`) and of the doctor's, and the doctor's
//! `KubeletPluginReport` CRD (`deploy/doctor/crd.yaml`), are applied; Nodes `node1` and `node2` are
//! created. `kpm run --node-name node1` talks to the API server as its
//! service account through a kubeconfig, so its RBAC is checked too. Every
//! check reads the API server (as admin), never kpm, except the request
//! count that kpm reports.
//!
//! | scenario | checked through the API server |
//! |---|---|
//! | `cluster` | without kpm: kpm's token may do what kpm needs and nothing else; kube-apiserver restarts on the same etcd with every object kept |
//! | `csi` | a CSI driver's registration fills CSINode `node1` (owned by the Node), the Node's node-id annotation and topology label; its exit empties both but leaves the label |
//! | `csi-allocatable` | a CSIDriver with `nodeAllocatableUpdatePeriodSeconds: 10`: the CSINode entry's count follows the driver's changed volume limit within one period, in one update (KEP-4876; kpm may not patch CSINodes) |
//! | `device-plugin` | a device plugin's 3 devices become capacity and allocatable of Node `node1`; one unhealthy device lowers allocatable only; prints kpm's request count |
//! | `device-leftovers` | after a restart, an earlier run's device capacity stays without a flap while its plugin is there, and goes after the device grace once it is not |
//! | `dra` | a DRA driver killed without deregistering loses its ResourceSlices on `node1` once the grace period passes; other drivers' and other nodes' stay |
//! | `dra-test-driver` | Kubernetes' e2e DRA test driver (`--dra-test-driver`) registers and publishes its ResourceSlices; once it is killed kpm deletes them after the grace period |
//! | `apiserver-down` | plugins register locally while the API server is down (CSI reports the failed Node update), and everything converges once it is back |
//! | `outage` | issue 43: the API server killed for 20 s while a CSI driver leaves and one registers (rejected, retried), a device plugin stops and one registers, a DRA driver's slice wipe falls due; within 10 s of `/readyz` CSINode, the node-id annotation, labels, capacity, allocatable and slices are what the kubelet's rules say, the stopped plugin's capacity kept (none allocatable) for its grace and removed after; then an idle minute with no write by kpm (the audit log); prints the times and counts |
//! | `doctor` | `kpm doctor --kubeconfig` with kpm's token: a registered CSI driver ok, a driver missing from CSINode `not-registered`, the entry of one that went stale |
//! | `fleet-scale` | `kpm doctor --cluster` over 2000 then 20,000 real-sized Nodes (over 15 KB) with ten-entry `KubeletPluginReports`, their CSINodes and four ResourceSlices each: its time, CPU, peak RSS, bytes and requests beside kubectl's reads and the cross-check, printed; every node judged, every failing node named, the bytes within the reports plus the Nodes' table, and a report that lies named by the cross-check only (`scenarios/fleet_scale.rs`) |
//! | `fleet` | `kpm doctor --watch` on 20 nodes (`scenarios/fleet.rs`): failures and recoveries published within 5 s, in the condition and the typed report (owned by the Node), an idle minute of heartbeats only (the audit log), the kubelet's Ready kept beside the doctor's condition, publishing resumed after an API server restart, `kpm doctor --cluster` read from the reports' table and cross-checked against every node's objects, `kubectl get kubeletpluginreports` as the API server prints it |
//! | `hang` | a CSI driver stopped with SIGSTOP beside `kpm doctor --watch` as shipped: the Node's condition False within 60 s (its looks, not its 5 min period), True again after SIGCONT; the times printed (`scenarios/hang.rs`) |
//! | `flapping` | a driver present 4 s and gone 1 s for 2 min beside a doctor without and with flap damping, and one present 1 s and gone 1 s: each doctor's writes (audit log) printed, the damped one's a handful; the fast one shown `Flapping` within the window; healthy again a hold after, with its Events (`scenarios/flapping.rs`) |
//!
//! The runner (this file: options, the programs, each scenario on a cluster
//! of its own) sits on `cluster` (etcd and kube-apiserver, started and
//! stopped), `pki` (their certificates), `api` (a blocking client and the
//! objects the checks read) and `scenarios` (one file per subject, the
//! table of names).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::command::{Misused, Result};
use crate::scenario::{self, Profile};

pub(crate) mod api;
mod cluster;
pub(crate) mod pki;
mod scenarios;

use cluster::Cluster;
use scenarios::{SCENARIOS, Scenario};

/// How long any one step may take: kpm writes to the API server within
/// milliseconds, but a 2-core machine shared with builds is slow at times.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long etcd and kube-apiserver may take to become ready (about 2.5 s
/// on an idle machine).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a process may take to exit on SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// After the API server is back: kpm's retries back off, up to its cap.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(90);
/// `kpm run --dra-cleanup-grace`, in seconds: how long a DRA driver that
/// stopped keeps its ResourceSlices.
const DRA_GRACE_SECS: u64 = 3;
/// `kpm run --device-cleanup-grace`, in seconds.
const DEVICE_GRACE_SECS: u64 = 10;
/// How long the slices that must stay are watched after the others went.
const DRA_STAY_CHECK: Duration = Duration::from_secs(DRA_GRACE_SECS + 2);

/// The tokens of the static token file; loopback-only, gone with the run.
const ADMIN_TOKEN: &str = "kpm-e2e-admin-token";
const KPM_TOKEN: &str = "kpm-e2e-kpm-token";
const KPM_USER: &str = "system:serviceaccount:kube-system:kpm";
const DOCTOR_TOKEN: &str = "kpm-e2e-doctor-token";
const DOCTOR_USER: &str = "system:serviceaccount:kube-system:kpm-doctor";
/// An operator who runs `kpm doctor --cluster`, bound to the fleet
/// reader's `ClusterRole` alone (`scenarios/fleet_daemon_set.rs`).
const READER_TOKEN: &str = "kpm-e2e-reader-token";
const READER_USER: &str = "kpm-e2e-fleet-reader";
const KPM_GROUPS: &str =
    "system:serviceaccounts,system:serviceaccounts:kube-system,system:authenticated";

/// The Node annotation of CSI node ids, by driver.
const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// The programs, the manifest and where the logs go.
struct Env {
    kpm: PathBuf,
    example_plugin: PathBuf,
    apiserver: PathBuf,
    etcd: PathBuf,
    /// Kubernetes' e2e DRA test driver, if given.
    dra_test_driver: Option<PathBuf>,
    manifest: PathBuf,
    /// `deploy/doctor/daemonset.yaml`, whose RBAC the doctors run with.
    doctor_manifest: PathBuf,
    /// `deploy/doctor/crd.yaml`, the doctors' `KubeletPluginReport`.
    doctor_crd: PathBuf,
    out: PathBuf,
}

/// The usage `--help` prints: the synopsis `cargo xtask kube-e2e …`, then what
/// its words stand for.
pub fn usage() -> String {
    let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    format!(
        "cargo xtask kube-e2e --apiserver BIN --etcd BIN [--dra-test-driver BIN] [--manifest FILE] \
         [--only SCENARIO] [--release]\n  SCENARIO: {}",
        names.join(", ")
    )
}

/// Runs `cargo xtask kube-e2e` in the workspace at `root` with `options`, the
/// words after its name; wrong ones are a [`Misused`].
pub fn run(root: &Path, options: &[&str]) -> Result {
    let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    let (mut apiserver, mut etcd, mut manifest, mut only) = (None, None, None, None);
    let (mut dra_test_driver, mut profile) = (None, Profile::Debug);
    let mut options = options.iter().copied();
    while let Some(option) = options.next() {
        if option == "--release" {
            profile = Profile::Release;
            continue;
        }
        match (option, options.next()) {
            ("--apiserver", Some(bin)) => apiserver = Some(std::path::absolute(bin)?),
            ("--etcd", Some(bin)) => etcd = Some(std::path::absolute(bin)?),
            ("--dra-test-driver", Some(bin)) => dra_test_driver = Some(std::path::absolute(bin)?),
            ("--manifest", Some(file)) => manifest = Some(std::path::absolute(file)?),
            ("--only", Some(name)) if names.contains(&name) => only = Some(name),
            (option, value) => return Err(Misused::refused(option, value).into()),
        }
    }
    let apiserver = apiserver.ok_or_else(|| Misused::missing("--apiserver BIN"))?;
    let etcd = etcd.ok_or_else(|| Misused::missing("--etcd BIN"))?;
    let selected: Vec<&Scenario> =
        SCENARIOS.iter().filter(|s| only.is_none_or(|only| only == s.name)).collect();
    let missing: Vec<String> = [&apiserver, &etcd]
        .iter()
        .filter(|bin| !bin.is_file())
        .map(|bin| bin.display().to_string())
        .collect();
    if !missing.is_empty() {
        println!("\nkube-e2e: {} missing", missing.join(", "));
        for scenario in &selected {
            println!("  {:<16} skipped", scenario.name);
        }
        return Ok(());
    }

    if selected.iter().any(|s| s.needs_kpm) {
        scenario::build(root, profile)?;
    }
    let binaries = scenario::Binaries::locate(root, "kube-e2e", profile)?;
    let env = Env {
        kpm: binaries.kpm,
        example_plugin: binaries.example_plugin,
        apiserver,
        etcd,
        dra_test_driver,
        manifest: manifest.unwrap_or_else(|| root.join("deploy/run/daemonset.yaml")),
        doctor_manifest: root.join("deploy/doctor/daemonset.yaml"),
        doctor_crd: root.join("deploy/doctor/crd.yaml"),
        out: binaries.out,
    };

    let mut outcomes = Vec::new();
    for scenario in selected {
        if scenario.name == "dra-test-driver"
            && !env.dra_test_driver.as_ref().is_some_and(|bin| bin.is_file())
        {
            outcomes.push((scenario.name, "skipped (no --dra-test-driver)".to_owned()));
            continue;
        }
        eprintln!("\n== {}", scenario.name);
        let outcome = match Cluster::start(&env, scenario.name)
            .and_then(|mut cluster| (scenario.run)(&env, &mut cluster))
        {
            Ok(()) => "passed".to_owned(),
            Err(err) => format!("FAILED: {err}"),
        };
        outcomes.push((scenario.name, outcome));
    }

    crate::harness::report_outcomes("kube-e2e", &env.apiserver, &outcomes, &env.out)
}
