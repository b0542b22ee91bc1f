//! What a binary needs of kpm's Unix-socket transport (`kpm-transport`),
//! and no more: raising the soft open-files limit, sizing the fd budget and
//! reading its stats ([`fd`]), binding a socket with a mode and serving
//! tonic or HTTP/1 on it within the budget ([`bind_with_mode`], [`Incoming`],
//! [`Http1Incoming`], [`TrackRequests`], [`BoundSocket`]), and dialing a
//! plugin ([`Dialer`], paid from the budget the caller names, with the
//! types its methods give: [`GrpcChannel`], [`UdsChannel`],
//! [`PermittedStream`], [`LiveConnections`]; a [`Reach`] is a budget and
//! the [`HostRoot`] a process sees the host's `/` at, and [`file_id_at`]
//! tells a socket made anew at a path from the one seen before).
//!
//! ```no_run
//! # async fn example() -> Result<(), kpm::transport::TransportError> {
//! use kpm::transport::{self, fd};
//!
//! fd::raise_soft_limit()?;
//! fd::init(fd::DEFAULT_RESERVE);
//! let socket = std::path::Path::new("/run/agent.sock");
//! let (incoming, bound) = transport::bind_with_mode(socket, transport::OWNER_ONLY).await?;
//! // tonic::transport::Server::builder()...serve_with_incoming(incoming)
//! # drop(incoming);
//! bound.remove().ok();
//! # Ok(())
//! # }
//! ```

pub use kpm_transport::{
    BoundSocket, Connection, DEFAULT_HANDSHAKE_TIMEOUT, Dialer, GrpcChannel, HostRoot,
    Http1Connection, Http1Incoming, Incoming, Listen, LiveConnections, OWNER_ONLY, PermittedStream,
    Reach, TrackRequests, TransportError, UdsChannel, bind, bind_with_mode, file_id_at,
};

/// The process's file descriptors as a budget every connection kpm dials
/// pays from: size it once at start, read its stats for metrics.
pub mod fd {
    pub use kpm_transport::fd::{
        Activity, DEFAULT_RESERVE, FdBudget, FdStats, NofileLimit, SHORTAGE_PAUSE, budget, init,
        is_shortage, nofile_limit, open_fds, raise_soft_limit,
    };
}
