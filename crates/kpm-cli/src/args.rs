//! The flags several commands share.

use std::path::PathBuf;

/// Where the node's kubelet-style directories are.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RootArgs {
    /// The kubelet root directory.
    #[arg(long, value_name = "DIR", default_value = kpm::api::DEFAULT_ROOT_DIR, env = "KPM_ROOT_DIR")]
    pub(crate) root_dir: PathBuf,
    /// The status API socket [default: <ROOT_DIR>/kpm.sock].
    #[arg(long, value_name = "PATH", env = "KPM_STATUS_SOCKET")]
    status_socket: Option<PathBuf>,
}

impl RootArgs {
    pub(crate) fn status_socket(&self) -> PathBuf {
        self.status_socket
            .clone()
            .unwrap_or_else(|| self.root_dir.join(kpm_status::STATUS_SOCKET_NAME))
    }
}

/// The longest period or timeout a flag accepts, in seconds (a year): far
/// beyond any useful setting, and far from overflowing a clock.
pub(crate) const MAX_PERIOD_SECS: u64 = kpm::api::MAX_CONFIG_DURATION.as_secs();
