//! A liveness probe on a connection of its own: dial, the HTTP/2 client
//! preface with empty settings and one PING, wait for its acknowledgement,
//! GOAWAY, hang up. A gRPC server's transport answers it by itself, as on
//! a held connection, but kpm keeps nothing: none of h2's buffers (about
//! 28 KB a connection, docs/performance.md) and no task. For sockets probed
//! too rarely to keep a connection to each.

use std::io;
use std::path::Path;

use h2::Reason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::stream::PermittedStream;
use crate::TransportError;

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types and the ACK flag (RFC 9113 §6).
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;

/// The PING's opaque data, which its acknowledgement echoes.
const OPAQUE: [u8; 8] = *b"kpm-live";

/// Sends an HTTP/2 PING on `stream`, just connected to `path`, and
/// returns once the server acknowledged it, then says GOAWAY. Unbounded in
/// time: [`Dialer::bare_ping`](super::Dialer::bare_ping) bounds it.
pub(super) async fn ping(path: &Path, mut stream: PermittedStream) -> Result<(), TransportError> {
    let failed = |source| TransportError::BarePing { path: path.to_path_buf(), source };
    let mut hello = PREFACE.to_vec();
    hello.extend_from_slice(&frame_header(0, SETTINGS, 0));
    hello.extend_from_slice(&frame_header(8, PING, 0));
    hello.extend_from_slice(&OPAQUE);
    stream.write_all(&hello).await.map_err(failed)?;
    let mut frames = Frames { stream: &mut stream, buf: [0; 512], start: 0, end: 0 };
    let settings = frames.until_acknowledged().await.map_err(failed)?;
    // The answer is in. The server's settings are acknowledged, as the
    // protocol asks, with the goodbye (last stream 0, no error), in one
    // write; it is a courtesy, so its failure is no probe's.
    let mut goodbye = Vec::with_capacity(26);
    if settings {
        goodbye.extend_from_slice(&frame_header(0, SETTINGS, ACK));
    }
    goodbye.extend_from_slice(&frame_header(8, GOAWAY, 0));
    goodbye.extend_from_slice(&[0; 8]);
    let _ = stream.write_all(&goodbye).await;
    Ok(())
}

/// A frame header on stream 0 (RFC 9113 §4.1).
fn frame_header(length: u32, kind: u8, flags: u8) -> [u8; 9] {
    let [_, high, middle, low] = length.to_be_bytes();
    [high, middle, low, kind, flags, 0, 0, 0, 0]
}

/// The server's frames, read a buffer at a time: its settings, a window
/// update and the PING's acknowledgement usually come in one read.
struct Frames<'a> {
    stream: &'a mut PermittedStream,
    buf: [u8; 512],
    /// What is read and not yet taken: `buf[start..end]`.
    start: usize,
    end: usize,
}

impl Frames<'_> {
    /// Reads frames until the acknowledgement of our PING; says whether the
    /// server sent settings to acknowledge.
    async fn until_acknowledged(&mut self) -> io::Result<bool> {
        let mut settings = false;
        loop {
            let [high, middle, low, kind, flags, ..] = self.take::<9>().await?;
            let length = u32::from_be_bytes([0, high, middle, low]);
            match kind {
                PING if flags & ACK != 0 && length == 8 => {
                    if self.take::<8>().await? == OPAQUE {
                        return Ok(settings);
                    }
                }
                GOAWAY if length >= 8 => {
                    let [.., a, b, c, d] = self.take::<8>().await?;
                    let reason = Reason::from(u32::from_be_bytes([a, b, c, d]));
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!("the server said GOAWAY ({reason:?})"),
                    ));
                }
                _ => {
                    settings |= kind == SETTINGS && flags & ACK == 0;
                    self.skip(length).await?;
                }
            }
        }
    }

    /// The next `N` bytes.
    async fn take<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        while self.end - self.start < N {
            self.buf.copy_within(self.start..self.end, 0);
            (self.end, self.start) = (self.end - self.start, 0);
            self.read().await?;
        }
        let mut taken = [0; N];
        taken.copy_from_slice(&self.buf[self.start..self.start + N]);
        self.start += N;
        Ok(taken)
    }

    /// Drops the next `length` bytes (a frame's payload).
    async fn skip(&mut self, length: u32) -> io::Result<()> {
        let mut left = usize::try_from(length).unwrap_or(usize::MAX);
        loop {
            let dropped = left.min(self.end - self.start);
            (self.start, left) = (self.start + dropped, left - dropped);
            if left == 0 {
                return Ok(());
            }
            (self.start, self.end) = (0, 0);
            self.read().await?;
        }
    }

    /// Reads what is there into the free end of the buffer; a connection
    /// closed first, or reset (closed with our PING unread), says so.
    async fn read(&mut self) -> io::Result<()> {
        let closed = "the server closed the connection before acknowledging the PING";
        match self.stream.read(&mut self.buf[self.end..]).await {
            Ok(0) => Err(io::Error::new(io::ErrorKind::UnexpectedEof, closed)),
            Ok(read) => {
                self.end += read;
                Ok(())
            }
            Err(err) if err.kind() == io::ErrorKind::ConnectionReset => {
                Err(io::Error::new(err.kind(), format!("{closed}: {err}")))
            }
            Err(err) => Err(err),
        }
    }
}
