//! The kubelet side of exec and attach: the remote command protocols `channel.k8s.io` to
//! `v5.channel.k8s.io`, over SPDY streams or WebSocket channels.
//!
//! Over SPDY the client opens one stream per standard stream plus `error` (and `resize` with a
//! terminal on v3+), each named by its `streamtype` header; over WebSockets channel numbers take
//! that role (0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize). Either way the command's end is
//! reported on the error stream: a JSON `metav1.Status` on v4/v5, a plain message on failure
//! before that.

use std::sync::Arc;

use futures::future::Either;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::backend::{
    AttachRequest, BoxReader, BoxWriter, ExecIo, ExecRequest, ExitStatus, StreamBackend,
    StreamOptions, TerminalSize,
};
use crate::config::StreamingConfig;
use crate::error::StreamError;
use crate::spdy::{RstStatus, Session, SpdyStream};
use crate::upgrade::{RemoteCommandUpgrade, RemoteCommandVersion, Transport, WsEncoding};
use crate::websocket::ChannelMux;

/// WebSocket channel numbers.
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;

/// A buffered resize message larger than this is garbage; resizes stop being read.
const MAX_RESIZE_MESSAGE: usize = 4096;

#[derive(Debug)]
enum Command {
    Exec(ExecRequest),
    Attach(AttachRequest),
}

impl Command {
    fn options(&self) -> StreamOptions {
        match self {
            Self::Exec(r) => r.options,
            Self::Attach(r) => r.options,
        }
    }
}

/// Serves an exec on an upgraded connection, as negotiated by `upgrade`.
pub async fn serve_exec<B, T>(
    upgrade: &RemoteCommandUpgrade,
    io: T,
    request: ExecRequest,
    backend: Arc<B>,
    config: &StreamingConfig,
) -> Result<(), StreamError>
where
    B: StreamBackend,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve(upgrade, io, Command::Exec(request), backend, config).await
}

/// Serves an attach on an upgraded connection, as negotiated by `upgrade`.
pub async fn serve_attach<B, T>(
    upgrade: &RemoteCommandUpgrade,
    io: T,
    request: AttachRequest,
    backend: Arc<B>,
    config: &StreamingConfig,
) -> Result<(), StreamError>
where
    B: StreamBackend,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve(upgrade, io, Command::Attach(request), backend, config).await
}

async fn serve<B, T>(
    upgrade: &RemoteCommandUpgrade,
    io: T,
    command: Command,
    backend: Arc<B>,
    config: &StreamingConfig,
) -> Result<(), StreamError>
where
    B: StreamBackend,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match upgrade.transport() {
        Transport::Spdy => serve_spdy(io, upgrade.version(), command, &*backend, config).await,
        Transport::WebSocket => {
            serve_ws(
                io,
                upgrade.version(),
                upgrade.encoding(),
                command,
                &*backend,
                config,
            )
            .await
        }
    }
}

/// Serves an exec over SPDY with the negotiated protocol `version`.
pub async fn serve_exec_spdy<B, T>(
    io: T,
    version: RemoteCommandVersion,
    request: ExecRequest,
    backend: Arc<B>,
    config: &StreamingConfig,
) -> Result<(), StreamError>
where
    B: StreamBackend,
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    serve_spdy(io, version, Command::Exec(request), &*backend, config).await
}

/// Serves an attach over SPDY with the negotiated protocol `version`.
pub async fn serve_attach_spdy<B, T>(
    io: T,
    version: RemoteCommandVersion,
    request: AttachRequest,
    backend: Arc<B>,
    config: &StreamingConfig,
) -> Result<(), StreamError>
where
    B: StreamBackend,
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    serve_spdy(io, version, Command::Attach(request), &*backend, config).await
}

/// Serves an exec over WebSocket channels with the negotiated `version` and `encoding`.
pub async fn serve_exec_websocket<B, T>(
    io: T,
    version: RemoteCommandVersion,
    encoding: WsEncoding,
    request: ExecRequest,
    backend: Arc<B>,
    config: &StreamingConfig,
) -> Result<(), StreamError>
where
    B: StreamBackend,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_ws(
        io,
        version,
        encoding,
        Command::Exec(request),
        &*backend,
        config,
    )
    .await
}

