//! WebSocket transports: the Kubernetes channel protocols (`channel.k8s.io` family), where the
//! first byte of each message names a channel, and a byte-stream view of a WebSocket for the
//! SPDY-in-WebSocket port-forward tunnel.
//!
//! Channels reuse [`crate::pipe`], so reads and writes are bounded exactly like SPDY streams.
//! Public for the fuzz targets (`fuzz/`): the read limits ([`server_config`]) and what a
//! client message means ([`inbound`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::{Buf, Bytes};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Semaphore, mpsc};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Utf8Bytes;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

use crate::config::StreamingConfig;
use crate::pipe::{self, Activity, Chunk, DataOut, InboundReader, Out, OutboundWriter, PipeState};
use crate::upgrade::WsEncoding;

/// The v5 CLOSE signal: `[255, channel]` ends the client's side of one channel.
const CLOSE_CHANNEL: u8 = 255;

/// Starts a server-side WebSocket on an upgraded connection.
pub(crate) async fn accept<T>(io: T, config: &StreamingConfig) -> WebSocketStream<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    WebSocketStream::from_raw_socket(io, Role::Server, Some(server_config(config))).await
}

/// The limits the server side reads a client's frames with: a message or frame larger than
/// `websocket_max_message` ends the connection before it is buffered.
pub fn server_config(config: &StreamingConfig) -> WebSocketConfig {
    let max = Some(config.websocket_max_message);
    WebSocketConfig::default()
        .max_message_size(max)
        .max_frame_size(max)
        .read_buffer_size(64 << 10)
}

#[derive(Debug)]
pub(crate) enum WsControl {
    Message(Message),
    Close,
}

#[derive(Debug)]
struct MuxShared {
    tx: mpsc::UnboundedSender<Out<WsControl>>,
    out_budget: Arc<Semaphore>,
    max_chunk: usize,
    cancel: CancellationToken,
    reader_done: CancellationToken,
}

/// Server side of a channel protocol connection.
#[derive(Debug)]
pub(crate) struct ChannelMux {
    shared: Arc<MuxShared>,
    readers: Vec<Option<InboundReader>>,
    encoding: WsEncoding,
}

impl ChannelMux {
    /// Starts the reader and writer tasks. `readable` lists the channels the client may send
    /// on; messages for others are dropped, as Kubernetes does. `v5_close` honours `[255, ch]`.
    pub(crate) async fn start<T>(
        io: T,
        encoding: WsEncoding,
        v5_close: bool,
        readable: &[u8],
        config: &StreamingConfig,
    ) -> Self
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let ws = accept(io, config).await;
        let (sink, stream) = ws.split();
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let activity = Arc::new(Activity::new());
        let shared = Arc::new(MuxShared {
            tx,
            out_budget: Arc::new(Semaphore::new(config.session.outbound_buffer.max(1))),
            max_chunk: config.session.max_outbound_frame,
            cancel: cancel.clone(),
            reader_done: CancellationToken::new(),
        });
        let mut senders: Vec<Option<mpsc::Sender<Chunk>>> = vec![None; 256];
        let mut readers: Vec<Option<InboundReader>> = (0..256).map(|_| None).collect();
        for &ch in readable {
            let (tx, rx) = mpsc::channel(64);
            if let (Some(s), Some(r)) = (
                senders.get_mut(usize::from(ch)),
                readers.get_mut(usize::from(ch)),
            ) {
                *s = Some(tx);
                *r = Some(InboundReader::new(rx, Arc::new(PipeState::default())));
            }
        }
        let in_budget = Arc::new(Semaphore::new(
            config
                .session
                .inbound_buffer
                .max(config.websocket_max_message),
        ));
        tokio::spawn(read_loop(
            stream,
            senders,
            encoding,
            v5_close,
            in_budget,
            Arc::clone(&shared),
            Arc::clone(&activity),
        ));
        tokio::spawn(write_loop(
            sink,
            rx,
            encoding,
            Arc::clone(&shared),
            Arc::clone(&activity),
        ));
        if let Some(idle) = config.session.idle_timeout {
            pipe::spawn_idle_watch(activity, idle, cancel);
        }
        Self {
            shared,
            readers,
            encoding,
        }
    }

    /// The reading end of a channel listed as readable (once).
    pub(crate) fn take_reader(&mut self, ch: u8) -> Option<InboundReader> {
        self.readers.get_mut(usize::from(ch)).and_then(Option::take)
    }

    /// A writer for a channel. Ending it sends nothing: the channel protocols have no
    /// server-side close, the connection's close ends every channel.
    pub(crate) fn writer(&self, ch: u8) -> OutboundWriter<WsControl> {
        OutboundWriter::new(
            u32::from(ch),
            self.shared.tx.clone(),
            Arc::clone(&self.shared.out_budget),
            self.shared.max_chunk,
            Arc::new(PipeState::default()),
        )
    }

    /// Sends a message with the channel byte and no payload (the "connected" signal).
    pub(crate) fn send_empty(&self, ch: u8) {
        let msg = match self.encoding {
            WsEncoding::Binary => Message::binary(vec![ch]),
            WsEncoding::Base64 => Message::text(char::from(b'0'.wrapping_add(ch)).to_string()),
        };
        let _ = self.shared.tx.send(Out::Control(WsControl::Message(msg)));
    }

    /// Resolves when the client closed the connection or it failed.
    pub(crate) fn closed_token(&self) -> CancellationToken {
        self.shared.reader_done.clone()
    }

    /// Sends the close frame after everything queued, waits up to `grace` for the client to
    /// close (it has read everything by then), then tears the connection down.
    pub(crate) async fn finish(mut self, grace: Duration) {
        // Unread input is discarded from now on, so it cannot block the client's close.
        self.readers.clear();
        let _ = self.shared.tx.send(Out::Control(WsControl::Close));
        let _ = tokio::time::timeout(grace, self.shared.reader_done.cancelled()).await;
    }
}

