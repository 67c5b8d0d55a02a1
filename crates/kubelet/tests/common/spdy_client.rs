//! A small SPDY/3.1 client for tests, built on the crate's codec but not on its session, so the
//! server is exercised by independent code. One reader task routes frames to per-stream event
//! queues; writes go through a mutex.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tensile_kubelet::spdy::{
    CodecLimits, Frame, FrameDecoder, FrameEncoder, GoAwayStatus, Headers, RstStatus,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, WriteHalf};
use tokio::sync::{Mutex, mpsc, watch};
use tokio_util::codec::FramedRead;

/// What happened on a stream, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Reply,
    Data(Bytes),
    Fin,
    Reset(RstStatus),
}

/// Connection-level observations.
#[derive(Debug, Default, Clone)]
pub struct ConnState {
    pub pings: Vec<u32>,
    pub goaway: Option<(u32, GoAwayStatus)>,
    pub closed: bool,
}

type Writer = Box<dyn AsyncWrite + Send + Unpin>;

struct Inner {
    writer: Mutex<(Writer, FrameEncoder, BytesMut)>,
    streams: std::sync::Mutex<HashMap<u32, mpsc::UnboundedSender<Event>>>,
    next_id: AtomicU32,
    state: watch::Sender<ConnState>,
}

#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    pub fn new<T>(io: T) -> Self
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (r, w) = tokio::io::split(io);
        let w: WriteHalf<T> = w;
        let inner = Arc::new(Inner {
            writer: Mutex::new((Box::new(w), FrameEncoder::new().unwrap(), BytesMut::new())),
            streams: std::sync::Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(1),
            state: watch::channel(ConnState::default()).0,
        });
        let reader = Arc::clone(&inner);
        tokio::spawn(async move {
            let mut frames = FramedRead::new(r, FrameDecoder::new(CodecLimits::default()));
            while let Some(Ok(frame)) = frames.next().await {
                reader.dispatch(frame);
            }
            reader.state.send_modify(|s| s.closed = true);
            reader.streams.lock().unwrap().clear();
        });
        Self { inner }
    }

    /// Writes any frame, valid or not.
    pub async fn send(&self, frame: Frame) -> std::io::Result<()> {
        let mut w = self.inner.writer.lock().await;
        let (io, enc, buf) = &mut *w;
        buf.clear();
        enc.encode_frame(&frame, buf).unwrap();
        io.write_all(buf).await?;
        io.flush().await
    }

    /// Writes raw bytes.
    pub async fn send_raw(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut w = self.inner.writer.lock().await;
        w.0.write_all(bytes).await?;
        w.0.flush().await
    }

    /// Closes our write side.
    pub async fn close(&self) {
        let mut w = self.inner.writer.lock().await;
        let _ = w.0.shutdown().await;
    }

    /// Opens a stream with the next odd id; does not wait for the reply. Ids are taken under
    /// the write lock so concurrent opens reach the wire in increasing order, as SPDY requires.
    pub async fn open(&self, headers: Headers) -> ClientStream {
        self.open_inner(None, headers).await
    }

    /// Opens a stream with a chosen id (to test id validation).
    pub async fn open_with_id(&self, id: u32, headers: Headers) -> ClientStream {
        self.open_inner(Some(id), headers).await
    }

    async fn open_inner(&self, id: Option<u32>, headers: Headers) -> ClientStream {
        let mut w = self.inner.writer.lock().await;
        let id = id.unwrap_or_else(|| self.inner.next_id.fetch_add(2, Ordering::SeqCst));
        let (tx, rx) = mpsc::unbounded_channel();
        self.inner.streams.lock().unwrap().insert(id, tx);
        let frame = Frame::SynStream {
            stream_id: id,
            associated_id: 0,
            priority: 0,
            slot: 0,
            fin: false,
            unidirectional: false,
            headers,
        };
        let (io, enc, buf) = &mut *w;
        buf.clear();
        enc.encode_frame(&frame, buf).unwrap();
        let _ = io.write_all(buf).await;
        let _ = io.flush().await;
        ClientStream {
            id,
            client: self.clone(),
            rx,
        }
    }

    pub fn state(&self) -> watch::Receiver<ConnState> {
        self.inner.state.subscribe()
    }

    /// Waits until the connection state satisfies `f`.
    pub async fn wait_state(&self, f: impl Fn(&ConnState) -> bool) -> ConnState {
        let mut rx = self.state();
        rx.wait_for(|s| f(s))
            .await
            .map(|s| s.clone())
            .unwrap_or_default()
    }
}

