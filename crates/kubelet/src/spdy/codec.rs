//! SPDY/3.1 wire format: 8-byte frame headers, control frame payloads, and zlib-compressed
//! header blocks.
//!
//! Header blocks of one direction share ONE zlib stream for the whole connection (initialised
//! with the SPDY/3 dictionary, each block ended by a sync flush), so the encoder and the decoder
//! are stateful and a connection needs exactly one of each. Every limit is checked before the
//! bytes it guards are buffered or inflated, so a hostile peer cannot make us allocate more than
//! [`CodecLimits`] allows.

use std::io;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio_util::codec::{Decoder, Encoder};

use super::dictionary::DICTIONARY;
use super::frame::{
    FLAG_CLEAR_SETTINGS, FLAG_FIN, FLAG_UNIDIRECTIONAL, Frame, GoAwayStatus, Headers,
    MAX_FRAME_PAYLOAD, RstStatus, STREAM_ID_MASK, Setting, VERSION, kind,
};

/// Bounds applied while decoding frames from a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodecLimits {
    /// Largest DATA payload accepted. Go clients write one frame per `Write` call, which for
    /// `io.Copy` from an in-memory reader can be the whole buffer, so the default is the format's
    /// own limit (16 MiB - 1).
    pub max_data_frame: usize,
    /// Largest control frame payload accepted (header blocks are compressed; Kubernetes sends a
    /// few dozen bytes).
    pub max_control_frame: usize,
    /// Largest header block after decompression (stops zlib bombs), and most the decoded
    /// headers may hold, each value counted with its name and [`HEADER_OVERHEAD`].
    pub max_header_block: usize,
}

impl Default for CodecLimits {
    fn default() -> Self {
        Self {
            max_data_frame: MAX_FRAME_PAYLOAD,
            max_control_frame: 64 * 1024,
            max_header_block: 64 * 1024,
        }
    }
}

/// Why a frame could not be read or written. Every decode error is fatal for the session: the
/// header compression context is shared, so nothing after a bad frame can be trusted.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The transport failed.
    #[error("SPDY transport: {0}")]
    Io(#[from] io::Error),
    /// A control frame carried a version other than 3.
    #[error("unsupported SPDY version {0} in a control frame")]
    Version(u16),
    /// A frame is larger than the configured limit.
    #[error("{what} frame of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Frame kind.
        what: &'static str,
        /// Its declared payload length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A frame's fields are inconsistent with its type.
    #[error("malformed {what} frame: {why}")]
    Malformed {
        /// Frame kind.
        what: &'static str,
        /// What is wrong.
        why: &'static str,
    },
    /// A header block could not be inflated or parsed.
    #[error("bad header block: {0}")]
    HeaderBlock(String),
    /// A header block inflates past the configured limit.
    #[error("header block exceeds {0} bytes after decompression")]
    HeaderBlockTooLarge(usize),
    /// The local compressor failed (not caused by the peer).
    #[error("header compression failed: {0}")]
    Compress(String),
}

/// What one decoded header value costs beyond its bytes (its own copy of the name is counted
/// apart): two `String`s and their allocations, roughly. A block repeats a name once and
/// separates its values by NUL, so without this a 64 KiB block of one long name and NULs
/// decoded to a gigabyte (each value a pair with a copy of the name).
pub const HEADER_OVERHEAD: usize = 32;

const CONTROL_BIT: u32 = 0x8000_0000;
const LENGTH_MASK: u32 = 0x00ff_ffff;
/// How far ahead of the bytes received the read buffer grows for a frame still arriving.
const READ_AHEAD: usize = 64 << 10;
/// Inflate in steps of this size, so the output never outgrows the limit by more than one step.
const INFLATE_STEP: usize = 4096;

fn malformed(what: &'static str, why: &'static str) -> CodecError {
    CodecError::Malformed { what, why }
}

/// The compressing half of a connection's header context.
pub struct HeaderCompressor {
    zlib: Compress,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for HeaderCompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeaderCompressor")
            .field("total_in", &self.zlib.total_in())
            .finish()
    }
}

