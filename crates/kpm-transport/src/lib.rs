//! The Unix-socket gRPC transport of kpm: dialing a plugin's socket, binding
//! kpm's own, and the process's file descriptors as a budget every
//! connection pays from. The wire itself (generated code, constants) is
//! `kpm-api`; this crate does the IO.
//!
//! | item | what it is |
//! |---|---|
//! | [`Dialer`], [`GrpcChannel`], [`LiveConnections`] | the one way to dial a socket path: a fd budget, a connect timeout, refusals retried or not, and one method per kind of connection ([`Dialer::grpc`], [`Dialer::kept`], [`Dialer::stream`], [`Dialer::bare_ping`]); its connections counted while live |
//! | [`UdsChannel`], [`ResponseBody`], [`CallError`], [`PINGS_PER_CALL`], [`SmallBufferCodec`] | a plain HTTP/2 connection (h2, no hyper) kept for long, one per plugin, that also answers PINGs; prost's codec with small buffers for its streams |
//! | [`PermittedStream`] | a raw connected stream holding its permit, for a hyper client |
//! | [`bind`], [`bind_with_mode`], [`Incoming`], [`Connection`], [`BoundSocket`] | serving tonic on a socket: connections that take any `:authority` grpc-go sends, and a socket file removed only while it is still ours |
//! | [`Http1Incoming`], [`Listen`], [`TrackRequests`], [`ConnectionInfo`], [`DEFAULT_HANDSHAKE_TIMEOUT`] | the one accept path of every server: a budget permit per accepted connection, the handshake timeout, idle connections told from busy ones so that they can be shed |
//! | [`timed_request`], [`timed_call`], [`TimedCallError`] | every plugin call's deadline, sent along and enforced locally |
//! | [`fd`] | the fd budget: [`fd::budget`], [`fd::init`], [`fd::raise_soft_limit`], [`fd::FdStats`], the permits of accepted connections ([`fd::ServerPermit`]) |
//! | [`TransportError`] | the crate's one error |
//!
//! Module dependencies go one way: `error` ← `fd` ← `uds` (dialing, binding,
//! the `:authority` rewriting), re-exported here. The crate holds no logic
//! beyond dialing, binding, the budget and the rewriting. `cargo xtask tidy`
//! refuses a gRPC server on a plain `UnixListenerStream` outside this crate
//! (but for the test that shows h2 alone refusing grpc-go), so every server
//! pays for its connections and takes grpc-go's `:authority`;
//! kpm's HTTP/1 servers (the status API, metrics) take the same accept loop
//! through [`Incoming::into_http1`].
//!
//! Tests: `tests/uds.rs` binds and dials real sockets and `tests/emfile.rs`
//! runs out of fds; the handshake timeout and the shedding order are held on
//! paused time (`uds/server/tests.rs`, `fd/server.rs`); `uds/incoming/tests.rs`
//! feeds the rewriting chosen chunks and read sizes, with properties (any
//! bytes never panic, other frames pass byte for byte, a block keeps every
//! field but a refused `:authority`).

#![deny(missing_docs)]

pub mod fd;

mod error;
mod uds;

pub use error::TransportError;
pub use uds::*;
