//! `kpm check -- PLUGIN-COMMAND…` on plugins that pass and on each way of
//! failing: no cleanup on SIGTERM, a slow `GetInfo`, no registration after
//! the kubelet restarts, and each rule of the conversation that follows
//! registration broken by one of kpm-registrar's stub misbehaviours.
//!
//! The plugins are real processes: this test binary started again by
//! `kpm check` with the plugin's configuration in the environment (see
//! [`main`]), built on kpm-registrar as its example plugin is: a device
//! plugin on a registration socket, or one registering on `kubelet.sock`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "a test")]

mod support;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use kpm_registrar::Registrar;
use kpm_registrar::stub::{Misbehaviour, StubCsiDriver, StubDevicePlugin, StubDraDriver};
use kpm_test_support::http;
use support::trial;

/// `registry` or `kubelet-sock`: the plugin's role, when this binary runs as one.
const ROLE: &str = "KPM_TEST_CHECK_PLUGIN";
/// Misbehaviours, for the plugin: leave its socket on SIGTERM, answer
/// `GetInfo` late (milliseconds), register on `kubelet.sock` only once.
const NO_CLEANUP: &str = "KPM_TEST_NO_CLEANUP";
const GET_INFO_DELAY_MS: &str = "KPM_TEST_GET_INFO_DELAY_MS";
const NO_REREGISTER: &str = "KPM_TEST_NO_REREGISTER";
/// kpm-registrar's stub misbehaviours, comma-separated names.
const MISBEHAVE: &str = "KPM_TEST_MISBEHAVE";
/// The `csi` role's topology, `KEY=VALUE`.
const TOPOLOGY: &str = "KPM_TEST_TOPOLOGY";
/// Environment variables of the plugin, `(name, value)`.
type Environment = &'static [(&'static str, &'static str)];
/// What `--health-change` runs: the plugin turns a device unhealthy on SIGUSR1.
const HEALTH_CHANGE: &str = "kill -USR1 $KPM_CHECK_PID";
/// The `dra` role's supported versions, comma-separated (default:
/// kpm-registrar's).
const DRA_VERSIONS: &str = "KPM_TEST_DRA_VERSIONS";
/// The resource the plugin serves.
const GPU: &str = "vendor.com/gpu";
/// The `dra` role's stand-in API server, `HOST:PORT`. With it the driver
/// publishes its ResourceSlice there (unless [`DRA_NO_SLICE`]), prepares
/// claims with a device whose CDI spec it writes in `KPM_CHECK_CDI`, and
/// tells its own claims from another driver's by their allocation there.
const DRA_API: &str = "KPM_TEST_DRA_API";
/// The `dra` role publishes no ResourceSlice.
const DRA_NO_SLICE: &str = "KPM_TEST_DRA_NO_SLICE";
/// The `dra` role's driver, and the node and pool of its slice.
const DRA_DRIVER: &str = "gpu.example.com";
const NODE: &str = "kpm-check-node";

/// Runs the tests, or, started by `kpm check`, a plugin.
fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        plugin(&role);
        return;
    }
    support::run_tests();
}

/// Runs `kpm check` on this binary in `role` with `misbehaviour` set;
/// returns the exit code and the report.
fn check(role: &str, misbehaviour: &[(&str, &str)]) -> (i32, String) {
    check_with(&[], role, misbehaviour)
}

/// [`check`] with `kpm check`'s `options`.
fn check_with(options: &[&OsStr], role: &str, misbehaviour: &[(&str, &str)]) -> (i32, String) {
    let me = std::env::current_exe().unwrap();
    let out = Command::new(support::KPM)
        .args(["check", "--timeout", "5"])
        .args(options)
        .arg("--")
        .arg(me)
        .env(ROLE, role)
        .envs(misbehaviour.iter().copied())
        .output()
        .unwrap();
    (out.status.code().unwrap(), String::from_utf8(out.stdout).unwrap())
}

