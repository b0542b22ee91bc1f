//! The crate's one error enum. Below both the fd budget and the dialing
//! code, which share it, so that neither depends on the other for it.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Why a Unix-socket connection or listener could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// Connecting to the socket failed (missing file, nobody listening, ...).
    #[error("dial {}: {}", path.display(), root_cause(source))]
    Dial {
        /// The socket.
        path: PathBuf,
        /// tonic's connection error.
        #[source]
        source: tonic::transport::Error,
    },
    /// Creating the socket to dial from failed (a shortage of fds is waited
    /// out instead).
    #[error("dial {}: socket: {source}", path.display())]
    Socket {
        /// The socket dialed.
        path: PathBuf,
        /// The `socket(2)` error.
        #[source]
        source: io::Error,
    },
    /// Connecting to the socket failed (a [`Dialer`](crate::Dialer)'s kept
    /// connection, raw stream or bare PING).
    #[error("dial {}: {source}", path.display())]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The connect error.
        #[source]
        source: io::Error,
    },
    /// The HTTP/2 handshake of a [`UdsChannel`](crate::UdsChannel) failed.
    #[error("dial {}: HTTP/2 handshake: {source}", path.display())]
    Handshake {
        /// The socket.
        path: PathBuf,
        /// h2's error.
        #[source]
        source: h2::Error,
    },
    /// An HTTP/2 PING on a [`UdsChannel`](crate::UdsChannel) failed: its
    /// connection is closed.
    #[error("ping {}: {source}", path.display())]
    Ping {
        /// The socket.
        path: PathBuf,
        /// h2's error.
        #[source]
        source: h2::Error,
    },
    /// A [`Dialer::bare_ping`](crate::Dialer::bare_ping) got no acknowledgement: the server
    /// closed the connection or said GOAWAY first, or writing failed.
    #[error("ping {}: {source}", path.display())]
    BarePing {
        /// The socket.
        path: PathBuf,
        /// What came instead of the acknowledgement.
        #[source]
        source: io::Error,
    },
    /// Connecting (for a bare PING, connecting and the PING) did not finish
    /// in time.
    #[error("dial {}: timed out after {timeout:?}", path.display())]
    DialTimeout {
        /// The socket.
        path: PathBuf,
        /// The deadline that passed.
        timeout: Duration,
    },
    /// An [optional holder](crate::Dialer::optional_holder)'s dial found no
    /// spare permit: taking one would leave a quarter or less of the budget
    /// free. Nothing was dialled.
    #[error("dial {}: no spare file descriptor for an optional connection", path.display())]
    NoSparePermit {
        /// The socket.
        path: PathBuf,
    },
    /// A live server already answers on the socket; it is not ours to remove.
    #[error("bind {}: socket is in use by a live server", path.display())]
    InUse {
        /// The socket.
        path: PathBuf,
    },
    /// Raising the soft `RLIMIT_NOFILE` to the hard one failed.
    #[error("raise the soft open-files limit from {} to {}: {source}", show_limit(*soft), show_limit(*hard))]
    RaiseFdLimit {
        /// The soft limit; `None` is unlimited.
        soft: Option<u64>,
        /// The hard limit.
        hard: Option<u64>,
        /// The `setrlimit` error.
        #[source]
        source: io::Error,
    },
    /// Removing a stale socket file or binding the new one failed.
    #[error("bind {}: {source}", path.display())]
    Bind {
        /// The socket.
        path: PathBuf,
        /// The remove or bind error.
        #[source]
        source: io::Error,
    },
}

impl TransportError {
    /// Whether dialing found nobody there: the socket file is missing, or
    /// nothing listens on it (connection refused). A plugin that is merely
    /// slow or stuck times out instead.
    pub fn is_gone(&self) -> bool {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = match self {
            Self::Dial { source, .. } => Some(source),
            Self::Connect { source, .. } => Some(source),
            _ => return false,
        };
        while let Some(err) = cause {
            if let Some(io) = err.downcast_ref::<io::Error>() {
                return matches!(
                    io.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                );
            }
            cause = err.source();
        }
        false
    }
}

/// The innermost cause: tonic's own text is only "transport error", the OS
/// error underneath says what went wrong.
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// A resource limit as `ulimit` shows it.
pub(crate) fn show_limit(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".to_owned(), |limit| limit.to_string())
}
