//! A registered device plugin driven as the kubelet's device manager drives
//! it once a pod asks for its resource: the first `ListAndWatch` list, a
//! health change, `Allocate`, `GetPreferredAllocation`, `PreStartContainer`,
//! and the stream kept open throughout. The calls go over the connection of
//! the check's own kubelet (its device manager, which holds the stream), as
//! the kubelet makes them; the first list is read again on a connection of
//! its own, for what the manager does not keep (the raw list, its latency).
//!
//! Where the kubelet copes with a broken rule, the step warns; where the
//! pod fails, it fails. The kubelet's `devicemanager` (`manager.go`) is the
//! referee: it takes `ContainerResponses[0]` and refuses none; it ignores
//! preferred ids it did not offer and fills up the size itself; an error of
//! `Allocate`, `GetPreferredAllocation` or a required `PreStartContainer`
//! fails the pod.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use kpm::device::DeviceView;
use kpm_api::constants::{DEVICE_HEALTHY, DEVICE_UNHEALTHY};
use kpm_api::deviceplugin::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, PreferredAllocationRequest,
};
use tokio::time::Instant;

use crate::Check;
use crate::cdi;
use crate::hook::HookCall;
use crate::outcome::{Evidence, Outcome};
use crate::wait::wait_for;

/// At most this many healthy devices are allocated, alone and in pairs: a
/// plugin with hundreds of devices is judged by its first ones.
const MOST_ALLOCATED: usize = 16;
/// An id no plugin lists.
const UNKNOWN: &str = "kpm-check-no-such-device";

/// The conversation with the device plugin serving `resource` at
/// `endpoint`, registered with `view`'s kubelet; `health_change` provokes a
/// health change, if the user said how. Also how many devices were healthy
/// once the first list came, for the plugin's restart to be held to.
pub(super) async fn converse(
    view: &DeviceView,
    resource: &str,
    endpoint: &Path,
    health_change: Option<&HookCall>,
    bound: Duration,
) -> (Vec<(Check, Outcome)>, usize) {
    let opened = Instant::now();
    let mut checks = vec![(Check::ListAndWatch, first_list(view, resource, endpoint, bound).await)];
    let healthy = healthy_ids(view, resource);
    if healthy.is_empty() {
        let why = match view.resource(resource) {
            Some(status) if status.endpoint.is_empty() => {
                "the ListAndWatch stream ended: every device is unhealthy".to_owned()
            }
            _ => format!("{resource} has no healthy device"),
        };
        for step in [
            Check::Allocate,
            Check::AllocateUnknownId,
            Check::GetPreferredAllocation,
            Check::PreStartContainer,
            Check::HealthChange,
        ] {
            checks.push((step, Outcome::skipped(why.clone())));
        }
    } else {
        checks.push((Check::Allocate, allocate(view, resource, &healthy).await));
        checks.push((Check::AllocateUnknownId, allocate_unknown(view, resource).await));
        checks.push((Check::GetPreferredAllocation, preferred(view, resource, &healthy).await));
        checks.push((Check::PreStartContainer, pre_start(view, resource, &healthy).await));
        checks.push((
            Check::HealthChange,
            health_change_step(view, resource, health_change, bound).await,
        ));
    }
    checks.push((Check::StreamStaysOpen, stream_open(view, resource, opened.elapsed())));
    (checks, healthy.len())
}

/// The healthy devices' ids as the kubelet's stream has them, sorted.
fn healthy_ids(view: &DeviceView, resource: &str) -> Vec<String> {
    let devices = view.resource(resource).map(|status| status.devices).unwrap_or_default();
    devices.into_iter().filter(|d| d.health == DEVICE_HEALTHY).map(|d| d.id).collect()
}