/// The report's line for `step`.
fn line<'a>(report: &'a str, step: &str) -> &'a str {
    report
        .lines()
        .find(|line| line.get(5..).is_some_and(|rest| rest.starts_with(step)))
        .unwrap_or_else(|| panic!("no {step} line in {report}"))
}

// Nothing was checked: neither "passed" (0) nor "failed" (1).
trial!(a_plugin_command_that_does_not_start_cannot_be_checked, || {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-plugin");
    let out = Command::new(support::KPM).arg("check").arg("--").arg(&missing).output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("start the plugin {}", missing.display())), "{stderr}");
});

/// The device plugin's steps, in the order they run.
const DEVICE_STEPS: [&str; 7] = [
    "ListAndWatch",
    "Allocate",
    "Allocate unknown id",
    "GetPreferredAllocation",
    "PreStartContainer",
    "health change",
    "stream stays open",
];

trial!(a_good_plugin_passes_every_step, || {
    let options = [OsStr::new("--health-change"), OsStr::new(HEALTH_CHANGE)];
    let (code, report) = check_with(&options, "registry", &[]);
    assert_eq!(code, 0, "{report}");
    let minors = line(&report, "kubelet minors");
    assert!(minors.starts_with("SKIP") && minors.contains("no DRA driver"), "{report}");
    let steps = ["registers", "GetInfo within 1 s", "type checks", "socket names"];
    let after = ["kubelet restart", "SIGTERM", "plugin restart"];
    for step in steps.iter().chain(&DEVICE_STEPS).chain(&after) {
        assert!(line(&report, step).starts_with("PASS"), "{step}: {report}");
    }
    assert!(
        line(&report, "registers")
            .contains("DevicePlugin vendor.com/gpu at plugins_registry/vendor.com_gpu-reg.sock")
    );
    assert!(line(&report, "type checks").contains("3 devices, 3 healthy"));
    let allocate = line(&report, "Allocate");
    assert!(allocate.contains("gpu-0: 1 env, 1 device /dev/null→/dev/gpu-0 rw"), "{report}");
    assert!(line(&report, "health change").contains("gpu-0 Healthy→Unhealthy"), "{report}");
    assert!(
        line(&report, "plugin restart").contains("vendor.com/gpu: 3 healthy again"),
        "{report}"
    );
    // One socket name in every instance: a second cannot bind beside it.
    assert!(line(&report, "rolling update").contains("k8s-device-plugin#1792"), "{report}");
    assert!(report.ends_with("15 passed, 1 warned, 0 failed\n"), "{report}");
    // Without a way to change a device's health, that step is skipped.
    let (code, report) = check("registry", &[]);
    assert_eq!(code, 0, "{report}");
    assert!(line(&report, "health change").starts_with("SKIP"), "{report}");
});

// Each rule of the device plugin API, broken by the stub's misbehaviour:
// the step that judges it fails (or warns, where the kubelet copes), and
// the others are unmoved.
trial!(each_device_plugin_rule_fails_on_its_misbehaviour, || {
    let rules = [
        ("no-device-list", "ListAndWatch", "FAIL", "no list within"),
        ("duplicate-ids", "ListAndWatch", "FAIL", "ids listed more than once"),
        ("allocate-no-response", "Allocate", "FAIL", "no container response"),
        ("allocate-missing-device", "Allocate", "FAIL", "is not on the host"),
        ("allocate-unknown-ids", "Allocate unknown id", "WARN", "was allocated"),
        ("preferred-ignores-must-include", "GetPreferredAllocation", "WARN", "gpu-2 was a must"),
        ("pre-start-fails", "PreStartContainer", "FAIL", "the container does not start"),
        ("partial-updates", "health change", "FAIL", "left out [\"gpu-1\", \"gpu-2\"]"),
        ("stream-ends", "stream stays open", "FAIL", "ended the ListAndWatch stream"),
    ];
    let options = [OsStr::new("--health-change"), OsStr::new(HEALTH_CHANGE)];
    for (misbehaviour, step, mark, evidence) in rules {
        let (code, report) = check_with(&options, "registry", &[(MISBEHAVE, misbehaviour)]);
        let judged = line(&report, step);
        assert!(judged.starts_with(mark) && judged.contains(evidence), "{misbehaviour}: {report}");
        assert_eq!(code, i32::from(mark == "FAIL"), "{misbehaviour}: {report}");
        for other in DEVICE_STEPS.iter().filter(|other| **other != step) {
            assert!(!line(&report, other).starts_with("FAIL"), "{misbehaviour}: {other}: {report}");
        }
    }
});

