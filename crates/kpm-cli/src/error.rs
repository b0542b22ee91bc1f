//! Errors a user of the `kpm` command can meet, each one line naming the
//! path and the step.

#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    #[error("read the log lines from stdin: {0}")]
    ReadStdin(#[source] std::io::Error),

    #[error("start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),

    #[error("{0}")]
    Status(#[from] kpm_status::StatusError),

    #[error("{0}")]
    Manager(#[from] kpm::Error),

    #[error("{0}")]
    Kubernetes(#[from] kpm::kube::KubeError),

    #[error("{0}")]
    Doctor(#[from] kpm_doctor::DoctorError),

    #[error("{0}")]
    DoctorWatch(#[from] kpm_doctor::WatchError),

    #[error("configure the doctor: {0}")]
    DoctorConfig(#[from] kpm_doctor::ConfigError),

    #[error("read the fleet: {0}")]
    Fleet(#[from] kpm_fleet::FleetError),

    #[error("configure the fleet read: {0}")]
    FleetConfig(#[from] kpm_fleet::OutOfRange),

    #[error(
        "find the API server: no --kubeconfig, KUBECONFIG, service account (not in a pod) or ~/.kube/config"
    )]
    NoApiServer,

    #[error("find the node name: {0} (set --node-name)")]
    NodeName(#[source] std::io::Error),

    #[error("serve device-plugin registration: {0}")]
    DevicePlugins(#[from] kpm::device::DeviceError),

    #[error("install signal handler: {0}")]
    Signal(#[source] std::io::Error),

    #[error("set up logging: {0}")]
    Logging(String),

    #[cfg(feature = "demo")]
    #[error("demo: {0}")]
    Demo(String),

    #[error("check: {0}")]
    Check(#[from] kpm_conformance::SuiteError),

    #[error("write output: {0}")]
    Output(#[source] std::io::Error),
}
