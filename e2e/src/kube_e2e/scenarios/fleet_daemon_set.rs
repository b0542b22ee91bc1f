//! The `fleet` scenario's last step: a CSI driver registered on one node
//! and not on another whose taint its DaemonSet's pods do not tolerate.
//! `kpm doctor --cluster`, run as a user bound to the fleet reader's
//! `ClusterRole` of `deploy/doctor` and nothing else, must name the
//! DaemonSet and the taint, through the real API server's RBAC, watch
//! cache and field selectors.
//!
//! No kubelet runs these pods and no controller makes them: the objects
//! are what a DaemonSet controller and two doctors would have written.

use serde_json::{Value, json};

use super::Cluster;
use crate::command::Result;
use crate::kube_e2e::api::REPORTS;
use crate::kube_e2e::{Env, READER_TOKEN, READER_USER};

const NAMESPACE: &str = "csi-ds";
const DAEMON_SET: &str = "csi-node";
const DRIVER: &str = "ds.csi.example.com";
const ON: &str = "ds-on";
const TAINTED: &str = "ds-tainted";
const TAINT: &str = "dedicated=gpu:NoSchedule";

pub(super) fn daemon_set_named(env: &Env, cluster: &Cluster) -> Result {
    let api = &cluster.api;
    for node in [ON, TAINTED] {
        cluster.create_node(node)?;
    }
    patch(
        api,
        &format!("/api/v1/nodes/{TAINTED}"),
        &json!({"spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}),
    )?;
    api.post("/api/v1/namespaces", &json!({"metadata": {"name": NAMESPACE}}))?;
    // No controller-manager makes the namespace's default service account.
    api.post(
        &format!("/api/v1/namespaces/{NAMESPACE}/serviceaccounts"),
        &json!({"metadata": {"name": "default"}}),
    )?;
    let labels = json!({"app": DAEMON_SET});
    let pod_spec = json!({
        "automountServiceAccountToken": false,
        "containers": [{"name": "node-driver-registrar", "image": "registrar:e2e"}],
    });
    let daemon_set = api.post(
        &format!("/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets"),
        &json!({
            "metadata": {"name": DAEMON_SET},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
        }),
    )?;
    let uid = daemon_set["metadata"]["uid"].as_str().ok_or("a DaemonSet without a uid")?;
    let mut on_node = pod_spec.clone();
    on_node["nodeName"] = ON.into();
    let pod = api.post(
        &format!("/api/v1/namespaces/{NAMESPACE}/pods"),
        &json!({
            "metadata": {"name": "csi-node-on", "labels": labels, "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "DaemonSet", "name": DAEMON_SET, "uid": uid,
                "controller": true}]},
            "spec": on_node,
        }),
    )?;
    let pod_uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let served = json!({"namespace": NAMESPACE, "pod": "csi-node-on", "uid": pod_uid,
                        "container": "node-driver-registrar", "restarts": 0, "state": "Running"});
    report(api, ON, Some(served))?;
    report(api, TAINTED, None)?;
    // The reader, bound to the fleet reader's ClusterRole alone.
    api.post(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        &json!({
            "metadata": {"name": "kpm-e2e-fleet-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "kpm-doctor-fleet-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": READER_USER}],
        }),
    )?;
    let reader = cluster.kubeconfig("reader-kubeconfig", READER_TOKEN)?;
    let out = std::process::Command::new(&env.kpm)
        .args(["doctor", "--cluster", "-o", "json", "--kubeconfig"])
        .arg(&reader)
        .output()?;
    let fleet: Value = serde_json::from_slice(&out.stdout)
        .map_err(|err| format!("{err}: {}", String::from_utf8_lossy(&out.stderr)))?;
    let driver = fleet["drivers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|driver| driver["name"] == DRIVER)
        .ok_or_else(|| format!("{DRIVER} is not in the fleet view: {fleet}"))?;
    if driver["daemon_set"] != format!("{NAMESPACE}/{DAEMON_SET}") {
        return Err(format!("the fleet view does not name the DaemonSet: {driver}").into());
    }
    let tainted = driver["not_on"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|node| node["node"] == TAINTED)
        .ok_or_else(|| format!("{TAINTED} is not among the nodes without {DRIVER}: {driver}"))?;
    let why = tainted["pod"]["why"].as_str().unwrap_or_default();
    if tainted["pod"]["state"] != "not-scheduled" || !why.contains(TAINT) {
        return Err(format!("{TAINTED}: the taint is not named: {tainted}").into());
    }
    if let Some(unseen) = fleet["unseen"].as_array().filter(|unseen| !unseen.is_empty()) {
        return Err(format!("the reader was refused something: {unseen:?}").into());
    }
    eprintln!(
        "kpm doctor --cluster as the fleet reader: {DRIVER} served by DaemonSet \
         {NAMESPACE}/{DAEMON_SET}; {TAINTED}: {why} ({} requests, {} bytes in all)",
        fleet["read"]["requests"], fleet["read"]["bytes"]
    );
    Ok(())
}

/// A merge patch of `path`.
fn patch(api: &crate::kube_e2e::api::Api, path: &str, body: &Value) -> Result {
    let (code, answer) = api.request("PATCH", path, Some(body))?;
    if !(200..300).contains(&code) {
        return Err(format!("PATCH {path}: {code} {}", answer["message"]).into());
    }
    Ok(())
}

/// Node `node`'s report, healthy: `serving` names the pod of the driver's
/// registered plugin; without it, the node shows nothing registered.
fn report(api: &crate::kube_e2e::api::Api, node: &str, serving: Option<Value>) -> Result {
    api.post(
        &REPORTS,
        &json!({"apiVersion": "doctor.kpm.io/v1alpha1", "kind": "KubeletPluginReport",
                "metadata": {"name": node}, "spec": {"nodeName": node}}),
    )?;
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let (plugins, registered) = match serving {
        Some(pod) => (
            json!([{"socket": format!("/var/lib/kubelet/plugins_registry/{DRIVER}-reg.sock"),
                    "type": "CSIPlugin", "name": DRIVER, "verdict": "ok",
                    "reason": "registered; CSINode lists it", "since": now, "pod": pod}]),
            format!("CSIPlugin:{DRIVER}"),
        ),
        None => (json!([]), String::new()),
    };
    let status = json!({"status": {
        "health": "Healthy", "reason": "PluginsHealthy",
        "kubelet": {"rootDir": "/var/lib/kubelet", "foundBy": "the default", "version": "v1.36.2"},
        "counts": {"plugins": plugins.as_array().map_or(0, Vec::len), "failing": 0, "omitted": 0},
        "plugins": plugins, "findings": [], "registered": registered,
        "heartbeatTime": now, "doctorVersion": env!("CARGO_PKG_VERSION"),
    }});
    patch(api, &format!("{}/{node}/status", *REPORTS), &status)
}
