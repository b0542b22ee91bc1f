//! File descriptors are a budget: `kpm run` started with 128 open files
//! (soft and hard) while 300 CSI plugins appear at once registers every one
//! of them without telling any `false`, and its status API answers all the
//! while. Before the budget, 192 of the 300 were told `false` with
//! `NodeGetInfo on …: dial …: Too many open files (os error 24)`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use kpm_registrar::stub::StubCsiDriver;
use kpm_registrar::{CSI_PLUGIN, Registrar};
use kpm_test_support::prometheus;
use kpm_test_support::{OwnRuntime, free_local_addr};
use support::{Kpm, wait_until};

const PLUGINS: usize = 300;
const NOFILE: u32 = 128;

#[test]
fn three_hundred_csi_plugins_register_under_128_open_files() {
    // This process serves the 300 plugins: it needs more than kpm is given.
    kpm::transport::fd::raise_soft_limit().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let addr = free_local_addr();
    let kpm = Kpm::start_with_nofile(dir.path(), NOFILE, &["--metrics-addr", &addr]);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", kpm.pid())).unwrap();
    let open_files = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    assert_eq!(
        open_files.split_whitespace().skip(3).take(2).collect::<Vec<_>>(),
        [NOFILE.to_string(), NOFILE.to_string()],
        "{open_files}"
    );

    let registry = kpm.registry();
    let (sent, received) = std::sync::mpsc::channel();
    let started = Instant::now();
    let plugins = OwnRuntime::start(move || async move {
        let mut registrars = Vec::with_capacity(PLUGINS);
        for i in 0..PLUGINS {
            let name = format!("csi-{i}.example.com");
            let driver = StubCsiDriver::new(name.clone(), "node-1").routes();
            let registrar = Registrar::builder(CSI_PLUGIN, name)
                .socket_dir(&registry)
                .routes(driver)
                .serve()
                .await
                .unwrap();
            registrars.push(registrar);
        }
        sent.send(registrars).unwrap();
    });
    let registrars = received.recv().unwrap();

    // The status API answers throughout: every poll is a fresh connection.
    let (mut polls, mut slowest) = (0_u32, Duration::ZERO);
    wait_until("all 300 plugins registered", || {
        let asked = Instant::now();
        let status = kpm.status();
        slowest = slowest.max(asked.elapsed());
        polls += 1;
        if polls % 20 == 0 {
            assert!(kpm.list().is_some(), "kpm list failed:\n{}", kpm.log());
        }
        let plugins = status["plugins"].as_array().unwrap();
        plugins.iter().filter(|p| p["state"] == "registered").count() == PLUGINS
    });
    let took = started.elapsed();
    assert_eq!(kpm.plugins().len(), PLUGINS);

    let told_false: Vec<_> = registrars
        .iter()
        .filter(|r| r.statuses().iter().any(|s| !s.plugin_registered))
        .map(|r| (r.socket_path().display().to_string(), r.statuses()))
        .collect();
    assert!(told_false.is_empty(), "{} told false: {told_false:?}", told_false.len());
    assert!(registrars.iter().all(|r| r.statuses().iter().any(|s| s.plugin_registered)));

    let metrics = prometheus::scrape(&addr);
    let metric = |series: &str| metrics.get(series).copied().unwrap_or_default();
    assert!((metric("kpm_fd_budget{state=\"limit\"}") - f64::from(NOFILE)).abs() < 0.5);
    // The log says why, should an attempt fail or back off after all.
    let log = kpm.log();
    assert!(metric("kpm_rejections_total") < 0.5, "no attempt failed:\n{log}");
    assert!(metric("kpm_retries_scheduled_total") < 0.5, "nothing backed off:\n{log}");
    assert!(!log.contains("Too many open files"), "{log}");
    eprintln!(
        "{PLUGINS} CSI plugins registered under {NOFILE} open files in {took:?}; \
         status API: {polls} polls, slowest {slowest:?}; fd budget {}, permit waits {}, \
         shortage episodes {}, shortage waits {}",
        metric("kpm_fd_budget{state=\"budget\"}"),
        metric("kpm_fd_permit_waits_total"),
        metric("kpm_fd_shortage_total"),
        metric("kpm_fd_shortage_waits_total"),
    );
    drop(kpm);
    drop(registrars);
    plugins.stop();
}
