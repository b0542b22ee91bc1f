//! Raw HTTP/2 against each kind of gRPC server kpm runs on a Unix socket, the
//! way grpc-go clients that dial a socket path talk to them: the kubelet's
//! plugin watcher calls `GetInfo` on a registration socket with the socket's
//! path as `:authority`, and most device plugins call `Register` on
//! `kubelet.sock` the same way. Every server must answer a path, an empty
//! `:authority` and `localhost` alike, whether the header block comes in one
//! HEADERS frame or is continued in CONTINUATION frames.
//!
//! The client here is hand-made (tonic always sends a valid authority): it
//! encodes headers like grpc-go (Huffman, incremental indexing, with
//! `httlib-hpack`) and decodes the server's with `loona-hpack`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use kpm::device::{DeviceConfig, DeviceManager};
use kpm_api::deviceplugin::v1beta1::RegisterRequest;
use kpm_api::registration::v1::{InfoRequest, PluginInfo};
use kpm_registrar::Registrar;
use kpm_registrar::stub::StubDevicePlugin;
use prost::Message;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// Within which every answer comes, on the busiest CI machine.
const DEADLINE: Duration = Duration::from_secs(20);

/// How the client sends its request's header block.
#[derive(Debug, Clone, Copy)]
enum Framing {
    OneFrame,
    /// One CONTINUATION frame every 4 bytes of the block.
    Continued,
}

