//! The extender's state as an index: it applies the watch events of every lower cluster's
//! nodes and pods, of the upper nodes and of the bound Pending upper pods, and answers the
//! decisions as values: a verdict per candidate node for `filter`/`prioritize`, where a pod may
//! be bound and whether room is reserved for it for `bind`. It makes no calls: the HTTP layer
//! (`super`) reads requests, executes the binding and writes answers. The rules of one
//! cluster's room are `tensile_core::extender`'s; what is tested here is how events and
//! requests change them (a reservation released when its lower pod appears, an unreachable
//! cluster filtered out, reservations rebuilt from bound pods after a restart).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher;
use tensile_core::extender::{
    Demand, LowerCluster, Outage, Reservations, RoomMemo, Verdict, cluster_of,
};
use tensile_runtime::cache::ListedKeys;

use crate::serve::truncated;

/// Pods whose demand is remembered from filter/prioritize for their `/bind`, at most; beyond
/// it the oldest are forgotten first (as are those older than the reservation TTL). A `/bind`
/// without its pod's demand is still judged (`BindTarget::Cluster` with no demand).
const RECENT_MAX: usize = 16_384;

#[derive(Debug)]
struct ClusterState {
    lower: LowerCluster,
    nodes: ListedKeys,
    pods: ListedKeys,
    /// The room after the pending lower pods and the reservations, and the verdicts it gave,
    /// kept from one request to the next while they hold.
    room: Option<RoomMemo>,
    /// Whether its watches reach it: an unreachable cluster gets no pods, whatever its last
    /// known room (they would wait there until it is back).
    outage: Outage,
}

impl ClusterState {
    fn synced(&self) -> bool {
        self.nodes.synced() && self.pods.synced()
    }
}

/// How an upper node is judged.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Judged {
    /// Not a virtual node, no clusterID, or an unknown cluster: passes unchanged.
    Pass,
    /// Its lower cluster decides.
    Cluster(String),
    /// Cannot tell yet: fails with this reason.
    Unknown(String),
}

/// Where a `/bind` goes, before anything is reserved.
#[derive(Debug, PartialEq)]
pub enum BindTarget {
    /// A node no lower cluster decides: bound as asked, nothing reserved.
    Unjudged,
    /// A virtual node of this lower cluster; the pod's demand when a filter call showed it.
    Cluster {
        id: String,
        demand: Option<Box<Demand>>,
    },
}

/// What `/bind` reserved.
#[derive(Debug, PartialEq, Eq)]
pub enum Reserved {
    /// Room on this lower node, until the lower pod shows up or the TTL lapses.
    Room { lower_node: String },
    /// Nothing: the pod's lower pod exists already (a repeated bind).
    AlreadyThere,
}

/// A pod's demand as a filter or prioritize call worked it out.
#[derive(Debug)]
struct Recent {
    /// The pod's `resourceVersion` then: the demand holds while it does.
    version: String,
    demand: Demand,
    seen: Instant,
}

/// The extender's state.
#[derive(Debug)]
pub struct Index {
    clusters: BTreeMap<String, ClusterState>,
    reservations: Reservations,
    /// Upper nodes from the watch: name -> the cluster id it is judged by (None: passes).
    upper_nodes: HashMap<String, Option<String>>,
    upper_listed: ListedKeys,
    /// Upper nodes seen in filter/prioritize requests (full nodes), for `/bind`.
    learned_nodes: HashMap<String, Option<String>>,
    /// Demands of upper pods seen in filter/prioritize, by UID, for `/bind`.
    recent: HashMap<String, Recent>,
    /// `recent`'s UIDs in the order remembered, with when: forgetting the old ones takes
    /// from the front, never a scan of them all (a burst remembers thousands within a TTL).
    recent_order: VecDeque<(Instant, String)>,
    /// How long a reservation lasts when no lower pod shows up.
    ttl: Duration,
}

