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

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::Result;
use crate::scenario::{self, Process, RunningKpm, find, wait_for, wait_until};

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
        run: node_driver_registrar,
    },
    Scenario {
        name: "csi-endpoint",
        programs: &["node-driver-registrar", "hostpathplugin"],
        run: csi_endpoint,
    },
    Scenario { name: "grpcio-driver", programs: &["grpcio-csi-driver"], run: grpcio_driver },
    Scenario {
        name: "generic-device-plugin",
        programs: &["generic-device-plugin"],
        run: generic_device_plugin,
    },
    Scenario {
        name: "sample-device-plugin",
        programs: &["sample-device-plugin"],
        run: sample_device_plugin,
    },
    Scenario {
        name: "dra-rolling-update",
        programs: &["dra-kubeletplugin"],
        run: dra_rolling_update,
    },
    Scenario {
        name: "kubelet-plugin-manager",
        programs: &["kubelet-pluginmanager"],
        run: kubelet_plugin_manager,
    },
    Scenario {
        name: "check",
        programs: &["generic-device-plugin", "node-driver-registrar", "hostpathplugin"],
        run: check_real_plugins,
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
        run: doctor_beside_the_kubelet,
    },
    Scenario {
        name: "doctor-device-manager",
        programs: &["kubelet-devicemanager", "generic-device-plugin"],
        run: doctor_beside_the_device_manager,
    },
];

/// The programs and where their logs go.
struct Env {
    kpm: PathBuf,
    example_plugin: PathBuf,
    bin_dir: PathBuf,
    out: PathBuf,
}

pub(crate) fn run(root: &Path, options: &[&str]) -> Result {
    let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    let usage = || format!("usage: cargo xtask interop --bin-dir DIR [--only {}]", names.join("|"));
    let (mut bin_dir, mut only) = (None, None);
    let mut options = options.iter();
    while let Some(option) = options.next() {
        match (*option, options.next()) {
            ("--bin-dir", Some(dir)) => bin_dir = Some(PathBuf::from(dir)),
            ("--only", Some(name)) if names.contains(name) => only = Some(*name),
            _ => return Err(usage().into()),
        }
    }
    let bin_dir = bin_dir.ok_or_else(usage)?;
    let bin_dir = std::path::absolute(&bin_dir)?;

    scenario::build(root)?;
    let binaries = scenario::Binaries::locate(root, "interop")?;
    let env = Env {
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
                Err(err) => format!("FAILED: {err}"),
            }
        } else {
            format!("skipped: {} not in {}", missing.join(", "), env.bin_dir.display())
        };
        outcomes.push((scenario.name, outcome));
    }

    println!("\ninterop against {}:", env.bin_dir.display());
    for (name, outcome) in &outcomes {
        println!("  {name:<24} {outcome}");
    }
    println!("logs: {}", env.out.display());
    let failed = outcomes.iter().filter(|(_, outcome)| outcome.starts_with("FAILED")).count();
    if failed > 0 {
        return Err(format!("{failed} interop scenario(s) failed").into());
    }
    Ok(())
}

// === Scenarios ===

