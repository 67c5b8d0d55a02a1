//! In-memory storage with the semantics controllers depend on: one global, monotonically
//! increasing resourceVersion; compare-and-swap updates (409 on a stale resourceVersion); and
//! an event log from which watches replay any resourceVersion still retained (410 Expired
//! otherwise).
//!
//! All watches read the one shared log: a write appends an event and wakes the watchers, each
//! of which takes the events after its own cursor. The log is the only buffer, bounded as
//! kube-apiserver's watch cache is: it keeps the events of the last [`EVENT_FRESH`] (at least
//! [`KEEP_AT_LEAST`] of them, at most its capacity) and drops older ones, so its memory follows
//! the write rate, not the writes since start. Each event holds a version of an object that a
//! newer write may have superseded; with every change kept, a run's history was most of the
//! simulated clusters' memory. A watcher that falls behind past the log gets 410 like a real
//! one and lists again.
//! A watch of one resource (an API watch) is woken by that resource's writes only, and takes
//! only its events: a virtual node watches each ConfigMap and Secret its pods mount, one watch
//! per object, and every pod status written used to wake each of those thousands of watches.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::Notify;

use super::resources::ResId;

/// How long the log keeps an event: kube-apiserver's watch cache keeps 75 s of events (its
/// bookmark period and a margin), so a watch resumed from its last bookmark finds them.
pub const EVENT_FRESH: Duration = Duration::from_secs(75);

/// The log keeps this many events however old (the watch cache's lower bound per resource),
/// so a quiet server still resumes a watch that reconnects a little late.
pub const KEEP_AT_LEAST: usize = 100;

/// Namespace ("" for cluster-scoped objects) and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjKey {
    /// Namespace, empty for cluster-scoped objects.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjKey {
    /// A key.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// A stored object, shared (never copied) between readers.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The object, with `metadata.resourceVersion` set.
    pub object: Arc<Value>,
    /// Its JSON, serialized once at write time.
    pub json: Bytes,
    /// Its resourceVersion.
    pub rv: u64,
}

/// Watch event types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed; the object is its last state.
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug)]
pub struct Event {
    /// The resourceVersion of the change.
    pub rv: u64,
    /// Which resource.
    pub res: ResId,
    /// What happened.
    pub kind: EventType,
    /// Which object.
    pub key: ObjKey,
    /// The object after the change (its last state, for deletions).
    pub entry: Entry,
    /// The object before a modification, so filtered watches can tell an object that stops
    /// matching (sent as DELETED) from one that starts matching (sent as ADDED). It shares its
    /// data with the previous event of the object: it costs nothing while that one is kept.
    pub prev: Option<Entry>,
}

/// Storage failures; the API layer turns them into Status errors.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No such object.
    #[error("not found")]
    NotFound,
    /// An object with that key exists.
    #[error("already exists")]
    AlreadyExists,
    /// The object changed since the given resourceVersion.
    #[error(
        "the object has been modified; please apply your changes to the latest version and try again"
    )]
    Conflict,
    /// The requested resourceVersion is older than the retained history.
    #[error("too old resource version: {requested} ({oldest})")]
    Expired {
        /// What was asked.
        requested: u64,
        /// The oldest resourceVersion still replayable.
        oldest: u64,
    },
}

struct Inner {
    rv: u64,
    objects: Vec<BTreeMap<ObjKey, Entry>>,
    /// Per resource, the resourceVersion of its last change (0: never changed).
    changed_at: Vec<u64>,
    /// The events, with when each was recorded.
    log: VecDeque<(Instant, Arc<Event>)>,
    /// The objects each controller owns (by the controller's UID), kept as objects change:
    /// what kube-controller-manager's informers index by owner, so a ReplicaSet or Job with
    /// thousands of pods finds its own without scanning every pod of the namespace.
    controlled: HashMap<(ResId, String), BTreeSet<ObjKey>>,
    /// Every event with rv > floor is in the log.
    floor: u64,
    /// Per resource, the resourceVersion of its newest event dropped from the log: a watch of
    /// the resource whose cursor is at or after it lost none of its events, however far the
    /// floor moved past it while the resource was quiet.
    dropped: Vec<u64>,
    /// The most events the log keeps.
    capacity: usize,
    /// Events older than this are dropped (beyond the first `keep_at_least`).
    fresh: Duration,
    keep_at_least: usize,
}

