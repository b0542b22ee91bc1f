//! `kpm check -- PLUGIN-COMMAND…` on plugins that pass and on each way of
//! failing: no cleanup on SIGTERM, a slow `GetInfo`, no registration after
//! the kubelet restarts.
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
use kpm_registrar::stub::StubDevicePlugin;

/// `registry` or `kubelet-sock`: the plugin's role, when this binary runs as one.
const ROLE: &str = "KPM_TEST_CHECK_PLUGIN";
/// Misbehaviours, for the plugin: leave its socket on SIGTERM, answer
/// `GetInfo` late (milliseconds), register on `kubelet.sock` only once.
const NO_CLEANUP: &str = "KPM_TEST_NO_CLEANUP";
const GET_INFO_DELAY_MS: &str = "KPM_TEST_GET_INFO_DELAY_MS";
const NO_REREGISTER: &str = "KPM_TEST_NO_REREGISTER";
/// The `dra` role's supported versions, comma-separated (default:
/// kpm-registrar's).
const DRA_VERSIONS: &str = "KPM_TEST_DRA_VERSIONS";
/// The resource the plugin serves.
const GPU: &str = "vendor.com/gpu";

/// Runs the tests, or, started by `kpm check`, a plugin.
fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        plugin(&role);
        return;
    }
    let tests: [(&str, fn()); 8] = [
        ("a_good_plugin_passes_every_step", a_good_plugin_passes_every_step),
        (
            "a_plugin_that_leaves_its_socket_on_sigterm_fails",
            a_plugin_that_leaves_its_socket_on_sigterm_fails,
        ),
        (
            "a_plugin_slower_than_the_kubelets_second_fails_to_register",
            a_plugin_slower_than_the_kubelets_second_fails_to_register,
        ),
        (
            "a_kubelet_sock_plugin_passes_without_registry_steps",
            a_kubelet_sock_plugin_passes_without_registry_steps,
        ),
        (
            "a_plugin_that_does_not_register_again_after_a_restart_fails",
            a_plugin_that_does_not_register_again_after_a_restart_fails,
        ),
        ("the_report_is_also_json_and_junit_for_a_ci", the_report_is_also_json_and_junit_for_a_ci),
        (
            "a_dra_driver_is_held_against_every_kubelet_minor",
            a_dra_driver_is_held_against_every_kubelet_minor,
        ),
        (
            "a_plugin_command_that_does_not_start_cannot_be_checked",
            a_plugin_command_that_does_not_start_cannot_be_checked,
        ),
    ];
    support::run_tests(&tests);
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

/// Nothing was checked: neither "passed" (0) nor "failed" (1).
fn a_plugin_command_that_does_not_start_cannot_be_checked() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-plugin");
    let out = Command::new(support::KPM).arg("check").arg("--").arg(&missing).output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("start {}", missing.display())), "{stderr}");
}

fn a_good_plugin_passes_every_step() {
    let (code, report) = check("registry", &[]);
    assert_eq!(code, 0, "{report}");
    let minors = line(&report, "kubelet minors");
    assert!(minors.starts_with("SKIP") && minors.contains("no DRA driver"), "{report}");
    for step in [
        "registers",
        "GetInfo within 1 s",
        "type checks",
        "socket names",
        "kubelet restart",
        "SIGTERM",
    ] {
        assert!(line(&report, step).starts_with("PASS"), "{report}");
    }
    assert!(
        line(&report, "registers")
            .contains("DevicePlugin vendor.com/gpu at plugins_registry/vendor.com_gpu-reg.sock")
    );
    assert!(line(&report, "type checks").contains("2 devices, 2 healthy"));
    assert!(report.ends_with("6 passed, 0 failed\n"), "{report}");
}

fn a_plugin_that_leaves_its_socket_on_sigterm_fails() {
    let (code, report) = check("registry", &[(NO_CLEANUP, "1")]);
    assert_eq!(code, 1, "{report}");
    let sigterm = line(&report, "SIGTERM");
    assert!(
        sigterm.starts_with("FAIL")
            && sigterm.contains("but left")
            && sigterm.contains("vendor.com_gpu-reg.sock"),
        "{report}"
    );
    assert!(report.ends_with("5 passed, 1 failed\n"), "{report}");
}

fn a_plugin_slower_than_the_kubelets_second_fails_to_register() {
    let (code, report) = check("registry", &[(GET_INFO_DELAY_MS, "1500")]);
    assert_eq!(code, 1, "{report}");
    let registers = line(&report, "registers");
    assert!(
        registers.starts_with("FAIL") && registers.contains("GetInfo timed out after 1s"),
        "{report}"
    );
    assert!(line(&report, "SIGTERM").starts_with("SKIP"), "{report}");
}

fn a_kubelet_sock_plugin_passes_without_registry_steps() {
    let (code, report) = check("kubelet-sock", &[]);
    assert_eq!(code, 0, "{report}");
    assert!(
        line(&report, "registers").contains("DevicePlugin vendor.com/gpu on kubelet.sock"),
        "{report}"
    );
    assert!(line(&report, "GetInfo within 1 s").starts_with("SKIP"), "{report}");
    assert!(line(&report, "kubelet restart").starts_with("PASS"), "{report}");
    assert!(report.ends_with("4 passed, 0 failed\n"), "{report}");
}

