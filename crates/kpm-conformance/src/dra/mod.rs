//! `kpm check`'s conversation with a DRA driver: what a kubelet and the
//! scheduler do with it. The driver's ResourceSlices are read back from the
//! API server; a ResourceClaim is allocated from one of their devices as the
//! scheduler allocates it, and prepared, prepared again and unprepared on
//! each DRA service the driver offers, as the kubelet's DRA manager
//! (`pkg/kubelet/cm/dra/manager.go`) calls it; the CDI devices it answers
//! must resolve in valid CDI specs ([`cdi`](super::cdi)). A claim never
//! prepared is unprepared, and a claim allocated to another driver is sent
//! along. Without an API server (no `--kubeconfig`) only what needs no
//! ResourceClaim runs; the rest is skipped.
//!
//! The kubelet is the referee: what makes it fail a pod fails the check; a
//! rule it does not hold a driver to (a CDI spec left behind, a claim it
//! never sends) is a warning.

mod beside;
mod call;
mod cluster;
mod events;
mod health;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kpm::dra::{DraService, DraView};
use kpm_api::dra::v1;

use self::beside::{claim_of_another_driver, shared_device};
use self::call::{Answers, Call, Prepared, judge_uids};
use self::cluster::{
    CLAIM_PREFIX, Claims, Made, NAMESPACE, SliceDevice, random_uid, resource_slices,
};
pub(crate) use self::events::{after_reboot, keep_prepared, slices_after_wipe};
use crate::Check;
use crate::cdi::{self, Severity};
use crate::hook::HookCall;
use crate::outcome::{Evidence, Outcome};

/// What the DRA checks need beyond the driver.
pub(crate) struct DraContext<'a> {
    /// The check kubelet's DRA manager, which makes the calls.
    pub(crate) dra: &'a DraView,
    /// A client of the API server from `--kubeconfig`; None without it
    /// (then the checks that need a ResourceClaim are skipped).
    pub(crate) api: Option<&'a kube::Client>,
    /// The node name the driver was given (`{node}`).
    pub(crate) node: &'a str,
    /// Where the driver was told to write CDI specs (`{cdi}`).
    pub(crate) cdi_dir: &'a Path,
    /// The bound of every wait and call (`--timeout`).
    pub(crate) bound: Duration,
    /// When the driver was started: its slices are those written since.
    pub(crate) started: Timestamp,
    /// What changes a device's health (`--health-change`), for the
    /// health check.
    pub(crate) health_change: Option<&'a HookCall>,
}

impl std::fmt::Debug for DraContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraContext")
            .field("api", &self.api.is_some())
            .field("node", &self.node)
            .field("cdi_dir", &self.cdi_dir)
            .field("bound", &self.bound)
            .finish()
    }
}

/// One service's claim checks.
struct Names {
    prepare: Check,
    again: Check,
    unprepare: Check,
    unknown: Check,
    other: Check,
    shared: Check,
    late: Check,
}

impl Names {
    fn of(service: DraService) -> Self {
        let [prepare, again, unprepare, unknown, other, shared, late] = Check::of_service(service);
        Self { prepare, again, unprepare, unknown, other, shared, late }
    }
}

/// The services of `services` (GetInfo's supported versions) the claims
/// are checked on, in the order they run.
fn offered(services: &[String]) -> Vec<DraService> {
    let offers = |service: &DraService| services.iter().any(|name| name == service.as_str());
    crate::check::SERVICES.into_iter().filter(offers).collect()
}

