//! A TCP proxy in front of a cluster's API server, for faults either backend can suffer the
//! same way: clients reach the cluster through it, while the cluster's own parts (its
//! controllers, scheduler and simulated kubelets) reach the API server directly. An outage
//! ([`FaultProxy::set_available`]) closes every open connection and refuses new ones, so what
//! a client sees is what it would see when a lower cluster drops off the network.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A running proxy; it stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    available: Arc<watch::Sender<bool>>,
    frozen: Arc<watch::Sender<bool>>,
    stop: CancellationToken,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let available = Arc::new(watch::Sender::new(true));
        let frozen = Arc::new(watch::Sender::new(false));
        let stop = CancellationToken::new();
        tokio::spawn(accept(
            listener,
            upstream,
            (available.clone(), frozen.clone()),
            stop.clone(),
        ));
        Ok(Self {
            addr,
            available,
            frozen,
            stop,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `false` begins an outage: open connections are closed and new ones closed at once,
    /// until set back to `true`.
    pub fn set_available(&self, available: bool) {
        self.available.send_replace(available);
    }

    /// `true` freezes every connection, open and new, as a stopped (SIGSTOP) API server
    /// does: they stay open, new ones are accepted, and no byte moves either way until set
    /// back to `false`, when what waited is delivered.
    pub fn set_frozen(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }

    /// Closes every open connection once, as an API server restart does; new connections
    /// are served as before.
    pub fn reset_connections(&self) {
        self.available.send_replace(false);
        self.available.send_replace(true);
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    (available, frozen): (Arc<watch::Sender<bool>>, Arc<watch::Sender<bool>>),
    stop: CancellationToken,
) {
    let mut errors = tensile_runtime::tls::AcceptErrors::new("fault proxy");
    loop {
        let (client, _) = tokio::select! {
            () = stop.cancelled() => return,
            c = tensile_runtime::tls::accept_backing_off(&listener, &mut errors) => c,
        };
        if !*available.borrow() {
            drop(client);
            continue;
        }
        let down = available.subscribe();
        tokio::spawn(splice(
            client,
            upstream,
            (down, frozen.subscribe()),
            stop.child_token(),
        ));
    }
}

/// Copies both ways until either side ends, the proxy stops, or an outage (or reset) begins.
async fn splice(
    client: TcpStream,
    upstream: SocketAddr,
    (mut available, frozen): (watch::Receiver<bool>, watch::Receiver<bool>),
    stop: CancellationToken,
) {
    // Marks the current value seen, so only a change after this connection began cuts it.
    available.borrow_and_update();
    let frozen_at_start = frozen.clone();
    let connect = async {
        // A frozen server accepts (its kernel does) but does not answer: connect once thawed.
        thawed(frozen_at_start).await;
        TcpStream::connect(upstream).await
    };
    let server = tokio::select! {
        () = stop.cancelled() => return,
        _ = available.changed() => return,
        s = connect => match s {
            Ok(s) => s,
            Err(_) => return,
        },
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = stop.cancelled() => {}
        _ = available.changed() => {}
        _ = async {
            tokio::join!(
                pump(client_read, server_write, frozen.clone()),
                pump(server_read, client_write, frozen)
            )
        } => {}
    }
}

/// Returns once `frozen` is false.
async fn thawed(mut frozen: watch::Receiver<bool>) {
    let _ = frozen.wait_for(|f| !*f).await;
}

/// Copies `from` to `to` until either ends, holding the bytes while `frozen`.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        thawed(frozen.clone()).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        thawed(frozen.clone()).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
