//! A SPDY/3.1 session over any byte stream (a hyper upgraded connection, or a WebSocket tunnel
//! adapted to bytes): the server side, which accepts the peer's streams (the kubelet), or the
//! client side, which opens them ([`Session::client`], [`Session::open`]: the virtual node's
//! port-forward to a lower cluster, whose WebSocket protocol cannot half-close a connection).
//!
//! Three tasks per session: a reader that decodes frames and routes them, a writer that encodes
//! the single ordered outbound queue, and (when configured) an idle watch. Like Go's spdystream,
//! which every Kubernetes client speaks, there is no flow control: WINDOW_UPDATE is ignored and
//! backpressure comes from bounded buffers instead (see [`crate::pipe`]). When a stream's
//! consumer is slow, the reader pauses the whole connection, as spdystream does.
//!
//! Dropping a [`Session`] aborts it; [`Session::shutdown`] ends it gracefully.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use super::codec::{CodecError, CodecLimits, FrameDecoder, FrameEncoder};
use super::frame::{Frame, GoAwayStatus, Headers, RstStatus};
use crate::pipe::{self, Activity, Chunk, DataOut, InboundReader, Out, OutboundWriter, PipeState};

/// Tunables of one session. The defaults suit the kubelet: generous for real clients, bounded
/// for hostile ones.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Frame size limits.
    pub limits: CodecLimits,
    /// Streams open at once; further SYN_STREAMs are refused with RST_STREAM(REFUSED_STREAM).
    pub max_streams: usize,
    /// Bytes received but not yet consumed, across all streams, before the session stops reading.
    /// Raised to at least `limits.max_data_frame`.
    pub inbound_buffer: usize,
    /// Bytes queued for sending, across all streams, before writers wait.
    pub outbound_buffer: usize,
    /// Largest DATA frame this side sends.
    pub max_outbound_frame: usize,
    /// Control frames (PING replies, resets) queued behind a peer that does not read; past this
    /// the peer is abusive and the session ends.
    pub max_queued_control: usize,
    /// Close the session when no frame moved for this long (the kubelet's
    /// `streamingConnectionIdleTimeout`, 4 h by default).
    pub idle_timeout: Option<Duration>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            limits: CodecLimits::default(),
            max_streams: 1000,
            inbound_buffer: 16 << 20,
            outbound_buffer: 4 << 20,
            max_outbound_frame: 64 << 10,
            max_queued_control: 1024,
            idle_timeout: Some(Duration::from_secs(4 * 3600)),
        }
    }
}

/// Commands for the writer task besides stream data.
#[derive(Debug)]
pub(crate) enum Control {
    /// SYN_STREAM of a stream we open.
    Syn(u32, Headers),
    Reply(u32),
    Rst(u32, RstStatus),
    Ping(u32),
    GoAway(GoAwayStatus),
    /// Flush, shut the transport's write side, stop.
    Close,
}

type Tx = mpsc::UnboundedSender<Out<Control>>;

#[derive(Debug)]
struct Entry {
    inbound: Option<mpsc::Sender<Chunk>>,
    state: Arc<PipeState>,
    remote_closed: bool,
    local_closed: bool,
    /// For a stream we opened, until the peer's SYN_REPLY.
    reply: Option<oneshot::Sender<()>>,
}

#[derive(Debug, Default)]
struct Table {
    streams: HashMap<u32, Entry>,
    last_remote_id: u32,
    /// The id of the next stream we open (client side: odd, from 1).
    next_local_id: u32,
}

/// Which end of the connection a session is: it decides the parity of the stream ids each side
/// opens (odd for the client) and so which pings are the peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Server,
    Client,
}

impl Role {
    /// Whether `id` (a stream or ping id) is one the peer may originate.
    fn is_remote(self, id: u32) -> bool {
        match self {
            Role::Server => id % 2 == 1,
            Role::Client => id != 0 && id.is_multiple_of(2),
        }
    }
}

