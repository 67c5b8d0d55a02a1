//! `tensile scheduler`: a kube-scheduler extender (HTTP `filter`, `prioritize` and `bind`) that
//! knows the lower clusters' real nodes, so the upper scheduler only sends a pod to a virtual node
//! whose lower cluster has a single node where it fits; other nodes pass unchanged.
//!
//! - The rules are [`tensile_core::extender`]'s; this module keeps their inputs live and serves
//!   them. Per lower cluster, one watch of nodes and one of pods feed a
//!   [`LowerCluster`] (never a LIST poll); a cluster whose two watches have not listed yet fails
//!   its virtual nodes with a reason instead of guessing.
//! - Upper nodes are classified by their labels: from the request (`nodeCacheCapable: false`,
//!   full nodes) or from one watch of upper nodes (names only).
//! - `/bind` is where room is promised: under the lock it re-checks the fit, counting every
//!   reservation, then reserves and POSTs the Binding. A reservation lasts until the lower pod
//!   (annotation `tensile-kube.io/upper-uid`) is seen, or its TTL lapses. So a burst of pods
//!   cannot over-commit a lower cluster, even while the upper scheduler's filter calls run ahead
//!   of its bindings.
//! - Reservations are also rebuilt from one watch of the upper pods that are bound and still
//!   Pending: a pod bound to a virtual node whose lower pod is not seen holds one. So a new
//!   leader (or a restarted extender) counts the pods its predecessor bound, and a pod deleted
//!   before its lower pod appeared frees its room at once.
//! - Split as an index and a thin HTTP layer: the index (`index.rs`) applies every watch's
//!   events and answers the decisions as values (a verdict per candidate node, where a bind
//!   goes, what it reserved), tested without clusters; this module reads requests, posts the
//!   Binding and writes the answers.
//!
//! Wire format: kube-scheduler's `k8s.io/kube-scheduler/extender/v1` types. They have no JSON
//! tags, so kube-scheduler sends Go field names (`Pod`, `Nodes`, `NodeNames`, `PodName`, ...)
//! and decodes answers case-insensitively; older senders used lowercase tags (`pod`,
//! `nodenames`). Requests are read with keys matched case-insensitively, as Go does; answers use
//! the historical tag names (`nodes`, `nodenames`, `failedNodes`, `failedAndUnresolvableNodes`,
//! `error`, `host`, `score`).

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tensile_core::extender::{Demand, Verdict, retry_error};
use tokio_util::sync::CancellationToken;

pub mod index;

use index::{BindTarget, Index, Reserved};

use crate::bounded::{self, Bounded, DecodeError, Key, Keys, Text};
use crate::metrics::{ExtenderMetrics, FilterOutcome};
use crate::serve::{
    ClientAuth, Handler, LiveCert, Reply, ServeError, Server, tls_config_clients, truncated,
};

/// kube-scheduler's own default for the TTL of an assumed pod is 15 minutes for a binding that
/// never comes back; a lower pod normally appears within a second of the upper binding, so two
/// minutes is ample and keeps a lost reservation from blocking room for long.
pub const DEFAULT_RESERVATION_TTL: Duration = Duration::from_secs(120);

/// The user kube-scheduler's client certificate names (kubeadm's `scheduler.conf`): the one
/// common name the extender accepts by default.
pub const KUBE_SCHEDULER_USER: &str = "system:kube-scheduler";

/// One lower cluster: the `clusterID` label value of its virtual node(s) and a client.
#[derive(Clone)]
pub struct LowerClusterClient {
    /// The `clusterID` label value.
    pub id: String,
    /// A client of the lower cluster (list and watch of nodes and pods).
    pub client: kube::Client,
}

impl std::fmt::Debug for LowerClusterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LowerClusterClient")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Largest extender request accepted. As shipped (`nodeCacheCapable: true`) kube-scheduler
/// sends the pod and the candidates' names: the pod is at most the 3 MiB the API server accepts
/// as a request (and 1.5 MiB once stored), and the names of at most [`MAX_CANDIDATE_NODES`]
/// nodes, each at most 253 bytes, are at most 3.7 MiB (~0.5 MiB with real names): 8 MiB holds
/// both. With `nodeCacheCapable: false` it sends the Nodes whole (10-15 KiB each with their 50
/// images): that fits up to ~400 candidates; larger clusters need names only.
pub const MAX_EXTENDER_ARGS: usize = 8 << 20;

