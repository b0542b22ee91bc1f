//! What a run is given: the plugin's command, the kubelet root's place,
//! the API server and node name of the DRA checks, the bound of each wait,
//! the hooks that act on the plugin from outside, and whether warnings
//! fail. Set with [`Config`]'s methods, checked once by
//! [`Suite::try_new`](crate::Suite::try_new).

use std::path::PathBuf;
use std::time::Duration;

use crate::SuiteError;
use crate::plugin::{Act, Hook, Plugin, Serve};

/// The node name a plugin is told it runs on, unless set.
pub const DEFAULT_NODE: &str = "kpm-check-node";
/// How long each wait may take, unless set.
pub const DEFAULT_BOUND: Duration = Duration::from_secs(30);

/// A run's settings.
///
/// ```no_run
/// # async fn example() -> Result<(), kpm_conformance::SuiteError> {
/// let config = kpm_conformance::Config::new(["target/debug/my-plugin", "--registry", "{registry}"])
///     .health_change("kill -USR1 $KPM_CHECK_PID");
/// kpm_conformance::Suite::try_new(config)?.run().await?.assert_conformant();
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Config {
    pub(crate) plugin: Plugin,
    pub(crate) bound: Duration,
    pub(crate) api: Option<ApiServer>,
    pub(crate) node: String,
    pub(crate) health_change: Option<Hook>,
    pub(crate) root_parent: Option<PathBuf>,
    pub(crate) keep_root: bool,
    pub(crate) strict: bool,
}

impl Config {
    /// The plugin's command, its program first. `{root}`, `{registry}`,
    /// `{device-plugins}` and `{plugins}` in its arguments become the
    /// temporary kubelet root, its `plugins_registry`, `device-plugins` and
    /// `plugins` directories, `{cdi}` a directory for CDI specs, `{node}`
    /// the node's name and `{kubeconfig}` the kubeconfig, also given as
    /// `KPM_CHECK_ROOT`, `KPM_CHECK_REGISTRY`, `KPM_CHECK_DEVICE_PLUGINS`,
    /// `KPM_CHECK_PLUGINS`, `KPM_CHECK_CDI`, `KPM_CHECK_NODE` and
    /// `KPM_CHECK_KUBECONFIG`.
    pub fn new(command: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self::of(Plugin::Command(command.into_iter().map(Into::into).collect()))
    }

    /// A plugin served in this process by `serve`, called at each start
    /// with where to serve ([`PluginEnv`](crate::PluginEnv)) and when to
    /// stop ([`Stop`](crate::Stop)), shown in the report as `name`.
    pub fn in_process(name: impl Into<String>, serve: Serve) -> Self {
        Self::of(Plugin::InProcess { name: name.into(), serve })
    }

    fn of(plugin: Plugin) -> Self {
        Self {
            plugin,
            bound: DEFAULT_BOUND,
            api: None,
            node: DEFAULT_NODE.to_owned(),
            health_change: None,
            root_parent: None,
            keep_root: false,
            strict: false,
        }
    }

    /// How long the plugin may take to register, to register again after
    /// a restart, to go after SIGTERM, and each call to answer.
    #[must_use]
    pub fn bound(mut self, bound: Duration) -> Self {
        self.bound = bound;
        self
    }

    /// The kubeconfig of an API server for the DRA checks (ResourceSlices
    /// read back, ResourceClaims allocated from them and prepared); without
    /// it those checks are skipped.
    #[must_use]
    pub fn kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.api = Some(ApiServer::Kubeconfig(path.into()));
        self
    }

    /// The API server of the DRA checks, as a client of this process (an
    /// in-process plugin's test): the plugin is told no kubeconfig.
    #[must_use]
    pub fn api_client(mut self, client: kube::Client) -> Self {
        self.api = Some(ApiServer::Client(client));
        self
    }

    /// The node the plugin is told it runs on: a DRA driver's
    /// ResourceSlices and claims are this node's.
    #[must_use]
    pub fn node_name(mut self, name: impl Into<String>) -> Self {
        self.node = name.into();
        self
    }

    /// A shell command that makes one of the device plugin's devices
    /// change health, run once with `KPM_CHECK_PID` (the plugin's pid) and
    /// the paths in its environment; without it the health-change check is
    /// skipped.
    #[must_use]
    pub fn health_change(mut self, command: impl Into<String>) -> Self {
        self.health_change = Some(Hook::Shell(command.into()));
        self
    }

    /// [`health_change`](Self::health_change) as a function of this
    /// process, for an in-process plugin.
    #[must_use]
    pub fn health_change_with(mut self, act: Act) -> Self {
        self.health_change = Some(Hook::InProcess(act));
        self
    }

    /// Where the temporary kubelet root is made (default: the system's
    /// temporary directory). Its path must leave room for socket names:
    /// a Unix socket's path is at most 107 bytes.
    #[must_use]
    pub fn root_in(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root_parent = Some(dir.into());
        self
    }

    /// Keeps the kubelet root, with the plugin's output in `plugin.out`
    /// and `plugin.err`, instead of removing it.
    #[must_use]
    pub fn keep_root(mut self, keep: bool) -> Self {
        self.keep_root = keep;
        self
    }

    /// Strict mode: a warning makes the plugin not conformant too.
    #[must_use]
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// Checks the settings.
    pub(crate) fn validate(&self) -> Result<(), SuiteError> {
        if let Plugin::Command(command) = &self.plugin
            && command.first().is_none_or(String::is_empty)
        {
            return Err(SuiteError::NoCommand);
        }
        let max = kpm::api::MAX_CONFIG_DURATION;
        if self.bound < Duration::from_secs(1) || self.bound > max {
            return Err(SuiteError::Bound { bound: self.bound, max });
        }
        if !kpm_api::is_dns1123_subdomain(&self.node) {
            return Err(SuiteError::NodeName(self.node.clone()));
        }
        Ok(())
    }
}

/// The API server of the DRA checks.
#[derive(Clone)]
pub(crate) enum ApiServer {
    /// Its kubeconfig, also given to the plugin.
    Kubeconfig(PathBuf),
    /// A client of this process.
    Client(kube::Client),
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let api = match &self.api {
            Some(ApiServer::Kubeconfig(path)) => Some(path.display().to_string()),
            Some(ApiServer::Client(_)) => Some("a client".to_owned()),
            None => None,
        };
        f.debug_struct("Config")
            .field("plugin", &self.plugin)
            .field("bound", &self.bound)
            .field("api", &api)
            .field("node", &self.node)
            .field("health_change", &self.health_change)
            .field("root_parent", &self.root_parent)
            .field("keep_root", &self.keep_root)
            .field("strict", &self.strict)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_is_checked_once_for_what_would_fail_later() {
        let ok = Config::new(["plugin"]);
        assert!(ok.validate().is_ok());
        let cases = [
            (Config::new(Vec::<String>::new()), "no plugin command"),
            (Config::new([""]), "no plugin command"),
            (Config::new(["p"]).bound(Duration::from_millis(10)), "between 1 s"),
            (Config::new(["p"]).node_name("Node_1"), "\"Node_1\" is no DNS subdomain"),
        ];
        for (config, error) in cases {
            let err = config.validate().err().map(|err| err.to_string()).unwrap_or_default();
            assert!(err.contains(error), "{config:?}: {err}");
        }
    }
}
