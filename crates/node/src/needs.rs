//! Which lower copies our pods need: a count per (kind, namespace, name) over the upper pods
//! bound to the node (those still to be created included) and our lower pods (those still
//! terminating included), kept from the pod controller's watch events, never from a LIST. The
//! copy controller deletes copies whose count is zero and re-creates needed ones that went
//! missing; a count falling to zero puts the copy's key on its queue. A count rising from zero
//! does not: the pod controller creates a new pod's copies itself, before the pod, and a second
//! create from here would only race it (a copy that goes missing later is seen by the copy
//! controller's own lower watch).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use tensile_core::deps::{CopyKind, needed_copies};
use tensile_core::translate::offload_decision;
use tokio::sync::watch;

use crate::cache::{Key, ListedKeys};
use crate::queue::Queue;

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
}

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
        let gone = inner.listed_keys.entry(side).or_default().record(event);
        for (ns, name) in gone {
            set(&mut inner, (side, ns, name), Vec::new());
        }
        match event {
            watcher::Event::Init => {}
            watcher::Event::InitApply(pod) | watcher::Event::Apply(pod) => {
                let Some((ns, name)) = pod_key(pod) else {
                    return;
                };
                // Pods that are not offloaded never get lower copies.
                let keys = if side == Side::Lower || offload_decision(pod).is_ok() {
                    needed_copies(pod)
                        .into_iter()
                        .map(|(kind, dep)| (kind, ns.clone(), dep))
                        .collect()
                } else {
                    Vec::new()
                };
                set(&mut inner, (side, ns, name), keys);
            }
            watcher::Event::Delete(pod) => {
                if let Some((ns, name)) = pod_key(pod) {
                    set(&mut inner, (side, ns, name), Vec::new());
                }
            }
            watcher::Event::InitDone => {
                drop(inner);
                self.listed.send_modify(|listed| {
                    listed.insert(side);
                });
            }
        }
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

    /// Copies of `kind` no pod needs any more are added to `queue`.
    pub(crate) fn subscribe(&self, kind: CopyKind, queue: Queue<Key>) {
        self.lock().subscribers.push((kind, queue));
    }
}

fn pod_key(pod: &Pod) -> Option<(String, String)> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

/// Replaces what `pod` needs with `keys`, telling subscribers about counts falling to zero.
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
        *inner.counts.entry(key).or_insert(0) += 1;
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
                queue.add((ns.clone(), name.clone()));
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
    fn pods_that_are_not_offloaded_need_no_copies() {
        let needs = Needs::default();
        let mut system = pod("dns", &["coredns"]);
        system.metadata.namespace = Some("kube-system".into());
        needs.observe(Side::Upper, &watcher::Event::Apply(system));
        assert!(!needs.needed(CopyKind::ConfigMap, "kube-system", "coredns"));
    }
}
