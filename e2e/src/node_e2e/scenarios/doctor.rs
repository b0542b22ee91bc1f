//! `doctor`: the doctor's DaemonSet as a user applies it, beside the real
//! kubelet and the CSI driver of `csi-driver`.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::super::node::{Node, condition};
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::{namespace_and_image, overlay, secs};
use crate::command::Result;
use crate::scenario::wait_for;

/// The namespace the scenarios' overlays put kpm in: not the base's, so
/// that the overlay's namespace is checked to move everything.
pub(in super::super) const NAMESPACE: &str = "kpm-system";
pub(super) const DOCTOR_SELECTOR: &str = "app.kubernetes.io/name=kpm-doctor";
const DOCTOR_USER: &str = "system:serviceaccount:kpm-system:kpm-doctor";
/// The doctor's condition on the Node.
pub(super) const CONDITION: &str = "KubeletPluginsHealthy";

/// `deploy/doctor` with an overlay that sets the namespace and the image
/// and nothing else: the pod runs, judges the node healthy and says so on
/// the Node, serves its metrics, names host paths, and none of its requests
/// is refused.
pub(super) fn doctor_daemonset(env: &Env, node: &mut Node) -> Result<String> {
    let overlay = overlay(
        env,
        "doctor",
        &format!("resources:\n  - @DEPLOY@/doctor\n{}", namespace_and_image()?),
    )?;
    let audit_from = std::fs::metadata(&node.audit_log).map_or(0, |meta| meta.len());
    // As a user would: the namespace first, then the overlay.
    node.kubectl(&["create", "namespace", NAMESPACE])?;
    let applied = Instant::now();
    node.kubectl(&["apply", "-k", &overlay.display().to_string()])?;
    let ready = node.wait_pods_ready(NAMESPACE, DOCTOR_SELECTOR)?;
    let healthy =
        wait_for(&format!("{CONDITION}=True on Node {NODE_NAME}"), START_TIMEOUT, || {
            let node = node.api.get(&format!("/api/v1/nodes/{NODE_NAME}"))?;
            Ok((condition(&node, CONDITION) == Some("True")).then(Instant::now))
        })?;

    let (reported, typed, table) = plugin_report(node)?;

    let pod = node.pod(NAMESPACE, DOCTOR_SELECTOR)?;
    let pod_name = pod["metadata"]["name"].as_str().ok_or("doctor pod without a name")?;
    let pod_ip = pod["status"]["podIP"].as_str().ok_or("doctor pod without an IP")?;
    for path in ["/healthz", "/metrics"] {
        let url = format!("http://{pod_ip}:9465{path}");
        let code = ureq::get(&url).call().map(|response| response.status().as_u16())?;
        if code != 200 {
            return Err(format!("GET {url}: {code}").into());
        }
    }

    // What an operator reads names paths of the node, never the pod's
    // view of them under /host.
    let report = node.kubectl(&doctor_in_pod(pod_name));
    let report: Value = match report {
        Ok(text) => serde_json::from_str(&text)?,
        // Exit 1 (a plugin failing) still prints the report.
        Err(err) => return Err(format!("kpm doctor in the pod: {err}").into()),
    };
    let logs = node.kubectl(&["logs", "-n", NAMESPACE, pod_name])?;
    let message = node.api.get(&format!("/api/v1/nodes/{NODE_NAME}"))?;
    for (what, text) in [
        ("the report", report.to_string()),
        ("the log", logs),
        ("the Node's conditions", message["status"]["conditions"].to_string()),
        ("the KubeletPluginReport", table.clone()),
    ] {
        let inside: Vec<&str> =
            text.lines().filter(|line| line.contains("/host/")).take(3).collect();
        if !inside.is_empty() {
            return Err(format!("{what} names paths under /host: {}", inside.join(" | ")).into());
        }
    }
    // The typed report and a look of its own in the pod see the same
    // sockets.
    let rows = report["plugins"].as_array().map_or(0, Vec::len);
    if typed["status"]["counts"]["plugins"] != rows {
        return Err(format!(
            "the KubeletPluginReport counts {} plugin sockets, kpm doctor in the pod {rows}",
            typed["status"]["counts"]["plugins"]
        )
        .into());
    }
    let kubelet_root = node.kubelet_root.display().to_string();
    if !report.to_string().contains(&kubelet_root) {
        return Err(format!("the doctor's report does not name {kubelet_root}: {report}").into());
    }

    let refused = refused_requests(node, DOCTOR_USER, audit_from)?;
    if !refused.is_empty() {
        return Err(format!("requests of {DOCTOR_USER} refused: {}", refused.join(", ")).into());
    }
    Ok(format!(
        "pod ready {} after apply -k, {CONDITION}=True {} after that, its KubeletPluginReport Healthy {} after that; /metrics and /healthz served; no request refused",
        secs(ready - applied),
        secs(healthy - ready),
        secs(reported.saturating_duration_since(healthy)),
    ))
}

