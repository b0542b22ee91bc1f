//! The conformance suite for kubelet plugins (CSI drivers, device plugins,
//! DRA drivers), without a cluster: `kpm check` is a thin shell over it,
//! and a driver's own `cargo test` can run it too.
//!
//! A kubelet (kpm's, the one `kpm run` runs) serves a temporary root; the
//! plugin is started with that root and driven through what real kubelets
//! do to plugins: it must register within the bound, answer `GetInfo`
//! within the kubelet's second, pass its type's checks, name its sockets
//! as the conventions say; then hold the conversation the kubelet has with
//! it after registration (a device plugin's devices listed and allocated,
//! a CSI driver's node info, a DRA driver's claims prepared); register
//! again when the kubelet restarts and when it restarts itself, and on
//! SIGTERM remove its sockets and be deregistered. Each [`Check`] ends in
//! an [`Outcome`]: passed, warned (a rule the kubelet does not hold the
//! plugin to), failed (where the kubelet would fail the pod) or skipped,
//! with its [`Evidence`]. The [`Report`] renders as lines, JSON or
//! `JUnit` XML, and asserts in a test:
//!
//! ```no_run
//! #[tokio::test]
//! async fn my_plugin_conforms() {
//!     let config = kpm_conformance::Config::new([env!("CARGO_BIN_EXE_my-plugin"), "--registry", "{registry}"]);
//!     let report = kpm_conformance::Suite::try_new(config).unwrap().run().await.unwrap();
//!     report.assert_conformant();
//! }
//! ```
//!
//! The kubelet source each check holds the plugin to is [`Check::source`];
//! what kubelet minors other than kpm's do is `kpm-minors`' (shared with
//! `kpm doctor`).
//!
//! Modules: `run` drives the kubelet and the plugin through the checks
//! and hands each registered plugin to its type's conversation, `device`,
//! `csi` or `dra` (which reads and writes the API server, and judges
//! CDI specs with `cdi`).

mod cdi;
mod check;
mod config;
mod csi;
mod device;
mod dial;
mod dra;
mod error;
mod hook;
mod outcome;
mod plugin;
mod report;
mod run;
#[cfg(test)]
mod tests;
mod wait;

pub use crate::check::Check;
pub use crate::config::{Config, DEFAULT_BOUND, DEFAULT_NODE};
pub use crate::error::SuiteError;
pub use crate::outcome::{Evidence, Finding, Mark, Outcome, Subject};
pub use crate::plugin::{Act, BoxFuture, Hook, Plugin, PluginEnv, Serve, Stop};
pub use crate::report::{Checked, Report, Tally};

/// The suite, configured: [`run`](Self::run) it once per plugin.
#[derive(Debug, Clone)]
pub struct Suite {
    config: Config,
}

impl Suite {
    /// Checks `config`.
    pub fn try_new(config: Config) -> Result<Self, SuiteError> {
        config.validate()?;
        Ok(Self { config })
    }

    /// Runs the plugin through every check. `Err` only when the suite
    /// could not judge it at all (its command does not start, no
    /// temporary root); a plugin that fails a check is `Ok`, with a report
    /// that says so.
    pub async fn run(&self) -> Result<Report, SuiteError> {
        run::run(&self.config).await
    }
}
