//! Liveness of registered plugins.
//!
//! The kubelet only looks at the registry directory: a plugin that crashed
//! and left its socket file behind stays registered forever (kubernetes
//! #128696). The [`LivenessMonitor`] notices three things:
//!
//! - **A plugin process exits.** At registration kpm learned which process
//!   serves the socket (`SO_PEERCRED`, [`Registration::server_pid`]); the
//!   monitor watches it with a pidfd, so the kernel says when it is gone, in
//!   milliseconds and at no cost meanwhile. The socket is then checked: if it
//!   refuses connections or is gone, the plugin is renewed. A socket still
//!   served by another process (a fork that kept it) is left to the probes.
//! - **A plugin hangs.** Every plugin is probed once per period, at a phase
//!   of its own so that probes are spread over the period: an HTTP/2 PING,
//!   which its transport answers by itself, and every fourth probe (gRPC
//!   servers close a connection at the fourth PING between two responses)
//!   or while it fails, a gRPC call: `GetInfo`. A CSI driver is probed on
//!   its endpoint as well, the call there being `csi.v1.Identity/Probe`:
//!   its registration socket is node-driver-registrar's, which answers
//!   while the driver hangs. One that fails `failure_threshold` probes in
//!   a row, or whose socket refuses connections, is renewed. Where a
//!   handler holds a connection to the registration socket anyway (a
//!   device plugin serving `ListAndWatch` on it), the probe goes over that
//!   connection ([`SharedConnections`]); otherwise over a connection of the
//!   monitor's own, kept between probes (at most [`MAX_KEPT_CONNECTIONS`],
//!   each an optional holder of the fd budget; beyond that, probes dial and
//!   hang up, a PING on a bare connection, [`kpm_transport::Dialer::bare_ping`],
//!   that holds no HTTP/2 state).
//! - **An endpoint goes.** A plugin's endpoint, when it is an absolute path
//!   other than its registration socket (a CSI or DRA driver's service
//!   socket), is watched with inotify. A
//!   socket file replaced by another renews the plugin; one removed *holds*
//!   it ([`DesiredState::hold`]): it is deregistered, and nothing is
//!   registered or dialled until a socket is back there
//!   ([`DesiredState::release`]). A DRA instance has a registration socket of
//!   its own, so only that instance goes.
//!
//! A connection a handler holds that drops (a device plugin's `ListAndWatch`
//! stream, a DRA driver's connection) gets the plugin's socket checked at
//! once too ([`LivenessMonitor::suspect`]). Where no process can be watched
//! (kpm runs in another pid namespace, or the kernel has no pidfds: logged
//! once), these and the probes catch exits.
//!
//! Renewing gives the socket a new generation in [`DesiredState`]
//! ([`DesiredState::renew`]) and reports [`PluginEvent::Unresponsive`]. The
//! reconciler then does what it does for any new incarnation: deregisters the
//! old one and registers anew, which fails and backs off until the plugin
//! answers again. The monitor never touches ActualState or a handler itself,
//! so every registration and deregistration still goes through the one
//! operation per socket of the executor: nothing is deregistered twice. It
//! writes DesiredState only for the incarnation it followed (`renew`, `hold`
//! and `release` refuse a socket re-created meanwhile), and it never signals
//! or waits for a process: a pidfd only says that one exited. Pidfds and the
//! monitor's kept connections are optional holders of the fd budget, so they
//! never starve registrations: without a spare permit a process is left to
//! the probes, and a probe dials and hangs up. [`open_pidfd`] is public
//! because `kpm doctor --watch` waits for exits with it too.
//!
//! [`DesiredState`]: kpm_cache::DesiredState
//! [`DesiredState::renew`]: kpm_cache::DesiredState::renew
//! [`DesiredState::hold`]: kpm_cache::DesiredState::hold
//! [`DesiredState::release`]: kpm_cache::DesiredState::release
//! [`Registration::server_pid`]: kpm_cache::Registration::server_pid
//! [`PluginEvent::Unresponsive`]: kpm_cache::PluginEvent::Unresponsive

#![deny(missing_docs)]

mod endpoints;
mod exits;
mod monitor;
mod probe;

use std::fmt;
use std::time::Duration;

use kpm_api::config::check_durations;
use kpm_cache::Registration;
use kpm_transport::UdsChannel;