impl HeaderCompressor {
    /// A fresh context primed with the SPDY/3 dictionary.
    pub fn new() -> Result<Self, CodecError> {
        // Best compression like Go's spdystream; blocks are tiny, so speed does not matter.
        let mut zlib = Compress::new(Compression::best(), true);
        zlib.set_dictionary(&DICTIONARY)
            .map_err(|e| CodecError::Compress(e.to_string()))?;
        Ok(Self {
            zlib,
            scratch: Vec::new(),
        })
    }

    /// Serialises and compresses `headers`, appending the compressed block to `out`.
    pub fn compress(&mut self, headers: &Headers, out: &mut Vec<u8>) -> Result<(), CodecError> {
        let mut raw = std::mem::take(&mut self.scratch);
        raw.clear();
        encode_header_block(headers, &mut raw)?;
        let result = self.compress_raw(&raw, out);
        self.scratch = raw;
        result
    }

    /// Compresses an already serialised block as it is (the fuzz targets feed malformed ones).
    pub fn compress_raw(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        let start = self.zlib.total_in();
        loop {
            let consumed = consumed_since(self.zlib.total_in(), start);
            let rest = raw.get(consumed..).unwrap_or_default();
            out.reserve(rest.len() + 64);
            self.zlib
                .compress_vec(rest, out, FlushCompress::Sync)
                .map_err(|e| CodecError::Compress(e.to_string()))?;
            let consumed = consumed_since(self.zlib.total_in(), start);
            // Room left in the output means the sync flush completed.
            if consumed >= raw.len() && out.len() < out.capacity() {
                return Ok(());
            }
        }
    }
}

/// The inflating half of a connection's header context.
pub struct HeaderDecompressor {
    zlib: Decompress,
    max: usize,
}

impl std::fmt::Debug for HeaderDecompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeaderDecompressor")
            .field("max", &self.max)
            .finish()
    }
}

impl HeaderDecompressor {
    /// A fresh context; the dictionary is supplied when the stream asks for it.
    pub fn new(max_header_block: usize) -> Self {
        Self {
            zlib: Decompress::new(true),
            max: max_header_block,
        }
    }

    /// Inflates one compressed block (the rest of a control frame) and parses it.
    pub fn decompress(&mut self, block: &[u8]) -> Result<Headers, CodecError> {
        let raw = self.inflate(block)?;
        decode_header_block(&raw, self.max)
    }

    fn inflate(&mut self, input: &[u8]) -> Result<Vec<u8>, CodecError> {
        let mut out: Vec<u8> = Vec::new();
        let start = self.zlib.total_in();
        loop {
            if out.len() > self.max {
                return Err(CodecError::HeaderBlockTooLarge(self.max));
            }
            let consumed = consumed_since(self.zlib.total_in(), start);
            let rest = input.get(consumed..).unwrap_or_default();
            // Never offer more room than the limit needs (+1 byte to detect overflow).
            let room = (self.max + 1 - out.len()).min(INFLATE_STEP);
            out.reserve_exact(room);
            let (in_before, out_before) = (self.zlib.total_in(), out.len());
            match self
                .zlib
                .decompress_vec(rest, &mut out, FlushDecompress::Sync)
            {
                Ok(Status::StreamEnd) => {
                    // A SPDY context never ends; later blocks could not be decoded.
                    return Err(CodecError::HeaderBlock("zlib stream ended".into()));
                }
                Ok(Status::Ok | Status::BufError) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.zlib
                        .set_dictionary(&DICTIONARY)
                        .map_err(|e| CodecError::HeaderBlock(format!("dictionary: {e}")))?;
                    continue;
                }
                Err(e) => return Err(CodecError::HeaderBlock(e.to_string())),
            }
            let all_in = consumed_since(self.zlib.total_in(), start) >= input.len();
            let progressed = self.zlib.total_in() != in_before || out.len() != out_before;
            if all_in && out.len() < out.capacity() {
                break;
            }
            if !progressed {
                if all_in {
                    break;
                }
                return Err(CodecError::HeaderBlock("inflate made no progress".into()));
            }
        }
        if out.len() > self.max {
            return Err(CodecError::HeaderBlockTooLarge(self.max));
        }
        Ok(out)
    }
}

fn consumed_since(now: u64, start: u64) -> usize {
    usize::try_from(now.saturating_sub(start)).unwrap_or(usize::MAX)
}

fn len_u32(len: usize) -> Result<u32, CodecError> {
    u32::try_from(len).map_err(|_| CodecError::Compress("header field longer than 4 GiB".into()))
}

