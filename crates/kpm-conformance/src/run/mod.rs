//! A run: the checks that judge the plugin, in their order, from its
//! registration through the conversation of its type to the restarts and
//! SIGTERM, each ending in an [`Outcome`] for the [`Report`]. [`node`] is
//! the check's kubelet, [`plugin`] the plugin's process and its root.

mod events;
mod node;
mod plugin;
mod registration;
mod rolling;

use kpm::Kubelet;
use tokio::time::Instant;

use self::events::Before;
use self::node::{Node, Registrations};
use self::plugin::{Api, Dirs, Running, Settings};
use self::registration::{inspect, names, wait_registered};
use crate::config::ApiServer;
use crate::hook::HookCall;
use crate::outcome::Outcome;
use crate::plugin::Plugin;
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

/// What every check of a run is given.
struct Run<'a> {
    plugin_of: &'a Plugin,
    dirs: &'a Dirs,
    settings: &'a Settings,
    /// When the plugin was first started.
    started_at: k8s_openapi::jiff::Timestamp,
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
    let mut made: Vec<(Check, Outcome)> = Vec::new();
    let mut node = Node::start(dirs)?;
    let started_at = k8s_openapi::jiff::Timestamp::now();
    let mut plugin = Running::start(plugin_of, dirs)?;
    let started = Instant::now();
    let registered = wait_registered(&node, dirs, &mut plugin, bound).await;
    let registered = match registered {
        Ok(registered) => {
            let took = started.elapsed();
            made.push((
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
            made.push((Check::Registers, Outcome::failed(reason)));
            None
        }
    };
    if let Some(registered) = &registered {
        // A kubelet of its own, with nothing registered: the running one's
        // CSI handler would refuse the driver it holds as a duplicate.
        let get_info = kpm::ExecutorConfig::default().get_info_timeout;
        let judge = Kubelet::builder()
            .root_dir(dirs.root())
            .inspect_only(bound, get_info, kpm::transport::HostRoot::default())
            .build()
            .map_err(|err| SuiteError::BuildKubelet(Box::new(err)))?;
        made.extend(inspect(&judge.handle(), dirs, registered).await);
        made.push((Check::SocketNames, names(registered)));
        let hook = settings.health_change.as_ref().map(|hook| {
            let mut env = dirs.env.environment();
            env.push(("KPM_CHECK_PID", plugin.pid().unwrap_or_default().to_string()));
            HookCall::new(hook.clone(), env, bound)
        });
        let before =
            converse(&node, dirs, registered, settings, hook.as_ref(), started_at, &mut made).await;
        let run = Run { plugin_of, dirs, settings, started_at };
        node = events::node_events(&run, node, &mut plugin, registered, &before, &mut made).await?;
    } else {
        for name in [
            Check::GetInfoWithin1s,
            Check::TypeChecks,
            Check::KubeletMinors,
            Check::SocketNames,
            Check::KubeletRestart,
            Check::DevicesAfterKubeletRestart,
            Check::SlicesAfterWipe,
            Check::Sigterm,
            Check::PluginRestart,
            Check::PrepareAfterReboot,
            Check::RollingUpdate,
        ] {
            made.push((name, Outcome::skipped("the plugin never registered")));
        }
    }
    // What is left of the plugin goes now.
    plugin.kill().await;
    node.stop().await?;

    Ok(made)
}

/// The conversation each registered plugin has with the kubelet after its
/// registration, by type (`device`, `csi`, `dra`), its checks pushed to
/// `made`; the plugin was `started` then.
async fn converse(
    node: &Node,
    dirs: &Dirs,
    registered: &Registrations,
    settings: &Settings,
    health_change: Option<&HookCall>,
    started: k8s_openapi::jiff::Timestamp,
    made: &mut Vec<(Check, Outcome)>,
) -> Before {
    let bound = settings.bound;
    let mut before = Before::default();
    let devices = node.handle.devices();
    for (resource, endpoint) in registered.device_endpoints() {
        let (said, healthy) =
            device::converse(devices, &resource, &endpoint, health_change, bound).await;
        made.extend(said);
        before.healthy.push((resource, healthy));
    }
    for socket in registered.of_type(kpm::api::CSI_PLUGIN) {
        let endpoint = socket.plugin.endpoint.target().into_owned();
        let (said, node_id) = csi::converse(&socket.plugin.name, &endpoint, bound).await;
        made.extend(said);
        if let Some(node_id) = node_id {
            before.node_ids.push((socket.plugin.name.clone(), endpoint, node_id));
        }
    }
    let context = dra::DraContext { health_change, ..dra_context(node, settings, dirs, started) };
    for socket in registered.of_type(kpm::api::DRA_PLUGIN) {
        let (name, versions) = (&socket.plugin.name, &socket.plugin.versions);
        let endpoint = socket.plugin.endpoint.socket_path().to_path_buf();
        made.extend(dra::converse(name, &endpoint, versions, &context).await);
    }
    before
}

/// What the DRA checks are given, on `node`'s kubelet; the plugin was
/// started then.
fn dra_context<'a>(
    node: &'a Node,
    settings: &'a Settings,
    dirs: &'a Dirs,
    started: k8s_openapi::jiff::Timestamp,
) -> dra::DraContext<'a> {
    dra::DraContext {
        dra: node.handle.dra(),
        api: settings.api.as_ref().map(|api| &api.client),
        node: &settings.node,
        cdi_dir: &dirs.env.cdi,
        bound: settings.bound,
        started,
        health_change: None,
    }
}
