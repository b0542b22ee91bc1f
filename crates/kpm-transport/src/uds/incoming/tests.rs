//! The client-to-server direction of a [`Connection`](super::Connection),
//! driven through the same read path with chosen chunks and buffer sizes.
//! Clients encode with `httlib-hpack`; what h2 would see is decoded with
//! `loona-hpack`, an HPACK implementation of its own.

use std::collections::VecDeque;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use proptest::prelude::*;
use tokio::io::{AsyncRead, ReadBuf};

use super::ClientBytes;
use crate::uds::MAX_HEADER_BLOCK;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
const SOCKET_PATH: &str = "/var/lib/kubelet/plugins_registry/csi.example.com-reg.sock";

// === Driving the read path ===

/// A client whose bytes arrive in the given chunks, then end.
struct Chunks(VecDeque<Vec<u8>>);

impl AsyncRead for Chunks {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(mut chunk) = self.0.pop_front() {
            let n = chunk.len().min(buf.remaining());
            buf.put_slice(&chunk[..n]);
            if n < chunk.len() {
                self.0.push_front(chunk.split_off(n));
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Everything the server reads when the client sends `bytes` cut at `cuts`,
/// read `buf_size` bytes at a time.
fn serve(bytes: &[u8], cuts: &[usize], buf_size: usize) -> io::Result<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|cut| cut % (bytes.len() + 1)).collect();
    points.extend([0, bytes.len()]);
    points.sort_unstable();
    points.dedup();
    let chunks = points.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect();
    let mut client = Chunks(chunks);
    let mut reader = ClientBytes::default();
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    let mut storage = vec![0; buf_size];
    loop {
        let mut buf = ReadBuf::new(&mut storage);
        match reader.poll_read(&mut client, Path::new(SOCKET_PATH), &mut cx, &mut buf) {
            Poll::Ready(Ok(())) if buf.filled().is_empty() => return Ok(out),
            Poll::Ready(Ok(())) => out.extend_from_slice(buf.filled()),
            Poll::Ready(Err(err)) => return Err(err),
            Poll::Pending => unreachable!("the client never makes the server wait"),
        }
    }
}

// === The client's side: HPACK and frames ===

/// A header field as a client sends it: name, value and `httlib-hpack`'s
/// encoder flags (Huffman name / value, indexing, never indexed, best format).
type Field = (Vec<u8>, Vec<u8>, u8);

fn field(name: &str, value: &str, flags: u8) -> Field {
    (name.as_bytes().to_vec(), value.as_bytes().to_vec(), flags)
}

/// How grpc-go and h2 encode: Huffman, indexed, best representation.
const LIKE_GRPC_GO: u8 = 0x1 | 0x2 | 0x4 | 0x10;

fn grpc_request(authority: &str) -> Vec<Field> {
    vec![
        field(":method", "POST", LIKE_GRPC_GO),
        field(":scheme", "http", LIKE_GRPC_GO),
        field(":path", "/pluginregistration.Registration/GetInfo", LIKE_GRPC_GO),
        field(":authority", authority, LIKE_GRPC_GO),
        field("content-type", "application/grpc", LIKE_GRPC_GO),
        field("user-agent", "grpc-go/1.72.1", LIKE_GRPC_GO),
        field("te", "trailers", LIKE_GRPC_GO),
        field("grpc-timeout", "999946u", LIKE_GRPC_GO),
    ]
}

/// One client connection's HPACK encoder.
struct Client(httlib_hpack::Encoder<'static>);

impl Client {
    fn new() -> Self {
        Self(httlib_hpack::Encoder::default())
    }

    fn block(&mut self, fields: &[Field], size_update: Option<u32>) -> Vec<u8> {
        let mut block = Vec::new();
        if let Some(size) = size_update {
            self.0.update_max_dynamic_size(size, &mut block).unwrap();
        }
        for field in fields {
            self.0.encode(field.clone(), &mut block).unwrap();
        }
        block
    }
}

/// How a header block is cut into frames.
#[derive(Debug, Clone, Default)]
struct Framing {
    /// Where CONTINUATION frames start, as offsets into the block.
    cuts: Vec<usize>,
    pad: Option<u8>,
    priority: bool,
    end_stream: bool,
}

fn frame_header(len: usize, kind: u8, flags: u8, stream: u32) -> Vec<u8> {
    let len = u32::try_from(len).unwrap().to_be_bytes();
    let mut head = len[1..].to_vec();
    head.extend([kind, flags]);
    head.extend(stream.to_be_bytes());
    head
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = frame_header(payload.len(), kind, flags, stream);
    bytes.extend_from_slice(payload);
    bytes
}

/// Where `framing` cuts a block of `len` bytes, its ends included.
fn cut_points(len: usize, framing: &Framing) -> Vec<usize> {
    let mut points: Vec<usize> = framing.cuts.iter().map(|cut| cut % (len + 1)).collect();
    points.extend([0, len]);
    points.sort_unstable();
    points.dedup();
    points
}

fn one_frame(len: usize, framing: &Framing) -> bool {
    cut_points(len, framing).len() <= 2
}

fn headers_frames(stream: u32, block: &[u8], framing: &Framing) -> Vec<u8> {
    let mut points = cut_points(block.len(), framing);
    if points.len() == 1 {
        points.push(0); // an empty block is one empty HEADERS frame
    }
    let last = points.len() - 2;
    let mut bytes = Vec::new();
    for (i, w) in points.windows(2).enumerate() {
        let fragment = &block[w[0]..w[1]];
        let end_headers = if i == last { END_HEADERS } else { 0 };
        if i > 0 {
            bytes.extend(frame(CONTINUATION, end_headers, stream, fragment));
            continue;
        }
        let mut payload = Vec::new();
        let mut flags = end_headers;
        if framing.end_stream {
            flags |= END_STREAM;
        }
        if let Some(pad) = framing.pad {
            flags |= PADDED;
            payload.push(pad);
        }
        if framing.priority {
            flags |= PRIORITY;
            payload.extend([0x80, 0, 0, 1, 15]); // exclusive, on stream 1, weight 16
        }
        payload.extend_from_slice(fragment);
        payload.extend(std::iter::repeat_n(0, framing.pad.map_or(0, usize::from)));
        bytes.extend(frame(HEADERS, flags, stream, &payload));
    }
    bytes
}

// === What h2 sees ===

#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// A header block, decoded, with the HEADERS frame's `END_STREAM` flag and
    /// priority fields.
    Headers {
        stream: u32,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
        end_stream: bool,
        priority: Option<Vec<u8>>,
    },
    /// Any other frame, exactly as it was read.
    Frame(Vec<u8>),
}

/// A header block being gathered: stream, fragments so far, `END_STREAM`,
/// priority fields.
type OpenBlock = (u32, Vec<u8>, bool, Option<Vec<u8>>);

/// Splits what the server read into frames, and decodes header blocks with
/// one HPACK context.
fn seen(bytes: &[u8]) -> Vec<Seen> {
    assert!(bytes.starts_with(PREFACE), "the preface comes first, untouched");
    let mut decoder = loona_hpack::Decoder::new();
    let mut rest = &bytes[PREFACE.len()..];
    let mut out = Vec::new();
    let mut block: Option<OpenBlock> = None;
    while !rest.is_empty() {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        let (kind, flags) = (rest[3], rest[4]);
        let stream = u32::from_be_bytes(rest[5..9].try_into().unwrap());
        let whole = &rest[..9 + len];
        let payload = &whole[9..];
        rest = &rest[9 + len..];
        let mut fragment = payload;
        match kind {
            HEADERS => {
                if flags & PADDED != 0 {
                    let pad = usize::from(fragment[0]);
                    fragment = &fragment[1..fragment.len() - pad];
                }
                let priority = (flags & PRIORITY != 0).then(|| fragment[..5].to_vec());
                fragment = &fragment[priority.as_ref().map_or(0, Vec::len)..];
                block = Some((stream, Vec::new(), flags & END_STREAM != 0, priority));
            }
            CONTINUATION => {}
            _ => {
                out.push(Seen::Frame(whole.to_vec()));
                continue;
            }
        }
        let (stream_of_block, gathered, _, _) = block.as_mut().unwrap();
        assert_eq!(*stream_of_block, stream);
        gathered.extend_from_slice(fragment);
        if flags & END_HEADERS != 0 {
            let (stream, gathered, end_stream, priority) = block.take().unwrap();
            let fields = decoder.decode(&gathered).unwrap();
            out.push(Seen::Headers { stream, fields, end_stream, priority });
        }
    }
    assert!(block.is_none(), "a header block left open");
    out
}

/// Whether h2 refuses this field as it is.
fn refused_authority((name, value, _): &Field) -> bool {
    name == b":authority" && http::uri::Authority::try_from(&value[..]).is_err()
}

fn refused(fields: &[Field]) -> bool {
    fields.iter().any(refused_authority)
}

/// What h2 should see for a block the client sent: the same fields, with an
/// `:authority` h2 refuses replaced by `localhost`.
fn expected(fields: &[Field]) -> Vec<(Vec<u8>, Vec<u8>)> {
    fields
        .iter()
        .map(|field| {
            let value =
                if refused_authority(field) { b"localhost".to_vec() } else { field.1.clone() };
            (field.0.clone(), value)
        })
        .collect()
}

fn headers(stream: u32, fields: &[Field], framing: &Framing) -> Seen {
    Seen::Headers {
        stream,
        fields: expected(fields),
        end_stream: framing.end_stream,
        priority: framing.priority.then(|| vec![0x80, 0, 0, 1, 15]),
    }
}

fn with_preface(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = PREFACE.to_vec();
    for frame in frames {
        bytes.extend_from_slice(frame);
    }
    bytes
}

// === Examples ===

#[test]
fn an_authority_h2_refuses_becomes_localhost_however_the_block_is_framed() {
    let framings = [
        ("one frame", Framing::default()),
        ("continuations", Framing { cuts: vec![1, 7, 30], ..Framing::default() }),
        ("empty continuation", Framing { cuts: vec![5, 5, 200], ..Framing::default() }),
        ("padded", Framing { pad: Some(9), end_stream: true, ..Framing::default() }),
        ("priority", Framing { priority: true, ..Framing::default() }),
        (
            "padded, priority, continued",
            Framing { cuts: vec![3], pad: Some(1), priority: true, end_stream: true },
        ),
    ];
    let authorities =
        [SOCKET_PATH, "", "localhost", "tonic", "unix:///run/x.sock", "[::1]:8080", "a b", "é"];
    for (what, framing) in &framings {
        for authority in authorities {
            let fields = grpc_request(authority);
            let block = Client::new().block(&fields, None);
            let sent = with_preface(&[
                frame(SETTINGS, 0, 0, &[]),
                headers_frames(1, &block, framing),
                frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 0]),
            ]);
            for buf_size in [1, 7, 4096] {
                let read = serve(&sent, &[], buf_size).unwrap();
                let want = vec![
                    Seen::Frame(frame(SETTINGS, 0, 0, &[])),
                    headers(1, &fields, framing),
                    Seen::Frame(frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 0])),
                ];
                let what = format!("{what}, authority {authority:?}, read {buf_size} at a time");
                assert_eq!(seen(&read), want, "{what}");
                if !refused(&fields) && one_frame(block.len(), framing) {
                    assert_eq!(read, sent, "{what}: an accepted block passes byte for byte");
                }
            }
        }
    }
}

