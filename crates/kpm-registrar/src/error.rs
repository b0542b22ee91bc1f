//! The one error type of the registrar crate. Every variant names the path
//! and the step that failed.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use kpm_api::uds::TransportError;

#[derive(Debug, thiserror::Error)]
pub enum RegistrarError {
    // === Setting up the registration socket ===
    /// The registration socket path does not fit in `sockaddr_un.sun_path`;
    /// `bind` would fail with an obscure `InvalidInput`.
    #[error(
        "registration socket {} is {len} bytes long; a Unix socket path may have at most {max}",
        path.display()
    )]
    SocketPathTooLong { path: PathBuf, len: usize, max: usize },

    /// `PluginInfo.endpoint` is a protobuf string, so the endpoint must be UTF-8.
    #[error("endpoint {} is not valid UTF-8", path.display())]
    EndpointNotUtf8 { path: PathBuf },

    /// Creating the socket directory (and its parents) failed.
    #[error("create socket directory {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// Binding the registration socket failed, or a live plugin already
    /// answers on it ([`TransportError::InUse`]); that socket is left alone.
    #[error(transparent)]
    Bind {
        #[from]
        source: TransportError,
    },

    // === Running ===
    /// Nobody sent `NotifyRegistrationStatus` in time: the node agent does not
    /// watch the socket's directory, or is not running.
    #[error(
        "no registration status received on {} within {timeout:?}; is a node agent watching {}?",
        socket.display(),
        socket.parent().unwrap_or(socket).display()
    )]
    StatusTimeout { socket: PathBuf, timeout: Duration },

    /// The gRPC server on the registration socket failed.
    #[error("serve {}: {source}", socket.display())]
    Serve {
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },

    // === Shutting down ===
    /// Removing our own registration socket file failed.
    #[error("remove registration socket {}: {source}", path.display())]
    RemoveSocket {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}
