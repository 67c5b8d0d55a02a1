//! The virtual node: one lower cluster registered as one Node of the upper cluster. Node
//! registration, status and lease; the pod sync controller; dependency reflectors; the capacity
//! tracker; and the kubelet backend that forwards to the lower cluster.
//!
//! Built on top of `tensile-core`.
#![forbid(unsafe_code)]

pub mod bootstrap;
pub mod clients;
pub mod copies;
pub mod copy_index;
pub mod creation;
pub mod kubelet_auth;
pub mod lower_backend;
mod lower_portforward;
pub mod lower_token;
pub mod mirror_events;
pub mod namespaces;
pub mod needs;
pub mod node;
pub mod node_ports;
pub mod pod_index;
pub mod pods;
pub mod reach;
pub mod sync_error;
pub mod sync_metrics;
pub mod tokens;
pub mod volumes;
pub mod watches;

pub use tensile_runtime::queue::Retry;

use std::net::SocketAddr;
use std::sync::Arc;

use tensile_runtime::{cache, events, metrics};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The kubelet API of the virtual node.
pub struct KubeletApi {
    /// Where to listen (the advertised port is the bound one).
    pub listen: SocketAddr,
    /// Serving certificate.
    pub cert: tensile_kubelet::ServingCert,
    /// CA of client certificates (the upper cluster's CA by default).
    pub client_ca: ClientCa,
    /// Authentication and authorization off (only when the operator asks for it).
    pub auth_disabled: bool,
    /// Bearer tokens are reviewed (`--authentication-token-webhook`); when false only client
    /// certificates authenticate.
    pub token_reviews: bool,
    /// How long review answers are cached (the kubelet's defaults, or its flags).
    pub review_ttls: tensile_core::guard::ReviewTtls,
    /// The upper client of TokenReviews and SubjectAccessReviews, with a rate limit of its own
    /// ([`clients::UpperClients::reviews`]): anyone who reaches the port makes them.
    pub reviews: kube::Client,
}

impl std::fmt::Debug for KubeletApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletApi")
            .field("listen", &self.listen)
            .field("client_ca", &self.client_ca)
            .field("auth_disabled", &self.auth_disabled)
            .field("token_reviews", &self.token_reviews)
            .field("review_ttls", &self.review_ttls)
            .finish_non_exhaustive()
    }
}

/// The CA client certificates on the kubelet API must chain to.
#[derive(Debug, Clone)]
pub enum ClientCa {
    /// PEM certificates (`--client-verify-ca`, or the upper cluster's `kube-root-ca.crt`).
    Pem(String),
    /// None could be read, for this reason: every client certificate is refused (tokens still
    /// work), which is logged as an error and recorded as a Warning event on the Node.
    Unavailable(String),
}