pub use exits::open_pidfd;
pub use monitor::{LivenessMonitor, LivenessStats};
pub use probe::{MAX_KEPT_CONNECTIONS, ProbeFailure};

/// The connections to plugins that handlers hold anyway, which probes share
/// instead of dialling: a device plugin's `ListAndWatch` connection when its
/// endpoint is its registration socket. A probe over it costs a PING (or a
/// request), no socket and no handshake; a connection kept for probes alone
/// would cost its HTTP/2 buffers for every plugin, all the time. (The
/// monitor's own connections, kept between probes, are for the plugins no
/// handler shares one to.)
pub trait SharedConnections: Send + Sync + fmt::Debug {
    /// An open connection to `plugin`'s registration socket
    /// ([`Registration::socket_path`]), if a handler has one to share.
    /// Called once per probe, on the monitor's loop: it must not block.
    fn connection(&self, plugin: &Registration) -> Option<UdsChannel>;
}

/// Settings of liveness. Build it from [`Default`] with the setters; the
/// fields are public to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LivenessConfig {
    /// Time between two probes of a plugin: non-zero, at most
    /// [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION) (365
    /// days). `None`: no probes; exits are still watched.
    pub period: Option<Duration>,
    /// Failed probes in a row after which the plugin is registered anew.
    pub failure_threshold: u32,
    /// Deadline of each step of a probe (dial, PING or call): non-zero, at most
    /// the period.
    pub timeout: Duration,
    /// Whether to watch the process serving each registration socket and
    /// check the socket as soon as it exits.
    pub watch_exits: bool,
}

impl Default for LivenessConfig {
    /// Exits watched; a probe every 30 s, 3 failures in a row, 1 s per step.
    fn default() -> Self {
        Self {
            period: Some(Duration::from_secs(30)),
            failure_threshold: 3,
            timeout: Duration::from_secs(1),
            watch_exits: true,
        }
    }
}

/// Why liveness cannot start.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum LivenessError {
    /// The period is zero: the prober would spin.
    #[error("liveness probing: the period must be non-zero")]
    ZeroPeriod,
    /// The failure threshold is zero: every plugin would be registered anew
    /// on every probe.
    #[error("liveness probing: the failure threshold must be at least 1")]
    ZeroThreshold,
    /// The probe timeout is zero or longer than the period, so probes of one
    /// plugin would overlap.
    #[error(
        "liveness probing: the probe timeout {timeout:?} must be non-zero and at most the period {period:?}"
    )]
    InvalidTimeout {
        /// The probe timeout given.
        timeout: Duration,
        /// The period given.
        period: Duration,
    },
    /// A duration is longer than [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION).
    #[error("liveness probing: {0}")]
    InvalidConfig(#[from] kpm_api::config::DurationOutOfRange),
}

impl LivenessConfig {
    /// Sets [`period`](Self::period) (default 30 s; `None`: no probes).
    #[must_use]
    pub fn period(mut self, period: Option<Duration>) -> Self {
        self.period = period;
        self
    }

    /// Sets [`failure_threshold`](Self::failure_threshold) (default 3).
    #[must_use]
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.failure_threshold = failures;
        self
    }

    /// Sets [`timeout`](Self::timeout) (default 1 s).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets [`watch_exits`](Self::watch_exits) (default `true`).
    #[must_use]
    pub fn watch_exits(mut self, watch: bool) -> Self {
        self.watch_exits = watch;
        self
    }

    /// Checks the ranges [`LivenessMonitor::try_new`] relies on: a non-zero period
    /// of at most [`MAX_CONFIG_DURATION`](kpm_api::constants::MAX_CONFIG_DURATION), a threshold of at least 1, and a
    /// non-zero timeout of at most the period.
    pub fn validate(&self) -> Result<(), LivenessError> {
        let Some(period) = self.period else { return Ok(()) };
        if period.is_zero() {
            return Err(LivenessError::ZeroPeriod);
        }
        check_durations(&[], &[("period", period)])?;
        if self.failure_threshold == 0 {
            return Err(LivenessError::ZeroThreshold);
        }
        if self.timeout.is_zero() || self.timeout > period {
            return Err(LivenessError::InvalidTimeout { timeout: self.timeout, period });
        }
        Ok(())
    }
}