/// The first list, on a new connection: within the call timeout, ids
/// listed once each, healths the kubelet knows; then the kubelet's own
/// stream must have delivered it.
async fn first_list(
    view: &DeviceView,
    resource: &str,
    endpoint: &Path,
    bound: Duration,
) -> Outcome {
    let inspected = tokio::time::timeout(bound, view.inspect_endpoint(resource, endpoint)).await;
    let report = match inspected {
        Ok(Ok(report)) => report,
        Err(_) => {
            return Outcome::failed(format!(
                "no list within {bound:?} of the ListAndWatch call: the kubelet's capacity for \
                 {resource} stays 0 until one comes"
            ));
        }
        Ok(Err(err)) => {
            return Outcome::failed(format!(
                "{err}: the kubelet's capacity for {resource} stays 0 until a list comes"
            ));
        }
    };
    let mut findings = Evidence::default();
    findings.pass(format!(
        "{} devices, {} healthy, listed {:.1} ms after the call",
        report.devices,
        report.healthy,
        report.first_list_took.as_secs_f64() * 1000.0
    ));
    if report.devices == 0 {
        findings
            .warn("an empty list: capacity 0, nothing to allocate (a node without the hardware?)");
    }
    if !report.repeated_ids.is_empty() {
        findings.fail(format!(
            "ids listed more than once: {:?}: the kubelet keeps one device per id, so its \
             capacity is {} where the plugin meant {}",
            report.repeated_ids,
            report.devices - report.repeated_ids.len(),
            report.devices
        ));
    }
    // The kubelet's stream has the same list by now, with the healths as sent.
    let delivered = wait_for(bound, || {
        view.resource(resource).filter(|status| !status.devices.is_empty() || report.devices == 0)
    })
    .await;
    match delivered {
        Some(status) => {
            let odd: Vec<String> = status
                .devices
                .iter()
                .filter(|d| d.health != DEVICE_HEALTHY && d.health != DEVICE_UNHEALTHY)
                .map(|d| format!("{} {:?}", d.id, d.health))
                .collect();
            if !odd.is_empty() {
                findings.warn(format!(
                    "health neither {DEVICE_HEALTHY} nor {DEVICE_UNHEALTHY}: {}: the kubelet counts them unhealthy",
                    odd.join(", ")
                ));
            }
            let numa: Vec<String> = status
                .devices
                .iter()
                .filter(|d| !d.numa_nodes.is_empty())
                .map(|d| format!("{} NUMA {:?}", d.id, d.numa_nodes))
                .collect();
            if numa.is_empty() {
                findings.pass("no topology: the topology manager aligns nothing");
            } else {
                findings.pass(numa.join(", "));
            }
        }
        None => findings.fail(format!(
            "the kubelet's own ListAndWatch stream delivered no list within {bound:?}"
        )),
    }
    findings.outcome("")
}

/// `Allocate` as the kubelet calls it, one container request per call: on
/// each healthy device alone, then on neighbours in pairs; then one call
/// with two container requests, which the kubelet does not make (a warning
/// only). Each response must have a container response and name only what
/// a container runtime can give a container.
async fn allocate(view: &DeviceView, resource: &str, healthy: &[String]) -> Outcome {
    let mut findings = Evidence::default();
    let ids = &healthy[..healthy.len().min(MOST_ALLOCATED)];
    let alone = ids.iter().map(|id| vec![id.clone()]);
    let pairs = ids.windows(2).map(<[String]>::to_vec);
    let mut summaries = Vec::new();
    // Each broken rule once, with the calls that broke it: `(fails, rule)`.
    let mut broken: BTreeMap<(bool, String), Vec<String>> = BTreeMap::new();
    for asked in alone.chain(pairs) {
        let request = ContainerAllocateRequest { devices_ids: asked.clone() };
        let shown = asked.join("+");
        let mut breaks = |fails: bool, rule: String| {
            broken.entry((fails, rule)).or_default().push(shown.clone());
        };
        match view.allocate(resource, AllocateRequest { container_requests: vec![request] }).await {
            Err(err) => breaks(true, format!("{err}: the kubelet fails the pod's admission")),
            Ok(response) => match response.container_responses.as_slice() {
                [] => breaks(
                    true,
                    "no container response: the kubelet refuses it (\"no containers return in \
                     allocation response\") and fails the pod"
                        .into(),
                ),
                [first, rest @ ..] => {
                    if !rest.is_empty() {
                        breaks(
                            false,
                            "more container responses than requests: the kubelet uses the first"
                                .into(),
                        );
                    }
                    for rule in refused_by_runtime(first) {
                        breaks(true, rule);
                    }
                    summaries.push(format!("{shown}: {}", contents(first)));
                }
            },
        }
    }
    for ((fails, rule), calls) in broken {
        let line = format!("{}: {rule}", calls.join(", "));
        if fails { findings.fail(line) } else { findings.warn(line) }
    }
    if let [a, b, ..] = ids {
        let requests = [a, b].map(|id| ContainerAllocateRequest { devices_ids: vec![id.clone()] });
        let request = AllocateRequest { container_requests: requests.to_vec() };
        match view.allocate(resource, request).await {
            Ok(response) if response.container_responses.len() == 2 => {
                findings.pass("two container requests in one call: two responses");
            }
            Ok(response) => findings.warn(format!(
                "two container requests in one call: {} responses (the API says one per \
                 request; the kubelet sends one request per call)",
                response.container_responses.len()
            )),
            Err(err) => findings.warn(format!(
                "two container requests in one call: {err} (the kubelet sends one per call)"
            )),
        }
    }
    if !summaries.is_empty() {
        findings.pass(summarized(&summaries));
    }
    findings.outcome("")
}

/// At most a few responses' contents, then how many more.
fn summarized(summaries: &[String]) -> String {
    const SHOWN: usize = 4;
    let shown = summaries[..summaries.len().min(SHOWN)].join(", ");
    match summaries.len().checked_sub(SHOWN).filter(|more| *more > 0) {
        Some(more) => format!("{shown} and {more} more"),
        None => shown,
    }
}

