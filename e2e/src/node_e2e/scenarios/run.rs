//! `kpm-run`: `deploy/run` (`kpm run` as a DaemonSet) as a pod beside the
//! real kubelet, serving a registry of its own for a second Node.

use std::time::Instant;

use serde_json::json;

use super::super::node::Node;
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::doctor::{NAMESPACE, refused_requests};
use super::{namespace_and_image, overlay, secs};
use crate::command::Result;
use crate::scenario::{find, wait_until};

/// The Node `kpm run` serves: not the kubelet's, which publishes its own.
pub(super) const SECOND_NODE: &str = "kpm-second";
/// `kpm run`'s root: a directory the real kubelet does not watch.
pub(super) const SECOND_ROOT: &str = "/var/lib/kpm-second";
const RUN_SELECTOR: &str = "app.kubernetes.io/name=kpm";
const KPM_USER: &str = "system:serviceaccount:kpm-system:kpm";
/// The label of the second Node, which no kubelet runs.
pub(super) const NO_KUBELET_LABEL: &str = "kpm.example/no-kubelet";
/// The example plugin's CSI driver.
const EXAMPLE_DRIVER: &str = "csi.example.com";

/// `deploy/run` with an overlay that sets the namespace, the image and the
/// root (through `deploy/kubelet-root`), and the node name: it registers a
/// plugin written with kpm-registrar running in another pod and publishes
/// the second Node's CSINode, with its manifest's RBAC and nothing more.
pub(super) fn kpm_run_daemonset(env: &Env, node: &mut Node) -> Result<String> {
    // The Node a second node agent would have registered. No kubelet runs
    // it, so a DaemonSet's pod there (the doctor's tolerates everything)
    // stays Pending and, unavailable, holds up the DaemonSet's rolling
    // updates: labelled, for overlays that roll the doctor out to keep off
    // it ([`super::doctor_with_plugin_conditions`]).
    node.api.post(
        "/api/v1/nodes",
        &json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": SECOND_NODE, "labels": {NO_KUBELET_LABEL: "true"}},
        }),
    )?;
    let overlay = overlay(
        env,
        "run",
        &format!(
            "resources:\n  - @DEPLOY@/run\ncomponents:\n  - @DEPLOY@/kubelet-root\n{}\
             configMapGenerator:\n  - name: kpm-kubelet-root\n    literals: [dir={SECOND_ROOT}]\n    \
             options:\n      annotations:\n        config.kubernetes.io/local-config: \"true\"\n\
             patches:\n  - target: {{kind: DaemonSet, name: kpm}}\n    patch: |-\n      \
             - op: add\n        path: /spec/template/spec/containers/0/env/-\n        \
             value: {{name: KPM_NODE_NAME, value: {SECOND_NODE}}}\n",
            namespace_and_image()?
        ),
    )?;
    let audit_from = std::fs::metadata(&node.audit_log).map_or(0, |meta| meta.len());
    let applied = Instant::now();
    node.kubectl(&["apply", "-k", &overlay.display().to_string()])?;
    let ready = node.wait_pods_ready(NAMESPACE, RUN_SELECTOR)?;

    let plugin = include_str!("../manifests/example-plugin.yaml")
        .replace("@REGISTRY@", &format!("{SECOND_ROOT}/plugins_registry"))
        .replace("@NODE@", SECOND_NODE)
        .replace("@NAMESPACE@", NAMESPACE)
        .replace("@KUBELET_NODE@", NODE_NAME);
    let plugin_started = Instant::now();
    node.apply(&plugin)?;
    wait_until(&format!("CSINode {SECOND_NODE} lists {EXAMPLE_DRIVER}"), START_TIMEOUT, || {
        let (code, csinode) = node.api.request(
            "GET",
            &format!("/apis/storage.k8s.io/v1/csinodes/{SECOND_NODE}"),
            None,
        )?;
        Ok(code == 200 && find(&csinode["spec"]["drivers"], "name", EXAMPLE_DRIVER).is_some())
    })?;
    let published = plugin_started.elapsed();

    let refused = refused_requests(node, KPM_USER, audit_from)?;
    if !refused.is_empty() {
        return Err(format!("requests of {KPM_USER} refused: {}", refused.join(", ")).into());
    }
    Ok(format!(
        "pod ready {} after apply -k; CSINode {SECOND_NODE} lists {EXAMPLE_DRIVER} {} after the plugin's pod was created; no request refused",
        secs(ready - applied),
        secs(published)
    ))
}
