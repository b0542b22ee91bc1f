//! A lean gRPC client connection for connections kpm holds for long, one per
//! plugin: h2 itself on the Unix socket, without hyper's client or tonic's
//! `Channel` on top (tonic's `Buffer` layer costs a task and a 9 KiB queue
//! per connection, hyper's client a dispatch queue of 8.5 KB and two tasks
//! per request; docs/performance.md measures them).
//!
//! [`UdsChannel`] is a tower `Service` that tonic's generated clients take
//! as they take a `Channel`, and it answers [`UdsChannel::ping`]: an HTTP/2
//! PING, which the peer's transport acknowledges by itself. It never
//! reconnects: once the server closes the connection,
//! [`UdsChannel::is_closed`] says so and every call fails.
//! [`SmallBufferCodec`] is the prost codec with small buffers, for a stream
//! of small messages held for long (`ListAndWatch`).

use std::future::poll_fn;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use h2::client::{Connection, SendRequest};
use h2::{Ping, PingPong, Reason, RecvStream};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};
use tracing::debug;

use super::{TransportError, server_pid};

/// Initial size of [`SmallBufferCodec`]'s buffers: a device list of a few
/// devices fits, a larger message grows the buffer to its size.
const SMALL_BUFFER: usize = 512;

/// tonic's default yield threshold (not readable from `BufferSettings`):
/// only the buffer size changes.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// The largest header list kpm takes from a plugin, as hyper's client
/// (and so tonic's `Channel`) allows.
const MAX_HEADER_LIST_SIZE: u32 = 16 << 10;

/// How many PINGs a gRPC server takes between two responses when they come
/// often (see [`UdsChannel::ping`]): grpc-go's and C-core's
/// `maxPingStrikes` of 2, plus the first PING, which is not a strike.
pub const PINGS_PER_CALL: u32 = 3;

/// A gRPC client connection to one Unix socket, for tonic's generated
/// clients (`DevicePluginClient::new(channel)`), made by
/// [`Dialer::kept`](super::Dialer::kept). Cheap to clone; clones share
/// the connection, which closes when the last clone and the last response
/// stream on it are dropped.
///
/// Calls send their request body whole once it has ended: unary and
/// server-streaming calls, the only kinds kpm makes.
#[derive(Debug, Clone)]
pub struct UdsChannel {
    send: SendRequest<Bytes>,
    shared: Arc<Shared>,
}

/// What the clones of a channel and its connection's task share.
#[derive(Debug)]
struct Shared {
    path: PathBuf,
    peer_pid: Option<u32>,
    /// Set when the connection's task ends.
    closed: AtomicBool,
    pings: tokio::sync::Mutex<Pings>,
}

/// The connection's one PING in flight (h2 allows no more).
#[derive(Debug)]
struct Pings {
    /// `None` only if h2 gave none, which it does once per connection.
    ping_pong: Option<PingPong>,
    /// A PING was sent and its acknowledgement not yet seen (its caller
    /// gave up waiting).
    outstanding: bool,
}

impl UdsChannel {
    /// Runs HTTP/2 on a stream already connected to `path` (one end of a
    /// socket pair, say). The handshake only writes: it never waits for the
    /// server.
    pub async fn handshake(path: &Path, stream: UnixStream) -> Result<Self, TransportError> {
        let peer_pid = server_pid(&stream);
        Self::handshake_io(path, stream, peer_pid).await
    }

