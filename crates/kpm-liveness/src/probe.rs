//! One liveness probe: dial the registration socket, ask `GetInfo`; and the
//! cheaper question asked when a plugin's process exits: does anybody still
//! accept connections on its socket?

use std::io;
use std::path::Path;
use std::time::Duration;

use kpm_api::constants::MAX_REGISTRATION_MESSAGE_BYTES;
use kpm_api::gotext::go_code_name;
use kpm_api::registration::v1::InfoRequest;
use kpm_api::registration::v1::registration_client::RegistrationClient;
use kpm_api::uds;

/// Why a probe failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeFailure {
    /// Nobody is there (socket file missing, connection refused): the
    /// plugin is gone, no point in asking again.
    pub gone: bool,
    /// The dial or `GetInfo` error, for logs and the `Unresponsive` event.
    pub reason: String,
}

/// Dials `socket` and asks `GetInfo`, each step within `timeout`, then
/// hangs up: a connection kept between probes would cost its fixed HTTP/2
/// buffers (about 35 KB) for every registered plugin, all the time. The
/// answer's content is not checked: the probe asks whether the plugin is
/// alive, registration already judged what it said.
pub(crate) async fn probe(socket: &Path, timeout: Duration) -> Result<(), ProbeFailure> {
    let channel = uds::dial(socket, timeout)
        .await
        .map_err(|err| ProbeFailure { gone: err.is_gone(), reason: err.to_string() })?;
    let mut client =
        RegistrationClient::new(channel).max_decoding_message_size(MAX_REGISTRATION_MESSAGE_BYTES);
    let call = client.get_info(uds::timed_request(InfoRequest {}, timeout));
    match uds::within(timeout, call).await {
        Ok(_) => Ok(()),
        Err(Some(status)) => Err(ProbeFailure {
            gone: false,
            reason: format!("GetInfo: {}: {}", go_code_name(status.code()), status.message()),
        }),
        Err(None) => Err(ProbeFailure {
            gone: false,
            reason: format!("GetInfo timed out after {timeout:?}"),
        }),
    }
}

/// Whether `socket` still has a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reachability {
    /// A connection was accepted (or queued: the listener is open).
    Served,
    /// The socket file is missing or nobody listens on it; why, for the log.
    Gone(String),
}

/// Connects to `socket` and hangs up at once, without a word of HTTP/2: a
/// gRPC server takes a connection closed before its preface silently. Any
/// error but a missing file or a refusal (a full backlog) counts as served:
/// only absence is evidence of death. A shortage of fds is waited out.
pub(crate) async fn reach(socket: &Path) -> Reachability {
    match uds::connect_stream(socket, Duration::ZERO).await {
        Err(err) if is_absence(&err) => {
            Reachability::Gone(format!("connect {}: {err}", socket.display()))
        }
        Ok(_) | Err(_) => Reachability::Served,
    }
}

fn is_absence(err: &io::Error) -> bool {
    matches!(err.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound)
}