/// Waits for the doctor's `KubeletPluginReport` of the node to say
/// `Healthy` with the kubelet's version from the Node, owned by the Node,
/// and returns when it did, the report, and the report as `kubectl get -o
/// yaml` prints it; `kubectl get kubeletpluginreports` goes to the log.
fn plugin_report(node: &Node) -> Result<(Instant, Value, String)> {
    // A doctor that met the CRD before it was established tries again
    // after 2 minutes.
    let timeout = START_TIMEOUT + Duration::from_secs(120);
    let what = format!("KubeletPluginReport {NODE_NAME} Healthy");
    let (reported, report) = wait_for(&what, timeout, || {
        let report = crate::kube_e2e::api::report(&node.api, NODE_NAME)?;
        Ok(report
            .filter(|r| r["status"]["health"] == "Healthy")
            .map(|report| (Instant::now(), report)))
    })?;
    let object = node.api.get(&format!("/api/v1/nodes/{NODE_NAME}"))?;
    let version = &object["status"]["nodeInfo"]["kubeletVersion"];
    if report["status"]["kubelet"]["version"] != *version {
        return Err(format!("the report's kubelet is not the Node's {version}: {report}").into());
    }
    let owner = &report["metadata"]["ownerReferences"][0];
    if owner["kind"] != "Node" || owner["uid"] != object["metadata"]["uid"] {
        return Err(format!("the report is not owned by Node {NODE_NAME}: {owner}").into());
    }
    eprintln!(
        "$ kubectl get kubeletpluginreports\n{}",
        node.kubectl(&["get", "kubeletpluginreports"])?
    );
    let yaml = node.kubectl(&["get", "kubeletpluginreport", NODE_NAME, "-o", "yaml"])?;
    Ok((reported, report, yaml))
}

/// The requests of `user` the API server answered with 401 or 403, from
/// byte `from` of its audit log.
pub(super) fn refused_requests(node: &Node, user: &str, from: u64) -> Result<Vec<String>> {
    let text = std::fs::read(&node.audit_log)?;
    let from = usize::try_from(from)?.min(text.len());
    let mut refused = Vec::new();
    for line in String::from_utf8_lossy(&text[from..]).lines() {
        let Ok(entry) = serde_json::from_str::<Value>(line) else { continue };
        let code = entry["responseStatus"]["code"].as_u64().unwrap_or_default();
        if entry["user"]["username"] == user && matches!(code, 401 | 403) {
            refused.push(format!("{} {} ({code})", entry["verb"], entry["requestURI"]));
        }
    }
    Ok(refused)
}

/// The status and reason of the doctor's condition on the Node.
pub(super) fn node_condition(node: &Node) -> Result<Option<(String, String)>> {
    let object = node.api.get(&format!("/api/v1/nodes/{NODE_NAME}"))?;
    let found = object["status"]["conditions"]
        .as_array()
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == CONDITION))
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
            )
        });
    Ok(found)
}

/// The Events about the Node.
pub(super) fn node_events(node: &Node) -> Result<Vec<Value>> {
    let list = node.api.get("/apis/events.k8s.io/v1/events")?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|event| {
            event["regarding"]["kind"] == "Node" && event["regarding"]["name"] == NODE_NAME
        })
        .cloned()
        .collect())
}

/// The `kubectl` arguments that run `kpm doctor -o json` in the doctor's
/// pod `pod`, on the host as the pod sees it, as an operator runs it.
pub(super) fn doctor_in_pod(pod: &str) -> [&str; 11] {
    ["exec", "-n", NAMESPACE, pod, "--", "kpm", "doctor", "--host-root", "/host", "-o", "json"]
}

/// Waits until the doctor's DaemonSet has rolled out: one pod, ready.
pub(super) fn one_doctor_pod(node: &Node) -> Result {
    wait_for("the doctor's rollout", START_TIMEOUT, || {
        let pods = node.pods(NAMESPACE, DOCTOR_SELECTOR)?;
        let ready = pods.iter().all(|pod| condition(pod, "Ready") == Some("True"));
        Ok((pods.len() == 1 && ready).then_some(()))
    })
}

/// `kpm doctor -o json` in the doctor's pod: its exit code and report.
pub(super) fn doctor_report(node: &Node) -> Result<(i32, Value)> {
    let pod = node.pod(NAMESPACE, DOCTOR_SELECTOR)?;
    let name = pod["metadata"]["name"].as_str().ok_or("doctor pod without a name")?.to_owned();
    let (code, stdout) = node.kubectl_exit(&doctor_in_pod(&name))?;
    let report = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    Ok((code, report))
}

/// The report's row of plugin `name`.
pub(super) fn row<'a>(report: &'a Value, name: &str) -> Option<&'a Value> {
    report["plugins"].as_array()?.iter().find(|row| row["name"] == name)
}

/// The verdict of plugin `name` in a report.
pub(super) fn verdict(report: &Value, name: &str) -> Option<String> {
    row(report, name).and_then(|row| row["verdict"].as_str()).map(str::to_owned)
}
