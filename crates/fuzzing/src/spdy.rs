//! SPDY/3.1 as the kubelet reads it from a client: frames, compressed header blocks, whole
//! exec/attach/port-forward sessions, and the resize stream's JSON.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tensile_kubelet::remotecommand::ResizeDecoder;
use tensile_kubelet::spdy::codec::{
    HEADER_OVERHEAD, HeaderCompressor, HeaderDecompressor, decode_header_block, encode_header_block,
};
use tensile_kubelet::spdy::{CodecError, CodecLimits, Frame, FrameDecoder, FrameEncoder, Headers};
use tensile_kubelet::{RemoteCommandVersion, StreamingConfig, TerminalSize};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::backend::{self, Echo};

/// The limits the codec targets decode with: the defaults, but header blocks of 1 KiB, so the
/// fuzzer reaches the limit with inputs of its usual size (the property holds at any scale).
fn limits() -> CodecLimits {
    CodecLimits {
        max_header_block: 1024,
        ..CodecLimits::default()
    }
}

/// What decoded headers hold, in the measure their limit is checked in.
pub fn footprint(headers: &Headers) -> usize {
    headers
        .iter()
        .map(|(n, v)| n.len() + v.len() + HEADER_OVERHEAD)
        .sum()
}

/// Headers grouped by name in order of first appearance: what the wire keeps of a block (a
/// name appears once, its values joined), so two blocks that mean the same compare equal.
fn grouped(headers: &Headers) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for (name, value) in headers.iter() {
        match out.iter_mut().find(|(n, _)| n == name) {
            Some((_, values)) => values.push(value.to_owned()),
            None => out.push((name.to_owned(), vec![value.to_owned()])),
        }
    }
    out
}

/// A frame with its headers grouped (see [`grouped`]), for comparing frames after a round
/// trip.
#[derive(Debug, PartialEq, Eq)]
struct Comparable(Frame, Option<Vec<(String, Vec<String>)>>);

fn comparable(frame: &Frame) -> Comparable {
    let headers = match frame {
        Frame::SynStream { headers, .. }
        | Frame::SynReply { headers, .. }
        | Frame::Headers { headers, .. } => Some(headers),
        _ => None,
    };
    let grouped_headers = headers.map(grouped);
    let mut bare = frame.clone();
    if let Frame::SynStream { headers, .. }
    | Frame::SynReply { headers, .. }
    | Frame::Headers { headers, .. } = &mut bare
    {
        *headers = Headers::new();
    }
    Comparable(bare, grouped_headers)
}

/// Frames decoded from `chunks` delivered one after the other, and the error that ended them.
struct Decoded {
    frames: Vec<Frame>,
    error: Option<String>,
}

fn decode<'a>(limits: CodecLimits, chunks: impl IntoIterator<Item = &'a [u8]>) -> Decoded {
    let mut decoder = FrameDecoder::new(limits);
    let mut src = BytesMut::new();
    let mut frames = Vec::new();
    let mut delivered = 0usize;
    for chunk in chunks {
        src.extend_from_slice(chunk);
        delivered += chunk.len();
        loop {
            match decoder.decode_frame(&mut src) {
                Ok(Some(frame)) => {
                    if let Frame::SynStream { headers, .. }
                    | Frame::SynReply { headers, .. }
                    | Frame::Headers { headers, .. } = &frame
                    {
                        let held = footprint(headers);
                        assert!(
                            held <= limits.max_header_block,
                            "a header block decoded to {held} bytes of headers, over its limit of {}",
                            limits.max_header_block
                        );
                    }
                    frames.push(frame);
                }
                Ok(None) => break,
                Err(e) => {
                    return Decoded {
                        frames,
                        error: Some(e.to_string()),
                    };
                }
            }
            // What the decoder holds is what the peer sent, not what a length field promised.
            assert!(
                src.capacity() <= 2 * delivered + (128 << 10),
                "the decoder holds {} bytes of buffer after {delivered} bytes were sent",
                src.capacity()
            );
        }
        assert!(
            src.capacity() <= 2 * delivered + (128 << 10),
            "the decoder holds {} bytes of buffer after {delivered} bytes were sent",
            src.capacity()
        );
    }
    Decoded {
        frames,
        error: None,
    }
}

