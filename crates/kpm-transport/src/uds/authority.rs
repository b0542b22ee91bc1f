//! Makes the `:authority` of a client's HTTP/2 requests acceptable to h2.
//!
//! grpc-go clients that dial a Unix socket through a dialer of their own (the
//! kubelet's plugin watcher, most device plugins) send the socket's path as
//! `:authority`. h2 resets every such stream with `PROTOCOL_ERROR`, a path not
//! being an RFC 3986 authority (hyperium/h2 #442 and PR #487, hyperium/tonic
//! #243, hyperium/hyper #3750), while grpc-go's own servers answer it.
//!
//! [`Rewriter`] reads the client-to-server byte stream ahead of h2, sans IO.
//! Every frame passes as it is, except header blocks (a HEADERS frame and its
//! CONTINUATION frames), which it decodes with the client's HPACK context. A
//! block whose `:authority` h2 would accept passes as it is too (framed
//! again if it came in several frames), so a client that never sends such an
//! `:authority` (tonic, grpc-go told `WithAuthority`) reaches h2 byte for
//! byte. The first block that needs it gets `localhost` instead, what tonic
//! and the kubelet's own clients send, and from then on every block of the
//! connection is encoded again, into frames of at most 16 KiB, by an encoder
//! of our own: once one block differs, the client's dynamic table and h2's
//! are no longer the same. That first block opens with table size updates to
//! 0 and back, which empty h2's table, so that our encoder's table, new and
//! empty, mirrors it. Nothing in the header list changes but the
//! `:authority`.
//!
//! The HPACK tables, the encoder and Huffman decoding come from `httlib-hpack`
//! and `httlib-huffman` (a table-driven decoder, about 0.4 µs a string); the
//! walk over a block's representations (RFC 7541 §5.1, §6, under 100 lines)
//! is ours, because `httlib-hpack`'s own decoder indexes past the end of a
//! truncated block. `loona-hpack`, the maintained fork of `hpack`, is correct
//! but builds its Huffman table anew for every string (about 140 times
//! slower, and every first request carries five or more), so it is only the
//! independent decoder the property tests check our output with. h2's own
//! HPACK is private, and a fork of h2 is not worth keeping.
//!
//! Only the client's bytes are read: what the server writes is never
//! touched. A malformed frame or block closes that one connection.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use httlib_hpack::Encoder;
use httlib_hpack::table::Table;
use httlib_huffman::DecoderSpeed;

/// The bytes a client opens every HTTP/2 connection with (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;
/// Length, type, flags and stream id (RFC 9113 §4.1).
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Stream dependency and weight, in a HEADERS frame with the PRIORITY flag.
const PRIORITY_LEN: usize = 5;
/// The largest frame payload every HTTP/2 peer accepts (the initial
/// `SETTINGS_MAX_FRAME_SIZE`): rewritten blocks are framed within it.
const MAX_FRAME_PAYLOAD: usize = 16_384;
/// The HPACK dynamic table size of an h2 server: the initial
/// `SETTINGS_HEADER_TABLE_SIZE`, which hyper and tonic never change. It bounds
/// the client's table, and h2's table starts at it.
const HEADER_TABLE_SIZE: u32 = 4096;

/// The most a header block may take, compressed (the fragments of all its
/// frames) and decoded (names, values and 32 bytes per field, as
/// `SETTINGS_MAX_HEADER_LIST_SIZE` counts). Four times hyper's default header
/// list limit: anything h2 would answer gets through to it; above this the
/// connection is closed.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;

/// What replaces an `:authority` h2 would refuse.
const LOCALHOST: &[u8] = b"localhost";

/// Why a client's byte stream cannot be passed to h2. Each one is a connection
/// error in HTTP/2 too (RFC 9113 §5.4.1), so the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Malformed {
    /// A CONTINUATION frame that does not continue a header block, or another
    /// frame in the middle of one.
    Continuation,
    /// Padding or priority fields longer than the frame.
    FrameLayout,
    /// More than [`MAX_HEADER_BLOCK`], compressed or decoded.
    TooLarge,
    /// The header block is not valid HPACK.
    Hpack(&'static str),
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Continuation => {
                f.write_str("a header block is interrupted or continued out of place")
            }
            Self::FrameLayout => f.write_str("padding or priority longer than the HEADERS frame"),
            Self::TooLarge => write!(f, "a header block over {MAX_HEADER_BLOCK} bytes"),
            Self::Hpack(what) => write!(f, "invalid HPACK: {what}"),
        }
    }
}

/// What to do with the bytes at the front of the client's stream.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Scan {
    /// Up to this many bytes go to h2 as they are; report with
    /// [`Rewriter::passed`] how many did.
    Pass(usize),
    /// Nothing can be decided before more bytes arrive: a frame header or a
    /// header block is incomplete.
    NeedMore,
    /// The first `len` bytes were a whole header block; `frames` go to h2
    /// instead.
    Rewrite { len: usize, frames: Vec<u8> },
}