/// Uncompressed header block: u32 count, then per name u32 length, name, u32 length, values
/// joined by NUL. Repeated names are merged into one pair, in order of first appearance.
pub fn encode_header_block(headers: &Headers, out: &mut Vec<u8>) -> Result<(), CodecError> {
    let mut names: Vec<&str> = Vec::new();
    for (name, _) in headers.iter() {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    out.put_u32(len_u32(names.len())?);
    for name in names {
        out.put_u32(len_u32(name.len())?);
        out.extend(name.bytes().map(|b| b.to_ascii_lowercase()));
        let values: Vec<&str> = headers
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .collect();
        let joined = values.join("\0");
        out.put_u32(len_u32(joined.len())?);
        out.extend_from_slice(joined.as_bytes());
    }
    Ok(())
}

/// Parses an uncompressed header block (the inverse of [`encode_header_block`]); the headers
/// may hold at most `max` bytes, each value counted with its name and [`HEADER_OVERHEAD`].
pub fn decode_header_block(mut raw: &[u8], max: usize) -> Result<Headers, CodecError> {
    let bad = |why: &str| CodecError::HeaderBlock(why.to_string());
    if raw.remaining() < 4 {
        return Err(bad("truncated pair count"));
    }
    let count = raw.get_u32();
    let mut headers = Headers::new();
    let mut held = 0usize;
    for _ in 0..count {
        let name = take_field(&mut raw).ok_or_else(|| bad("truncated name"))?;
        let value = take_field(&mut raw).ok_or_else(|| bad("truncated value"))?;
        let name = std::str::from_utf8(name).map_err(|_| bad("name is not UTF-8"))?;
        let value = std::str::from_utf8(value).map_err(|_| bad("value is not UTF-8"))?;
        // Go rejects uppercase names; we are lenient and fold them.
        for v in value.split('\0') {
            held = held.saturating_add(name.len() + v.len() + HEADER_OVERHEAD);
            if held > max {
                return Err(CodecError::HeaderBlockTooLarge(max));
            }
            headers.add(name, v);
        }
    }
    if raw.has_remaining() {
        return Err(bad("trailing bytes after the last pair"));
    }
    Ok(headers)
}

fn take_field<'a>(raw: &mut &'a [u8]) -> Option<&'a [u8]> {
    if raw.remaining() < 4 {
        return None;
    }
    let len = usize::try_from(raw.get_u32()).ok()?;
    if raw.remaining() < len {
        return None;
    }
    let (field, rest) = raw.split_at(len);
    *raw = rest;
    Some(field)
}

/// Writes frames; owns the outbound header compression context.
#[derive(Debug)]
pub struct FrameEncoder {
    headers: HeaderCompressor,
    block: Vec<u8>,
}

impl FrameEncoder {
    /// A fresh encoder for one connection.
    pub fn new() -> Result<Self, CodecError> {
        Ok(Self {
            headers: HeaderCompressor::new()?,
            block: Vec::new(),
        })
    }

