//! The node events the plugin is taken through after its conversation:
//! the kubelet's restart and what must come back after it, SIGTERM, its
//! own restart, and for a DRA driver its slices wiped and a reboot; last,
//! a device plugin's rolling update (`rolling`).

use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use super::node::{Node, Registrations};
use super::plugin::{Dirs, Running, Settings, evidence};
use super::{Run, dra_context};
use crate::outcome::{Evidence, Mark, Outcome, Subject};
use crate::plugin::Plugin;
use crate::wait::wait_for;
use crate::{Check, SuiteError, csi, dra};

/// What the conversation saw, for the plugin's restart to be held to.
#[derive(Debug, Default)]
pub(super) struct Before {
    /// Device plugins' resources and how many devices were healthy at first.
    pub(super) healthy: Vec<(String, usize)>,
    /// CSI drivers' names, endpoints and node ids.
    pub(super) node_ids: Vec<(String, String, String)>,
}

/// The node events, in their order, each ending in a check pushed to
/// `checks`: the kubelet on `node` stopped and started anew (the new one is
/// returned), SIGTERM, the plugin started anew, and for a DRA driver its
/// slices wiped and a claim prepared across a reboot.
pub(super) async fn node_events(
    run: &Run<'_>,
    mut node: Node,
    plugin: &mut Running,
    registered: &Registrations,
    before: &Before,
    checks: &mut Vec<(Check, Outcome)>,
) -> Result<Node, SuiteError> {
    let Run { plugin_of, dirs, settings, started_at } = *run;
    let bound = settings.bound;
    // What the kubelet's restart is held to: the health now (a hook may
    // have turned a device unhealthy since the first list).
    let before_restart = Before { healthy: healthy_now(&node, before), ..Before::default() };
    node.stop().await?;
    let restarted = Instant::now();
    node = Node::start(dirs)?;
    let again =
        wait_for(bound, || node.registered(dirs).same_names(registered).then_some(())).await;
    checks.push((
        Check::KubeletRestart,
        match again {
            Some(()) => Outcome::passed(format!(
                "registered again {} ms after the kubelet started anew (kubelet.sock re-created)",
                restarted.elapsed().as_millis()
            )),
            None => Outcome::failed(format!(
                "not registered again within {bound:?} of the kubelet's restart (now: {}); {}",
                node.registered(dirs).describe(dirs),
                evidence(dirs),
            )),
        },
    ));
    checks.push((
        Check::DevicesAfterKubeletRestart,
        devices_again(&node, &before_restart, bound, "the kubelet's restart").await,
    ));
    let dra = registered.of_type(kpm::api::DRA_PLUGIN).next();
    // A claim to prepare again after the reboot below, made while the
    // driver's slices are there.
    let kept = match (dra, &settings.api) {
        (Some(socket), Some(_)) => {
            let ctx = dra_context(&node, settings, dirs, started_at);
            let endpoint = socket.plugin.endpoint.socket_path().to_path_buf();
            let (name, versions) = (&socket.plugin.name, &socket.plugin.versions);
            Some(dra::keep_prepared(name, &endpoint, versions, &ctx).await)
        }
        _ => None,
    };
    let slices = match (dra, &settings.api) {
        (Some(socket), Some(api)) => {
            dra::slices_after_wipe(&api.client, &socket.plugin.name, &settings.node, bound).await
        }
        (Some(_), None) => Outcome::skipped("give --kubeconfig: the slices are the API server's"),
        (None, _) => Outcome::skipped("no DRA driver"),
    };
    checks.push((Check::SlicesAfterWipe, slices));
    checks.push((Check::Sigterm, terminate(&node, dirs, plugin, registered, bound).await));
    if kept.is_some() {
        // The reboot: a node's `/var/run/cdi` is a tmpfs.
        empty_dir(&dirs.env.cdi);
    }
    let restart = restart_plugin(plugin_of, &node, dirs, settings, plugin, registered, before);
    checks.push((Check::PluginRestart, restart.await));
    let rebooted = match (&kept, dra) {
        (None, Some(_)) => Outcome::skipped("give --kubeconfig: the claim is a ResourceClaim"),
        (Some(Err(why)), _) => Outcome::failed(why.clone()),
        (Some(Ok(_)), _) if plugin.exited().is_some() => {
            Outcome::skipped("the plugin was not started anew (see plugin restart)")
        }
        (Some(Ok(kept)), Some(socket)) => {
            let ctx = dra_context(&node, settings, dirs, started_at);
            let now = node.registered(dirs);
            let again =
                now.of_type(kpm::api::DRA_PLUGIN).find(|s| s.plugin.name == socket.plugin.name);
            let endpoint = again.unwrap_or(socket).plugin.endpoint.socket_path().to_path_buf();
            dra::after_reboot(kept, &socket.plugin.name, &endpoint, &ctx).await
        }
        (_, None) => Outcome::skipped("no DRA driver"),
    };
    checks.push((Check::PrepareAfterReboot, rebooted));
    if let (Some(Ok(kept)), Some(api)) = (&kept, &settings.api) {
        kept.claims().delete(&api.client, bound).await;
    }
    let rolled = super::rolling::rolling_update(run, &node, plugin, registered).await;
    checks.push((Check::RollingUpdate, rolled));
    Ok(node)
}

/// How many devices of each resource of `before` are healthy now.
fn healthy_now(node: &Node, before: &Before) -> Vec<(String, usize)> {
    let devices = node.handle.devices();
    let now = |resource: &str| devices.resource(resource).map_or(0, |status| status.healthy);
    before.healthy.iter().map(|(resource, _)| (resource.clone(), now(resource))).collect()
}

