//! The node ports a virtual node serves, as every node of a cluster serves them (kube-proxy):
//! a connection to the node's address on a Service's `nodePort` reaches one of the Service's
//! ready backends.
//!
//! A virtual node is one node upstairs; its pods run downstairs, where the Service copies are
//! ClusterIP (`crate::services`). So the node's own address answers on the node ports, and
//! forwards to the backends the upper Endpoints list (pod IPs, reachable on the flat network
//! tensile-kube requires for Services), as kube-proxy does:
//! - NodePort and LoadBalancer Services, TCP and UDP ports (SCTP is not forwarded);
//! - ready addresses only; with `externalTrafficPolicy: Local`, only those on this node;
//! - `sessionAffinity: ClientIP` keeps a client on one backend until it has been idle for the
//!   Service's timeout (default 3 hours, as kube-proxy);
//! - a port with no backend is not listened on: a client is refused, as kube-proxy's REJECT
//!   refuses it.
//!
//! Endpoints are written by users too (a Service without selector): an address that is never a
//! pod's (loopback, link-local, unspecified, multicast) is not forwarded to, as the API server's
//! validation of Endpoints refuses them; the node's process must not be a way into its own
//! host or the cloud metadata service.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{EndpointPort, Endpoints, Service, ServicePort};

use crate::guard::TtlCache;

/// kube-proxy's default session affinity timeout (`sessionAffinityConfig.clientIP`).
pub const DEFAULT_AFFINITY_TIMEOUT: Duration = Duration::from_secs(10_800);
/// Clients remembered per port for session affinity: a flood of new clients cannot grow memory.
pub const AFFINITY_CLIENTS: usize = 4096;

/// The transport of a node port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Protocol {
    fn parse(protocol: Option<&str>) -> Option<Self> {
        match protocol.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            _ => None,
        }
    }

    /// As Kubernetes writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}

/// A node port: protocol and number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey {
    /// Its transport.
    pub protocol: Protocol,
    /// Its number.
    pub port: u16,
}

/// Where a node port's connections go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The ready backends, sorted, without repeats.
    pub backends: Vec<SocketAddr>,
    /// `sessionAffinity: ClientIP`: a client's idle time after which it may change backend.
    pub affinity: Option<Duration>,
}

/// Whether `ip` may be a backend: never an address a pod cannot have (see the module notes).
pub fn forwardable(ip: IpAddr) -> bool {
    let never = match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6.to_ipv4_mapped().is_some()
        }
    };
    !never
}

fn same_port_name(service_port: &ServicePort, endpoint_port: &EndpointPort) -> bool {
    service_port.name.as_deref().unwrap_or_default()
        == endpoint_port.name.as_deref().unwrap_or_default()
}

/// The node ports of the upper Service `service` with its Endpoints `endpoints`, on the virtual
/// node `node`; empty for a Service of another type. A port without a ready backend is listed
/// with none (see [`listened`]). The node's own address `own` is never a backend: a tenant's
/// Endpoints naming it would loop connections back into the node (or onto its kubelet port).
pub fn service_routes(
    service: &Service,
    endpoints: Option<&Endpoints>,
    node: &str,
    own: IpAddr,
) -> Vec<(PortKey, Route)> {
    let Some(spec) = service.spec.as_ref() else {
        return Vec::new();
    };
    if !matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer")) {
        return Vec::new();
    }
    let local_only = spec.external_traffic_policy.as_deref() == Some("Local");
    let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .filter(|s| *s > 0)
            .map_or(DEFAULT_AFFINITY_TIMEOUT, Duration::from_secs)
    });
    let subsets = endpoints
        .and_then(|e| e.subsets.as_deref())
        .unwrap_or_default();
    let mut routes = Vec::new();
    for service_port in spec.ports.iter().flatten() {
        let Some(protocol) = Protocol::parse(service_port.protocol.as_deref()) else {
            continue;
        };
        let Some(port) = service_port
            .node_port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0)
        else {
            continue;
        };
        let mut backends = Vec::new();
        for subset in subsets {
            let Some(target) = subset.ports.iter().flatten().find(|p| {
                same_port_name(service_port, p)
                    && Protocol::parse(p.protocol.as_deref()) == Some(protocol)
            }) else {
                continue;
            };
            let Ok(target) = u16::try_from(target.port) else {
                continue;
            };
            if target == 0 {
                continue;
            }
            for address in subset.addresses.iter().flatten() {
                if local_only && address.node_name.as_deref() != Some(node) {
                    continue;
                }
                match address.ip.parse::<IpAddr>() {
                    Ok(ip) if forwardable(ip) && ip != own => {
                        backends.push(SocketAddr::new(ip, target));
                    }
                    _ => {}
                }
            }
        }
        backends.sort();
        backends.dedup();
        routes.push((PortKey { protocol, port }, Route { backends, affinity }));
    }
    routes
}

