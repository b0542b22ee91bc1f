//! `registrar-plugins`: kpm-registrar's example plugin as pods, one per
//! plugin type, registering with the node's real kubelet: a CSI driver
//! (CSINode lists it), a DRA driver offering `v1.DRAPlugin` and
//! `v1beta1.DRAPlugin` (the kubelet's NotifyRegistrationStatus, as the
//! plugin prints it) and a device plugin through `kubelet.sock` (its 2
//! devices in the Node's capacity). Then the kubelet restarts: the device
//! plugin registers again on the new `kubelet.sock`, and the kubelet
//! registers the CSI and DRA drivers again from its `plugins_registry`.
//! The pods are deleted at the end: a live DRA driver without
//! ResourceSlices is not for the later scenarios to see.

use std::time::Instant;

use super::super::kubelets;
use super::super::node::Node;
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::device::{DEVICE_PLUGINS, LastStatus};
use super::secs;
use crate::command::Result;
use crate::scenario::{find, wait_for};

const NAMESPACE: &str = "registrar-plugins";
const CSI_POD: &str = "csi-plugin";
const DRA_POD: &str = "dra-plugin";
const DEVICE_POD: &str = "device-plugin";
/// The plugins' names, as `manifests/registrar-plugins.yaml` gives them.
const CSI_DRIVER: &str = "csi.example.com";
const DRA_DRIVER: &str = "gpu.example.com";
const RESOURCE: &str = "example.com/dev";
/// The device-plugin stub's devices (`example_plugin`'s `--devices` default).
const DEVICES: &str = "2";
/// What `example_plugin` prints per `NotifyRegistrationStatus` (`registered:
/// true`, or `registered: false: <reason>`).
const STATUS: &str = "registered: ";
/// What kpm-registrar logs (at info) for each Register on `kubelet.sock`
/// that the kubelet accepted.
const DEVICE_REGISTERED: &str = "registered with the kubelet";