/// The DRA conversation with `driver` (its registered name) served at
/// `endpoint`, offering `services` (GetInfo's supported versions).
pub(crate) async fn converse(
    driver: &str,
    endpoint: &Path,
    services: &[String],
    ctx: &DraContext<'_>,
) -> Vec<(Check, Outcome)> {
    let mut checks = Vec::new();
    let offered = offered(services);
    let first_service = offered.first().copied();
    // The slices first: they are the driver's, whichever service.
    let slices = if let Some(client) = ctx.api {
        let (outcome, device) = resource_slices(client, driver, ctx).await;
        checks.push((Check::ResourceSlices, outcome));
        device
    } else {
        checks.push((
            Check::ResourceSlices,
            Outcome::skipped(
                "give --kubeconfig: the driver's ResourceSlices are read from the API server",
            ),
        ));
        None
    };
    // A driver offering neither service is refused at registration (and
    // by every kubelet from 1.34: `kubelet minors`), so it never gets here.
    // The claims, made once for every service; deleted at the end.
    let claims = match (ctx.api, slices) {
        (Some(client), Some(device)) => Some(Claims::create(client, driver, &device, ctx).await),
        _ => None,
    };
    for service in offered {
        let names = Names::of(service);
        let endpoint = endpoint.to_string_lossy();
        let call = Call { dra: ctx.dra, driver, endpoint: &endpoint, service };
        match claims.as_ref() {
            Some(Ok(claims)) => {
                checks.extend(with_claim(&call, &names, claims, ctx).await);
            }
            Some(Err(err)) => {
                for name in [names.prepare, names.again, names.unprepare, names.late] {
                    checks.push((name, Outcome::failed(err.clone())));
                }
            }
            None => {
                let why = if ctx.api.is_some() {
                    "no ResourceSlice device to allocate a claim from (see ResourceSlices)"
                } else {
                    "give --kubeconfig: a claim to prepare is a ResourceClaim the driver reads from the API server"
                };
                // A prepare with no claims needs no API server.
                let prepare = match call.prepare(Vec::new()).await {
                    Ok(answers) if answers.is_empty() => {
                        Outcome::skipped(format!("{why} (with no claims it answered none)"))
                    }
                    Ok(answers) => Outcome::failed(format!(
                        "with no claims it answered {} claims: the kubelet fails a pod on a claim it did not send",
                        answers.len()
                    )),
                    Err(err) => Outcome::failed(format!("with no claims: {err}")),
                };
                checks.push((names.prepare, prepare));
                for name in [names.again, names.unprepare, names.late] {
                    checks.push((name, Outcome::skipped(why)));
                }
            }
        }
        checks.push((names.unknown, unprepare_unknown(&call).await));
        let other = match claims.as_ref() {
            Some(Ok(claims)) => claim_of_another_driver(&call, claims).await,
            Some(Err(err)) => Outcome::failed(err.clone()),
            None => Outcome::skipped(
                "give --kubeconfig: the driver reads both claims from the API server",
            ),
        };
        checks.push((names.other, other));
        let shared = match claims.as_ref() {
            Some(Ok(claims)) => shared_device(&call, claims, ctx.cdi_dir).await,
            Some(Err(err)) => Outcome::failed(err.clone()),
            None => Outcome::skipped(
                "give --kubeconfig: a shared device is one of the driver's ResourceSlices",
            ),
        };
        checks.push((names.shared, shared));
    }
    let endpoint = endpoint.to_string_lossy();
    let call =
        first_service.map(|service| Call { dra: ctx.dra, driver, endpoint: &endpoint, service });
    let health = resource_health(&endpoint, call.as_ref(), claims.as_ref(), services, ctx);
    checks.push((Check::ResourceHealth, health.await));
    if let (Some(client), Some(Ok(claims))) = (ctx.api, &claims) {
        claims.delete(client, ctx.bound).await;
    }
    checks
}

/// `DRAResourceHealth`, watched while the driver's claim is prepared
/// (through `call`, on the first service offered), then unprepared.
async fn resource_health(
    endpoint: &str,
    call: Option<&Call<'_>>,
    claims: Option<&Result<Claims, String>>,
    services: &[String],
    ctx: &DraContext<'_>,
) -> Outcome {
    let prepared = match (claims, call) {
        (Some(Ok(claims)), Some(call)) => match call.prepare(vec![claims.ours.claim()]).await {
            Ok(answers) => match answers.get(&claims.ours.uid) {
                Some(prepared) if prepared.error.is_empty() => Ok(prepared
                    .devices
                    .iter()
                    .map(|device| (device.pool_name.clone(), device.device_name.clone()))
                    .collect()),
                Some(prepared) => Err(format!("its prepare failed: {:?}", prepared.error)),
                None => Err("its prepare answered no claim".to_owned()),
            },
            Err(err) => Err(err),
        },
        (Some(Err(err)), _) => Err(err.clone()),
        _ => Err("give --kubeconfig: a claim is a ResourceClaim".to_owned()),
    };
    let watched = health::Watched {
        endpoint,
        services,
        prepared: prepared.clone(),
        hook: ctx.health_change,
        bound: ctx.bound,
    };
    let outcome = health::resource_health(&watched).await;
    if let (Some(Ok(claims)), Some(call), Ok(_)) = (claims, call, &prepared) {
        let _ = call.unprepare(vec![claims.ours.claim()]).await;
    }
    outcome
}

/// What prepare made of the claim: the CDI spec files defining its ids.
#[derive(Debug, Default)]
struct Wrote {
    files: BTreeSet<PathBuf>,
    ids: Vec<String>,
}

