//! What keeps the suite from judging a plugin at all (a plugin that fails
//! a check is a report, not an error), each variant named after the part
//! of the run that failed.

use std::path::PathBuf;

/// Why the suite could not run, or its report not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SuiteError {
    #[error("no plugin command to check")]
    NoCommand,
    #[error("the bound of each wait must be between 1 s and {max:?}, not {bound:?}")]
    Bound { bound: std::time::Duration, max: std::time::Duration },
    #[error("node name {0:?} is no DNS subdomain (lower-case letters, digits, '-' and '.')")]
    NodeName(String),
    #[error("create the kubelet root {}: {source}", path.display())]
    CreateRoot { path: PathBuf, source: std::io::Error },
    #[error("read the kubeconfig {}: {source}", path.display())]
    ReadKubeconfig { path: PathBuf, source: Box<kpm::kube::KubeError> },
    #[error("start the plugin {program}: {source}")]
    StartPlugin { program: String, source: std::io::Error },
    #[error("keep the plugin's output in {}: {source}", path.display())]
    PluginOutput { path: PathBuf, source: std::io::Error },
    #[error("build the check's kubelet: {0}")]
    BuildKubelet(#[source] Box<kpm::Error>),
    #[error("run the check's kubelet: {0}")]
    RunKubelet(#[source] Box<kpm::Error>),
    #[error("the check's kubelet task failed: {0}")]
    KubeletTask(String),
    #[error("render the JUnit report: {0}")]
    RenderJunit(String),
    #[error("write the JUnit report {}: {source}", path.display())]
    WriteJunit { path: PathBuf, source: std::io::Error },
}