/// Candidate nodes accepted in one request: kube-scheduler is tested up to 5 000 nodes and
/// some run 15 000. Each costs its name and two labels once read.
pub const MAX_CANDIDATE_NODES: usize = 15_000;

/// Filter and prioritize calls worked on at once. kube-scheduler calls them for one pod at a
/// time; each takes a millisecond or so, so they take turns (up to `serve::MAX_WAITING` wait)
/// rather than each holding up to an 8 MiB body and the pod decoded from it at the same time.
/// Binds, which wait on the API server, have places of their own (`serve::MAX_IO_BOUND`).
pub const MAX_CONCURRENT_CALLS: usize = 1;

/// What the extender needs.
pub struct ExtenderConfig {
    /// Upper cluster client: watches nodes, GETs a pod it has not seen, POSTs bindings.
    pub upper: kube::Client,
    /// The lower clusters.
    pub clusters: Vec<LowerClusterClient>,
    /// How long a reservation lasts when no lower pod shows up.
    pub reservation_ttl: Duration,
    /// Where to serve HTTPS.
    pub listen: SocketAddr,
    /// Serving certificate (replaced while serving when it comes from a Secret).
    pub cert: LiveCert,
    /// Which client certificates are accepted: kube-scheduler's `tlsConfig.certData`/`keyData`
    /// (or `certFile`/`keyFile`). Without it anyone who reaches the port can have pods bound,
    /// so [`start`] refuses a non-loopback address unless `insecure_without_client_auth`.
    pub client_auth: Option<ClientAuth>,
    /// Serve a non-loopback address without `client_auth` (`--insecure-serve-without-client-auth`).
    pub insecure_without_client_auth: bool,
    /// Request latencies and reservations are counted here.
    pub metrics: ExtenderMetrics,
}

impl std::fmt::Debug for ExtenderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtenderConfig")
            .field("clusters", &self.clusters)
            .field("reservation_ttl", &self.reservation_ttl)
            .field("listen", &self.listen)
            .finish_non_exhaustive()
    }
}

/// A running extender.
#[derive(Debug)]
pub struct Running {
    /// The bound address.
    pub addr: SocketAddr,
    /// The CA clients verify it with (an extender's `tlsConfig.caData`).
    pub ca_pem: String,
    /// A handle on its state.
    pub extender: Extender,
    /// Ends when it has stopped.
    pub handle: tokio::task::JoinHandle<()>,
}

/// Starts the watches and the HTTPS server; runs until `stop`.
pub async fn start(cfg: ExtenderConfig, stop: CancellationToken) -> Result<Running, ServeError> {
    if cfg.client_auth.is_none() && !cfg.listen.ip().is_loopback() {
        if !cfg.insecure_without_client_auth {
            return Err(ServeError::Unauthenticated(format!(
                "the scheduler extender would let anyone who reaches {} bind pods: give \
                 --client-ca-file (the CA of kube-scheduler's client certificate, its \
                 tlsConfig.certData), listen on a loopback address, or pass \
                 --insecure-serve-without-client-auth",
                cfg.listen
            )));
        }
        tracing::warn!(
            listen = %cfg.listen,
            "--insecure-serve-without-client-auth: the scheduler extender verifies no client \
             certificates; whoever reaches it can have pods bound"
        );
    }
    let tls = tls_config_clients(&cfg.cert, cfg.client_auth.as_ref())?;
    let extender = Extender::with_metrics(
        cfg.upper.clone(),
        cfg.clusters.iter().map(|c| c.id.clone()),
        cfg.reservation_ttl,
        cfg.metrics,
    );
    let server = Server::start(cfg.listen, tls, Arc::new(extender.clone())).await?;
    let addr = server.addr();
    let mut tasks = Vec::new();
    for cluster in cfg.clusters {
        tasks.push(tokio::spawn(watch_lower_nodes(
            extender.clone(),
            cluster.clone(),
            stop.clone(),
        )));
        tasks.push(tokio::spawn(watch_lower_pods(
            extender.clone(),
            cluster,
            stop.clone(),
        )));
    }
    tasks.push(tokio::spawn(watch_upper_nodes(
        extender.clone(),
        cfg.upper.clone(),
        stop.clone(),
    )));
    tasks.push(tokio::spawn(watch_bound_upper_pods(
        extender.clone(),
        cfg.upper,
        stop.clone(),
    )));
    let handle = tokio::spawn(async move {
        stop.cancelled().await;
        for task in tasks {
            let _ = task.await;
        }
        drop(server);
    });
    tracing::info!(%addr, "scheduler extender serving");
    Ok(Running {
        addr,
        ca_pem: cfg.cert.current().ca_pem,
        extender,
        handle,
    })
}