impl Inner {
    fn route(&self, id: u32, ev: Event) {
        if let Some(tx) = self.streams.lock().unwrap().get(&id) {
            let _ = tx.send(ev);
        }
    }

    fn dispatch(&self, frame: Frame) {
        match frame {
            Frame::SynReply { stream_id, fin, .. } => {
                self.route(stream_id, Event::Reply);
                if fin {
                    self.route(stream_id, Event::Fin);
                }
            }
            Frame::Data {
                stream_id,
                fin,
                data,
            } => {
                if !data.is_empty() {
                    self.route(stream_id, Event::Data(data));
                }
                if fin {
                    self.route(stream_id, Event::Fin);
                }
            }
            Frame::RstStream { stream_id, status } => self.route(stream_id, Event::Reset(status)),
            Frame::Ping { id } => self.state.send_modify(|s| s.pings.push(id)),
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                self.state
                    .send_modify(|s| s.goaway = Some((last_good_stream_id, status)));
            }
            _ => {}
        }
    }
}

pub struct ClientStream {
    pub id: u32,
    client: Client,
    rx: mpsc::UnboundedReceiver<Event>,
}

impl ClientStream {
    pub async fn next_event(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// Waits for SYN_REPLY; `Err` with the reset status if refused.
    pub async fn replied(&mut self) -> Result<(), RstStatus> {
        match self.rx.recv().await {
            Some(Event::Reply) => Ok(()),
            Some(Event::Reset(s)) => Err(s),
            other => panic!("stream {}: expected a reply, got {other:?}", self.id),
        }
    }

    pub async fn write(&self, data: &[u8]) -> std::io::Result<()> {
        self.client
            .send(Frame::Data {
                stream_id: self.id,
                fin: false,
                data: Bytes::copy_from_slice(data),
            })
            .await
    }

    pub async fn fin(&self) -> std::io::Result<()> {
        self.client
            .send(Frame::Data {
                stream_id: self.id,
                fin: true,
                data: Bytes::new(),
            })
            .await
    }

    pub async fn reset(&self) -> std::io::Result<()> {
        self.client
            .send(Frame::RstStream {
                stream_id: self.id,
                status: RstStatus::CANCEL,
            })
            .await
    }

    /// Collects data until FIN. `Err` if the stream was reset or the connection ended first.
    pub async fn read_to_end(&mut self) -> Result<Vec<u8>, Option<RstStatus>> {
        let mut out = Vec::new();
        loop {
            match self.rx.recv().await {
                Some(Event::Data(d)) => out.extend_from_slice(&d),
                Some(Event::Fin) => return Ok(out),
                Some(Event::Reply) => {}
                Some(Event::Reset(s)) => return Err(Some(s)),
                None => return Err(None),
            }
        }
    }
}

/// The sending half of a [`ClientStream`], usable while the stream is being read.
#[derive(Clone)]
pub struct StreamSender {
    pub id: u32,
    client: Client,
}

impl StreamSender {
    pub async fn write(&self, data: &[u8]) -> std::io::Result<()> {
        self.client
            .send(Frame::Data {
                stream_id: self.id,
                fin: false,
                data: Bytes::copy_from_slice(data),
            })
            .await
    }

    pub async fn fin(&self) -> std::io::Result<()> {
        self.client
            .send(Frame::Data {
                stream_id: self.id,
                fin: true,
                data: Bytes::new(),
            })
            .await
    }
}

impl ClientStream {
    pub fn sender(&self) -> StreamSender {
        StreamSender {
            id: self.id,
            client: self.client.clone(),
        }
    }
}
