//! The virtual node's node ports: its address answers on every NodePort (and LoadBalancer)
//! Service's node ports and forwards to the Service's backends, as kube-proxy does on every
//! node. Where each port goes is `tensile_core::node_ports`; this is the thin I/O around it:
//! the Service controller's watches of upper Services and Endpoints tell it of every change
//! (`crate::copies`), and it opens, retargets and closes listeners.
//!
//! - TCP: each accepted connection goes to one backend (round robin, or the client's with
//!   session affinity) and its bytes are copied both ways until either side closes. A backend
//!   that does not answer in [`CONNECT_TIMEOUT`] gets the client a reset, as a refused
//!   connection.
//! - UDP: each client address is a flow with a socket of its own to one backend; replies go back
//!   from the node port; a flow idle for [`UDP_IDLE`] ends (conntrack's UDP timeout).
//! - Bounded: at most [`MAX_CONNECTIONS`] TCP connections and [`MAX_FLOWS`] UDP flows at once per
//!   node (each holds fixed buffers); more are refused, not queued. These tasks share the
//!   runtime with the rest of the node but not its clients: the Lease has its own
//!   (`crate::clients`).
//! - Listeners set `SO_REUSEPORT`: virtual nodes that share an address (one host, tests) each
//!   take a share of its connections, and each forwards to the same backends.
//! - An established connection outlives a change of its Service, as conntrack keeps it; all end
//!   when the node stops.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Endpoints, Service};
use tensile_core::guard::WarnLimiter;
use tensile_core::node_ports::{PortKey, Protocol, Route, listened, service_routes};
use tensile_runtime::cache::{CompactCache, Key};
use tensile_runtime::tls::{AcceptErrors, accept_backing_off};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// How long a backend has to accept a forwarded TCP connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A UDP flow without a datagram either way for this long ends.
pub const UDP_IDLE: Duration = Duration::from_secs(30);
/// TCP connections forwarded at once, per node.
pub const MAX_CONNECTIONS: usize = 1024;
/// UDP flows at once, per node (each holds a 64 KiB reply buffer).
pub const MAX_FLOWS: usize = 256;
/// Failed listens are tried again this often.
const RETRY_EVERY: Duration = Duration::from_secs(30);
/// The largest UDP payload.
const DATAGRAM: usize = 65_536;

/// One port's route and the choice of backend for its next client.
#[derive(Debug, Default)]
struct Forward {
    route: Option<Route>,
    picker: tensile_core::node_ports::Picker,
}

type SharedForward = Arc<Mutex<Forward>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere cannot make the table unreadable: its content is always whole.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn pick(forward: &SharedForward, client: IpAddr) -> Option<SocketAddr> {
    let mut f = lock(forward);
    let Forward { route, picker } = &mut *f;
    picker.pick(route.as_ref()?, client, Instant::now())
}

struct Open {
    forward: SharedForward,
    cancel: CancellationToken,
}

#[derive(Default)]
struct State {
    /// Every NodePort Service's routes, by `namespace/name`.
    routes: BTreeMap<Key, Vec<(PortKey, Route)>>,
    open: HashMap<PortKey, Open>,
    /// Ports that could not be listened on (tried again every [`RETRY_EVERY`]).
    failed: BTreeSet<PortKey>,
}

/// The node ports of one virtual node.
pub struct NodePorts {
    node: String,
    address: IpAddr,
    services: CompactCache<Service>,
    endpoints: CompactCache<Endpoints>,
    state: Mutex<State>,
    connections: Arc<Semaphore>,
    flows: Arc<Semaphore>,
    warn: Mutex<WarnLimiter>,
    stop: CancellationToken,
}

