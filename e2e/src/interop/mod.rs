//! `cargo xtask interop --bin-dir DIR [--only SCENARIO]`: `kpm run` and
//! `kpm-registrar` against real programs found in DIR, built from their
//! public sources (`docs/plugin-authors.md` says which and how). A scenario
//! whose program is missing is skipped and named as skipped; one that fails
//! says which step, and the logs of every process are in `target/interop`.
//!
//! | scenario | programs in DIR | kpm's part |
//! |---|---|---|
//! | `node-driver-registrar` | `node-driver-registrar`, `hostpathplugin` | `kpm run` registers the CSI driver with its node id, topology and max volumes, probes the registrar and the driver a dozen times (`--liveness-period 1`: PINGs, every fourth a call) with no failure and no connection closed for too many PINGs, and deregisters it when the registrar exits |
//! | `grpcio-driver` | `grpcio-csi-driver` | a CSI driver on Python grpcio (gRPC C-core), registration and CSI on one socket: `kpm run` registers it and probes it a dozen times (PINGs, every fourth a call) with no failure and its one connection never closed for too many PINGs |
//! | `generic-device-plugin` | `generic-device-plugin` | `kpm run`'s `kubelet.sock` takes its `Register`; `squat.ai/null` has 3 healthy devices, unhealthy once it exits |
//! | `sample-device-plugin` | `sample-device-plugin` | the Kubernetes e2e device plugin, its socket in the registry: `kpm run` registers it through the plugin watcher, probes it over its `ListAndWatch` connection (`--liveness-period 1`) and deregisters it at once when it is killed with SIGKILL, its socket left behind |
//! | `dra-rolling-update` | `dra-kubeletplugin` | two instances of a driver on `k8s.io/dynamic-resource-allocation/kubeletplugin` registered side by side; the newer exits, the older remains |
//! | `kubelet-plugin-manager` | `kubelet-pluginmanager` | the kubelet's own plugin manager registers `kpm-registrar` plugins of all three types and deregisters them when they stop |
//! | `doctor-device-manager` | `kubelet-devicemanager`, `generic-device-plugin` | `kpm doctor` beside the kubelet's own device manager: the plugin registered on its `kubelet.sock` is named `squat.ai/null` from the manager's checkpoint; a device plugin serving in `device-plugins/` that never registered is `not-registered` |
//! | `check-generic-device-plugin` | `generic-device-plugin` | `kpm check`: registration on `kubelet.sock`, `ListAndWatch`, `Allocate` alone, in pairs and on an unknown id, the stream kept open, both restarts and the devices after them, SIGTERM, a rolling update (its endpoint named after the second it started): 11 passed |
//! | `check-sample-device-plugin` | `sample-device-plugin` | `kpm check` on a registry socket named `dp.<time>` (a warning: the kubelet takes any name), a rolling update on `dp.<seconds>` sockets: 12 passed, 1 warned |
//! | `check-node-driver-registrar` | `node-driver-registrar`, `hostpathplugin` | `kpm check`: the node id on every call and across the driver's restart, topology keys, `GetPluginInfo`'s name, `NodeGetCapabilities`: 11 passed |
//! | `check-intel-gpu-plugin` | `intel_gpu_plugin`, `intel_gpu_fakedev` | `kpm check` on eight fake cards (as root, in a mount namespace): `GetPreferredAllocation` ignoring `must_include_deviceIDs` the socket left on SIGTERM and a second instance refused beside the first warn: 9 passed, 3 warned |
//! | `check-cert-manager-csi-driver` | `cert-manager-csi-driver`, `node-driver-registrar`, `kube-apiserver`, `etcd` | `kpm check --kubeconfig` on the script's cluster with the `CertificateRequest` CRD (as root, in a mount namespace, from `/` with a relative `--data-root`): the node id, `GetPluginInfo`, `NodeGetCapabilities` (`VOLUME_MOUNT_GROUP`): 11 passed |
//! | `check-hostdev-device-plugin` | `hostdev-device-plugin` | `kpm check` on 64 `/dev/null`s (as root, in a mount namespace): one response to two container requests, an unknown id allocated and a rolling update on one socket path warn: 8 passed, 3 warned |
//! | `check-nfsplugin` | `nfsplugin`, `node-driver-registrar` | `kpm check`: the node id, `GetPluginInfo`, `NodeGetCapabilities`: 11 passed |
//! | `check-image` | `generic-device-plugin` | `kpm check` from kpm's image (run by `ctr`, with the plugin mounted in) through the same script: 11 passed, as on the host; skipped without a containerd that `ctr` reaches (`CONTAINERD_ADDRESS`) |
//! | `check-dra-test-driver` | `dra-test-driver`, `kube-apiserver`, `etcd` | `kpm check --kubeconfig` with the script's API server: the driver's ResourceSlices, a claim allocated from them prepared (CDI ids resolving in valid specs), prepared again, unprepared, an unknown claim unprepared, a claim of another driver, a late prepare, on `v1` and `v1beta1`, a claim prepared again after a reboot; `DRAResourceHealth` open but reporting no device (a warning); its slices, wiped, published again or not as the helper's mutation cache forgot them or not: 23 passed, 1 warned (one more failed for each of the wipe and its SIGTERM race) |
//! | `check-dra-example-driver` | `dra-example-kubeletplugin`, `kube-apiserver`, `etcd` | the same on kubernetes-sigs' example GPU driver, whose re-prepare from its checkpoint writes no CDI spec (kubernetes#141433): 21 passed, 2 failed (likewise) |
//! | `check-dra-example-driver-shared` | `dra-example-kubeletplugin`, `kube-apiserver`, `etcd` | the same with its shareable GPUs (consumable capacity): each claim a share with its share id and `consumedCapacity`, and two claims sharing one GPU kept apart: 23 passed, 2 failed (likewise) |
//!
//! The runner (this file: options, the table of scenarios, a temporary root
//! for each) sits on `processes` (starting the programs with their logs,
//! `kpm run`, waiting on `kpm list`); the scenarios are one file per
//! subject: `csi`, `device`, `dra`, `kubelet` (its plugin manager),
//! `doctor` (beside the kubelet's managers) and `check` (`kpm check` on
//! each real plugin through the CI job's script, `ci/kpm-check.sh`, with
//! etcd and kube-apiserver from DIR where the plugin reads the API server;
//! its report ending with the tally `docs/plugin-authors.md` gives).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::command::{Misused, Result};
use crate::scenario::{self, Profile};