/// What a container response gives: `1 env, 1 device /dev/null→/dev/gpu0 rw, …`.
fn contents(response: &ContainerAllocateResponse) -> String {
    // `N things`, then each of them.
    let counted = |what: &str, named: Vec<String>| {
        let plural = if named.len() == 1 { "" } else { "s" };
        let mut said = format!("{} {what}{plural}", named.len());
        for item in named {
            said.push(' ');
            said.push_str(&item);
        }
        said
    };
    let plural = if response.envs.len() == 1 { "" } else { "s" };
    let devices = response.devices.iter();
    let mut parts = vec![
        format!("{} env{plural}", response.envs.len()),
        counted(
            "device",
            devices
                .map(|d| format!("{}→{} {}", d.host_path, d.container_path, d.permissions))
                .collect(),
        ),
        counted("mount", response.mounts.iter().map(|m| m.container_path.clone()).collect()),
        counted("CDI device", response.cdi_devices.iter().map(|d| d.name.clone()).collect()),
    ];
    if !response.annotations.is_empty() {
        parts.push(format!("{} annotation(s)", response.annotations.len()));
    }
    parts.join(", ")
}

/// What a runtime would refuse in a container response, each as a rule
/// broken: a device or mount whose host path is missing or relative, a
/// relative container path, permissions other than `r`, `w` and `m`, an
/// env name that is empty or has `=`, a CDI device name the CDI package
/// does not parse.
fn refused_by_runtime(response: &ContainerAllocateResponse) -> Vec<String> {
    let creates = "the runtime fails to create the container";
    let on_host = |path: &str| Path::new(path).is_absolute() && Path::new(path).exists();
    let mut refused = Vec::new();
    for device in &response.devices {
        if !on_host(&device.host_path) {
            refused.push(format!("device {:?} is not on the host: {creates}", device.host_path));
        }
        if !Path::new(&device.container_path).is_absolute() {
            refused.push(format!("device path {:?} is relative: {creates}", device.container_path));
        }
        if !device.permissions.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            refused.push(format!(
                "permissions {:?} are not of r, w, m: {creates}",
                device.permissions
            ));
        }
    }
    for mount in &response.mounts {
        if !on_host(&mount.host_path) {
            refused
                .push(format!("mount source {:?} is not on the host: {creates}", mount.host_path));
        }
        if !Path::new(&mount.container_path).is_absolute() {
            refused.push(format!("mount target {:?} is relative: {creates}", mount.container_path));
        }
    }
    for name in response.envs.keys() {
        if name.is_empty() || name.contains('=') {
            refused.push(format!("env name {name:?} cannot be set: {creates}"));
        }
    }
    for device in &response.cdi_devices {
        if let Err(why) = cdi::parse_device_id(&device.name) {
            refused.push(format!("{why}: the runtime cannot resolve it"));
        }
    }
    refused
}

/// `Allocate` on an id the plugin never listed: the kubelet never asks
/// for one, so taking it is a warning, not a failure.
async fn allocate_unknown(view: &DeviceView, resource: &str) -> Outcome {
    let request = ContainerAllocateRequest { devices_ids: vec![UNKNOWN.to_owned()] };
    match view.allocate(resource, AllocateRequest { container_requests: vec![request] }).await {
        Err(err) => Outcome::passed(format!("{UNKNOWN} refused: {err}")),
        Ok(response) => Outcome::warned(format!(
            "{UNKNOWN}, never listed, was allocated ({}): the kubelet asks only for listed ids, \
             but a plugin that takes any id hides a stale allocation after its own restart",
            response.container_responses.first().map_or_else(|| "no response".into(), contents)
        )),
    }
}