/// Prepare, prepare again and unprepare the driver's claim on one service.
async fn with_claim(
    call: &Call<'_>,
    names: &Names,
    claims: &Claims,
    ctx: &DraContext<'_>,
) -> Vec<(Check, Outcome)> {
    let mut checks = Vec::new();
    let ours = &claims.ours;
    // Spec files there before the claim (a driver's devices common to
    // every claim) are not the claim's to remove.
    let before: Vec<PathBuf> = cdi::read_dir(ctx.cdi_dir)
        .map(|files| files.into_iter().map(|file| file.path).collect())
        .unwrap_or_default();
    let first = call.prepare(vec![ours.claim()]).await;
    let (outcome, made) = judge_prepare(&first, ours, &claims.device, ctx.cdi_dir);
    checks.push((names.prepare, outcome));
    let again = call.prepare(vec![ours.claim()]).await;
    checks.push((names.again, judge_again(&first, &again, &ours.uid)));
    let mut findings = Evidence::default();
    match call.unprepare(vec![ours.claim()]).await {
        Err(err) => findings.fail(err),
        Ok(answers) => {
            judge_uids(&answers, &[ours.uid.as_str()], &mut findings);
            match answers.get(&ours.uid) {
                Some(error) if !error.is_empty() => findings.fail(format!(
                    "claim {} failed: {error:?}: the kubelet retries and the pod does not go",
                    ours.name
                )),
                Some(_) => findings.pass(format!("claim {} unprepared", ours.name)),
                None => {}
            }
        }
    }
    // What prepare wrote for the claim goes, or stops naming its devices:
    // the kubelet does not look, the container runtime would still find them.
    for file in made.files.iter().filter(|file| !before.contains(file)) {
        if !file.exists() {
            findings.pass(format!("{} removed", shown(file)));
            continue;
        }
        let spec = cdi::read_file(file);
        let left: Vec<&String> = made
            .ids
            .iter()
            .filter(|id| {
                cdi::parse_device_id(id).is_ok_and(|(kind, name)| spec.defines(kind, name))
            })
            .collect();
        if left.is_empty() {
            findings.pass(format!("{} no longer names the claim's devices", shown(file)));
        } else {
            findings.warn(format!(
                "{} still defines {left:?} after unprepare: a stale CDI spec, the runtime still resolves the claim's devices",
                shown(file)
            ));
        }
    }
    checks.push((names.unprepare, findings.outcome("nothing to judge")));
    // A late prepare of the claim it unprepared: the kubelet sends one when
    // a pod goes while its prepare is in flight, and retries it.
    let late = call.prepare(vec![ours.claim()]).await;
    let (outcome, _) = judge_prepare(&late, ours, &claims.device, ctx.cdi_dir);
    checks.push((names.late, outcome));
    let _ = call.unprepare(vec![ours.claim()]).await;
    checks
}

/// A spec file as the report shows it: its name (it is in the CDI directory).
fn shown(file: &Path) -> String {
    file.file_name()
        .map_or_else(|| file.display().to_string(), |name| name.to_string_lossy().into_owned())
}

/// The first prepare: no error, devices of the allocation, CDI ids that
/// resolve in valid specs of the CDI directory.
fn judge_prepare(
    answer: &Result<Answers<Prepared>, String>,
    ours: &Made,
    device: &SliceDevice,
    cdi_dir: &Path,
) -> (Outcome, Wrote) {
    let mut findings = Evidence::default();
    let mut made = Wrote::default();
    let answers = match answer {
        Ok(answers) => answers,
        Err(err) => {
            findings.fail(err.clone());
            return (findings.outcome(""), made);
        }
    };
    judge_uids(answers, &[ours.uid.as_str()], &mut findings);
    let Some(prepared) = answers.get(&ours.uid) else {
        return (findings.outcome(""), made);
    };
    if !prepared.error.is_empty() {
        findings.fail(format!(
            "claim {} failed: {:?}: the kubelet fails the pod",
            ours.name, prepared.error
        ));
        return (findings.outcome(""), made);
    }
    findings.pass(format!("claim {} prepared: {}", ours.name, prepared.describe()));
    if prepared.devices.is_empty() {
        findings.warn(format!(
            "no devices for the allocated {}: the kubelet accepts it, the container gets nothing",
            device.describe()
        ));
    }
    judge_devices(prepared, ours, device, &mut findings);
    let ids: Vec<&String> = prepared.cdi_ids().collect();
    if ids.is_empty() && !prepared.devices.is_empty() {
        findings.warn(
            "no CDI device ids: the kubelet accepts it, the container runtime injects nothing",
        );
    }
    if ids.is_empty() {
        return (findings.outcome(""), made);
    }
    let specs = match cdi::read_dir(cdi_dir) {
        Ok(specs) => specs,
        Err(err) => {
            findings.fail(err);
            return (findings.outcome(""), made);
        }
    };
    for id in ids {
        made.ids.push(id.clone());
        let (kind, name) = match cdi::parse_device_id(id) {
            Ok(parsed) => parsed,
            Err(err) => {
                findings.fail(format!("{err}: the container runtime refuses it"));
                continue;
            }
        };
        let defining: Vec<&cdi::SpecFile> =
            specs.iter().filter(|spec| spec.defines(kind, name)).collect();
        match defining.as_slice() {
            [] => findings.fail(format!(
                "{id} is in no CDI spec of {}: the container runtime cannot resolve it",
                cdi_dir.display()
            )),
            [spec] => {
                made.files.insert(spec.path.clone());
                let file = spec.path.file_name().map(|f| f.to_string_lossy()).unwrap_or_default();
                if spec.problems.is_empty() {
                    findings.pass(format!("{id} resolves in {file}, a valid CDI spec"));
                }
                for problem in &spec.problems {
                    let line = format!("{id}: {file}: {}", problem.what);
                    match problem.severity {
                        Severity::Breaks => {
                            findings.fail(format!("{line} (the CDI package refuses the spec)"));
                        }
                        Severity::Stricter => findings.warn(line),
                    }
                }
            }
            several => {
                let files: Vec<String> =
                    several.iter().map(|spec| spec.path.display().to_string()).collect();
                made.files.extend(several.iter().map(|spec| spec.path.clone()));
                findings.fail(format!(
                    "{id} is defined in {files:?}: the CDI cache drops a device two specs define"
                ));
            }
        }
    }
    (findings.outcome(""), made)
}

