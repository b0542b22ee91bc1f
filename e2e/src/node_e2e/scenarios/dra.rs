//! `dra`: a DRA driver's kubelet plugin as a pod (the Kubernetes e2e test
//! driver, `manifests/dra-test-driver.yaml`) beside the doctor's DaemonSet
//! of `doctor`: the kubelet registers it, the doctor names it ok, its
//! ResourceSlices appear; then the pod is deleted, and how long the kubelet
//! takes to wipe the driver's ResourceSlices of the node is measured. The
//! kubelets' sources say at once on 1.31 and 1.32, 30 s after the last
//! instance went on 1.33 and later (`docs/kubelet-minors.md`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::super::kubelets;
use super::super::node::Node;
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::doctor::{CONDITION, DOCTOR_SELECTOR, NAMESPACE as DOCTOR_NAMESPACE, node_condition};
use super::{Skipped, secs};
use crate::command::Result;
use crate::scenario::wait_for;

/// The test driver's name (its `--drivername` default).
const DRIVER: &str = "test-driver.cdi.k8s.io";
const NAMESPACE: &str = "dra-test-driver";
const POD: &str = "dra-test-driver";
/// The devices it publishes (its `--num-devices` default).
const DEVICES: usize = 4;
/// The kubelets from 1.33 on wait 30 s before they wipe a gone driver's
/// ResourceSlices; less than this, with the polling's slack, is no wait.
const WIPE_DELAY_FLOOR: Duration = Duration::from_secs(25);
/// How long the wipe may take: the delay and the kubelet's retries, on a
/// loaded machine.
const WIPE_TIMEOUT: Duration = Duration::from_secs(180);

/// What the kubelet answered the driver's registration with, from the
/// driver's log.
#[derive(Debug, PartialEq, Eq)]
enum Registration {
    Registered,
    Refused(String),
}

/// `dra`: see the module.
pub(super) fn dra_driver(_env: &Env, node: &mut Node) -> Result<String> {
    let minor = node.kubelet_minor;
    let audit_from = std::fs::metadata(&node.audit_log).map_or(0, |meta| meta.len());
    node.apply(include_str!("../manifests/dra-test-driver.yaml"))?;
    let registry = node.kubelet_root.join("plugins_registry");
    let (socket, socket_at) =
        wait_for("the DRA driver's registration socket", START_TIMEOUT, || {
            Ok(registration_socket(&registry)?.map(|socket| (socket, Instant::now())))
        })
        .map_err(|err| format!("{err}; the driver's log ends: {}", log_tail(node)))?;
    let (registration, registered_at) = wait_for(
        "the kubelet's NotifyRegistrationStatus in the driver's log",
        START_TIMEOUT,
        || Ok(registration(node).map(|registration| (registration, Instant::now()))),
    )?;
    if let Registration::Refused(why) = registration {
        // What the doctor makes of a driver this kubelet refuses.
        let doctor = doctor_row(node)?.map_or_else(|| "no row".to_owned(), |row| describe(&row));
        node.kubectl(&["delete", "pod", "-n", NAMESPACE, POD, "--wait=false"])?;
        let message =
            format!("the kubelet refused the driver's registration: {why}; the doctor: {doctor}");
        // The 1.31 kubelet takes semantic versions only in GetInfo, where
        // the kubeletplugin helper of 1.32 on sends its gRPC services
        // (`v1.DRAPlugin`, `v1beta1.DRAPlugin`); and its
        // resource.k8s.io/v1alpha3 has no ResourceSlices in the 1.34
        // kube-apiserver it needs.
        if kubelets::dra_api_version(minor) == "v1alpha3" {
            return Err(Skipped(format!(
                "DRA of 1.31 (v1alpha3, semver versions) cannot serve this driver; {message}"
            ))
            .into());
        }
        return Err(message.into());
    }

    let (verdict, doctor_ok_at) = doctor_verdict(node)?;
    let (slices, sliced_at) = wait_for(
        &format!("{DEVICES} devices in {DRIVER}'s ResourceSlices"),
        START_TIMEOUT,
        || {
            let slices = resource_slices(node)?;
            Ok((devices(&slices) == DEVICES).then(|| (slices.len(), Instant::now())))
        },
    )?;

    node.kubectl(&["delete", "pod", "-n", NAMESPACE, POD, "--wait=false"])?;
    let deleted = Instant::now();
    // The driver removes its sockets as it stops: the kubelet's plugin
    // watcher sees it go (1.31–1.33), and its gRPC connection ends (1.34 on).
    let gone_at = wait_for("the DRA driver's registration socket removed", START_TIMEOUT, || {
        Ok((!socket.exists()).then(Instant::now))
    })?;
    let mut conditions: Vec<(String, Duration)> = Vec::new();
    let wiped_at = wait_for(&format!("{DRIVER}'s ResourceSlices wiped"), WIPE_TIMEOUT, || {
        // What the doctor says while the slices outlive their driver.
        if let Some((status, reason)) = node_condition(node)? {
            let seen = format!("{status}/{reason}");
            if conditions.last().is_none_or(|(last, _)| *last != seen) {
                conditions.push((seen, gone_at.elapsed()));
            }
        }
        Ok(resource_slices(node)?.is_empty().then(Instant::now))
    })?;
    let wipe = wiped_at - gone_at;
    // The doctor must agree again once the slices are gone.
    let healthy_at =
        wait_for(&format!("{CONDITION} True once the slices are wiped"), START_TIMEOUT, || {
            Ok(node_condition(node)?.filter(|(status, _)| status == "True").map(|_| Instant::now()))
        })?;
    let by = wipers(node, audit_from)?;
    let expected = if minor.is_none_or(|minor| minor >= 33) {
        if wipe < WIPE_DELAY_FLOOR {
            return Err(format!(
                "{DRIVER}'s ResourceSlices wiped {} after its socket went, by {by}: this kubelet \
                 waits 30 s",
                secs(wipe)
            )
            .into());
        }
        "the 30 s delay"
    } else {
        "this kubelet wipes on deregistration"
    };
    Ok(format!(
        "registered {} after its socket appeared ({verdict} by the doctor {} later), {slices} \
         ResourceSlice(s) with {DEVICES} devices {} after registration; pod deleted: socket gone \
         {} later, slices wiped {} after that by {by} ({expected}); the doctor's condition \
         meanwhile (from the socket's removal) {}, True again {} after the wipe",
        secs(registered_at - socket_at),
        secs(doctor_ok_at.saturating_duration_since(registered_at)),
        secs(sliced_at.saturating_duration_since(registered_at)),
        secs(gone_at - deleted),
        secs(wipe),
        conditions
            .iter()
            .map(|(seen, at)| format!("{seen} at +{}", secs(*at)))
            .collect::<Vec<_>>()
            .join(" → "),
        secs(healthy_at.saturating_duration_since(wiped_at)),
    ))
}

