//! Which lower copies our pods need: a count per (kind, namespace, name) over the upper pods
//! bound to the node (those still to be created included) and our lower pods (those still
//! terminating included), kept from the pod controller's watch events, never from a LIST. A
//! count rising from zero or falling to zero puts the copy's key on the copy controller's queue
//! (`crate::copies`), which creates the copies pods need and deletes those no pod needs.
//!
//! It also knows which upper ConfigMaps, Secrets and claims the upper pods bound to the node
//! reference (their copies, and the root CA of pods that mount a token), and starts and stops the
//! per-object watches of ConfigMaps and Secrets (`crate::watches`) as the first pod referencing
//! one appears and the last one goes; and which pods reference an object, to try them again when
//! it appears upstairs or its copy downstairs ([`Needs::copy_changed`]).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use tensile_core::deps::{CopyKind, needed_copies};
use tensile_core::identity::token_needs;
use tensile_core::keys::CONFIG_MAP_KUBE_ROOT_CA;
use tensile_core::translate::offload_decision;
use tokio::sync::watch;

use tensile_runtime::cache::{Key, ListedKeys};
use tensile_runtime::queue::Queue;

/// Which cluster a pod was seen in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// Upper pods bound to the node.
    Upper,
    /// Our lower pods.
    Lower,
}

type NeedKey = (CopyKind, String, String);
type PodKey = (Side, String, String);

#[derive(Default)]
struct Inner {
    counts: HashMap<NeedKey, usize>,
    by_pod: HashMap<PodKey, Vec<NeedKey>>,
    /// The pods each side's watch has listed: a completed re-list names the vanished ones.
    listed_keys: HashMap<Side, ListedKeys>,
    subscribers: Vec<(CopyKind, Queue<Key>)>,
    /// The pod controller's queue, woken when a copy its pods wait for changes.
    pods: Option<Queue<Key>>,
    /// The upper ConfigMaps and Secrets each upper pod references, and the reverse.
    refs_by_pod: HashMap<Key, Vec<NeedKey>>,
    pods_by_ref: HashMap<NeedKey, HashSet<Key>>,
    /// Told when an upper object gains its first referencing pod (`true`) or loses its last.
    watchers: Vec<(CopyKind, Watcher)>,
}

/// See [`Needs::watch_upper`].
pub type Watcher = std::sync::Arc<dyn Fn(Key, bool) + Send + Sync>;

/// The dependency index; share it in an `Arc`.
pub struct Needs {
    inner: Mutex<Inner>,
    /// Sides whose first list is complete.
    listed: watch::Sender<HashSet<Side>>,
}

impl std::fmt::Debug for Needs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Needs").finish_non_exhaustive()
    }
}

impl Default for Needs {
    fn default() -> Self {
        Needs {
            inner: Mutex::default(),
            listed: watch::Sender::new(HashSet::new()),
        }
    }
}

impl Needs {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes one pod watch event of `side`.
    pub fn observe(&self, side: Side, event: &watcher::Event<Pod>) {
        let mut inner = self.lock();
        let mut changed = Vec::new();
        let gone = inner.listed_keys.entry(side).or_default().record(event);
        for Key {
            namespace: ns,
            name,
        } in gone
        {
            set(&mut inner, (side, ns.clone(), name.clone()), Vec::new());
            if side == Side::Upper {
                set_refs(
                    &mut inner,
                    Key {
                        namespace: ns,
                        name,
                    },
                    Vec::new(),
                    &mut changed,
                );
            }
        }
        match event {
            watcher::Event::Init => {}
            watcher::Event::InitApply(pod) | watcher::Event::Apply(pod) => {
                let Some((ns, name)) = pod_key(pod) else {
                    return;
                };
                // Pods that are not offloaded never get lower copies.
                let offloaded = side == Side::Lower || offload_decision(pod).is_ok();
                let keys: Vec<NeedKey> = if offloaded {
                    needed_copies(pod)
                        .into_iter()
                        .map(|(kind, dep)| (kind, ns.clone(), dep))
                        .collect()
                } else {
                    Vec::new()
                };
                if side == Side::Upper {
                    let refs = if offloaded {
                        upper_references(pod, &ns, &keys)
                    } else {
                        Vec::new()
                    };
                    set_refs(
                        &mut inner,
                        Key::new(ns.clone(), name.clone()),
                        refs,
                        &mut changed,
                    );
                }
                set(&mut inner, (side, ns, name), keys);
            }
            watcher::Event::Delete(pod) => {
                if let Some((ns, name)) = pod_key(pod) {
                    set(&mut inner, (side, ns.clone(), name.clone()), Vec::new());
                    if side == Side::Upper {
                        set_refs(
                            &mut inner,
                            Key {
                                namespace: ns,
                                name,
                            },
                            Vec::new(),
                            &mut changed,
                        );
                    }
                }
            }
            // Below, once the pods a completed re-list dropped are forgotten.
            watcher::Event::InitDone => {}
        }
        // Outside the lock: a watcher may start a watch, whose observers read this index.
        let watchers = inner.watchers.clone();
        drop(inner);
        for ((kind, ns, name), first) in changed {
            for (k, watch) in &watchers {
                if *k == kind {
                    watch(Key::new(ns.clone(), name.clone()), first);
                }
            }
        }
        if matches!(event, watcher::Event::InitDone) {
            self.listed.send_modify(|listed| {
                listed.insert(side);
            });
        }
    }