/// The store of one API server.
pub struct Store {
    inner: Mutex<Inner>,
    /// Woken by every write.
    changed: Notify,
    /// Per resource, woken by its writes.
    changed_res: Vec<Notify>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("rv", &self.current_rv())
            .finish()
    }
}

impl Store {
    /// A store for `resources` resource types whose event log keeps the events of the last
    /// [`EVENT_FRESH`], at most `capacity` of them.
    pub fn new(resources: usize, capacity: usize) -> Self {
        Self::with_history(resources, capacity, EVENT_FRESH, KEEP_AT_LEAST)
    }

    /// [`Store::new`] keeping `fresh` of events, at least `keep_at_least` of them.
    fn with_history(
        resources: usize,
        capacity: usize,
        fresh: Duration,
        keep_at_least: usize,
    ) -> Self {
        Self {
            inner: Mutex::new(Inner {
                rv: 1,
                objects: (0..resources).map(|_| BTreeMap::new()).collect(),
                changed_at: vec![0; resources],
                log: VecDeque::new(),
                controlled: HashMap::new(),
                floor: 1,
                dropped: vec![0; resources],
                capacity: capacity.max(1),
                fresh,
                keep_at_least,
            }),
            changed: Notify::new(),
            changed_res: (0..resources).map(|_| Notify::new()).collect(),
        }
    }