/// The driver's registration socket in the kubelet's `plugins_registry`:
/// `<driver>-reg.sock`, or `<driver>-<uid>-reg.sock` with rolling updates.
fn registration_socket(registry: &std::path::Path) -> Result<Option<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(registry) else { return Ok(None) };
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with(DRIVER) && name.ends_with("-reg.sock") {
            return Ok(Some(registry.join(name)));
        }
    }
    Ok(None)
}

/// The kubelet's NotifyRegistrationStatus as the driver logged it (the
/// helper logs each gRPC call at `-v=6`), once it has.
fn registration(node: &Node) -> Option<Registration> {
    // No log before the container starts.
    let log = node.kubectl(&["logs", "-n", NAMESPACE, POD]).ok()?;
    parse_registration(&log)
}

/// The registration status in the driver's `log`, if there is one.
fn parse_registration(log: &str) -> Option<Registration> {
    let calls = log.lines().filter(|line| line.contains("NotifyRegistrationStatus"));
    for line in calls {
        if line.contains("PluginRegistered:true") || line.contains("plugin_registered:true") {
            return Some(Registration::Registered);
        }
        if line.contains("failed registration process") {
            // The error's text, up to the end of its quoted value.
            let why = line.split("failed registration process: ").nth(1).unwrap_or(line);
            let end = why
                .char_indices()
                .find(|(at, c)| *c == '"' && !why[..*at].ends_with('\\'))
                .map_or(why.len(), |(at, _)| at);
            let why = why[..end].replace("\\\"", "\"");
            return Some(Registration::Refused(why.chars().take(400).collect()));
        }
    }
    None
}

/// The last lines of the driver's log (of its last run, if it crashed).
fn log_tail(node: &Node) -> String {
    let log = node
        .kubectl(&["logs", "-n", NAMESPACE, POD, "--previous"])
        .or_else(|_| node.kubectl(&["logs", "-n", NAMESPACE, POD]))
        .unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(2)..].join(" | ")
}