/// The client-to-server half of one HTTP/2 connection, seen frame by frame.
pub(crate) struct Rewriter {
    /// Bytes of the preface, or of the frame being passed, still to come.
    passing: usize,
    /// The client's HPACK context, as the client's encoder keeps it.
    client: Table<'static>,
    /// Our HPACK context towards h2, the mirror of h2's decoder, from the
    /// first block that had to be rewritten on.
    server: Option<Encoder<'static>>,
}

impl fmt::Debug for Rewriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rewriter").field("passing", &self.passing).finish_non_exhaustive()
    }
}

impl Default for Rewriter {
    fn default() -> Self {
        Self {
            // The preface is h2's to check.
            passing: PREFACE_LEN,
            client: Table::with_dynamic_size(HEADER_TABLE_SIZE),
            server: None,
        }
    }
}

impl Rewriter {
    /// Looks at the front of what the client sent and has not been handed on.
    /// A `Rewrite` has changed the HPACK contexts: its `len` bytes must not be
    /// scanned again.
    pub(crate) fn scan(&mut self, bytes: &[u8]) -> Result<Scan, Malformed> {
        if self.passing == 0 {
            let Some(head) = FrameHead::read(bytes) else { return Ok(Scan::NeedMore) };
            match head.kind {
                HEADERS => return self.header_block(bytes),
                CONTINUATION => return Err(Malformed::Continuation),
                _ => self.passing = FRAME_HEADER_LEN + head.len,
            }
        }
        Ok(match self.passing.min(bytes.len()) {
            0 => Scan::NeedMore,
            n => Scan::Pass(n),
        })
    }

    /// `n` bytes of a [`Scan::Pass`] went to h2.
    pub(crate) fn passed(&mut self, n: usize) {
        self.passing -= n.min(self.passing);
    }

    /// A HEADERS frame starts `bytes`: once its whole block is there, decode
    /// it, and pass it on as it is or with its `:authority` fixed.
    fn header_block(&mut self, bytes: &[u8]) -> Result<Scan, Malformed> {
        let Some(Gathered { len, first, fragments }) = gather(bytes)? else {
            return Ok(Scan::NeedMore);
        };
        let block: Cow<'_, [u8]> = match &fragments[..] {
            [one] => Cow::Borrowed(&bytes[one.clone()]),
            all => Cow::Owned(
                all.iter().flat_map(|fragment| &bytes[fragment.clone()]).copied().collect(),
            ),
        };
        let mut fields = self.decode(&block)?;
        let mut refused = false;
        for field in &mut fields {
            if field.name == b":authority"
                && http::uri::Authority::try_from(&field.value[..]).is_err()
            {
                field.value = LOCALHOST.to_vec();
                refused = true;
            }
        }
        // Allocated only once a block is to be encoded: blocks passed as
        // they are, the common case, need none.
        let mut encoded = Vec::new();
        let server = match &mut self.server {
            Some(server) => server,
            None if !refused && fragments.len() == 1 => {
                self.passing = len;
                return Ok(Scan::Pass(len));
            }
            // Continued blocks are framed again, in as few frames as can be:
            // h2 takes at most a handful of CONTINUATION frames
            // (`too_many_continuations`), and a block must fare the same
            // whatever its `:authority`.
            None if !refused => {
                let frames = frame(&first, &bytes[..FRAME_HEADER_LEN], &block);
                return Ok(Scan::Rewrite { len, frames });
            }
            None => {
                // Empty h2's dynamic table, which the client filled, so that
                // it is exactly the new encoder's (RFC 7541 §4.2 allows both
                // updates at the start of a block). The client's entries
                // would do no harm, being older than ours and evicted first,
                // but a table that mirrors is one less thing to reason about.
                let mut server = Encoder::with_dynamic_size(HEADER_TABLE_SIZE);
                for size in [0, HEADER_TABLE_SIZE] {
                    server
                        .update_max_dynamic_size(size, &mut encoded)
                        .map_err(|_| Malformed::Hpack("a table size our encoder refused"))?;
                }
                self.server.insert(server)
            }
        };
        encoded.reserve(block.len() + LOCALHOST.len());
        for field in fields {
            let flags = Encoder::BEST_FORMAT
                | match field.kind {
                    Kind::Indexed | Kind::Incremental => Encoder::WITH_INDEXING,
                    Kind::NeverIndexed => Encoder::NEVER_INDEXED,
                    Kind::WithoutIndexing => 0,
                };
            server
                .encode((field.name, field.value, flags), &mut encoded)
                .map_err(|_| Malformed::Hpack("a field our encoder refused"))?;
        }
        let frames = frame(&first, &bytes[..FRAME_HEADER_LEN], &encoded);
        Ok(Scan::Rewrite { len, frames })
    }

    /// Decodes a header block with the client's context (RFC 7541 §6),
    /// updating it as the client's encoder did.
    fn decode(&mut self, mut block: &[u8]) -> Result<Vec<Field>, Malformed> {
        let mut fields = Vec::new();
        let mut size = 0;
        while let Some(&first) = block.first() {
            let field = if first & 0x80 != 0 {
                let (index, rest) = integer(block, 7)?;
                block = rest;
                let (name, value) = self.indexed(index)?;
                Field { name: name.to_vec(), value: value.to_vec(), kind: Kind::Indexed }
            } else if first & 0xe0 == 0x20 {
                let (max, rest) = integer(block, 5)?;
                block = rest;
                // Only before the first field (RFC 7541 §4.2), and within
                // what the server allows.
                let max = u32::try_from(max)
                    .ok()
                    .filter(|max| *max <= HEADER_TABLE_SIZE && fields.is_empty())
                    .ok_or(Malformed::Hpack(
                        "a dynamic table size update out of place or too large",
                    ))?;
                self.client.update_max_dynamic_size(max);
                continue;
            } else {
                let (kind, prefix) = match first & 0xf0 {
                    0x00 => (Kind::WithoutIndexing, 4),
                    0x10 => (Kind::NeverIndexed, 4),
                    _ => (Kind::Incremental, 6),
                };
                let (index, rest) = integer(block, prefix)?;
                let (name, rest) = match index {
                    0 => string(rest)?,
                    index => (self.indexed(index)?.0.to_vec(), rest),
                };
                let (value, rest) = string(rest)?;
                block = rest;
                if kind == Kind::Incremental {
                    self.client.insert(name.clone(), value.clone());
                }
                Field { name, value, kind }
            };
            size += field.name.len() + field.value.len() + 32;
            if size > MAX_HEADER_BLOCK {
                return Err(Malformed::TooLarge);
            }
            fields.push(field);
        }
        Ok(fields)
    }

    fn indexed(&self, index: usize) -> Result<(&[u8], &[u8]), Malformed> {
        u32::try_from(index)
            .ok()
            .and_then(|index| self.client.get(index))
            .ok_or(Malformed::Hpack("an index outside the tables"))
    }
}

