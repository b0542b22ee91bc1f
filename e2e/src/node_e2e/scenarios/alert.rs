//! `alert`: a real Prometheus (Debian's) scrapes the doctor's pod with
//! `deploy/doctor/alerts.yaml` loaded, and the registrar of `csi-driver` is
//! killed whenever it comes back, until `KubeletPluginFailing` fires.

use std::fs;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::super::node::Node;
use super::super::{Env, NODE_NAME};
use super::breakage::{kill_program, registrar_restarts};
use super::doctor::{DOCTOR_SELECTOR, NAMESPACE};
use super::secs;
use crate::command::Result;
use crate::scenario::{Process, wait_until};

/// The alert a failing plugin fires, and the `for:` it waits (the rules'
/// own, read from the file).
const ALERT: &str = "KubeletPluginFailing";
/// Where Prometheus serves, in the node's network namespace.
const PROMETHEUS: &str = "127.0.0.1:9090";
/// The rules' `for:` and the kubelet's back-off between the last kills.
const FIRE_TIMEOUT: Duration = Duration::from_secs(6 * 60);

/// Prometheus with the shipped rules, scraping the doctor as the rules'
/// header says (job `kpm-doctor`, a `node` label); then the registrar
/// killed at each restart until the alert fires.
pub(super) fn alert_fires(env: &Env, node: &mut Node) -> Result<String> {
    let pod = node.pod(NAMESPACE, DOCTOR_SELECTOR)?;
    let pod_ip = pod["status"]["podIP"].as_str().ok_or("no doctor pod IP")?.to_owned();
    let dir = env.out.join("prometheus");
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    let rules = env.root.join("deploy/doctor/alerts.yaml");
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [{rules}]\n\
         scrape_configs:\n  - job_name: kpm-doctor\n    static_configs:\n      \
         - targets: ['{pod_ip}:9465']\n        labels: {{node: {NODE_NAME}}}\n",
        rules = rules.display()
    );
    fs::write(dir.join("prometheus.yml"), config)?;
    let _prometheus = Process::spawn(
        "prometheus",
        std::path::Path::new("prometheus"),
        &[
            &format!("--config.file={}", dir.join("prometheus.yml").display()),
            &format!("--storage.tsdb.path={}", dir.join("data").display()),
            &format!("--web.listen-address={PROMETHEUS}"),
        ],
        &env.out.join("prometheus.out"),
        &env.out.join("prometheus.log"),
    )?;
    wait_until("Prometheus scraping the doctor", Duration::from_secs(60), || {
        // Refused until Prometheus listens.
        let up = query("up{job=\"kpm-doctor\"}").unwrap_or_default();
        Ok(up.iter().any(|sample| sample["value"][1] == "1"))
    })?;
    if alert_state()?.is_some() {
        return Err(format!("{ALERT} is already pending or firing before the kill").into());
    }

    let started = Instant::now();
    let mut kills = 0;
    let mut restarts = registrar_restarts(node)?;
    loop {
        if alert_state()?.as_deref() == Some("firing") {
            break;
        }
        if started.elapsed() > FIRE_TIMEOUT {
            return Err(format!(
                "{ALERT} did not fire within {FIRE_TIMEOUT:?} of the first kill ({kills} kills)"
            )
            .into());
        }
        // Killed whenever the kubelet brings it back: it stays failing.
        let now = registrar_restarts(node)?;
        if (kills == 0 || now > restarts) && kill_program("node-driver-registrar").is_ok() {
            kills += 1;
            restarts = now;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(format!(
        "{ALERT} firing {} after the first of {kills} kills of the registrar",
        secs(started.elapsed())
    ))
}

/// The state of [`ALERT`] for the node, if pending or firing.
fn alert_state() -> Result<Option<String>> {
    let mut response = ureq::get(&format!("http://{PROMETHEUS}/api/v1/alerts")).call()?;
    let body: Value = serde_json::from_str(&response.body_mut().read_to_string()?)?;
    Ok(body["data"]["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|alert| alert["labels"]["alertname"] == ALERT && alert["labels"]["node"] == NODE_NAME)
        .and_then(|alert| alert["state"].as_str().map(str::to_owned)))
}

/// The samples of an instant query.
fn query(expr: &str) -> Result<Vec<Value>> {
    let mut response =
        ureq::get(&format!("http://{PROMETHEUS}/api/v1/query")).query("query", expr).call()?;
    let body: Value = serde_json::from_str(&response.body_mut().read_to_string()?)?;
    Ok(body["data"]["result"].as_array().cloned().unwrap_or_default())
}