/// Why [`Session::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The session ended, or one side said GOAWAY.
    #[error("the SPDY connection is closed or going away")]
    Closed,
    /// The peer refused the stream with RST_STREAM.
    #[error("the peer refused the stream")]
    Refused,
    /// Too many streams open, or the stream ids are used up.
    #[error("no more streams can be opened on this SPDY connection")]
    Exhausted,
}

#[derive(Debug)]
struct Shared {
    table: Mutex<Table>,
    tx: Tx,
    out_budget: Arc<Semaphore>,
    in_budget: Arc<Semaphore>,
    queued_control: AtomicUsize,
    going_away: AtomicBool,
    /// The peer said GOAWAY: we open no more streams.
    peer_going_away: AtomicBool,
    role: Role,
    /// Refuse new streams without GOAWAY (which would make Go clients stop reading).
    refusing: AtomicBool,
    activity: Arc<Activity>,
    /// Aborts everything.
    cancel: CancellationToken,
    /// Fired when the reader stopped: peer closed, error or abort.
    reader_done: CancellationToken,
    /// Fired when the writer stopped.
    writer_done: CancellationToken,
    config: SessionConfig,
}

impl Shared {
    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic while holding this lock cannot leave the table inconsistent in a way that
        // matters more than losing the session, so recover the guard.
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn control(&self, c: Control) -> bool {
        self.queued_control.fetch_add(1, Ordering::AcqRel);
        self.tx.send(Out::Control(c)).is_ok()
    }

    fn control_backlog(&self) -> usize {
        self.queued_control.load(Ordering::Acquire)
    }

    /// Our side of `id` is finished (FIN or RST written).
    fn local_done(&self, id: u32) {
        let mut t = self.table();
        if let Some(e) = t.streams.get_mut(&id) {
            e.local_closed = true;
            if e.remote_closed {
                t.streams.remove(&id);
            }
        }
    }

    /// The peer's side of `id` is finished (FIN).
    fn remote_done(&self, id: u32) {
        let mut t = self.table();
        if let Some(e) = t.streams.get_mut(&id) {
            e.remote_closed = true;
            e.inbound = None;
            if e.local_closed {
                t.streams.remove(&id);
            }
        }
    }

    fn reset(&self, id: u32) {
        if let Some(e) = self.table().streams.remove(&id) {
            e.state.mark_reset();
        }
    }

    fn parts(&self, id: u32, rx: mpsc::Receiver<Chunk>, state: Arc<PipeState>) -> StreamParts {
        StreamParts {
            id,
            reader: InboundReader::new(rx, Arc::clone(&state)),
            writer: OutboundWriter::new(
                id,
                self.tx.clone(),
                Arc::clone(&self.out_budget),
                self.config.max_outbound_frame,
                Arc::clone(&state),
            ),
            state,
        }
    }
}

/// Why the reader stopped on its own.
#[derive(Debug)]
enum ReadEnd {
    PeerClosed,
    Aborted,
    Protocol(CodecError),
    Io(io::Error),
    Abuse(&'static str),
}

/// A SPDY/3.1 session. On the server side, peer-initiated streams arrive through
/// [`Session::accept`]; on the client side, [`Session::open`] opens streams.
#[derive(Debug)]
pub struct Session {
    incoming: mpsc::Receiver<IncomingStream>,
    shared: Arc<Shared>,
}

impl Session {
    /// Starts serving SPDY on `io`. Must be called inside a Tokio runtime.
    pub fn server<T>(io: T, config: SessionConfig) -> Result<Self, CodecError>
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        Self::start(io, config, Role::Server)
    }

