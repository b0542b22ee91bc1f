//! Looks between passes: the sockets the last pass found ok are each sent
//! an HTTP/2 PING on a connection of its own, every
//! [`WatchConfig::look`](super::WatchConfig::look) (30 s). A plugin whose
//! process is alive but does not answer (stopped, deadlocked in its event
//! loop) accepts the connection into its backlog and never answers: the
//! watch then judges the node at once, and the pass names it, instead of
//! waiting for the period (5 min). The price is a connection and a frame
//! per socket; the doctor still holds no connection between looks, and a
//! failing socket is left to the passes, which back off. A look also lists
//! the container runtime's containers again: one that started, ended or
//! restarted since the pass (a pod that should serve a socket and crash-
//! loops without one changes no file) has the node judged at once.

use std::time::Duration;

use kpm::transport::Dialer;
use tracing::debug;

use crate::{Diagnosis, Doctor, Seen};

/// The sockets to look at, and how.
#[derive(Debug)]
pub(super) struct Looks {
    dialer: Dialer,
    sockets: Vec<Seen>,
    runtime: Option<crate::pods::RuntimeSeen>,
}

impl Looks {
    /// Looks that give up on a socket after `timeout`.
    pub(super) fn new(timeout: Duration) -> Self {
        Self {
            dialer: Dialer::new(kpm::transport::fd::budget().clone(), timeout),
            sockets: Vec::new(),
            runtime: None,
        }
    }

    /// Looks at the sockets `report` found ok from now on: each ok row's
    /// socket, and its endpoint where it advertised another (a CSI
    /// driver's, behind its registrar), where `doctor` reads them.
    pub(super) fn follow(&mut self, report: &Diagnosis, doctor: &Doctor) {
        let mut sockets: Vec<Seen> = Vec::new();
        for row in report.plugins.iter().filter(|row| row.verdict == crate::Verdict::Ok) {
            let endpoint = row.endpoint.as_deref().map(kpm::api::endpoint_path);
            for path in std::iter::once(row.path.as_path()).chain(endpoint) {
                let seen = doctor.seen(path);
                if !sockets.contains(&seen) {
                    sockets.push(seen);
                }
            }
        }
        self.sockets = sockets;
        self.runtime.clone_from(&report.runtime);
    }

    /// Whether there is anything to look at.
    pub(super) fn any(&self) -> bool {
        !self.sockets.is_empty() || self.runtime.is_some()
    }

    /// Whether every socket answered its PING and the runtime's containers
    /// are as the pass saw them; what did not is logged.
    pub(super) async fn all_answer(&self) -> bool {
        let pings = self.sockets.iter().map(|socket| answers(&self.dialer, socket));
        let answered = futures_util::future::join_all(pings).await;
        if !answered.iter().all(|answered| *answered) {
            return false;
        }
        let changed = match &self.runtime {
            Some(runtime) => runtime.changed(&self.dialer).await,
            None => false,
        };
        if changed {
            debug!("a container started, ended or restarted since the pass");
        }
        !changed
    }
}

/// Whether the socket `seen` answers a PING on a connection of its own
/// within the dialer's timeout.
async fn answers(dialer: &Dialer, seen: &Seen) -> bool {
    match dialer.bare_ping(seen.as_ref()).await {
        Ok(()) => true,
        Err(err) => {
            debug!(socket = %seen.on_host().display(), error = %err, "no answer to a look");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::Host;

    /// A process that is stopped: its socket listens, the kernel takes
    /// connections into the backlog, and nobody ever reads them.
    #[tokio::test]
    async fn a_socket_that_accepts_and_never_answers_fails_its_look_one_that_serves_passes() {
        let dir = tempfile::tempdir().unwrap();
        let stopped = dir.path().join("stopped.sock");
        let _listening = std::os::unix::net::UnixListener::bind(&stopped).unwrap();
        let serving = dir.path().join("serving.sock");
        let driver = kpm_test_support::csi::FakeCsiDriver::always(
            "csi.example.com",
            kpm_test_support::csi::info("node1", 0, &[]),
        );
        let _served = kpm_test_support::csi::serve(&serving, driver).await;
        let host = Host::default();
        let dialer = Dialer::new(kpm::transport::fd::budget().clone(), Duration::from_millis(500));
        assert!(!answers(&dialer, &host.path(&stopped)).await);
        assert!(answers(&dialer, &host.path(&serving)).await);
        let gone = dir.path().join("gone.sock");
        assert!(!answers(&dialer, &host.path(&gone)).await);
    }
}