    /// Appends the wire form of `frame` to `dst`.
    pub fn encode_frame(&mut self, frame: &Frame, dst: &mut BytesMut) -> Result<(), CodecError> {
        match frame {
            Frame::Data {
                stream_id,
                fin,
                data,
            } => {
                if *stream_id == 0 || *stream_id > STREAM_ID_MASK {
                    return Err(malformed("DATA", "stream id out of range"));
                }
                let len = checked_len("DATA", data.len())?;
                dst.reserve(8 + data.len());
                dst.put_u32(*stream_id);
                dst.put_u32(flags_len(if *fin { FLAG_FIN } else { 0 }, len));
                dst.extend_from_slice(data);
            }
            Frame::SynStream {
                stream_id,
                associated_id,
                priority,
                slot,
                fin,
                unidirectional,
                headers,
            } => {
                let block = self.compress(headers)?;
                let mut flags = 0;
                if *fin {
                    flags |= FLAG_FIN;
                }
                if *unidirectional {
                    flags |= FLAG_UNIDIRECTIONAL;
                }
                let len = checked_len("SYN_STREAM", 10 + block.len())?;
                control_header(dst, kind::SYN_STREAM, flags, len);
                dst.put_u32(stream_id & STREAM_ID_MASK);
                dst.put_u32(associated_id & STREAM_ID_MASK);
                dst.put_u8((priority & 0x07) << 5);
                dst.put_u8(*slot);
                dst.extend_from_slice(&block);
            }
            Frame::SynReply {
                stream_id,
                fin,
                headers,
            } => {
                let block = self.compress(headers)?;
                let len = checked_len("SYN_REPLY", 4 + block.len())?;
                control_header(dst, kind::SYN_REPLY, fin_flag(*fin), len);
                dst.put_u32(stream_id & STREAM_ID_MASK);
                dst.extend_from_slice(&block);
            }
            Frame::Headers {
                stream_id,
                fin,
                headers,
            } => {
                let block = self.compress(headers)?;
                let len = checked_len("HEADERS", 4 + block.len())?;
                control_header(dst, kind::HEADERS, fin_flag(*fin), len);
                dst.put_u32(stream_id & STREAM_ID_MASK);
                dst.extend_from_slice(&block);
            }
            Frame::RstStream { stream_id, status } => {
                control_header(dst, kind::RST_STREAM, 0, 8);
                dst.put_u32(stream_id & STREAM_ID_MASK);
                dst.put_u32(status.0);
            }
            Frame::Settings { clear, entries } => {
                let len = checked_len("SETTINGS", 4 + entries.len().saturating_mul(8))?;
                let flags = if *clear { FLAG_CLEAR_SETTINGS } else { 0 };
                control_header(dst, kind::SETTINGS, flags, len);
                dst.put_u32(len_u32(entries.len())?);
                for s in entries {
                    dst.put_u32((u32::from(s.flags) << 24) | (s.id & LENGTH_MASK));
                    dst.put_u32(s.value);
                }
            }
            Frame::Ping { id } => {
                control_header(dst, kind::PING, 0, 4);
                dst.put_u32(*id);
            }
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                control_header(dst, kind::GOAWAY, 0, 8);
                dst.put_u32(last_good_stream_id & STREAM_ID_MASK);
                dst.put_u32(status.0);
            }
            Frame::WindowUpdate { stream_id, delta } => {
                control_header(dst, kind::WINDOW_UPDATE, 0, 8);
                dst.put_u32(stream_id & STREAM_ID_MASK);
                dst.put_u32(delta & STREAM_ID_MASK);
            }
            Frame::Unknown {
                kind,
                flags,
                payload,
            } => {
                let len = checked_len("control", payload.len())?;
                control_header(dst, *kind, *flags, len);
                dst.extend_from_slice(payload);
            }
        }
        Ok(())
    }

    fn compress(&mut self, headers: &Headers) -> Result<Vec<u8>, CodecError> {
        let mut block = std::mem::take(&mut self.block);
        block.clear();
        self.headers.compress(headers, &mut block)?;
        let out = block.clone();
        self.block = block;
        Ok(out)
    }
}

impl Encoder<Frame> for FrameEncoder {
    type Error = CodecError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), CodecError> {
        self.encode_frame(&frame, dst)
    }
}

fn fin_flag(fin: bool) -> u8 {
    if fin { FLAG_FIN } else { 0 }
}

fn flags_len(flags: u8, len: u32) -> u32 {
    (u32::from(flags) << 24) | (len & LENGTH_MASK)
}

fn checked_len(what: &'static str, len: usize) -> Result<u32, CodecError> {
    if len > MAX_FRAME_PAYLOAD {
        return Err(CodecError::TooLarge {
            what,
            len,
            limit: MAX_FRAME_PAYLOAD,
        });
    }
    u32::try_from(len).map_err(|_| CodecError::TooLarge {
        what,
        len,
        limit: MAX_FRAME_PAYLOAD,
    })
}

fn control_header(dst: &mut BytesMut, kind: u16, flags: u8, len: u32) {
    dst.reserve(8 + len as usize);
    dst.put_u32(CONTROL_BIT | (u32::from(VERSION) << 16) | u32::from(kind));
    dst.put_u32(flags_len(flags, len));
}

/// Reads frames; owns the inbound header compression context.
#[derive(Debug)]
pub struct FrameDecoder {
    headers: HeaderDecompressor,
    limits: CodecLimits,
}

