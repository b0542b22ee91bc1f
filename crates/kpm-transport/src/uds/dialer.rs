//! The one way kpm opens a connection: a [`Dialer`] carries the fd budget
//! its connections pay from, how it takes their permits, its connect
//! timeout and its patience with refused connections, and has one method per
//! kind of connection.

use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use super::stream::{self, LiveConnections, PermittedStream, Prepared};
use super::{HostRoot, Reach, UdsChannel, bare_ping, server_pid};
use crate::TransportError;
use crate::fd::FdBudget;

/// Opens connections to Unix sockets, each holding a permit of the dialer's
/// [fd budget](crate::fd) for as long as it is open. Cheap to clone.
///
/// The permit is taken before the connect timeout starts, and a shortage of
/// fds (`EMFILE`, `ENFILE`) met creating the socket is waited out then too:
/// kpm's own lack of fds is never a plugin's failure. By default a dial
/// waits for its permit (an operation's); an
/// [optional holder](Self::optional_holder)'s dial never waits and is
/// refused instead while a quarter or less of the budget is free.
///
/// A path it is given is a path on the host, and errors name it so; it is
/// opened where this process sees it ([`HostRoot::reach`]).
///
/// One method per kind of connection: [`grpc`](Self::grpc) (a tonic
/// `Channel`, for short-lived use), [`kept`](Self::kept) (a [`UdsChannel`],
/// held for long), [`stream`](Self::stream) (a raw stream, for a hyper
/// client) and [`bare_ping`](Self::bare_ping) (an HTTP/2 PING on a
/// connection of its own).
#[derive(Debug, Clone)]
pub struct Dialer {
    budget: FdBudget,
    host: HostRoot,
    connect_timeout: Duration,
    refused_retry: Duration,
    optional: bool,
    live: Option<LiveConnections>,
}

/// A tonic `Channel` from [`Dialer::grpc`], and the server it reached.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GrpcChannel {
    /// The channel, for tonic's generated clients. Should it reconnect, the
    /// new connection waits for a permit of its own from the same budget.
    pub channel: Channel,
    /// The process serving the socket: the pid the kernel recorded when the
    /// server called `listen()` (`SO_PEERCRED`), in kpm's pid namespace.
    /// `None` when the kernel reports 0: the server runs in a pid namespace
    /// kpm cannot see into.
    pub server_pid: Option<u32>,
}

impl Dialer {
    /// A dialer whose connections pay from the budget of `reach` (name
    /// the process-wide one, [`fd::budget`](crate::fd::budget), to share
    /// it), waiting for a permit, each connection given `connect_timeout`
    /// once it has one, to sockets of the host `reach` sees (an
    /// [`FdBudget`] alone: the host itself). A refused connection fails at
    /// once.
    pub fn new(reach: impl Into<Reach>, connect_timeout: Duration) -> Self {
        let reach = reach.into();
        Self {
            budget: reach.budget().clone(),
            host: reach.host().clone(),
            connect_timeout,
            refused_retry: Duration::ZERO,
            optional: false,
            live: None,
        }
    }

    /// Retries a refused connection every few milliseconds for up to
    /// `window` (within the connect timeout). A socket file appears at
    /// `bind()`, before the server calls `listen()`; plugins built on gRPC's
    /// C core leave a visible gap there, and a refusal in it says nothing
    /// about the plugin's health.
    #[must_use]
    pub fn retry_refused_for(mut self, window: Duration) -> Self {
        self.refused_retry = window;
        self
    }

    /// Makes the dialer's connections optional holders of the budget
    /// ([`FdBudget::try_acquire`]): a dial never waits for a permit, and
    /// fails with [`TransportError::NoSparePermit`] while taking one would
    /// leave a quarter or less of the budget free, so that optional
    /// connections can never starve registrations.
    #[must_use]
    pub fn optional_holder(mut self) -> Self {
        self.optional = true;
        self
    }

    /// Counts the dialer's connections in `live` while they are live (see
    /// [`LiveConnections`]): an observed connection.
    #[must_use]
    pub fn counted_in(mut self, live: &LiveConnections) -> Self {
        self.live = Some(live.clone());
        self
    }

    /// The budget the dialer's connections pay from.
    pub fn budget(&self) -> &FdBudget {
        &self.budget
    }

