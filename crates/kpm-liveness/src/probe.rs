//! One liveness probe of one socket: an HTTP/2 PING, or a gRPC call where a
//! PING is not enough, over a connection a handler holds, one kept from the
//! last probe, or a new one; and the cheaper question asked when a
//! plugin's process exits: does anybody still accept connections on its
//! socket?

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use kpm_api::constants::MAX_REGISTRATION_MESSAGE_BYTES;
use kpm_api::csi::v1::ProbeRequest;
use kpm_api::csi::v1::identity_client::IdentityClient;
use kpm_api::gotext::go_code_name;
use kpm_api::registration::v1::InfoRequest;
use kpm_api::registration::v1::registration_client::RegistrationClient;
use kpm_transport::fd::FdBudget;
use kpm_transport::{
    self as uds, Dialer, PINGS_PER_CALL, TimedCallError, TransportError, UdsChannel,
};

/// Why a probe failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeFailure {
    /// Nobody is there (socket file missing, connection refused): the
    /// plugin is gone, no point in asking again.
    pub gone: bool,
    /// The dial, PING or call error, for logs and the `Unresponsive` event.
    pub reason: String,
}

/// The gRPC call that probes a socket when a PING is not enough.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    /// `Registration/GetInfo`, on a registration socket.
    GetInfo,
    /// `csi.v1.Identity/Probe`, on a CSI driver's endpoint: its readiness,
    /// which only the driver can tell.
    CsiProbe,
}

/// One socket a plugin is probed on, between probes.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) socket: PathBuf,
    call: Call,
    /// PINGs answered since the last call (see [`PINGS_PER_CALL`]).
    pings: u32,
    /// The connection its last probe answered on, if the monitor keeps it;
    /// taken while a probe runs.
    kept: Option<Kept>,
}

impl Target {
    pub(crate) fn new(socket: PathBuf, call: Call) -> Self {
        Self { socket, call, pings: 0, kept: None }
    }

    /// The next check of this socket, over `shared` if a handler shares a
    /// connection there: a PING, unless the plugin failed its last probe
    /// (a call tells more) or the server has taken as many PINGs as it
    /// takes between two responses.
    pub(crate) fn next_check(&mut self, failing: bool, shared: Option<UdsChannel>) -> Check {
        let ask =
            if failing || self.pings >= PINGS_PER_CALL { Ask::Call(self.call) } else { Ask::Ping };
        let via = match (shared, self.kept.take().filter(|kept| !kept.is_closed())) {
            (Some(shared), _) => Via::Shared(shared),
            (None, Some(kept)) => Via::Kept(kept),
            (None, None) => Via::Dial,
        };
        Check { socket: self.socket.clone(), ask, via }
    }

    /// Takes back what a check of this socket found: its connection, and
    /// whether the server answered a PING or a call.
    pub(crate) fn checked(&mut self, checked: Checked) -> Result<(), ProbeFailure> {
        self.kept = checked.keep;
        match (&checked.outcome, checked.asked) {
            (Ok(()), Some(Ask::Ping)) => self.pings += 1,
            (Ok(()), Some(Ask::Call(_))) => self.pings = 0,
            _ => {}
        }
        checked.outcome
    }
}

/// What a check asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// An HTTP/2 PING: answered by the server's transport, a frame each way.
    Ping,
    /// A gRPC call.
    Call(Call),
}

/// The connection a check goes over.
#[derive(Debug)]
pub(crate) enum Via {
    /// A handler's connection to the socket, shared (see
    /// [`SharedConnections`](crate::SharedConnections)).
    Shared(UdsChannel),
    /// The monitor's own, kept from the socket's last probe.
    Kept(Kept),
    /// A new connection.
    Dial,
}

/// One check to make: of `socket`, what, over which connection.
#[derive(Debug)]
pub(crate) struct Check {
    socket: PathBuf,
    ask: Ask,
    via: Via,
}

/// How many connections the monitor keeps between probes, at most: each
/// costs its fixed HTTP/2 buffers, and plugins no handler holds a
/// connection to (CSI and DRA registration sockets, CSI drivers) are a
/// handful per node. Beyond it, probes dial and hang up: a PING on a bare
/// connection ([`Dialer::bare_ping`]), a call on an HTTP/2 one.
pub const MAX_KEPT_CONNECTIONS: usize = 128;