impl std::fmt::Debug for NodePorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePorts")
            .field("node", &self.node)
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl NodePorts {
    /// The node ports of node `node` on `address`, from the upper `services` and `endpoints`
    /// (the Service controller's caches), until `stop`.
    pub fn new(
        node: String,
        address: IpAddr,
        services: CompactCache<Service>,
        endpoints: CompactCache<Endpoints>,
        stop: CancellationToken,
    ) -> Arc<Self> {
        let ports = Arc::new(Self {
            node,
            address,
            services,
            endpoints,
            state: Mutex::default(),
            connections: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            flows: Arc::new(Semaphore::new(MAX_FLOWS)),
            warn: Mutex::new(WarnLimiter::new(Duration::from_secs(10))),
            stop,
        });
        let retry = Arc::downgrade(&ports);
        let stop = ports.stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RETRY_EVERY) => {}
                }
                let Some(ports) = retry.upgrade() else { return };
                let mut state = lock(&ports.state);
                if !state.failed.is_empty() {
                    ports.apply(&mut state);
                }
            }
        });
        ports
    }

    /// The Service or Endpoints `key` changed upstairs (the caches show it already).
    pub fn changed(&self, key: &Key) {
        let Key {
            namespace: ns,
            name,
        } = key;
        let routes = self
            .services
            .get(ns, name)
            .map(|svc| {
                service_routes(
                    &svc,
                    self.endpoints.get(ns, name).as_ref(),
                    &self.node,
                    self.address,
                )
            })
            .unwrap_or_default();
        let mut state = lock(&self.state);
        let before = state.routes.get(key);
        if before.is_none() && routes.is_empty() {
            return;
        }
        if before == Some(&routes) {
            return;
        }
        if routes.is_empty() {
            state.routes.remove(key);
        } else {
            state.routes.insert(key.clone(), routes);
        }
        self.apply(&mut state);
    }

    /// The ports listened on now (tests and logs).
    pub fn listening(&self) -> Vec<(Protocol, u16)> {
        let state = lock(&self.state);
        let mut out: Vec<_> = state.open.keys().map(|k| (k.protocol, k.port)).collect();
        out.sort();
        out
    }

    fn apply(&self, state: &mut State) {
        let want = listened(state.routes.iter());
        state.open.retain(|key, open| {
            let keep = want.contains_key(key);
            if !keep {
                open.cancel.cancel();
                tracing::info!(node = %self.node, port = key.port, protocol = key.protocol.as_str(), "node port closed: no Service with a ready backend has it");
            }
            keep
        });
        state.failed.retain(|key| want.contains_key(key));
        for (key, route) in want {
            if let Some(open) = state.open.get(&key) {
                lock(&open.forward).route = Some(route);
                continue;
            }
            let forward: SharedForward = Arc::new(Mutex::new(Forward {
                route: Some(route),
                ..Forward::default()
            }));
            match self.listen(key, &forward) {
                Ok(cancel) => {
                    state.failed.remove(&key);
                    tracing::info!(node = %self.node, address = %self.address, port = key.port, protocol = key.protocol.as_str(), "node port open");
                    state.open.insert(key, Open { forward, cancel });
                }
                Err(e) => {
                    state.failed.insert(key);
                    if let Some(held_back) = lock(&self.warn).allow(Instant::now()) {
                        tracing::warn!(node = %self.node, address = %self.address, port = key.port, protocol = key.protocol.as_str(), error = %e, held_back, "cannot listen on a node port; trying again in 30 s");
                    }
                }
            }
        }
    }

    fn listen(&self, key: PortKey, forward: &SharedForward) -> std::io::Result<CancellationToken> {
        let at = SocketAddr::new(self.address, key.port);
        let cancel = self.stop.child_token();
        match key.protocol {
            Protocol::Tcp => {
                let listener = TcpListener::from_std(reusable(at, socket2::Type::STREAM)?.into())?;
                tokio::spawn(serve_tcp(
                    listener,
                    forward.clone(),
                    self.connections.clone(),
                    cancel.clone(),
                    self.stop.clone(),
                ));
            }
            Protocol::Udp => {
                let socket = UdpSocket::from_std(reusable(at, socket2::Type::DGRAM)?.into())?;
                tokio::spawn(serve_udp(
                    Arc::new(socket),
                    forward.clone(),
                    self.flows.clone(),
                    cancel.clone(),
                ));
            }
        }
        Ok(cancel)
    }
}