/// The frame codec: the first byte sets how the rest (bytes as a client sends them) is split
/// into deliveries. Whatever the split, the same frames come out, the same error ends them, no
/// header block decodes past its limit and the buffer holds only what was sent; every frame
/// decoded is written again and reads back the same.
pub fn frames(data: &[u8]) {
    let Some((&split, wire)) = data.split_first() else {
        return;
    };
    let limits = limits();
    let whole = decode(limits, [wire]);
    let chunked = decode(limits, wire.chunks(usize::from(split).max(1)));
    assert_eq!(
        whole.frames, chunked.frames,
        "frames differ with the delivery"
    );
    assert_eq!(
        whole.error, chunked.error,
        "the error differs with the delivery"
    );
    let mut encoder = match FrameEncoder::new() {
        Ok(e) => e,
        Err(e) => panic_codec(&e),
    };
    let mut rewritten = BytesMut::new();
    for frame in &whole.frames {
        if let Err(e) = encoder.encode_frame(frame, &mut rewritten) {
            panic_codec(&e);
        }
    }
    let again = decode(limits, [&rewritten[..]]);
    assert_eq!(
        again.error, None,
        "a frame written again does not read back"
    );
    assert_eq!(
        whole.frames.iter().map(comparable).collect::<Vec<_>>(),
        again.frames.iter().map(comparable).collect::<Vec<_>>(),
        "frames written again read back different"
    );
}

#[allow(
    clippy::panic,
    reason = "a fuzz target reports a failed property by panicking"
)]
fn panic_codec(e: &CodecError) -> ! {
    panic!("encoding a decoded frame failed: {e}")
}

/// A header block before compression (what the zlib stream inflates to): it decodes within the
/// limit or not at all, reads back the same once written again, and reads the same through the
/// session's zlib context as it does raw.
pub fn header_block(data: &[u8]) {
    let limit = limits().max_header_block;
    let raw = decode_header_block(data, limit);
    // A block within the limit (larger ones are refused as they are inflated, below).
    if let (Ok(headers), true) = (&raw, data.len() <= limit) {
        let held = footprint(headers);
        assert!(
            held <= limit,
            "a header block of {} bytes decoded to {held} bytes of headers, over the limit of {limit}",
            data.len()
        );
        let mut again = Vec::new();
        assert!(
            encode_header_block(headers, &mut again).is_ok(),
            "decoded headers cannot be written again"
        );
        let back = decode_header_block(&again, limit).map(|h| grouped(&h)).ok();
        assert_eq!(
            back,
            Some(grouped(headers)),
            "headers written again read back different"
        );
    }
    // The same block compressed as a client's zlib context would.
    let (Ok(mut compressor), mut decompressor) =
        (HeaderCompressor::new(), HeaderDecompressor::new(limit))
    else {
        return;
    };
    let mut compressed = Vec::new();
    if compressor.compress_raw(data, &mut compressed).is_err() {
        return;
    }
    let inflated = decompressor.decompress(&compressed);
    match (&raw, &inflated) {
        (_, Err(CodecError::HeaderBlockTooLarge(_))) => {
            assert!(
                data.len() > limit || matches!(raw, Err(CodecError::HeaderBlockTooLarge(_))),
                "a block within the limit was refused as too large"
            );
        }
        (Ok(a), Ok(b)) => assert_eq!(grouped(a), grouped(b), "zlib changed the headers"),
        (Err(_), Err(_)) => {}
        (a, b) => panic_mismatch(a, b),
    }
}

#[allow(
    clippy::panic,
    reason = "a fuzz target reports a failed property by panicking"
)]
fn panic_mismatch(a: &Result<Headers, CodecError>, b: &Result<Headers, CodecError>) -> ! {
    panic!("raw and inflated blocks disagree: {a:?} vs {b:?}")
}