/// The devices a prepare answered, against the allocation: the allocated
/// device, and its share when it is shared; the kubelet copes with either
/// off, so they warn.
fn judge_devices(prepared: &Prepared, ours: &Made, device: &SliceDevice, findings: &mut Evidence) {
    for answered in &prepared.devices {
        let (pool, name) = (&answered.pool_name, &answered.device_name);
        if (pool, name) != (&device.pool, &device.device) {
            findings.warn(format!(
                "device {pool}/{name} is not the allocated {}: the kubelet reports its health under that name",
                device.describe()
            ));
        }
        if let Some(answered) = &answered.share_id
            && ours.share.as_ref() != Some(answered)
        {
            findings.warn(format!(
                "share {answered} of {pool}/{name} is not the allocated {}: the kubelet keeps it and \
                 reads it nowhere",
                ours.share.as_deref().unwrap_or("(none: the device is not shared)")
            ));
        }
    }
}

/// The same call again answers the same: the kubelet calls again after a
/// failure elsewhere in the pod or a restart, and takes the answer.
fn judge_again(
    first: &Result<Answers<Prepared>, String>,
    again: &Result<Answers<Prepared>, String>,
    uid: &str,
) -> Outcome {
    match (first, again) {
        (_, Err(err)) => {
            Outcome::failed(format!("{err}: the kubelet retries, the pod does not start"))
        }
        (Ok(first), Ok(again)) => match (first.get(uid), again.get(uid)) {
            (_, None) => Outcome::failed("no answer for the claim: the kubelet fails the pod"),
            (_, Some(prepared)) if !prepared.error.is_empty() => Outcome::failed(format!(
                "the claim failed the second time: {:?}: the kubelet fails the pod",
                prepared.error
            )),
            (Some(before), Some(prepared)) if before == prepared => {
                Outcome::passed(format!("the same answer: {}", prepared.describe()))
            }
            (before, Some(prepared)) => Outcome::warned(format!(
                "a different answer: {} (first: {}): the kubelet takes the last, its first container may have another device",
                prepared.describe(),
                before.map_or_else(|| "none".into(), Prepared::describe)
            )),
        },
        (Err(_), Ok(again)) => match again.get(uid) {
            Some(prepared) if prepared.error.is_empty() => Outcome::passed(format!(
                "prepared the second time (the first failed): {}",
                prepared.describe()
            )),
            _ => Outcome::failed("failed both times"),
        },
    }
}

/// A claim the driver never prepared, unprepared: the kubelet does so
/// after a restart for what its checkpoint holds, and an error keeps the
/// pod from going (the kubelet retries it for ever).
async fn unprepare_unknown(call: &Call<'_>) -> Outcome {
    let uid = random_uid();
    let claim = v1::Claim {
        namespace: NAMESPACE.into(),
        uid: uid.clone(),
        name: format!("{CLAIM_PREFIX}never-prepared"),
    };
    let mut findings = Evidence::default();
    match call.unprepare(vec![claim]).await {
        Err(err) => findings.fail(format!(
            "{err}: the kubelet unprepares its checkpoint's claims after a restart, and retries while this fails"
        )),
        Ok(answers) => {
            judge_uids(&answers, &[uid.as_str()], &mut findings);
            match answers.get(&uid) {
                Some(error) if !error.is_empty() => findings.fail(format!(
                    "claim {uid} failed: {error:?}: the kubelet unprepares its checkpoint's claims after a restart, and the pod does not go while this fails"
                )),
                Some(_) => findings.pass(format!("claim {uid}, never prepared, unprepared with no error")),
                None => {}
            }
        }
    }
    findings.outcome("")
}