    /// Wakes the watches of every resource and those of `res`.
    fn wake(&self, res: ResId) {
        self.changed.notify_waiters();
        if let Some(n) = self.changed_res.get(res) {
            n.notify_waiters();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated (every mutation
        // is a single insert/remove after all fallible work), so a poisoned lock is usable.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The newest resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// The resourceVersion of the last change (create, update or removal) of any object of a
    /// resource, 0 if there was none: a cheap way to tell whether a cache built from a
    /// resource's objects is still current.
    pub fn changed_at(&self, res: ResId) -> u64 {
        self.lock().changed_at.get(res).copied().unwrap_or(0)
    }

    /// One object.
    pub fn get(&self, res: ResId, key: &ObjKey) -> Option<Entry> {
        self.lock().objects.get(res)?.get(key).cloned()
    }

    /// Objects of a resource, in one namespace or all, in key order, after `start_after`
    /// (pagination), at most `limit`; with the store's resourceVersion at that moment and
    /// whether more remain.
    pub fn list(
        &self,
        res: ResId,
        namespace: Option<&str>,
        start_after: Option<&ObjKey>,
        limit: Option<usize>,
        filter: impl FnMut(&Entry) -> bool,
    ) -> (Vec<Entry>, u64, Option<ObjKey>) {
        let (items, rv, more) = self.list_page(res, namespace, start_after, limit, filter);
        (items, rv, more.map(|(k, _)| k))
    }

    /// The objects of a resource in `namespace` whose controller (the owner reference with
    /// `controller: true`) has `uid`, in key order.
    pub fn list_controlled(&self, res: ResId, namespace: &str, uid: &str) -> Vec<Entry> {
        let inner = self.lock();
        let (Some(keys), Some(table)) = (
            inner.controlled.get(&(res, uid.to_owned())),
            inner.objects.get(res),
        ) else {
            return Vec::new();
        };
        keys.iter()
            .filter(|k| k.namespace == namespace)
            .filter_map(|k| table.get(k).cloned())
            .collect()
    }

    /// [`Store::list`], and with the last key of a cut page how many matching objects follow
    /// it (a list's `remainingItemCount`).
    pub fn list_page(
        &self,
        res: ResId,
        namespace: Option<&str>,
        start_after: Option<&ObjKey>,
        limit: Option<usize>,
        mut filter: impl FnMut(&Entry) -> bool,
    ) -> (Vec<Entry>, u64, Option<(ObjKey, usize)>) {
        let inner = self.lock();
        let Some(table) = inner.objects.get(res) else {
            return (Vec::new(), inner.rv, None);
        };
        let lower = match (start_after, namespace) {
            (Some(k), _) => Bound::Excluded(k.clone()),
            (None, Some(ns)) => Bound::Included(ObjKey::new(ns, "")),
            (None, None) => Bound::Unbounded,
        };
        let mut out = Vec::new();
        let mut last = None;
        let mut remaining = 0;
        for (key, entry) in table.range((lower, Bound::Unbounded)) {
            if let Some(ns) = namespace
                && key.namespace != ns
            {
                break;
            }
            if !filter(entry) {
                continue;
            }
            if limit.is_some_and(|l| out.len() >= l) {
                remaining += 1;
                continue;
            }
            out.push(entry.clone());
            last = Some(key.clone());
        }
        let more = (remaining > 0).then_some(last).flatten();
        (out, inner.rv, more.map(|k| (k, remaining)))
    }

    /// Stores a new object. The object's `metadata.resourceVersion` is set here.
    pub fn create(&self, res: ResId, key: ObjKey, object: Value) -> Result<Entry, StoreError> {
        let mut inner = self.lock();
        if inner.objects.get(res).is_some_and(|t| t.contains_key(&key)) {
            return Err(StoreError::AlreadyExists);
        }
        let entry = inner.commit(res, key, object, EventType::Added);
        drop(inner);
        self.wake(res);
        Ok(entry)
    }

    /// Replaces an object if its resourceVersion is still `expected` (when given).
    pub fn replace(
        &self,
        res: ResId,
        key: ObjKey,
        object: Value,
        expected: Option<u64>,
    ) -> Result<Entry, StoreError> {
        let mut inner = self.lock();
        let current = inner
            .objects
            .get(res)
            .and_then(|t| t.get(&key))
            .map(|e| e.rv);
        match (current, expected) {
            (None, _) => return Err(StoreError::NotFound),
            (Some(rv), Some(exp)) if rv != exp => return Err(StoreError::Conflict),
            _ => {}
        }
        let entry = inner.commit(res, key, object, EventType::Modified);
        drop(inner);
        self.wake(res);
        Ok(entry)
    }

    /// Removes an object if its resourceVersion is still `expected` (when given); the DELETED
    /// event carries the last state with a new resourceVersion, as etcd-backed servers do.
    pub fn remove(
        &self,
        res: ResId,
        key: &ObjKey,
        expected: Option<u64>,
    ) -> Result<Entry, StoreError> {
        let mut inner = self.lock();
        let current = inner
            .objects
            .get(res)
            .and_then(|t| t.get(key))
            .map(|e| e.rv);
        match (current, expected) {
            (None, _) => return Err(StoreError::NotFound),
            (Some(rv), Some(exp)) if rv != exp => return Err(StoreError::Conflict),
            _ => {}
        }
        let last = inner.objects.get_mut(res).and_then(|t| t.remove(key));
        if let Some(uid) = last.as_ref().and_then(|e| controller_uid(&e.object)) {
            inner.unindex(res, uid.to_owned(), key);
        }
        let object = last
            .map(|e| Arc::unwrap_or_clone(e.object))
            .unwrap_or(Value::Null);
        let entry = inner.record(res, key.clone(), object, EventType::Deleted, None);
        drop(inner);
        self.wake(res);
        Ok(entry)
    }

    /// Starts a watch after resourceVersion `from`: the retained events since then, and a
    /// cursor to wait for more.
    pub fn watch_from(&self, from: u64) -> Result<WatchCursor<'_>, StoreError> {
        self.cursor(None, from)
    }

    /// [`Store::watch_from`] for the events of `res` alone: woken by its writes only. Only
    /// the events of `res` count: a watch of a quiet resource resumed from a resourceVersion
    /// older than the log's start lost nothing if none of them was dropped since (the watch
    /// cache keeps a log per resource, and other resources' changes do not age it).
    pub fn watch_resource_from(
        &self,
        res: ResId,
        from: u64,
    ) -> Result<WatchCursor<'_>, StoreError> {
        self.cursor(Some(res), from)
    }

    /// A cursor after `from`, or 410 if events it would need were dropped: any resource's
    /// for a watch of all of them, `res`'s own for a watch of one.
    fn cursor(&self, res: Option<ResId>, from: u64) -> Result<WatchCursor<'_>, StoreError> {
        let inner = self.lock();
        let dropped = match res {
            Some(res) => inner.dropped.get(res).copied().unwrap_or(inner.floor),
            None => inner.floor,
        };
        if from < dropped {
            return Err(StoreError::Expired {
                requested: from,
                oldest: inner.floor,
            });
        }
        Ok(WatchCursor {
            store: self,
            after: from.min(inner.rv),
            res,
        })
    }
}

