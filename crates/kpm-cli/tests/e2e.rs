//! End to end: the `kpm` binary as a real process on a temp root dir, real
//! plugins (kpm-registrar) registering through the real watcher, and `kpm list`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use kpm_registrar::Registrar;
use kpm_test_support::DEADLINE;
use kpm_test_support::{http, prometheus};
use support::{Kpm, kpm, wait_until};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
}

/// Serves a plugin's registration socket in `kpm`'s registry, with the
/// default versions of its type.
fn serve_plugin(
    rt: &tokio::runtime::Runtime,
    kpm: &Kpm,
    plugin_type: &str,
    name: &str,
) -> Registrar {
    let builder = Registrar::builder(plugin_type, name).socket_dir(kpm.registry());
    // A device plugin is connected to at registration: serve its service too.
    let builder = if plugin_type == kpm_registrar::DEVICE_PLUGIN {
        builder.routes(support::device_plugin(&[("dev-0", "Healthy")]))
    } else {
        builder
    };
    rt.block_on(builder.serve()).unwrap()
}

#[test]
fn a_plugin_registers_re_registers_and_deregisters_through_the_binary() {
    let root = tempfile::tempdir().unwrap();
    let kpm = Kpm::start(root.path());
    let rt = runtime();

    let plugin = serve_plugin(&rt, &kpm, kpm_registrar::DEVICE_PLUGIN, "vendor.com/gpu");
    let status = rt.block_on(plugin.wait_for_status(DEADLINE)).unwrap();
    assert!(status.plugin_registered, "{status:?}");
    let socket = plugin.socket_path().display().to_string();

    // The plugin is told before it is recorded as registered.
    wait_until("the plugin is listed as registered", || {
        kpm.plugins().first().is_some_and(|p| p["state"] == "registered")
    });
    let plugins = kpm.plugins();
    assert_eq!(plugins.len(), 1, "{plugins:?}");
    let listed = &plugins[0];
    assert_eq!(listed["socket_path"], socket.as_str());
    assert_eq!(listed["state"], "registered");
    assert_eq!(listed["type"], "DevicePlugin");
    assert_eq!(listed["name"], "vendor.com/gpu");
    assert_eq!(listed["endpoint"], socket.as_str());
    assert_eq!(listed["versions"], serde_json::json!(["v1beta1"]));
    assert!(listed["last_error"].is_null());
    assert!(listed["registered_at"].as_str().unwrap().ends_with('Z'));
    // Without --kubeconfig (or a pod's service account) kpm publishes nothing.
    let list = kpm.list().unwrap();
    assert!(list.as_object().unwrap().contains_key("kubernetes"), "{list}");
    assert!(list["kubernetes"].is_null(), "{list}");
    let first_generation = listed["generation"].as_u64().unwrap();

    // The plugin restarts: its socket is re-created, so it registers again.
    rt.block_on(plugin.shutdown()).unwrap();
    let plugin = serve_plugin(&rt, &kpm, kpm_registrar::DEVICE_PLUGIN, "vendor.com/gpu");
    assert!(rt.block_on(plugin.wait_for_status(DEADLINE)).unwrap().plugin_registered);
    wait_until("the new incarnation is listed as registered", || {
        let plugins = kpm.plugins();
        plugins.len() == 1
            && plugins[0]["state"] == "registered"
            && plugins[0]["generation"].as_u64().unwrap() > first_generation
    });

    // The socket goes: the plugin leaves the list.
    rt.block_on(plugin.shutdown()).unwrap();
    wait_until("the plugin is gone from the list", || kpm.plugins().is_empty());

    let (status, logs) = kpm.terminate();
    assert!(status.success(), "{status:?}\n{logs}");
    assert!(!root.path().join("kpm.sock").exists(), "kpm removes its status socket");
    assert!(logs.contains("plugin registered") && logs.contains("plugin deregistered"), "{logs}");
}

