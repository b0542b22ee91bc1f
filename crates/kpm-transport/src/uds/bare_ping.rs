//! A liveness probe on a connection of its own: dial, the HTTP/2 client
//! preface with empty settings and one PING, wait for its acknowledgement,
//! GOAWAY, hang up. A gRPC server's transport answers it by itself, as on
//! a held connection, but kpm keeps nothing: none of h2's buffers (about
//! 28 KB a connection, docs/performance.md) and no task. For sockets probed
//! too rarely to keep a connection to each.

use std::io;
use std::path::Path;
use std::time::Duration;

use h2::Reason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::stream::{self, PermittedStream};
use crate::TransportError;
use crate::fd::FdPermit;

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types and the ACK flag (RFC 9113 §6).
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;

/// The PING's opaque data, which its acknowledgement echoes.
const OPAQUE: [u8; 8] = *b"kpm-live";

/// Dials `path` (no retry of a refusal: the socket is expected to be
/// served), the connection holding `permit`, and sends an HTTP/2 PING;
/// returns once the server acknowledged it. Unbounded in time: wrap it in
/// [`within`](super::within). A refused or missing socket is a
/// [`TransportError::Connect`] ([`TransportError::is_gone`]); anything else
/// that stands between the PING and its acknowledgement (the server closed
/// the connection, said GOAWAY) a [`TransportError::BarePing`].
pub async fn bare_ping(path: &Path, permit: FdPermit) -> Result<(), TransportError> {
    let mut stream = stream::connect_with_permit(path, Duration::ZERO, permit)
        .await
        .map_err(|source| TransportError::Connect { path: path.to_path_buf(), source })?;
    let failed = |source| TransportError::BarePing { path: path.to_path_buf(), source };
    let mut hello = PREFACE.to_vec();
    hello.extend_from_slice(&frame_header(0, SETTINGS, 0));
    hello.extend_from_slice(&frame_header(8, PING, 0));
    hello.extend_from_slice(&OPAQUE);
    stream.write_all(&hello).await.map_err(failed)?;
    acknowledged(&mut stream).await.map_err(failed)?;
    // The answer is in; the goodbye is a courtesy (last stream 0, no error).
    let mut goodbye = frame_header(8, GOAWAY, 0).to_vec();
    goodbye.extend_from_slice(&[0; 8]);
    let _ = stream.write_all(&goodbye).await;
    Ok(())
}

/// Reads frames until the acknowledgement of our PING; the server's
/// settings are acknowledged on the way, as the protocol asks.
async fn acknowledged(stream: &mut PermittedStream) -> io::Result<()> {
    loop {
        let mut header = [0; 9];
        read_exact(stream, &mut header).await?;
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]);
        let (kind, flags) = (header[3], header[4]);
        match kind {
            PING if flags & ACK != 0 && length == 8 => {
                let mut opaque = [0; 8];
                read_exact(stream, &mut opaque).await?;
                if opaque == OPAQUE {
                    return Ok(());
                }
            }
            GOAWAY if length >= 8 => {
                let mut payload = [0; 8];
                read_exact(stream, &mut payload).await?;
                let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!("the server said GOAWAY ({:?})", Reason::from(code)),
                ));
            }
            SETTINGS if flags & ACK == 0 => {
                skip(stream, length).await?;
                // Unwritten, it shows in the reads that follow: what the
                // server said (GOAWAY) or that it hung up is what is told.
                let _ = stream.write_all(&frame_header(0, SETTINGS, ACK)).await;
            }
            _ => skip(stream, length).await?,
        }
    }
}

/// A frame header on stream 0 (RFC 9113 §4.1).
fn frame_header(length: u32, kind: u8, flags: u8) -> [u8; 9] {
    let [_, high, middle, low] = length.to_be_bytes();
    [high, middle, low, kind, flags, 0, 0, 0, 0]
}

/// Fills `buf`; a connection closed first, or reset (closed with our PING
/// unread), says so.
async fn read_exact(stream: &mut PermittedStream, buf: &mut [u8]) -> io::Result<()> {
    let closed = "the server closed the connection before acknowledging the PING";
    match stream.read_exact(buf).await {
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => {
            Err(io::Error::new(err.kind(), closed))
        }
        Err(err) if err.kind() == io::ErrorKind::ConnectionReset => {
            Err(io::Error::new(err.kind(), format!("{closed}: {err}")))
        }
        other => other.map(drop),
    }
}

/// Reads and drops `length` bytes of a frame's payload.
async fn skip(stream: &mut PermittedStream, length: u32) -> io::Result<()> {
    let mut left = length as usize;
    let mut buf = [0; 512];
    while left > 0 {
        let chunk = left.min(buf.len());
        read_exact(stream, &mut buf[..chunk]).await?;
        left -= chunk;
    }
    Ok(())
}