// Each rule of the kubelet's node-info path for CSI drivers, broken by
// the stub's misbehaviour or a topology key no label may have.
trial!(each_csi_rule_fails_on_its_misbehaviour, || {
    let (code, report) = check("csi", &[]);
    assert_eq!(code, 0, "{report}");
    for step in ["node id stable", "topology keys", "GetPluginInfo name", "NodeGetCapabilities"] {
        assert!(line(&report, step).starts_with("PASS"), "{step}: {report}");
    }
    assert!(line(&report, "plugin restart").contains("node id \"node-1\" kept"), "{report}");
    let rules: [(Environment, &str, &str); 4] = [
        (&[(MISBEHAVE, "node-id-changes")], "node id stable", "on 3 calls"),
        (&[(MISBEHAVE, "plugin-info-name-differs")], "GetPluginInfo name", "registered as"),
        (&[(MISBEHAVE, "no-node-capabilities")], "NodeGetCapabilities", "Unimplemented"),
        (&[(TOPOLOGY, "bad key=x")], "topology keys", "\"bad key\" is not a label key"),
    ];
    for (misbehaviour, step, evidence) in rules {
        let (code, report) = check("csi", misbehaviour);
        assert_eq!(code, 1, "{misbehaviour:?}: {report}");
        let judged = line(&report, step);
        assert!(
            judged.starts_with("FAIL") && judged.contains(evidence),
            "{misbehaviour:?}: {report}"
        );
    }
    // A node id that moves also moves across the driver's restart.
    let (_, report) = check("csi", &[(MISBEHAVE, "node-id-changes")]);
    assert!(line(&report, "plugin restart").starts_with("FAIL"), "{report}");
});

trial!(a_plugin_that_leaves_its_socket_on_sigterm_fails, || {
    let (code, report) = check("registry", &[(NO_CLEANUP, "1")]);
    assert_eq!(code, 1, "{report}");
    let sigterm = line(&report, "SIGTERM");
    assert!(
        sigterm.starts_with("FAIL")
            && sigterm.contains("but left")
            && sigterm.contains("vendor.com_gpu-reg.sock"),
        "{report}"
    );
    assert!(report.ends_with("13 passed, 1 warned, 1 failed\n"), "{report}");
});

trial!(a_plugin_slower_than_the_kubelets_second_fails_to_register, || {
    let (code, report) = check("registry", &[(GET_INFO_DELAY_MS, "1500")]);
    assert_eq!(code, 1, "{report}");
    let registers = line(&report, "registers");
    assert!(
        registers.starts_with("FAIL") && registers.contains("GetInfo timed out after 1s"),
        "{report}"
    );
    assert!(line(&report, "SIGTERM").starts_with("SKIP"), "{report}");
});

trial!(a_kubelet_sock_plugin_passes_without_registry_steps, || {
    let (code, report) = check("kubelet-sock", &[]);
    assert_eq!(code, 0, "{report}");
    assert!(
        line(&report, "registers").contains("DevicePlugin vendor.com/gpu on kubelet.sock"),
        "{report}"
    );
    assert!(line(&report, "GetInfo within 1 s").starts_with("SKIP"), "{report}");
    assert!(line(&report, "kubelet restart").starts_with("PASS"), "{report}");
    assert!(line(&report, "Allocate").starts_with("PASS"), "{report}");
    let rolled = line(&report, "rolling update");
    assert!(rolled.starts_with("PASS") && rolled.contains("3 healthy once the first"), "{report}");
    assert!(report.ends_with("13 passed, 0 failed\n"), "{report}");
});