/// What the server answered one call with.
#[derive(Debug)]
enum Answer {
    /// `:status`, the response message, `grpc-status`.
    Grpc { status: Vec<u8>, message: Vec<u8>, grpc_status: Vec<u8> },
    /// The stream was reset, with this error code.
    Reset(u32),
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut bytes = len[1..].to_vec();
    bytes.extend([kind, flags]);
    bytes.extend(stream.to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// One unary gRPC call over a fresh connection to `socket`, as grpc-go makes
/// it; `authority: None` leaves `:authority` out.
async fn call(
    socket: &Path,
    method: &str,
    request: &impl Message,
    authority: Option<&str>,
    framing: Framing,
) -> Answer {
    let exchange = exchange(socket, method, request.encode_to_vec(), authority, framing);
    tokio::time::timeout(DEADLINE, exchange).await.unwrap_or_else(|_| {
        panic!("{method} on {} with {authority:?}: no answer", socket.display())
    })
}

async fn exchange(
    socket: &Path,
    method: &str,
    message: Vec<u8>,
    authority: Option<&str>,
    framing: Framing,
) -> Answer {
    const LIKE_GRPC_GO: u8 = 0x1 | 0x2 | 0x4 | 0x10;
    let mut fields = vec![(":method", "POST"), (":scheme", "http"), (":path", method)];
    fields.extend(authority.map(|authority| (":authority", authority)));
    fields.extend([
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.72.1"),
        ("te", "trailers"),
        ("grpc-timeout", "9999946u"),
    ]);
    let mut encoder = httlib_hpack::Encoder::default();
    let mut block = Vec::new();
    for (name, value) in fields {
        let field = (name.as_bytes().to_vec(), value.as_bytes().to_vec(), LIKE_GRPC_GO);
        encoder.encode(field, &mut block).unwrap();
    }

    let mut sent = PREFACE.to_vec();
    sent.extend(frame(SETTINGS, 0, 0, &[]));
    match framing {
        Framing::OneFrame => sent.extend(frame(HEADERS, END_HEADERS, 1, &block)),
        Framing::Continued => {
            let mut chunks = block.chunks(4).peekable();
            let mut kind = HEADERS;
            while let Some(chunk) = chunks.next() {
                let flags = if chunks.peek().is_none() { END_HEADERS } else { 0 };
                sent.extend(frame(kind, flags, 1, chunk));
                kind = CONTINUATION;
            }
        }
    }
    let mut data = vec![0];
    data.extend(u32::try_from(message.len()).unwrap().to_be_bytes());
    data.extend(message);
    sent.extend(frame(DATA, END_STREAM, 1, &data));

    let mut stream = UnixStream::connect(socket).await.unwrap();
    stream.write_all(&sent).await.unwrap();

    let mut decoder = loona_hpack::Decoder::new();
    let (mut status, mut message, mut grpc_status) = (Vec::new(), Vec::new(), Vec::new());
    let mut block = Vec::new();
    loop {
        let mut head = [0; 9];
        stream.read_exact(&mut head).await.unwrap();
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let mut payload = vec![0; len];
        stream.read_exact(&mut payload).await.unwrap();
        match kind {
            SETTINGS if flags & ACK == 0 => {
                stream.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
            }
            RST_STREAM => {
                return Answer::Reset(u32::from_be_bytes(payload[..4].try_into().unwrap()));
            }
            GOAWAY => panic!("GOAWAY: {payload:?}"),
            DATA => message.extend_from_slice(payload.get(5..).unwrap_or_default()),
            HEADERS | CONTINUATION => {
                block.extend_from_slice(&payload);
                if flags & END_HEADERS == 0 {
                    continue;
                }
                for (name, value) in decoder.decode(&std::mem::take(&mut block)).unwrap() {
                    match &name[..] {
                        b":status" => status = value,
                        b"grpc-status" => grpc_status = value,
                        _ => {}
                    }
                }
                if flags & END_STREAM != 0 {
                    return Answer::Grpc { status, message, grpc_status };
                }
            }
            _ => {}
        }
    }
}

/// Every `:authority` grpc-go clients send, in both framings, gets the
/// answer `localhost` gets: `check` is given the response message.
async fn answers_alike(socket: &Path, method: &str, request: &impl Message, check: impl Fn(&[u8])) {
    let path = socket.to_str().unwrap();
    for authority in [Some(path), Some(""), Some("localhost"), None] {
        for framing in [Framing::OneFrame, Framing::Continued] {
            let what = format!("{method} with :authority {authority:?}, {framing:?}");
            match call(socket, method, request, authority, framing).await {
                Answer::Grpc { status, message, grpc_status } => {
                    assert_eq!(status, b"200", "{what}");
                    assert_eq!(grpc_status, b"0", "{what}");
                    check(&message);
                }
                Answer::Reset(code) => panic!("{what}: stream reset with error code {code}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_socket_answers_get_info_whatever_the_authority() {
    let dir = tempfile::tempdir().unwrap();
    let registrar = Registrar::builder("CSIPlugin", "csi.example.com")
        .socket_dir(dir.path())
        .routes(kpm_registrar::stub::routes("CSIPlugin", "csi.example.com"))
        .serve()
        .await
        .unwrap();
    let socket = registrar.socket_path().to_path_buf();
    answers_alike(
        &socket,
        "/pluginregistration.Registration/GetInfo",
        &InfoRequest {},
        |message| {
            let info = PluginInfo::decode(message).unwrap();
            assert_eq!((&info.r#type[..], &info.name[..]), ("CSIPlugin", "csi.example.com"));
        },
    )
    .await;
    // The stub CSI driver served on the same socket.
    let request = kpm_api::csi::v1::GetPluginInfoRequest {};
    answers_alike(&socket, "/csi.v1.Identity/GetPluginInfo", &request, |message| {
        let info = kpm_api::csi::v1::GetPluginInfoResponse::decode(message).unwrap();
        assert_eq!(info.name, "csi.example.com");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_sock_answers_register_whatever_the_authority() {
    let dir = tempfile::tempdir().unwrap();
    let manager =
        DeviceManager::try_new(DeviceConfig::default(), kpm::transport::fd::budget().clone())
            .unwrap();
    let _served = manager.serve_registration(dir.path()).await.unwrap();
    let kubelet_sock = dir.path().join("kubelet.sock");
    let (plugin, _devices) = StubDevicePlugin::new([("gpu-0", "Healthy")]);
    let endpoint = Registrar::builder("DevicePlugin", "vendor.com/gpu")
        .socket_dir(dir.path())
        .routes(plugin.routes())
        .serve()
        .await
        .unwrap();
    let request = RegisterRequest {
        version: "v1beta1".into(),
        endpoint: endpoint.socket_path().file_name().unwrap().to_str().unwrap().into(),
        resource_name: "vendor.com/gpu".into(),
        options: None,
    };
    answers_alike(&kubelet_sock, "/v1beta1.Registration/Register", &request, |message| {
        assert!(message.is_empty(), "Register answers Empty");
    })
    .await;
    let mut changes = manager.changes();
    let registered = changes.wait_for(|_| {
        manager.resources().iter().any(|resource| resource.resource == "vendor.com/gpu")
    });
    tokio::time::timeout(DEADLINE, registered).await.unwrap().unwrap();
}

/// The reason for all of this: a tonic server on a plain listener resets a
/// stream whose `:authority` is a path with `PROTOCOL_ERROR` (1). Should h2
/// ever accept such requests, this fails, and the rewriting can go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_alone_still_refuses_a_path_as_authority() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("plain.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let routes = kpm_registrar::stub::routes("CSIPlugin", "csi.example.com");
    tokio::spawn(
        tonic::transport::Server::builder().add_routes(routes).serve_with_incoming(incoming),
    );
    let request = kpm_api::csi::v1::GetPluginInfoRequest {};
    let path = socket.to_str().unwrap();
    let method = "/csi.v1.Identity/GetPluginInfo";
    let answer = call(&socket, method, &request, Some(path), Framing::OneFrame).await;
    assert!(matches!(answer, Answer::Reset(1)), "{answer:?}");
    let answer = call(&socket, method, &request, Some("localhost"), Framing::OneFrame).await;
    assert!(matches!(answer, Answer::Grpc { .. }), "{answer:?}");
}
