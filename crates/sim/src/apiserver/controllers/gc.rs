//! Garbage collection by owner references (background, foreground and orphan propagation),
//! and pods of deleted nodes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::meta;
use super::super::resources::{RESOURCES, ResId, ids};
use super::super::rest::DeleteOptions;
use super::super::store::{Event, EventType, ObjKey};
use super::{Reconciler, delete, modify, owner_uids, run_loop};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(5), Gc::default()).await;
}

type Ref = (ResId, ObjKey);

/// Who depends on whom, kept from the events (never a full scan per deletion), with each
/// object's owners as it was indexed so that re-indexing it touches only those.
#[derive(Default)]
struct Gc {
    dependents: HashMap<String, HashSet<Ref>>,
    uid_of: HashMap<Ref, String>,
    owners_of: HashMap<Ref, Vec<String>>,
    /// The objects alive, by UID.
    by_uid: HashMap<String, Ref>,
}

impl Gc {
    fn index(&mut self, r: Ref, obj: &Value) {
        self.unindex(&r);
        let uid = meta::meta_str(obj, "uid").unwrap_or_default().to_owned();
        let owners: Vec<String> = owner_uids(obj).map(str::to_owned).collect();
        for owner in &owners {
            self.dependents
                .entry(owner.clone())
                .or_default()
                .insert(r.clone());
        }
        self.owners_of.insert(r.clone(), owners);
        self.by_uid.insert(uid.clone(), r.clone());
        self.uid_of.insert(r, uid);
    }

    fn unindex(&mut self, r: &Ref) {
        if let Some(uid) = self.uid_of.remove(r)
            && self.by_uid.get(&uid) == Some(r)
        {
            self.by_uid.remove(&uid);
        }
        for owner in self.owners_of.remove(r).unwrap_or_default() {
            if let Some(set) = self.dependents.get_mut(&owner) {
                set.remove(r);
                if set.is_empty() {
                    self.dependents.remove(&owner);
                }
            }
        }
    }

    fn live(&self, uid: &str) -> bool {
        self.by_uid.contains_key(uid)
    }

    /// Deletes the dependents of a gone owner whose other owners are gone too.
    fn collect(&mut self, state: &State, owner_uid: &str) {
        let Some(deps) = self.dependents.remove(owner_uid) else {
            return;
        };
        for (res, key) in deps {
            let Some(e) = state.store.get(res, &key) else {
                continue;
            };
            if meta::deleting(&e.object) {
                continue;
            }
            if owner_uids(&e.object).all(|o| !self.live(o)) {
                let _ = delete(state, res, &key, &DeleteOptions::default());
            } else {
                let _ = modify(state, res, &key, |o| drop_owner(o, owner_uid));
            }
        }
    }

    /// Foreground and orphan finalizers on a deleting owner.
    fn finalize(&mut self, state: &State, res: ResId, key: &ObjKey, obj: &Value) {
        let uid = meta::meta_str(obj, "uid").unwrap_or_default().to_owned();
        let finalizers = meta::finalizers(obj);
        let deps: Vec<Ref> = self
            .dependents
            .get(&uid)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default();
        if finalizers.iter().any(|f| f == "orphan") {
            for (dres, dkey) in &deps {
                let _ = modify(state, *dres, dkey, |o| drop_owner(o, &uid));
            }
            remove_finalizer(state, res, key, "orphan");
        } else if finalizers.iter().any(|f| f == "foregroundDeletion") {
            let mut left = 0;
            for (dres, dkey) in &deps {
                if state.store.get(*dres, dkey).is_some() {
                    left += 1;
                    let _ = delete(
                        state,
                        *dres,
                        dkey,
                        &DeleteOptions {
                            propagation: Some("Foreground".into()),
                            ..Default::default()
                        },
                    );
                }
            }
            if left == 0 {
                remove_finalizer(state, res, key, "foregroundDeletion");
            }
        }
    }
}

fn drop_owner(obj: &mut Value, uid: &str) -> bool {
    let Some(refs) = obj
        .pointer_mut("/metadata/ownerReferences")
        .and_then(Value::as_array_mut)
    else {
        return false;
    };
    let before = refs.len();
    refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
    before != refs.len()
}

/// Removes a finalizer and, if that was the last thing holding the object, the object.
fn remove_finalizer(state: &State, res: ResId, key: &ObjKey, finalizer: &str) {
    let _ = modify(state, res, key, |o| {
        let Some(list) = o
            .pointer_mut("/metadata/finalizers")
            .and_then(Value::as_array_mut)
        else {
            return false;
        };
        list.retain(|f| f.as_str() != Some(finalizer));
        true
    });
    if let Some(e) = state.store.get(res, key)
        && meta::deleting(&e.object)
        && meta::finalizers(&e.object).is_empty()
    {
        let _ = state.store.remove(res, key, Some(e.rv));
    }
}

impl Reconciler for Gc {
    async fn resync(&mut self, state: &State) {
        *self = Gc::default();
        for (res, rt) in RESOURCES.iter().enumerate() {
            if rt.create_only || rt.read_only {
                continue;
            }
            let (items, _, _) = state.store.list(res, None, None, None, |_| true);
            for e in items {
                let key = ObjKey::new(
                    meta::namespace(&e.object).unwrap_or_default(),
                    meta::name(&e.object).unwrap_or_default(),
                );
                self.index((res, key), &e.object);
            }
        }
        let orphans: Vec<String> = self
            .dependents
            .keys()
            .filter(|o| !self.live(o))
            .cloned()
            .collect();
        for owner in orphans {
            self.collect(state, &owner);
        }
    }

    async fn changed(&mut self, state: &State, events: Option<&[Arc<Event>]>) {
        let Some(events) = events else { return };
        for e in events {
            let r = (e.res, e.key.clone());
            match e.kind {
                EventType::Added | EventType::Modified => {
                    self.index(r.clone(), &e.entry.object);
                    if meta::deleting(&e.entry.object) {
                        self.finalize(state, e.res, &e.key, &e.entry.object);
                    }
                }
                EventType::Deleted => {
                    let uid = meta::meta_str(&e.entry.object, "uid")
                        .unwrap_or_default()
                        .to_owned();
                    self.unindex(&r);
                    self.collect(state, &uid);
                    if e.res == *ids::NODES {
                        pods_of_deleted_node(state, &e.key.name);
                    }
                }
            }
            // A dependent that starts deleting may unblock its foreground owner.
            if meta::deleting(&e.entry.object) || e.kind == EventType::Deleted {
                let owners: Vec<String> = owner_uids(&e.entry.object).map(str::to_owned).collect();
                for owner in owners {
                    if let Some((ores, okey)) = self.by_uid.get(&owner).cloned()
                        && let Some(o) = state.store.get(ores, &okey)
                        && meta::deleting(&o.object)
                    {
                        self.finalize(state, ores, &okey, &o.object);
                    }
                }
            }
        }
    }
}

/// The pod garbage collector's rule for pods bound to a node that no longer exists: they are
/// deleted at once, their kubelet being gone.
fn pods_of_deleted_node(state: &State, node: &str) {
    let (pods, _, _) = state.store.list(*ids::PODS, None, None, None, |e| {
        e.object.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node)
    });
    for p in pods {
        let key = ObjKey::new(
            meta::namespace(&p.object).unwrap_or_default(),
            meta::name(&p.object).unwrap_or_default(),
        );
        let _ = delete(
            state,
            *ids::PODS,
            &key,
            &DeleteOptions {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        );
    }
}