/// The extender's state and request handler; cheap to clone, clones share everything.
#[derive(Clone)]
pub struct Extender {
    shared: Arc<ExtenderState>,
}

impl std::fmt::Debug for Extender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extender").finish_non_exhaustive()
    }
}

struct ExtenderState {
    upper: kube::Client,
    metrics: ExtenderMetrics,
    index: Mutex<Index>,
    /// Told when the upper node watch has listed (a bound pod's cluster is its node's).
    upper_nodes_listed: tokio::sync::Notify,
}

impl Extender {
    /// An extender for the given cluster ids, nothing synced yet.
    pub fn new(
        upper: kube::Client,
        clusters: impl IntoIterator<Item = String>,
        ttl: Duration,
    ) -> Self {
        Self::with_metrics(upper, clusters, ttl, ExtenderMetrics::default())
    }

    /// [`Extender::new`], counting in `metrics`.
    pub fn with_metrics(
        upper: kube::Client,
        clusters: impl IntoIterator<Item = String>,
        ttl: Duration,
        metrics: ExtenderMetrics,
    ) -> Self {
        Self {
            shared: Arc::new(ExtenderState {
                upper,
                metrics,
                index: Mutex::new(Index::new(clusters, ttl)),
                upper_nodes_listed: tokio::sync::Notify::new(),
            }),
        }
    }

    fn index(&self) -> MutexGuard<'_, Index> {
        lock(&self.shared.index)
    }

    /// Whether every lower cluster's watches (and the upper node watch) have listed.
    pub fn synced(&self) -> bool {
        self.index().synced()
    }

    /// Whether the upper node watch has seen the node `name`.
    pub fn knows_upper_node(&self, name: &str) -> bool {
        self.index().knows_upper_node(name)
    }

    /// Sets every cluster's reservations gauge and rooms-built counter from `index`.
    fn publish_cluster_metrics(&self, index: &Index) {
        for (id, count) in index.reservation_counts() {
            self.shared.metrics.set_reservations(id, count);
        }
        for (id, total) in index.rooms_built() {
            self.shared.metrics.set_rooms_built(id, total);
        }
    }

    /// How many reservations `cluster` holds now.
    pub fn reservations(&self, cluster: &str) -> usize {
        let mut index = self.index();
        index.expire(Instant::now());
        index.reservations(cluster)
    }

    async fn filter_or_prioritize(&self, verb: Verb, body: &[u8]) -> Reply {
        let (reply, outcome) = answer_call(&self.shared.index, verb, body, Instant::now());
        if let Some(outcome) = outcome {
            self.shared.metrics.filtered(outcome);
        }
        reply
    }

    async fn bind(&self, body: &[u8]) -> Reply {
        let args = match BindingArgs::parse(body) {
            Ok(a) => a,
            Err(e) => return Reply::error(StatusCode::BAD_REQUEST, &e),
        };
        let answer = |error: String| {
            if !error.is_empty() {
                tracing::debug!(pod = %format!("{}/{}", args.namespace, args.name), node = %args.node, %error, "extender refused to bind");
            }
            Reply::json(&json!({"error": error}))
        };
        match self.bind_pod(&args).await {
            Ok(()) => answer(String::new()),
            Err(e) => answer(e),
        }
    }

    async fn bind_pod(&self, args: &BindingArgs) -> Result<(), String> {
        let pods: Api<Pod> = Api::namespaced(self.shared.upper.clone(), &args.namespace);
        let key = format!("{}/{}", args.namespace, args.name);
        let target = self.index().bind_target(&args.node, args.uid.as_deref())?;
        let mut uid = args.uid.clone();
        let mut reserved = false;
        if let BindTarget::Cluster { id, demand: known } = target {
            // The pod's demand: from its filter call, or read once from the upper cluster.
            let demand = match known {
                Some(d) => *d,
                None => {
                    let pod = pods
                        .get(&args.name)
                        .await
                        .map_err(|e| format!("reading pod {key}: {e}"))?;
                    let actual = pod.metadata.uid.clone().unwrap_or_default();
                    if let Some(expected) = &uid
                        && *expected != actual
                    {
                        return Err(format!(
                            "pod {key} has UID {actual}, not {expected}: it was replaced"
                        ));
                    }
                    uid = Some(actual);
                    Demand::of_upper_pod(&pod).map_err(|e| e.to_string())?
                }
            };
            let uid = uid.clone().unwrap_or_default();
            if let Reserved::Room { lower_node } =
                self.index().reserve(&id, &uid, demand, Instant::now())?
            {
                tracing::debug!(pod = %key, cluster = %id, %lower_node, "room reserved");
                reserved = true;
            }
        }
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(args.name.clone()),
                namespace: Some(args.namespace.clone()),
                uid: uid.clone(),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(args.node.clone()),
                ..ObjectReference::default()
            },
        };
        let posted: Result<Value, kube::Error> = pods
            .create_subresource("binding", &args.name, &PostParams::default(), &binding)
            .await;
        if let Err(e) = posted {
            if let Some(uid) = &uid
                && reserved
            {
                self.index().release(uid);
            }
            return Err(format!("binding pod {key} to node {}: {e}", args.node));
        }
        tracing::debug!(pod = %key, node = %args.node, "bound");
        Ok(())
    }

    fn on_lower_pod(&self, id: &str, event: &watcher::Event<Pod>) {
        let mut index = self.index();
        if index.apply_lower_pod(id, event) {
            self.publish_cluster_metrics(&index);
        }
    }

    fn on_upper_node(&self, event: &watcher::Event<Node>) {
        if self.index().apply_upper_node(event) {
            self.shared.upper_nodes_listed.notify_waiters();
        }
    }

    fn on_bound_upper_pod(&self, event: &watcher::Event<Pod>) {
        let mut index = self.index();
        if index.apply_bound_upper_pod(event, Instant::now()) {
            self.publish_cluster_metrics(&index);
        }
    }
}