mod check;
mod csi;
mod device;
mod doctor;
mod dra;
mod kubelet;
mod processes;

/// How long any one step may take: registrations take milliseconds, but the
/// Go programs retry on their own schedules (generic-device-plugin every 5 s).
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// generic-device-plugin's `squat.ai/null`: 3 devices, all `/dev/null`.
const NULL_DEVICES: &str =
    r#"{"name": "null", "groups": [{"paths": [{"path": "/dev/null"}], "count": 3}]}"#;
/// How long a program may take to exit on SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

struct Scenario {
    name: &'static str,
    programs: &'static [&'static str],
    run: fn(&Env, &Path) -> Result,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "node-driver-registrar",
        programs: &["node-driver-registrar", "hostpathplugin"],
        run: csi::node_driver_registrar,
    },
    Scenario {
        name: "csi-endpoint",
        programs: &["node-driver-registrar", "hostpathplugin"],
        run: csi::csi_endpoint,
    },
    Scenario { name: "grpcio-driver", programs: &["grpcio-csi-driver"], run: csi::grpcio_driver },
    Scenario {
        name: "generic-device-plugin",
        programs: &["generic-device-plugin"],
        run: device::generic_device_plugin,
    },
    Scenario {
        name: "sample-device-plugin",
        programs: &["sample-device-plugin"],
        run: device::sample_device_plugin,
    },
    Scenario {
        name: "dra-rolling-update",
        programs: &["dra-kubeletplugin"],
        run: dra::dra_rolling_update,
    },
    Scenario {
        name: "kubelet-plugin-manager",
        programs: &["kubelet-pluginmanager"],
        run: kubelet::kubelet_plugin_manager,
    },
    Scenario {
        name: "check-generic-device-plugin",
        programs: &["generic-device-plugin"],
        run: check::generic_device_plugin,
    },
    Scenario {
        name: "check-sample-device-plugin",
        programs: &["sample-device-plugin"],
        run: check::sample_device_plugin,
    },
    Scenario {
        name: "check-node-driver-registrar",
        programs: &["node-driver-registrar", "hostpathplugin"],
        run: check::node_driver_registrar,
    },
    Scenario {
        name: "check-intel-gpu-plugin",
        programs: &["intel_gpu_plugin", "intel_gpu_fakedev"],
        run: check::intel_gpu_plugin,
    },
    Scenario {
        name: "check-cert-manager-csi-driver",
        programs: &["cert-manager-csi-driver", "node-driver-registrar", "kube-apiserver", "etcd"],
        run: check::cert_manager_csi_driver,
    },
    Scenario {
        name: "check-hostdev-device-plugin",
        programs: &["hostdev-device-plugin"],
        run: check::hostdev_device_plugin,
    },
    Scenario {
        name: "check-nfsplugin",
        programs: &["nfsplugin", "node-driver-registrar"],
        run: check::nfsplugin,
    },
    Scenario { name: "check-image", programs: &["generic-device-plugin"], run: check::image },
    Scenario {
        name: "check-dra-test-driver",
        programs: &["dra-test-driver", "kube-apiserver", "etcd"],
        run: check::dra_test_driver,
    },
    Scenario {
        name: "check-dra-example-driver",
        programs: &["dra-example-kubeletplugin", "kube-apiserver", "etcd"],
        run: check::dra_example_driver,
    },
    Scenario {
        name: "check-dra-example-driver-shared",
        programs: &["dra-example-kubeletplugin", "kube-apiserver", "etcd"],
        run: check::dra_example_driver_shared,
    },
    Scenario {
        name: "doctor",
        programs: &[
            "kubelet-pluginmanager",
            "node-driver-registrar",
            "hostpathplugin",
            "generic-device-plugin",
            "dra-kubeletplugin",
        ],
        run: doctor::doctor_beside_the_kubelet,
    },
    Scenario {
        name: "doctor-device-manager",
        programs: &["kubelet-devicemanager", "generic-device-plugin"],
        run: doctor::doctor_beside_the_device_manager,
    },
];

