//! The checks of the plugin's registration: that the kubelet registers
//! it, `GetInfo` within the kubelet's second, its type's checks (a second
//! look on a kubelet of its own), the kubelet minors and its sockets' names.

use std::path::PathBuf;
use std::time::Duration;

use kpm::{ExecutorError, KubeletHandle, PluginDetails, Step};
use tokio::time::Instant;

use super::node::{Node, Registrations, Socket};
use super::plugin::{Dirs, Running, evidence};
use crate::Check;
use crate::outcome::{Evidence, Mark, Outcome, Subject};
use crate::wait::POLL;

/// Waits until the kubelet has registered something of the plugin, and
/// then until nothing more comes for a moment (a plugin may register
/// several sockets).
pub(super) async fn wait_registered(
    node: &Node,
    dirs: &Dirs,
    plugin: &mut Running,
    bound: Duration,
) -> Result<Registrations, String> {
    let deadline = Instant::now() + bound;
    loop {
        let registered = node.registered(dirs);
        if !registered.is_empty() {
            // Settled once it stays the same for 100 ms.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let settled = node.registered(dirs);
            if settled == registered {
                return Ok(registered);
            }
            continue;
        }
        if let Some(status) = plugin.exited() {
            return Err(format!(
                "the plugin exited ({status}) before it registered; {}",
                evidence(dirs)
            ));
        }
        if Instant::now() >= deadline {
            let pending: Vec<String> = node
                .handle
                .manager()
                .status()
                .into_iter()
                .map(|status| {
                    let error = status.last_error.unwrap_or_default();
                    format!("{} {}: {error}", status.socket_path.display(), status.state.as_str())
                })
                .collect();
            return Err(format!(
                "nothing registered within {bound:?}; the registry holds {pending:?}; {}",
                evidence(dirs)
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `GetInfo` within the kubelet's second, and each type's checks, by the
/// inspection `kpm probe` shows, made by `handle`'s kubelet; a device
/// plugin on `kubelet.sock` has no `GetInfo`, its service is inspected as
/// the device manager connects.
pub(super) async fn inspect(
    handle: &KubeletHandle,
    dirs: &Dirs,
    registered: &Registrations,
) -> Vec<(Check, Outcome)> {
    let kubelet_get_info = kpm::ExecutorConfig::default().get_info_timeout;
    let (mut get_info, mut checks, mut dra) =
        (Evidence::default(), Evidence::default(), Vec::new());
    for Socket { path: socket, .. } in &registered.sockets {
        let shown = dirs.shown(socket);
        let about = || Subject::Socket(socket.clone());
        let inspection = handle.manager().inspect(socket).await;
        if let Some(info) =
            inspection.info.as_ref().filter(|info| info.r#type == kpm::api::DRA_PLUGIN)
        {
            dra.push((socket.clone(), shown.clone(), info.supported_versions.clone()));
        }
        match (inspection.took(Step::GetInfo), &inspection.outcome) {
            (_, Err(ExecutorError::GetInfoTimeout { .. })) => {
                get_info
                    .add(
                        Mark::Fail,
                        format!("{shown}: no answer within the kubelet's {kubelet_get_info:?}"),
                    )
                    .about(about());
            }
            (Some(took), _) => {
                get_info
                    .add(
                        Mark::Pass,
                        format!("{shown} answered in {:.1} ms", took.as_secs_f64() * 1000.0),
                    )
                    .about(about())
                    .took(took);
            }
            (None, Err(err)) => {
                get_info.add(Mark::Fail, format!("{shown}: {}", err.reason())).about(about());
            }
            (None, Ok(())) => {}
        }
        match &inspection.outcome {
            Ok(()) => {
                let service =
                    inspection.service.as_ref().map_or_else(|| "ok".into(), ToString::to_string);
                checks.add(Mark::Pass, format!("{shown}: {service}")).about(about());
            }
            Err(ExecutorError::GetInfoTimeout { .. }) => {}
            Err(err) => {
                let step = inspection.failed_step().map_or("inspection", Step::name);
                checks.add(Mark::Fail, format!("{shown}: {step}: {}", err.reason())).about(about());
            }
        }
    }
    for (resource, endpoint) in &registered.resources {
        let about = Subject::Resource(resource.clone());
        let (mark, said) = match handle.devices().inspect_endpoint(resource, endpoint).await {
            Ok(report) => (Mark::Pass, format!("{resource}: {report}")),
            Err(err) => (Mark::Fail, format!("{resource}: {}", kpm_api::gotext::error_chain(&err))),
        };
        checks.add(mark, said).about(about);
    }
    vec![
        (
            Check::GetInfoWithin1s,
            get_info.outcome("registered through kubelet.sock only: no GetInfo"),
        ),
        (Check::TypeChecks, checks.outcome("nothing to check")),
        (Check::KubeletMinors, minors(&dra)),
    ]
}

/// What each kubelet minor kpm was checked against does with each DRA
/// driver, by the services it offers (`kpm_minors::dra_handling`, the rule
/// `kpm doctor` judges by too): fails when a kubelet from 1.32 on would
/// refuse it or call it on an API it does not serve. 1.31's DRA (alpha,
/// v1alpha4 only) is only reported. The other types register alike on
/// every minor.
fn minors(dra: &[(PathBuf, String, Vec<String>)]) -> Outcome {
    use kpm_minors::{CHECKED_MINORS, DraApi, DraHandling, V1BETA1_FROM, dra_handling};
    if dra.is_empty() {
        let (first, last) = (CHECKED_MINORS.start(), CHECKED_MINORS.end());
        return Outcome::skipped(format!(
            "no DRA driver: kubelets 1.{first} to 1.{last} take CSI drivers and device plugins alike"
        ));
    }
    let mut findings = Evidence::default();
    for (socket, shown, services) in dra {
        let mut failed = false;
        // Consecutive minors that do the same, as `(first, last, what)`.
        let mut spans: Vec<(u32, u32, String)> = Vec::new();
        for minor in CHECKED_MINORS {
            let handling = dra_handling(minor, services);
            failed |= minor >= V1BETA1_FROM && !matches!(handling, DraHandling::Calls(_));
            let what = match handling {
                DraHandling::Calls(api) => format!("call {api}"),
                DraHandling::CallsUnserved => format!(
                    "register it, then call {}, which it does not offer: its claims fail",
                    DraApi::V1alpha4
                ),
                DraHandling::Refuses(why) => format!("refuse it: {why}"),
                other => format!("{other:?}"),
            };
            match spans.last_mut() {
                Some((_, last, said)) if *said == what => *last = minor,
                _ => spans.push((minor, minor, what)),
            }
        }
        let said: Vec<String> = spans
            .iter()
            .rev()
            .map(|(first, last, what)| {
                if first == last {
                    format!("1.{first} {what}")
                } else {
                    format!("1.{first}-1.{last} {what}")
                }
            })
            .collect();
        let mark = if failed { Mark::Fail } else { Mark::Pass };
        findings
            .add(mark, format!("{shown}: kubelets {}", said.join(", ")))
            .about(Subject::Socket(socket.clone()));
    }
    findings.outcome("")
}

/// Registration sockets named `<name>-reg.sock` (a name's `/` as `_`), or
/// `<name>-<uid>-reg.sock` for one instance of several (DRA rolling
/// updates). The kubelet takes any name (Kubernetes' own sample device
/// plugin calls its socket `dp.<time>`), so another is a warning.
pub(super) fn names(registered: &Registrations) -> Outcome {
    let mut findings = Evidence::default();
    for Socket { path: socket, plugin: PluginDetails { name, .. }, .. } in &registered.sockets {
        let file = socket.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        let prefix = name.replace('/', "_");
        let conforms = file.strip_suffix("-reg.sock").is_some_and(|stem| {
            stem == prefix || stem.strip_prefix(&prefix).is_some_and(|uid| uid.starts_with('-'))
        });
        if conforms {
            findings.pass(format!("{file}: <name>-reg.sock or <name>-<uid>-reg.sock"));
        } else {
            findings.warn(format!(
                "{file} should be {prefix}-reg.sock (or {prefix}-<uid>-reg.sock per instance): \
                 the kubelet takes any name, but node-driver-registrar and the kubelet's \
                 helpers name it so, and tools find it by that name"
            ));
        }
    }
    findings.outcome("registered through kubelet.sock only: no registration socket")
}
