//! The plugin of a check: the temporary kubelet root it is given, the
//! user's settings, its process group, and its output as evidence.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::SuiteError;

/// The temporary kubelet root and its directories.
pub(super) struct Dirs {
    pub(super) root: PathBuf,
    registry: PathBuf,
    pub(super) device_plugins: PathBuf,
    plugins: PathBuf,
    pub(super) cdi: PathBuf,
}

impl Dirs {
    /// The kubelet's directories under `root`, created.
    pub(super) fn create(root: &Path) -> Result<Self, SuiteError> {
        let dirs = Self {
            root: root.to_path_buf(),
            registry: root.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME),
            device_plugins: root.join(kpm::api::DEVICE_PLUGINS_DIR_NAME),
            plugins: root.join("plugins"),
            cdi: root.join("cdi"),
        };
        for dir in [&dirs.registry, &dirs.device_plugins, &dirs.plugins, &dirs.cdi] {
            std::fs::create_dir_all(dir)
                .map_err(|source| SuiteError::CreateRoot { path: dir.clone(), source })?;
        }
        Ok(dirs)
    }

    /// `path` as the report shows it: relative to the root.
    pub(super) fn shown(&self, path: &Path) -> String {
        path.strip_prefix(&self.root).unwrap_or(path).display().to_string()
    }

    /// `(placeholder, environment variable, value)` of the plugin's
    /// command: the paths, the node's name and the kubeconfig, if given.
    fn substitutions(&self, settings: &Settings) -> Vec<(&'static str, &'static str, OsString)> {
        let paths = [
            ("{root}", "KPM_CHECK_ROOT", &self.root),
            ("{registry}", "KPM_CHECK_REGISTRY", &self.registry),
            ("{device-plugins}", "KPM_CHECK_DEVICE_PLUGINS", &self.device_plugins),
            ("{plugins}", "KPM_CHECK_PLUGINS", &self.plugins),
            ("{cdi}", "KPM_CHECK_CDI", &self.cdi),
        ];
        let mut substitutions: Vec<_> = paths
            .into_iter()
            .map(|(placeholder, variable, path)| (placeholder, variable, path.clone().into()))
            .collect();
        substitutions.push(("{node}", "KPM_CHECK_NODE", settings.node.clone().into()));
        if let Some(api) = &settings.api {
            substitutions.push((
                "{kubeconfig}",
                "KPM_CHECK_KUBECONFIG",
                api.kubeconfig.clone().into(),
            ));
        }
        substitutions
    }

    /// The environment variables of the substitutions, for the plugin and hooks.
    pub(super) fn environment(&self, settings: &Settings) -> Vec<(&'static str, OsString)> {
        let substitutions = self.substitutions(settings).into_iter();
        substitutions.map(|(_, variable, value)| (variable, value)).collect()
    }
}

/// What the user set for a run.
pub(super) struct Settings {
    /// How long each wait may take (`--timeout`).
    pub(super) bound: Duration,
    /// `--health-change`: a shell command that changes the health of one
    /// of the device plugin's devices.
    pub(super) health_change: Option<String>,
    /// `--node-name`: the node the plugin is told it runs on.
    pub(super) node: String,
    /// `--kubeconfig`: the API server the DRA steps use.
    pub(super) api: Option<Api>,
}

/// An API server for the DRA steps: its client, and the kubeconfig the
/// plugin is given too.
pub(super) struct Api {
    pub(super) client: kube::Client,
    pub(super) kubeconfig: PathBuf,
}

/// Starts the plugin with the placeholders replaced, the paths in its
/// environment, its output in `plugin.out` and `plugin.err` of the root.
pub(super) fn start_plugin(
    command: &[String],
    dirs: &Dirs,
    settings: &Settings,
) -> Result<Child, SuiteError> {
    let substitutions = dirs.substitutions(settings);
    let substitute = |arg: &String| {
        substitutions.iter().fold(arg.clone(), |arg, (placeholder, _, value)| {
            arg.replace(placeholder, &value.to_string_lossy())
        })
    };
    let (program, args) = command.split_first().ok_or(SuiteError::NoCommand)?;
    // Appended to: a restarted plugin's output follows its first run's.
    let output = |name: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dirs.root.join(name))
            .map(Stdio::from)
            .map_err(|source| SuiteError::PluginOutput { path: dirs.root.join(name), source })
    };
    let mut plugin = Command::new(substitute(program));
    plugin
        .args(args.iter().map(substitute))
        .stdin(Stdio::null())
        .stdout(output("plugin.out")?)
        .stderr(output("plugin.err")?)
        // A group of its own, for SIGTERM to reach every process of the command.
        .process_group(0)
        .kill_on_drop(true);
    plugin.envs(dirs.environment(settings));
    plugin
        .spawn()
        .map_err(|source| SuiteError::StartPlugin { program: substitute(program), source })
}

/// The last lines of the plugin's stderr, as evidence.
pub(super) fn evidence(dirs: &Dirs) -> String {
    let last = |name: &str| {
        let text = std::fs::read_to_string(dirs.root.join(name)).unwrap_or_default();
        let mut lines: Vec<String> = text.lines().rev().take(5).map(str::to_owned).collect();
        lines.reverse();
        lines.join(" | ")
    };
    match (last("plugin.out"), last("plugin.err")) {
        (out, err) if out.is_empty() && err.is_empty() => "the plugin wrote nothing".into(),
        (out, err) => format!("its stdout ends: {out:?}; its stderr ends: {err:?}"),
    }
}

/// Sends `signal` to the plugin's process group: every process of its
/// command, as a pod's containers all get it.
pub(super) fn signal_group(pid: u32, signal: rustix::process::Signal) -> std::io::Result<()> {
    let pid = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw);
    let pid = pid.ok_or_else(|| std::io::Error::other("pid out of range"))?;
    Ok(rustix::process::kill_process_group(pid, signal)?)
}