/// The calls the extender judges a pod's candidates in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `/filter`: which candidates the pod fits on.
    Filter,
    /// `/prioritize`: a score per candidate.
    Prioritize,
}

fn lock(index: &Mutex<Index>) -> MutexGuard<'_, Index> {
    // A panic while holding the lock leaves consistent-enough bookkeeping; keep serving.
    index.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The answer to a filter or prioritize call's `body`, judged by `index` at `now`, and how a
/// filter call is counted: no I/O, so it is tested and fuzzed (`fuzz/`) without a server. The
/// index is locked only while the candidates are judged.
pub fn answer_call(
    index: &Mutex<Index>,
    verb: Verb,
    body: &[u8],
    now: Instant,
) -> (Reply, Option<FilterOutcome>) {
    let args = match ExtenderArgs::parse(body) {
        Ok(a) => a,
        Err(e) => return (Reply::error(StatusCode::BAD_REQUEST, &e), None),
    };
    let pod_name = args.pod_name();
    let verdicts = lock(index).judge_pod(
        &args.pod,
        args.nodes
            .iter()
            .map(|n| (n.name.as_str(), n.labels.as_ref().map(Option::as_ref))),
        now,
    );
    let mut kept = Vec::new();
    let mut failed = serde_json::Map::new();
    let mut unresolvable = serde_json::Map::new();
    let mut scores = Vec::new();
    let mut refused = Vec::new();
    for (node, verdict) in args.nodes.iter().zip(verdicts) {
        tracing::debug!(pod = %pod_name, node = %node.name, ?verb, ?verdict, "extender decision");
        match (verb, verdict) {
            (Verb::Filter, verdict) => match verdict.as_ref().and_then(Verdict::refusal) {
                None => kept.push(node),
                Some((reason, u)) => {
                    let target = if u { &mut unresolvable } else { &mut failed };
                    target.insert(node.name.clone(), Value::String(reason.to_owned()));
                    if let Some(verdict) = verdict {
                        refused.push((node.name.as_str(), verdict));
                    }
                }
            },
            (Verb::Prioritize, Some(Verdict::Fits { score, .. })) => {
                scores.push(json!({"host": node.name, "score": score}));
            }
            (Verb::Prioritize, _) => scores.push(json!({"host": node.name, "score": 0})),
        }
    }
    match verb {
        Verb::Prioritize => (Reply::json(&Value::Array(scores)), None),
        Verb::Filter => {
            let retry = retry_error(kept.len(), refused.iter().map(|(n, v)| (*n, v)));
            let outcome = match (&retry, kept.is_empty()) {
                (Some(_), _) => FilterOutcome::Retry,
                (None, true) => FilterOutcome::None,
                (None, false) => FilterOutcome::Some,
            };
            if let Some(error) = retry {
                let reply = Reply::json(&FilterAnswer {
                    nodes: None,
                    nodenames: None,
                    failed_nodes: serde_json::Map::new(),
                    failed_and_unresolvable_nodes: serde_json::Map::new(),
                    error: &error,
                });
                return (reply, Some(outcome));
            }
            let (nodes, nodenames) = if args.names_only {
                (None, Some(kept.iter().map(|n| n.name.as_str()).collect()))
            } else {
                let items = kept.iter().filter_map(|n| n.object).collect();
                (
                    Some(NodeListAnswer {
                        metadata: serde_json::Map::new(),
                        items,
                    }),
                    None,
                )
            };
            // Sized up front: the nodes kept may be most of the request.
            let size = kept
                .iter()
                .map(|n| n.object.map_or(n.name.len() + 3, |o| o.get().len() + 1))
                .sum::<usize>();
            let reply = Reply::json_sized(
                &FilterAnswer {
                    nodes,
                    nodenames,
                    failed_nodes: failed,
                    failed_and_unresolvable_nodes: unresolvable,
                    error: "",
                },
                size + (4 << 10),
            );
            (reply, Some(outcome))
        }
    }
}