impl FrameDecoder {
    /// A fresh decoder for one connection.
    pub fn new(limits: CodecLimits) -> Self {
        Self {
            headers: HeaderDecompressor::new(limits.max_header_block),
            limits,
        }
    }

    /// Takes one frame off the front of `src`, or returns `None` when more bytes are needed.
    pub fn decode_frame(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, CodecError> {
        let Some(mut head) = src.get(..8) else {
            return Ok(None);
        };
        let word0 = head.get_u32();
        let word1 = head.get_u32();
        let flags = (word1 >> 24) as u8;
        let len = (word1 & LENGTH_MASK) as usize;
        let control = word0 & CONTROL_BIT != 0;
        // Refuse oversized frames before buffering their payload.
        if control {
            let version = ((word0 >> 16) & 0x7fff) as u16;
            if version != VERSION {
                return Err(CodecError::Version(version));
            }
            if len > self.limits.max_control_frame {
                let limit = self.limits.max_control_frame;
                return Err(CodecError::TooLarge {
                    what: "control",
                    len,
                    limit,
                });
            }
        } else if len > self.limits.max_data_frame {
            let limit = self.limits.max_data_frame;
            return Err(CodecError::TooLarge {
                what: "DATA",
                len,
                limit,
            });
        }
        if src.len() < 8 + len {
            // Room for the frame as its bytes arrive, never more than a step ahead: a length
            // field alone must not make us hold its 16 MiB (found by the fuzz target
            // `spdy_frames`).
            src.reserve((8 + len - src.len()).min(READ_AHEAD));
            return Ok(None);
        }
        src.advance(8);
        let payload = src.split_to(len).freeze();
        let frame = if control {
            self.control(word0 as u16, flags, payload)?
        } else {
            let stream_id = word0 & STREAM_ID_MASK;
            if stream_id == 0 {
                return Err(malformed("DATA", "stream id 0"));
            }
            Frame::Data {
                stream_id,
                fin: flags & FLAG_FIN != 0,
                data: payload,
            }
        };
        Ok(Some(frame))
    }

    fn control(&mut self, ty: u16, flags: u8, mut p: Bytes) -> Result<Frame, CodecError> {
        let fin = flags & FLAG_FIN != 0;
        let frame = match ty {
            kind::SYN_STREAM => {
                if p.len() < 10 {
                    return Err(malformed("SYN_STREAM", "shorter than 10 bytes"));
                }
                let stream_id = p.get_u32() & STREAM_ID_MASK;
                let associated_id = p.get_u32() & STREAM_ID_MASK;
                let priority = p.get_u8() >> 5;
                let slot = p.get_u8();
                // Inflate even if the frame is refused later: the context must stay in sync.
                let headers = self.headers.decompress(&p)?;
                if stream_id == 0 {
                    return Err(malformed("SYN_STREAM", "stream id 0"));
                }
                Frame::SynStream {
                    stream_id,
                    associated_id,
                    priority,
                    slot,
                    fin,
                    unidirectional: flags & FLAG_UNIDIRECTIONAL != 0,
                    headers,
                }
            }
            kind::SYN_REPLY | kind::HEADERS => {
                let what = if ty == kind::SYN_REPLY {
                    "SYN_REPLY"
                } else {
                    "HEADERS"
                };
                if p.len() < 4 {
                    return Err(malformed(what, "shorter than 4 bytes"));
                }
                let stream_id = p.get_u32() & STREAM_ID_MASK;
                let headers = self.headers.decompress(&p)?;
                if stream_id == 0 {
                    return Err(malformed(what, "stream id 0"));
                }
                if ty == kind::SYN_REPLY {
                    Frame::SynReply {
                        stream_id,
                        fin,
                        headers,
                    }
                } else {
                    Frame::Headers {
                        stream_id,
                        fin,
                        headers,
                    }
                }
            }
            kind::RST_STREAM => {
                if p.len() != 8 {
                    return Err(malformed("RST_STREAM", "length is not 8"));
                }
                let stream_id = p.get_u32() & STREAM_ID_MASK;
                Frame::RstStream {
                    stream_id,
                    status: RstStatus(p.get_u32()),
                }
            }
            kind::SETTINGS => {
                if p.len() < 4 {
                    return Err(malformed("SETTINGS", "shorter than 4 bytes"));
                }
                let count = p.get_u32() as usize;
                if count.checked_mul(8) != Some(p.len()) {
                    return Err(malformed("SETTINGS", "entry count does not match length"));
                }
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    let word = p.get_u32();
                    entries.push(Setting {
                        flags: (word >> 24) as u8,
                        id: word & LENGTH_MASK,
                        value: p.get_u32(),
                    });
                }
                Frame::Settings {
                    clear: flags & FLAG_CLEAR_SETTINGS != 0,
                    entries,
                }
            }
            kind::PING => {
                if p.len() != 4 {
                    return Err(malformed("PING", "length is not 4"));
                }
                Frame::Ping { id: p.get_u32() }
            }
            kind::GOAWAY => {
                if p.len() != 8 {
                    return Err(malformed("GOAWAY", "length is not 8"));
                }
                let last_good_stream_id = p.get_u32() & STREAM_ID_MASK;
                Frame::GoAway {
                    last_good_stream_id,
                    status: GoAwayStatus(p.get_u32()),
                }
            }
            kind::WINDOW_UPDATE => {
                if p.len() != 8 {
                    return Err(malformed("WINDOW_UPDATE", "length is not 8"));
                }
                let stream_id = p.get_u32() & STREAM_ID_MASK;
                Frame::WindowUpdate {
                    stream_id,
                    delta: p.get_u32() & STREAM_ID_MASK,
                }
            }
            other => Frame::Unknown {
                kind: other,
                flags,
                payload: p,
            },
        };
        Ok(frame)
    }
}

