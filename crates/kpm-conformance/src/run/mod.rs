//! A run: the checks that judge the plugin, in their order, from its
//! registration through the conversation of its type to the restarts and
//! SIGTERM, each ending in an [`Outcome`] for the [`Report`]. [`node`] is
//! the check's kubelet, [`plugin`] the plugin's process and its root.

mod node;
mod plugin;

use std::path::PathBuf;
use std::time::Duration;

use kpm::{ExecutorError, Kubelet, KubeletHandle, PluginDetails, Step};
use tokio::time::Instant;

use self::node::{Node, Registrations, Socket, endpoint_path};
use self::plugin::{Api, Dirs, Running, Settings, evidence};
use crate::config::ApiServer;
use crate::hook::HookCall;
use crate::outcome::{Evidence, Mark, Outcome, Subject};
use crate::plugin::Plugin;
use crate::wait::{POLL, wait_for};
use crate::{Check, Config, Report, SuiteError, csi, device, dra};

/// Runs the plugin of `config` through every check.
pub(crate) async fn run(config: &Config) -> Result<Report, SuiteError> {
    let mut temp = tempfile::Builder::new();
    temp.prefix("kpm-check-");
    let parent = config.root_parent.clone().unwrap_or_else(std::env::temp_dir);
    let temp = temp
        .tempdir_in(&parent)
        .map_err(|source| SuiteError::CreateRoot { path: parent.clone(), source })?;
    let api = match &config.api {
        Some(ApiServer::Kubeconfig(kubeconfig)) => {
            let client = kpm::kube::client_from_kubeconfig(kubeconfig).await.map_err(|source| {
                SuiteError::ReadKubeconfig { path: kubeconfig.clone(), source: Box::new(source) }
            })?;
            Some(Api { client, kubeconfig: Some(kubeconfig.clone()) })
        }
        Some(ApiServer::Client(client)) => Some(Api { client: client.clone(), kubeconfig: None }),
        None => None,
    };
    let kubeconfig = api.as_ref().and_then(|api| api.kubeconfig.clone());
    let dirs = Dirs::create(temp.path(), &config.node, kubeconfig)?;
    let started = Instant::now();
    let settings = Settings {
        bound: config.bound,
        health_change: config.health_change.clone(),
        node: config.node.clone(),
        api,
    };
    let checks = checks(&config.plugin, &dirs, &settings).await?;
    let kept = config.keep_root.then(|| temp.keep());
    Ok(Report::new(config.plugin.shown(), checks, kept, started.elapsed(), config.strict))
}

