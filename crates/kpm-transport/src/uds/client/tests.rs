//! `Dialer::kept`'s `UdsChannel` and `Dialer::bare_ping` against a real
//! tonic server on a Unix socket: calls, a held stream, PINGs, the server
//! going away, and dialing nobody.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::*;
use crate::uds::Dialer;
use dp::device_plugin_client::DevicePluginClient;
use dp::device_plugin_server::{DevicePlugin, DevicePluginServer};
use kpm_api::deviceplugin::v1beta1 as dp;

const TIMEOUT: Duration = Duration::from_secs(10);
/// Only stops a hang; nothing here is expected to take long.
const DEADLINE: Duration = Duration::from_secs(30);

/// A device plugin whose `ListAndWatch` sends two updates and stays open.
struct Plugin;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(dp::DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: false,
        }))
    }

    type ListAndWatchStream = ReceiverStream<Result<dp::ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (send, receive) = mpsc::channel(4);
        tokio::spawn(async move {
            for count in 1..=2 {
                let devices = (0..count)
                    .map(|n| dp::Device { id: format!("dev-{n}"), ..Default::default() })
                    .collect();
                let _ = send.send(Ok(dp::ListAndWatchResponse { devices })).await;
            }
            // Holding the sender keeps the stream open, as a plugin does.
            send.closed().await;
        });
        Ok(Response::new(ReceiverStream::new(receive)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("not here"))
    }

    async fn allocate(
        &self,
        _: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        Err(Status::unimplemented("not here"))
    }

    async fn pre_start_container(
        &self,
        _: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

/// Serves [`Plugin`] on `socket` in a runtime of its own: shutting that
/// runtime down closes every connection, as the plugin's exit would.
fn serve(socket: &Path) -> tokio::runtime::Runtime {
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let incoming = {
        let _entered = runtime.enter();
        crate::uds::Incoming::new(tokio::net::UnixListener::from_std(listener).unwrap())
    };
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(Plugin))
            .serve_with_incoming(incoming),
    );
    runtime
}

/// `ListAndWatch` through `tonic::client::Grpc` with the small-buffer codec.
async fn list_and_watch(
    channel: UdsChannel,
) -> Result<tonic::codec::Streaming<dp::ListAndWatchResponse>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|err| Status::unavailable(err.to_string()))?;
    let path = http::uri::PathAndQuery::from_static("/v1beta1.DevicePlugin/ListAndWatch");
    let codec = SmallBufferCodec::<dp::Empty, dp::ListAndWatchResponse>::default();
    Ok(grpc.server_streaming(Request::new(dp::Empty {}), path, codec).await?.into_inner())
}

/// Waits until the channel reports its connection closed.
async fn wait_closed(channel: &UdsChannel) {
    tokio::time::timeout(DEADLINE, async {
        while !channel.is_closed() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the channel never reported its connection closed");
}

#[tokio::test]
async fn calls_and_streams_until_the_server_goes_then_reports_it_closed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("dp.sock");
    let server = serve(&socket);
    let channel = dialer(Duration::ZERO).kept(&socket).await.unwrap();
    assert_eq!(channel.peer_pid(), Some(std::process::id()));
    assert!(!channel.is_closed());

    let mut client = DevicePluginClient::new(channel.clone());
    let options = client.get_device_plugin_options(dp::Empty {}).await.unwrap().into_inner();
    assert!(options.pre_start_required);
    let unimplemented = client.allocate(dp::AllocateRequest::default()).await.unwrap_err();
    assert_eq!(unimplemented.code(), tonic::Code::Unimplemented);

    let mut stream = list_and_watch(channel.clone()).await.unwrap();
    for count in 1..=2 {
        let update = stream.message().await.unwrap().unwrap();
        assert_eq!(update.devices.len(), count);
    }

    server.shutdown_background();
    assert!(stream.message().await.is_err(), "the stream breaks when the server goes");
    wait_closed(&channel).await;
    let closed = client.get_device_plugin_options(dp::Empty {}).await.unwrap_err();
    assert_ne!(closed.code(), tonic::Code::Ok);
}

#[tokio::test]
async fn a_grpc_channel_names_its_server_and_calls_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("dp.sock");
    let server = serve(&socket);
    let dialed = dialer(Duration::ZERO).grpc(&socket).await.unwrap();
    assert_eq!(dialed.server_pid, Some(std::process::id()));
    let mut client = DevicePluginClient::new(dialed.channel);
    let options = client.get_device_plugin_options(dp::Empty {}).await.unwrap().into_inner();
    assert!(options.pre_start_required);
    server.shutdown_background();
}

