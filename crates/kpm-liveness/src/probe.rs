//! One liveness probe: `GetInfo` on the registration socket, over a
//! connection a handler holds, one kept from the last probe, or a new one;
//! and the cheaper question asked when a plugin's process exits: does
//! anybody still accept connections on its socket?

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kpm_api::constants::MAX_REGISTRATION_MESSAGE_BYTES;
use kpm_api::gotext::go_code_name;
use kpm_api::registration::v1::InfoRequest;
use kpm_api::registration::v1::registration_client::RegistrationClient;
use kpm_transport::fd::FdBudget;
use kpm_transport::{self as uds, UdsChannel};

/// Why a probe failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeFailure {
    /// Nobody is there (socket file missing, connection refused): the
    /// plugin is gone, no point in asking again.
    pub gone: bool,
    /// The dial or `GetInfo` error, for logs and the `Unresponsive` event.
    pub reason: String,
}

/// The connection a probe goes over.
#[derive(Debug)]
pub(crate) enum Via {
    /// A handler's connection to the registration socket, shared.
    Handler(UdsChannel),
    /// The monitor's own, kept from the plugin's last probe.
    Kept(Kept),
    /// A new connection.
    Dial,
}

/// How many connections the monitor keeps between probes, at most: each
/// costs its fixed HTTP/2 buffers (about 35 KB), and plugins no handler
/// holds a connection to (CSI and DRA registration sockets) are a handful
/// per node. Beyond it, probes dial and hang up.
const MAX_KEPT_CONNECTIONS: usize = 128;

/// A connection the monitor keeps between a plugin's probes, counted in
/// `LivenessStats::probe_connections` for as long as it lives.
#[derive(Debug)]
pub(crate) struct Kept {
    channel: UdsChannel,
    count: Arc<AtomicUsize>,
}

impl Kept {
    /// Keeps `channel`, unless [`MAX_KEPT_CONNECTIONS`] are kept already.
    fn keep(channel: UdsChannel, count: &Arc<AtomicUsize>) -> Option<Self> {
        let under_cap = |kept: usize| (kept < MAX_KEPT_CONNECTIONS).then_some(kept + 1);
        count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, under_cap).ok()?;
        Some(Self { channel, count: Arc::clone(count) })
    }

    /// Whether the plugin closed it (it exited or restarted, say).
    pub(crate) fn is_closed(&self) -> bool {
        self.channel.is_closed()
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a probe found, and the connection to keep for the next one.
#[derive(Debug)]
pub(crate) struct Probed {
    pub(crate) outcome: Result<(), ProbeFailure>,
    /// The monitor's own connection, after an answer on it.
    pub(crate) keep: Option<Kept>,
}

/// Asks `GetInfo` on `socket` over `via`, each step within `timeout`. The
/// answer's content is not checked: the probe asks whether the plugin is
/// alive, registration already judged what it said.
///
/// A dialled connection is kept for the next probe (counted in `kept`) when
/// it answered, the fd budget could spare an optional permit for it (a
/// quarter of the budget stays free) and fewer than
/// [`MAX_KEPT_CONNECTIONS`] are kept; otherwise it is closed after the
/// probe, as is a kept connection that failed.
pub(crate) async fn probe(
    socket: &Path,
    via: Via,
    timeout: Duration,
    kept: &Arc<AtomicUsize>,
    budget: &FdBudget,
) -> Probed {
    match via {
        Via::Handler(channel) => Probed { outcome: get_info(channel, timeout).await, keep: None },
        Via::Kept(connection) => {
            let outcome = get_info(connection.channel.clone(), timeout).await;
            Probed { keep: outcome.is_ok().then_some(connection), outcome }
        }
        Via::Dial => {
            let (channel, keepable) = match dial(socket, timeout, budget).await {
                Ok(dialled) => dialled,
                Err(failure) => return Probed { outcome: Err(failure), keep: None },
            };
            let outcome = get_info(channel.clone(), timeout).await;
            let keep = (keepable && outcome.is_ok()).then(|| Kept::keep(channel, kept)).flatten();
            Probed { outcome, keep }
        }
    }
}

/// Dials `socket`; says whether the connection may be kept (its permit is
/// an optional holder's).
async fn dial(
    socket: &Path,
    timeout: Duration,
    budget: &FdBudget,
) -> Result<(UdsChannel, bool), ProbeFailure> {
    let (permit, keepable) = match budget.try_acquire() {
        Some(permit) => (permit, true),
        None => (budget.acquire().await, false),
    };
    let channel = UdsChannel::connect_with_permit(socket, timeout, Duration::ZERO, permit)
        .await
        .map_err(|err| ProbeFailure { gone: err.is_gone(), reason: err.to_string() })?;
    Ok((channel, keepable))
}

async fn get_info(channel: UdsChannel, timeout: Duration) -> Result<(), ProbeFailure> {
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

/// How long a connection made by [`reach`] is watched for a reset.
const RESET_WINDOW: Duration = Duration::from_millis(100);

/// Connects to `socket` without a word of HTTP/2 (a gRPC server takes a
/// connection closed before its preface silently) and watches it for
/// [`RESET_WINDOW`]: a plugin that is exiting may close its connections a
/// moment before its listener, and the kernel then resets what the dying
/// listener had queued. A live server sends its settings or waits for the
/// preface. Any error but a missing file or a refusal (a full backlog)
/// counts as served: only absence is evidence of death. A shortage of fds
/// is waited out.
pub(crate) async fn reach(socket: &Path, budget: &FdBudget) -> Reachability {
    let gone = |why: String| Reachability::Gone(format!("connect {}: {why}", socket.display()));
    let permit = budget.acquire().await;
    let stream = match uds::connect_with_permit(socket, Duration::ZERO, permit).await {
        Ok(stream) => stream,
        Err(err) if is_absence(&err) => return gone(err.to_string()),
        Err(_) => return Reachability::Served,
    };
    let stream = stream.get_ref();
    let Ok(Ok(())) = tokio::time::timeout(RESET_WINDOW, stream.readable()).await else {
        return Reachability::Served;
    };
    match stream.try_read(&mut [0; 1]) {
        Ok(0) => gone("closed at once: the listener went away".to_owned()),
        Err(err) if err.kind() == io::ErrorKind::ConnectionReset => gone(err.to_string()),
        Ok(_) | Err(_) => Reachability::Served,
    }
}

/// Whether `endpoint` accepts a connection within `window`, refusals
/// retried (a server binds its socket file a moment before it listens).
pub(crate) async fn accepts(endpoint: &Path, window: Duration, budget: &FdBudget) -> bool {
    let permit = budget.acquire().await;
    uds::connect_with_permit(endpoint, window, permit).await.is_ok()
}

fn is_absence(err: &io::Error) -> bool {
    matches!(err.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound)
}
