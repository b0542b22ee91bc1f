//! The plugin of a run: the temporary kubelet root it is given, the
//! user's settings, and the plugin running: a process group of its own, or
//! a task of this process, with its output as evidence.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::SuiteError;
use crate::plugin::{Hook, Plugin, PluginEnv, Stop};

/// The temporary kubelet root and its directories, as the plugin is told
/// them.
pub(super) struct Dirs {
    pub(super) env: PluginEnv,
}

impl Dirs {
    /// The kubelet's directories under `root`, created; the plugin is told
    /// `node` and `kubeconfig` too.
    pub(super) fn create(
        root: &Path,
        node: &str,
        kubeconfig: Option<PathBuf>,
    ) -> Result<Self, SuiteError> {
        let env = PluginEnv {
            root: root.to_path_buf(),
            registry: root.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME),
            device_plugins: root.join(kpm::api::DEVICE_PLUGINS_DIR_NAME),
            plugins: root.join("plugins"),
            cdi: root.join("cdi"),
            node: node.to_owned(),
            kubeconfig,
            instance: new_instance(),
        };
        for dir in [&env.registry, &env.device_plugins, &env.plugins, &env.cdi] {
            std::fs::create_dir_all(dir)
                .map_err(|source| SuiteError::CreateRoot { path: dir.clone(), source })?;
        }
        Ok(Self { env })
    }

    pub(super) fn root(&self) -> &Path {
        &self.env.root
    }

    /// `path` as the report shows it: relative to the root.
    pub(super) fn shown(&self, path: &Path) -> String {
        path.strip_prefix(&self.env.root).unwrap_or(path).display().to_string()
    }
}

/// What the user set for a run.
pub(super) struct Settings {
    /// How long each wait may take (`--timeout`).
    pub(super) bound: Duration,
    /// `--health-change`: what changes the health of one of the device
    /// plugin's devices.
    pub(super) health_change: Option<Hook>,
    /// `--node-name`: the node the plugin is told it runs on.
    pub(super) node: String,
    /// `--kubeconfig`: the API server the DRA checks use.
    pub(super) api: Option<Api>,
}

/// An API server for the DRA checks: its client, and the kubeconfig the
/// plugin is given too, when there is one.
pub(super) struct Api {
    pub(super) client: kube::Client,
    pub(super) kubeconfig: Option<PathBuf>,
}

/// The plugin, running.
pub(super) enum Running {
    Process(Child),
    /// An in-process plugin's task, and how to tell it to stop.
    InProcess {
        task: JoinHandle<()>,
        stop: Option<oneshot::Sender<()>>,
    },
}

impl Running {
    /// Starts `plugin` in `dirs`: a command with the placeholders replaced,
    /// the paths in its environment, its output in `plugin.out` and
    /// `plugin.err` of the root; an in-process plugin as a task.
    /// Each start is a new instance (`{instance}`).
    pub(super) fn start(plugin: &Plugin, dirs: &Dirs) -> Result<Self, SuiteError> {
        let env = PluginEnv { instance: new_instance(), ..dirs.env.clone() };
        match plugin {
            Plugin::Command(command) => start_command(command, &env).map(Self::Process),
            Plugin::InProcess { serve, .. } => {
                let (stop, told) = Stop::new();
                let task = tokio::spawn(serve(env, told));
                Ok(Self::InProcess { task, stop: Some(stop) })
            }
        }
    }

    /// The process's pid, for a hook; `None` in process or once it exited.
    pub(super) fn pid(&self) -> Option<u32> {
        match self {
            Self::Process(child) => child.id(),
            Self::InProcess { .. } => None,
        }
    }

    /// How it ended, if it has.
    pub(super) fn exited(&mut self) -> Option<String> {
        match self {
            Self::Process(child) => {
                child.try_wait().ok().flatten().map(|status| status.to_string())
            }
            Self::InProcess { task, .. } => task.is_finished().then(|| "returned".to_owned()),
        }
    }

    /// SIGTERM to the process group (or the in-process plugin told to
    /// stop), then its end, for at most `bound`: how it ended.
    pub(super) async fn terminate(&mut self, bound: Duration) -> Result<String, String> {
        match self {
            Self::Process(child) => {
                let Some(pid) = child.id() else {
                    return Err("the plugin exited before SIGTERM".into());
                };
                signal_group(pid, rustix::process::Signal::TERM)
                    .map_err(|err| format!("cannot send SIGTERM: {err}"))?;
                match tokio::time::timeout(bound, child.wait()).await {
                    Ok(Ok(status)) => Ok(status.to_string()),
                    Ok(Err(err)) => Err(format!("waiting for the plugin: {err}")),
                    Err(_) => Err(format!("still running {bound:?} after SIGTERM")),
                }
            }
            Self::InProcess { task, stop } => {
                if task.is_finished() {
                    return Err("the plugin returned before it was told to stop".into());
                }
                drop(stop.take());
                match tokio::time::timeout(bound, task).await {
                    Ok(Ok(())) => Ok("returned".into()),
                    Ok(Err(join)) => Err(format!("the plugin's task failed: {join}")),
                    Err(_) => Err(format!("still running {bound:?} after told to stop")),
                }
            }
        }
    }

    /// Ends what is left of it: SIGKILL to the process group, or the task
    /// aborted.
    pub(super) async fn kill(&mut self) {
        match self {
            Self::Process(child) => {
                if let Some(pid) = child.id() {
                    let _ = signal_group(pid, rustix::process::Signal::KILL);
                }
                let _ = child.wait().await;
            }
            // A finished task was awaited by `terminate`, or has nothing to
            // reap: a JoinHandle is not polled after it completed.
            Self::InProcess { task, .. } if !task.is_finished() => {
                task.abort();
                let _ = task.await;
            }
            Self::InProcess { .. } => {}
        }
    }
}

/// Starts `command` with the placeholders replaced, the paths in its
/// environment, its output appended to `plugin.out` and `plugin.err`.
fn start_command(command: &[String], env: &PluginEnv) -> Result<Child, SuiteError> {
    let substitutions = env.substitutions();
    let substitute = |arg: &String| {
        substitutions
            .iter()
            .fold(arg.clone(), |arg, (placeholder, _, value)| arg.replace(placeholder, value))
    };
    let (program, args) = command.split_first().ok_or(SuiteError::NoCommand)?;
    // Appended to: a restarted plugin's output follows its first run's.
    let output = |name: &str| {
        let path = env.root.join(name);
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map(Stdio::from)
            .map_err(|source| SuiteError::PluginOutput { path, source })
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
    plugin.envs(env.environment());
    plugin
        .spawn()
        .map_err(|source| SuiteError::StartPlugin { program: substitute(program), source })
}

/// A new instance id: 16 hex digits.
fn new_instance() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// The last lines of the plugin's output, as evidence.
pub(super) fn evidence(dirs: &Dirs) -> String {
    let last = |name: &str| {
        let text = std::fs::read_to_string(dirs.root().join(name)).unwrap_or_default();
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
fn signal_group(pid: u32, signal: rustix::process::Signal) -> std::io::Result<()> {
    let pid = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw);
    let pid = pid.ok_or_else(|| std::io::Error::other("pid out of range"))?;
    Ok(rustix::process::kill_process_group(pid, signal)?)
}