#[tokio::test]
async fn a_server_that_closes_the_connection_is_seen_closed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("raw.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let channel = dialer(Duration::ZERO).kept(&socket).await.unwrap();
    let (accepted, _) = listener.accept().await.unwrap();
    assert!(!channel.is_closed());
    drop(accepted);
    wait_closed(&channel).await;
}

#[tokio::test]
async fn nobody_there_is_gone_and_names_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("missing.sock");
    let err = dialer(Duration::ZERO).kept(&socket).await.unwrap_err();
    assert!(matches!(err, TransportError::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains("missing.sock"), "{err}");
    assert!(err.is_gone(), "a missing socket file is gone: {err:?}");

    // A file nobody listens on refuses connections: gone too, also after
    // the refused-retry window.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let err = dialer(Duration::ZERO).kept(&socket).await.unwrap_err();
    assert!(err.is_gone(), "a refused connection is gone: {err:?}");
    let err = dialer(Duration::from_millis(20)).kept(&socket).await.unwrap_err();
    assert!(err.is_gone(), "refused all through the window: {err:?}");
}

#[tokio::test]
async fn a_refused_connection_is_retried_until_the_server_listens() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("late.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let dialer = dialer(TIMEOUT);
    let dial = dialer.kept(&socket);
    let listen = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Bound elsewhere and moved in: the path never goes missing.
        let fresh = dir.path().join("fresh.sock");
        let server = serve(&fresh);
        std::fs::rename(&fresh, &socket).unwrap();
        server
    };
    let (channel, server) = tokio::join!(dial, listen);
    let mut client = DevicePluginClient::new(channel.unwrap());
    client.get_device_plugin_options(dp::Empty {}).await.unwrap();
    server.shutdown_background();
}

#[tokio::test]
async fn a_ping_is_answered_by_the_servers_transport_with_no_call() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ping.sock");
    let server = serve(&socket);
    let channel = dialer(Duration::ZERO).kept(&socket).await.unwrap();
    for _ in 0..3 {
        tokio::time::timeout(DEADLINE, channel.ping()).await.unwrap().unwrap();
    }
    // Over the held stream's connection too, while the stream stays open.
    let mut stream = list_and_watch(channel.clone()).await.unwrap();
    stream.message().await.unwrap().unwrap();
    tokio::time::timeout(DEADLINE, channel.ping()).await.unwrap().unwrap();

    server.shutdown_background();
    wait_closed(&channel).await;
    let err = channel.ping().await.unwrap_err();
    assert!(matches!(err, TransportError::Ping { .. }), "{err:?}");
    assert!(err.to_string().contains("ping.sock"), "{err}");
}

/// A peer that takes the connection and never reads from it, as a stopped
/// process: the kernel queues what is sent, nothing answers.
#[tokio::test(start_paused = true)]
async fn a_ping_to_a_peer_that_never_answers_waits_and_the_next_waits_for_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("stopped.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let channel = dialer(Duration::ZERO).kept(&socket).await.unwrap();
    let (mut accepted, _) = listener.accept().await.unwrap();

    let timeout = Duration::from_secs(1);
    assert!(tokio::time::timeout(timeout, channel.ping()).await.is_err());
    assert!(tokio::time::timeout(timeout, channel.ping()).await.is_err());
    assert!(!channel.is_closed(), "unanswered is not closed");

    // One PING was sent for both waits: h2 allows one in flight.
    let mut sent = Vec::new();
    while let Ok(Ok(read)) = tokio::time::timeout(timeout, async {
        let mut buf = [0u8; 1024];
        tokio::io::AsyncReadExt::read(&mut accepted, &mut buf).await.map(|n| buf[..n].to_vec())
    })
    .await
    {
        if read.is_empty() {
            break;
        }
        sent.extend(read);
    }
    assert_eq!(count_frames(&sent, PING), 1, "{sent:?}");
}

const PING: u8 = 0x6;