impl Drop for ChannelMux {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
    }
}

/// What one message of the client means on a channel connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// Bytes for a channel (never empty); dropped when the channel is not one the client may
    /// send on.
    Data(u8, Bytes),
    /// v5's CLOSE of a channel: the client sends nothing more on it.
    Close(u8),
    /// Nothing to deliver: not a data message of this encoding, not decodable, or empty.
    Ignored,
}

/// Reads one client message of a channel protocol (`v5_close`: `[255, channel]` closes a
/// channel); a function of the message alone, so it is tested and fuzzed (`fuzz/`) apart from
/// the connection.
pub fn inbound(msg: Message, encoding: WsEncoding, v5_close: bool) -> Inbound {
    let Some((ch, data)) = decode_message(msg, encoding) else {
        return Inbound::Ignored;
    };
    if v5_close && ch == CLOSE_CHANNEL {
        return data
            .first()
            .map_or(Inbound::Ignored, |c| Inbound::Close(*c));
    }
    if data.is_empty() {
        return Inbound::Ignored;
    }
    Inbound::Data(ch, data)
}

fn decode_message(msg: Message, encoding: WsEncoding) -> Option<(u8, Bytes)> {
    match (msg, encoding) {
        (Message::Binary(mut b), WsEncoding::Binary) => {
            if b.is_empty() {
                return None;
            }
            let ch = b.get_u8();
            Some((ch, b))
        }
        (Message::Text(t), WsEncoding::Base64) => {
            let s = t.as_str();
            let ch = s.as_bytes().first()?.wrapping_sub(b'0');
            let payload = BASE64.decode(s.get(1..)?).ok()?;
            Some((ch, Bytes::from(payload)))
        }
        _ => None,
    }
}

async fn read_loop<S>(
    mut stream: S,
    mut senders: Vec<Option<mpsc::Sender<Chunk>>>,
    encoding: WsEncoding,
    v5_close: bool,
    budget: Arc<Semaphore>,
    shared: Arc<MuxShared>,
    activity: Arc<Activity>,
) where
    S: futures::Stream<Item = Result<Message, WsError>> + Unpin,
{
    loop {
        let next = tokio::select! {
            biased;
            () = shared.cancel.cancelled() => break,
            m = stream.next() => m,
        };
        let msg = match next {
            None => break,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "WebSocket read failed");
                break;
            }
            Some(Ok(Message::Close(_))) => break,
            Some(Ok(m)) => m,
        };
        activity.touch();
        let (ch, data) = match inbound(msg, encoding, v5_close) {
            Inbound::Data(ch, data) => (ch, data),
            Inbound::Close(ch) => {
                if let Some(slot) = senders.get_mut(usize::from(ch)) {
                    *slot = None;
                }
                continue;
            }
            Inbound::Ignored => continue,
        };
        let Some(tx) = senders.get(usize::from(ch)).and_then(Option::as_ref) else {
            continue;
        };
        let permit = tokio::select! {
            () = shared.cancel.cancelled() => break,
            p = pipe::acquire(&budget, data.len()) => p,
        };
        tokio::select! {
            () = shared.cancel.cancelled() => break,
            _ = tx.send(Chunk { data, _permit: permit }) => {}
        }
    }
    drop(senders);
    shared.reader_done.cancel();
}

fn encode_message(ch: u8, data: &[u8], encoding: WsEncoding) -> Message {
    match encoding {
        WsEncoding::Binary => {
            let mut v = Vec::with_capacity(data.len() + 1);
            v.push(ch);
            v.extend_from_slice(data);
            Message::binary(v)
        }
        WsEncoding::Base64 => {
            let mut s = String::with_capacity(data.len() * 4 / 3 + 5);
            s.push(char::from(b'0'.wrapping_add(ch)));
            BASE64.encode_string(data, &mut s);
            Message::text(s)
        }
    }
}

