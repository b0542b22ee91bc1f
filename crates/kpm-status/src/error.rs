//! Errors of the status API's server and client, each naming the path and
//! the step.

use std::path::PathBuf;

/// What failed, serving or reading the status API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
    /// The socket's directory could not be created.
    #[error("create root directory {}: {source}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },

    /// The socket could not be bound.
    #[error("serve status API: {0}")]
    Bind(#[source] kpm::transport::TransportError),

    /// Nothing answers on the socket.
    #[error("connect to status API at {} (is `kpm run` running?): {source}", path.display())]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },

    /// The request failed, or its answer could not be read.
    #[error("query status API at {}: {message}", path.display())]
    Query {
        /// The socket.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },

    /// The metrics' address could not be bound.
    #[error("serve metrics on {addr}: {source}")]
    MetricsAddr {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}