/// Serves an attach over WebSocket channels with the negotiated `version` and `encoding`.
pub async fn serve_attach_websocket<B, T>(
    io: T,
    version: RemoteCommandVersion,
    encoding: WsEncoding,
    request: AttachRequest,
    backend: Arc<B>,
    config: &StreamingConfig,
) -> Result<(), StreamError>
where
    B: StreamBackend,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_ws(
        io,
        version,
        encoding,
        Command::Attach(request),
        &*backend,
        config,
    )
    .await
}

/// The streams of one command, whatever carries them.
struct Streams {
    stdin: Option<BoxReader>,
    stdout: Option<BoxWriter>,
    stderr: Option<BoxWriter>,
    resize: Option<BoxReader>,
    error: BoxWriter,
}

#[derive(Default)]
struct SpdyStreams {
    error: Option<SpdyStream>,
    stdin: Option<SpdyStream>,
    stdout: Option<SpdyStream>,
    stderr: Option<SpdyStream>,
    resize: Option<SpdyStream>,
}

async fn serve_spdy<B, T>(
    io: T,
    version: RemoteCommandVersion,
    command: Command,
    backend: &B,
    config: &StreamingConfig,
) -> Result<(), StreamError>
where
    B: StreamBackend,
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut session = Session::server(io, config.session.clone())?;
    let options = command.options();
    let wait = wait_for_streams(&mut session, version, options);
    let streams = match tokio::time::timeout(config.stream_creation_timeout, wait).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(StreamError::StreamCreationTimeout(
                config.stream_creation_timeout,
            ));
        }
    };
    session.stop_accepting();
    let Some(error) = streams.error else {
        return Err(StreamError::ClosedBeforeStreams);
    };
    // The client never sends on the error stream; only our half matters.
    let (_, error) = error.into_split();
    // Our halves of stdin and resize stay open until the end: kubectl takes a FIN there as
    // "the command is gone" and closes its stdin early.
    let mut hold = Vec::new();
    let mut reader = |s: SpdyStream| {
        let (r, w) = s.into_split();
        hold.push(w);
        Box::new(r) as BoxReader
    };
    let stdin = streams.stdin.map(&mut reader);
    let resize = streams.resize.map(&mut reader);
    let writer = |s: SpdyStream| Box::new(s.into_split().1) as BoxWriter;
    let streams = Streams {
        stdin,
        stdout: streams.stdout.map(writer),
        stderr: streams.stderr.map(writer),
        resize,
        error: Box::new(error),
    };
    let result = run(backend, command, streams, version, session.closed_token()).await;
    drop(hold);
    session.shutdown(config.close_grace).await;
    result
}

/// Accepts streams until every expected one is there. Unexpected or duplicate stream types
/// are refused so they cannot stand in for a missing one.
async fn wait_for_streams(
    session: &mut Session,
    version: RemoteCommandVersion,
    options: StreamOptions,
) -> Result<SpdyStreams, StreamError> {
    let mut got = SpdyStreams::default();
    let resize = options.tty && version.resize();
    loop {
        let complete = got.error.is_some()
            && got.stdin.is_some() == options.stdin
            && got.stdout.is_some() == options.stdout
            && got.stderr.is_some() == options.stderr
            && got.resize.is_some() == resize;
        if complete {
            return Ok(got);
        }
        let Some(incoming) = session.accept().await else {
            return Err(StreamError::ClosedBeforeStreams);
        };
        let kind = incoming
            .headers()
            .get("streamtype")
            .unwrap_or_default()
            .to_string();
        let slot = match kind.as_str() {
            "error" => &mut got.error,
            "stdin" if options.stdin => &mut got.stdin,
            "stdout" if options.stdout => &mut got.stdout,
            "stderr" if options.stderr => &mut got.stderr,
            "resize" if resize => &mut got.resize,
            _ => {
                tracing::debug!(stream_type = %kind, "refusing unexpected stream");
                incoming.reject(RstStatus::PROTOCOL_ERROR);
                continue;
            }
        };
        if slot.is_some() {
            tracing::debug!(stream_type = %kind, "refusing duplicate stream");
            incoming.reject(RstStatus::PROTOCOL_ERROR);
            continue;
        }
        *slot = incoming.accept();
    }
}