    /// `watch` is told `(key, true)` when an upper object of `kind` is referenced by a first
    /// upper pod bound to the node, `(key, false)` when by none any more.
    pub fn watch_upper(&self, kind: CopyKind, watch: Watcher) {
        self.lock().watchers.push((kind, watch));
    }

    /// The upper pods bound to the node that reference the upper object `kind` `key`.
    pub fn upper_pods_referencing(&self, kind: CopyKind, key: &Key) -> Vec<Key> {
        self.lock()
            .pods_by_ref
            .get(&(kind, key.namespace.clone(), key.name.clone()))
            .map(|pods| pods.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether any of our pods needs the copy `kind` `namespace/name`.
    pub fn needed(&self, kind: CopyKind, namespace: &str, name: &str) -> bool {
        self.lock()
            .counts
            .contains_key(&(kind, namespace.to_owned(), name.to_owned()))
    }

    /// Waits until both sides have been listed once (before that, "not needed" means nothing).
    pub async fn wait_until_listed(&self) {
        let mut rx = self.listed.subscribe();
        let _ = rx
            .wait_for(|listed| listed.contains(&Side::Upper) && listed.contains(&Side::Lower))
            .await;
    }

    /// Copies of `kind` a first pod needs, or no pod any more, are added to `queue`.
    pub(crate) fn subscribe(&self, kind: CopyKind, queue: Queue<Key>) {
        self.lock().subscribers.push((kind, queue));
    }

    /// The copies of `kind` some pod needs.
    pub fn needed_keys(&self, kind: CopyKind) -> Vec<Key> {
        self.lock()
            .counts
            .keys()
            .filter(|(k, _, _)| *k == kind)
            .map(|(_, ns, name)| Key::new(ns, name))
            .collect()
    }

    /// The pods of `queue` (the pod controller's) wait for copies: [`Self::copy_changed`] wakes
    /// them.
    pub fn wake_pods(&self, queue: Queue<Key>) {
        self.lock().pods = Some(queue);
    }

    /// The copy of `kind` `key` changed (made, found, failed, or shown by the lower watch): the
    /// upper pods referencing it whose lower pod does not exist yet look again, urgently (those
    /// with a lower pod need nothing more to be created).
    pub fn copy_changed(&self, kind: CopyKind, key: &Key) {
        let inner = self.lock();
        let Some(queue) = &inner.pods else { return };
        let need = (kind, key.namespace.clone(), key.name.clone());
        for pod in inner.pods_by_ref.get(&need).into_iter().flatten() {
            let lower = (Side::Lower, pod.namespace.clone(), pod.name.clone());
            // Ahead of pods not looked at yet: one whose copies are there is one write from
            // done, and was in the queue once already.
            if !inner.by_pod.contains_key(&lower) {
                queue.add_urgent(pod.clone());
            }
        }
    }
}

fn pod_key(pod: &Pod) -> Option<(String, String)> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

/// The upper objects an offloaded upper `pod` of namespace `ns` references, whose copies are
/// `copies`: those, and the namespace's root CA when it mounts a token (the upper tokens carry
/// it, `crate::tokens`). Claims are among them, but have no per-object watches.
fn upper_references(pod: &Pod, ns: &str, copies: &[NeedKey]) -> Vec<NeedKey> {
    let mut refs: Vec<NeedKey> = copies.to_vec();
    if pod
        .spec
        .as_ref()
        .is_some_and(|s| !token_needs(s).is_empty())
    {
        let ca = (
            CopyKind::ConfigMap,
            ns.to_owned(),
            CONFIG_MAP_KUBE_ROOT_CA.to_owned(),
        );
        if !refs.contains(&ca) {
            refs.push(ca);
        }
    }
    refs
}

/// Replaces what upper `pod` references with `refs`; objects gaining their first pod or losing
/// their last are added to `changed` (with `true` for a first).
fn set_refs(inner: &mut Inner, pod: Key, refs: Vec<NeedKey>, changed: &mut Vec<(NeedKey, bool)>) {
    let old = if refs.is_empty() {
        inner.refs_by_pod.remove(&pod).unwrap_or_default()
    } else {
        inner
            .refs_by_pod
            .insert(pod.clone(), refs.clone())
            .unwrap_or_default()
    };
    if old == refs {
        return;
    }
    for key in &refs {
        let pods = inner.pods_by_ref.entry(key.clone()).or_default();
        if pods.is_empty() {
            changed.push((key.clone(), true));
        }
        pods.insert(pod.clone());
    }
    for key in old {
        if refs.contains(&key) {
            continue;
        }
        if let Some(pods) = inner.pods_by_ref.get_mut(&key) {
            pods.remove(&pod);
            if pods.is_empty() {
                inner.pods_by_ref.remove(&key);
                changed.push((key, false));
            }
        }
    }
}

/// Replaces what `pod` needs with `keys`, telling subscribers about counts rising from zero
/// or falling to zero.
fn set(inner: &mut Inner, pod: PodKey, keys: Vec<NeedKey>) {
    let old = if keys.is_empty() {
        inner.by_pod.remove(&pod).unwrap_or_default()
    } else {
        inner.by_pod.insert(pod, keys.clone()).unwrap_or_default()
    };
    if old == keys {
        return;
    }
    let mut crossed = Vec::new();
    for key in keys {
        let count = inner.counts.entry(key.clone()).or_insert(0);
        *count += 1;
        if *count == 1 {
            crossed.push(key);
        }
    }
    for key in old {
        if let Some(count) = inner.counts.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                inner.counts.remove(&key);
                crossed.push(key);
            }
        }
    }
    for (kind, ns, name) in crossed {
        for (k, queue) in &inner.subscribers {
            if *k == kind {
                queue.add(Key::new(ns.clone(), name.clone()));
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, config_maps: &[&str]) -> Pod {
        let volumes: Vec<_> = config_maps
            .iter()
            .map(|c| json!({"name": c, "configMap": {"name": c}}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"nodeName": "vk", "volumes": volumes, "containers": [{"name": "c", "image": "i"}]},
        }))
        .unwrap()
    }