trial!(a_plugin_that_does_not_register_again_after_a_restart_fails, || {
    let (code, report) = check("kubelet-sock", &[(NO_REREGISTER, "1")]);
    assert_eq!(code, 1, "{report}");
    let restart = line(&report, "kubelet restart");
    assert!(restart.starts_with("FAIL") && restart.contains("not registered again"), "{report}");
});

trial!(the_report_is_also_json_and_junit_for_a_ci, || {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("kpm-check.xml");
    let options = [OsStr::new("-o"), OsStr::new("json"), OsStr::new("--junit"), junit.as_os_str()];
    let misbehaviours = [(NO_CLEANUP, "1"), (MISBEHAVE, "allocate-unknown-ids")];
    let (code, report) = check_with(&options, "registry", &misbehaviours);
    assert_eq!(code, 1, "{report}");

    let json: serde_json::Value = serde_json::from_str(&report).unwrap();
    let results: Vec<(&str, &str)> = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|check| (check["check"].as_str().unwrap(), check["result"].as_str().unwrap()))
        .collect();
    assert_eq!(
        results,
        [
            ("registers", "passed"),
            ("GetInfo within 1 s", "passed"),
            ("type checks", "passed"),
            ("kubelet minors", "skipped"),
            ("socket names", "passed"),
            ("ListAndWatch", "passed"),
            ("Allocate", "passed"),
            ("Allocate unknown id", "warned"),
            ("GetPreferredAllocation", "passed"),
            ("PreStartContainer", "passed"),
            ("health change", "skipped"),
            ("stream stays open", "passed"),
            ("kubelet restart", "passed"),
            ("devices after kubelet restart", "passed"),
            ("ResourceSlices after a wipe", "skipped"),
            ("SIGTERM", "failed"),
            ("plugin restart", "passed"),
            ("prepare after reboot", "skipped"),
            ("rolling update", "warned"),
        ],
        "{report}"
    );
    let sigterm = &json["checks"][15]["evidence"][0];
    assert_eq!(sigterm["mark"], "fail", "{report}");
    assert!(sigterm["said"].as_str().unwrap().contains("but left"), "{report}");
    let get_info = &json["checks"][1]["evidence"][0];
    assert!(get_info["subject"]["socket"].as_str().unwrap().ends_with("vendor.com_gpu-reg.sock"));
    assert!(get_info["tookMs"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(
        (&json["passed"], &json["warned"], &json["failed"], &json["skipped"]),
        (&12.into(), &2.into(), &1.into(), &4.into())
    );
    assert!(json["kept"].is_null(), "{report}");

    let xml = std::fs::read_to_string(&junit).unwrap();
    let junit = quick_junit::Report::deserialize_from_str(&xml).unwrap();
    assert_eq!((junit.tests, junit.failures, junit.errors), (19, 1, 0), "{xml}");
    let cases = &junit.test_suites[0].test_cases;
    let names: Vec<&str> = cases.iter().map(|case| case.name.as_str()).collect();
    assert_eq!(names, results.iter().map(|(step, _)| *step).collect::<Vec<_>>(), "{xml}");
    match &cases[15].status {
        quick_junit::TestCaseStatus::NonSuccess {
            kind: quick_junit::NonSuccessKind::Failure,
            message: Some(message),
            ..
        } => assert!(message.contains("vendor.com_gpu-reg.sock"), "{xml}"),
        other => panic!("SIGTERM is {other:?}: {xml}"),
    }
    // JUnit has no warnings: a pass whose output says so.
    let warned = cases[7].system_out.as_deref().unwrap_or_default();
    assert!(warned.starts_with("warning: kpm-check-no-such-device"), "{xml}");
    assert!(matches!(cases[7].status, quick_junit::TestCaseStatus::Success { .. }), "{xml}");
    let registers = cases[0].system_out.as_deref().unwrap_or_default();
    assert!(registers.contains("DevicePlugin vendor.com/gpu"), "{xml}");
});

// Each kubelet minor's rule on the services a DRA driver offers, as the
// doctor judges them: kpm-registrar's default (v1 and v1beta1) is served
// by every minor from 1.32; `v1.DRAPlugin` alone breaks on 1.32 and 1.33.
trial!(a_dra_driver_is_held_against_every_kubelet_minor, || {
    let (code, report) = check("dra", &[]);
    assert_eq!(code, 0, "{report}");
    let minors = line(&report, "kubelet minors");
    assert!(
        minors.starts_with("PASS")
            && minors.contains("kubelets 1.34-1.36 call v1.DRAPlugin, 1.32-1.33 call v1beta1.DRAPlugin, 1.31 refuse it"),
        "{report}"
    );
    let (code, report) = check("dra", &[(DRA_VERSIONS, "v1.DRAPlugin")]);
    assert_eq!(code, 1, "{report}");
    let minors = line(&report, "kubelet minors");
    assert!(
        minors.starts_with("FAIL")
            && minors.contains("1.32-1.33 register it, then call v1alpha3.Node (DRA v1alpha4)"),
        "{report}"
    );
    assert!(line(&report, "type checks").starts_with("PASS"), "kpm itself takes it: {report}");
});

// === The plugin ===

fn plugin(role: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let set = |name: &str| std::env::var_os(name).is_some();
    runtime.block_on(async {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        let misbehaviours: Vec<Misbehaviour> = std::env::var(MISBEHAVE)
            .map(|names| names.split(',').map(|name| name.parse().unwrap()).collect())
            .unwrap_or_default();
        let (plugin, devices) = StubDevicePlugin::new([
            ("gpu-0", "Healthy"),
            ("gpu-1", "Healthy"),
            ("gpu-2", "Healthy"),
        ]);
        let plugin = plugin
            .preferred_allocation()
            .pre_start_required()
            .misbehave(misbehaviours.iter().copied());
        let registry = || PathBuf::from(std::env::var("KPM_CHECK_REGISTRY").unwrap());
        match role {
            "registry" => {
                let delay = std::env::var(GET_INFO_DELAY_MS).map_or(0, |ms| ms.parse().unwrap());
                let registrar = Registrar::builder(kpm::api::DEVICE_PLUGIN, GPU)
                    .socket_dir(registry())
                    .routes(plugin.routes())
                    .get_info_delay(Duration::from_millis(delay))
                    .serve()
                    .await
                    .unwrap();
                let mut user1 =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
                        .unwrap();
                loop {
                    tokio::select! {
                        _ = user1.recv() => { devices.fail_next(); }
                        _ = terminate.recv() => break,
                    }
                }
                if set(NO_CLEANUP) {
                    std::process::exit(0);
                }
                registrar.shutdown().await.unwrap();
            }
            "kubelet-sock" => {
                let dir = PathBuf::from(std::env::var("KPM_CHECK_DEVICE_PLUGINS").unwrap());
                let stop = async {
                    terminate.recv().await;
                };
                if !set(NO_REREGISTER) {
                    // An endpoint per instance: a rolling update's second
                    // instance serves beside the first.
                    let instance = std::env::var("KPM_CHECK_INSTANCE").unwrap();
                    kpm_registrar::serve_device_plugin(
                        &dir,
                        &format!("gpu-{instance}.sock"),
                        GPU,
                        plugin.routes(),
                        stop,
                    )
                    .await
                    .unwrap();
                    return;
                }
                register_once(&dir, &plugin).await;
                stop.await;
                let _ = std::fs::remove_file(dir.join("gpu.sock"));
            }
            "csi" => {
                let registrar = Registrar::builder(kpm::api::CSI_PLUGIN, "csi.example.com")
                    .socket_dir(registry())
                    .routes(csi_driver().misbehave(misbehaviours).routes())
                    .serve()
                    .await
                    .unwrap();
                terminate.recv().await;
                registrar.shutdown().await.unwrap();
            }
            "dra" => {
                let mut driver = StubDraDriver::new().misbehave(misbehaviours);
                if let Ok(api) = std::env::var(DRA_API) {
                    if !set(DRA_NO_SLICE) {
                        publish_slice(api.clone());
                    }
                    let cdi = std::env::var("KPM_CHECK_CDI").unwrap();
                    driver = driver.cdi(cdi, NODE).foreign_claims(move |namespace, name| {
                        !allocated_to_us(&api, namespace, name)
                    });
                }
                let builder = Registrar::builder(kpm::api::DRA_PLUGIN, DRA_DRIVER)
                    .socket_dir(registry())
                    .routes(driver.routes());
                let builder = match std::env::var(DRA_VERSIONS) {
                    Ok(versions) => builder.versions(versions.split(',').map(str::to_owned)),
                    Err(_) => builder,
                };
                let registrar = builder.serve().await.unwrap();
                terminate.recv().await;
                registrar.shutdown().await.unwrap();
            }
            other => panic!("unknown role {other}"),
        }
    });
}

/// Serves `plugin` in `dir` and registers it on `kubelet.sock` once, when
/// that first appears. Serving it, kpm empties the directory: a socket
/// bound in that moment is gone, and the registration fails; then once more.
async fn register_once(dir: &std::path::Path, plugin: &StubDevicePlugin) {
    while !dir.join("kubelet.sock").exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for attempt in 1.. {
        let incoming = kpm::transport::bind(&dir.join("gpu.sock")).await.unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_routes(plugin.clone().routes())
                .serve_with_incoming(incoming),
        );
        let timeout = Duration::from_secs(5);
        match kpm_registrar::register_device_plugin(dir, "gpu.sock", GPU, timeout).await {
            Ok(()) => break,
            Err(err) if attempt < 3 => {
                eprintln!("registering failed, once more: {err}");
                server.abort();
            }
            Err(err) => panic!("registering failed: {err}"),
        }
    }
}