fn node_driver_registrar(env: &Env, root: &Path) -> Result {
    let metrics = scenario::free_local_addr()?;
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
fn grpcio_driver(env: &Env, root: &Path) -> Result {
    const SCENARIO: &str = "grpcio-driver";
    const DRIVER: &str = "grpcio.example.com";
    let metrics = scenario::free_local_addr()?;
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
fn csi_endpoint(env: &Env, root: &Path) -> Result {
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

fn generic_device_plugin(env: &Env, root: &Path) -> Result {
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

fn dra_rolling_update(env: &Env, root: &Path) -> Result {
    let kpm = start_kpm(env, root, "dra-rolling-update")?;
    let bin = env.bin_dir.join("dra-kubeletplugin");
    let instance = |uid: &str| {
        let name = format!("dra-kubeletplugin-{uid}");
        spawn(
            env,
            "dra-rolling-update",
            &name,
            &bin,
            &[
                "--driver-name",
                "dra.example.com",
                "--node-name",
                "node-1",
                "--registrar-dir",
                &root.join("plugins_registry").display().to_string(),
                "--plugin-dir",
                &root.join("plugins/dra.example.com").display().to_string(),
                "--uid",
                uid,
            ],
        )
    };
    let endpoints = |list: &serde_json::Value| -> Vec<String> {
        find(&list["dra_drivers"], "name", "dra.example.com")
            .and_then(|driver| driver["instances"].as_array())
            .map(|instances| {
                instances.iter().filter_map(|i| i["endpoint"].as_str().map(str::to_owned)).collect()
            })
            .unwrap_or_default()
    };
    let mut old = instance("1111")?;
    old.wait_for_line("the helper told registered", STEP_TIMEOUT, |line| {
        line == "registration status: true"
    })?;
    let mut new = instance("2222")?;
    new.wait_for_line("the helper told registered", STEP_TIMEOUT, |line| {
        line == "registration status: true"
    })?;
    let both = wait_for_list(&kpm, "both instances registered", |list| {
        let endpoints = endpoints(list);
        Ok((endpoints.len() == 2).then_some(endpoints))
    })?;
    eprintln!("both instances registered: {both:?}");
    new.stop(STOP_TIMEOUT)?;
    let left = wait_for_list(&kpm, "back to the older instance", |list| {
        let endpoints = endpoints(list);
        Ok((endpoints.len() == 1 && endpoints[0].contains("1111")).then_some(endpoints))
    })?;
    eprintln!("the newer instance exited, left: {left:?}");
    old.stop(STOP_TIMEOUT)?;
    wait_for_list(&kpm, "no instance left", |list| Ok(endpoints(list).is_empty().then_some(())))?;
    kpm.stop()
}

fn kubelet_plugin_manager(env: &Env, root: &Path) -> Result {
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

/// `kpm doctor` beside the kubelet's own plugin manager: node-driver-registrar
/// with hostpathplugin and a DRA kubelet-plugin registered with it,
/// generic-device-plugin registered on a `kubelet.sock` (served by a `kpm
/// run` whose registry is elsewhere), a stale socket and a CSI driver's own
/// socket placed in the registry. Every verdict must be right, and the
/// doctor must not have notified anyone.
fn doctor_beside_the_kubelet(env: &Env, root: &Path) -> Result {
    const SCENARIO: &str = "doctor";
    let registry = root.join("plugins_registry");
    fs::create_dir_all(&registry)?;
    let manager = peer(
        env,
        SCENARIO,
        "kubelet-pluginmanager",
        &["--registry-dir", &registry.display().to_string()],
    )?;
    manager.wait_for_line("the plugin manager started", STEP_TIMEOUT, |line| line == "started")?;
    let kubelet_sock = start_kpm_with(
        env,
        root,
        SCENARIO,
        &["--registry-dir", &root.join("kpm-registry").display().to_string()],
    )?;

    let csi_sock = root.join("plugins/csi-hostpath/csi.sock");
    fs::create_dir_all(csi_sock.parent().ok_or("no parent")?)?;
    let _driver = hostpath(env, SCENARIO, root, "hostpath.csi.k8s.io", &csi_sock, &[])?;
    wait_until("hostpathplugin serves its socket", STEP_TIMEOUT, || Ok(csi_sock.exists()))?;
    let registrar = peer(
        env,
        SCENARIO,
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
        SCENARIO,
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
    let _devices = null_devices(env, SCENARIO, root)?;
    wait_for_list(&kubelet_sock, "squat.ai/null registered on kubelet.sock", |list| {
        Ok(find(&list["device_resources"], "resource", "squat.ai/null")
            .filter(|r| r["healthy"] == 3)
            .cloned())
    })?;
    let stale = registry.join("gone.example.com-reg.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale)?);
    let misplaced = registry.join("csi.sock");
    let _misplaced_driver = hostpath(env, SCENARIO, root, "misplaced.csi.k8s.io", &misplaced, &[])?;
    wait_until("the misplaced driver serves its socket", STEP_TIMEOUT, || Ok(misplaced.exists()))?;

    let notified = |registrar: &Process| -> Result<usize> {
        Ok(registrar
            .error_lines()?
            .iter()
            .filter(|line| line.contains("NotifyRegistrationStatus"))
            .count())
    };
    let before = notified(&registrar)?;
    let nowhere = root.join("no-other-root").display().to_string();
    let report = scenario::doctor(
        &env.kpm,
        &["--root-dir", &root.display().to_string(), "--other-root", &nowhere],
    )?;
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
    kubelet_sock.stop()
}

/// `kpm doctor` beside the kubelet's own device manager (its test binary,
/// run on `ROOT/device-plugins/kubelet.sock`): generic-device-plugin
/// registers there, and the doctor names its socket's resource from the
/// checkpoint the manager writes; kpm-registrar's example device plugin,
/// serving in `device-plugins/` without registering, is `not-registered`.
fn doctor_beside_the_device_manager(env: &Env, root: &Path) -> Result {
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
    let nowhere = root.join("no-other-root").display().to_string();
    let report = scenario::doctor(
        &env.kpm,
        &["--root-dir", &root.display().to_string(), "--other-root", &nowhere],
    )?;
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

/// `kpm check` on real plugins: generic-device-plugin (registers on
/// `kubelet.sock`, and again only once its own socket is removed), and
/// node-driver-registrar with hostpathplugin as one command. Both pass
/// every step that applies.
fn check_real_plugins(env: &Env, _root: &Path) -> Result {
    let bin = |name: &str| env.bin_dir.join(name).display().to_string();
    let plugin_dir = "--plugin-directory={device-plugins}";
    let device = format!("--device={NULL_DEVICES}");
    let generic = bin("generic-device-plugin");
    let args = [generic.as_str(), plugin_dir, "--domain=squat.ai", "--listen=127.0.0.1:0", &device];
    run_check(env, "generic-device-plugin", &args, "4 passed, 0 failed")?;
    let csi = format!(
        "{} --endpoint=unix://{{plugins}}/csi.sock --nodeid=node-1 --drivername=hostpath.csi.k8s.io \
         --statedir={{root}}/state & exec {} --csi-address={{plugins}}/csi.sock \
         --kubelet-registration-path={{plugins}}/csi.sock --plugin-registration-path={{registry}}",
        bin("hostpathplugin"),
        bin("node-driver-registrar"),
    );
    run_check(env, "node-driver-registrar", &["sh", "-c", &csi], "6 passed, 0 failed")
}

/// Runs `kpm check --junit FILE -- COMMAND`, shows and keeps its report,
/// and fails unless it succeeds with `expected` as its last line and a
/// `--junit` report of its six steps, none failed.
fn run_check(env: &Env, name: &str, command: &[&str], expected: &str) -> Result {
    let junit = env.out.join(format!("check-{name}.xml"));
    let out = std::process::Command::new(&env.kpm)
        .arg("check")
        .arg("--junit")
        .arg(&junit)
        .arg("--")
        .args(command)
        .output()?;
    let report = String::from_utf8_lossy(&out.stdout);
    eprintln!("{report}");
    fs::write(env.out.join(format!("check-{name}.out")), report.as_bytes())?;
    let xml = fs::read_to_string(&junit).unwrap_or_default();
    let suites = xml.lines().find(|line| line.starts_with("<testsuites ")).unwrap_or_default();
    if !(suites.contains(r#" tests="6""#) && suites.contains(r#" failures="0""#)) {
        return Err(format!(
            "kpm check of {name}: the JUnit report {} begins {suites:?}",
            junit.display()
        )
        .into());
    }
    if out.status.success() && report.trim_end().ends_with(expected) {
        Ok(())
    } else {
        Err(format!(
            "kpm check of {name}: {} ({}), expected {expected}",
            report.trim_end(),
            out.status
        )
        .into())
    }
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

/// `test/images/sample-device-plugin` of Kubernetes: its stub serves
/// `Registration` and `DevicePlugin` on one socket, so kpm's liveness probes
/// go over the `ListAndWatch` connection; the stub logs each `GetInfo`.
fn sample_device_plugin(env: &Env, root: &Path) -> Result {
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

// === Processes ===

/// hostpathplugin serving driver `name` on `endpoint`, node id `node-1`.
fn hostpath(
    env: &Env,
    scenario: &str,
    root: &Path,
    name: &str,
    endpoint: &Path,
    extra: &[&str],
) -> Result<Process> {
    let endpoint = format!("--endpoint=unix://{}", endpoint.display());
    let driver = format!("--drivername={name}");
    let state = format!("--statedir={}", root.join(format!("{name}-state")).display());
    let mut args = vec![endpoint.as_str(), "--nodeid=node-1", &driver, &state];
    args.extend_from_slice(extra);
    peer(env, scenario, "hostpathplugin", &args)
}

/// generic-device-plugin registering `squat.ai/null` (3 devices, all
/// `/dev/null`) on `root`'s `kubelet.sock`.
fn null_devices(env: &Env, scenario: &str, root: &Path) -> Result<Process> {
    let dir = root.join("device-plugins").display().to_string();
    let args = [
        "--plugin-directory",
        &dir,
        "--domain",
        "squat.ai",
        "--listen",
        "127.0.0.1:0",
        "--device",
        NULL_DEVICES,
    ];
    peer(env, scenario, "generic-device-plugin", &args)
}

fn start_kpm(env: &Env, root: &Path, scenario: &str) -> Result<RunningKpm> {
    start_kpm_with(env, root, scenario, &[])
}

fn start_kpm_with(env: &Env, root: &Path, scenario: &str, args: &[&str]) -> Result<RunningKpm> {
    RunningKpm::start(&env.kpm, root, args, &env.out.join(format!("{scenario}-kpm.log")))
}

/// Starts `program` from the bin dir.
fn peer(env: &Env, scenario: &str, program: &str, args: &[&str]) -> Result<Process> {
    spawn(env, scenario, program, &env.bin_dir.join(program), args)
}

/// Starts `bin`, naming it `name` in messages and in its log files in `target/interop`.
fn spawn(env: &Env, scenario: &str, name: &str, bin: &Path, args: &[&str]) -> Result<Process> {
    spawn_command(env, scenario, name, std::process::Command::new(bin).args(args))
}

/// [`spawn`] for a command given its arguments and environment already.
fn spawn_command(
    env: &Env,
    scenario: &str,
    name: &str,
    command: &mut std::process::Command,
) -> Result<Process> {
    let log = |suffix: &str| env.out.join(format!("{scenario}-{name}.{suffix}"));
    Process::spawn_command(name, command, &log("out"), &log("err"))
}

/// Waits until `kpm list -o json` shows what `found` looks for.
fn wait_for_list<T>(
    kpm: &RunningKpm,
    what: &str,
    found: impl Fn(&serde_json::Value) -> Result<Option<T>>,
) -> Result<T> {
    wait_for(what, STEP_TIMEOUT, || found(&kpm.list()?))
}
