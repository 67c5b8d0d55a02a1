//! Byte pipes between a multiplexed connection (SPDY session or WebSocket channels) and the code
//! that uses one of its streams.
//!
//! Inbound: the connection's reader task pushes [`Chunk`]s into a bounded channel per stream.
//! Each chunk holds permits of a per-connection byte budget, released when the consumer has read
//! it, so the bytes buffered for all streams of a connection stay under that budget; when it is
//! spent the reader task stops reading the socket, which pushes back on the peer through TCP.
//!
//! Outbound: writers put data on the connection's single ordered queue (so a stream's FIN can
//! never overtake its data, nor data its SYN_REPLY), after taking permits of a second byte
//! budget that the writer task gives back once the bytes are encoded.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, PollSemaphore};

/// Bytes delivered to a stream, holding their share of the inbound budget until consumed.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) data: Bytes,
    pub(crate) _permit: Option<OwnedSemaphorePermit>,
}

/// Takes `len` permits of `budget`, or `None` if the connection is shutting down.
pub(crate) async fn acquire(budget: &Arc<Semaphore>, len: usize) -> Option<OwnedSemaphorePermit> {
    let n = u32::try_from(len).ok()?;
    Arc::clone(budget).acquire_many_owned(n).await.ok()
}

/// Flags one stream shares with its connection.
#[derive(Debug, Default)]
pub(crate) struct PipeState {
    /// The stream was reset by either side, or the connection died under it.
    pub(crate) reset: AtomicBool,
    /// This side has finished writing (FIN queued).
    pub(crate) write_closed: AtomicBool,
}

impl PipeState {
    pub(crate) fn is_reset(&self) -> bool {
        self.reset.load(Ordering::Acquire)
    }

    pub(crate) fn mark_reset(&self) {
        self.reset.store(true, Ordering::Release);
    }
}

/// The reading end of a stream.
#[derive(Debug)]
pub(crate) struct InboundReader {
    rx: mpsc::Receiver<Chunk>,
    current: Option<Chunk>,
    state: Arc<PipeState>,
}

impl InboundReader {
    pub(crate) fn new(rx: mpsc::Receiver<Chunk>, state: Arc<PipeState>) -> Self {
        Self {
            rx,
            current: None,
            state,
        }
    }
}

impl AsyncRead for InboundReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if let Some(chunk) = self.current.as_mut() {
                if chunk.data.has_remaining() {
                    let n = chunk.data.len().min(buf.remaining());
                    buf.put_slice(chunk.data.get(..n).unwrap_or_default());
                    chunk.data.advance(n);
                    if !chunk.data.has_remaining() {
                        // Return the budget as soon as the bytes are out.
                        self.current = None;
                    }
                    return Poll::Ready(Ok(()));
                }
                self.current = None;
            }
            match ready!(self.rx.poll_recv(cx)) {
                Some(chunk) => self.current = Some(chunk),
                None if self.state.is_reset() => {
                    return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
                }
                None => return Poll::Ready(Ok(())),
            }
        }
    }
}

/// An item on a connection's outbound queue: stream data or a connection-specific command.
#[derive(Debug)]
pub(crate) enum Out<C> {
    Data(DataOut),
    Control(C),
}

/// Bytes (and/or the end) of one stream, in order.
#[derive(Debug)]
pub(crate) struct DataOut {
    pub(crate) id: u32,
    pub(crate) data: Bytes,
    pub(crate) fin: bool,
    pub(crate) _permit: Option<OwnedSemaphorePermit>,
}

/// The writing end of a stream. Dropping it without `shutdown` still ends the stream (FIN),
/// so a backend that forgets to close its stdout cannot hang the client.
#[derive(Debug)]
pub(crate) struct OutboundWriter<C: Send + 'static> {
    id: u32,
    tx: mpsc::UnboundedSender<Out<C>>,
    budget: PollSemaphore,
    max_chunk: usize,
    state: Arc<PipeState>,
}