/// The `csi` role's driver: node id `node-1`, its topology from [`TOPOLOGY`].
fn csi_driver() -> StubCsiDriver {
    let driver = StubCsiDriver::new("csi.example.com", "node-1");
    match std::env::var(TOPOLOGY) {
        Ok(segment) => {
            let (key, value) = segment.split_once('=').unwrap();
            driver.topology(key, value)
        }
        Err(_) => driver.topology("topology.example.com/node", "node-1"),
    }
}

// Without `--kubeconfig` the DRA steps that need a `ResourceClaim` skip,
// saying so; a prepare with no claims and an unknown claim's unprepare
// still run, on both services.
trial!(a_dra_driver_without_an_api_server_skips_the_claim_steps, || {
    let (code, report) = check("dra", &[]);
    assert_eq!(code, 0, "{report}");
    let resource_slices = line(&report, "ResourceSlices");
    assert!(
        resource_slices.starts_with("SKIP") && resource_slices.contains("--kubeconfig"),
        "{report}"
    );
    for version in ["v1", "v1beta1"] {
        let prepare = line(&report, &format!("NodePrepareResources {version}"));
        assert!(prepare.starts_with("SKIP") && prepare.contains("answered none"), "{report}");
        assert!(
            line(&report, &format!("unprepare unknown claim {version}")).starts_with("PASS"),
            "{report}"
        );
        let other = line(&report, &format!("claim of another driver {version}"));
        assert!(other.starts_with("SKIP"), "{report}");
    }
});