/// A scenario that cannot run here, and why (not a failure).
#[derive(Debug)]
struct Skip(String);

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Skip {}

/// The programs and where their logs go.
struct Env {
    /// The workspace, for the CI job's script (`ci/kpm-check.sh`).
    root: PathBuf,
    kpm: PathBuf,
    example_plugin: PathBuf,
    bin_dir: PathBuf,
    out: PathBuf,
}

/// The usage `--help` prints: the synopsis `cargo xtask interop …`, then what
/// its words stand for.
pub fn usage() -> String {
    let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    format!("cargo xtask interop --bin-dir DIR [--only SCENARIO]\n  SCENARIO: {}", names.join(", "))
}

/// Runs `cargo xtask interop` in the workspace at `root` with `options`, the
/// words after its name; wrong ones are a [`Misused`].
pub fn run(root: &Path, options: &[&str]) -> Result {
    let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    let (mut bin_dir, mut only) = (None, None);
    let mut options = options.iter().copied();
    while let Some(option) = options.next() {
        match (option, options.next()) {
            ("--bin-dir", Some(dir)) => bin_dir = Some(PathBuf::from(dir)),
            ("--only", Some(name)) if names.contains(&name) => only = Some(name),
            (option, value) => return Err(Misused::refused(option, value).into()),
        }
    }
    let bin_dir = bin_dir.ok_or_else(|| Misused::missing("--bin-dir DIR"))?;
    let bin_dir = std::path::absolute(&bin_dir)?;

    scenario::build(root, Profile::Debug)?;
    let binaries = scenario::Binaries::locate(root, "interop", Profile::Debug)?;
    let env = Env {
        root: root.to_path_buf(),
        kpm: binaries.kpm,
        example_plugin: binaries.example_plugin,
        bin_dir,
        out: binaries.out,
    };

    let mut outcomes = Vec::new();
    for scenario in SCENARIOS.iter().filter(|s| only.is_none_or(|only| only == s.name)) {
        let missing: Vec<&str> =
            scenario.programs.iter().copied().filter(|p| !env.bin_dir.join(p).is_file()).collect();
        let outcome = if missing.is_empty() {
            eprintln!("\n== {}", scenario.name);
            let dir = tempfile::Builder::new().prefix("kpm-interop-").tempdir_in("/tmp")?;
            match (scenario.run)(&env, dir.path()) {
                Ok(()) => "passed".to_owned(),
                Err(err) => match err.downcast_ref::<Skip>() {
                    Some(Skip(why)) => format!("skipped: {why}"),
                    None => format!("FAILED: {err}"),
                },
            }
        } else {
            format!("skipped: {} not in {}", missing.join(", "), env.bin_dir.display())
        };
        outcomes.push((scenario.name, outcome));
    }

    crate::harness::report_outcomes("interop", &env.bin_dir, &outcomes, &env.out)
}