/// The frames of type `kind` in what a client sent: its preface, then frames.
fn count_frames(sent: &[u8], kind: u8) -> usize {
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    assert!(sent.starts_with(preface));
    let mut rest = &sent[preface.len()..];
    let mut count = 0;
    while rest.len() >= 9 {
        let length = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        count += usize::from(rest[3] == kind);
        rest = &rest[(9 + length).min(rest.len())..];
    }
    count
}

/// A budget of its own, to see every bare PING's connection closed.
fn budget() -> crate::fd::FdBudget {
    crate::fd::FdBudget::new(8, None)
}

/// A dialer on a budget of its own, refusals retried for `refused_retry`.
fn dialer(refused_retry: Duration) -> Dialer {
    Dialer::new(budget(), TIMEOUT).retry_refused_for(refused_retry)
}

#[tokio::test]
async fn a_bare_ping_is_answered_by_the_servers_transport_and_leaves_no_connection() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bare.sock");
    let server = serve(&socket);
    let budget = budget();
    // More than a held connection takes between calls: each is a new one.
    let dialer = Dialer::new(budget.clone(), TIMEOUT);
    for _ in 0..=PINGS_PER_CALL + 1 {
        tokio::time::timeout(DEADLINE, dialer.bare_ping(&socket)).await.unwrap().unwrap();
    }
    assert_eq!(budget.in_use(), 0);
    server.shutdown_background();
}

#[tokio::test]
async fn a_bare_ping_to_nobody_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.sock");
    let err = dialer(Duration::ZERO).bare_ping(&missing).await.unwrap_err();
    assert!(err.is_gone(), "{err:?}");
    // A socket file nobody listens on: refused.
    let closed = dir.path().join("closed.sock");
    drop(std::os::unix::net::UnixListener::bind(&closed).unwrap());
    let err = dialer(Duration::ZERO).bare_ping(&closed).await.unwrap_err();
    assert!(err.is_gone(), "{err:?}");
}

/// A peer that takes the connection and never reads from it, as a stopped
/// process: the PING waits until the dialer's timeout; the client sent the
/// preface, empty settings and one PING.
#[tokio::test(start_paused = true)]
async fn a_bare_ping_to_a_peer_that_never_answers_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("stopped.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let ping = tokio::spawn(async move {
        Dialer::new(budget(), Duration::from_secs(1)).bare_ping(&socket).await
    });
    let (mut accepted, _) = listener.accept().await.unwrap();
    let err = ping.await.unwrap().unwrap_err();
    assert!(matches!(err, TransportError::DialTimeout { .. }), "no acknowledgement: {err:?}");
    let mut sent = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut accepted, &mut sent).await.unwrap();
    assert_eq!(count_frames(&sent, 0x4), 1, "{sent:?}");
    assert_eq!(count_frames(&sent, PING), 1, "{sent:?}");
}

/// A peer that answers the preface with `answer` and nothing else, and
/// holds the connection until the client closes it; with no answer, it
/// hangs up.
async fn bare_ping_answered_with(answer: &'static [u8]) -> TransportError {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("peer.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        let (mut accepted, _) = listener.accept().await.unwrap();
        let mut preface = [0; 24];
        tokio::io::AsyncReadExt::read_exact(&mut accepted, &mut preface).await.unwrap();
        if !answer.is_empty() {
            tokio::io::AsyncWriteExt::write_all(&mut accepted, answer).await.unwrap();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut accepted, &mut Vec::new()).await;
        }
    });
    let dialer = dialer(Duration::ZERO);
    let err = tokio::time::timeout(DEADLINE, dialer.bare_ping(&socket)).await.unwrap().unwrap_err();
    assert!(matches!(err, TransportError::BarePing { .. }), "{err:?}");
    assert!(err.to_string().contains("peer.sock"), "{err}");
    err
}

#[tokio::test]
async fn a_bare_ping_fails_with_the_servers_goaway_or_its_hang_up() {
    // Settings (one, acknowledged on the way), then GOAWAY ENHANCE_YOUR_CALM.
    let goaway: &[u8] = &[
        0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 0x3, 0, 0, 0, 100, //
        0, 0, 8, 0x7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xb,
    ];
    let err = bare_ping_answered_with(goaway).await;
    assert!(err.to_string().contains("GOAWAY (ENHANCE_YOUR_CALM)"), "{err}");
    let err = bare_ping_answered_with(&[]).await;
    assert!(err.to_string().contains("closed the connection before acknowledging"), "{err}");
}