    #[test]
    fn counts_follow_pods_on_both_sides_and_relists_forget_vanished_pods() {
        let needs = Needs::default();
        let needed = |name: &str| needs.needed(CopyKind::ConfigMap, "shop", name);
        needs.observe(Side::Upper, &watcher::Event::Apply(pod("a", &["cfg", "x"])));
        needs.observe(Side::Lower, &watcher::Event::Apply(pod("a", &["cfg", "x"])));
        needs.observe(Side::Upper, &watcher::Event::Apply(pod("b", &["cfg"])));
        assert!(needed("cfg") && needed("x"));
        // Pod a loses its volume x upstairs; the lower pod still mounts it.
        needs.observe(Side::Upper, &watcher::Event::Apply(pod("a", &["cfg"])));
        assert!(needed("x"));
        needs.observe(
            Side::Lower,
            &watcher::Event::Delete(pod("a", &["cfg", "x"])),
        );
        assert!(!needed("x"));
        needs.observe(Side::Upper, &watcher::Event::Delete(pod("a", &["cfg"])));
        assert!(needed("cfg"), "pod b still needs it");
        // A relist that no longer has pod b: it is gone.
        needs.observe(Side::Upper, &watcher::Event::Init);
        needs.observe(Side::Upper, &watcher::Event::InitDone);
        assert!(!needed("cfg"));
        assert!(needs.lock().by_pod.is_empty() && needs.lock().counts.is_empty());
    }