    /// Starts the client side of SPDY on `io` (after an HTTP upgrade to `SPDY/3.1`). Streams the
    /// peer opens are refused: no Kubernetes streaming protocol has the server open any. Must be
    /// called inside a Tokio runtime.
    pub fn client<T>(io: T, config: SessionConfig) -> Result<Self, CodecError>
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        Self::start(io, config, Role::Client)
    }

    fn start<T>(io: T, config: SessionConfig, role: Role) -> Result<Self, CodecError>
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let encoder = FrameEncoder::new()?;
        let decoder = FrameDecoder::new(config.limits);
        let (tx, rx) = mpsc::unbounded_channel();
        let (incoming_tx, incoming) = mpsc::channel(64);
        let in_budget = config
            .inbound_buffer
            .max(config.limits.max_data_frame)
            .max(1);
        let shared = Arc::new(Shared {
            table: Mutex::new(Table {
                next_local_id: if role == Role::Client { 1 } else { 2 },
                ..Table::default()
            }),
            tx,
            out_budget: Arc::new(Semaphore::new(config.outbound_buffer.max(1))),
            in_budget: Arc::new(Semaphore::new(in_budget)),
            queued_control: AtomicUsize::new(0),
            going_away: AtomicBool::new(false),
            peer_going_away: AtomicBool::new(false),
            role,
            refusing: AtomicBool::new(role == Role::Client),
            activity: Arc::new(Activity::new()),
            cancel: CancellationToken::new(),
            reader_done: CancellationToken::new(),
            writer_done: CancellationToken::new(),
            config,
        });
        let (read_half, write_half) = tokio::io::split(io);
        tokio::spawn(write_loop(Arc::clone(&shared), write_half, encoder, rx));
        tokio::spawn(read_loop(
            Arc::clone(&shared),
            read_half,
            decoder,
            incoming_tx,
        ));
        if let Some(idle) = shared.config.idle_timeout {
            pipe::spawn_idle_watch(Arc::clone(&shared.activity), idle, shared.cancel.clone());
        }
        Ok(Self { incoming, shared })
    }

    /// The next stream the peer opened, or `None` once the peer can open no more (it closed the
    /// connection, sent GOAWAY, or the session ended).
    pub async fn accept(&mut self) -> Option<IncomingStream> {
        self.incoming.recv().await
    }

    /// Opens a stream with `headers` and waits for the peer's SYN_REPLY. Callers bound the wait
    /// (a peer may never answer); dropping the future before the reply resets the stream.
    pub async fn open(&self, headers: Headers) -> Result<SpdyStream, OpenError> {
        let shared = &self.shared;
        if shared.going_away.load(Ordering::Acquire)
            || shared.peer_going_away.load(Ordering::Acquire)
            || shared.reader_done.is_cancelled()
        {
            return Err(OpenError::Closed);
        }
        let (reply_tx, reply_rx) = oneshot::channel();
        let (tx, rx) = mpsc::channel(64);
        let state = Arc::new(PipeState::default());
        let id = {
            let mut t = shared.table();
            if t.streams.len() >= shared.config.max_streams {
                return Err(OpenError::Exhausted);
            }
            let id = t.next_local_id;
            // Stream ids are 31 bits.
            if id > 0x7fff_ffff {
                return Err(OpenError::Exhausted);
            }
            t.next_local_id = id.saturating_add(2);
            t.streams.insert(
                id,
                Entry {
                    inbound: Some(tx),
                    state: Arc::clone(&state),
                    remote_closed: false,
                    local_closed: false,
                    reply: Some(reply_tx),
                },
            );
            // Queued under the table lock: SYN_STREAMs must reach the wire in id order.
            if !shared.control(Control::Syn(id, headers.clone())) {
                t.streams.remove(&id);
                return Err(OpenError::Closed);
            }
            id
        };
        let mut pending = PendingOpen {
            shared: Arc::clone(shared),
            id,
            state: Arc::clone(&state),
            done: false,
        };
        let replied = tokio::select! {
            r = reply_rx => r.is_ok(),
            () = shared.reader_done.cancelled() => false,
        };
        pending.done = true;
        if !replied {
            let refused = state.is_reset() && !shared.reader_done.is_cancelled();
            shared.reset(id);
            return Err(if refused {
                OpenError::Refused
            } else {
                OpenError::Closed
            });
        }
        let parts = shared.parts(id, rx, state);
        Ok(stream_from_parts(shared, parts, headers))
    }

    /// Sends GOAWAY(OK): streams already open continue, new ones are refused.
    pub fn go_away(&self) {
        if !self.shared.going_away.swap(true, Ordering::AcqRel) {
            self.shared.control(Control::GoAway(GoAwayStatus::OK));
        }
    }

    /// Refuses further streams with RST_STREAM(REFUSED_STREAM), silently: unlike GOAWAY this
    /// does not end the peer's session (Go's spdystream stops reading after a GOAWAY). For
    /// protocols whose streams are all open once work starts, so extra ones cannot pile up.
    pub fn stop_accepting(&self) {
        self.shared.refusing.store(true, Ordering::Release);
    }

    /// Resolves when the peer closed the connection or the session ended.
    pub async fn closed(&self) {
        self.shared.reader_done.cancelled().await;
    }

    /// A handle that resolves like [`Session::closed`], usable after the session moved.
    pub fn closed_token(&self) -> CancellationToken {
        self.shared.reader_done.clone()
    }

    /// True once the peer closed the connection or the session ended.
    pub fn is_closed(&self) -> bool {
        self.shared.reader_done.is_cancelled()
    }

    /// Ends the session gracefully: GOAWAY, then up to `grace` for the peer to close the
    /// connection (it has everything we queued by then), then up to `grace` to flush and close
    /// our side. Everything still running is aborted afterwards.
    pub async fn shutdown(self, grace: Duration) {
        self.go_away();
        let _ = tokio::time::timeout(grace, self.shared.reader_done.cancelled()).await;
        if self.shared.control(Control::Close) {
            let _ = tokio::time::timeout(grace, self.shared.writer_done.cancelled()).await;
        }
        self.shared.cancel.cancel();
    }

    /// Aborts the session now: the transport is dropped, every stream fails.
    pub fn abort(&self) {
        self.shared.cancel.cancel();
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
    }
}

