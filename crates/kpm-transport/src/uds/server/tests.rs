//! The accept path on real sockets and paused time: permits, the handshake
//! timeout, shedding, and the request tracking that tells idle from busy.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;
use tokio::time::Instant;
use tokio_stream::StreamExt as _;
use tower::{Layer as _, ServiceExt as _};

use super::*;
use crate::uds::Incoming;

const TIMEOUT: Duration = Duration::from_secs(5);
/// The client magic and an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

fn incoming(dir: &Path, budget: &FdBudget) -> Incoming {
    let listener = UnixListener::bind(dir.join("server.sock")).unwrap();
    Incoming::new(listener).handshake_timeout(TIMEOUT).budget(budget.clone())
}

/// Reads until `n` octets came, then once more: what that read ends with.
async fn read_past<R: AsyncRead + Unpin>(io: &mut R, n: usize) -> io::Result<usize> {
    let mut buf = vec![0; n];
    io.read_exact(&mut buf).await?;
    io.read(&mut [0; 64]).await
}

#[tokio::test(start_paused = true)]
async fn a_client_that_sends_no_preface_is_closed_after_the_handshake_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let budget = FdBudget::new(4, None);
    let mut incoming = incoming(dir.path(), &budget);
    let mut client = UnixStream::connect(dir.path().join("server.sock")).await.unwrap();
    let mut connection = incoming.next().await.unwrap().unwrap();
    assert_eq!(budget.in_use(), 1, "the connection holds a permit");

    // The magic alone, and part of the SETTINGS frame, is not the preface.
    client.write_all(&PREFACE[..30]).await.unwrap();
    let started = Instant::now();
    let err = read_past(&mut connection, 30).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    assert_eq!(started.elapsed(), TIMEOUT);
    drop(connection);
    assert_eq!(budget.in_use(), 0, "released when the connection closes");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_sends_its_preface_in_time_keeps_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let budget = FdBudget::new(4, None);
    let mut incoming = incoming(dir.path(), &budget);
    let mut client = UnixStream::connect(dir.path().join("server.sock")).await.unwrap();
    let mut connection = incoming.next().await.unwrap().unwrap();
    client.write_all(&PREFACE[..20]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(4_999)).await;
    client.write_all(&PREFACE[20..]).await.unwrap();
    let reading = tokio::spawn(async move { read_past(&mut connection, PREFACE.len()).await });
    tokio::time::sleep(TIMEOUT * 10).await;
    assert!(!reading.is_finished());
    // A SETTINGS acknowledgement: a whole frame, which the rewriting passes.
    client.write_all(b"\0\0\0\x04\x01\0\0\0\0").await.unwrap();
    assert_eq!(reading.await.unwrap().unwrap(), 9, "still open long after the timeout");
}

#[tokio::test(start_paused = true)]
async fn an_http1_client_has_until_the_end_of_its_first_request_head() {
    let dir = tempfile::tempdir().unwrap();
    let budget = FdBudget::new(4, None);
    let listener = UnixListener::bind(dir.path().join("status.sock")).unwrap();
    let mut incoming = Http1Incoming::new(listener).handshake_timeout(TIMEOUT).budget(budget);
    let head = b"GET /v1/plugins HTTP/1.1\r\nhost: kpm\r\n";
    for complete in [false, true] {
        let mut client = UnixStream::connect(dir.path().join("status.sock")).await.unwrap();
        let mut connection = incoming.accept().await.unwrap();
        client.write_all(head).await.unwrap();
        if complete {
            client.write_all(b"\r\n").await.unwrap();
        }
        let sent = head.len() + if complete { 2 } else { 0 };
        let reading = tokio::spawn(async move { read_past(&mut connection, sent).await });
        tokio::time::sleep(TIMEOUT * 2).await;
        if complete {
            assert!(!reading.is_finished(), "a request head came in time");
            drop(client);
            assert_eq!(reading.await.unwrap().unwrap(), 0, "closed by the client");
        } else {
            let err = reading.await.unwrap().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        }
    }
}

#[test]
fn the_handshake_ends_exactly_where_the_preface_or_request_head_does() {
    let mut settings = PREFACE.to_vec();
    settings[26] = 6;
    settings.extend_from_slice(&[0; 6]);
    let cases: [(Protocol, &[u8]); 4] = [
        (Protocol::Http2, PREFACE),
        (Protocol::Http2, &settings),
        (Protocol::Http1, b"GET / HTTP/1.1\r\n\r\n"),
        (Protocol::Http1, b"GET / HTTP/1.1\r\nhost: \r\r\n\r\n"),
    ];
    for (protocol, handshake) in cases {
        for chunk in [1, 2, 7, handshake.len()] {
            let mut progress = Progress::new(protocol);
            let mut done_at = None;
            for (i, part) in handshake.chunks(chunk).enumerate() {
                if progress.advance(part) {
                    done_at.get_or_insert(i * chunk + part.len());
                }
            }
            let text = String::from_utf8_lossy(handshake);
            // The chunk it ends in is the last one.
            assert_eq!(done_at, Some(handshake.len()), "{text:?} in chunks of {chunk}");
            let mut short = Progress::new(protocol);
            assert!(
                !short.advance(&handshake[..handshake.len() - 1]),
                "{text:?} but its last octet"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_is_shed_when_the_budget_runs_short_and_a_busy_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let budget = FdBudget::new(2, None);
    let mut incoming = incoming(dir.path(), &budget);
    let mut clients = Vec::new();
    let mut connections = Vec::new();
    for _ in 0..2 {
        let mut client = UnixStream::connect(dir.path().join("server.sock")).await.unwrap();
        client.write_all(PREFACE).await.unwrap();
        clients.push(client);
        let mut connection = incoming.next().await.unwrap().unwrap();
        let mut preface = [0; PREFACE.len()];
        connection.read_exact(&mut preface).await.unwrap();
        connections.push(connection);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // The older one has a request open: the newer one is the idle one.
    let open = connections[0].activity().request();
    let mut readers: Vec<_> = connections
        .into_iter()
        .map(|mut connection| {
            tokio::spawn(async move {
                let read = connection.read(&mut [0; 16]).await;
                (read, connection)
            })
        })
        .collect();
    let waiting = tokio::spawn({
        let budget = budget.clone();
        async move { budget.acquire().await }
    });
    let (read, shed) = readers.pop().unwrap().await.unwrap();
    assert_eq!(read.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
    assert!(!readers[0].is_finished(), "a connection with a request open stays");
    assert!(!waiting.is_finished());
    drop(shed);
    waiting.await.unwrap();
    assert_eq!(budget.stats().shed_connections, 1);
    drop(open);
}

#[tokio::test]
async fn a_tracked_request_is_open_until_its_response_body_is_done() {
    let budget = FdBudget::new(1, None);
    let permit = budget.server_permit(Arc::from("kubelet.sock")).await;
    let service = TrackRequests.layer(tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, io::Error>(http::Response::new(tonic::body::Body::empty()))
    }));
    let mut request = http::Request::new(());
    request.extensions_mut().insert(permit.activity().clone());
    let response = service.clone().oneshot(request).await.unwrap();
    assert_eq!(permit.activity().open_requests(), 1, "the body is not done yet");
    drop(response);
    assert_eq!(permit.activity().open_requests(), 0);
    // A request from elsewhere (no connection in its extensions) passes.
    let response = service.oneshot(http::Request::new(())).await.unwrap();
    assert!(http_body::Body::is_end_stream(response.body()));
}