#[test]
fn a_plugin_of_an_unknown_type_is_told_why_it_was_rejected() {
    let root = tempfile::tempdir().unwrap();
    let kpm = Kpm::start(root.path());
    let rt = runtime();
    let plugin = serve_plugin(&rt, &kpm, "FancyPlugin", "fancy.example.com");
    let status = rt.block_on(plugin.wait_for_status(DEADLINE)).unwrap();
    assert!(!status.plugin_registered);
    assert!(
        status.error.contains("no handler registered for plugin type: FancyPlugin"),
        "{}",
        status.error
    );
    wait_until("the socket is listed as failed", || {
        let plugins = kpm.plugins();
        plugins.len() == 1
            && plugins[0]["state"] == "failed"
            && plugins[0]["last_error"].as_str().unwrap().contains("FancyPlugin")
    });
}

#[test]
fn a_second_kpm_on_the_same_root_fails_naming_the_socket_in_use() {
    let root = tempfile::tempdir().unwrap();
    let _first = Kpm::start(root.path());
    let second = kpm(&["run", "--root-dir", root.path().to_str().unwrap()]);
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    let error_lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("kpm: error:")).collect();
    assert_eq!(error_lines.len(), 1, "{stderr}");
    // The first of its sockets it finds taken (kubelet.sock or kpm.sock) is named.
    let line = error_lines[0];
    assert!(line.contains(root.path().to_str().unwrap()) && line.contains(".sock"), "{stderr}");
    assert!(line.contains("in use") || line.contains("live process"), "{stderr}");
}

#[test]
fn an_unusable_root_dir_fails_with_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let root = file.join("root");
    let out = kpm(&["run", "--root-dir", root.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("kpm: error:") && stderr.contains(root.to_str().unwrap()), "{stderr}");
}

#[test]
fn usage_errors_exit_with_2_and_list_without_a_server_exits_with_1() {
    assert_eq!(kpm(&["run", "--no-such-flag"]).status.code(), Some(2));
    assert_eq!(kpm(&["list", "-o", "yaml"]).status.code(), Some(2));
    let dir = tempfile::tempdir().unwrap();
    let out = kpm(&["list", "--root-dir", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("kpm.sock") && stderr.contains("is `kpm run` running?"), "{stderr}");
}

#[test]
fn watch_streams_events_as_json_lines() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let root = tempfile::tempdir().unwrap();
    let kpm = Kpm::start(root.path());
    let mut watch = Command::new(support::KPM)
        .args(["watch", "-o", "json", "--root-dir", root.path().to_str().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel::<serde_json::Value>();
    let stdout = BufReader::new(watch.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if lines_tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                break;
            }
        }
    });
    let next_event = |kind: &str| loop {
        let event = lines.recv_timeout(DEADLINE).expect("an event before the deadline");
        if event["event"] == kind {
            return event;
        }
    };

    // Nothing is missed once the stream says it is subscribed.
    next_event("subscribed");
    let rt = runtime();
    let plugin = serve_plugin(&rt, &kpm, kpm_registrar::DEVICE_PLUGIN, "vendor.com/watched");
    let registered = next_event("registered");
    assert_eq!(registered["name"], "vendor.com/watched");
    assert_eq!(registered["type"], "DevicePlugin");
    assert_eq!(registered["socket"], plugin.socket_path().display().to_string());
    assert!(registered["time"].as_str().unwrap().ends_with('Z'));

    rt.block_on(plugin.shutdown()).unwrap();
    let deregistered = next_event("deregistered");
    assert_eq!(deregistered["name"], "vendor.com/watched");
    assert_eq!(deregistered["generation"], registered["generation"]);
    watch.kill().unwrap();
    watch.wait().unwrap();
}