/// A stream being opened: reset if the opener gives up before the reply.
struct PendingOpen {
    shared: Arc<Shared>,
    id: u32,
    state: Arc<PipeState>,
    done: bool,
}

impl Drop for PendingOpen {
    fn drop(&mut self) {
        if !self.done {
            reset_stream(&self.shared, self.id, &self.state, RstStatus::CANCEL);
        }
    }
}

fn stream_from_parts(shared: &Arc<Shared>, parts: StreamParts, headers: Headers) -> SpdyStream {
    SpdyStream {
        id: parts.id,
        headers,
        recv: SpdyRecvStream {
            reader: parts.reader,
        },
        send: SpdySendStream {
            id: parts.id,
            writer: parts.writer,
            state: parts.state,
            shared: Arc::clone(shared),
        },
    }
}

/// A stream the peer opened and that is waiting for our SYN_REPLY.
#[derive(Debug)]
pub struct IncomingStream {
    headers: Headers,
    parts: Option<StreamParts>,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct StreamParts {
    id: u32,
    reader: InboundReader,
    writer: OutboundWriter<Control>,
    state: Arc<PipeState>,
}

impl IncomingStream {
    /// The stream id.
    pub fn id(&self) -> u32 {
        self.parts.as_ref().map_or(0, |p| p.id)
    }

    /// The headers of the SYN_STREAM.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// Replies (SYN_REPLY with no headers, like the kubelet) and hands over the stream.
    pub fn accept(mut self) -> Option<SpdyStream> {
        let parts = self.parts.take()?;
        self.shared.control(Control::Reply(parts.id));
        let headers = std::mem::take(&mut self.headers);
        Some(stream_from_parts(&self.shared, parts, headers))
    }

    /// Refuses the stream with RST_STREAM(`status`).
    pub fn reject(mut self, status: RstStatus) {
        if let Some(parts) = self.parts.take() {
            reset_stream(&self.shared, parts.id, &parts.state, status);
        }
    }
}

impl Drop for IncomingStream {
    fn drop(&mut self) {
        if let Some(parts) = self.parts.take() {
            reset_stream(
                &self.shared,
                parts.id,
                &parts.state,
                RstStatus::REFUSED_STREAM,
            );
        }
    }
}

fn reset_stream(shared: &Shared, id: u32, state: &PipeState, status: RstStatus) {
    if state.is_reset() {
        return;
    }
    state.mark_reset();
    shared.reset(id);
    shared.control(Control::Rst(id, status));
}

/// An accepted stream: read what the peer sends, write to the peer. `shutdown` (or dropping the
/// stream) half-closes with FIN; [`SpdyStream::reset`] aborts with RST_STREAM.
#[derive(Debug)]
pub struct SpdyStream {
    id: u32,
    headers: Headers,
    recv: SpdyRecvStream,
    send: SpdySendStream,
}

impl SpdyStream {
    /// The stream id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The headers the peer opened the stream with.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// Aborts both directions with RST_STREAM(CANCEL).
    pub fn reset(self) {
        self.send.reset();
    }