impl Decoder for FrameDecoder {
    type Item = Frame;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, CodecError> {
        self.decode_frame(src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip(frames: &[Frame]) -> Vec<Frame> {
        let mut enc = FrameEncoder::new().unwrap();
        let mut dec = FrameDecoder::new(CodecLimits::default());
        let mut buf = BytesMut::new();
        for f in frames {
            enc.encode_frame(f, &mut buf).unwrap();
        }
        let mut out = Vec::new();
        while let Some(f) = dec.decode_frame(&mut buf).unwrap() {
            out.push(f);
        }
        assert!(buf.is_empty(), "left over bytes: {}", buf.len());
        out
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9-]{0,20}"
    }

    fn value() -> impl Strategy<Value = String> {
        // NUL separates values on the wire, so it cannot be part of one.
        "[ -~]{0,40}"
    }

    /// Headers whose names are unique, so the wire grouping preserves order.
    fn headers() -> impl Strategy<Value = Headers> {
        proptest::collection::btree_map(name(), value(), 0..12).prop_map(|m| {
            let mut h = Headers::new();
            for (n, v) in m {
                h.add(&n, v);
            }
            h
        })
    }

    fn stream_id() -> impl Strategy<Value = u32> {
        1..=STREAM_ID_MASK
    }

    fn frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (
                stream_id(),
                0..=STREAM_ID_MASK,
                0u8..8,
                any::<u8>(),
                any::<bool>(),
                any::<bool>(),
                headers()
            )
                .prop_map(
                    |(stream_id, associated_id, priority, slot, fin, unidirectional, headers)| {
                        Frame::SynStream {
                            stream_id,
                            associated_id,
                            priority,
                            slot,
                            fin,
                            unidirectional,
                            headers,
                        }
                    }
                ),
            (stream_id(), any::<bool>(), headers()).prop_map(|(stream_id, fin, headers)| {
                Frame::SynReply {
                    stream_id,
                    fin,
                    headers,
                }
            }),
            (stream_id(), any::<u32>()).prop_map(|(stream_id, s)| Frame::RstStream {
                stream_id,
                status: RstStatus(s)
            }),
            (
                any::<bool>(),
                proptest::collection::vec((any::<u8>(), 0u32..=LENGTH_MASK, any::<u32>()), 0..20)
            )
                .prop_map(|(clear, e)| Frame::Settings {
                    clear,
                    entries: e
                        .into_iter()
                        .map(|(flags, id, value)| Setting { flags, id, value })
                        .collect(),
                }),
            any::<u32>().prop_map(|id| Frame::Ping { id }),
            (0..=STREAM_ID_MASK, any::<u32>()).prop_map(|(last_good_stream_id, s)| Frame::GoAway {
                last_good_stream_id,
                status: GoAwayStatus(s),
            }),
            (stream_id(), any::<bool>(), headers()).prop_map(|(stream_id, fin, headers)| {
                Frame::Headers {
                    stream_id,
                    fin,
                    headers,
                }
            }),
            (stream_id(), 0..=STREAM_ID_MASK)
                .prop_map(|(stream_id, delta)| Frame::WindowUpdate { stream_id, delta }),
            (
                stream_id(),
                any::<bool>(),
                proptest::collection::vec(any::<u8>(), 0..2048)
            )
                .prop_map(|(stream_id, fin, d)| Frame::Data {
                    stream_id,
                    fin,
                    data: Bytes::from(d)
                }),
            (
                prop_oneof![Just(5u16), Just(10u16), 11u16..=u16::MAX >> 1],
                any::<u8>(),
                proptest::collection::vec(any::<u8>(), 0..64)
            )
                .prop_map(|(kind, flags, p)| Frame::Unknown {
                    kind,
                    flags,
                    payload: Bytes::from(p)
                }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn every_frame_roundtrips(f in frame()) {
            prop_assert_eq!(roundtrip(std::slice::from_ref(&f)), vec![f]);
        }

        /// Many header blocks share one zlib context per direction; order and content survive.
        #[test]
        fn sequences_share_one_header_context(frames in proptest::collection::vec(frame(), 1..40)) {
            prop_assert_eq!(roundtrip(&frames), frames);
        }

        /// Frames arriving in arbitrary pieces decode the same as arriving whole.
        #[test]
        fn split_delivery_decodes_identically(
            frames in proptest::collection::vec(frame(), 1..10),
            cuts in proptest::collection::vec(1usize..64, 1..200),
        ) {
            let mut enc = FrameEncoder::new().unwrap();
            let mut wire = BytesMut::new();
            for f in &frames {
                enc.encode_frame(f, &mut wire).unwrap();
            }
            let mut dec = FrameDecoder::new(CodecLimits::default());
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            let mut cut = cuts.iter().cycle();
            while !wire.is_empty() {
                let n = (*cut.next().unwrap()).min(wire.len());
                buf.extend_from_slice(&wire.split_to(n));
                while let Some(f) = dec.decode_frame(&mut buf).unwrap() {
                    out.push(f);
                }
            }
            prop_assert_eq!(out, frames);
        }

        /// Random bytes never panic the frame reader, and it never buffers past its limits.
        #[test]
        fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let limits = CodecLimits {
                max_data_frame: 1024,
                max_control_frame: 1024,
                max_header_block: 1024,
            };
            let mut dec = FrameDecoder::new(limits);
            let mut buf = BytesMut::from(&data[..]);
            loop {
                match dec.decode_frame(&mut buf) {
                    Ok(Some(_)) => continue,
                    Ok(None) => {
                        // Never more than about one frame at the limit beyond the input.
                        prop_assert!(buf.capacity() <= 2 * (8 + 1024 + data.len()));
                        break;
                    }
                    Err(_) => break,
                }
            }
        }

        /// Random bytes as a compressed header block: an error or a block, never a panic.
        #[test]
        fn random_header_blocks_never_panic(
            blocks in proptest::collection::vec(
                proptest::collection::vec(any::<u8>(), 0..512),
                1..8,
            ),
        ) {
            let mut dec = HeaderDecompressor::new(4096);
            for b in blocks {
                let _ = dec.decompress(&b);
            }
        }

        /// A valid zlib prefix followed by random bytes: errors or blocks, never a panic.
        #[test]
        fn corrupted_valid_streams_never_panic(
            h in headers(),
            flip in any::<usize>(),
            junk in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let mut comp = HeaderCompressor::new().unwrap();
            let mut block = Vec::new();
            comp.compress(&h, &mut block).unwrap();
            let at = flip % block.len();
            block[at] ^= 0x5a;
            block.extend(junk);
            let mut dec = HeaderDecompressor::new(4096);
            let _ = dec.decompress(&block);
        }
    }