/// Runs the plugin's `command` against a kubelet on `dirs`, check by
/// check, each wait bounded by `settings.bound`; the checks that cannot run
/// once the plugin failed to register are skipped.
async fn checks(
    plugin_of: &Plugin,
    dirs: &Dirs,
    settings: &Settings,
) -> Result<Vec<(Check, Outcome)>, SuiteError> {
    let bound = settings.bound;
    let mut steps: Vec<(Check, Outcome)> = Vec::new();
    let mut node = Node::start(dirs)?;
    let started_at = k8s_openapi::jiff::Timestamp::now();
    let mut plugin = Running::start(plugin_of, dirs)?;
    let started = Instant::now();
    let registered = wait_registered(&node, dirs, &mut plugin, bound).await;
    let registered = match registered {
        Ok(registered) => {
            let took = started.elapsed();
            steps.push((
                Check::Registers,
                Outcome::passed(format!(
                    "{} ({} ms after start)",
                    registered.describe(dirs),
                    took.as_millis()
                )),
            ));
            Some(registered)
        }
        Err(reason) => {
            steps.push((Check::Registers, Outcome::failed(reason)));
            None
        }
    };
    if let Some(registered) = &registered {
        // A kubelet of its own, with nothing registered: the running one's
        // CSI handler would refuse the driver it holds as a duplicate.
        let get_info = kpm::ExecutorConfig::default().get_info_timeout;
        let judge = Kubelet::builder()
            .root_dir(dirs.root())
            .inspect_only(bound, get_info)
            .build()
            .map_err(|err| SuiteError::BuildKubelet(Box::new(err)))?;
        steps.extend(inspect(&judge.handle(), dirs, registered).await);
        steps.push((Check::SocketNames, names(registered)));
        let hook = settings.health_change.as_ref().map(|hook| {
            let mut env = dirs.env.environment();
            env.push(("KPM_CHECK_PID", plugin.pid().unwrap_or_default().to_string()));
            HookCall::new(hook.clone(), env, bound)
        });
        let before =
            converse(&node, dirs, registered, settings, hook.as_ref(), started_at, &mut steps)
                .await;
        node.stop().await?;
        let restarted = Instant::now();
        node = Node::start(dirs)?;
        let again =
            wait_for(bound, || node.registered(dirs).same_names(registered).then_some(())).await;
        steps.push((
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
        steps.push((Check::Sigterm, terminate(&node, dirs, &mut plugin, registered, bound).await));
        let restart =
            restart_plugin(plugin_of, &node, dirs, settings, &mut plugin, registered, &before);
        steps.push((Check::PluginRestart, restart.await));
    } else {
        for name in [
            Check::GetInfoWithin1s,
            Check::TypeChecks,
            Check::KubeletMinors,
            Check::SocketNames,
            Check::KubeletRestart,
            Check::Sigterm,
            Check::PluginRestart,
        ] {
            steps.push((name, Outcome::skipped("the plugin never registered")));
        }
    }
    // What is left of the plugin goes now.
    plugin.kill().await;
    node.stop().await?;

    Ok(steps)
}

/// What the conversation saw, for the plugin's restart to be held to.
#[derive(Debug, Default)]
struct Before {
    /// Device plugins' resources and how many devices were healthy at first.
    healthy: Vec<(String, usize)>,
    /// CSI drivers' names, endpoints and node ids.
    node_ids: Vec<(String, String, String)>,
}

/// The conversation each registered plugin has with the kubelet after its
/// registration, by type (`device`, `csi`, `dra`), its steps pushed to
/// `steps`; the plugin was `started` then.
async fn converse(
    node: &Node,
    dirs: &Dirs,
    registered: &Registrations,
    settings: &Settings,
    health_change: Option<&HookCall>,
    started: k8s_openapi::jiff::Timestamp,
    steps: &mut Vec<(Check, Outcome)>,
) -> Before {
    let bound = settings.bound;
    let mut before = Before::default();
    let devices = node.handle.devices();
    for (resource, endpoint) in registered.device_endpoints() {
        let (said, healthy) =
            device::converse(devices, &resource, &endpoint, health_change, bound).await;
        steps.extend(said);
        before.healthy.push((resource, healthy));
    }
    for socket in registered.of_type(kpm::api::CSI_PLUGIN) {
        let endpoint = socket.plugin.endpoint.target().into_owned();
        let (said, node_id) = csi::converse(&socket.plugin.name, &endpoint, bound).await;
        steps.extend(said);
        if let Some(node_id) = node_id {
            before.node_ids.push((socket.plugin.name.clone(), endpoint, node_id));
        }
    }
    let context = dra::DraContext {
        dra: node.handle.dra(),
        api: settings.api.as_ref().map(|api| &api.client),
        node: &settings.node,
        cdi_dir: &dirs.env.cdi,
        bound,
        started,
    };
    for socket in registered.of_type(kpm::api::DRA_PLUGIN) {
        let (name, versions) = (&socket.plugin.name, &socket.plugin.versions);
        let endpoint = endpoint_path(&socket.plugin.endpoint);
        steps.extend(dra::converse(name, &endpoint, versions, &context).await);
    }
    before
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
    let devices = node.handle.devices();
    for (resource, healthy) in &before.healthy {
        let back = wait_for(bound, || {
            devices.resource(resource).map(|status| status.healthy).filter(|now| now >= healthy)
        });
        match back.await {
            Some(now) => findings.pass(format!("{resource}: {now} healthy again")),
            None => findings.fail(format!(
                "{resource}: {} healthy {bound:?} after its restart, {healthy} before: the \
                 node's allocatable stays short",
                devices.resource(resource).map_or(0, |status| status.healthy)
            )),
        }
    }
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

/// Waits until the kubelet has registered something of the plugin, and
/// then until nothing more comes for a moment (a plugin may register
/// several sockets).
async fn wait_registered(
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
async fn inspect(
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
fn names(registered: &Registrations) -> Outcome {
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