/// Removes every file of `dir`, as a reboot empties a tmpfs.
fn empty_dir(dir: &std::path::Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let _ = std::fs::remove_file(entry.path());
    }
}

/// The device plugins' devices as healthy as at first, within the bound,
/// after `event`: a plugin that does not send its list again leaves the
/// node's allocatable short.
async fn devices_again(node: &Node, before: &Before, bound: Duration, event: &str) -> Outcome {
    let mut findings = Evidence::default();
    devices_back(node, before, bound, event, &mut findings).await;
    findings.outcome("no device plugin")
}

/// [`devices_again`]'s findings, one a resource.
async fn devices_back(
    node: &Node,
    before: &Before,
    bound: Duration,
    event: &str,
    findings: &mut Evidence,
) {
    let devices = node.handle.devices();
    for (resource, healthy) in &before.healthy {
        let back = wait_for(bound, || {
            devices.resource(resource).map(|status| status.healthy).filter(|now| now >= healthy)
        });
        let about = Subject::Resource(resource.clone());
        if let Some(now) = back.await {
            findings.add(Mark::Pass, format!("{resource}: {now} healthy again")).about(about);
        } else {
            let now = devices.resource(resource).map_or(0, |status| status.healthy);
            findings
                .add(
                    Mark::Fail,
                    format!(
                        "{resource}: {now} healthy {bound:?} after {event}, {healthy} before: \
                         the node's allocatable stays short"
                    ),
                )
                .about(about);
        }
    }
}

/// The plugin started anew after its SIGTERM, as a pod's container is
/// restarted: it registers again as before, its devices come back healthy
/// (allocatable stuck at 0 after a plugin's restart is a kubelet classic:
/// Kubernetes #62773, #121994), and a CSI driver keeps its node id.
async fn restart_plugin(
    plugin_of: &Plugin,
    node: &Node,
    dirs: &Dirs,
    settings: &Settings,
    plugin: &mut Running,
    registered: &Registrations,
    before: &Before,
) -> Outcome {
    let bound = settings.bound;
    if plugin.exited().is_none() {
        return Outcome::skipped("the plugin did not exit on SIGTERM");
    }
    let started = Instant::now();
    *plugin = match Running::start(plugin_of, dirs) {
        Ok(plugin) => plugin,
        Err(err) => return Outcome::failed(err.to_string()),
    };
    let again = wait_for(bound, || node.registered(dirs).same_names(registered).then_some(()));
    if again.await.is_none() {
        return Outcome::failed(format!(
            "not registered again within {bound:?} of its restart (now: {}); {}",
            node.registered(dirs).describe(dirs),
            evidence(dirs),
        ));
    }
    let mut findings = Evidence::default();
    findings.pass(format!(
        "registered again {} ms after it started anew",
        started.elapsed().as_millis()
    ));
    devices_back(node, before, bound, "its restart", &mut findings).await;
    for (name, endpoint, id) in &before.node_ids {
        match csi::node_id(endpoint, bound).await {
            Ok(now) if now == *id => findings.pass(format!("{name}: node id {id:?} kept")),
            Ok(now) => findings.fail(format!(
                "{name}: node id {now:?} after its restart, {id:?} before: the kubelet rewrites \
                 the Node's annotation and the CSINode, and volumes attached under the old id \
                 are lost to it"
            )),
            Err(why) => findings.fail(format!("{name}: {why}")),
        }
    }
    findings.outcome("")
}

/// SIGTERM: the plugin exits within the bound, having removed its
/// registration sockets and `kubelet.sock` endpoints, and is deregistered.
async fn terminate(
    node: &Node,
    dirs: &Dirs,
    plugin: &mut Running,
    registered: &Registrations,
    bound: Duration,
) -> Outcome {
    let sent = Instant::now();
    let exited = match plugin.terminate(bound).await {
        Ok(exited) => exited,
        Err(why) => return Outcome::failed(why),
    };
    let took = sent.elapsed();
    let left = |paths: Vec<&PathBuf>| -> Vec<String> {
        paths
            .into_iter()
            .filter(|path| path.exists())
            .map(|path| path.display().to_string())
            .collect()
    };
    let registry_left = left(registered.sockets.iter().map(|socket| &socket.path).collect());
    if !registry_left.is_empty() {
        return Outcome::failed(format!(
            "exited ({exited}) in {} ms but left {registry_left:?}: the kubelet keeps dialling a \
             stale socket, with backoff",
            took.as_millis()
        ));
    }
    // The kubelet dials a device plugin's endpoint only when it registers,
    // and empties `device-plugins/` when it starts: one left there harms
    // only those who read the directory.
    let endpoints_left = left(registered.resources.iter().map(|(_, endpoint)| endpoint).collect());
    if !endpoints_left.is_empty() {
        return Outcome::warned(format!(
            "exited ({exited}) in {} ms but left {endpoints_left:?}: the kubelet does not dial it \
             again, but tools that read device-plugins/ (kpm doctor) see a stale socket until \
             the kubelet restarts",
            took.as_millis()
        ));
    }
    let deregistered = wait_for(bound, || node.registered(dirs).is_empty().then_some(())).await;
    match deregistered {
        Some(()) => Outcome::passed(format!(
            "exited ({exited}) {} ms after SIGTERM, its sockets removed, deregistered",
            took.as_millis()
        )),
        None => Outcome::failed(format!(
            "its sockets are gone but it is still registered after {bound:?}"
        )),
    }
}