    /// Separates the two directions.
    pub fn into_split(self) -> (SpdyRecvStream, SpdySendStream) {
        (self.recv, self.send)
    }
}

impl AsyncRead for SpdyStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.recv).poll_read(cx, buf)
    }
}

impl AsyncWrite for SpdyStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.send).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.send).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.send).poll_shutdown(cx)
    }
}

/// The receiving direction of a [`SpdyStream`]. EOF means the peer sent FIN; an error of kind
/// `ConnectionReset` means the stream was reset or the session died.
#[derive(Debug)]
pub struct SpdyRecvStream {
    reader: InboundReader,
}

impl AsyncRead for SpdyRecvStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.reader).poll_read(cx, buf)
    }
}

/// The sending direction of a [`SpdyStream`]. Dropping it sends FIN if not done yet.
#[derive(Debug)]
pub struct SpdySendStream {
    id: u32,
    writer: OutboundWriter<Control>,
    state: Arc<PipeState>,
    shared: Arc<Shared>,
}

impl SpdySendStream {
    /// Aborts the stream with RST_STREAM(CANCEL).
    pub fn reset(self) {
        reset_stream(&self.shared, self.id, &self.state, RstStatus::CANCEL);
    }
}

impl AsyncWrite for SpdySendStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.writer).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_shutdown(cx)
    }
}

async fn read_loop<R>(
    shared: Arc<Shared>,
    io: R,
    decoder: FrameDecoder,
    incoming: mpsc::Sender<IncomingStream>,
) where
    R: AsyncRead + Unpin + Send + 'static,
{
    let mut frames = FramedRead::with_capacity(io, decoder, 16 * 1024);
    let mut incoming = Some(incoming);
    let end = loop {
        let next = tokio::select! {
            biased;
            () = shared.cancel.cancelled() => break ReadEnd::Aborted,
            next = frames.next() => next,
        };
        let frame = match next {
            None => break ReadEnd::PeerClosed,
            Some(Err(CodecError::Io(e))) => break ReadEnd::Io(e),
            Some(Err(e)) => break ReadEnd::Protocol(e),
            Some(Ok(frame)) => frame,
        };
        shared.activity.touch();
        match on_frame(&shared, frame, &mut incoming).await {
            Ok(()) => {}
            Err(end) => break end,
        }
    };
    match &end {
        ReadEnd::PeerClosed | ReadEnd::Aborted => tracing::trace!(?end, "SPDY reader stopped"),
        ReadEnd::Io(e) => tracing::debug!(error = %e, "SPDY connection failed"),
        ReadEnd::Protocol(e) => {
            tracing::debug!(error = %e, "SPDY protocol error, sending GOAWAY");
            shared.control(Control::GoAway(GoAwayStatus::PROTOCOL_ERROR));
            shared.control(Control::Close);
        }
        ReadEnd::Abuse(why) => {
            tracing::debug!(why, "SPDY peer misbehaves, sending GOAWAY");
            shared.control(Control::GoAway(GoAwayStatus::PROTOCOL_ERROR));
            shared.control(Control::Close);
        }
    }
    // Streams the peer left open will never see more data.
    let streams = std::mem::take(&mut shared.table().streams);
    for entry in streams.into_values() {
        if !entry.remote_closed {
            entry.state.mark_reset();
        }
    }
    drop(incoming);
    shared.reader_done.cancel();
    // Give the writer a moment to send the GOAWAY before the transport goes away.
    if matches!(end, ReadEnd::Protocol(_) | ReadEnd::Abuse(_)) {
        let _ = tokio::time::timeout(Duration::from_secs(5), shared.writer_done.cancelled()).await;
        shared.cancel.cancel();
    }
}