/// The longest a session may run after its client has sent everything and closed its side:
/// the stream creation timeout, the close grace, and room for the backend.
const SETTLED: Duration = Duration::from_secs(120);

/// Serves `wire` as the bytes of one client connection with `serve`, reading (and dropping)
/// everything the server writes; asserts the server is done within [`SETTLED`] of virtual
/// time once the client closed its side.
pub(crate) fn serve_connection<F, Fut>(wire: &[u8], serve: F)
where
    F: FnOnce(tokio::io::DuplexStream) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let wire = wire.to_vec();
    crate::runtime().block_on(async move {
        let (client, server) = tokio::io::duplex(64 << 10);
        let (from_server, to_server) = tokio::io::split(client);
        let writer = tokio::spawn(send_all(to_server, wire));
        let reader = tokio::spawn(drain(from_server));
        let started = tokio::time::Instant::now();
        serve(server).await;
        let took = started.elapsed();
        writer.abort();
        reader.abort();
        assert!(
            took <= SETTLED,
            "the server held the connection {took:?} after the client had sent everything"
        );
    });
}

async fn send_all(mut to: impl AsyncWrite + Unpin, wire: Vec<u8>) {
    let _ = to.write_all(&wire).await;
    let _ = to.shutdown().await;
}

async fn drain(mut from: impl AsyncRead + Unpin) {
    let _ = tokio::io::copy(&mut from, &mut tokio::io::sink()).await;
}

fn version(selector: u8) -> RemoteCommandVersion {
    match selector % 5 {
        0 => RemoteCommandVersion::V1,
        1 => RemoteCommandVersion::V2,
        2 => RemoteCommandVersion::V3,
        3 => RemoteCommandVersion::V4,
        _ => RemoteCommandVersion::V5,
    }
}

/// A whole SPDY connection after the upgrade: the first byte picks exec, attach or port-forward
/// and the protocol version, the second the streams asked for; the rest is what the client
/// sends. The kubelet's own serve functions run it with a backend that echoes.
pub fn streams(data: &[u8]) {
    let [kind, bits, wire @ ..] = data else {
        return;
    };
    let config = StreamingConfig::default();
    let options = backend::options(*bits);
    let version = version(*kind >> 2);
    match kind % 3 {
        0 => serve_connection(wire, |io| async move {
            let _ = tensile_kubelet::serve_exec_spdy(
                io,
                version,
                backend::exec_request(options),
                Arc::new(Echo),
                &config,
            )
            .await;
        }),
        1 => serve_connection(wire, |io| async move {
            let _ = tensile_kubelet::serve_attach_spdy(
                io,
                version,
                backend::attach_request(options),
                Arc::new(Echo),
                &config,
            )
            .await;
        }),
        _ => serve_connection(wire, |io| async move {
            let _ = tensile_kubelet::serve_portforward_spdy(
                io,
                backend::pod(),
                Arc::new(Echo),
                &config,
            )
            .await;
        }),
    }
}

/// The resize stream (concatenated JSON terminal sizes): the first byte sets the size of the
/// reads the rest arrives in. Whatever the reads, the sizes decoded are the start of those of
/// the whole stream read at once (a message held past the limit stops the stream earlier).
pub fn resize(data: &[u8]) {
    let Some((&split, stream)) = data.split_first() else {
        return;
    };
    let read = |chunks: &mut dyn Iterator<Item = &[u8]>| -> Vec<TerminalSize> {
        let mut decoder = ResizeDecoder::default();
        let mut all = Vec::new();
        for chunk in chunks {
            let (sizes, more) = decoder.push(chunk);
            all.extend(sizes);
            if !more {
                break;
            }
        }
        all
    };
    let whole = read(&mut std::iter::once(stream));
    let chunked = read(&mut stream.chunks(usize::from(split).max(1)));
    assert!(
        whole.starts_with(&chunked),
        "reads of {split} bytes decoded {chunked:?}, the whole stream {whole:?}"
    );
}