/// The verb a request path names: its last segment.
fn verb_of(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
}

impl Handler for Extender {
    /// See [`MAX_EXTENDER_ARGS`].
    fn max_body(&self) -> usize {
        MAX_EXTENDER_ARGS
    }

    fn max_concurrent(&self) -> usize {
        MAX_CONCURRENT_CALLS
    }

    /// A bind is one Binding write (and a pod read when its filter call was not seen): it
    /// waits on the API server, its body is a few names.
    fn waits_on_io(&self, path: &str) -> bool {
        verb_of(path) == "bind"
    }

    /// One large body at a time: only kube-scheduler's certificate gets as far as sending one
    /// (the TLS handshake refuses everyone else), and its calls are a few KiB.
    fn large_bodies(&self) -> usize {
        1
    }

    fn handle(&self, path: &str, body: Bytes) -> Pin<Box<dyn Future<Output = Reply> + Send + '_>> {
        let verb = verb_of(path).to_owned();
        Box::pin(async move {
            let started = Instant::now();
            let (label, reply) = match verb.as_str() {
                "filter" => (
                    "filter",
                    self.filter_or_prioritize(Verb::Filter, &body).await,
                ),
                "prioritize" => (
                    "prioritize",
                    self.filter_or_prioritize(Verb::Prioritize, &body).await,
                ),
                "bind" => ("bind", self.bind(&body).await),
                _ => {
                    return Reply::error(
                        StatusCode::NOT_FOUND,
                        &format!(
                            "{:?}: the extender serves filter, prioritize and bind",
                            truncated(&verb, 64)
                        ),
                    );
                }
            };
            self.shared.metrics.observe(label, started.elapsed());
            // Every verb may have expired, placed or released reservations.
            self.publish_cluster_metrics(&self.index());
            reply
        })
    }
}