    /// How long a connection may take once it has its permit.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// A tonic `Channel` to the gRPC server on `path` (including the HTTP/2
    /// handshake), for short-lived connections, and the pid of the process
    /// serving it. The refused-connection window applies to a reconnection
    /// too.
    pub async fn grpc(&self, path: &Path) -> Result<GrpcChannel, TransportError> {
        // Taken by the first connection; a reconnection prepares its own.
        let first = Arc::new(Mutex::new(Some(self.prepare(path).await?)));
        let (target, budget, refused_retry) =
            (Arc::<Path>::from(self.host.reach(path)), self.budget.clone(), self.refused_retry);
        let (live, peer) = (self.live.clone(), Arc::new(OnceLock::new()));
        let seen = Arc::clone(&peer);
        let timeout = self.connect_timeout;
        // The URI is never resolved, the connector below ignores it;
        // `localhost` becomes the `:authority`, as with the kubelet's dialer.
        let endpoint = Endpoint::from_static("http://localhost").connect_timeout(timeout);
        let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
            let (target, first, seen) =
                (Arc::clone(&target), Arc::clone(&first), Arc::clone(&seen));
            let (budget, live) = (budget.clone(), live.clone());
            async move {
                let prepared = first.lock().unwrap_or_else(PoisonError::into_inner).take();
                let prepared = match prepared {
                    Some(prepared) => prepared,
                    None => Prepared {
                        permit: budget.acquire().await,
                        socket: stream::new_socket(&budget).await?,
                    },
                };
                let stream = stream::connect_prepared(&target, refused_retry, prepared).await?;
                // The first connection's answer; a reconnection keeps it.
                let _ = seen.set(server_pid(stream.get_ref()));
                Ok::<_, io::Error>(TokioIo::new(observe(stream, live.as_ref())))
            }
        }));
        match tokio::time::timeout(timeout, connect).await {
            Ok(Ok(channel)) => {
                Ok(GrpcChannel { channel, server_pid: peer.get().copied().flatten() })
            }
            Ok(Err(source)) => Err(TransportError::Dial { path: path.to_path_buf(), source }),
            Err(_) => Err(self.timed_out(path)),
        }
    }

    /// A [`UdsChannel`] to the gRPC server on `path`, its HTTP/2 handshake
    /// done: a connection kept for long, one per plugin, that never
    /// reconnects.
    pub async fn kept(&self, path: &Path) -> Result<UdsChannel, TransportError> {
        let prepared = self.prepare(path).await?;
        let connect = async {
            let stream = self.connect(path, prepared).await?;
            let peer_pid = server_pid(stream.get_ref());
            UdsChannel::handshake_io(path, stream, peer_pid).await
        };
        tokio::time::timeout(self.connect_timeout, connect)
            .await
            .unwrap_or_else(|_| Err(self.timed_out(path)))
    }

    /// A raw stream connected to `path`, holding its permit, for a hyper
    /// client or a look at the socket.
    pub async fn stream(&self, path: &Path) -> Result<PermittedStream, TransportError> {
        let prepared = self.prepare(path).await?;
        tokio::time::timeout(self.connect_timeout, self.connect(path, prepared))
            .await
            .unwrap_or_else(|_| Err(self.timed_out(path)))
    }

    /// An HTTP/2 PING on a connection dialled for it alone: the client
    /// preface with empty settings and the PING, then GOAWAY once the
    /// server acknowledged it, and the connection closed. The server's
    /// transport answers by itself, as on a kept connection, but nothing of
    /// h2 is kept (no buffers, no task): a liveness probe for sockets probed
    /// too rarely to keep a connection to each. The connect timeout bounds the connection and the
    /// PING together ([`TransportError::DialTimeout`]). A refused or missing
    /// socket is a [`TransportError::Connect`]
    /// ([`TransportError::is_gone`]); anything else that stands between the
    /// PING and its acknowledgement (the server closed the connection, said
    /// GOAWAY) a [`TransportError::BarePing`].
    pub async fn bare_ping(&self, path: &Path) -> Result<(), TransportError> {
        let prepared = self.prepare(path).await?;
        let ping = async { bare_ping::ping(path, self.connect(path, prepared).await?).await };
        tokio::time::timeout(self.connect_timeout, ping)
            .await
            .unwrap_or_else(|_| Err(self.timed_out(path)))
    }

    /// The permit and the socket of a connection to `path`, both taken
    /// before its timeout starts.
    async fn prepare(&self, path: &Path) -> Result<Prepared, TransportError> {
        let permit = if self.optional {
            self.budget
                .try_acquire()
                .ok_or_else(|| TransportError::NoSparePermit { path: path.to_path_buf() })?
        } else {
            self.budget.acquire().await
        };
        let socket = stream::new_socket(&self.budget)
            .await
            .map_err(|source| TransportError::Socket { path: path.to_path_buf(), source })?;
        Ok(Prepared { permit, socket })
    }

    /// Connects a prepared socket, refusals retried as configured.
    async fn connect(
        &self,
        path: &Path,
        prepared: Prepared,
    ) -> Result<PermittedStream, TransportError> {
        stream::connect_prepared(&self.host.reach(path), self.refused_retry, prepared)
            .await
            .map(|stream| observe(stream, self.live.as_ref()))
            .map_err(|source| TransportError::Connect { path: path.to_path_buf(), source })
    }

    fn timed_out(&self, path: &Path) -> TransportError {
        TransportError::DialTimeout { path: path.to_path_buf(), timeout: self.connect_timeout }
    }
}

/// `stream`, counted in `live` if there is one.
fn observe(stream: PermittedStream, live: Option<&LiveConnections>) -> PermittedStream {
    match live {
        Some(live) => stream.counted_in(live),
        None => stream,
    }
}

#[cfg(test)]
mod tests;