/// `GetPreferredAllocation`, when the plugin offers it, as the kubelet
/// asks: every healthy device available, the last one a must, two wanted.
/// The kubelet keeps only offered ids and fills up the size itself, so an
/// answer that ignores the request is a warning; an error fails the pod.
async fn preferred(view: &DeviceView, resource: &str, healthy: &[String]) -> Outcome {
    let offered = view.options(resource).is_some_and(|o| o.get_preferred_allocation_available);
    if !offered {
        return Outcome::skipped(
            "not offered (get_preferred_allocation_available=false): the kubelet does not call it",
        );
    }
    let (Some(must), true) = (healthy.last(), healthy.len() >= 2) else {
        return Outcome::skipped("one healthy device: no choice to prefer");
    };
    // Two: the least that leaves the plugin a choice besides the must.
    let size = 2;
    let request = ContainerPreferredAllocationRequest {
        available_device_i_ds: healthy.to_vec(),
        must_include_device_i_ds: vec![must.clone()],
        allocation_size: 2,
    };
    let asked = format!("{size} of {} with {must}", healthy.len());
    let request = PreferredAllocationRequest { container_requests: vec![request] };
    let response = match view.get_preferred_allocation(resource, request).await {
        Ok(response) => response,
        Err(err) => {
            return Outcome::failed(format!(
                "{asked}: {err}: the kubelet fails the pod's admission"
            ));
        }
    };
    let Some(chosen) = response.container_responses.first().map(|r| &r.device_i_ds) else {
        return Outcome::warned(format!(
            "{asked}: no container response: the kubelet chooses without the plugin"
        ));
    };
    let mut findings = Evidence::default();
    findings.pass(format!("{asked}: {chosen:?}"));
    let copes = "the kubelet keeps the offered ids and chooses the rest itself";
    if !chosen.contains(must) {
        findings.warn(format!("{must} was a must and is missing: {copes}"));
    }
    if chosen.len() != size {
        findings.warn(format!("{} ids for a size of {size}: {copes}", chosen.len()));
    }
    let strangers: Vec<&String> = chosen.iter().filter(|id| !healthy.contains(id)).collect();
    if !strangers.is_empty() {
        findings.warn(format!("{strangers:?} were not offered: {copes}"));
    }
    findings.outcome("")
}

/// `PreStartContainer`, when the plugin asks for it, on one device: an
/// error keeps the container from starting.
async fn pre_start(view: &DeviceView, resource: &str, healthy: &[String]) -> Outcome {
    let required = view.options(resource).is_some_and(|o| o.pre_start_required);
    if !required {
        return Outcome::skipped(
            "not required (pre_start_required=false): the kubelet does not call it",
        );
    }
    let ids = healthy[..1].to_vec();
    match view.pre_start_container(resource, ids.clone()).await {
        Ok(()) => Outcome::passed(format!("{ids:?} answered")),
        Err(err) => Outcome::failed(format!(
            "{ids:?}: {err}: the container does not start (\"PreStartContainer rpc failed\")"
        )),
    }
}

/// A health change, provoked by the hook: the kubelet must see a device's
/// health change within the bound, and the message must be the whole list
/// again (the kubelet takes each message as the whole list: a device left
/// out leaves its capacity).
async fn health_change_step(
    view: &DeviceView,
    resource: &str,
    hook: Option<&HookCall>,
    bound: Duration,
) -> Outcome {
    let Some(hook) = hook else {
        return Outcome::skipped(
            "no --health-change COMMAND to provoke one (for kpm-registrar's example plugin: \
             'kill -USR1 $KPM_CHECK_PID')",
        );
    };
    let healths = || -> BTreeMap<String, String> {
        let devices = view.resource(resource).map(|status| status.devices).unwrap_or_default();
        devices.into_iter().map(|d| (d.id, d.health)).collect()
    };
    let before = healths();
    let mut updates = view.changes();
    updates.mark_unchanged();
    let ran = Instant::now();
    if let Err(why) = hook.run().await {
        return Outcome::failed(format!("the hook {why}"));
    }
    let changed = tokio::time::timeout(bound, async {
        loop {
            let now = healths();
            if now != before {
                return now;
            }
            if updates.changed().await.is_err() {
                return now;
            }
        }
    })
    .await;
    let Ok(after) = changed else {
        return Outcome::failed(format!(
            "no health change reached the kubelet within {bound:?} of the hook: a device that \
             fails stays allocatable"
        ));
    };
    let took = ran.elapsed().as_millis();
    let flipped: Vec<String> = after
        .iter()
        .filter_map(|(id, health)| {
            let was = before.get(id)?;
            (was != health).then(|| format!("{id} {was}→{health}"))
        })
        .collect();
    let dropped: Vec<&String> = before.keys().filter(|id| !after.contains_key(*id)).collect();
    if !dropped.is_empty() {
        return Outcome::failed(format!(
            "the update after the hook ({}) left out {dropped:?}: the kubelet takes each \
             message as the whole list, so they left its capacity",
            flipped.join(", ")
        ));
    }
    Outcome::passed(format!(
        "{} {took} ms after the hook, in the whole list of {} devices",
        flipped.join(", "),
        after.len()
    ))
}

/// The kubelet's stream is still open at the end: a plugin that ends it
/// has its devices marked unhealthy until it registers again.
fn stream_open(view: &DeviceView, resource: &str, open: Duration) -> Outcome {
    match view.resource(resource) {
        Some(status) if !status.endpoint.is_empty() => Outcome::passed(format!(
            "still open after the checks above ({:.1} s of calls)",
            open.as_secs_f64()
        )),
        _ => Outcome::failed(
            "the plugin ended the ListAndWatch stream: the kubelet marks every device \
             unhealthy and the node's allocatable drops to 0 until the plugin registers again",
        ),
    }
}
