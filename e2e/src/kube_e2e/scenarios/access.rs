//! The `cluster` scenario: the cluster alone, without kpm: kpm's token may
//! do what kpm needs and nothing else, and a restarted kube-apiserver keeps
//! every object.

use serde_json::{Value, json};

use super::Cluster;
use crate::command::Result;
use crate::kube_e2e::api::{CSIDRIVERS, SLICES, create_slice, slice, slices};
use crate::kube_e2e::{Env, KPM_TOKEN};

/// kpm's token may do exactly what kpm needs, checked call by call; a
/// restarted kube-apiserver serves the same objects (`apiserver-down` relies
/// on it).
pub(super) fn cluster(env: &Env, cluster: &mut Cluster) -> Result {
    let kpm = cluster.api.as_token(KPM_TOKEN);
    let csinode = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": "node1"}, "spec": {"drivers": []},
    });
    let label = json!({"metadata": {"labels": {"kube-e2e": "cluster"}}});
    let status = json!({"status": {"capacity": {"example.com/e2e": "1"}}});
    create_slice(&cluster.api, "node2-a-0", "a.example.com", "node2", 1)?;
    let by_name = "fieldSelector=metadata.name%3Dnode1";
    let watch = |path: &str| format!("{path}?{by_name}&watch=true&timeoutSeconds=1");
    let allowed: [(&str, Result<(u16, Value)>); 14] = [
        ("get nodes", kpm.request("GET", "/api/v1/nodes/node1", None)),
        ("list nodes", kpm.request("GET", &format!("/api/v1/nodes?{by_name}"), None)),
        ("watch nodes", kpm.request("GET", &watch("/api/v1/nodes"), None)),
        ("patch nodes", kpm.request("PATCH", "/api/v1/nodes/node1", Some(&label))),
        ("patch nodes/status", kpm.request("PATCH", "/api/v1/nodes/node1/status", Some(&status))),
        (
            "create csinodes",
            kpm.request("POST", "/apis/storage.k8s.io/v1/csinodes", Some(&csinode)),
        ),
        ("get csinodes", kpm.request("GET", "/apis/storage.k8s.io/v1/csinodes/node1", None)),
        (
            "list csinodes",
            kpm.request("GET", &format!("/apis/storage.k8s.io/v1/csinodes?{by_name}"), None),
        ),
        ("watch csinodes", kpm.request("GET", &watch("/apis/storage.k8s.io/v1/csinodes"), None)),
        ("update csinodes", {
            let current = cluster.api.get("/apis/storage.k8s.io/v1/csinodes/node1")?;
            kpm.request("PUT", "/apis/storage.k8s.io/v1/csinodes/node1", Some(&current))
        }),
        ("list csidrivers", kpm.request("GET", CSIDRIVERS, None)),
        (
            "watch csidrivers",
            kpm.request("GET", &format!("{CSIDRIVERS}?watch=true&timeoutSeconds=1"), None),
        ),
        ("list resourceslices", kpm.request("GET", SLICES, None)),
        (
            "deletecollection resourceslices",
            kpm.request("DELETE", &format!("{SLICES}?fieldSelector=spec.nodeName%3Dnode2"), None),
        ),
    ];
    let denied: [(&str, Result<(u16, Value)>); 5] = [
        (
            "patch csinodes",
            kpm.request("PATCH", "/apis/storage.k8s.io/v1/csinodes/node1", Some(&json!({}))),
        ),
        ("list secrets", kpm.request("GET", "/api/v1/namespaces/kube-system/secrets", None)),
        ("delete nodes", kpm.request("DELETE", "/api/v1/nodes/node2", None)),
        ("list pods", kpm.request("GET", "/api/v1/pods", None)),
        (
            "create resourceslices",
            kpm.request("POST", SLICES, Some(&slice("x", "a.example.com", "node1", 1))),
        ),
    ];
    let mut wrong = Vec::new();
    for (what, answer) in allowed {
        let (code, body) = answer?;
        if !(200..300).contains(&code) {
            wrong.push(format!("{what}: {code} {}", body["message"]));
        }
    }
    for (what, answer) in denied {
        let (code, _) = answer?;
        if code != 403 {
            wrong.push(format!("{what}: {code}, not 403"));
        }
    }
    if !wrong.is_empty() {
        return Err(format!("kpm's token: {}", wrong.join("; ")).into());
    }
    if !slices(&cluster.api)?.is_empty() {
        return Err("deletecollection left node2's slice".into());
    }
    eprintln!("kpm's token: 14 calls kpm needs allowed, 5 others denied");

    cluster.stop_apiserver()?;
    if cluster.api.request("GET", "/readyz", None).is_ok() {
        return Err("kube-apiserver still answers once stopped".into());
    }
    cluster.start_apiserver(env)?;
    let node = kpm.get("/api/v1/nodes/node1")?;
    if node["metadata"]["labels"]["kube-e2e"] != "cluster" {
        return Err(format!("Node node1 after the restart: {}", node["metadata"]).into());
    }
    eprintln!("kube-apiserver restarted: Node node1 kept its label");
    Ok(())
}
