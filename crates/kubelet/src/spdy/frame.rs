//! SPDY/3.1 frames in memory. The wire format lives in [`super::codec`].

use bytes::Bytes;

/// The protocol version carried in every control frame.
pub const VERSION: u16 = 3;

/// Largest payload the 24-bit length field can describe.
pub const MAX_FRAME_PAYLOAD: usize = (1 << 24) - 1;

/// Stream ids are 31 bits; the top bit of the word is reserved.
pub const STREAM_ID_MASK: u32 = 0x7fff_ffff;

/// Control frame type codes.
pub mod kind {
    /// SYN_STREAM: opens a stream.
    pub const SYN_STREAM: u16 = 1;
    /// SYN_REPLY: accepts a stream.
    pub const SYN_REPLY: u16 = 2;
    /// RST_STREAM: aborts a stream.
    pub const RST_STREAM: u16 = 3;
    /// SETTINGS.
    pub const SETTINGS: u16 = 4;
    /// PING.
    pub const PING: u16 = 6;
    /// GOAWAY: no new streams on this session.
    pub const GOAWAY: u16 = 7;
    /// HEADERS: more headers for a stream.
    pub const HEADERS: u16 = 8;
    /// WINDOW_UPDATE (flow control, ignored like Go's spdystream does).
    pub const WINDOW_UPDATE: u16 = 9;
}

/// FIN flag of data frames and of SYN_STREAM, SYN_REPLY and HEADERS.
pub const FLAG_FIN: u8 = 0x01;
/// UNIDIRECTIONAL flag of SYN_STREAM.
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;
/// CLEAR_SETTINGS flag of SETTINGS.
pub const FLAG_CLEAR_SETTINGS: u8 = 0x01;

/// RST_STREAM status codes (SPDY/3.1 section 2.4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RstStatus(pub u32);

impl RstStatus {
    /// PROTOCOL_ERROR.
    pub const PROTOCOL_ERROR: Self = Self(1);
    /// INVALID_STREAM.
    pub const INVALID_STREAM: Self = Self(2);
    /// REFUSED_STREAM.
    pub const REFUSED_STREAM: Self = Self(3);
    /// UNSUPPORTED_VERSION.
    pub const UNSUPPORTED_VERSION: Self = Self(4);
    /// CANCEL.
    pub const CANCEL: Self = Self(5);
    /// INTERNAL_ERROR.
    pub const INTERNAL_ERROR: Self = Self(6);
    /// FLOW_CONTROL_ERROR.
    pub const FLOW_CONTROL_ERROR: Self = Self(7);
    /// STREAM_IN_USE.
    pub const STREAM_IN_USE: Self = Self(8);
    /// STREAM_ALREADY_CLOSED.
    pub const STREAM_ALREADY_CLOSED: Self = Self(9);
    /// FRAME_TOO_LARGE.
    pub const FRAME_TOO_LARGE: Self = Self(11);
}

/// GOAWAY status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoAwayStatus(pub u32);

impl GoAwayStatus {
    /// OK: a normal end of session.
    pub const OK: Self = Self(0);
    /// PROTOCOL_ERROR.
    pub const PROTOCOL_ERROR: Self = Self(1);
    /// INTERNAL_ERROR.
    pub const INTERNAL_ERROR: Self = Self(2);
}

/// One SETTINGS entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The 8 flag bits.
    pub flags: u8,
    /// The 24-bit id.
    pub id: u32,
    /// The value.
    pub value: u32,
}

/// A header block: ordered name/value pairs. Names are lowercase; a name may repeat, which on
/// the wire becomes one pair whose values are separated by NUL, as SPDY/3 prescribes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    entries: Vec<(String, String)>,
}

impl Headers {
    /// An empty block.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a value; the name is lowercased because SPDY/3 forbids uppercase names.
    pub fn add(&mut self, name: &str, value: impl Into<String>) {
        self.entries.push((name.to_ascii_lowercase(), value.into()));
    }

    /// Builder form of [`Headers::add`].
    #[must_use]
    pub fn with(mut self, name: &str, value: impl Into<String>) -> Self {
        self.add(name, value);
        self
    }

    /// The first value of `name` (compared case-insensitively).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// All pairs, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Number of name/value pairs (counting repeated names separately).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A SPDY/3.1 frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Opens a stream.
    SynStream {
        /// Odd for client-initiated streams.
        stream_id: u32,
        /// The stream this one is associated with, or 0.
        associated_id: u32,
        /// 3-bit priority, 0 is highest.
        priority: u8,
        /// Credential slot (unused by Kubernetes).
        slot: u8,
        /// Sender half-closes with the opening frame.
        fin: bool,
        /// Sender will never send on this stream.
        unidirectional: bool,
        /// The request headers.
        headers: Headers,
    },
    /// Accepts a stream.
    SynReply {
        /// The stream accepted.
        stream_id: u32,
        /// Sender half-closes with the reply.
        fin: bool,
        /// Reply headers (empty for Kubernetes).
        headers: Headers,
    },
    /// Aborts a stream.
    RstStream {
        /// The stream aborted.
        stream_id: u32,
        /// Why.
        status: RstStatus,
    },
    /// Session settings (ignored: we announce nothing and need nothing).
    Settings {
        /// Clear previously persisted settings.
        clear: bool,
        /// The entries.
        entries: Vec<Setting>,
    },
    /// Liveness check; the receiver echoes pings the peer initiated.
    Ping {
        /// Odd from clients, even from servers.
        id: u32,
    },
    /// The sender accepts no new streams.
    GoAway {
        /// Highest stream id the sender processed.
        last_good_stream_id: u32,
        /// Why.
        status: GoAwayStatus,
    },
    /// More headers for an open stream.
    Headers {
        /// The stream.
        stream_id: u32,
        /// Sender half-closes.
        fin: bool,
        /// The headers.
        headers: Headers,
    },
    /// Flow control credit (ignored).
    WindowUpdate {
        /// The stream.
        stream_id: u32,
        /// 31-bit credit.
        delta: u32,
    },
    /// Stream payload.
    Data {
        /// The stream.
        stream_id: u32,
        /// Sender half-closes after this payload.
        fin: bool,
        /// The bytes.
        data: Bytes,
    },
    /// A control frame of a type this implementation does not know; SPDY says to ignore it.
    Unknown {
        /// The type code.
        kind: u16,
        /// The flags.
        flags: u8,
        /// The raw payload.
        payload: Bytes,
    },
}