/// `registrar-plugins`: see the module.
pub(super) fn registrar_plugins(_env: &Env, node: &mut Node) -> Result<String> {
    let registry = node.kubelet_root.join("plugins_registry");
    let manifest = include_str!("../manifests/registrar-plugins.yaml")
        .replace("@REGISTRY@", &registry.display().to_string())
        .replace("@DEVICE_PLUGINS@", DEVICE_PLUGINS)
        .replace("@NODE@", NODE_NAME);
    let applied = Instant::now();
    node.apply(&manifest)?;

    let csi_at =
        wait_for(&format!("CSINode {NODE_NAME} lists {CSI_DRIVER}"), START_TIMEOUT, || {
            Ok(csinode_lists(node)?.then(Instant::now))
        })
        .map_err(|err| with_log(node, CSI_POD, &err))?;
    let (dra, dra_at) = wait_for(
        &format!("the kubelet's NotifyRegistrationStatus to {DRA_DRIVER}"),
        START_TIMEOUT,
        || Ok(statuses(node, DRA_POD).into_iter().next().map(|status| (status, Instant::now()))),
    )
    .map_err(|err| with_log(node, DRA_POD, &err))?;
    let dra = match dra.strip_prefix(STATUS) {
        Some("true") => format!("registered: true {}", secs(dra_at - applied)),
        // The 1.31 kubelet takes semantic versions only (the `dra`
        // scenario's driver is refused the same way): what kpm-registrar
        // offers by default is not for it.
        Some(refused) if kubelets::dra_api_version(node.kubelet_minor) == "v1alpha3" => {
            format!(
                "registered: {refused} {} (the 1.31 kubelet takes semantic versions only)",
                secs(dra_at - applied)
            )
        }
        _ => return Err(format!("the kubelet's answer to {DRA_DRIVER}: {dra}").into()),
    };
    let device_at =
        wait_for(&format!("{RESOURCE}: {DEVICES} on Node {NODE_NAME}"), START_TIMEOUT, || {
            Ok(has_devices(node)?.then(Instant::now))
        })
        .map_err(|err| with_log(node, DEVICE_POD, &err))?;

    // What each plugin had from the kubelet before it restarts: each one
    // must have more after.
    let device_before = device_registrations(node);
    let (csi_before, dra_before) = (statuses(node, CSI_POD).len(), statuses(node, DRA_POD).len());
    let status_before = LastStatus::read(node)?;
    let restarted = Instant::now();
    node.restart_kubelet()?;
    node.wait_ready()?;
    let device_again = wait_for(
        &format!("{RESOURCE} registered again through the new kubelet.sock"),
        START_TIMEOUT,
        || Ok((device_registrations(node) > device_before).then(Instant::now)),
    )
    .map_err(|err| with_log(node, DEVICE_POD, &err))?;
    // In a Node status the restarted kubelet posted, not the old one's.
    let device_back = wait_for(
        &format!("{RESOURCE}: {DEVICES} in the restarted kubelet's Node status"),
        START_TIMEOUT,
        || {
            let posted = status_before.posted_anew(node)?;
            Ok((posted && has_devices(node)?).then(Instant::now))
        },
    )?;
    let csi_again = wait_for(
        &format!("the restarted kubelet's NotifyRegistrationStatus to {CSI_DRIVER}"),
        START_TIMEOUT,
        || Ok((statuses(node, CSI_POD).len() > csi_before).then(Instant::now)),
    )
    .map_err(|err| with_log(node, CSI_POD, &err))?;
    let dra_again = wait_for(
        &format!("the restarted kubelet's NotifyRegistrationStatus to {DRA_DRIVER}"),
        START_TIMEOUT,
        || Ok((statuses(node, DRA_POD).len() > dra_before).then(Instant::now)),
    )
    .map_err(|err| with_log(node, DRA_POD, &err))?;
    let csi_listed = csinode_lists(node)?;

    // Gone before the next scenario: the pods and their sockets (each
    // removes its own on SIGTERM, which deregisters it).
    let deleted = Instant::now();
    node.kubectl(&["delete", "namespace", NAMESPACE, "--wait=false"])?;
    let sockets = [
        registry.join(format!("{CSI_DRIVER}-reg.sock")),
        registry.join(format!("{DRA_DRIVER}-reg.sock")),
        std::path::Path::new(DEVICE_PLUGINS).join(format!("{}.sock", RESOURCE.replace('/', "_"))),
    ];
    let gone = wait_for("the plugins' pods and sockets gone", START_TIMEOUT, || {
        let pods = node.api.get(&format!("/api/v1/namespaces/{NAMESPACE}/pods"))?;
        let no_pods = pods["items"].as_array().is_none_or(Vec::is_empty);
        Ok((no_pods && sockets.iter().all(|socket| !socket.exists())).then(Instant::now))
    })?;

    Ok(format!(
        "after apply: CSINode lists {CSI_DRIVER} {}, {DRA_DRIVER} {dra}, {RESOURCE}: {DEVICES} \
         in capacity and allocatable {}; kubelet restarted: {RESOURCE} registered again {}, \
         {DEVICES} in its Node status {}, {CSI_DRIVER} notified again {} (CSINode lists it: \
         {csi_listed}), {DRA_DRIVER} notified again {}; pods and sockets gone {} after the delete",
        secs(csi_at - applied),
        secs(device_at - applied),
        secs(device_again - restarted),
        secs(device_back - restarted),
        secs(csi_again - restarted),
        secs(dra_again - restarted),
        secs(gone - deleted),
    ))
}

/// Whether the kubelet's CSINode lists [`CSI_DRIVER`].
fn csinode_lists(node: &Node) -> Result<bool> {
    let (code, csinode) =
        node.api.request("GET", &format!("/apis/storage.k8s.io/v1/csinodes/{NODE_NAME}"), None)?;
    Ok(code == 200 && find(&csinode["spec"]["drivers"], "name", CSI_DRIVER).is_some())
}

/// Whether the Node's capacity and allocatable both have [`DEVICES`] of
/// [`RESOURCE`].
fn has_devices(node: &Node) -> Result<bool> {
    let object = node.api.get(&format!("/api/v1/nodes/{NODE_NAME}"))?;
    let status = &object["status"];
    Ok(["capacity", "allocatable"].iter().all(|field| status[field][RESOURCE] == DEVICES))
}

/// The registration statuses `pod`'s `example_plugin` printed, in order;
/// none before its container starts.
fn statuses(node: &Node, pod: &str) -> Vec<String> {
    let log = node.kubectl(&["logs", "-n", NAMESPACE, pod]).unwrap_or_default();
    log.lines().filter(|line| line.starts_with(STATUS)).map(str::to_owned).collect()
}

/// How many times the device plugin's Register was accepted.
fn device_registrations(node: &Node) -> usize {
    let log = node.kubectl(&["logs", "-n", NAMESPACE, DEVICE_POD]).unwrap_or_default();
    log.lines().filter(|line| line.contains(DEVICE_REGISTERED)).count()
}

/// `err` with the last lines of `pod`'s log.
fn with_log(node: &Node, pod: &str, err: &dyn std::fmt::Display) -> Box<dyn std::error::Error> {
    let log = node.kubectl(&["logs", "-n", NAMESPACE, pod]).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    format!("{err}; {pod}'s log ends: {}", lines[lines.len().saturating_sub(3)..].join(" | "))
        .into()
}