async fn serve_ws<B, T>(
    io: T,
    version: RemoteCommandVersion,
    encoding: WsEncoding,
    command: Command,
    backend: &B,
    config: &StreamingConfig,
) -> Result<(), StreamError>
where
    B: StreamBackend,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let options = command.options();
    // Unlike SPDY, every WebSocket version has the resize channel (Kubernetes opens it always).
    let resize = options.tty;
    let mut readable = Vec::new();
    if options.stdin {
        readable.push(STDIN);
    }
    if resize {
        readable.push(RESIZE);
    }
    let mut mux = ChannelMux::start(
        io,
        encoding,
        version == RemoteCommandVersion::V5,
        &readable,
        config,
    )
    .await;
    // Tells the client the streams are ready, on the lowest channel it reads.
    mux.send_empty(if options.stdout {
        STDOUT
    } else if options.stderr {
        STDERR
    } else {
        ERROR
    });
    let streams = Streams {
        stdin: mux.take_reader(STDIN).map(|r| Box::new(r) as BoxReader),
        stdout: options
            .stdout
            .then(|| Box::new(mux.writer(STDOUT)) as BoxWriter),
        stderr: options
            .stderr
            .then(|| Box::new(mux.writer(STDERR)) as BoxWriter),
        resize: mux.take_reader(RESIZE).map(|r| Box::new(r) as BoxReader),
        error: Box::new(mux.writer(ERROR)),
    };
    let result = run(backend, command, streams, version, mux.closed_token()).await;
    mux.finish(config.close_grace).await;
    result
}

/// Runs the command and reports how it ended. If the client goes away first the command is
/// dropped (the backend stops it) and nothing is reported.
async fn run<B: StreamBackend>(
    backend: &B,
    command: Command,
    streams: Streams,
    version: RemoteCommandVersion,
    client_gone: CancellationToken,
) -> Result<(), StreamError> {
    let Streams {
        stdin,
        stdout,
        stderr,
        resize,
        mut error,
    } = streams;
    let tty = command.options().tty;
    let resize = resize.map(|r| {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(decode_resizes(r, tx));
        rx
    });
    let io = ExecIo {
        stdin,
        stdout,
        stderr,
        tty,
        resize,
    };
    let running = match command {
        Command::Exec(r) => Either::Left(backend.exec(r, io)),
        Command::Attach(r) => Either::Right(backend.attach(r, io)),
    };
    let status = tokio::select! {
        status = running => status,
        () = client_gone.cancelled() => {
            tracing::debug!("client left before the command ended");
            return Ok(());
        }
    };
    write_status(&mut error, &status, version)
        .await
        .map_err(StreamError::Status)?;
    Ok(())
}

async fn write_status(
    error: &mut BoxWriter,
    status: &ExitStatus,
    version: RemoteCommandVersion,
) -> std::io::Result<()> {
    if version.json_status() {
        let json = serde_json::to_vec(&status.to_status()).map_err(std::io::Error::other)?;
        error.write_all(&json).await?;
    } else if let Some(text) = status.to_text() {
        error.write_all(text.as_bytes()).await?;
    }
    error.shutdown().await
}

/// Reads a stream of concatenated JSON `TerminalSize` objects (Go's `json.Decoder` writes them
/// back to back) and forwards each one. Stops at EOF, at garbage, or when nobody listens.
async fn decode_resizes(mut reader: BoxReader, tx: mpsc::Sender<TerminalSize>) {
    let mut decoder = ResizeDecoder::default();
    let mut buf = [0u8; 512];
    loop {
        let n = tokio::select! {
            () = tx.closed() => return,
            n = reader.read(&mut buf) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
        };
        let (sizes, more) = decoder.push(buf.get(..n).unwrap_or_default());
        for size in sizes {
            if tx.send(size).await.is_err() {
                return;
            }
        }
        if !more {
            return;
        }
    }
}

/// The resize channel's parser, fed each read as it arrives: a function of the bytes alone, so
/// it is tested and fuzzed (`fuzz/`) without a stream. It holds at most [`MAX_RESIZE_MESSAGE`]
/// bytes of an unfinished message.
///
/// Each byte is scanned once: the decoder keeps where a message stands (nesting, inside a
/// string, after a backslash) across reads and decodes a message only once its closing brace
/// came. Decoding what was held at every read instead cost O(n^2) in the bytes of a message
/// that arrives a byte at a time (AFL++ found 15 KB that took 0.2 s).
#[derive(Debug, Default)]
pub struct ResizeDecoder {
    /// The unfinished message, from its opening brace.
    pending: Vec<u8>,
    /// Braces open in `pending` (0: between messages).
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// Messages handed to the JSON decoder (what the tests count).
    decoded: usize,
}