/// One decoded field, and how the client represented it.
#[derive(Debug)]
struct Field {
    name: Vec<u8>,
    value: Vec<u8>,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Indexed,
    Incremental,
    WithoutIndexing,
    NeverIndexed,
}

/// The header of one frame.
#[derive(Debug, Clone, Copy)]
struct FrameHead {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameHead {
    fn read(bytes: &[u8]) -> Option<Self> {
        let head: &[u8; FRAME_HEADER_LEN] = bytes.get(..FRAME_HEADER_LEN)?.try_into().ok()?;
        Some(Self {
            len: usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]),
            kind: head[3],
            flags: head[4],
            // The reserved bit is h2's to look at; it stays in the bytes.
            stream: u32::from_be_bytes([head[5] & 0x7f, head[6], head[7], head[8]]),
        })
    }
}

/// A whole header block at the front of the client's bytes.
#[derive(Debug)]
struct Gathered {
    /// How many bytes its frames take.
    len: usize,
    /// The HEADERS frame's flags and priority fields, kept for the new frame.
    first: First,
    /// Where its HPACK fragments are, padding and priority left out.
    fragments: Vec<Range<usize>>,
}

#[derive(Debug)]
struct First {
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
}

/// Finds the frames of the header block that starts `bytes`: `None` until
/// all of them are there. Nothing is copied. The bound counts frame headers
/// too, so a flood of empty CONTINUATION frames is refused as well.
fn gather(bytes: &[u8]) -> Result<Option<Gathered>, Malformed> {
    let Some(head) = FrameHead::read(bytes) else { return Ok(None) };
    let mut at = 0;
    let mut frame = head;
    let mut fragments = Vec::new();
    let mut first = None;
    loop {
        let payload = at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + frame.len;
        if payload.end > MAX_HEADER_BLOCK {
            return Err(Malformed::TooLarge);
        }
        let Some(body) = bytes.get(payload.clone()) else { return Ok(None) };
        let fragment = match first {
            None => {
                let (fields, fragment) = headers_payload(frame.flags, body)?;
                first = Some(fields);
                fragment
            }
            Some(_) => 0..body.len(),
        };
        fragments.push(payload.start + fragment.start..payload.start + fragment.end);
        at = payload.end;
        if frame.flags & END_HEADERS != 0 {
            break;
        }
        let Some(next) = FrameHead::read(&bytes[at..]) else { return Ok(None) };
        if next.kind != CONTINUATION || next.stream != head.stream {
            return Err(Malformed::Continuation);
        }
        frame = next;
    }
    Ok(first.map(|first| Gathered { len: at, first, fragments }))
}