/// The doctor's verdict on the driver, from `kpm doctor` in its pod, once
/// it is `ok`; when it did.
fn doctor_verdict(node: &Node) -> Result<(String, Instant)> {
    let mut last = String::from("no row");
    let found = wait_for(&format!("the doctor's verdict ok on {DRIVER}"), START_TIMEOUT, || {
        let Some(row) = doctor_row(node)? else { return Ok(None) };
        last = describe(&row);
        Ok((row["verdict"] == "ok" && row["type"] == "DRAPlugin").then(Instant::now))
    });
    match found {
        Ok(at) => Ok(("ok".to_owned(), at)),
        Err(err) => Err(format!("{err}; the doctor's last verdict: {last}").into()),
    }
}

/// The driver's row in the report of `kpm doctor` in the doctor's pod, if
/// it has one.
fn doctor_row(node: &Node) -> Result<Option<Value>> {
    let pod = node.pod(DOCTOR_NAMESPACE, DOCTOR_SELECTOR)?;
    let pod = pod["metadata"]["name"].as_str().ok_or("doctor pod without a name")?;
    // Exit 1 (a plugin failing) still prints the report.
    let text = node.kubectl_stdout(&super::doctor::doctor_in_pod(pod))?;
    let Ok(report) = serde_json::from_str::<Value>(&text) else { return Ok(None) };
    let row = report["plugins"].as_array().into_iter().flatten().find(|row| row["name"] == DRIVER);
    Ok(row.cloned())
}

/// A doctor's row in a line: `ok (DRAPlugin): …`.
fn describe(row: &Value) -> String {
    format!(
        "{} ({}): {}",
        row["verdict"].as_str().unwrap_or("?"),
        row["type"].as_str().unwrap_or("?"),
        row["reason"].as_str().unwrap_or_default()
    )
}

/// The driver's ResourceSlices of the node, in the API's `v1`.
fn resource_slices(node: &Node) -> Result<Vec<Value>> {
    let path = format!(
        "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={NODE_NAME},spec.driver={DRIVER}"
    );
    Ok(node.api.get(&path)?["items"].as_array().cloned().unwrap_or_default())
}

/// The devices of `slices`.
fn devices(slices: &[Value]) -> usize {
    slices.iter().map(|slice| slice["spec"]["devices"].as_array().map_or(0, Vec::len)).sum()
}

/// Who deleted ResourceSlices since byte `from` of the API server's audit
/// log, and how: `system:node:kpm-node (deletecollection)`.
fn wipers(node: &Node, from: u64) -> Result<String> {
    let text = std::fs::read(&node.audit_log)?;
    let from = usize::try_from(from)?.min(text.len());
    let mut who: Vec<String> = Vec::new();
    for line in String::from_utf8_lossy(&text[from..]).lines() {
        let Ok(entry) = serde_json::from_str::<Value>(line) else { continue };
        let deletes = matches!(entry["verb"].as_str(), Some("delete" | "deletecollection"));
        if deletes && entry["objectRef"]["resource"] == "resourceslices" {
            let code = entry["responseStatus"]["code"].as_u64().unwrap_or_default();
            let one = format!(
                "{} ({} {}, {code})",
                entry["user"]["username"].as_str().unwrap_or("?"),
                entry["verb"].as_str().unwrap_or("?"),
                entry["objectRef"]["apiVersion"].as_str().unwrap_or("?"),
            );
            if !who.contains(&one) {
                who.push(one);
            }
        }
    }
    Ok(if who.is_empty() { "nobody in the audit log".to_owned() } else { who.join(", ") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registration_status_is_read_from_the_drivers_log() {
        // As the 1.36 kubeletplugin helper logs them at -v=6 (from a 1.31
        // kubelet's refusal and a 1.36 kubelet's acceptance).
        let refused = r#"I1127 22:34:52.031154 1 nonblockinggrpcserver.go:150] "handling request" logger="registrar" requestID=4 method="/pluginregistration.Registration/NotifyRegistrationStatus" request="error:\"RegisterPlugin error -- plugin validation failed\""
E1127 22:34:52.031410 1 nonblockinggrpcserver.go:159] "handling request failed" err="failed registration process: RegisterPlugin error -- reported: illegal version string \"v1.DRAPlugin\"" logger="registrar" requestID=4 method="/pluginregistration.Registration/NotifyRegistrationStatus""#;
        assert_eq!(
            parse_registration(refused),
            Some(Registration::Refused(
                r#"RegisterPlugin error -- reported: illegal version string "v1.DRAPlugin""#
                    .to_owned()
            ))
        );
        let registered = r#"I1127 22:10:23.1 1 nonblockinggrpcserver.go:150] "handling request" logger="registrar" requestID=2 method="/pluginregistration.Registration/NotifyRegistrationStatus" request="plugin_registered:true""#;
        assert_eq!(parse_registration(registered), Some(Registration::Registered));
        assert_eq!(parse_registration("I1127 \"Starting\""), None);
    }
}
