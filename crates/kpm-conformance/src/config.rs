//! What a run is given: the plugin's command, the kubelet root's place,
//! the API server and node name of the DRA checks, the bound of each wait,
//! the hooks that act on the plugin from outside, and whether warnings
//! fail. Set with [`Config`]'s methods, checked once by
//! [`Suite::try_new`](crate::Suite::try_new).

use std::path::PathBuf;
use std::time::Duration;

use crate::SuiteError;

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
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) command: Vec<String>,
    pub(crate) bound: Duration,
    pub(crate) kubeconfig: Option<PathBuf>,
    pub(crate) node: String,
    pub(crate) health_change: Option<String>,
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
        Self {
            command: command.into_iter().map(Into::into).collect(),
            bound: DEFAULT_BOUND,
            kubeconfig: None,
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
        self.kubeconfig = Some(path.into());
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
        self.health_change = Some(command.into());
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
        if self.command.first().is_none_or(String::is_empty) {
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