// The kubelet unprepares its checkpoint's claims after a restart, which
// the driver may not know: an error there keeps the pod from going.
trial!(a_dra_driver_failing_an_unknown_claim_fails, || {
    let (code, report) = check("dra", &[(MISBEHAVE, "unprepare-unknown-fails")]);
    assert_eq!(code, 1, "{report}");
    for version in ["v1", "v1beta1"] {
        let unknown = line(&report, &format!("unprepare unknown claim {version}"));
        assert!(unknown.starts_with("FAIL") && unknown.contains("is not prepared"), "{report}");
    }
});

// The kubelet fails a pod on an answer for a claim it did not send.
trial!(a_dra_driver_answering_unsent_claims_fails, || {
    let (code, report) = check("dra", &[(MISBEHAVE, "prepare-answers-unsent-claim")]);
    assert_eq!(code, 1, "{report}");
    let prepare = line(&report, "NodePrepareResources v1");
    assert!(prepare.starts_with("FAIL") && prepare.contains("did not send"), "{report}");
});

// === DRA drivers against an API server ===

/// The ResourceSlices' collection.
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// The `dra` role's ResourceSlice: device `dev-0` of pool [`NODE`], created
/// at `created` (None: the stand-in stamps it).
fn resource_slice(created: Option<&str>) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{NODE}-{DRA_DRIVER}"), "creationTimestamp": created},
        "spec": {"driver": DRA_DRIVER, "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "dev-0"}]},
    })
}