async fn write_loop<K>(
    mut sink: K,
    mut rx: mpsc::UnboundedReceiver<Out<WsControl>>,
    encoding: WsEncoding,
    shared: Arc<MuxShared>,
    activity: Arc<Activity>,
) where
    K: futures::Sink<Message, Error = WsError> + Unpin,
{
    let result: Result<(), WsError> = async {
        loop {
            let first = tokio::select! {
                biased;
                () = shared.cancel.cancelled() => return Ok(()),
                m = rx.recv() => m,
            };
            let Some(mut item) = first else { return Ok(()) };
            loop {
                let msg = match item {
                    Out::Data(DataOut { id, data, .. }) => {
                        // Empty data is a FIN, which channel protocols cannot express.
                        if data.is_empty() {
                            None
                        } else {
                            Some(encode_message(
                                u8::try_from(id).unwrap_or(u8::MAX),
                                &data,
                                encoding,
                            ))
                        }
                    }
                    Out::Control(WsControl::Message(m)) => Some(m),
                    Out::Control(WsControl::Close) => {
                        // Go clients treat anything but 1000 as an error.
                        tokio::select! {
                            () = shared.cancel.cancelled() => {}
                            r = sink.send(normal_close()) => r?,
                        }
                        return Ok(());
                    }
                };
                if let Some(msg) = msg {
                    tokio::select! {
                        () = shared.cancel.cancelled() => return Ok(()),
                        r = sink.feed(msg) => r?,
                    }
                }
                match rx.try_recv() {
                    Ok(next) => item = next,
                    Err(_) => break,
                }
            }
            tokio::select! {
                () = shared.cancel.cancelled() => return Ok(()),
                r = sink.flush() => r?,
            }
            activity.touch();
        }
    }
    .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "WebSocket write failed");
        shared.cancel.cancel();
    }
    shared.out_budget.close();
}

fn normal_close() -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: Utf8Bytes::from_static(""),
    }))
}

/// A WebSocket seen as a byte stream: binary message payloads in order, each write one binary
/// message. This is how Kubernetes tunnels SPDY through WebSockets for port-forward.
#[derive(Debug)]
pub(crate) struct WsByteStream<T> {
    ws: WebSocketStream<T>,
    pending: Bytes,
    eof: bool,
    close_sent: bool,
}

impl<T> WsByteStream<T> {
    pub(crate) fn new(ws: WebSocketStream<T>) -> Self {
        Self {
            ws,
            pending: Bytes::new(),
            eof: false,
            close_sent: false,
        }
    }
}

fn io_err(e: WsError) -> io::Error {
    match e {
        WsError::Io(e) => e,
        WsError::ConnectionClosed | WsError::AlreadyClosed => io::ErrorKind::BrokenPipe.into(),
        other => io::Error::other(other),
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsByteStream<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                buf.put_slice(self.pending.get(..n).unwrap_or_default());
                self.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            if self.eof {
                return Poll::Ready(Ok(()));
            }
            match ready!(self.ws.poll_next_unpin(cx)) {
                Some(Ok(Message::Binary(b))) => self.pending = b,
                Some(Ok(Message::Close(_))) | None => self.eof = true,
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "text message in a binary tunnel",
                    )));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Err(io_err(e))),
            }
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsByteStream<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.ws.poll_ready_unpin(cx)).map_err(io_err)?;
        self.ws
            .start_send_unpin(Message::binary(Bytes::copy_from_slice(buf)))
            .map_err(io_err)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.ws.poll_flush_unpin(cx).map_err(io_err)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.close_sent {
            ready!(self.ws.poll_ready_unpin(cx)).map_err(io_err)?;
            self.ws.start_send_unpin(normal_close()).map_err(io_err)?;
            self.close_sent = true;
        }
        self.ws.poll_close_unpin(cx).map_err(io_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_messages_roundtrip() {
        let m = encode_message(1, b"hello", WsEncoding::Base64);
        assert_eq!(m, Message::text("1aGVsbG8="));
        assert_eq!(
            decode_message(m, WsEncoding::Base64),
            Some((1, Bytes::from_static(b"hello")))
        );
        let b = encode_message(2, b"x", WsEncoding::Binary);
        assert_eq!(
            decode_message(b, WsEncoding::Binary),
            Some((2, Bytes::from_static(b"x")))
        );
        assert_eq!(
            decode_message(Message::text("0!!"), WsEncoding::Base64),
            None
        );
        assert_eq!(
            decode_message(Message::binary(Vec::new()), WsEncoding::Binary),
            None
        );
    }
}