impl Inner {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn commit(&mut self, res: ResId, key: ObjKey, object: Value, kind: EventType) -> Entry {
        let prev = match kind {
            EventType::Modified => self.objects.get(res).and_then(|t| t.get(&key)).cloned(),
            _ => None,
        };
        let was = prev
            .as_ref()
            .and_then(|p| controller_uid(&p.object))
            .map(str::to_owned);
        let now = controller_uid(&object).map(str::to_owned);
        if was != now {
            if let Some(uid) = was {
                self.unindex(res, uid, &key);
            }
            if let Some(uid) = now {
                self.controlled
                    .entry((res, uid))
                    .or_default()
                    .insert(key.clone());
            }
        }
        let entry = self.record(res, key.clone(), object, kind, prev);
        if let Some(table) = self.objects.get_mut(res) {
            table.insert(key, entry.clone());
        }
        entry
    }

    fn unindex(&mut self, res: ResId, uid: String, key: &ObjKey) {
        let index = (res, uid);
        if let Some(keys) = self.controlled.get_mut(&index) {
            keys.remove(key);
            if keys.is_empty() {
                self.controlled.remove(&index);
            }
        }
    }

    /// Stamps the object with a new resourceVersion and appends the event.
    fn record(
        &mut self,
        res: ResId,
        key: ObjKey,
        mut object: Value,
        kind: EventType,
        prev: Option<Entry>,
    ) -> Entry {
        let rv = self.next_rv();
        if let Some(at) = self.changed_at.get_mut(res) {
            *at = rv;
        }
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        let json = Bytes::from(serde_json::to_vec(&object).unwrap_or_default());
        let entry = Entry {
            object: Arc::new(object),
            json,
            rv,
        };
        let now = Instant::now();
        self.trim(now);
        let event = Event {
            rv,
            res,
            kind,
            key,
            entry: entry.clone(),
            prev,
        };
        self.log.push_back((now, Arc::new(event)));
        entry
    }

    /// Makes room for one event: drops the oldest while the log is full, or holds more than
    /// `keep_at_least` events and the oldest is older than `fresh`.
    fn trim(&mut self, now: Instant) {
        while let Some((at, old)) = self.log.front() {
            let full = self.log.len() >= self.capacity;
            let stale = self.log.len() > self.keep_at_least && now.duration_since(*at) > self.fresh;
            if !(full || stale) {
                break;
            }
            self.floor = old.rv;
            if let Some(d) = self.dropped.get_mut(old.res) {
                *d = old.rv;
            }
            self.log.pop_front();
        }
        // A burst grew the buffer: give its memory back once the log is a quarter of it.
        if self.log.capacity() > 4 * self.log.len().max(1024) {
            self.log.shrink_to(2 * self.log.len().max(1024));
        }
    }
}