/// The ports to listen on, from every Service's routes (by `namespace/name`): the ports with a
/// backend. Should two Services claim one port (the API server's allocator never lets them; a
/// moment of two updates might), the first by name has it.
pub fn listened<'a, K: Ord + 'a>(
    services: impl IntoIterator<Item = (&'a K, &'a Vec<(PortKey, Route)>)>,
) -> BTreeMap<PortKey, Route> {
    let mut ordered: Vec<_> = services.into_iter().collect();
    ordered.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = BTreeMap::new();
    for (_, routes) in ordered {
        for (key, route) in routes {
            if !route.backends.is_empty() {
                out.entry(*key).or_insert_with(|| route.clone());
            }
        }
    }
    out
}

/// Which backend each new connection (TCP) or client flow (UDP) of one node port goes to:
/// round robin, or for a Service with session affinity the client's backend while it is still
/// a backend and the client has not been idle longer than the timeout.
#[derive(Debug)]
pub struct Picker {
    next: usize,
    clients: TtlCache<IpAddr, SocketAddr>,
}

impl Default for Picker {
    fn default() -> Self {
        Self {
            next: 0,
            clients: TtlCache::new(AFFINITY_CLIENTS),
        }
    }
}

impl Picker {
    /// The backend of `route` for a connection from `client` at `now`; `None` without backends.
    pub fn pick(&mut self, route: &Route, client: IpAddr, now: Instant) -> Option<SocketAddr> {
        if route.backends.is_empty() {
            return None;
        }
        if let Some(timeout) = route.affinity
            && let Some(kept) = self.clients.get(&client, now)
            && route.backends.contains(&kept)
        {
            self.clients.insert(client, kept, timeout, now);
            return Some(kept);
        }
        let chosen = route.backends[self.next % route.backends.len()];
        self.next = self.next.wrapping_add(1);
        if let Some(timeout) = route.affinity {
            self.clients.insert(client, chosen, timeout, now);
        }
        Some(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const OWN: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 16));

