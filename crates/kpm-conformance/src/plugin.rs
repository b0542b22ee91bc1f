//! The plugin a run checks, and what acts on it from outside: a command
//! started in a process group of its own (what `kpm check` runs), or a
//! plugin served in this process (a Rust plugin's own test; the suite's
//! unit tests, on paused time), told where to serve by a [`PluginEnv`] and
//! when to stop by a [`Stop`].

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::oneshot;

/// A boxed future, as the in-process plugin and hooks return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Serves a plugin in this process until told to stop, then returns; each
/// start of the plugin calls it again.
pub type Serve = Arc<dyn Fn(PluginEnv, Stop) -> BoxFuture<()> + Send + Sync>;

/// Acts on the running plugin from outside, once: `Err` says how it failed.
pub type Act = Arc<dyn Fn() -> BoxFuture<Result<(), String>> + Send + Sync>;

/// The plugin of a run.
#[derive(Clone)]
#[non_exhaustive]
pub enum Plugin {
    /// A command, its program first, with the placeholders of
    /// [`Config::new`](crate::Config::new) replaced.
    Command(Vec<String>),
    /// A plugin served in this process by `serve`, shown as `name`.
    InProcess { name: String, serve: Serve },
}

impl Plugin {
    /// How the report names it: the command, or the in-process plugin's name.
    pub(crate) fn shown(&self) -> Vec<String> {
        match self {
            Self::Command(command) => command.clone(),
            Self::InProcess { name, .. } => vec![format!("{name} (in process)")],
        }
    }
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Command(command) => f.debug_tuple("Command").field(command).finish(),
            Self::InProcess { name, .. } => {
                f.debug_struct("InProcess").field("name", name).finish()
            }
        }
    }
}

/// What acts on the plugin from outside.
#[derive(Clone)]
#[non_exhaustive]
pub enum Hook {
    /// A shell command, run by `sh -c` with the plugin's pid as
    /// `KPM_CHECK_PID` and the paths of its [`PluginEnv`] in its
    /// environment.
    Shell(String),
    /// A function of this process (for an in-process plugin).
    InProcess(Act),
}

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shell(command) => f.debug_tuple("Shell").field(command).finish(),
            Self::InProcess(_) => f.write_str("InProcess"),
        }
    }
}

/// Where the plugin serves and what it is told: the temporary kubelet
/// root and its directories, the node's name and the API server's
/// kubeconfig. A command gets them as placeholders and in its environment.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PluginEnv {
    /// The kubelet root (`{root}`, `KPM_CHECK_ROOT`).
    pub root: PathBuf,
    /// Its `plugins_registry` (`{registry}`, `KPM_CHECK_REGISTRY`).
    pub registry: PathBuf,
    /// Its `device-plugins`, with `kubelet.sock` (`{device-plugins}`,
    /// `KPM_CHECK_DEVICE_PLUGINS`).
    pub device_plugins: PathBuf,
    /// Its `plugins`, for endpoints (`{plugins}`, `KPM_CHECK_PLUGINS`).
    pub plugins: PathBuf,
    /// A directory for CDI specs (`{cdi}`, `KPM_CHECK_CDI`).
    pub cdi: PathBuf,
    /// The node's name (`{node}`, `KPM_CHECK_NODE`).
    pub node: String,
    /// The API server's kubeconfig, when the run has one
    /// (`{kubeconfig}`, `KPM_CHECK_KUBECONFIG`).
    pub kubeconfig: Option<PathBuf>,
    /// This start's own id, new each time the plugin is started (`{instance}`,
    /// `KPM_CHECK_INSTANCE`), as a DaemonSet's pods each have a uid: what
    /// tells two instances' sockets apart in a rolling update.
    pub instance: String,
}

impl PluginEnv {
    /// `(placeholder, environment variable, value)` of each thing it tells.
    pub(crate) fn substitutions(&self) -> Vec<(&'static str, &'static str, String)> {
        let path = |path: &PathBuf| path.to_string_lossy().into_owned();
        let mut substitutions = vec![
            ("{root}", "KPM_CHECK_ROOT", path(&self.root)),
            ("{registry}", "KPM_CHECK_REGISTRY", path(&self.registry)),
            ("{device-plugins}", "KPM_CHECK_DEVICE_PLUGINS", path(&self.device_plugins)),
            ("{plugins}", "KPM_CHECK_PLUGINS", path(&self.plugins)),
            ("{cdi}", "KPM_CHECK_CDI", path(&self.cdi)),
            ("{node}", "KPM_CHECK_NODE", self.node.clone()),
            ("{instance}", "KPM_CHECK_INSTANCE", self.instance.clone()),
        ];
        if let Some(kubeconfig) = &self.kubeconfig {
            substitutions.push(("{kubeconfig}", "KPM_CHECK_KUBECONFIG", path(kubeconfig)));
        }
        substitutions
    }

    /// The environment variables it sets, for a command and a shell hook.
    pub(crate) fn environment(&self) -> Vec<(&'static str, String)> {
        let substitutions = self.substitutions().into_iter();
        substitutions.map(|(_, variable, value)| (variable, value)).collect()
    }
}

/// Told to an in-process plugin: when it is to stop, as SIGTERM tells a
/// process.
#[derive(Debug)]
pub struct Stop(oneshot::Receiver<()>);

impl Stop {
    pub(crate) fn new() -> (oneshot::Sender<()>, Self) {
        let (tell, told) = oneshot::channel();
        (tell, Self(told))
    }

    /// Resolves when the plugin is to stop.
    pub async fn requested(self) {
        let _ = self.0.await;
    }
}