/// A non-blocking socket bound to `at` with `SO_REUSEADDR` and `SO_REUSEPORT` (see the module
/// notes), listening if it is a stream socket.
fn reusable(at: SocketAddr, kind: socket2::Type) -> std::io::Result<socket2::Socket> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(at), kind, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&at.into())?;
    if kind == socket2::Type::STREAM {
        socket.listen(1024)?;
    }
    Ok(socket)
}

async fn serve_tcp(
    listener: TcpListener,
    forward: SharedForward,
    connections: Arc<Semaphore>,
    cancel: CancellationToken,
    stop: CancellationToken,
) {
    let mut errors = AcceptErrors::new("node port");
    let mut full = WarnLimiter::new(Duration::from_secs(10));
    loop {
        let (client, peer) = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = accept_backing_off(&listener, &mut errors) => accepted,
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            if let Some(held_back) = full.allow(Instant::now()) {
                tracing::warn!(
                    limit = MAX_CONNECTIONS,
                    held_back,
                    "node port connection refused: too many forwarded at once"
                );
            }
            refuse(client);
            continue;
        };
        let Some(backend) = pick(&forward, peer.ip()) else {
            refuse(client);
            continue;
        };
        tokio::spawn(relay_tcp(client, backend, permit, stop.clone()));
    }
}

/// Ends `client` with a reset, as a refused connection ends.
fn refuse(client: TcpStream) {
    let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
}

async fn relay_tcp(
    mut client: TcpStream,
    backend: SocketAddr,
    _permit: OwnedSemaphorePermit,
    stop: CancellationToken,
) {
    let mut upstream =
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(backend)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(%backend, error = %e, "node port backend refused the connection");
                return refuse(client);
            }
            Err(_) => {
                tracing::debug!(%backend, "node port backend did not answer in time");
                return refuse(client);
            }
        };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    tokio::select! {
        () = stop.cancelled() => {}
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
    }
}

struct Flow {
    upstream: Arc<UdpSocket>,
    last: Arc<Mutex<Instant>>,
}

type Flows = Arc<Mutex<HashMap<SocketAddr, Flow>>>;

async fn serve_udp(
    socket: Arc<UdpSocket>,
    forward: SharedForward,
    limit: Arc<Semaphore>,
    cancel: CancellationToken,
) {
    let flows: Flows = Arc::default();
    let mut buf = vec![0u8; DATAGRAM];
    let mut full = WarnLimiter::new(Duration::from_secs(10));
    loop {
        let (n, client) = tokio::select! {
            () = cancel.cancelled() => return,
            received = socket.recv_from(&mut buf) => match received {
                Ok(r) => r,
                // An ICMP error of an earlier send (Linux reports it on the next call).
                Err(_) => continue,
            },
        };
        let known = lock(&flows)
            .get(&client)
            .map(|f| (f.upstream.clone(), f.last.clone()));
        let upstream = match known {
            Some((upstream, last)) => {
                *lock(&last) = Instant::now();
                upstream
            }
            None => {
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    if let Some(held_back) = full.allow(Instant::now()) {
                        tracing::warn!(
                            limit = MAX_FLOWS,
                            held_back,
                            "node port datagram dropped: too many UDP flows at once"
                        );
                    }
                    continue;
                };
                let Some(backend) = pick(&forward, client.ip()) else {
                    continue;
                };
                let Ok(upstream) = connected_udp(backend).await else {
                    continue;
                };
                let upstream = Arc::new(upstream);
                let last = Arc::new(Mutex::new(Instant::now()));
                lock(&flows).insert(
                    client,
                    Flow {
                        upstream: upstream.clone(),
                        last: last.clone(),
                    },
                );
                tokio::spawn(relay_replies(
                    socket.clone(),
                    client,
                    upstream.clone(),
                    last,
                    flows.clone(),
                    permit,
                    cancel.clone(),
                ));
                upstream
            }
        };
        let _ = upstream.send(&buf[..n]).await;
    }
}