impl ResizeDecoder {
    /// The sizes `bytes` complete, and whether to keep reading (`false` after garbage or an
    /// oversized message: further resizes are ignored).
    pub fn push(&mut self, bytes: &[u8]) -> (Vec<TerminalSize>, bool) {
        let mut sizes = Vec::new();
        for &b in bytes {
            if self.depth == 0 {
                // Between messages: whitespace, or the brace that opens the next one. Anything
                // else is not a terminal size (Go's json.Decoder would fail on it too).
                match b {
                    b' ' | b'\t' | b'\n' | b'\r' => continue,
                    b'{' => {
                        self.pending.clear();
                        self.depth = 1;
                        self.pending.push(b);
                        continue;
                    }
                    _ => {
                        tracing::debug!("bad resize message, ignoring further resizes");
                        return (sizes, false);
                    }
                }
            }
            self.pending.push(b);
            if self.pending.len() > MAX_RESIZE_MESSAGE {
                tracing::debug!("oversized resize message, ignoring further resizes");
                return (sizes, false);
            }
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => self.depth -= 1,
                _ => {}
            }
            if self.depth == 0 {
                self.decoded += 1;
                match serde_json::from_slice::<TerminalSize>(&self.pending) {
                    Ok(size) => sizes.push(size),
                    Err(e) => {
                        tracing::debug!(error = %e, "bad resize message, ignoring further resizes");
                        return (sizes, false);
                    }
                }
            }
        }
        (sizes, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resizes_are_decoded_across_reads() {
        let (mut w, r) = tokio::io::duplex(64);
        let (tx, mut rx) = mpsc::channel(4);
        let task = tokio::spawn(decode_resizes(Box::new(r), tx));
        w.write_all(br#"{"Width":80,"Hei"#).await.unwrap();
        w.write_all(br#"ght":24}{"Width":100,"Height":50}"#)
            .await
            .unwrap();
        assert_eq!(
            rx.recv().await,
            Some(TerminalSize {
                width: 80,
                height: 24
            })
        );
        assert_eq!(
            rx.recv().await,
            Some(TerminalSize {
                width: 100,
                height: 50
            })
        );
        w.write_all(b"\n{\"Width\":1,\"Height\":2}\n")
            .await
            .unwrap();
        assert_eq!(
            rx.recv().await,
            Some(TerminalSize {
                width: 1,
                height: 2
            })
        );
        drop(w);
        assert_eq!(rx.recv().await, None);
        task.await.unwrap();
    }

    /// A message that arrives a byte at a time is scanned once and decoded once, whatever its
    /// length (strings with escapes and braces inside included), and gives what it gives read
    /// whole; an array, which Go's decoder refuses for a struct, stops the stream.
    #[test]
    fn a_message_read_a_byte_at_a_time_is_decoded_once() {
        let padding = format!(r#""x\\\"}}{{":"{}","#, "\\\\".repeat(1_500));
        let message = format!(r#" {{{padding}"Width":80,"Height":24}}{{"Width":1,"Height":2}}"#);
        assert!(message.len() > 3_000);
        let mut decoder = ResizeDecoder::default();
        let mut sizes = Vec::new();
        for b in message.as_bytes() {
            let (got, more) = decoder.push(std::slice::from_ref(b));
            assert!(more);
            sizes.extend(got);
        }
        let expected = [
            TerminalSize {
                width: 80,
                height: 24,
            },
            TerminalSize {
                width: 1,
                height: 2,
            },
        ];
        assert_eq!(sizes, expected);
        assert_eq!(decoder.decoded, 2);
        assert_eq!(
            ResizeDecoder::default().push(message.as_bytes()).0,
            expected
        );
        assert_eq!(
            ResizeDecoder::default().push(b"[80,24]"),
            (Vec::new(), false)
        );
    }

    #[tokio::test]
    async fn garbage_resizes_stop_quietly() {
        let (mut w, r) = tokio::io::duplex(64);
        let (tx, mut rx) = mpsc::channel(4);
        let task = tokio::spawn(decode_resizes(Box::new(r), tx));
        w.write_all(b"not json").await.unwrap();
        assert_eq!(rx.recv().await, None);
        task.await.unwrap();
    }
}