impl Index {
    /// An index of the given lower clusters, nothing listed yet.
    pub fn new(clusters: impl IntoIterator<Item = String>, ttl: Duration) -> Self {
        let clusters = clusters
            .into_iter()
            .map(|id| {
                (
                    id,
                    ClusterState {
                        lower: LowerCluster::new(),
                        nodes: ListedKeys::default(),
                        pods: ListedKeys::default(),
                        room: None,
                        outage: Outage::default(),
                    },
                )
            })
            .collect();
        Self {
            clusters,
            reservations: Reservations::new(),
            upper_nodes: HashMap::new(),
            upper_listed: ListedKeys::default(),
            learned_nodes: HashMap::new(),
            recent: HashMap::new(),
            recent_order: VecDeque::new(),
            ttl,
        }
    }

    /// Whether every lower cluster's watches (and the upper node watch) have listed.
    pub fn synced(&self) -> bool {
        self.upper_listed.synced() && self.clusters.values().all(ClusterState::synced)
    }

    /// Whether the upper node watch has listed.
    pub fn upper_listed(&self) -> bool {
        self.upper_listed.synced()
    }

    /// Whether the upper node watch has seen the node `name`.
    pub fn knows_upper_node(&self, name: &str) -> bool {
        self.upper_nodes.contains_key(name)
    }

    /// Drops the reservations whose TTL lapsed at `now`.
    pub fn expire(&mut self, now: Instant) {
        for (uid, cluster) in self.reservations.expire(now) {
            tracing::debug!(%uid, %cluster, "reservation lapsed without a lower pod");
        }
    }

    /// How many reservations each cluster holds.
    pub fn reservation_counts(&self) -> impl Iterator<Item = (&str, usize)> {
        self.clusters
            .keys()
            .map(|id| (id.as_str(), self.reservations.count(id)))
    }

    /// How many rooms each cluster built from scratch (the other verdicts came from a kept
    /// room: see `tensile_core::extender::RoomMemo`).
    pub fn rooms_built(&self) -> impl Iterator<Item = (&str, u64)> {
        self.clusters
            .iter()
            .map(|(id, c)| (id.as_str(), c.lower.rooms_built()))
    }

    /// How many reservations `cluster` holds.
    pub fn reservations(&self, cluster: &str) -> usize {
        self.reservations.count(cluster)
    }

    fn judge(&self, name: &str, labels: Option<Option<&BTreeMap<String, String>>>) -> Judged {
        let id = match labels {
            Some(labels) => cluster_of(labels).map(str::to_owned),
            None => match self
                .upper_nodes
                .get(name)
                .or_else(|| self.learned_nodes.get(name))
            {
                Some(id) => id.clone(),
                None => {
                    return Judged::Unknown(format!(
                        "upper node {name} is not known to the tensile extender yet{}",
                        if self.upper_listed.synced() {
                            ""
                        } else {
                            " (its node watch has not listed)"
                        }
                    ));
                }
            },
        };
        match id {
            Some(id) if self.clusters.contains_key(&id) => Judged::Cluster(id),
            _ => Judged::Pass,
        }
    }

    /// The verdict of cluster `id` for a pod (`uid` leaves out its own reservation).
    fn verdict(
        &mut self,
        id: &str,
        uid: Option<&str>,
        demand: &Result<Demand, String>,
        now: Instant,
    ) -> Verdict {
        let Some(ClusterState {
            lower,
            nodes,
            pods,
            room,
            outage,
        }) = self.clusters.get_mut(id)
        else {
            return Verdict::Fits {
                node: String::new(),
                score: 0,
            };
        };
        if !(nodes.synced() && pods.synced()) {
            return Verdict::Unsure {
                reason: format!(
                    "lower cluster {id}: not synced yet (its nodes and pods are still being \
                     listed); the pod is retried"
                ),
            };
        }
        if let Some(error) = outage.unreachable(now) {
            return Verdict::Unsure {
                reason: format!(
                    "lower cluster {id}: unreachable ({}); the pod is retried",
                    truncated(error, 200)
                ),
            };
        }
        let demand = match demand {
            Err(e) => {
                return Verdict::Fails {
                    reason: format!("lower cluster {id}: {e}"),
                    unresolvable: true,
                };
            }
            Ok(d) => d,
        };
        lower.verdict(id, &self.reservations, uid, demand, room)
    }

