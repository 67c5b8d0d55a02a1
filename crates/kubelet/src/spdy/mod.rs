//! SPDY/3.1 as the Kubernetes streaming protocols use it: the server side, and a client side
//! that opens streams.
//!
//! No Rust crate serves SPDY: the only SPDY/3.1 crate (`spdy-mux`) is a GPL-licensed client
//! that refuses peer-initiated streams, and kubelets must accept exactly those. So this module
//! implements what Go's moby/spdystream does for a kubelet, written from the SPDY/3 draft:
//! the frame codec ([`codec`]), header blocks compressed with zlib against the SPDY dictionary
//! with one context per direction, and a Tokio session ([`Session`]) that accepts client
//! streams (or, as a client, opens streams), replies, half-closes, resets, answers pings and
//! says GOAWAY, with limits against hostile peers. There is no flow control (WINDOW_UPDATE is ignored), like spdystream.

pub mod codec;
mod dictionary;
pub mod frame;
mod session;

pub use codec::{CodecError, CodecLimits, FrameDecoder, FrameEncoder};
pub use frame::{Frame, GoAwayStatus, Headers, RstStatus};
pub use session::{
    IncomingStream, OpenError, Session, SessionConfig, SpdyRecvStream, SpdySendStream, SpdyStream,
};