#[test]
fn a_missing_authority_stays_missing() {
    let fields: Vec<Field> =
        grpc_request("x").into_iter().filter(|(name, ..)| name != b":authority").collect();
    let block = Client::new().block(&fields, None);
    let sent = with_preface(&[headers_frames(1, &block, &Framing::default())]);
    assert_eq!(
        seen(&serve(&sent, &[], 4096).unwrap()),
        vec![headers(1, &fields, &Framing::default())]
    );
}

#[test]
fn the_hpack_contexts_stay_in_step_over_a_connection() {
    // Later requests are mostly references into the client's dynamic table,
    // including to the path it indexed as `:authority`. The first ones pass
    // as they are and fill h2's table; the rewriting starts in the middle.
    // Large values that come back evict older entries, so both tables must
    // count alike; table size updates empty the client's table and shrink it
    // for a while.
    let mut client = Client::new();
    let mut frames = Vec::new();
    let mut want = Vec::new();
    let updates = [None, None, Some(0), Some(4096), None, Some(512), None, Some(4096)];
    for i in 0..24 {
        let stream = 2 * u32::try_from(i).unwrap() + 1;
        let mut fields = grpc_request(if i < 10 { "localhost" } else { SOCKET_PATH });
        fields.push(field("x-request", &(i % 5).to_string().repeat(900), 0x2 | 0x4 | 0x10));
        let update = updates.get(i).copied().flatten();
        frames.push(headers_frames(stream, &client.block(&fields, update), &Framing::default()));
        want.push(headers(stream, &fields, &Framing::default()));
    }
    let sent = with_preface(&frames);
    for cuts in [vec![], vec![30, 31, 90, 200, 333], (0..sent.len()).step_by(7).collect()] {
        assert_eq!(seen(&serve(&sent, &cuts, 64).unwrap()), want);
    }
}