async fn on_frame(
    shared: &Arc<Shared>,
    frame: Frame,
    incoming: &mut Option<mpsc::Sender<IncomingStream>>,
) -> Result<(), ReadEnd> {
    match frame {
        Frame::SynStream {
            stream_id,
            fin,
            unidirectional,
            headers,
            ..
        } => {
            on_syn_stream(shared, stream_id, fin, unidirectional, headers, incoming).await?;
        }
        Frame::Data {
            stream_id,
            fin,
            data,
        } => {
            let inbound = shared
                .table()
                .streams
                .get(&stream_id)
                .and_then(|e| e.inbound.clone());
            // Data for unknown or finished streams is dropped, as spdystream does.
            if let Some(tx) = inbound
                && !data.is_empty()
            {
                let permit = tokio::select! {
                    () = shared.cancel.cancelled() => return Err(ReadEnd::Aborted),
                    p = pipe::acquire(&shared.in_budget, data.len()) => p,
                };
                let chunk = Chunk {
                    data,
                    _permit: permit,
                };
                tokio::select! {
                    () = shared.cancel.cancelled() => return Err(ReadEnd::Aborted),
                    // A consumer that went away just discards.
                    _ = tx.send(chunk) => {}
                }
            }
            if fin {
                shared.remote_done(stream_id);
            }
        }
        Frame::SynReply { stream_id, fin, .. } => {
            // The peer accepted a stream we opened (its headers carry nothing the Kubernetes
            // protocols use; the block was inflated to keep the context in sync).
            let reply = shared
                .table()
                .streams
                .get_mut(&stream_id)
                .and_then(|e| e.reply.take());
            if let Some(reply) = reply {
                let _ = reply.send(());
            }
            if fin {
                shared.remote_done(stream_id);
            }
        }
        Frame::Headers { stream_id, fin, .. } => {
            if fin {
                shared.remote_done(stream_id);
            }
        }
        Frame::RstStream { stream_id, .. } => shared.reset(stream_id),
        Frame::Ping { id } => {
            // The peer's pings have its parity; the other would answer a ping of ours, and we
            // send none.
            if shared.role.is_remote(id) {
                if shared.control_backlog() >= shared.config.max_queued_control {
                    return Err(ReadEnd::Abuse("control frames pile up unread"));
                }
                shared.control(Control::Ping(id));
            }
        }
        Frame::GoAway { .. } => {
            // No new streams either way; the ones open continue until the peer closes.
            *incoming = None;
            shared.peer_going_away.store(true, Ordering::Release);
        }
        Frame::Settings { .. } | Frame::WindowUpdate { .. } | Frame::Unknown { .. } => {}
    }
    Ok(())
}

async fn on_syn_stream(
    shared: &Arc<Shared>,
    id: u32,
    fin: bool,
    unidirectional: bool,
    headers: Headers,
    incoming: &mut Option<mpsc::Sender<IncomingStream>>,
) -> Result<(), ReadEnd> {
    let refuse = |status| {
        if shared.control_backlog() >= shared.config.max_queued_control {
            return Err(ReadEnd::Abuse("control frames pile up unread"));
        }
        shared.control(Control::Rst(id, status));
        Ok(())
    };
    let (rx, state) = {
        let mut t = shared.table();
        // The peer's streams have its parity and increase; anything else is refused like
        // spdystream does.
        if !shared.role.is_remote(id) || id <= t.last_remote_id {
            drop(t);
            return refuse(RstStatus::PROTOCOL_ERROR);
        }
        t.last_remote_id = id;
        if incoming.is_none()
            || shared.going_away.load(Ordering::Acquire)
            || shared.refusing.load(Ordering::Acquire)
        {
            drop(t);
            return refuse(RstStatus::REFUSED_STREAM);
        }
        if t.streams.len() >= shared.config.max_streams {
            drop(t);
            return refuse(RstStatus::REFUSED_STREAM);
        }
        let (tx, rx) = mpsc::channel(64);
        let state = Arc::new(PipeState::default());
        if unidirectional {
            // The peer will not read: our side is closed from the start.
            state.write_closed.store(true, Ordering::Release);
        }
        t.streams.insert(
            id,
            Entry {
                inbound: (!fin).then_some(tx),
                state: Arc::clone(&state),
                remote_closed: fin,
                local_closed: unidirectional,
                reply: None,
            },
        );
        (rx, state)
    };
    let stream = IncomingStream {
        headers,
        parts: Some(shared.parts(id, rx, state)),
        shared: Arc::clone(shared),
    };
    if let Some(tx) = incoming.as_ref() {
        tokio::select! {
            () = shared.cancel.cancelled() => return Err(ReadEnd::Aborted),
            sent = tx.send(stream) => {
                // Nobody accepts any more: the stream was dropped, which refused it.
                if sent.is_err() {
                    *incoming = None;
                }
            }
        }
    }
    Ok(())
}

