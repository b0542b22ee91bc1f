//! A device plugin's rolling update with `maxSurge`, as a DaemonSet rolls
//! one out: a second instance started beside the running one, then the
//! first stopped; the resource must keep its devices throughout.
//!
//! Kubelets up to 1.36 key a device plugin's endpoint by resource
//! (`devicemanager/plugin/v1beta1/handler.go`): the first instance's exit
//! disconnects the second's client, so the resource loses its devices
//! whatever the plugin does (kubernetes#121994). Since kubernetes PR
//! #135437 the kubelet keys them by socket, and a rollout keeps the
//! devices when each instance serves a socket of its own; an endpoint both
//! instances share cannot be told apart (NVIDIA/k8s-device-plugin#1792).
//! The check's kubelet (kpm's) takes the newest registration as the
//! resource's endpoint and closes the previous one's stream.

use std::path::Path;
use std::time::Duration;

use kpm_api::FileId;
use tokio::time::Instant;

use super::Run;
use super::node::{Node, Registrations};
use super::plugin::{Dirs, Running, evidence};
use crate::outcome::{Evidence, Mark, Outcome, Subject};
use crate::wait::{POLL, wait_for};

/// The issue a socket shared by two instances is named after.
const SHARED_SOCKET: &str = "NVIDIA/k8s-device-plugin#1792";

/// How long the first instance runs, at least, before the second starts.
const SINCE_FIRST: Duration = Duration::from_secs(1);
/// How long the devices are watched once the first instance went.
const AFTER_FIRST: Duration = Duration::from_secs(1);

/// The healthy devices of `resource`, none while no endpoint serves it.
fn serving_healthy(devices: &kpm::device::DeviceView, resource: &str) -> usize {
    let status = devices.resource(resource).filter(|status| !status.endpoint.is_empty());
    status.map_or(0, |status| status.healthy)
}

/// A resource just before the rollout.
struct Before {
    resource: String,
    endpoint: String,
    file: Option<FileId>,
    healthy: usize,
}

fn file_id(path: &str) -> Option<FileId> {
    kpm::transport::file_id_at(Path::new(path))
}

/// The rolling update of the device plugins of `registered`; `plugin` is
/// the running instance, and the second one once it took over.
pub(super) async fn rolling_update(
    run: &Run<'_>,
    node: &Node,
    plugin: &mut Running,
    registered: &Registrations,
) -> Outcome {
    let Run { plugin_of, dirs, settings, .. } = *run;
    let bound = settings.bound;
    let devices = node.handle.devices();
    let resources: Vec<String> =
        registered.device_endpoints().into_iter().map(|(resource, _)| resource).collect();
    // The running instance serves: its endpoint answers, as a socket an
    // instance before it left behind does not.
    let live = |resource: &String| {
        devices
            .resource(resource)
            .is_some_and(|status| std::os::unix::net::UnixStream::connect(&status.endpoint).is_ok())
    };
    let _ = wait_for(bound, || resources.iter().all(live).then_some(())).await;
    let before: Vec<Before> = resources
        .into_iter()
        .filter_map(|resource| {
            let status = devices.resource(&resource)?;
            let file = file_id(&status.endpoint);
            Some(Before { resource, endpoint: status.endpoint, file, healthy: status.healthy })
        })
        .collect();
    if before.is_empty() {
        return Outcome::skipped("no device plugin");
    }
    if plugin.exited().is_some() {
        return Outcome::skipped("the plugin was not started anew (see plugin restart)");
    }
    // A rollout replaces an instance that has run a while: names made of
    // the start time (generic-device-plugin's `gdp-<resource>-<unix
    // seconds>.sock`) differ between the two then, as they would not
    // within the second the first one started.
    tokio::time::sleep(SINCE_FIRST).await;
    let mut second = match Running::start(plugin_of, dirs) {
        Ok(second) => second,
        Err(err) => return Outcome::failed(err.to_string()),
    };
    // Taken over: each resource's endpoint is another socket, or a socket
    // made anew where the first one was (not only the first's removed).
    let taken_over = |resource: &Before| {
        devices.resource(&resource.resource).is_some_and(|now| {
            let file = file_id(&now.endpoint);
            !now.endpoint.is_empty()
                && (now.endpoint != resource.endpoint || (file.is_some() && file != resource.file))
        })
    };
    if wait_for(bound, || before.iter().all(taken_over).then_some(())).await.is_none() {
        let how = second
            .exited()
            .map_or_else(|| "did not register".to_owned(), |exited| format!("exited ({exited})"));
        second.kill().await;
        return Outcome::warned(format!(
            "a second instance started beside the first {how} within {bound:?}: a rollout with \
             maxSurge stalls, the new pod never ready. An instance must serve sockets of its own \
             (with {{instance}}, the pod's uid in a DaemonSet) beside a running one ({SHARED_SOCKET}); {}",
            evidence(dirs)
        ));
    }
    // The second instance's first list, before the first goes.
    let listed =
        |resource: &Before| serving_healthy(devices, &resource.resource) >= resource.healthy;
    let _ = wait_for(bound, || before.iter().all(listed).then_some(())).await;
    let (mut findings, endpoints) = taken_over_by(&before, node, dirs);
    // The first instance stops, as the rollout deletes its pod. The
    // devices are watched from its SIGTERM until a while after it went: a
    // drop the second instance then makes good is a drop still (pods
    // admitted meanwhile fail).
    let mut lowest: Vec<usize> = before.iter().map(|resource| resource.healthy).collect();
    let record = |lowest: &mut Vec<usize>| {
        for (resource, lowest) in before.iter().zip(lowest.iter_mut()) {
            *lowest = (*lowest).min(serving_healthy(devices, &resource.resource));
        }
    };
    let terminated = {
        let terminating = plugin.terminate(bound);
        tokio::pin!(terminating);
        loop {
            record(&mut lowest);
            tokio::select! {
                terminated = &mut terminating => break terminated,
                () = tokio::time::sleep(POLL) => {}
            }
        }
    };
    if let Err(why) = terminated {
        findings.add(Mark::Warn, format!("the first instance: {why}"));
        plugin.kill().await;
    }
    // Once the kubelet has seen what the first took along, every socket it
    // still has registered is there.
    let settled = || node.registered(dirs).sockets.iter().all(|socket| socket.path.exists());
    let _ = wait_for(bound, || settled().then_some(())).await;
    let watched = Instant::now() + AFTER_FIRST;
    while Instant::now() < watched {
        record(&mut lowest);
        tokio::time::sleep(POLL).await;
    }
    record(&mut lowest);
    kept(&endpoints, &lowest, node, dirs, &mut findings);
    // The second instance is the plugin from now on.
    std::mem::swap(plugin, &mut second);
    second.kill().await;
    findings.outcome("")
}