#[test]
fn a_client_that_closes_inside_a_block_ends_the_stream_without_an_error() {
    let block = Client::new().block(&grpc_request(SOCKET_PATH), None);
    let sent = with_preface(&[headers_frames(
        1,
        &block,
        &Framing { cuts: vec![10], ..Framing::default() },
    )]);
    let cut = sent.len() - 3;
    assert_eq!(serve(&sent[..cut], &[40], 4096).unwrap(), PREFACE);
}

#[test]
fn malformed_header_blocks_close_the_connection() {
    let block = Client::new().block(&grpc_request(SOCKET_PATH), None);
    let open = |flags| frame(HEADERS, flags, 1, &block);
    let huge = vec![0; MAX_HEADER_BLOCK];
    let flood: Vec<u8> = std::iter::once(frame(HEADERS, 0, 1, &block))
        .chain(std::iter::repeat_n(frame(CONTINUATION, 0, 1, &[]), MAX_HEADER_BLOCK / 9))
        .flatten()
        .collect();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("a CONTINUATION out of place", frame(CONTINUATION, END_HEADERS, 1, &block)),
        ("a DATA frame inside a block", [open(0), frame(DATA, 0, 1, &[])].concat()),
        (
            "a CONTINUATION on another stream",
            [open(0), frame(CONTINUATION, END_HEADERS, 3, &[])].concat(),
        ),
        ("padding longer than the frame", frame(HEADERS, END_HEADERS | PADDED, 1, &[4, 0, 0])),
        ("no room for the pad length", frame(HEADERS, END_HEADERS | PADDED, 1, &[])),
        ("no room for the priority", frame(HEADERS, END_HEADERS | PRIORITY, 1, &[0, 0, 0])),
        ("a block over the bound", frame(HEADERS, END_HEADERS, 1, &huge)),
        ("a flood of empty CONTINUATION frames", flood),
        ("an index outside the tables", frame(HEADERS, END_HEADERS, 1, &[0x80 | 0x46])),
        ("index zero", frame(HEADERS, END_HEADERS, 1, &[0x80])),
        ("a truncated integer", frame(HEADERS, END_HEADERS, 1, &[0xff, 0x80])),
        (
            "an integer over 32 bits",
            frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]),
        ),
        ("a truncated string", frame(HEADERS, END_HEADERS, 1, &[0x40, 5, b'a'])),
        ("a table over the server's size", frame(HEADERS, END_HEADERS, 1, &[0x3f, 0xe2, 0x1f])),
        ("a size update after a field", frame(HEADERS, END_HEADERS, 1, &[0x82, 0x20])),
        (
            "an EOS in a Huffman string",
            frame(HEADERS, END_HEADERS, 1, &[0x41, 0x84, 0xff, 0xff, 0xff, 0xff]),
        ),
        // Eight decoded bytes per encoded byte at most: a list that decodes
        // over the bound from a small block.
        ("a decoded list over the bound", {
            let mut block = vec![0x40, 1, b'n', 0x7f, 0xa1, 0x1e]; // a 4000-byte value, indexed (62)
            block.extend([b'v'; 4000]);
            block.extend(std::iter::repeat_n(0x80 | 0x3e, 20));
            frame(HEADERS, END_HEADERS, 1, &block)
        }),
    ];
    for (what, frames) in cases {
        let sent = with_preface(&[frames]);
        for buf_size in [1, 16_384] {
            let err = serve(&sent, &[], buf_size).expect_err(what);
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}");
            assert!(err.to_string().starts_with("HTTP/2 from the client: "), "{what}: {err}");
        }
    }
}