/// A connection the monitor keeps between a socket's probes.
#[derive(Debug)]
pub(crate) struct Kept {
    channel: UdsChannel,
    _slot: Slot,
}

impl Kept {
    /// Whether the plugin closed it (it exited or restarted, say).
    fn is_closed(&self) -> bool {
        self.channel.is_closed()
    }
}

/// One of the [`MAX_KEPT_CONNECTIONS`], taken before a connection to keep
/// is dialled, counted in `LivenessStats::probe_connections` for as long
/// as it is kept.
#[derive(Debug)]
struct Slot {
    count: Arc<AtomicUsize>,
}

impl Slot {
    /// A slot, unless all are taken.
    fn take(count: &Arc<AtomicUsize>) -> Option<Self> {
        let under_cap = |kept: usize| (kept < MAX_KEPT_CONNECTIONS).then_some(kept + 1);
        count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, under_cap).ok()?;
        Some(Self { count: Arc::clone(count) })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a check found, and the connection to keep for the next one.
#[derive(Debug)]
pub(crate) struct Checked {
    /// What was asked; `None` when the dial failed first.
    asked: Option<Ask>,
    outcome: Result<(), ProbeFailure>,
    /// The monitor's own connection, after an answer on it.
    keep: Option<Kept>,
}

impl Checked {
    /// What was asked, if the socket could be reached to ask it.
    pub(crate) fn asked(&self) -> Option<Ask> {
        self.asked
    }
}

/// What a check's connections are counted in and paid from.
#[derive(Debug)]
pub(crate) struct Connections {
    /// The connections kept now.
    pub(crate) kept: Arc<AtomicUsize>,
    /// The connections dialled so far.
    pub(crate) dials: Arc<AtomicU64>,
    pub(crate) budget: FdBudget,
}

/// Makes `check`, each step (dial, PING or call) within `timeout`. A call's
/// answer is not looked into beyond what tells liveness (a CSI driver's
/// readiness): registration already judged what the plugin said.
///
/// A dialled connection is kept for the next probe (counted in `kept`) when
/// it answered, the fd budget could spare an optional permit for it (a
/// quarter of the budget stays free) and fewer than
/// [`MAX_KEPT_CONNECTIONS`] are kept; otherwise it is closed after the
/// check, as is a kept connection that failed. A PING with no connection
/// to keep goes on a bare one, which costs no HTTP/2 state.
pub(crate) async fn check(check: Check, timeout: Duration, connections: &Connections) -> Checked {
    let Check { socket, ask, via } = check;
    let asked = |outcome, keep| Checked { asked: Some(ask), outcome, keep };
    match via {
        Via::Shared(channel) => asked(ask_on(&channel, ask, timeout).await, None),
        Via::Kept(connection) => {
            let outcome = ask_on(&connection.channel, ask, timeout).await;
            let keep = outcome.is_ok().then_some(connection);
            asked(outcome, keep)
        }
        Via::Dial => {
            let slot = Slot::take(&connections.kept);
            if slot.is_none() && ask == Ask::Ping {
                return bare_ping(&socket, timeout, connections).await;
            }
            match dial(&socket, timeout, &connections.budget).await {
                Ok((channel, keepable)) => {
                    connections.dials.fetch_add(1, Ordering::Relaxed);
                    let outcome = ask_on(&channel, ask, timeout).await;
                    let slot = slot.filter(|_| keepable && outcome.is_ok());
                    asked(outcome, slot.map(|slot| Kept { channel, _slot: slot }))
                }
                Err(failure) => Checked { asked: None, outcome: Err(failure), keep: None },
            }
        }
    }
}

/// A PING on a bare connection to `socket`, dialled for it alone; the
/// dialer's timeout bounds the connection and the PING together.
async fn bare_ping(socket: &Path, timeout: Duration, connections: &Connections) -> Checked {
    let dialer = Dialer::new(connections.budget.clone(), timeout);
    match dialer.bare_ping(socket).await {
        Err(err @ (TransportError::Connect { .. } | TransportError::Socket { .. })) => {
            Checked { asked: None, outcome: Err(dial_failure(&err)), keep: None }
        }
        outcome => {
            connections.dials.fetch_add(1, Ordering::Relaxed);
            let outcome = outcome.map_err(|err| match err {
                TransportError::DialTimeout { .. } => TimedCallError::TimedOut,
                err => TimedCallError::Failed(err),
            });
            let outcome = answered("HTTP/2 PING", timeout, outcome);
            Checked { asked: Some(Ask::Ping), outcome, keep: None }
        }
    }
}

/// A dial's failure, as a probe tells it.
fn dial_failure(err: &TransportError) -> ProbeFailure {
    ProbeFailure { gone: err.is_gone(), reason: err.to_string() }
}

/// Dials `socket`; says whether the connection may be kept (its permit is
/// an optional holder's).
async fn dial(
    socket: &Path,
    timeout: Duration,
    budget: &FdBudget,
) -> Result<(UdsChannel, bool), ProbeFailure> {
    let dialer = Dialer::new(budget.clone(), timeout);
    let (connected, keepable) = match dialer.clone().optional_holder().kept(socket).await {
        Err(TransportError::NoSparePermit { .. }) => (dialer.kept(socket).await, false),
        connected => (connected, true),
    };
    let channel = connected.map_err(|err| dial_failure(&err))?;
    Ok((channel, keepable))
}

async fn ask_on(channel: &UdsChannel, ask: Ask, timeout: Duration) -> Result<(), ProbeFailure> {
    match ask {
        Ask::Ping => {
            answered("HTTP/2 PING", timeout, uds::timed_call(timeout, channel.ping()).await)
        }
        Ask::Call(Call::GetInfo) => {
            let mut client = RegistrationClient::new(channel.clone())
                .max_decoding_message_size(MAX_REGISTRATION_MESSAGE_BYTES);
            let call = client.get_info(uds::timed_request(InfoRequest {}, timeout));
            answered("GetInfo", timeout, uds::timed_call(timeout, call).await).map(drop)
        }
        Ask::Call(Call::CsiProbe) => {
            let mut client = IdentityClient::new(channel.clone());
            let call = client.probe(uds::timed_request(ProbeRequest {}, timeout));
            let response =
                answered("Identity/Probe", timeout, uds::timed_call(timeout, call).await)?;
            // Absent means ready (CSI spec); not ready fails, as the
            // livenessprobe sidecar has it.
            if response.get_ref().ready == Some(false) {
                let reason = "Identity/Probe: the driver says it is not ready".to_owned();
                return Err(ProbeFailure { gone: false, reason });
            }
            Ok(())
        }
    }
}

/// What a PING or call `what` gave, within `timeout` ([`uds::timed_call`]).
fn answered<T, E: Failed>(
    what: &str,
    timeout: Duration,
    result: Result<T, TimedCallError<E>>,
) -> Result<T, ProbeFailure> {
    result.map_err(|err| {
        let reason = match err {
            TimedCallError::Failed(err) => format!("{what}: {}", err.why()),
            TimedCallError::TimedOut => format!("{what} timed out after {timeout:?}"),
        };
        ProbeFailure { gone: false, reason }
    })
}

/// An error of a PING or a call, as a probe's reason tells it.
trait Failed {
    fn why(&self) -> String;
}

impl Failed for tonic::Status {
    /// The gRPC code as Go names it, and the message.
    fn why(&self) -> String {
        format!("{}: {}", go_code_name(self.code()), self.message())
    }
}

impl Failed for TransportError {
    fn why(&self) -> String {
        self.to_string()
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
    // A Unix socket's connect completes or fails at once: the timeout only
    // guards.
    let stream = match Dialer::new(budget.clone(), RESET_WINDOW).stream(socket).await {
        Ok(stream) => stream,
        Err(TransportError::Connect { source, .. }) if is_absence(&source) => {
            return gone(source.to_string());
        }
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
    Dialer::new(budget.clone(), window).retry_refused_for(window).stream(endpoint).await.is_ok()
}

fn is_absence(err: &io::Error) -> bool {
    matches!(err.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound)
}
