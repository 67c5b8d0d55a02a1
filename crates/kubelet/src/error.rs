//! Errors of a streaming connection after it was upgraded. The client has its 101 by then, so
//! these are for logs; what the user needs to see went to the error stream.

use std::time::Duration;

use crate::spdy::CodecError;

/// Why a streaming connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The SPDY session could not start.
    #[error("SPDY session: {0}")]
    Spdy(#[from] CodecError),
    /// The client did not open the expected streams in time.
    #[error("timed out after {0:?} waiting for the client to create streams")]
    StreamCreationTimeout(Duration),
    /// The client went away before opening the expected streams.
    #[error("connection closed before the client created its streams")]
    ClosedBeforeStreams,
    /// Writing the final status failed.
    #[error("writing the exit status: {0}")]
    Status(#[source] std::io::Error),
}