// === Properties ===

fn authority() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(SOCKET_PATH.to_owned()),
        Just(String::new()),
        Just("localhost".to_owned()),
        Just("localhost:0".to_owned()),
        "[ -~]{0,40}",
        "\\PC{0,12}",
    ]
}

fn flags() -> impl Strategy<Value = u8> {
    // Huffman name / value, incremental indexing or never indexed, best format.
    (0_u8..4, prop_oneof![Just(0), Just(0x4), Just(0x8)], any::<bool>())
        .prop_map(|(huffman, indexing, best)| huffman | indexing | if best { 0x10 } else { 0 })
}

fn header_list() -> impl Strategy<Value = Vec<Field>> {
    let name = prop_oneof![
        Just(":method".to_owned()),
        Just(":path".to_owned()),
        Just(":authority".to_owned()),
        Just("content-type".to_owned()),
        Just("user-agent".to_owned()),
        "[a-z-]{1,12}",
    ];
    let field =
        (name, "[ -~]{0,60}", authority(), flags()).prop_map(|(name, value, authority, flags)| {
            let value = if name == ":authority" { authority } else { value };
            (name.into_bytes(), value.into_bytes(), flags)
        });
    // At least one field: loona-hpack refuses a block that is only a table size update.
    prop::collection::vec(field, 1..12)
}