/// Flush when this much is batched even if more is queued.
const WRITE_BATCH: usize = 256 * 1024;

async fn write_loop<W>(
    shared: Arc<Shared>,
    io: W,
    mut encoder: FrameEncoder,
    mut rx: mpsc::UnboundedReceiver<Out<Control>>,
) where
    W: AsyncWrite + Send + 'static,
{
    let mut io = std::pin::pin!(io);
    let mut buf = BytesMut::with_capacity(WRITE_BATCH + 16 * 1024);
    let result: Result<(), CodecError> = async {
        loop {
            let first = tokio::select! {
                biased;
                () = shared.cancel.cancelled() => return Ok(()),
                m = rx.recv() => m,
            };
            let Some(first) = first else { return Ok(()) };
            buf.clear();
            let mut close = encode(&shared, &mut encoder, first, &mut buf)?;
            while !close && buf.len() < WRITE_BATCH {
                match rx.try_recv() {
                    Ok(m) => close = encode(&shared, &mut encoder, m, &mut buf)?,
                    Err(_) => break,
                }
            }
            tokio::select! {
                biased;
                () = shared.cancel.cancelled() => return Ok(()),
                r = async {
                    io.write_all(&buf).await?;
                    io.flush().await
                } => r?,
            }
            shared.activity.touch();
            if close {
                let _ = tokio::time::timeout(Duration::from_secs(5), io.shutdown()).await;
                return Ok(());
            }
        }
    }
    .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "SPDY writer stopped");
        shared.cancel.cancel();
    }
    // Writers blocked on the budget fail instead of waiting forever.
    shared.out_budget.close();
    rx.close();
    shared.writer_done.cancel();
}

/// Encodes one queue item; returns true for the close command.
fn encode(
    shared: &Shared,
    encoder: &mut FrameEncoder,
    item: Out<Control>,
    buf: &mut BytesMut,
) -> Result<bool, CodecError> {
    match item {
        Out::Data(DataOut { id, data, fin, .. }) => {
            // Data queued before a reset goes out before its RST_STREAM (one queue); writers
            // refuse data after it.
            encoder.encode_frame(
                &Frame::Data {
                    stream_id: id,
                    fin,
                    data,
                },
                buf,
            )?;
            if fin {
                shared.local_done(id);
            }
        }
        Out::Control(c) => {
            shared.queued_control.fetch_sub(1, Ordering::AcqRel);
            let frame = match c {
                Control::Syn(stream_id, headers) => Frame::SynStream {
                    stream_id,
                    associated_id: 0,
                    priority: 0,
                    slot: 0,
                    fin: false,
                    unidirectional: false,
                    headers,
                },
                Control::Reply(stream_id) => Frame::SynReply {
                    stream_id,
                    fin: false,
                    headers: Headers::new(),
                },
                Control::Rst(stream_id, status) => Frame::RstStream { stream_id, status },
                Control::Ping(id) => Frame::Ping { id },
                Control::GoAway(status) => {
                    let last_good_stream_id = shared.table().last_remote_id;
                    Frame::GoAway {
                        last_good_stream_id,
                        status,
                    }
                }
                Control::Close => return Ok(true),
            };
            encoder.encode_frame(&frame, buf)?;
        }
    }
    Ok(false)
}