    fn service(spec: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn endpoints(subsets: serde_json::Value) -> Endpoints {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "subsets": subsets,
        }))
        .unwrap()
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn node_ports_of_each_port_go_to_the_ready_addresses_at_the_target_port_of_the_same_name() {
        let svc = service(json!({
            "type": "NodePort",
            "ports": [
                {"name": "http", "port": 80, "nodePort": 30080},
                {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
                {"name": "sctp", "port": 99, "protocol": "SCTP", "nodePort": 30099},
            ],
        }));
        let ep = endpoints(json!([
            {
                "addresses": [{"ip": "198.18.1.5"}, {"ip": "198.18.2.7"}],
                "notReadyAddresses": [{"ip": "198.18.1.9"}],
                "ports": [{"name": "http", "port": 8080}, {"name": "dns", "port": 5353, "protocol": "UDP"}],
            },
            {
                "addresses": [{"ip": "198.18.3.1"}],
                "ports": [{"name": "http", "port": 8081}],
            },
        ]));
        let routes = service_routes(&svc, Some(&ep), "vn", OWN);
        assert_eq!(
            routes,
            vec![
                (
                    PortKey {
                        protocol: Protocol::Tcp,
                        port: 30080
                    },
                    Route {
                        backends: vec![
                            addr("198.18.1.5:8080"),
                            addr("198.18.2.7:8080"),
                            addr("198.18.3.1:8081")
                        ],
                        affinity: None,
                    }
                ),
                (
                    PortKey {
                        protocol: Protocol::Udp,
                        port: 30053
                    },
                    Route {
                        backends: vec![addr("198.18.1.5:5353"), addr("198.18.2.7:5353")],
                        affinity: None,
                    }
                ),
            ]
        );
    }

    #[test]
    fn only_node_port_and_load_balancer_services_have_node_ports() {
        for (kind, expected) in [
            ("ClusterIP", 0),
            ("ExternalName", 0),
            ("NodePort", 1),
            ("LoadBalancer", 1),
        ] {
            let svc = service(json!({"type": kind, "ports": [{"port": 80, "nodePort": 31000}]}));
            assert_eq!(
                service_routes(&svc, None, "vn", OWN).len(),
                expected,
                "{kind}"
            );
        }
        // A LoadBalancer without node ports (allocateLoadBalancerNodePorts: false) has none.
        let svc = service(json!({"type": "LoadBalancer", "ports": [{"port": 80}]}));
        assert!(service_routes(&svc, None, "vn", OWN).is_empty());
    }

    #[test]
    fn local_traffic_policy_keeps_the_backends_of_this_node() {
        let svc = service(json!({
            "type": "NodePort", "externalTrafficPolicy": "Local",
            "ports": [{"port": 80, "nodePort": 30080}],
        }));
        let ep = endpoints(json!([{
            "addresses": [{"ip": "198.18.1.5", "nodeName": "vn"}, {"ip": "198.18.2.7", "nodeName": "other"}],
            "ports": [{"port": 8080}],
        }]));
        let routes = service_routes(&svc, Some(&ep), "vn", OWN);
        assert_eq!(routes[0].1.backends, vec![addr("198.18.1.5:8080")]);
    }

    #[test]
    fn addresses_a_pod_never_has_are_not_forwarded_to() {
        let svc = service(json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}));
        let ep = endpoints(json!([{
            "addresses": [
                {"ip": "127.0.0.1"}, {"ip": "169.254.169.254"}, {"ip": "0.0.0.0"},
                {"ip": "224.0.0.1"}, {"ip": "::1"}, {"ip": "fe80::1"}, {"ip": "::ffff:127.0.0.1"},
                {"ip": "not-an-ip"}, {"ip": "198.18.0.16"}, {"ip": "198.18.1.5"},
            ],
            "ports": [{"port": 8080}],
        }]));
        let routes = service_routes(&svc, Some(&ep), "vn", OWN);
        assert_eq!(routes[0].1.backends, vec![addr("198.18.1.5:8080")]);
    }

    #[test]
    fn session_affinity_timeout_is_the_services_or_kube_proxys_default() {
        let with = |config: serde_json::Value| {
            let svc = service(json!({
                "type": "NodePort", "sessionAffinity": "ClientIP", "sessionAffinityConfig": config,
                "ports": [{"port": 80, "nodePort": 30080}],
            }));
            service_routes(&svc, None, "vn", OWN)[0].1.affinity
        };
        assert_eq!(
            with(json!({"clientIP": {"timeoutSeconds": 60}})),
            Some(Duration::from_secs(60))
        );
        assert_eq!(with(json!({})), Some(DEFAULT_AFFINITY_TIMEOUT));
        let none = service(json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}));
        assert_eq!(service_routes(&none, None, "vn", OWN)[0].1.affinity, None);
    }

    #[test]
    fn only_ports_with_a_backend_are_listened_on_and_a_port_claimed_twice_goes_to_the_first() {
        let key = |port| PortKey {
            protocol: Protocol::Tcp,
            port,
        };
        let route = |b: &[&str]| Route {
            backends: b.iter().map(|s| addr(s)).collect(),
            affinity: None,
        };
        let services = BTreeMap::from([
            (
                "b/second",
                vec![
                    (key(30001), route(&["198.18.0.2:80"])),
                    (key(30002), route(&["198.18.0.3:80"])),
                ],
            ),
            (
                "a/first",
                vec![
                    (key(30001), route(&["198.18.0.1:80"])),
                    (key(30003), route(&[])),
                ],
            ),
        ]);
        let listened = listened(services.iter());
        assert_eq!(
            listened,
            BTreeMap::from([
                (key(30001), route(&["198.18.0.1:80"])),
                (key(30002), route(&["198.18.0.3:80"])),
            ])
        );
    }

    #[test]
    fn picks_round_robin_without_affinity_and_keeps_a_client_with_it() {
        let now = Instant::now();
        let client: IpAddr = "198.18.5.5".parse().unwrap();
        let other: IpAddr = "198.18.5.6".parse().unwrap();
        let mut route = Route {
            backends: vec![addr("198.18.0.1:80"), addr("198.18.0.2:80")],
            affinity: None,
        };
        let mut picker = Picker::default();
        let picks: Vec<_> = (0..4)
            .map(|_| picker.pick(&route, client, now).unwrap())
            .collect();
        assert_eq!(picks[0], picks[2]);
        assert_ne!(picks[0], picks[1]);

        route.affinity = Some(Duration::from_secs(60));
        let mut picker = Picker::default();
        let first = picker.pick(&route, client, now).unwrap();
        for s in 1..10 {
            let at = now + Duration::from_secs(s * 30);
            assert_eq!(
                picker.pick(&route, client, at),
                Some(first),
                "idle < timeout"
            );
        }
        assert_ne!(picker.pick(&route, other, now), Some(first), "next client");
        let third: IpAddr = "198.18.5.7".parse().unwrap();
        assert_eq!(picker.pick(&route, third, now), Some(first), "round robin");
        // Idle longer than the timeout: the client is picked for as a new one (the round robin
        // is at the second backend).
        let later = now + Duration::from_secs(300 + 61);
        assert_ne!(picker.pick(&route, client, later), Some(first));
        // A backend that left is never kept.
        let mut picker = Picker::default();
        let kept = picker.pick(&route, client, now).unwrap();
        route.backends.retain(|b| *b != kept);
        assert_ne!(picker.pick(&route, client, now), Some(kept));
        assert_eq!(
            Picker::default().pick(
                &Route {
                    backends: vec![],
                    affinity: None
                },
                client,
                now
            ),
            None
        );
    }
}