fn framing() -> impl Strategy<Value = Framing> {
    (
        prop::collection::vec(any::<usize>(), 0..4),
        prop::option::of(any::<u8>()),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(cuts, pad, priority, end_stream)| Framing {
            cuts,
            pad,
            priority,
            end_stream,
        })
}

/// Any frame but HEADERS and CONTINUATION, with any flags and payload.
fn other_frame() -> impl Strategy<Value = Vec<u8>> {
    let kind = any::<u8>()
        .prop_filter("not a header block", |kind| ![HEADERS, CONTINUATION].contains(kind));
    (kind, any::<u8>(), any::<u32>(), prop::collection::vec(any::<u8>(), 0..100))
        .prop_map(|(kind, flags, stream, payload)| frame(kind, flags, stream, &payload))
}

#[derive(Debug, Clone)]
enum Sent {
    Block { fields: Vec<Field>, size_update: Option<u32>, framing: Framing },
    Other(Vec<u8>),
}

fn connection() -> impl Strategy<Value = Vec<Sent>> {
    let block = (header_list(), prop::option::of(0_u32..=4096), framing())
        .prop_map(|(fields, size_update, framing)| Sent::Block { fields, size_update, framing });
    prop::collection::vec(prop_oneof![3 => block, 1 => other_frame().prop_map(Sent::Other)], 0..10)
}

proptest! {
    #[test]
    fn any_bytes_cut_anywhere_never_panic(
        preface in any::<bool>(),
        bytes in prop::collection::vec(any::<u8>(), 0..2000),
        cuts in prop::collection::vec(any::<usize>(), 0..20),
        buf_size in 1_usize..300,
    ) {
        let sent = if preface { [PREFACE, &bytes].concat() } else { bytes };
        let _ = serve(&sent, &cuts, buf_size);
    }

    #[test]
    fn frames_outside_header_blocks_pass_byte_for_byte(
        frames in prop::collection::vec(other_frame(), 0..20),
        cuts in prop::collection::vec(any::<usize>(), 0..20),
        buf_size in 1_usize..300,
    ) {
        let sent = with_preface(&frames);
        prop_assert_eq!(serve(&sent, &cuts, buf_size).unwrap(), sent);
    }

    #[test]
    fn header_blocks_keep_their_fields_but_a_refused_authority(
        connection in connection(),
        cuts in prop::collection::vec(any::<usize>(), 0..20),
        buf_size in 1_usize..20_000,
    ) {
        let mut client = Client::new();
        let mut frames = Vec::new();
        let mut want = Vec::new();
        let mut as_sent = true;
        for (i, sent) in connection.iter().enumerate() {
            match sent {
                Sent::Block { fields, size_update, framing } => {
                    let stream = 2 * u32::try_from(i).unwrap() + 1;
                    let block = client.block(fields, *size_update);
                    as_sent &= !refused(fields) && one_frame(block.len(), framing);
                    frames.push(headers_frames(stream, &block, framing));
                    want.push(headers(stream, fields, framing));
                }
                Sent::Other(frame) => {
                    frames.push(frame.clone());
                    want.push(Seen::Frame(frame.clone()));
                }
            }
        }
        let sent = with_preface(&frames);
        let read = serve(&sent, &cuts, buf_size).unwrap();
        prop_assert_eq!(seen(&read), want);
        if as_sent {
            prop_assert_eq!(read, sent, "one-frame blocks h2 accepts pass byte for byte");
        }
    }
}