/// Publishes the `dra` role's slice on the API server at `api`, and again
/// whenever it is gone (a wiped slice), as the kubelet plugin helper's
/// controller does, until the process exits.
fn publish_slice(api: String) {
    let slice = resource_slice(None).to_string();
    http::send(&api, "POST", SLICES, &slice);
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let listed: serde_json::Value =
                serde_json::from_str(&http::send(&api, "GET", SLICES, "")).unwrap();
            let ours = listed["items"].as_array().into_iter().flatten();
            if ours.filter(|slice| slice["spec"]["driver"] == DRA_DRIVER).count() == 0 {
                http::send(&api, "POST", SLICES, &slice);
            }
        }
    });
}

/// Whether the ResourceClaim `namespace/name` of the API server at `api`
/// is allocated to the `dra` role's driver, as a driver reads it.
fn allocated_to_us(api: &str, namespace: &str, name: &str) -> bool {
    let path = format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}");
    let claim: serde_json::Value =
        serde_json::from_str(&http::send(api, "GET", &path, "")).unwrap();
    let results = claim["status"]["allocation"]["devices"]["results"].as_array().unwrap();
    results.iter().any(|result| result["driver"] == DRA_DRIVER)
}

/// `kpm check --kubeconfig` on the `dra` role with the stand-in API server
/// holding `slices`, the role configured by `environment`: the exit code,
/// the report and the stand-in after the run.
fn check_dra_with_api(
    slices: Vec<serde_json::Value>,
    environment: &[(&str, &str)],
) -> (i32, String, kpm_test_support::api_server::Shared) {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let state = std::sync::Arc::new(parking_lot::Mutex::new(kpm_test_support::api_server::State {
        slices,
        ..kpm_test_support::api_server::State::default()
    }));
    let port = kpm_test_support::free_port();
    kpm_test_support::api_server::serve(&rt, port, std::sync::Arc::clone(&state));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        kpm_test_support::api_server::kubeconfig(&format!("http://127.0.0.1:{port}")),
    )
    .unwrap();
    let api = format!("127.0.0.1:{port}");
    let mut environment = environment.to_vec();
    environment.push((DRA_API, &api));
    let options = [OsStr::new("--kubeconfig"), kubeconfig.as_os_str()];
    let (code, report) = check_with(&options, "dra", &environment);
    (code, report, state)
}

/// The DRA steps of one service that need a ResourceClaim.
fn claim_steps(version: &str) -> [String; 5] {
    [
        format!("NodePrepareResources {version}"),
        format!("prepare again {version}"),
        format!("NodeUnprepareResources {version}"),
        format!("unprepare unknown claim {version}"),
        format!("claim of another driver {version}"),
    ]
}