/// The watch's items, telling `ext` which errors mean lower cluster `id` is unreachable.
fn noting_outages<K>(
    ext: Extender,
    id: String,
    stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send {
    use futures::StreamExt as _;
    stream.inspect(move |item| {
        if let Err(e) = item {
            ext.index().lower_watch_failed(&id, e, Instant::now());
        }
    })
}

async fn watch_lower_nodes(ext: Extender, cluster: LowerClusterClient, stop: CancellationToken) {
    let stream = noting_outages(
        ext.clone(),
        cluster.id.clone(),
        tensile_runtime::backoff::watch(
            Api::<Node>::all(cluster.client.clone()),
            watcher::Config::default(),
        ),
    );
    let what = format!("lower nodes of {}", cluster.id);
    tensile_runtime::backoff::drain(Box::pin(stream), &stop, &what, |e| {
        ext.index().apply_lower_node(&cluster.id, &e);
    })
    .await;
}

async fn watch_lower_pods(ext: Extender, cluster: LowerClusterClient, stop: CancellationToken) {
    let stream = noting_outages(
        ext.clone(),
        cluster.id.clone(),
        tensile_runtime::backoff::watch(
            Api::<Pod>::all(cluster.client.clone()),
            watcher::Config::default(),
        ),
    );
    let what = format!("lower pods of {}", cluster.id);
    tensile_runtime::backoff::drain(Box::pin(stream), &stop, &what, |e| {
        ext.on_lower_pod(&cluster.id, &e);
    })
    .await;
}

async fn watch_upper_nodes(ext: Extender, upper: kube::Client, stop: CancellationToken) {
    let stream =
        tensile_runtime::backoff::watch(Api::<Node>::all(upper), watcher::Config::default());
    tensile_runtime::backoff::drain(Box::pin(stream), &stop, "upper nodes", |e| {
        ext.on_upper_node(&e);
    })
    .await;
}

/// The upper pods bound to a node and still Pending (few: they leave the selection once Running).
async fn watch_bound_upper_pods(ext: Extender, upper: kube::Client, stop: CancellationToken) {
    // Their cluster is their node's: wait until the upper nodes have listed.
    loop {
        let listed = ext.shared.upper_nodes_listed.notified();
        if ext.index().upper_listed() {
            break;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = listed => {}
        }
    }
    let stream = tensile_runtime::backoff::watch(
        Api::<Pod>::all(upper),
        watcher::Config::default().fields("status.phase=Pending,spec.nodeName!="),
    );
    tensile_runtime::backoff::drain(Box::pin(stream), &stop, "bound upper pods", |e| {
        ext.on_bound_upper_pod(&e);
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Wire types

/// A candidate node of `ExtenderArgs`.
struct CandidateNode<'a> {
    name: String,
    /// Its labels when the full node was sent (`Some(None)`: a node without labels); `None`
    /// when only its name was. Only the labels that say which lower cluster it stands for.
    labels: Option<Option<BTreeMap<String, String>>>,
    /// The node as sent (its JSON in the request body), echoed back when it passes:
    /// kube-scheduler versions before 1.30 use the nodes of the answer as they come.
    object: Option<&'a RawValue>,
}

/// `ExtenderArgs {Pod, Nodes, NodeNames}`.
struct ExtenderArgs<'a> {
    pod: Pod,
    nodes: Vec<CandidateNode<'a>>,
    names_only: bool,
}

/// `Nodes` as read: each node's JSON, not decoded.
#[derive(serde::Deserialize)]
struct WireNodeList<'a> {
    #[serde(default, alias = "Items", borrow)]
    items: Option<Bounded<&'a RawValue, MAX_CANDIDATE_NODES>>,
}

#[derive(Default, serde::Deserialize)]
#[serde(default)]
struct WireNode {
    metadata: Option<WireNodeMeta>,
}

#[derive(Default, serde::Deserialize)]
#[serde(default)]
struct WireNodeMeta {
    name: Option<String>,
    labels: Option<ClusterLabels>,
}

/// The labels of a node that say which lower cluster it stands for; others are skipped.
struct ClusterLabels(BTreeMap<String, String>);

impl<'de> serde::Deserialize<'de> for ClusterLabels {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ClusterLabels;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of labels")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ClusterLabels, A::Error> {
                let mut kept = BTreeMap::new();
                while let Some(Key(key)) = map.next_key()? {
                    if key == tensile_core::keys::LABEL_NODE_TYPE
                        || key == tensile_core::keys::LABEL_CLUSTER_ID
                    {
                        kept.insert(key, map.next_value::<String>()?);
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(ClusterLabels(kept))
            }
        }
        d.deserialize_map(V)
    }
}

/// `ExtenderFilterResult`, with the historical tag names.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct FilterAnswer<'a> {
    nodes: Option<NodeListAnswer<'a>>,
    #[serde(rename = "nodenames")]
    nodenames: Option<Vec<&'a str>>,
    failed_nodes: serde_json::Map<String, Value>,
    failed_and_unresolvable_nodes: serde_json::Map<String, Value>,
    error: &'a str,
}

/// The nodes kept, written as they were sent.
#[derive(serde::Serialize)]
struct NodeListAnswer<'a> {
    metadata: serde_json::Map<String, Value>,
    items: Vec<&'a RawValue>,
}

/// Refuses a name longer than Kubernetes allows (`max`: 253 for a DNS subdomain, 63 for a
/// label, 128 for a UID, generously): what a request names is logged and kept, and must not
/// be megabytes long.
fn short(what: &str, member: &str, value: &str, max: usize) -> Result<(), String> {
    if value.len() > max {
        return Err(format!(
            "malformed {what}: {member} is {} bytes long, more than {max}",
            value.len()
        ));
    }
    Ok(())
}