    /// The verdicts for `pod` on each candidate node (its name, and its labels when the
    /// request sent the whole node): `None` when the node passes unjudged. The pod's demand is
    /// remembered for its `/bind`, and candidates sent whole are remembered by their labels.
    pub fn judge_pod<'a>(
        &mut self,
        pod: &Pod,
        candidates: impl IntoIterator<Item = (&'a str, Option<Option<&'a BTreeMap<String, String>>>)>,
        now: Instant,
    ) -> Vec<Option<Verdict>> {
        self.expire(now);
        let uid = pod.metadata.uid.as_deref().filter(|u| !u.is_empty());
        let version = pod.metadata.resource_version.as_deref().unwrap_or_default();
        // prioritize follows filter with the same pod: its demand is not worked out again.
        let known = uid
            .and_then(|uid| self.recent.get(uid))
            .filter(|r| !version.is_empty() && r.version == version)
            .map(|r| r.demand.clone());
        // Remembered once per version: a pod's entry in the order is its only one.
        let demand = match known {
            Some(d) => Ok(d),
            None => {
                let demand = Demand::of_upper_pod(pod).map_err(|e| e.to_string());
                if let (Some(uid), Ok(d)) = (uid, &demand) {
                    self.remember(uid, version, d.clone(), now);
                }
                demand
            }
        };
        let mut verdicts: BTreeMap<String, Verdict> = BTreeMap::new();
        candidates
            .into_iter()
            .map(|(name, labels)| {
                if let Some(labels) = labels {
                    let id = cluster_of(labels).map(str::to_owned);
                    self.learned_nodes.insert(name.to_owned(), id);
                }
                match self.judge(name, labels) {
                    Judged::Pass => None,
                    Judged::Unknown(reason) => Some(Verdict::Unsure { reason }),
                    Judged::Cluster(id) => Some(match verdicts.get(&id) {
                        Some(v) => v.clone(),
                        None => {
                            let v = self.verdict(&id, uid, &demand, now);
                            verdicts.insert(id, v.clone());
                            v
                        }
                    }),
                }
            })
            .collect()
    }

    /// Keeps a pod's demand for its `/bind`, forgetting those older than the reservation TTL.
    fn remember(&mut self, uid: &str, version: &str, demand: Demand, now: Instant) {
        self.recent.insert(
            uid.to_owned(),
            Recent {
                version: version.to_owned(),
                demand,
                seen: now,
            },
        );
        self.recent_order.push_back((now, uid.to_owned()));
        while let Some((seen, _)) = self.recent_order.front() {
            let old = now.saturating_duration_since(*seen) >= self.ttl;
            if !old && self.recent_order.len() <= RECENT_MAX {
                break;
            }
            let Some((seen, uid)) = self.recent_order.pop_front() else {
                break;
            };
            // A UID remembered again since has a later entry of its own.
            if self.recent.get(&uid).is_some_and(|r| r.seen == seen) {
                self.recent.remove(&uid);
            }
        }
    }

    /// Where a `/bind` of the pod `uid` to upper node `node` goes; `Err` with the reason when
    /// the node cannot be judged yet.
    pub fn bind_target(&self, node: &str, uid: Option<&str>) -> Result<BindTarget, String> {
        match self.judge(node, None) {
            Judged::Pass => Ok(BindTarget::Unjudged),
            Judged::Unknown(reason) => Err(reason),
            Judged::Cluster(id) => Ok(BindTarget::Cluster {
                id,
                demand: uid
                    .and_then(|uid| self.recent.get(uid))
                    .map(|r| Box::new(r.demand.clone())),
            }),
        }
    }

    /// Re-checks that the pod `uid` fits in cluster `id`, counting every other reservation, and
    /// reserves its room until `now` + the TTL; `Err` with the reason when it no longer fits.
    pub fn reserve(
        &mut self,
        id: &str,
        uid: &str,
        demand: Demand,
        now: Instant,
    ) -> Result<Reserved, String> {
        self.expire(now);
        if self
            .clusters
            .get(id)
            .is_some_and(|c| c.lower.has_upper_uid(uid))
        {
            return Ok(Reserved::AlreadyThere);
        }
        match self.verdict(id, Some(uid), &Ok(demand.clone()), now) {
            Verdict::Fails { reason, .. } | Verdict::Unsure { reason } => Err(reason),
            Verdict::Fits { node, .. } => {
                self.reservations.reserve(uid, id, demand, now + self.ttl);
                Ok(Reserved::Room { lower_node: node })
            }
        }
    }

    /// Gives the room of the pod `uid` back (its binding failed); whether it held any.
    pub fn release(&mut self, uid: &str) -> bool {
        self.reservations.release(uid).is_some()
    }

    /// Applies an event of lower cluster `id`'s nodes.
    pub fn apply_lower_node(&mut self, id: &str, event: &watcher::Event<Node>) {
        let Some(cluster) = self.clusters.get_mut(id) else {
            return;
        };
        cluster.outage.answered();
        for tensile_runtime::cache::Key { name, .. } in cluster.nodes.record(event) {
            cluster.lower.remove_node(&name);
        }
        match event {
            watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                if let Err(e) = cluster.lower.apply_node(n) {
                    tracing::debug!(cluster = %id, error = %e, "lower node partly read");
                }
            }
            watcher::Event::Delete(n) => {
                cluster
                    .lower
                    .remove_node(n.metadata.name.as_deref().unwrap_or_default());
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// Applies an event of lower cluster `id`'s pods; whether a reservation was released (its
    /// lower pod exists).
    pub fn apply_lower_pod(&mut self, id: &str, event: &watcher::Event<Pod>) -> bool {
        let Some(cluster) = self.clusters.get_mut(id) else {
            return false;
        };
        cluster.outage.answered();
        for tensile_runtime::cache::Key { namespace, name } in cluster.pods.record(event) {
            cluster.lower.remove_pod(&namespace, &name);
        }
        match event {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                let (released, result) = cluster.lower.apply_pod_keeping(
                    id,
                    p,
                    &mut self.reservations,
                    &mut cluster.room,
                );
                if let Err(e) = result {
                    tracing::debug!(cluster = %id, error = %e, "lower pod partly read");
                }
                if released.is_some() {
                    tracing::debug!(cluster = %id, pod = ?p.metadata.name, "reservation released: its lower pod exists");
                    return true;
                }
            }
            watcher::Event::Delete(p) => cluster.lower.remove_pod(
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata.name.as_deref().unwrap_or_default(),
            ),
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
        false
    }

    /// A watch of lower cluster `id` failed at `now`: when it could not reach the cluster, the
    /// cluster is unreachable until one of its watches answers again.
    pub fn lower_watch_failed(&mut self, id: &str, error: &watcher::Error, now: Instant) {
        let reached = matches!(
            error,
            watcher::Error::WatchError(_) | watcher::Error::NoResourceVersion
        );
        if reached {
            return;
        }
        if let Some(cluster) = self.clusters.get_mut(id) {
            cluster.outage.failed(now, error.to_string());
        }
    }

    /// Applies an event of the upper nodes; whether their first list just completed.
    pub fn apply_upper_node(&mut self, event: &watcher::Event<Node>) -> bool {
        for tensile_runtime::cache::Key { name, .. } in self.upper_listed.record(event) {
            self.upper_nodes.remove(&name);
        }
        match event {
            watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                let id = cluster_of(n.metadata.labels.as_ref()).map(str::to_owned);
                self.upper_nodes
                    .insert(n.metadata.name.clone().unwrap_or_default(), id);
                false
            }
            watcher::Event::Delete(n) => {
                self.upper_nodes
                    .remove(n.metadata.name.as_deref().unwrap_or_default());
                false
            }
            watcher::Event::InitDone => true,
            watcher::Event::Init => false,
        }
    }

    /// Applies an event of the bound, Pending upper pods: such a pod holds a reservation unless
    /// its lower pod is seen (so a new leader counts the pods its predecessor bound). Gone
    /// (deleted, or no longer Pending: its lower pod exists by then), it holds none. Whether the
    /// reservations changed.
    pub fn apply_bound_upper_pod(&mut self, event: &watcher::Event<Pod>, now: Instant) -> bool {
        match event {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                let (Some(uid), Some(node)) = (
                    p.metadata.uid.as_deref(),
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                ) else {
                    return false;
                };
                let Judged::Cluster(id) = self.judge(node, None) else {
                    return false;
                };
                let seen = self
                    .clusters
                    .get(&id)
                    .is_some_and(|c| c.lower.has_upper_uid(uid));
                if seen || self.reservations.contains(uid) {
                    return false;
                }
                match Demand::of_upper_pod(p) {
                    Ok(demand) => {
                        tracing::debug!(%uid, cluster = %id, "reservation of a bound pod rebuilt");
                        self.reservations.reserve(uid, &id, demand, now + self.ttl);
                        true
                    }
                    Err(e) => {
                        tracing::debug!(%uid, error = %e, "bound pod not counted");
                        false
                    }
                }
            }
            watcher::Event::Delete(p) => {
                let released = p
                    .metadata
                    .uid
                    .as_deref()
                    .is_some_and(|uid| self.reservations.release(uid).is_some());
                if released {
                    tracing::debug!(uid = ?p.metadata.uid, "reservation released: the upper pod left Pending");
                }
                released
            }
            watcher::Event::Init | watcher::Event::InitDone => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TTL: Duration = Duration::from_secs(120);

    fn upper_node(name: &str, cluster: Option<&str>) -> Node {
        let labels = match cluster {
            Some(id) => json!({"type": "virtual-kubelet", "clusterID": id}),
            None => json!({}),
        };
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    fn lower_node(name: &str, cpu: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap()
    }

    /// An upper pod asking for `cpu`, bound to `node` when given.
    fn upper_pod(name: &str, cpu: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]},
            "status": {"phase": "Pending"}
        }))
        .unwrap()
    }

    /// The lower pod of upper pod `name`, on lower node `node` when given.
    fn lower_pod(name: &str, cpu: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("lower-{name}"),
                "annotations": {"tensile-kube.io/upper-uid": format!("uid-{name}")}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]},
            "status": {"phase": "Pending"}
        }))
        .unwrap()
    }

    /// Lower clusters `a` (one 3-CPU node) and `b` (one 1-CPU node), their virtual nodes
    /// `vk-a` and `vk-b` and a real node `worker` upstairs, every watch listed.
    fn listed() -> Index {
        let mut index = Index::new(["a".to_owned(), "b".to_owned()], TTL);
        index.apply_upper_node(&watcher::Event::Init);
        for node in [
            upper_node("vk-a", Some("a")),
            upper_node("vk-b", Some("b")),
            upper_node("worker", None),
        ] {
            index.apply_upper_node(&watcher::Event::InitApply(node));
        }
        assert!(index.apply_upper_node(&watcher::Event::InitDone));
        for (id, node, cpu) in [("a", "n1", "3"), ("b", "n2", "1")] {
            index.apply_lower_node(id, &watcher::Event::Init);
            index.apply_lower_node(id, &watcher::Event::InitApply(lower_node(node, cpu)));
            index.apply_lower_node(id, &watcher::Event::InitDone);
            index.apply_lower_pod(id, &watcher::Event::Init);
            index.apply_lower_pod(id, &watcher::Event::InitDone);
        }
        assert!(index.synced());
        index
    }

    /// The verdicts for `pod` on upper nodes named only (kube-scheduler's `nodeCacheCapable`).
    fn judge(index: &mut Index, pod: &Pod, nodes: &[&str], now: Instant) -> Vec<Option<Verdict>> {
        index.judge_pod(pod, nodes.iter().map(|n| (*n, None)), now)
    }

    fn fits(v: &Option<Verdict>) -> bool {
        matches!(v, Some(Verdict::Fits { .. }))
    }

    fn reason(v: &Option<Verdict>) -> &str {
        match v {
            Some(Verdict::Fails { reason, .. } | Verdict::Unsure { reason }) => reason,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    fn demand(pod: &Pod) -> Demand {
        Demand::of_upper_pod(pod).unwrap()
    }

    #[test]
    fn remembered_demands_are_forgotten_oldest_first_past_the_cap_or_the_ttl() {
        let mut index = listed();
        let t0 = Instant::now();
        let d = demand(&upper_pod("p", "1", None));
        for i in 0..RECENT_MAX + 10 {
            index.remember(&format!("u{i}"), "1", d.clone(), t0);
        }
        assert_eq!(index.recent.len(), RECENT_MAX);
        assert!(!index.recent.contains_key("u0") && !index.recent.contains_key("u9"));
        assert!(index.recent.contains_key("u10"));
        // Remembered again later, a UID outlives its first entry.
        index.remember("u10", "2", d.clone(), t0 + Duration::from_secs(1));
        index.remember("late", "1", d, t0 + TTL + Duration::from_millis(500));
        let mut kept: Vec<&str> = index.recent.keys().map(String::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["late", "u10"]);
        assert_eq!(index.recent_order.len(), 2);
    }

    #[test]
    fn each_virtual_node_is_judged_by_its_lower_cluster_and_other_nodes_pass() {
        let mut index = listed();
        let now = Instant::now();
        let pod = upper_pod("p", "2", None);
        let v = judge(&mut index, &pod, &["vk-a", "vk-b", "worker", "vk-new"], now);
        assert!(
            matches!(&v[0], Some(Verdict::Fits { node, .. }) if node == "n1"),
            "{v:?}"
        );
        assert!(reason(&v[1]).contains("lower cluster b"), "{v:?}");
        assert_eq!(v[2], None, "a real node passes unjudged");
        assert_eq!(
            reason(&v[3]),
            "upper node vk-new is not known to the tensile extender yet"
        );
        // A node sent whole is judged by its labels, and known by them for its /bind.
        let labels: BTreeMap<String, String> = [("type", "virtual-kubelet"), ("clusterID", "a")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into();
        let v = index.judge_pod(&pod, [("vk-new", Some(Some(&labels)))], now);
        assert!(fits(&v[0]));
        assert!(matches!(
            index.bind_target("vk-new", Some("uid-p")),
            Ok(BindTarget::Cluster { id, demand: Some(_) }) if id == "a"
        ));
        assert_eq!(index.bind_target("worker", None), Ok(BindTarget::Unjudged));
    }

    #[test]
    fn a_cluster_not_listed_yet_fails_its_virtual_node_with_a_reason() {
        let mut index = Index::new(["a".to_owned()], TTL);
        index.apply_upper_node(&watcher::Event::Apply(upper_node("vk-a", Some("a"))));
        index.apply_lower_node("a", &watcher::Event::Init);
        index.apply_lower_node("a", &watcher::Event::InitApply(lower_node("n1", "3")));
        index.apply_lower_node("a", &watcher::Event::InitDone);
        let pod = upper_pod("p", "1", None);
        let v = judge(&mut index, &pod, &["vk-a", "vk-x"], Instant::now());
        assert!(
            reason(&v[0]).contains("lower cluster a: not synced yet"),
            "{v:?}"
        );
        assert!(
            reason(&v[1]).ends_with("(its node watch has not listed)"),
            "{v:?}"
        );
        index.apply_lower_pod("a", &watcher::Event::Init);
        index.apply_lower_pod("a", &watcher::Event::InitDone);
        assert!(fits(&judge(&mut index, &pod, &["vk-a"], Instant::now())[0]));
    }

    #[test]
    fn a_reservation_holds_the_room_until_the_lower_pod_takes_it() {
        let mut index = listed();
        let now = Instant::now();
        let (p1, p2) = (upper_pod("p1", "2", None), upper_pod("p2", "2", None));
        assert_eq!(
            index.reserve("a", "uid-p1", demand(&p1), now),
            Ok(Reserved::Room {
                lower_node: "n1".into()
            })
        );
        // 3 CPU, 2 reserved: the next 2-CPU pod fails at filter and at bind.
        assert!(!fits(&judge(&mut index, &p2, &["vk-a"], now)[0]));
        let refused = index.reserve("a", "uid-p2", demand(&p2), now);
        assert!(refused.is_err(), "{refused:?}");
        // Its own reservation is not counted against the pod itself.
        assert!(fits(&judge(&mut index, &p1, &["vk-a"], now)[0]));
        // Its lower pod appears: the reservation goes, the lower pod counts by itself (waiting
        // for a node, then on it).
        assert!(index.apply_lower_pod("a", &watcher::Event::Apply(lower_pod("p1", "2", None))));
        assert_eq!(index.reservations("a"), 0);
        assert!(!fits(&judge(&mut index, &p2, &["vk-a"], now)[0]));
        let placed = lower_pod("p1", "2", Some("n1"));
        assert!(!index.apply_lower_pod("a", &watcher::Event::Apply(placed.clone())));
        assert!(!fits(&judge(&mut index, &p2, &["vk-a"], now)[0]));
        // A repeated bind of p1 reserves nothing more.
        assert_eq!(
            index.reserve("a", "uid-p1", demand(&p1), now),
            Ok(Reserved::AlreadyThere)
        );
        // Gone downstairs: its room is free.
        index.apply_lower_pod("a", &watcher::Event::Delete(placed));
        assert!(fits(&judge(&mut index, &p2, &["vk-a"], now)[0]));
    }

    #[test]
    fn a_failed_binding_gives_its_room_back_and_a_lost_one_lapses_after_the_ttl() {
        let mut index = listed();
        let now = Instant::now();
        let (p1, p2) = (upper_pod("p1", "2", None), upper_pod("p2", "2", None));
        index.reserve("a", "uid-p1", demand(&p1), now).unwrap();
        assert!(index.release("uid-p1"));
        assert!(!index.release("uid-p1"));
        assert!(fits(&judge(&mut index, &p2, &["vk-a"], now)[0]));
        // Reserved, and its lower pod never comes: held for the TTL, then free.
        index.reserve("a", "uid-p1", demand(&p1), now).unwrap();
        let before = now + TTL - Duration::from_secs(1);
        assert!(!fits(&judge(&mut index, &p2, &["vk-a"], before)[0]));
        assert!(fits(&judge(&mut index, &p2, &["vk-a"], now + TTL)[0]));
        assert_eq!(index.reservations("a"), 0);
    }

    #[test]
    fn an_unreachable_cluster_is_filtered_out_until_it_answers_again() {
        let mut index = listed();
        let now = Instant::now();
        let pod = upper_pod("p", "1", None);
        // A watch error the cluster answered (no resource version) is no outage.
        index.lower_watch_failed("a", &watcher::Error::NoResourceVersion, now);
        assert!(fits(&judge(&mut index, &pod, &["vk-a"], now)[0]));
        let refused =
            watcher::Error::WatchFailed(kube::Error::Service("connection refused".into()));
        index.lower_watch_failed("a", &refused, now);
        let v = judge(&mut index, &pod, &["vk-a", "vk-b"], now);
        assert!(
            reason(&v[0]).contains("lower cluster a: unreachable"),
            "{v:?}"
        );
        assert!(reason(&v[0]).contains("connection refused"), "{v:?}");
        assert!(
            matches!(&v[0], Some(Verdict::Unsure { .. })),
            "retried: {v:?}"
        );
        assert!(fits(&v[1]), "the other cluster still takes pods: {v:?}");
        assert!(index.reserve("a", "uid-p", demand(&pod), now).is_err());
        // An event from it: reachable again.
        index.apply_lower_node("a", &watcher::Event::Apply(lower_node("n1", "3")));
        assert!(fits(&judge(&mut index, &pod, &["vk-a"], now)[0]));
        // Failures that stop: reachable again once they have stopped for a while.
        index.lower_watch_failed("a", &refused, now);
        let later = now + tensile_core::extender::UNREACHABLE_WINDOW;
        assert!(fits(&judge(&mut index, &pod, &["vk-a"], later)[0]));
    }

    #[test]
    fn a_restarted_extender_rebuilds_the_reservations_of_the_pods_bound_before() {
        let mut index = listed();
        let now = Instant::now();
        // Bound by a predecessor, Pending, no lower pod yet: holds its room.
        let bound = upper_pod("p1", "2", Some("vk-a"));
        assert!(index.apply_bound_upper_pod(&watcher::Event::InitApply(bound.clone()), now));
        assert_eq!(index.reservations("a"), 1);
        let p2 = upper_pod("p2", "2", None);
        assert!(!fits(&judge(&mut index, &p2, &["vk-a"], now)[0]));
        // Seen again: counted once.
        assert!(!index.apply_bound_upper_pod(&watcher::Event::Apply(bound.clone()), now));
        assert_eq!(index.reservations("a"), 1);
        // Deleted (or no longer Pending) before its lower pod appeared: its room is free.
        assert!(index.apply_bound_upper_pod(&watcher::Event::Delete(bound), now));
        assert!(fits(&judge(&mut index, &p2, &["vk-a"], now)[0]));
        // One whose lower pod exists holds nothing (the lower pod counts), nor one on a real
        // node.
        index.apply_lower_pod(
            "a",
            &watcher::Event::Apply(lower_pod("p3", "1", Some("n1"))),
        );
        let p3 = upper_pod("p3", "1", Some("vk-a"));
        assert!(!index.apply_bound_upper_pod(&watcher::Event::Apply(p3), now));
        let on_worker = upper_pod("p4", "1", Some("worker"));
        assert!(!index.apply_bound_upper_pod(&watcher::Event::Apply(on_worker), now));
        assert_eq!(index.reservations("a"), 0);
    }

    #[test]
    fn a_re_list_drops_the_lower_pods_and_nodes_deleted_while_the_watch_was_down() {
        let mut index = listed();
        let now = Instant::now();
        index.apply_lower_pod(
            "a",
            &watcher::Event::Apply(lower_pod("big", "2", Some("n1"))),
        );
        let pod = upper_pod("p", "2", None);
        assert!(!fits(&judge(&mut index, &pod, &["vk-a"], now)[0]));
        // The watch restarts; the list no longer has the pod.
        index.apply_lower_pod("a", &watcher::Event::Init);
        index.apply_lower_pod("a", &watcher::Event::InitDone);
        assert!(fits(&judge(&mut index, &pod, &["vk-a"], now)[0]));
        // Nor the node: nothing fits there any more.
        index.apply_lower_node("a", &watcher::Event::Init);
        index.apply_lower_node("a", &watcher::Event::InitDone);
        assert!(!fits(&judge(&mut index, &pod, &["vk-a"], now)[0]));
        // An upper node dropped by its re-list is unknown again.
        index.apply_upper_node(&watcher::Event::Init);
        index.apply_upper_node(&watcher::Event::InitDone);
        assert!(!index.knows_upper_node("vk-a"));
        assert!(index.bind_target("vk-a", None).is_err());
    }

    #[test]
    fn a_pod_changed_since_its_filter_call_is_judged_by_its_new_spec() {
        let mut index = listed();
        let now = Instant::now();
        let mut pod = upper_pod("p", "1", None);
        pod.metadata.resource_version = Some("1".into());
        assert!(fits(&judge(&mut index, &pod, &["vk-a"], now)[0]));
        // Resized before prioritize: a new resourceVersion, so its demand is read again.
        let mut resized = upper_pod("p", "100", None);
        resized.metadata.resource_version = Some("2".into());
        assert!(!fits(&judge(&mut index, &resized, &["vk-a"], now)[0]));
        match index.bind_target("vk-a", Some("uid-p")) {
            Ok(BindTarget::Cluster {
                demand: Some(d), ..
            }) => assert_eq!(*d, demand(&resized)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_bind_knows_the_demand_of_a_pod_it_judged_and_reads_the_others() {
        let mut index = listed();
        let now = Instant::now();
        let pod = upper_pod("p", "1", None);
        assert_eq!(
            index.bind_target("vk-a", Some("uid-p")),
            Ok(BindTarget::Cluster {
                id: "a".into(),
                demand: None
            })
        );
        judge(&mut index, &pod, &["vk-a"], now);
        assert_eq!(
            index.bind_target("vk-a", Some("uid-p")),
            Ok(BindTarget::Cluster {
                id: "a".into(),
                demand: Some(Box::new(demand(&pod)))
            })
        );
    }
}
