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
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, upstream, available.clone(), stop.clone()));
        Ok(Self {
            addr,
            available,
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
    available: Arc<watch::Sender<bool>>,
    stop: CancellationToken,
) {
    let mut errors = tensile_kubelet::tls::AcceptErrors::new("fault proxy");
    loop {
        let (client, _) = tokio::select! {
            () = stop.cancelled() => return,
            c = tensile_kubelet::tls::accept_backing_off(&listener, &mut errors) => c,
        };
        if !*available.borrow() {
            drop(client);
            continue;
        }
        let down = available.subscribe();
        tokio::spawn(splice(client, upstream, down, stop.child_token()));
    }
}

/// Copies both ways until either side ends, the proxy stops, or an outage (or reset) begins.
async fn splice(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut available: watch::Receiver<bool>,
    stop: CancellationToken,
) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // Marks the current value seen, so only a change after this connection began cuts it.
    available.borrow_and_update();
    tokio::select! {
        () = stop.cancelled() => {}
        _ = available.changed() => {}
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
    }
}
