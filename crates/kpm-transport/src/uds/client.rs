//! A lean gRPC client connection for connections kpm holds for long, one per
//! plugin: a plain hyper HTTP/2 connection on the Unix socket, without
//! tonic's `Channel` (its `Buffer` layer costs a task and a 9 KiB queue per
//! connection, and its reconnect logic is not wanted for a plugin that left).
//!
//! [`UdsChannel`] is a tower `Service` that tonic's generated clients take
//! as they take a `Channel`. It never reconnects: once the server closes the
//! connection, [`UdsChannel::is_closed`] says so and every call fails.
//! [`SmallBufferCodec`] is the prost codec with small buffers, for a stream
//! of small messages held for long (`ListAndWatch`).

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};
use tracing::debug;

use super::stream::{self, PermittedStream};
use super::{TransportError, server_pid};
use crate::fd::{self, FdPermit};

/// Initial size of [`SmallBufferCodec`]'s buffers: a device list of a few
/// devices fits, a larger message grows the buffer to its size.
const SMALL_BUFFER: usize = 512;

/// tonic's default yield threshold (not readable from `BufferSettings`):
/// only the buffer size changes.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// A gRPC client connection to one Unix socket, for tonic's generated
/// clients (`DevicePluginClient::new(channel)`). Cheap to clone; clones share
/// the connection, which closes when the last clone and the last response
/// stream on it are dropped.
#[derive(Debug, Clone)]
pub struct UdsChannel {
    send: http2::SendRequest<tonic::body::Body>,
    peer_pid: Option<u32>,
}

impl UdsChannel {
    /// Connects to the gRPC server on the Unix socket `path` and completes
    /// the HTTP/2 handshake, within `timeout`. A refused connection is
    /// retried every few milliseconds for up to `refused_retry` (see
    /// [`dial_patiently`](super::dial_patiently)). The connection holds a
    /// permit of the [fd budget](crate::fd), waited for before the timeout
    /// starts.
    pub async fn connect(
        path: &Path,
        timeout: Duration,
        refused_retry: Duration,
    ) -> Result<Self, TransportError> {
        let permit = fd::budget().acquire().await;
        Self::connect_with_permit(path, timeout, refused_retry, permit).await
    }

    /// Like [`connect`](Self::connect), the connection holding `permit`: an
    /// optional holder's from
    /// [`FdBudget::try_acquire`](crate::fd::FdBudget::try_acquire), say.
    pub async fn connect_with_permit(
        path: &Path,
        timeout: Duration,
        refused_retry: Duration,
        permit: FdPermit,
    ) -> Result<Self, TransportError> {
        Self::connect_with(path, timeout, refused_retry, permit, |stream| stream).await
    }

    /// Like [`connect_with_permit`](Self::connect_with_permit), with the
    /// connected stream wrapped by `wrap` before HTTP/2 runs on it (to watch
    /// the connection's reads, say).
    pub async fn connect_with<T>(
        path: &Path,
        timeout: Duration,
        refused_retry: Duration,
        permit: FdPermit,
        wrap: impl FnOnce(PermittedStream) -> T,
    ) -> Result<Self, TransportError>
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let connect = async {
            let stream = stream::connect_with_permit(path, refused_retry, permit)
                .await
                .map_err(|source| TransportError::Connect { path: path.to_path_buf(), source })?;
            let peer_pid = server_pid(stream.get_ref());
            Self::handshake_io(path, wrap(stream), peer_pid).await
        };
        match tokio::time::timeout(timeout, connect).await {
            Ok(connected) => connected,
            Err(_) => Err(TransportError::DialTimeout { path: path.to_path_buf(), timeout }),
        }
    }

    /// Runs HTTP/2 on a stream already connected to `path` (one end of a
    /// socket pair, say). The handshake only writes: it never waits for the
    /// server.
    pub async fn handshake(path: &Path, stream: UnixStream) -> Result<Self, TransportError> {
        let peer_pid = server_pid(&stream);
        Self::handshake_io(path, stream, peer_pid).await
    }

    async fn handshake_io<T>(
        path: &Path,
        io: T,
        peer_pid: Option<u32>,
    ) -> Result<Self, TransportError>
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (send, connection) = builder()
            .handshake(TokioIo::new(io))
            .await
            .map_err(|source| TransportError::Handshake { path: path.to_path_buf(), source })?;
        tokio::spawn(drive(path.to_path_buf(), connection));
        Ok(Self { send, peer_pid })
    }

    /// Whether the connection has closed (the server closed it or went away,
    /// or an HTTP/2 error ended it). A closed channel fails every call.
    pub fn is_closed(&self) -> bool {
        self.send.is_closed()
    }

    /// The process id of the server, as the kernel recorded it when the
    /// connection was made (`SO_PEERCRED`); `None` if unknown (another PID
    /// namespace gives 0).
    pub fn peer_pid(&self) -> Option<u32> {
        self.peer_pid
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for UdsChannel {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        // tonic's generated clients send the path alone; h2 needs a scheme
        // and an authority. `localhost`, as with the kubelet's dialer.
        // A URI without a path stays as it is, and hyper refuses it.
        let mut uri = request.uri().clone().into_parts();
        uri.scheme = Some(http::uri::Scheme::HTTP);
        uri.authority = Some(http::uri::Authority::from_static("localhost"));
        if let Ok(full) = http::Uri::from_parts(uri) {
            *request.uri_mut() = full;
        }
        Box::pin(self.send.send_request(request))
    }
}

/// The settings of every [`UdsChannel`]: hyper's defaults, as with tonic's
/// `Channel` (16 KiB header lists, no keep-alive pings: a dropped Unix
/// connection is seen at once as end-of-file). None of hyper's knobs lowers
/// the memory of a connection: frame size, windows and the send buffer limit
/// only bound what may be in flight, while h2's fixed buffers (16 KiB to
/// write, 8 KiB to read, 4 KiB for HPACK) are not configurable.
fn builder() -> http2::Builder<TokioExecutor> {
    http2::Builder::new(TokioExecutor::new())
}

/// Runs the connection until it ends; a failure is the plugin's business
/// and shows in the calls, so it is only logged.
async fn drive<T>(
    socket: PathBuf,
    connection: http2::Connection<TokioIo<T>, tonic::body::Body, TokioExecutor>,
) where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    if let Err(error) = connection.await {
        debug!(socket = %socket.display(), %error, "gRPC connection ended");
    }
}

/// tonic's prost codec with 512-byte buffers instead of 8 KiB:
/// a held stream keeps its decode buffer for as long as it lives. Use it
/// with `tonic::client::Grpc` directly (the generated clients always use
/// the default codec).
#[derive(Debug)]
pub struct SmallBufferCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for SmallBufferCodec<T, U> {
    fn default() -> Self {
        Self(ProstCodec::default())
    }
}

impl<T, U> Codec for SmallBufferCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(small_buffers())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(small_buffers())
    }
}

fn small_buffers() -> BufferSettings {
    BufferSettings::new(SMALL_BUFFER, YIELD_THRESHOLD)
}

#[cfg(test)]
mod tests;
