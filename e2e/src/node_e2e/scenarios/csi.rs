//! `csi-driver`: a real CSI driver deployed as its project deploys it.

use std::time::Instant;

use super::super::node::Node;
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::secs;
use crate::command::Result;
use crate::scenario::{find, wait_until};

/// The driver's name, as hostpathplugin registers it.
pub(in super::super) const HOSTPATH_DRIVER: &str = "hostpath.csi.k8s.io";
/// Where `manifests/csi-hostpath.yaml` deploys it, and its pods' labels.
pub(super) const CSI_NAMESPACE: &str = "csi-hostpath";
pub(super) const CSI_SELECTOR: &str = "app.kubernetes.io/name=csi-hostpathplugin";

/// hostpathplugin and node-driver-registrar in one DaemonSet pod: the
/// kubelet registers the driver and CSINode lists it.
pub(super) fn hostpath_driver(_env: &Env, node: &mut Node) -> Result<String> {
    let manifest = include_str!("../manifests/csi-hostpath.yaml")
        .replace("@ROOT@", &node.kubelet_root.display().to_string());
    let applied = Instant::now();
    node.apply(&manifest)?;
    let ready = node.wait_pods_ready(CSI_NAMESPACE, CSI_SELECTOR)?;
    wait_until(&format!("CSINode {NODE_NAME} lists {HOSTPATH_DRIVER}"), START_TIMEOUT, || {
        let (code, csinode) = node.api.request(
            "GET",
            &format!("/apis/storage.k8s.io/v1/csinodes/{NODE_NAME}"),
            None,
        )?;
        Ok(code == 200 && find(&csinode["spec"]["drivers"], "name", HOSTPATH_DRIVER).is_some())
    })?;
    Ok(format!(
        "pod ready {} after apply, CSINode lists {HOSTPATH_DRIVER} {} after apply",
        secs(ready - applied),
        secs(applied.elapsed())
    ))
}