fn a_plugin_that_does_not_register_again_after_a_restart_fails() {
    let (code, report) = check("kubelet-sock", &[(NO_REREGISTER, "1")]);
    assert_eq!(code, 1, "{report}");
    let restart = line(&report, "kubelet restart");
    assert!(restart.starts_with("FAIL") && restart.contains("not registered again"), "{report}");
}

fn the_report_is_also_json_and_junit_for_a_ci() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("kpm-check.xml");
    let options = [OsStr::new("-o"), OsStr::new("json"), OsStr::new("--junit"), junit.as_os_str()];
    let (code, report) = check_with(&options, "registry", &[(NO_CLEANUP, "1")]);
    assert_eq!(code, 1, "{report}");

    let json: serde_json::Value = serde_json::from_str(&report).unwrap();
    let results: Vec<(&str, &str)> = json["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|step| (step["step"].as_str().unwrap(), step["result"].as_str().unwrap()))
        .collect();
    assert_eq!(
        results,
        [
            ("registers", "passed"),
            ("GetInfo within 1 s", "passed"),
            ("type checks", "passed"),
            ("kubelet minors", "skipped"),
            ("socket names", "passed"),
            ("kubelet restart", "passed"),
            ("SIGTERM", "failed"),
        ],
        "{report}"
    );
    assert!(json["steps"][6]["detail"].as_str().unwrap().contains("but left"), "{report}");
    assert_eq!(
        (&json["passed"], &json["failed"], &json["skipped"]),
        (&5.into(), &1.into(), &1.into())
    );
    assert!(json["kept"].is_null(), "{report}");

    let xml = std::fs::read_to_string(&junit).unwrap();
    let junit = quick_junit::Report::deserialize_from_str(&xml).unwrap();
    assert_eq!((junit.tests, junit.failures, junit.errors), (7, 1, 0), "{xml}");
    let cases = &junit.test_suites[0].test_cases;
    let names: Vec<&str> = cases.iter().map(|case| case.name.as_str()).collect();
    assert_eq!(names, results.iter().map(|(step, _)| *step).collect::<Vec<_>>(), "{xml}");
    match &cases[6].status {
        quick_junit::TestCaseStatus::NonSuccess {
            kind: quick_junit::NonSuccessKind::Failure,
            message: Some(message),
            ..
        } => assert!(message.contains("vendor.com_gpu-reg.sock"), "{xml}"),
        other => panic!("SIGTERM is {other:?}: {xml}"),
    }
    let registers = cases[0].system_out.as_deref().unwrap_or_default();
    assert!(registers.contains("DevicePlugin vendor.com/gpu"), "{xml}");
}

/// Each kubelet minor's rule on the services a DRA driver offers, as the
/// doctor judges them: kpm-registrar's default (v1 and v1beta1) is served
/// by every minor from 1.32; `v1.DRAPlugin` alone breaks on 1.32 and 1.33.
fn a_dra_driver_is_held_against_every_kubelet_minor() {
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
}

// === The plugin ===

fn plugin(role: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let set = |name: &str| std::env::var_os(name).is_some();
    runtime.block_on(async {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        let (plugin, _devices) =
            StubDevicePlugin::new([("gpu-0", "Healthy"), ("gpu-1", "Healthy")]);
        match role {
            "registry" => {
                let delay = std::env::var(GET_INFO_DELAY_MS).map_or(0, |ms| ms.parse().unwrap());
                let registrar = Registrar::builder(kpm::api::DEVICE_PLUGIN, GPU)
                    .socket_dir(PathBuf::from(std::env::var("KPM_CHECK_REGISTRY").unwrap()))
                    .routes(plugin.routes())
                    .get_info_delay(Duration::from_millis(delay))
                    .serve()
                    .await
                    .unwrap();
                terminate.recv().await;
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
                    kpm_registrar::serve_device_plugin(
                        &dir,
                        "gpu.sock",
                        GPU,
                        plugin.routes(),
                        stop,
                    )
                    .await
                    .unwrap();
                    return;
                }
                // Once, when kubelet.sock first appears. Serving it, kpm
                // empties the directory: a socket bound in that moment is
                // gone, and the registration fails; then once more.
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
                    match kpm_registrar::register_device_plugin(&dir, "gpu.sock", GPU, timeout)
                        .await
                    {
                        Ok(()) => break,
                        Err(err) if attempt < 3 => {
                            eprintln!("registering failed, once more: {err}");
                            server.abort();
                        }
                        Err(err) => panic!("registering failed: {err}"),
                    }
                }
                stop.await;
                let _ = std::fs::remove_file(dir.join("gpu.sock"));
            }
            "dra" => {
                let builder = Registrar::builder(kpm::api::DRA_PLUGIN, "gpu.example.com")
                    .socket_dir(PathBuf::from(std::env::var("KPM_CHECK_REGISTRY").unwrap()))
                    .routes(kpm_registrar::stub::StubDraDriver.routes());
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