    /// Runs HTTP/2 on `io`, connected to `path` and served by `peer_pid`.
    pub(super) async fn handshake_io<T>(
        path: &Path,
        io: T,
        peer_pid: Option<u32>,
    ) -> Result<Self, TransportError>
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (send, mut connection) = h2::client::Builder::new()
            .max_header_list_size(MAX_HEADER_LIST_SIZE)
            .handshake(io)
            .await
            .map_err(|source| TransportError::Handshake { path: path.to_path_buf(), source })?;
        let pings = Pings { ping_pong: connection.ping_pong(), outstanding: false };
        let shared = Arc::new(Shared {
            path: path.to_path_buf(),
            peer_pid,
            closed: AtomicBool::new(false),
            pings: tokio::sync::Mutex::new(pings),
        });
        tokio::spawn(drive(Arc::clone(&shared), connection));
        Ok(Self { send, shared })
    }

    /// Whether the connection has closed (the server closed it or went away,
    /// or an HTTP/2 error ended it). A closed channel fails every call.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// The process id of the server, as the kernel recorded it when the
    /// connection was made (`SO_PEERCRED`); `None` if unknown (another PID
    /// namespace gives 0).
    pub fn peer_pid(&self) -> Option<u32> {
        self.shared.peer_pid
    }

    /// Sends an HTTP/2 PING and waits for the peer to acknowledge it, which
    /// its HTTP/2 layer does by itself: a frame each way, no request. A
    /// stopped or wedged process never does. A PING whose caller gave up
    /// waiting is still the one in flight (h2 allows one): the next call
    /// waits for its acknowledgement instead of sending another. Put a
    /// deadline on it ([`timed_call`](super::timed_call)). Fails once the
    /// connection is closed.
    ///
    /// gRPC servers count PINGs that come less than five minutes apart with
    /// no response sent in between: grpc-go and gRPC C-core close the
    /// connection (`GOAWAY ENHANCE_YOUR_CALM`, `too_many_pings`) at the
    /// fourth, and start over whenever they send a response. Make a call
    /// after at most [`PINGS_PER_CALL`] PINGs.
    pub async fn ping(&self) -> Result<(), TransportError> {
        let failed = |source| TransportError::Ping { path: self.shared.path.clone(), source };
        let mut pings = self.shared.pings.lock().await;
        let Pings { ping_pong, outstanding } = &mut *pings;
        let ping_pong = ping_pong.as_mut().ok_or_else(|| failed(Reason::INTERNAL_ERROR.into()))?;
        if !*outstanding {
            ping_pong.send_ping(Ping::opaque()).map_err(failed)?;
            *outstanding = true;
        }
        poll_fn(|cx| ping_pong.poll_pong(cx)).await.map_err(failed)?;
        *outstanding = false;
        Ok(())
    }
}

/// An error of a call on a [`UdsChannel`]: h2's, or the request body's.
pub type CallError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<http::Request<tonic::body::Body>> for UdsChannel {
    type Response = http::Response<ResponseBody>;
    type Error = CallError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, CallError>> + Send + 'static>>;

    /// Always ready: a call waits for the connection's stream limit itself.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let send = self.send.clone();
        Box::pin(async move {
            let (mut head, body) = request.into_parts();
            // tonic's generated clients send the path alone; h2 needs a
            // scheme and an authority. `localhost`, as with the kubelet's
            // dialer. A URI without a path stays as it is, and h2 refuses it.
            let mut uri = head.uri.clone().into_parts();
            uri.scheme = Some(http::uri::Scheme::HTTP);
            uri.authority = Some(http::uri::Authority::from_static("localhost"));
            if let Ok(full) = http::Uri::from_parts(uri) {
                head.uri = full;
            }
            let body = body.collect().await?.to_bytes();
            let mut send = send.ready().await?;
            let request = http::Request::from_parts(head, ());
            let (response, mut stream) = send.send_request(request, body.is_empty())?;
            if !body.is_empty() {
                stream.send_data(body, true)?;
            }
            Ok(response.await?.map(|recv| ResponseBody { recv, data_done: false }))
        })
    }
}

/// The body of a response on a [`UdsChannel`]: its data, then its trailers
/// (a gRPC status). Each chunk of data read gives its flow-control window
/// back, so that a stream held for long never stalls.
#[derive(Debug)]
pub struct ResponseBody {
    recv: RecvStream,
    data_done: bool,
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        if !self.data_done {
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Fails only once the stream is gone, which the next
                    // poll reports.
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(err)) => return Poll::Ready(Some(Err(err))),
                None => self.data_done = true,
            }
        }
        match ready!(self.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(err) => Poll::Ready(Some(Err(err))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }
}

/// Runs the connection until it ends, then marks it closed; a failure is
/// the plugin's business and shows in the calls, so it is only logged.
async fn drive<T>(shared: Arc<Shared>, connection: Connection<T, Bytes>)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    if let Err(error) = connection.await {
        debug!(socket = %shared.path.display(), %error, "gRPC connection ended");
    }
    shared.closed.store(true, Ordering::Release);
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