    #[test]
    fn zlib_bomb_is_bounded() {
        // 1 MiB of one repeated value compresses to a few KiB; the limit must stop it.
        let mut h = Headers::new();
        h.add("x", "a".repeat(1 << 20));
        let mut comp = HeaderCompressor::new().unwrap();
        let mut block = Vec::new();
        comp.compress(&h, &mut block).unwrap();
        assert!(block.len() < 16 * 1024);
        let mut dec = HeaderDecompressor::new(64 * 1024);
        match dec.decompress(&block) {
            Err(CodecError::HeaderBlockTooLarge(_)) => {}
            other => panic!("expected a size error, got {other:?}"),
        }
    }

    /// Found by the fuzz target `spdy_header_block`: one name of 32 KiB and 32 Ki NULs as its
    /// values fit the 64 KiB block, and decoded to 32 Ki pairs, each with its own copy of the
    /// name (1 GiB).
    #[test]
    fn one_name_with_many_empty_values_is_bounded() {
        let name = "n".repeat(32 << 10);
        let mut raw = Vec::new();
        raw.put_u32(1);
        raw.put_u32(u32::try_from(name.len()).unwrap());
        raw.extend_from_slice(name.as_bytes());
        raw.put_u32(32 << 10);
        raw.resize(raw.len() + (32 << 10), 0);
        let mut comp = HeaderCompressor::new().unwrap();
        let mut block = Vec::new();
        comp.compress_raw(&raw, &mut block).unwrap();
        let mut dec = HeaderDecompressor::new(CodecLimits::default().max_header_block + 16);
        match dec.decompress(&block) {
            Err(CodecError::HeaderBlockTooLarge(_)) => {}
            other => panic!("expected a size error, got {:?}", other.map(|h| h.len())),
        }
    }