#[test]
fn demo_runs_every_scene_and_exits_cleanly() {
    let out = kpm(&["demo"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for expected in [
        "plugin example.com/gpu was told: registered",
        "plugin csi.example.com was told: registered",
        "plugin gpu.example.com was told: registered",
        "example.com/gpu: 1/2 devices healthy",
        "deregistered CSIPlugin csi.example.com",
        "==> done",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
}

#[test]
fn metrics_are_served_as_prometheus_text_with_the_expected_series() {
    let addr = kpm_test_support::free_local_addr();
    let root = tempfile::tempdir().unwrap();
    let kpm = Kpm::start_with(root.path(), &["--metrics-addr", &addr]);
    let rt = runtime();
    let plugin = serve_plugin(&rt, &kpm, kpm_registrar::DEVICE_PLUGIN, "vendor.com/gpu");
    assert!(rt.block_on(plugin.wait_for_status(DEADLINE)).unwrap().plugin_registered);
    let socket = plugin.socket_path().display().to_string();

    let mut samples = std::collections::HashMap::new();
    // The counters count as events are published; the latency histogram
    // as its own subscriber receives them, a moment later.
    wait_until("the registration is counted and timed", || {
        samples = prometheus::scrape(&addr);
        samples.get("kpm_registrations_total{type=\"DevicePlugin\"}") == Some(&1.0)
            && samples.get("kpm_registration_latency_seconds_count") == Some(&1.0)
    });
    for state in ["desired_state_of_world", "actual_state_of_world"] {
        let series =
            format!("plugin_manager_total_plugins{{socket_path=\"{socket}\",state=\"{state}\"}}");
        assert_eq!(samples.get(&series), Some(&1.0), "{series} in {samples:?}");
    }
    assert_eq!(samples.get("kpm_registration_latency_seconds_count"), Some(&1.0));
    assert!(
        samples.contains_key("kpm_backoff_skips_total")
            && samples.contains_key("kpm_watcher_rescans_total")
    );
    // One socket: at most one executor entry; the runtime has tasks alive.
    assert!(samples.get("kpm_operations").is_some_and(|n| *n <= 1.0), "{samples:?}");
    assert!(samples.get("kpm_tokio_tasks").is_some_and(|n| *n >= 1.0), "{samples:?}");
    // jemalloc's statistics: a live heap, within what the allocator holds.
    let heap = |name: &str| samples.get(name).copied().unwrap_or_default();
    let (allocated, resident) = (heap("kpm_heap_allocated_bytes"), heap("kpm_heap_resident_bytes"));
    assert!(allocated > 0.0 && allocated <= resident, "{samples:?}");
    assert!(allocated <= heap("kpm_heap_active_bytes") && heap("kpm_heap_metadata_bytes") > 0.0);
    assert!(heap("kpm_heap_active_bytes") <= heap("kpm_heap_mapped_bytes"), "{samples:?}");
    assert!(samples.contains_key("kpm_heap_retained_bytes"), "{samples:?}");
    // Freed pages kept, by arena.
    assert!(samples.keys().any(|series| series.starts_with("kpm_heap_dirty_bytes{arena=")));
    assert!(samples.keys().any(|series| series.starts_with("kpm_heap_muzzy_bytes{arena=")));
    wait_until("the device is counted", || {
        let samples = prometheus::scrape(&addr);
        samples.get("kpm_device_plugin_devices{resource=\"vendor.com/gpu\",health=\"healthy\"}")
            == Some(&1.0)
    });
    // Not publishing to an API server: no kpm_kube_* series.
    let samples = prometheus::scrape(&addr);
    assert!(!samples.keys().any(|series| series.starts_with("kpm_kube_")), "{samples:?}");
    assert_eq!(http::get(&addr, "/healthz"), "ok");
}

#[test]
fn own_files_are_restricted_and_the_status_api_is_read_only() {
    use std::os::unix::fs::PermissionsExt;

    let root = tempfile::tempdir().unwrap();
    let kpm = Kpm::start(root.path());
    let mode =
        |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let status_socket = root.path().join("kpm.sock");
    let kubelet_socket = kpm.kubelet_sock();
    assert_eq!(mode(&status_socket), 0o600);
    assert_eq!(mode(&kubelet_socket), 0o600);
    // Created by kpm: at most 0750 (less the umask).
    for dir in [kpm.registry(), root.path().join("device-plugins")] {
        assert_eq!(mode(&dir) & !0o750, 0, "{}: {:o}", dir.display(), mode(&dir));
    }

    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        let mut stream = std::os::unix::net::UnixStream::connect(&status_socket).unwrap();
        let answer = http::request(&mut stream, method, "/v1/plugins", "").unwrap();
        assert_eq!(answer.code, 405, "{method}: {answer:?}");
    }
    assert!(kpm.list().is_some(), "still serving");
}
