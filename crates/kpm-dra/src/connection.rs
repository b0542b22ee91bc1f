//! The long-lived gRPC connection to one instance's service socket, with its
//! state observed (spec C.5, the kubelet's stats handler).
//!
//! # How a drop is noticed
//!
//! The connection is a [`UdsChannel`] from a [`Dialer`] that counts it in
//! the instance's [`LiveConnections`]: live from the server's first bytes
//! (its HTTP/2 SETTINGS) until end-of-file, an IO error or the connection
//! being dropped, seen on the connection's own reads, so a server that
//! closes the socket, or a process that exits, is seen at once. No polling
//! and no keepalive pings are involved. [`Connection::subscribe`] gives the
//! number of live connections (normally 0 or 1; briefly 2 while a channel
//! is replaced).
//!
//! Reconnecting is the monitor's job (`manager/monitor.rs`): while nothing is
//! live it dials a fresh channel every [`RECONNECT_INTERVAL`] and swaps it
//! in with [`Connection::replace_channel`]. A channel never reconnects by
//! itself: a call made before the first connection, or on a connection that
//! closed, fails as unavailable.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kpm_transport::{Dialer, LiveConnections, Reach, TransportError, UdsChannel};
use tokio::sync::watch;
use tokio::time::Instant;

/// How long one dial (connect and HTTP/2 handshake) may take, and how long a
/// new connection may take to show the server's first bytes.
pub(crate) const DIAL_TIMEOUT: Duration = Duration::from_secs(1);

/// Pause between reconnect attempts while an instance is disconnected.
pub(crate) const RECONNECT_INTERVAL: Duration = Duration::from_millis(250);

/// The channel to one instance and the count of its live connections.
#[derive(Debug)]
pub(crate) struct Connection {
    socket: PathBuf,
    live: LiveConnections,
    channel: parking_lot::Mutex<Option<UdsChannel>>,
    /// Counts its connections in `live`.
    dialer: Dialer,
}

impl Connection {
    /// A connection to `socket` that has not connected yet, paid from
    /// `reach`; [`Connection::reconnect`] connects it.
    pub(crate) fn new(socket: &Path, reach: impl Into<Reach>) -> Self {
        let live = LiveConnections::new();
        let dialer = Dialer::new(reach, DIAL_TIMEOUT).counted_in(&live);
        let channel = parking_lot::Mutex::new(None);
        Self { socket: socket.to_path_buf(), live, channel, dialer }
    }

    /// The current channel (cheap to clone; calls on it share the
    /// connection); unavailable before the first connection.
    pub(crate) fn channel(&self) -> Result<UdsChannel, tonic::Status> {
        self.channel.lock().clone().ok_or_else(|| {
            tonic::Status::unavailable(format!("not connected to {}", self.socket.display()))
        })
    }

    /// Whether a connection is live.
    pub(crate) fn is_connected(&self) -> bool {
        self.live.count() > 0
    }

    /// The number of live connections, updated as they come and go.
    pub(crate) fn subscribe(&self) -> watch::Receiver<usize> {
        self.live.subscribe()
    }

    /// Makes `channel` the one calls use; the previous one is dropped, which
    /// closes its connection once no call uses it.
    fn replace_channel(&self, channel: UdsChannel) {
        drop(self.channel.lock().replace(channel));
    }

    /// Dials (connects and completes the client side of the HTTP/2
    /// handshake), swaps the new channel in and waits for the server's first
    /// bytes, all within [`DIAL_TIMEOUT`] once a permit of the fd budget is
    /// had. Returns whether the instance is connected afterwards; an error
    /// says why dialing failed.
    pub(crate) async fn reconnect(&self) -> Result<bool, TransportError> {
        let deadline = Instant::now() + DIAL_TIMEOUT;
        let channel = self.dialer.kept(&self.socket).await?;
        self.replace_channel(channel);
        let mut live = self.subscribe();
        let connected = tokio::time::timeout_at(deadline, live.wait_for(|live| *live > 0)).await;
        Ok(matches!(connected, Ok(Ok(_))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reconnecting_to_a_missing_socket_fails_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let budget = kpm_transport::fd::FdBudget::new(4, None);
        let connection = Connection::new(&dir.path().join("missing.sock"), budget);
        let err = kpm_api::gotext::error_chain(&connection.reconnect().await.unwrap_err());
        assert!(err.contains("No such file or directory"), "{err}");
        assert!(!connection.is_connected());
    }
}