/// Splits a HEADERS payload into the fields kept for the new frame and the
/// range of its HPACK fragment (RFC 9113 §6.2).
fn headers_payload(flags: u8, body: &[u8]) -> Result<(First, Range<usize>), Malformed> {
    let mut start = 0;
    let mut end = body.len();
    if flags & PADDED != 0 {
        let pad = usize::from(*body.first().ok_or(Malformed::FrameLayout)?);
        start += 1;
        end = end.checked_sub(pad).ok_or(Malformed::FrameLayout)?;
    }
    let priority = if flags & PRIORITY == 0 {
        None
    } else {
        let fields = body.get(start..start + PRIORITY_LEN).ok_or(Malformed::FrameLayout)?;
        start += PRIORITY_LEN;
        Some(fields.try_into().map_err(|_| Malformed::FrameLayout)?)
    };
    if start > end {
        return Err(Malformed::FrameLayout);
    }
    Ok((First { end_stream: flags & END_STREAM != 0, priority }, start..end))
}

/// Frames `block` as a HEADERS frame on the stream of `head`, followed by
/// CONTINUATION frames, none over [`MAX_FRAME_PAYLOAD`].
fn frame(first: &First, head: &[u8], block: &[u8]) -> Vec<u8> {
    let stream = &head[5..FRAME_HEADER_LEN];
    let priority = first.priority.as_ref().map_or(&[][..], |fields| &fields[..]);
    let mut frames = Vec::with_capacity(block.len() + priority.len() + 2 * FRAME_HEADER_LEN);
    let (mut chunk, mut rest) = block.split_at(block.len().min(MAX_FRAME_PAYLOAD - priority.len()));
    let mut kind = HEADERS;
    let mut flags = if first.end_stream { END_STREAM } else { 0 }
        | if priority.is_empty() { 0 } else { PRIORITY };
    let mut prefix = priority;
    loop {
        if rest.is_empty() {
            flags |= END_HEADERS;
        }
        // At most 16 KiB: the low three bytes hold it.
        let len = (prefix.len() + chunk.len()).to_be_bytes();
        frames.extend_from_slice(&len[len.len() - 3..]);
        frames.extend_from_slice(&[kind, flags]);
        frames.extend_from_slice(stream);
        frames.extend_from_slice(prefix);
        frames.extend_from_slice(chunk);
        if rest.is_empty() {
            return frames;
        }
        (chunk, rest) = rest.split_at(rest.len().min(MAX_FRAME_PAYLOAD));
        (kind, flags, prefix) = (CONTINUATION, 0, &[]);
    }
}

/// An HPACK integer with a `prefix`-bit prefix (RFC 7541 §5.1), and what
/// follows it. Values above `u32::MAX` are refused.
fn integer(bytes: &[u8], prefix: u8) -> Result<(usize, &[u8]), Malformed> {
    const TRUNCATED: Malformed = Malformed::Hpack("a truncated integer");
    const TOO_LARGE: Malformed = Malformed::Hpack("an integer too large");
    let (&first, mut rest) = bytes.split_first().ok_or(TRUNCATED)?;
    let max = (1_u8 << prefix) - 1;
    let mut value = u64::from(first & max);
    if value == u64::from(max) {
        let mut shift = 0;
        loop {
            let (&byte, after) = rest.split_first().ok_or(TRUNCATED)?;
            rest = after;
            value += u64::from(byte & 0x7f) << shift;
            if value > u64::from(u32::MAX) || shift > 28 {
                return Err(TOO_LARGE);
            }
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
    }
    Ok((usize::try_from(value).map_err(|_| TOO_LARGE)?, rest))
}

/// An HPACK string literal (RFC 7541 §5.2), decoded, and what follows it.
fn string(bytes: &[u8]) -> Result<(Vec<u8>, &[u8]), Malformed> {
    let huffman = bytes.first().is_some_and(|first| first & 0x80 != 0);
    let (len, rest) = integer(bytes, 7)?;
    if len > rest.len() {
        return Err(Malformed::Hpack("a truncated string"));
    }
    let (raw, rest) = rest.split_at(len);
    if !huffman {
        return Ok((raw.to_vec(), rest));
    }
    let mut decoded = Vec::with_capacity(raw.len() * 8 / 5);
    httlib_huffman::decode(raw, &mut decoded, DecoderSpeed::FiveBits)
        .map_err(|_| Malformed::Hpack("invalid Huffman code"))?;
    Ok((decoded, rest))
}
