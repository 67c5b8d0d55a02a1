//! A TCP proxy in front of a cluster's API server, for faults either backend can suffer the
//! same way: clients reach the cluster through it, while the cluster's own parts (its
//! controllers, scheduler and simulated kubelets) reach the API server directly. An outage
//! ([`FaultProxy::set_available`]) closes every open connection and refuses new ones, so what
//! a client sees is what it would see when a lower cluster drops off the network. A one-way
//! partition ([`FaultProxy::set_held`]) holds the bytes of one direction only, as a network
//! that drops one way's packets (TCP retransmits them once it heals).

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
    /// Bytes held one way: to the server, from the server.
    held: [Arc<watch::Sender<bool>>; 2],
    stop: CancellationToken,
}

/// A direction through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// From the client to the server: requests.
    ToServer,
    /// From the server to the client: answers and watch events.
    FromServer,
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
        let held = [
            Arc::new(watch::Sender::new(false)),
            Arc::new(watch::Sender::new(false)),
        ];
        let stop = CancellationToken::new();
        tokio::spawn(accept(
            listener,
            upstream,
            Gates {
                available: available.clone(),
                frozen: frozen.clone(),
                held: held.clone(),
            },
            stop.clone(),
        ));
        Ok(Self {
            addr,
            available,
            frozen,
            held,
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

    /// `true` holds every byte going `way`, on open connections and new ones (which are
    /// accepted and connected), until set back to `false`, when what waited is delivered: a
    /// one-way partition. With [`Way::FromServer`] requests arrive and are carried out, and
    /// their answers do not come back.
    pub fn set_held(&self, way: Way, held: bool) {
        self.held[way as usize].send_replace(held);
    }

    /// Closes every open connection once, as an API server restart does; new connections
    /// are served as before.
    pub fn reset_connections(&self) {
        self.available.send_replace(false);
        self.available.send_replace(true);
    }
}

/// What decides whether bytes move.
#[derive(Clone)]
struct Gates {
    available: Arc<watch::Sender<bool>>,
    frozen: Arc<watch::Sender<bool>>,
    held: [Arc<watch::Sender<bool>>; 2],
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    gates: Gates,
    stop: CancellationToken,
) {
    let mut errors = tensile_runtime::tls::AcceptErrors::new("fault proxy");
    loop {
        let (client, _) = tokio::select! {
            () = stop.cancelled() => return,
            c = tensile_runtime::tls::accept_backing_off(&listener, &mut errors) => c,
        };
        if !*gates.available.borrow() {
            drop(client);
            continue;
        }
        tokio::spawn(splice(client, upstream, gates.clone(), stop.child_token()));
    }
}

/// Copies both ways until either side ends, the proxy stops, or an outage (or reset) begins.
async fn splice(client: TcpStream, upstream: SocketAddr, gates: Gates, stop: CancellationToken) {
    let mut available = gates.available.subscribe();
    // Marks the current value seen, so only a change after this connection began cuts it.
    available.borrow_and_update();
    let frozen = gates.frozen.subscribe();
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
    let [to_server, from_server] = [
        gates.held[Way::ToServer as usize].subscribe(),
        gates.held[Way::FromServer as usize].subscribe(),
    ];
    tokio::select! {
        () = stop.cancelled() => {}
        _ = available.changed() => {}
        _ = async {
            tokio::join!(
                pump(client_read, server_write, [frozen.clone(), to_server]),
                pump(server_read, client_write, [frozen, from_server])
            )
        } => {}
    }
}

/// Returns once `frozen` is false.
async fn thawed(mut frozen: watch::Receiver<bool>) {
    let _ = frozen.wait_for(|f| !*f).await;
}

/// Returns once every gate is open (false).
async fn open(gates: &[watch::Receiver<bool>; 2]) {
    // One gate may close while the other is awaited: round again until both are open.
    while gates.iter().any(|g| *g.borrow()) {
        for gate in gates {
            thawed(gate.clone()).await;
        }
    }
}

/// Copies `from` to `to` until either ends, holding the bytes while a gate is closed.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    gates: [watch::Receiver<bool>; 2],
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        open(&gates).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        open(&gates).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// A server that answers each read with the bytes it read, and counts what it got.
    async fn echo() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = got.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        count.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, got)
    }

    async fn read_within(s: &mut TcpStream, ms: u64) -> Option<Vec<u8>> {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(Duration::from_millis(ms), s.read(&mut buf)).await {
            Ok(Ok(n)) => Some(buf[..n].to_vec()),
            _ => None,
        }
    }

    async fn until_got(got: &std::sync::atomic::AtomicUsize, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while got.load(std::sync::atomic::Ordering::SeqCst) < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the server never got {n} bytes"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_one_way_partition_holds_one_direction_and_delivers_when_it_heals() {
        let (server, got) = echo().await;
        let proxy = FaultProxy::start(server).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        client.write_all(b"a").await.unwrap();
        assert_eq!(
            read_within(&mut client, 5000).await.as_deref(),
            Some(&b"a"[..])
        );

        // Answers held: the request arrives, its answer does not come back until it heals.
        proxy.set_held(Way::FromServer, true);
        client.write_all(b"b").await.unwrap();
        until_got(&got, 2).await;
        assert_eq!(read_within(&mut client, 300).await, None);
        proxy.set_held(Way::FromServer, false);
        assert_eq!(
            read_within(&mut client, 5000).await.as_deref(),
            Some(&b"b"[..])
        );

        // Requests held: nothing arrives, on this connection or a new one.
        proxy.set_held(Way::ToServer, true);
        client.write_all(b"c").await.unwrap();
        let mut other = TcpStream::connect(proxy.addr()).await.unwrap();
        other.write_all(b"d").await.unwrap();
        assert_eq!(read_within(&mut client, 300).await, None);
        assert_eq!(got.load(std::sync::atomic::Ordering::SeqCst), 2);
        proxy.set_held(Way::ToServer, false);
        assert_eq!(
            read_within(&mut client, 5000).await.as_deref(),
            Some(&b"c"[..])
        );
        assert_eq!(
            read_within(&mut other, 5000).await.as_deref(),
            Some(&b"d"[..])
        );
    }
}