/// The reason for a body that is not what `what` should be.
fn malformed(what: &str, body: &[u8], member: &str, e: DecodeError) -> String {
    let object = body
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{');
    match e {
        DecodeError::Syntax(e) => format!("malformed {what}: not JSON: {e}"),
        DecodeError::Data(_) if !object => format!("malformed {what}: expected a JSON object"),
        DecodeError::Data(e) => format!("malformed {what}: {member}{e}"),
    }
}

impl<'a> ExtenderArgs<'a> {
    /// Reads the pod (walked first: bounded), then the candidates' names and cluster labels,
    /// typed; nothing else of the body is kept (nodes stay in it, referred to).
    fn parse(body: &'a [u8]) -> Result<Self, String> {
        let bad = |member: &'static str| move |e| malformed("ExtenderArgs", body, member, e);
        bounded::check_at(body, &["pod"], Keys::AnyCase, bounded::POD_SHAPE)
            .map_err(bad("Pod: "))?;
        let pod: Pod = bounded::at(body, &["pod"], Keys::AnyCase)
            .map_err(bad("Pod: "))?
            .ok_or("malformed ExtenderArgs: no Pod")?;
        let meta = &pod.metadata;
        for (member, value, max) in [
            ("Pod.metadata.name", &meta.name, 253),
            ("Pod.metadata.namespace", &meta.namespace, 63),
            ("Pod.metadata.uid", &meta.uid, 128),
        ] {
            short(
                "ExtenderArgs",
                member,
                value.as_deref().unwrap_or_default(),
                max,
            )?;
        }
        if let Some(list) = bounded::at::<WireNodeList<'_>>(body, &["nodes"], Keys::AnyCase)
            .map_err(bad("Nodes: "))?
        {
            let nodes = list
                .items
                .map(|i| i.0)
                .unwrap_or_default()
                .into_iter()
                .map(|raw| {
                    let node: WireNode = serde_json::from_str(raw.get()).map_err(|e| {
                        format!("malformed ExtenderArgs: a node of Nodes.items: {e}")
                    })?;
                    let meta = node.metadata.unwrap_or_default();
                    let name = meta
                        .name
                        .filter(|s| !s.is_empty())
                        .ok_or("malformed ExtenderArgs: a node of Nodes.items has no name")?;
                    short("ExtenderArgs", "a node name", &name, 253)?;
                    Ok(CandidateNode {
                        name,
                        labels: Some(meta.labels.map(|l| l.0)),
                        object: Some(raw),
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            return Ok(Self {
                pod,
                nodes,
                names_only: false,
            });
        }
        if let Some(names) =
            bounded::at::<Bounded<String, MAX_CANDIDATE_NODES>>(body, &["nodeNames"], Keys::AnyCase)
                .map_err(bad("NodeNames: "))?
        {
            for name in &names.0 {
                short("ExtenderArgs", "a node name", name, 253)?;
            }
            return Ok(Self {
                pod,
                nodes: names
                    .0
                    .into_iter()
                    .map(|name| CandidateNode {
                        name,
                        labels: None,
                        object: None,
                    })
                    .collect(),
                names_only: true,
            });
        }
        Err("malformed ExtenderArgs: neither Nodes nor NodeNames is set".into())
    }

    fn pod_name(&self) -> String {
        format!(
            "{}/{}",
            truncated(
                self.pod.metadata.namespace.as_deref().unwrap_or_default(),
                63
            ),
            truncated(self.pod.metadata.name.as_deref().unwrap_or_default(), 253)
        )
    }
}

/// `ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node}`, as read by
/// [`BindingArgs::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingArgs {
    /// `PodName`.
    pub name: String,
    /// `PodNamespace` (`default` when absent or empty).
    pub namespace: String,
    /// `PodUID`, when sent.
    pub uid: Option<String>,
    /// `Node`.
    pub node: String,
}

/// The four members of `ExtenderBindingArgs`, keys in any case, anything else skipped.
#[derive(Default)]
struct WireBinding {
    name: Text,
    namespace: Text,
    uid: Text,
    node: Text,
}

impl<'de> serde::Deserialize<'de> for WireBinding {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = WireBinding;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<WireBinding, A::Error> {
                let mut out = WireBinding::default();
                while let Some(Key(key)) = map.next_key()? {
                    let slot = match key.to_ascii_lowercase().as_str() {
                        "podname" => &mut out.name,
                        "podnamespace" => &mut out.namespace,
                        "poduid" => &mut out.uid,
                        "node" => &mut out.node,
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                            continue;
                        }
                    };
                    *slot = map.next_value()?;
                }
                Ok(out)
            }
        }
        d.deserialize_map(V)
    }
}

impl BindingArgs {
    /// Reads a `/bind` body: `Err` (400) with the reason when it is not one.
    pub fn parse(body: &[u8]) -> Result<Self, String> {
        let args: WireBinding = serde_json::from_slice(body)
            .map_err(|e| malformed("ExtenderBindingArgs", body, "", DecodeError::from(e)))?;
        let text = |key: &str, value: Text| -> Result<Option<String>, String> {
            match value {
                Text::Absent => Ok(None),
                Text::Str(s) => Ok(Some(s).filter(|s| !s.is_empty())),
                Text::Other => Err(format!(
                    "malformed ExtenderBindingArgs: {key} is not a string"
                )),
            }
        };
        let required = |key: &str, value: Text| {
            text(key, value)?
                .ok_or_else(|| format!("malformed ExtenderBindingArgs: {key} is required"))
        };
        let parsed = Self {
            name: required("PodName", args.name)?,
            namespace: text("PodNamespace", args.namespace)?
                .unwrap_or_else(|| "default".to_owned()),
            uid: text("PodUID", args.uid)?,
            node: required("Node", args.node)?,
        };
        for (member, value, max) in [
            ("PodName", parsed.name.as_str(), 253),
            ("PodNamespace", parsed.namespace.as_str(), 63),
            ("PodUID", parsed.uid.as_deref().unwrap_or_default(), 128),
            ("Node", parsed.node.as_str(), 253),
        ] {
            short("ExtenderBindingArgs", member, value, max)?;
        }
        Ok(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_are_read_with_go_or_tag_casing() {
        let go = br#"{"Pod": {"metadata": {"name": "p", "namespace": "ns"}}, "Nodes": null, "NodeNames": ["a", "b"]}"#;
        let a = ExtenderArgs::parse(go).unwrap();
        assert!(a.names_only);
        assert_eq!(a.nodes.len(), 2);
        let tags = br#"{"pod": {"metadata": {"name": "p"}}, "nodes": {"items": [{"metadata": {"name": "vk", "labels": {"type": "virtual-kubelet"}}}]}}"#;
        let a = ExtenderArgs::parse(tags).unwrap();
        assert!(!a.names_only);
        assert_eq!(a.nodes[0].name, "vk");
        assert!(matches!(&a.nodes[0].labels, Some(Some(l)) if l.len() == 1));
    }

    #[test]
    fn malformed_args_say_what_is_wrong() {
        for (body, expected) in [
            (&b"{"[..], "not JSON"),
            (b"[]", "expected a JSON object"),
            (b"{}", "no Pod"),
            (br#"{"Pod": {"spec": 3}, "NodeNames": []}"#, "Pod:"),
            (br#"{"Pod": {}}"#, "neither Nodes nor NodeNames"),
            (
                br#"{"Pod": {}, "NodeNames": [1]}"#,
                "NodeNames: invalid type: integer `1`",
            ),
            (br#"{"Pod": {}, "Nodes": {"items": [{}]}}"#, "has no name"),
        ] {
            let err = ExtenderArgs::parse(body).err().unwrap();
            assert!(
                err.contains(expected),
                "{err} for {:?}",
                String::from_utf8_lossy(body)
            );
        }
        // What a request names is logged: no name longer than Kubernetes allows.
        let long = "n".repeat(300);
        let body = format!(r#"{{"PodName": "{long}", "Node": "vk"}}"#);
        let err = BindingArgs::parse(body.as_bytes()).err().unwrap();
        assert_eq!(
            err,
            "malformed ExtenderBindingArgs: PodName is 300 bytes long, more than 253"
        );
        let body = format!(r#"{{"Pod": {{}}, "NodeNames": ["{long}"]}}"#);
        let err = ExtenderArgs::parse(body.as_bytes()).err().unwrap();
        assert!(err.contains("a node name is 300 bytes long"), "{err}");
        let err = BindingArgs::parse(br#"{"PodName": "p"}"#).err().unwrap();
        assert_eq!(err, "malformed ExtenderBindingArgs: Node is required");
        let b = BindingArgs::parse(
            br#"{"podName": "p", "podNamespace": "ns", "podUID": "u", "node": "vk"}"#,
        )
        .unwrap();
        assert_eq!(
            (
                b.name.as_str(),
                b.namespace.as_str(),
                b.uid.as_deref(),
                b.node.as_str()
            ),
            ("p", "ns", Some("u"), "vk")
        );
    }
}
