//! The one error type of the registrar crate. Every variant names the path
//! and the step that failed.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use kpm_transport::TransportError;

/// Why a registrar could not set up, serve or remove its registration socket.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrarError {
    // === Setting up the registration socket ===
    /// The registration socket path does not fit in `sockaddr_un.sun_path`;
    /// `bind` would fail with an obscure `InvalidInput`.
    #[error(
        "registration socket {} is {len} bytes long; a Unix socket path may have at most {max}",
        path.display()
    )]
    SocketPathTooLong {
        /// The registration socket.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The longest path a Unix socket address holds.
        max: usize,
    },

    /// `PluginInfo.endpoint` is a protobuf string, so the endpoint must be UTF-8.
    #[error("endpoint {} is not valid UTF-8", path.display())]
    EndpointNotUtf8 {
        /// The plugin's service socket.
        path: PathBuf,
    },

    /// Creating the socket directory (and its parents) failed.
    #[error("create socket directory {}: {source}", path.display())]
    CreateDir {
        /// The socket directory.
        path: PathBuf,
        /// The `mkdir -p` error.
        #[source]
        source: io::Error,
    },

    /// Binding the registration socket failed, or a live plugin already
    /// answers on it ([`TransportError::InUse`]); that socket is left alone.
    #[error(transparent)]
    Bind {
        /// The transport's error.
        #[from]
        source: TransportError,
    },

    // === Registering on kubelet.sock ===
    /// The kubelet refused or did not answer a device plugin's `Register`.
    #[error(
        "register device plugin {resource} on {}: rpc error: code = {} desc = {}",
        socket.display(), kpm_api::gotext::go_code_name(status.code()), status.message()
    )]
    RegisterDevicePlugin {
        /// The kubelet's `kubelet.sock`.
        socket: PathBuf,
        /// The extended resource registered.
        resource: String,
        /// The status the kubelet returned.
        #[source]
        status: tonic::Status,
    },

    // === Running ===
    /// Nobody sent `NotifyRegistrationStatus` in time: the node agent does not
    /// watch the socket's directory, or is not running.
    #[error(
        "no registration status received on {} within {timeout:?}; is a node agent watching {}?",
        socket.display(),
        socket.parent().unwrap_or(socket).display()
    )]
    StatusTimeout {
        /// The registration socket.
        socket: PathBuf,
        /// How long the registrar waited.
        timeout: Duration,
    },

    /// The gRPC server on the registration socket failed.
    #[error("serve {}: {source}", socket.display())]
    Serve {
        /// The registration socket.
        socket: PathBuf,
        /// tonic's error.
        #[source]
        source: tonic::transport::Error,
    },

    // === Shutting down ===
    /// Removing our own registration socket file failed.
    #[error("remove registration socket {}: {source}", path.display())]
    RemoveSocket {
        /// The registration socket.
        path: PathBuf,
        /// The `unlink` error.
        #[source]
        source: io::Error,
    },
}
