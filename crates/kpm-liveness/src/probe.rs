//! One liveness probe: `GetInfo` over a connection kept between probes, and
//! the cheaper question asked when a plugin's process exits: does anybody
//! still accept connections on its socket?

use std::io;
use std::path::Path;
use std::time::Duration;

use kpm_api::constants::MAX_REGISTRATION_MESSAGE_BYTES;
use kpm_api::gotext::go_code_name;
use kpm_api::registration::v1::InfoRequest;
use kpm_api::registration::v1::registration_client::RegistrationClient;
use kpm_api::{fd, uds};
use tonic::transport::Channel;

/// Why a probe failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeFailure {
    /// Nobody is there (socket file missing, connection refused): the
    /// plugin is gone, no point in asking again.
    pub gone: bool,
    /// The dial or `GetInfo` error, for logs and the `Unresponsive` event.
    pub reason: String,
}

/// The connection a plugin is probed over, kept from one probe to the next:
/// a probe then costs one round trip instead of a dial, a handshake and a
/// teardown.
#[derive(Debug, Clone)]
pub(crate) struct Link(RegistrationClient<Channel>);

/// Asks `GetInfo` over `link`, or over a new connection if there is none,
/// each step within `timeout`. The answer's content is not checked: the probe
/// asks whether the plugin is alive, registration already judged what it
/// said. Returns the connection to keep for the next probe, if it served.
///
/// A kept connection is optional: it is made only with a permit the fd
/// budget can spare (`try_acquire`); otherwise the probe dials as any call
/// does and hangs up after.
pub(crate) async fn probe(
    socket: &Path,
    link: Option<Link>,
    timeout: Duration,
) -> (Result<(), ProbeFailure>, Option<Link>) {
    let (Link(mut client), keep) = match link {
        Some(link) => (link, true),
        None => match connect(socket, timeout).await {
            Ok(connected) => connected,
            Err(failure) => return (Err(failure), None),
        },
    };
    let call = client.get_info(uds::timed_request(InfoRequest {}, timeout));
    let failure = match uds::within(timeout, call).await {
        Ok(_) => return (Ok(()), keep.then_some(Link(client))),
        Err(Some(status)) => ProbeFailure {
            // A kept connection redials when the plugin closed it; a refusal
            // then says the same as a refused dial.
            gone: caused_by_absence(&status),
            reason: format!("GetInfo: {}: {}", go_code_name(status.code()), status.message()),
        },
        Err(None) => {
            ProbeFailure { gone: false, reason: format!("GetInfo timed out after {timeout:?}") }
        }
    };
    // A connection that failed once is not trusted with the next probe.
    (Err(failure), None)
}

/// A new connection for a probe, and whether it may be kept: only with a
/// permit the fd budget can spare.
async fn connect(socket: &Path, timeout: Duration) -> Result<(Link, bool), ProbeFailure> {
    let spare = fd::budget().try_acquire();
    let keep = spare.is_some();
    let permit = match spare {
        Some(permit) => permit,
        None => fd::budget().acquire().await,
    };
    let (channel, _) = uds::dial_with_permit(socket, timeout, Duration::ZERO, permit)
        .await
        .map_err(|err| ProbeFailure { gone: err.is_gone(), reason: err.to_string() })?;
    let client =
        RegistrationClient::new(channel).max_decoding_message_size(MAX_REGISTRATION_MESSAGE_BYTES);
    Ok((Link(client), keep))
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

/// Whether a call failed because its connection could not be made again.
fn caused_by_absence(status: &tonic::Status) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = cause {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return is_absence(io);
        }
        cause = err.source();
    }
    false
}