    #[test]
    fn upper_references_start_and_stop_watches_and_name_their_pods() {
        use std::sync::{Arc, Mutex};
        let needs = Needs::default();
        let seen: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
        let record = seen.clone();
        needs.watch_upper(
            CopyKind::ConfigMap,
            Arc::new(move |Key { namespace: _, name }, first| {
                record.lock().unwrap().push((name, first))
            }),
        );
        let mut with_token = pod("b", &["cfg"]);
        with_token
            .spec
            .as_mut()
            .unwrap()
            .volumes
            .as_mut()
            .unwrap()
            .push(serde_json::from_value(json!({"name": "kube-api-access-x", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}))
            .unwrap());
        needs.observe(Side::Upper, &watcher::Event::Apply(pod("a", &["cfg"])));
        needs.observe(Side::Upper, &watcher::Event::Apply(with_token));
        // Lower pods read nothing upstairs.
        needs.observe(Side::Lower, &watcher::Event::Apply(pod("c", &["low"])));
        let key = Key::new("shop", "cfg");
        let mut pods = needs.upper_pods_referencing(CopyKind::ConfigMap, &key);
        pods.sort();
        assert_eq!(pods, [Key::new("shop", "a"), Key::new("shop", "b")]);
        needs.observe(Side::Upper, &watcher::Event::Delete(pod("a", &["cfg"])));
        needs.observe(Side::Upper, &watcher::Event::Delete(pod("b", &["cfg"])));
        assert_eq!(
            *seen.lock().unwrap(),
            [
                ("cfg".to_owned(), true),
                ("kube-root-ca.crt".to_owned(), true),
                ("cfg".to_owned(), false),
                ("kube-root-ca.crt".to_owned(), false),
            ]
        );
        assert!(
            needs
                .upper_pods_referencing(CopyKind::ConfigMap, &key)
                .is_empty()
        );
    }

    /// The next key of `queue`, if one is there now.
    async fn next_key(
        queue: &Queue<Key>,
        rx: &tensile_runtime::queue::Receiver<Key>,
    ) -> Option<Key> {
        let stop = tokio_util::sync::CancellationToken::new();
        let timer = stop.clone();
        // Only what is queued already: a key due later is not waited for.
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            timer.cancel();
        });
        let (key, _) = queue.next(rx, &stop).await?;
        queue.done(key.clone(), true);
        Some(key)
    }

    #[tokio::test]
    async fn a_copy_first_needed_or_needed_no_more_is_work_and_its_appearance_wakes_waiting_pods() {
        let needs = Needs::default();
        let (copies, copies_rx) = Queue::<Key>::new();
        let (pods, pods_rx) = Queue::<Key>::new();
        needs.subscribe(CopyKind::ConfigMap, copies.clone());
        needs.wake_pods(pods.clone());
        let cfg = Key::new("shop", "cfg");
        needs.observe(Side::Upper, &watcher::Event::Apply(pod("a", &["cfg"])));
        assert_eq!(
            next_key(&copies, &copies_rx).await,
            Some(cfg.clone()),
            "first need"
        );
        needs.observe(Side::Upper, &watcher::Event::Apply(pod("b", &["cfg"])));
        assert_eq!(next_key(&copies, &copies_rx).await, None, "needed already");
        // Pod b's lower pod exists: only pod a waits for the copy.
        needs.observe(Side::Lower, &watcher::Event::Apply(pod("b", &["cfg"])));
        needs.copy_changed(CopyKind::ConfigMap, &cfg);
        assert_eq!(next_key(&pods, &pods_rx).await, Some(Key::new("shop", "a")));
        assert_eq!(next_key(&pods, &pods_rx).await, None);
        for side in [Side::Upper, Side::Lower] {
            needs.observe(side, &watcher::Event::Delete(pod("b", &["cfg"])));
        }
        needs.observe(Side::Upper, &watcher::Event::Delete(pod("a", &["cfg"])));
        assert_eq!(
            next_key(&copies, &copies_rx).await,
            Some(cfg),
            "needed no more"
        );
    }

    #[test]
    fn pods_that_are_not_offloaded_need_no_copies() {
        let needs = Needs::default();
        let mut system = pod("dns", &["coredns"]);
        system.metadata.namespace = Some("kube-system".into());
        needs.observe(Side::Upper, &watcher::Event::Apply(system));
        assert!(!needs.needed(CopyKind::ConfigMap, "kube-system", "coredns"));
    }
}