/// Prometheus metrics of the virtual node.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Registry with the caller's metrics (the clients' API call counters); the pod sync
    /// histograms are added to it.
    pub registry: prometheus_client::registry::Registry,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` over plain HTTP (`--metrics-addr`).
    pub listen: Option<SocketAddr>,
}

/// Starting the virtual node failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The kubelet API could not start.
    #[error(transparent)]
    Kubelet(#[from] tensile_kubelet::ServerError),
    /// The metrics listener could not start.
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
    /// Another process runs this node (holds its Lease), the lease could not be read, or the
    /// node was stopped while waiting for another holder's lease to lapse.
    #[error(transparent)]
    Lease(#[from] node::LeaseCheckError),
}

/// A started virtual node.
#[derive(Debug)]
pub struct Running {
    /// Ends when the node has stopped.
    pub handle: tokio::task::JoinHandle<()>,
    /// The kubelet API's address, if served.
    pub kubelet_addr: Option<SocketAddr>,
    /// The metrics listener's address, if served.
    pub metrics_addr: Option<SocketAddr>,
}

/// Everything a virtual node runs, wired together.
pub struct VirtualNode {
    /// The node loop settings.
    pub node: node::NodeLoop,
    /// The upper client of the node's Lease and status, with a rate limit of its own
    /// ([`clients::UpperClients::heartbeat`]): nothing else the node does can starve them.
    pub heartbeat: kube::Client,
    /// The pod controller settings.
    pub pods: pods::PodSettings,
    /// The kubelet API, if served.
    pub kubelet: Option<KubeletApi>,
    /// Metrics (registry and listener).
    pub metrics: Metrics,
    /// Mirror upper Services and Endpoints to the lower cluster (`ServiceControllers`), with
    /// this filter.
    pub services: Option<tensile_core::services::ServiceFilter>,
    /// Mirror lower volumes and claim bindings upstairs, and claim deletions downstairs
    /// (`PVControllers`).
    pub volumes: bool,
    /// With `services`, serve the node ports of NodePort and LoadBalancer Services on the
    /// node's InternalIP (`node_ports`), as kube-proxy does on every node.
    pub node_ports: bool,
}

impl std::fmt::Debug for VirtualNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtualNode")
            .field("node", &self.node)
            .field("pods", &self.pods)
            .field("kubelet", &self.kubelet)
            .field("metrics", &self.metrics)
            .field("volumes", &self.volumes)
            .field("node_ports", &self.node_ports)
            .finish_non_exhaustive()
    }
}

impl VirtualNode {
    /// Starts the kubelet API (its port is then advertised on the node), the capacity tracker,
    /// the node loop, the copy controllers, the event mirror and the pod controller; runs until
    /// `stop`. The one place a virtual node's tasks are started.
    pub async fn start(mut self, stop: CancellationToken) -> Result<Running, StartError> {
        // Before anything is served or written: a second process for the same node would
        // overwrite the first one's kubelet endpoint. An elected leader skips the check: the
        // election lease decided, and the node lease of a leader that died stays fresh for 40 s.
        if !self.node.leader_elected {
            node::check_lease(&self.heartbeat, &self.node, &stop).await?;
        }
        let mut registry = std::mem::take(&mut self.metrics.registry);
        let reach = reach::LowerReach::new(self.pods.lower_name.clone()).reported_in(&mut registry);
        let upper_pods = cache::CompactCache::<k8s_openapi::api::core::v1::Pod>::new();
        let lower_pods = cache::CompactCache::<k8s_openapi::api::core::v1::Pod>::new();
        let reader = upper_pods.clone();
        let backend = Arc::new(
            lower_backend::LowerBackend::new(
                self.pods.lower.clone(),
                self.pods.translate.owner.clone(),
                move || reader.state(),
            )
            .with_node_name(self.node.identity.name.clone())
            // Stats read our lower pods from the pod controller's watch, not a LIST per scrape.
            .with_lower_pods(lower_pods.clone())
            .with_reach(reach.clone()),
        );
        let sync_metrics = sync_metrics::SyncMetrics::new(&mut registry);
        registry.register_collector(Box::new(sync_metrics::PodCounts {
            upper: upper_pods.clone(),
            lower: lower_pods.clone(),
        }));
        let capacity_metrics = node::CapacityMetrics::new(&mut registry);
        let node_events = events::EventSink::start(
            self.pods.upper_events.clone(),
            "tensile-kube",
            &self.node.identity.name,
        );
        let mut start_check = None;
        let server = match self.kubelet.take() {
            Some(k) => {
                let (client_ca_pem, ca_problem) = match k.client_ca {
                    ClientCa::Pem(pem) => (Some(pem), None),
                    ClientCa::Unavailable(why) => (None, Some(why)),
                };
                let auth_watch = (!k.auth_disabled).then(|| {
                    kubelet_auth::KubeletAuthWatch::new(
                        &mut registry,
                        &self.node.identity.name,
                        node_events.clone(),
                    )
                });
                let auth = match &auth_watch {
                    None => tensile_kubelet::Auth::Disabled,
                    Some(w) => tensile_kubelet::Auth::Webhook(Box::new(
                        tensile_kubelet::WebhookAuth::new(
                            k.reviews.clone(),
                            self.node.identity.name.clone(),
                        )
                        .with_token_reviews(k.token_reviews)
                        .with_ttls(k.review_ttls)
                        .with_refusal_hook(w.hook()),
                    )),
                };
                let config = tensile_kubelet::KubeletServerConfig {
                    listen: k.listen,
                    cert: k.cert,
                    client_ca_pem,
                    auth,
                    streaming: tensile_kubelet::StreamingConfig::default(),
                };
                let server = tensile_kubelet::KubeletServer::start(config, backend.clone()).await?;
                self.node.identity.kubelet_port = i32::from(server.addr().port());
                start_check = auth_watch.map(|w| (w, ca_problem));
                Some(server)
            }
            None => None,
        };
        // After the kubelet API, whose refusal counters join the registry.
        let metrics_addr = match self.metrics.listen {
            Some(addr) => {
                // Ready once served: the listener starts after the kubelet API, and a standby
                // does not get here.
                let ready = metrics::Readiness::ready();
                Some(metrics::serve_probes(addr, Arc::new(registry), ready, stop.clone()).await?)
            }
            None => None,
        };
        if let Some((watch, ca_problem)) = start_check {
            kubelet_auth::check_at_start(
                self.pods.upper.clone(),
                watch,
                ca_problem,
                self.node.identity.kubelet_port,
                stop.clone(),
            );
        }
        let kubelet_addr = server.as_ref().map(tensile_kubelet::KubeletServer::addr);
        let (tx, rx) = watch::channel(Default::default());
        let lower = self.pods.lower.clone();
        let upper = self.pods.upper.clone();
        let [for_pods, for_capacity] =
            pods::lower_pod_events(lower.clone(), reach.subscribe(), stop.clone());
        let capacity = tokio::spawn(node::track_capacity(
            lower.clone(),
            self.node.owner.clone(),
            for_capacity,
            tx,
            capacity_metrics,
            stop.clone(),
        ));
        let shared = copies::SharedDependencies::new(
            upper.clone(),
            lower.clone(),
            self.pods.translate.owner.clone(),
            &stop,
        );
        let node_ports = self.node_port_address();
        let copies = tokio::spawn(copies::run(
            copies::CopySync {
                upper: upper.clone(),
                lower: lower.clone(),
                owner: self.pods.translate.owner.clone(),
                // The copies pods wait for are made here: as many at once as pods are.
                workers: self.pods.workers.max(4),
                services: self.services.take(),
                volumes: self.volumes.then(|| self.node.identity.name.clone()),
                node_ports,
                metrics: sync_metrics.clone(),
            },
            shared.clone(),
            stop.clone(),
        ));
        let node_loop = tokio::spawn(node::run_node(
            self.heartbeat.clone(),
            lower,
            self.node,
            rx,
            reach.clone(),
            node_events,
            stop.clone(),
        ));
        // Lower events are mirrored once both pod caches are complete (ours only, and only
        // the events of the very lower pod of an upper pod).
        let mirror = {
            let mirror = mirror_events::EventMirror {
                upper: self.pods.upper_events.clone(),
                lower: self.pods.lower.clone(),
                owner: self.pods.translate.owner.clone(),
                lower_cluster: self.pods.lower_name.clone(),
                metrics: sync_metrics.clone(),
            };
            let (upper_pods, lower_pods, stop) =
                (upper_pods.clone(), lower_pods.clone(), stop.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = futures::future::join(
                        upper_pods.wait_until_ready(),
                        lower_pods.wait_until_ready(),
                    ) => {}
                }
                mirror_events::run(mirror, upper_pods, lower_pods, stop).await;
            })
        };
        let pods = pods::PodController::new(
            self.pods,
            pods::PodWiring {
                upper_pods,
                lower_pods,
                shared,
                lower_events: futures::StreamExt::boxed(for_pods),
                metrics: sync_metrics,
                reach,
            },
            stop.clone(),
        );
        let pods = tokio::spawn(pods.run());
        let handle = tokio::spawn(async move {
            let _ = tokio::join!(capacity, node_loop, pods, copies, mirror);
            drop(server);
        });
        Ok(Running {
            handle,
            kubelet_addr,
            metrics_addr,
        })
    }

    /// Where the node ports are served: the node's InternalIP, when they are on (see
    /// [`Self::node_ports`]) and it is an address.
    fn node_port_address(&self) -> Option<(String, std::net::IpAddr)> {
        if !self.node_ports || self.services.is_none() {
            return None;
        }
        let name = self.node.identity.name.clone();
        match self.node.identity.internal_ip.parse() {
            Ok(ip) => Some((name, ip)),
            Err(_) => {
                tracing::warn!(node = %name, internal_ip = %self.node.identity.internal_ip, "the node has no InternalIP address: its node ports are not served");
                None
            }
        }
    }

    /// [`Self::start`] and wait until `stop`.
    pub async fn run(self, stop: CancellationToken) -> Result<(), StartError> {
        let running = self.start(stop).await?;
        let _ = running.handle.await;
        Ok(())
    }
}