/// What serves each resource now that the second instance took it over:
/// its endpoint and the socket file there.
type Serving<'a> = Vec<(&'a Before, String, Option<FileId>)>;

/// Where the second instance serves each resource of `before`.
fn taken_over_by<'a>(before: &'a [Before], node: &Node, dirs: &Dirs) -> (Evidence, Serving<'a>) {
    let devices = node.handle.devices();
    let mut findings = Evidence::default();
    let mut endpoints = Vec::new();
    for resource in before {
        let now = devices.resource(&resource.resource).map(|now| now.endpoint).unwrap_or_default();
        let shown = dirs.shown(Path::new(&now));
        let about = Subject::Resource(resource.resource.clone());
        if now == resource.endpoint {
            findings
                .add(
                    Mark::Warn,
                    format!(
                        "{}: the second instance took {shown} over, the first's socket path: \
                         kubelets since #135437 key endpoints by socket, so the first's exit \
                         is taken for the second's ({SHARED_SOCKET})",
                        resource.resource
                    ),
                )
                .about(about);
        } else {
            findings
                .add(
                    Mark::Pass,
                    format!("{}: the second instance serves {shown}", resource.resource),
                )
                .about(about);
        }
        let file = file_id(&now);
        endpoints.push((resource, now, file));
    }
    (findings, endpoints)
}

/// Each resource's devices once the first instance stopped, served by
/// the second from `endpoints`.
/// with `lowest` the fewest healthy devices each had meanwhile.
fn kept(
    endpoints: &Serving<'_>,
    lowest: &[usize],
    node: &Node,
    dirs: &Dirs,
    findings: &mut Evidence,
) {
    let devices = node.handle.devices();
    for ((resource, endpoint, file), lowest) in endpoints.iter().zip(lowest) {
        let about = Subject::Resource(resource.resource.clone());
        let healthy = serving_healthy(devices, &resource.resource);
        if *lowest < resource.healthy {
            findings
                .add(
                    Mark::Fail,
                    format!(
                        "{}: {lowest} healthy at the fewest, from the second instance's list \
                         to a second after the first stopped ({healthy} now), {} before: the \
                         node's allocatable drops during every rollout (kubernetes#121994)",
                        resource.resource, resource.healthy
                    ),
                )
                .about(about);
        } else if file_id(endpoint) != *file {
            findings
                .add(
                    Mark::Warn,
                    format!(
                        "{}: the first instance's exit removed {}, the second's socket \
                         ({SHARED_SOCKET}): a plugin that watches its socket for the kubelet's \
                         restart registers again for nothing",
                        resource.resource,
                        dirs.shown(Path::new(endpoint))
                    ),
                )
                .about(about);
        } else {
            findings
                .add(
                    Mark::Pass,
                    format!(
                        "{}: {healthy} healthy once the first instance stopped (kubelets up to \
                         1.36 lose them here whatever the plugin does: kubernetes#121994)",
                        resource.resource
                    ),
                )
                .about(about);
        }
    }
}