async fn connected_udp(backend: SocketAddr) -> std::io::Result<UdpSocket> {
    let any: SocketAddr = match backend {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(any).await?;
    socket.connect(backend).await?;
    Ok(socket)
}

/// Sends the backend's datagrams of one flow back to its client until the flow is idle.
async fn relay_replies(
    socket: Arc<UdpSocket>,
    client: SocketAddr,
    upstream: Arc<UdpSocket>,
    last: Arc<Mutex<Instant>>,
    flows: Flows,
    _permit: OwnedSemaphorePermit,
    cancel: CancellationToken,
) {
    let mut buf = vec![0u8; DATAGRAM];
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            received = tokio::time::timeout(UDP_IDLE, upstream.recv(&mut buf)) => match received {
                Ok(Ok(n)) => {
                    *lock(&last) = Instant::now();
                    let _ = socket.send_to(&buf[..n], client).await;
                }
                // The backend refused a datagram (ICMP): the flow goes on, as conntrack's does.
                Ok(Err(_)) => {}
                Err(_) => {
                    if lock(&last).elapsed() >= UDP_IDLE {
                        break;
                    }
                }
            },
        }
    }
    let mut flows = lock(&flows);
    if flows
        .get(&client)
        .is_some_and(|f| Arc::ptr_eq(&f.upstream, &upstream))
    {
        flows.remove(&client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher;
    use serde_json::json;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn cache<K>(objects: Vec<K>) -> CompactCache<K>
    where
        K: kube::Resource + serde::Serialize + serde::de::DeserializeOwned + Clone,
    {
        let c = CompactCache::new();
        c.apply(&watcher::Event::Init);
        for o in objects {
            c.apply(&watcher::Event::InitApply(o));
        }
        c.apply(&watcher::Event::InitDone);
        c
    }

    /// A TCP server on `ip` answering every connection with `reply`.
    async fn backend(ip: IpAddr, reply: &'static str) -> SocketAddr {
        let l = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let _ = s.write_all(reply.as_bytes()).await;
            }
        });
        addr
    }

    async fn udp_echo(ip: IpAddr, prefix: &'static str) -> SocketAddr {
        let s = UdpSocket::bind((ip, 0)).await.unwrap();
        let addr = s.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = s.recv_from(&mut buf).await {
                let mut out = prefix.as_bytes().to_vec();
                out.extend_from_slice(&buf[..n]);
                let _ = s.send_to(&out, from).await;
            }
        });
        addr
    }

    async fn read_all(at: SocketAddr) -> std::io::Result<String> {
        let mut s = TcpStream::connect(at).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }

    /// A free port of `ip` for both TCP and UDP.
    fn free_port(ip: IpAddr) -> u16 {
        loop {
            let t = std::net::TcpListener::bind((ip, 0)).unwrap();
            let port = t.local_addr().unwrap().port();
            if std::net::UdpSocket::bind((ip, port)).is_ok() {
                return port;
            }
        }
    }

    // The backends listen on loopback, which the rules never forward to
    // (`tensile_core::node_ports::forwardable`): these tests set the routes themselves.
    struct Fixture {
        ports: Arc<NodePorts>,
        key: PortKey,
        at: SocketAddr,
        stop: CancellationToken,
    }

    impl Fixture {
        /// Node ports on loopback without Services, and a free port of `protocol`.
        fn new(protocol: Protocol) -> Self {
            let lo: IpAddr = "127.0.0.1".parse().unwrap();
            let stop = CancellationToken::new();
            let ports = NodePorts::new(
                "vn".into(),
                lo,
                cache(Vec::<Service>::new()),
                cache(Vec::<Endpoints>::new()),
                stop.clone(),
            );
            let port = free_port(lo);
            Fixture {
                ports,
                key: PortKey { protocol, port },
                at: SocketAddr::new(lo, port),
                stop,
            }
        }

        /// The port's only Service now goes to `backends`.
        fn route(&self, backends: Vec<SocketAddr>) {
            let mut state = lock(&self.ports.state);
            let route = Route {
                backends,
                affinity: None,
            };
            state
                .routes
                .insert(Key::new("ns", "web"), vec![(self.key, route)]);
            self.ports.apply(&mut state);
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            self.stop.cancel();
        }
    }

    #[tokio::test]
    async fn a_tcp_node_port_goes_round_robin_to_its_backends_and_closes_with_the_last() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let (a, b) = (backend(lo, "a").await, backend(lo, "b").await);
        let f = Fixture::new(Protocol::Tcp);
        f.route(vec![a, b]);
        assert_eq!(f.ports.listening(), vec![(Protocol::Tcp, f.key.port)]);
        let mut seen = BTreeSet::new();
        for _ in 0..4 {
            seen.insert(read_all(f.at).await.unwrap());
        }
        assert_eq!(seen, BTreeSet::from(["a".to_owned(), "b".to_owned()]));
        // Retargeted in place.
        f.route(vec![b]);
        for _ in 0..3 {
            assert_eq!(read_all(f.at).await.unwrap(), "b");
        }
        // No backend: not listened on, a client is refused.
        f.route(vec![]);
        assert!(f.ports.listening().is_empty());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match TcpStream::connect(f.at).await {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
                _ if Instant::now() > deadline => panic!("the closed node port still answers"),
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    #[tokio::test]
    async fn a_backend_that_refuses_gets_the_client_a_reset() {
        let gone = {
            let l = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
            l.local_addr().unwrap()
        };
        let f = Fixture::new(Protocol::Tcp);
        f.route(vec![gone]);
        let err = read_all(f.at).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    }

    #[tokio::test]
    async fn a_udp_node_port_keeps_each_client_on_its_backend_and_replies_from_the_port() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let (a, b) = (udp_echo(lo, "a:").await, udp_echo(lo, "b:").await);
        let f = Fixture::new(Protocol::Udp);
        f.route(vec![a, b]);
        let mut answers = BTreeSet::new();
        for client in 0..2 {
            let s = UdpSocket::bind((lo, 0)).await.unwrap();
            s.connect(f.at).await.unwrap();
            let mut first = None;
            for i in 0..3 {
                s.send(format!("{client}-{i}").as_bytes()).await.unwrap();
                let mut buf = [0u8; 64];
                let n = tokio::time::timeout(Duration::from_secs(10), s.recv(&mut buf))
                    .await
                    .expect("a reply")
                    .unwrap();
                let reply = String::from_utf8_lossy(&buf[..n]).into_owned();
                let (server, echoed) = reply.split_once(':').unwrap();
                assert_eq!(echoed, format!("{client}-{i}"));
                assert_eq!(
                    *first.get_or_insert(server.to_owned()),
                    server,
                    "one flow, one backend"
                );
            }
            answers.insert(first.unwrap());
        }
        assert_eq!(answers, BTreeSet::from(["a".to_owned(), "b".to_owned()]));
    }

    #[tokio::test]
    async fn routes_follow_the_upper_service_and_endpoints() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let port = free_port(lo);
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": port}]},
        }))
        .unwrap();
        let endpoints: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "subsets": [{"addresses": [{"ip": "198.18.9.9"}], "ports": [{"port": 8080}]}],
        }))
        .unwrap();
        let (services, eps) = (cache(vec![service]), cache(Vec::<Endpoints>::new()));
        let stop = CancellationToken::new();
        let ports = NodePorts::new("vn".into(), lo, services.clone(), eps.clone(), stop.clone());
        let key = Key::new("ns", "web");
        ports.changed(&key);
        assert!(ports.listening().is_empty(), "no backend yet");
        eps.apply(&watcher::Event::Apply(endpoints));
        ports.changed(&key);
        assert_eq!(ports.listening(), vec![(Protocol::Tcp, port)]);
        services.remove("ns", "web");
        ports.changed(&key);
        assert!(ports.listening().is_empty(), "the Service is gone");
        stop.cancel();
    }
}