// A driver that publishes its slice, prepares the claim allocated to it
// with a device whose CDI spec resolves, answers the same again, removes
// the spec on unprepare and gives another driver's claim no device
// passes every step on both services; the check's claims are deleted.
trial!(a_good_dra_driver_passes_every_claim_step_and_its_claims_go, || {
    let (code, report, state) = check_dra_with_api(Vec::new(), &[]);
    assert_eq!(code, 0, "{report}");
    let slices = line(&report, "ResourceSlices");
    assert!(slices.starts_with("PASS") && slices.contains("1 devices"), "{report}");
    for version in ["v1", "v1beta1"] {
        for step in claim_steps(version) {
            assert!(line(&report, &step).starts_with("PASS"), "{step}: {report}");
        }
        let prepare = line(&report, &format!("NodePrepareResources {version}"));
        assert!(
            prepare.contains(&format!("{NODE}/dev-0")) && prepare.contains("a valid CDI spec"),
            "{report}"
        );
        let unprepare = line(&report, &format!("NodeUnprepareResources {version}"));
        assert!(unprepare.contains("removed"), "{report}");
    }
    let state = state.lock();
    let created =
        state.requests.iter().filter(|r| r.starts_with("POST") && r.ends_with("/resourceclaims"));
    // Ours and another driver's for the conversation, the same two kept
    // across the driver's reboot.
    assert_eq!(created.count(), 4, "{:?}", state.requests);
    assert!(state.claims.is_empty(), "the check's claims are left: {:?}", state.claims.keys());
});

// Each rule of the claim steps, broken by the stub's misbehaviour (or a
// slice that is not the driver's doing): the step that judges it fails,
// or warns where the kubelet copes.
trial!(each_dra_claim_rule_fails_on_its_misbehaviour, || {
    let an_hour_ago =
        humantime::format_rfc3339_seconds(std::time::SystemTime::now() - Duration::from_secs(3600))
            .to_string();
    let an_hour_old = || vec![resource_slice(Some(&an_hour_ago))];
    let rules: [(Vec<serde_json::Value>, Environment, &str, &str, &str); 7] = [
        (
            Vec::new(),
            &[(MISBEHAVE, "cdi-id-unresolved")],
            "NodePrepareResources v1",
            "FAIL",
            "is in no CDI spec",
        ),
        (
            Vec::new(),
            &[(MISBEHAVE, "cdi-spec-invalid")],
            "NodePrepareResources v1",
            "FAIL",
            "the CDI package refuses the spec",
        ),
        (
            Vec::new(),
            &[(MISBEHAVE, "prepare-answers-differently")],
            "prepare again v1",
            "WARN",
            "a different answer",
        ),
        (
            Vec::new(),
            &[(MISBEHAVE, "unprepare-leaves-spec")],
            "NodeUnprepareResources v1",
            "WARN",
            "still defines",
        ),
        (
            Vec::new(),
            &[(MISBEHAVE, "prepares-foreign-claim")],
            "claim of another driver v1",
            "WARN",
            "prepared with devices",
        ),
        (
            an_hour_old(),
            &[(DRA_NO_SLICE, "1")],
            "ResourceSlices",
            "WARN",
            "none written since the driver started",
        ),
        (
            Vec::new(),
            &[(DRA_NO_SLICE, "1")],
            "ResourceSlices",
            "FAIL",
            "no ResourceSlice of gpu.example.com",
        ),
    ];
    for (slices, environment, step, mark, evidence) in rules {
        let (code, report, state) = check_dra_with_api(slices, environment);
        let judged = line(&report, step);
        assert!(judged.starts_with(mark) && judged.contains(evidence), "{environment:?}: {report}");
        // A driver that publishes no slice does not publish one after a wipe either.
        let no_slice = environment.contains(&(DRA_NO_SLICE, "1"));
        assert_eq!(code, i32::from(mark == "FAIL" || no_slice), "{environment:?}: {report}");
        assert!(state.lock().claims.is_empty(), "{environment:?}: claims left");
    }
});