/// The UID in an object's controller reference (`ownerReferences[?(@.controller)].uid`).
fn controller_uid(object: &Value) -> Option<&str> {
    object
        .get("metadata")?
        .get("ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))?
        .get("uid")?
        .as_str()
}

/// A position in the event log.
#[derive(Debug)]
pub struct WatchCursor<'a> {
    store: &'a Store,
    after: u64,
    /// The one resource whose events it takes; `None`: every resource's.
    res: Option<ResId>,
}

impl WatchCursor<'_> {
    /// The resourceVersion of the last event handed out (or of the start).
    pub fn position(&self) -> u64 {
        self.after
    }

    /// Events after the cursor, waiting until there is at least one. Err when the cursor fell
    /// out of the retained log.
    pub async fn next_batch(&mut self) -> Result<Vec<Arc<Event>>, StoreError> {
        loop {
            let notified = match self.res.and_then(|r| self.store.changed_res.get(r)) {
                Some(n) => n.notified(),
                None => self.store.changed.notified(),
            };
            tokio::pin!(notified);
            notified.as_mut().enable();
            let batch = self.take()?;
            if !batch.is_empty() {
                return Ok(batch);
            }
            notified.await;
        }
    }

    /// Events after the cursor, without waiting.
    pub fn take(&mut self) -> Result<Vec<Arc<Event>>, StoreError> {
        let inner = self.store.lock();
        let lost = match self.res {
            // Only events of its resource count.
            Some(r) => self.after < inner.dropped.get(r).copied().unwrap_or(inner.floor),
            None => self.after < inner.floor,
        };
        if lost {
            return Err(StoreError::Expired {
                requested: self.after,
                oldest: inner.floor,
            });
        }
        // rvs are strictly increasing along the log: binary search the start.
        let start = inner.log.partition_point(|(_, e)| e.rv <= self.after);
        let batch: Vec<Arc<Event>> = inner
            .log
            .range(start..)
            .filter(|(_, e)| self.res.is_none_or(|r| e.res == r))
            .map(|(_, e)| Arc::clone(e))
            .collect();
        // Past every event looked at, of any resource.
        self.after = self.after.max(inner.rv);
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(name: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "ns"}})
    }

    #[test]
    fn objects_are_found_by_their_controller_as_owner_references_change() {
        let owned = |name: &str, ns: &str, uid: &str, controller: bool| {
            json!({"metadata": {"name": name, "namespace": ns,
                "ownerReferences": [{"uid": uid, "controller": controller}]}})
        };
        let names = |s: &Store, ns: &str, uid: &str| -> Vec<String> {
            s.list_controlled(0, ns, uid)
                .iter()
                .map(|e| e.object["metadata"]["name"].as_str().unwrap().to_owned())
                .collect()
        };
        let s = Store::new(2, 100);
        s.create(0, ObjKey::new("ns", "b"), owned("b", "ns", "rs1", true))
            .unwrap();
        s.create(0, ObjKey::new("ns", "a"), owned("a", "ns", "rs1", true))
            .unwrap();
        s.create(
            0,
            ObjKey::new("other", "c"),
            owned("c", "other", "rs1", true),
        )
        .unwrap();
        // An owner that is not the controller, and another resource, do not count.
        s.create(0, ObjKey::new("ns", "d"), owned("d", "ns", "rs1", false))
            .unwrap();
        s.create(1, ObjKey::new("ns", "e"), owned("e", "ns", "rs1", true))
            .unwrap();
        assert_eq!(names(&s, "ns", "rs1"), ["a", "b"]);
        // Released (orphaned) and adopted by another controller.
        s.replace(
            0,
            ObjKey::new("ns", "a"),
            owned("a", "ns", "rs2", true),
            None,
        )
        .unwrap();
        assert_eq!(names(&s, "ns", "rs1"), ["b"]);
        assert_eq!(names(&s, "ns", "rs2"), ["a"]);
        s.remove(0, &ObjKey::new("ns", "b"), None).unwrap();
        assert!(names(&s, "ns", "rs1").is_empty());
        assert_eq!(names(&s, "other", "rs1"), ["c"]);
    }

    #[test]
    fn resource_versions_increase_globally_and_conflicts_are_detected() {
        let s = Store::new(2, 100);
        let a = s.create(0, ObjKey::new("ns", "a"), obj("a")).unwrap();
        let b = s.create(1, ObjKey::new("ns", "b"), obj("b")).unwrap();
        assert!(b.rv > a.rv);
        assert_eq!(a.object["metadata"]["resourceVersion"], a.rv.to_string());
        assert_eq!(
            s.create(0, ObjKey::new("ns", "a"), obj("a")).unwrap_err(),
            StoreError::AlreadyExists
        );
        let a2 = s
            .replace(0, ObjKey::new("ns", "a"), obj("a"), Some(a.rv))
            .unwrap();
        assert_eq!(
            s.replace(0, ObjKey::new("ns", "a"), obj("a"), Some(a.rv))
                .unwrap_err(),
            StoreError::Conflict
        );
        assert_eq!(
            s.remove(0, &ObjKey::new("ns", "a"), Some(a.rv))
                .unwrap_err(),
            StoreError::Conflict
        );
        s.remove(0, &ObjKey::new("ns", "a"), Some(a2.rv)).unwrap();
        assert!(s.get(0, &ObjKey::new("ns", "a")).is_none());
    }

    #[test]
    fn list_paginates_in_key_order_within_a_namespace() {
        let s = Store::new(1, 100);
        for (ns, n) in [("a", "x"), ("b", "y"), ("b", "z"), ("c", "w")] {
            s.create(0, ObjKey::new(ns, n), json!({"metadata": {}}))
                .unwrap();
        }
        let (page, _, next) = s.list(0, Some("b"), None, Some(1), |_| true);
        assert_eq!(page.len(), 1);
        let (rest, _, more) = s.list(0, Some("b"), next.as_ref(), Some(1), |_| true);
        assert_eq!(rest.len(), 1);
        assert!(more.is_none());
        assert_eq!(s.list(0, None, None, None, |_| true).0.len(), 4);
    }

    #[tokio::test]
    async fn watch_replays_retained_events_and_expires_old_ones() {
        let s = Store::new(1, 3);
        let start = s.current_rv();
        for n in ["a", "b", "c", "d"] {
            s.create(0, ObjKey::new("ns", n), obj(n)).unwrap();
        }
        assert!(matches!(
            s.watch_from(start),
            Err(StoreError::Expired { .. })
        ));
        let mut w = s.watch_from(s.current_rv() - 2).unwrap();
        let batch = w.next_batch().await.unwrap();
        let names: Vec<_> = batch.iter().map(|e| e.key.name.as_str()).collect();
        assert_eq!(names, ["c", "d"]);
        let waiter = async { w.next_batch().await.unwrap() };
        let writer = async {
            tokio::task::yield_now().await;
            s.remove(0, &ObjKey::new("ns", "d"), None).unwrap();
        };
        let (batch, ()) = tokio::join!(waiter, writer);
        assert_eq!(batch[0].kind, EventType::Deleted);
        assert_eq!(batch[0].entry.object["metadata"]["name"], "d");
    }

    #[test]
    fn the_log_keeps_the_fresh_events_and_at_least_a_few() {
        let s = Store::with_history(1, 100, EVENT_FRESH, 3);
        let start = s.current_rv();
        for n in ["a", "b", "c", "d", "e"] {
            s.create(0, ObjKey::new("ns", n), obj(n)).unwrap();
        }
        // All fresh: all kept, under the capacity.
        assert_eq!(s.watch_from(start).unwrap().take().unwrap().len(), 5);
        // Once they are stale, trimming keeps the newest few.
        s.lock()
            .trim(Instant::now() + EVENT_FRESH + Duration::from_secs(1));
        let names = |from: u64| -> Vec<String> {
            let batch = s.watch_from(from).unwrap().take().unwrap();
            batch.iter().map(|e| e.key.name.clone()).collect()
        };
        assert!(matches!(
            s.watch_from(start),
            Err(StoreError::Expired { .. })
        ));
        assert_eq!(names(s.current_rv() - 3), ["c", "d", "e"]);
        // The objects themselves stay, whatever the log dropped.
        assert!(s.get(0, &ObjKey::new("ns", "a")).is_some());
        // Fresh events are dropped only past the capacity.
        let capped = Store::new(1, 2);
        let start = capped.current_rv();
        for n in ["a", "b", "c"] {
            capped.create(0, ObjKey::new("ns", n), obj(n)).unwrap();
        }
        assert!(capped.watch_from(start).is_err());
        assert_eq!(
            capped.watch_from(start + 1).unwrap().take().unwrap().len(),
            2
        );
    }

    #[tokio::test]
    async fn a_watch_of_one_resource_sees_its_events_alone_and_outlives_other_resources_churn() {
        let s = Store::new(2, 3);
        let mut quiet = s.watch_resource_from(0, s.current_rv()).unwrap();
        let mut all = s.watch_from(s.current_rv()).unwrap();
        s.create(1, ObjKey::new("ns", "other"), obj("other"))
            .unwrap();
        s.create(0, ObjKey::new("ns", "mine"), obj("mine")).unwrap();
        let names =
            |b: Vec<Arc<Event>>| -> Vec<String> { b.iter().map(|e| e.key.name.clone()).collect() };
        assert_eq!(names(quiet.take().unwrap()), ["mine"]);
        assert_eq!(names(all.take().unwrap()), ["other", "mine"]);
        // The other resource's writes push the floor past the quiet watch's cursor.
        for n in ["a", "b", "c", "d"] {
            s.create(1, ObjKey::new("ns", n), obj(n)).unwrap();
        }
        assert!(matches!(all.take(), Err(StoreError::Expired { .. })));
        // The quiet watch lost nothing of its own: no 410, its next event arrives alone.
        assert!(quiet.take().unwrap().is_empty());
        let waiter = async { quiet.next_batch().await.unwrap() };
        let writer = async {
            tokio::task::yield_now().await;
            s.create(1, ObjKey::new("ns", "e"), obj("e")).unwrap();
            s.remove(0, &ObjKey::new("ns", "mine"), None).unwrap();
        };
        let (batch, ()) = tokio::join!(waiter, writer);
        let seen: Vec<_> = batch.iter().map(|e| (e.res, e.kind)).collect();
        assert_eq!(seen, [(0, EventType::Deleted)]);
        // A watch of it resumed from before the other resource's churn lost nothing either.
        let resumed = s.watch_resource_from(0, s.current_rv() - 5).unwrap();
        assert_eq!(resumed.position(), s.current_rv() - 5);
        assert!(
            s.watch_resource_from(0, 2).is_err(),
            "its creation was dropped"
        );
        assert!(matches!(s.watch_from(1), Err(StoreError::Expired { .. })));
        // Once an event of its own is dropped unseen, it expires as any watch does.
        let mut behind = s.watch_resource_from(0, s.current_rv()).unwrap();
        s.create(0, ObjKey::new("ns", "x"), obj("x")).unwrap();
        for n in ["f", "g", "h"] {
            s.create(1, ObjKey::new("ns", n), obj(n)).unwrap();
        }
        assert!(matches!(behind.take(), Err(StoreError::Expired { .. })));
    }
}