impl<C: Send + 'static> OutboundWriter<C> {
    pub(crate) fn new(
        id: u32,
        tx: mpsc::UnboundedSender<Out<C>>,
        budget: Arc<Semaphore>,
        max_chunk: usize,
        state: Arc<PipeState>,
    ) -> Self {
        Self {
            id,
            tx,
            budget: PollSemaphore::new(budget),
            max_chunk: max_chunk.max(1),
            state,
        }
    }

    fn send_fin(&self) -> bool {
        if self.state.write_closed.swap(true, Ordering::AcqRel) || self.state.is_reset() {
            return true;
        }
        let fin = DataOut {
            id: self.id,
            data: Bytes::new(),
            fin: true,
            _permit: None,
        };
        self.tx.send(Out::Data(fin)).is_ok()
    }
}

impl<C: Send + 'static> AsyncWrite for OutboundWriter<C> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.state.is_reset() {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        if self.state.write_closed.load(Ordering::Acquire) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "stream closed",
            )));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = buf.len().min(self.max_chunk);
        let permits = u32::try_from(n).unwrap_or(u32::MAX);
        let Some(permit) = ready!(self.budget.poll_acquire_many(cx, permits)) else {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "connection closed",
            )));
        };
        let data = Bytes::copy_from_slice(buf.get(..n).unwrap_or_default());
        let item = DataOut {
            id: self.id,
            data,
            fin: false,
            _permit: Some(permit),
        };
        if self.tx.send(Out::Data(item)).is_err() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "connection closed",
            )));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Queued data is written by the connection's writer in order; nothing is held here.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.send_fin() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "connection closed",
            )))
        }
    }
}

impl<C: Send + 'static> Drop for OutboundWriter<C> {
    fn drop(&mut self) {
        let _ = self.send_fin();
    }
}

/// Last time a connection moved a frame, for the idle timeout.
#[derive(Debug)]
pub(crate) struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    pub(crate) fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.epoch + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// Cancels `cancel` once nothing moved for `idle`; ends early when `cancel` fires.
pub(crate) fn spawn_idle_watch(activity: Arc<Activity>, idle: Duration, cancel: CancellationToken) {
    tokio::spawn(async move {
        loop {
            let deadline = activity.last() + idle;
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep_until(deadline) => {
                    if activity.last() + idle <= Instant::now() {
                        tracing::debug!(?idle, "streaming connection idle, closing");
                        cancel.cancel();
                        return;
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn reader_returns_budget_after_consumption() {
        let budget = Arc::new(Semaphore::new(10));
        let (tx, rx) = mpsc::channel(4);
        let state = Arc::new(PipeState::default());
        let mut reader = InboundReader::new(rx, Arc::clone(&state));
        let permit = acquire(&budget, 10).await;
        tx.send(Chunk {
            data: Bytes::from_static(b"0123456789"),
            _permit: permit,
        })
        .await
        .unwrap();
        assert_eq!(budget.available_permits(), 0);
        let mut buf = [0u8; 4];
        reader.read_exact(&mut buf).await.unwrap();
        assert_eq!(budget.available_permits(), 0, "chunk not fully read yet");
        let mut rest = [0u8; 6];
        reader.read_exact(&mut rest).await.unwrap();
        assert_eq!(budget.available_permits(), 10);
        drop(tx);
        assert_eq!(reader.read(&mut buf).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn reset_streams_read_as_errors() {
        let (tx, rx) = mpsc::channel(1);
        let state = Arc::new(PipeState::default());
        let mut reader = InboundReader::new(rx, Arc::clone(&state));
        state.mark_reset();
        drop(tx);
        let err = reader.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
    }

    #[tokio::test]
    async fn writer_chunks_waits_for_budget_and_fins_on_drop() {
        let budget = Arc::new(Semaphore::new(8));
        let (tx, mut rx) = mpsc::unbounded_channel::<Out<()>>();
        let state = Arc::new(PipeState::default());
        let mut w = OutboundWriter::new(3, tx, Arc::clone(&budget), 4, state);
        w.write_all(b"abcdefgh").await.unwrap();
        // Budget spent: a further write waits until the queued chunks are released.
        let pending = tokio::time::timeout(Duration::from_millis(50), w.write_all(b"x")).await;
        assert!(pending.is_err());
        let mut got = Vec::new();
        while let Ok(Out::Data(d)) = rx.try_recv() {
            got.extend_from_slice(&d.data);
        }
        assert_eq!(got, b"abcdefgh");
        drop(w);
        let mut saw_fin = false;
        while let Ok(Out::Data(d)) = rx.try_recv() {
            saw_fin |= d.fin;
        }
        assert!(saw_fin);
    }
}