    /// Found by the fuzz target `spdy_frames`: the header of a 16 MiB DATA frame alone made
    /// the decoder reserve 16 MiB.
    #[test]
    fn a_frame_header_alone_reserves_no_more_than_a_step() {
        let mut dec = FrameDecoder::new(CodecLimits::default());
        let mut src = BytesMut::from(&[0, 0, 0, 1, 0, 0xff, 0xff, 0xf0][..]);
        assert!(dec.decode_frame(&mut src).unwrap().is_none());
        assert!(src.capacity() <= 8 + READ_AHEAD, "{}", src.capacity());
    }

    #[test]
    fn oversized_frames_are_refused_before_buffering() {
        let mut dec = FrameDecoder::new(CodecLimits {
            max_data_frame: 100,
            ..CodecLimits::default()
        });
        let mut buf = BytesMut::new();
        buf.put_u32(1);
        buf.put_u32(1000);
        assert!(matches!(
            dec.decode_frame(&mut buf),
            Err(CodecError::TooLarge { .. })
        ));
    }

    #[test]
    fn wrong_version_is_refused() {
        let mut dec = FrameDecoder::new(CodecLimits::default());
        let mut buf = BytesMut::new();
        buf.put_u32(CONTROL_BIT | (2 << 16) | u32::from(kind::PING));
        buf.put_u32(4);
        buf.put_u32(1);
        assert!(matches!(
            dec.decode_frame(&mut buf),
            Err(CodecError::Version(2))
        ));
    }

    #[test]
    fn header_block_is_lowercased_and_multivalued() {
        let mut h = Headers::new();
        h.add("StreamType", "error");
        h.add("x-multi", "a");
        h.add("x-multi", "b");
        let out = roundtrip(&[Frame::SynReply {
            stream_id: 1,
            fin: false,
            headers: h,
        }]);
        let Some(Frame::SynReply { headers, .. }) = out.first() else {
            panic!("{out:?}")
        };
        assert_eq!(headers.get("streamtype"), Some("error"));
        let multi: Vec<_> = headers
            .iter()
            .filter(|(n, _)| *n == "x-multi")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(multi, ["a", "b"]);
    }

    /// Bytes a Go spdystream client sends for `streamType: error` as its first SYN_STREAM: the
    /// zlib header names the SPDY dictionary (DICTID e3c6a7c2).
    #[test]
    fn compressed_blocks_name_the_spdy_dictionary() {
        let mut comp = HeaderCompressor::new().unwrap();
        let mut block = Vec::new();
        comp.compress(&Headers::new().with("streamtype", "error"), &mut block)
            .unwrap();
        assert_eq!(block[1] & 0x20, 0x20, "FDICT flag");
        assert_eq!(&block[2..6], &[0xe3, 0xc6, 0xa7, 0xc2]);
        assert!(block.ends_with(&[0, 0, 0xff, 0xff]), "sync flush marker");
    }
}
