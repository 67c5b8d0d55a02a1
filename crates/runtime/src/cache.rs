//! A watch cache that keeps each object as its JSON encoding, decoded when read.
//!
//! Why not kube's reflector store: it keeps typed objects, and a typed k8s-openapi object is
//! mostly empty optional fields held inline (a `Container`, a `Volume` are each kilobytes of
//! `None`s). The virtual node caches every pod of its node twice, upper and lower; at 10,000 pods
//! the two typed stores held ~245 MB (heaptrack), ~12 KB per pod, where the same pods are ~2-3 KB
//! of JSON. A reconcile reads a pod a few times per change, so decoding on read costs
//! microseconds where typed storage cost most of the process's memory.
//!
//! The JSON is also LZ4-compressed against a dictionary: the first object the cache encodes.
//! The objects of one cache are alike (our pods share keys, namespaces, images, volumes,
//! tolerations), so most of an object is a match in the dictionary. On real clusters a pod
//! was ~2.8 KB of JSON (20,000 of them at 10,000 pods, upper and lower); compressed it is a
//! fraction of that, and a decode costs a few microseconds more.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use kube::runtime::watcher;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

/// An object's key: its namespace (empty for cluster-scoped objects) and name, the same in
/// both clusters for what we copy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// The namespace; empty for a cluster-scoped object.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl Key {
    /// The key of `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Key {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// A cache filled from a watcher's events (see [`CompactCache::apply`]); cheap to clone, all
/// clones share the content.
pub struct CompactCache<K> {
    inner: Arc<Inner>,
    _kind: PhantomData<fn() -> K>,
}

impl<K> Clone for CompactCache<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            _kind: PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for CompactCache<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompactCache")
            .field("len", &self.inner.objects.read().map_or(0, |o| o.len()))
            .finish_non_exhaustive()
    }
}

struct Inner {
    /// The dictionary of every encoded object, set by the first one (up to [`MAX_DICT`]).
    dict: OnceLock<Box<[u8]>>,
    objects: RwLock<HashMap<Key, Box<[u8]>>>,
    /// The objects of a (re-)list in progress; they replace `objects` when it is complete.
    relist: Mutex<Option<HashMap<Key, Box<[u8]>>>>,
    ready: watch::Sender<bool>,
}

impl<K> Default for CompactCache<K> {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                dict: OnceLock::new(),
                objects: RwLock::default(),
                relist: Mutex::default(),
                ready: watch::Sender::new(false),
            }),
            _kind: PhantomData,
        }
    }
}

fn key_of<K: kube::Resource>(o: &K) -> Option<Key> {
    let m = o.meta();
    Some(Key::new(
        m.namespace.clone().unwrap_or_default(),
        m.name.clone()?,
    ))
}

impl<K> CompactCache<K>
where
    K: kube::Resource + Serialize + DeserializeOwned,
{
    /// An empty cache, not ready until its first list is complete.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one watcher event, as kube's reflector does: a list replaces the content when it
    /// is complete (and the cache is ready from then on), changes apply at once.
    pub fn apply(&self, event: &watcher::Event<K>) {
        let _ = self.apply_keys(event);
    }

    /// [`Self::apply_keys`], returning the objects instead of their keys: each as the cache
    /// shows it now, or as it last showed it when it is gone (deleted, or dropped by a
    /// re-list).
    pub fn apply_objects(&self, event: &watcher::Event<K>) -> Vec<K>
    where
        K: Clone,
    {
        match event {
            watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                self.apply(event);
                vec![o.clone()]
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {
                self.apply(event);
                Vec::new()
            }
            watcher::Event::InitDone => {
                let listed: std::collections::HashSet<Key> = self
                    .inner
                    .relist
                    .lock()
                    .ok()
                    .and_then(|r| r.as_ref().map(|m| m.keys().cloned().collect()))
                    .unwrap_or_default();
                // The dropped ones as the previous list had them, before it goes.
                let mut objects: Vec<K> = self
                    .inner
                    .objects
                    .read()
                    .map(|o| {
                        o.iter()
                            .filter(|(k, _)| !listed.contains(*k))
                            .filter_map(|(_, v)| self.inner.decode(v))
                            .collect()
                    })
                    .unwrap_or_default();
                self.apply(event);
                objects.extend(
                    listed
                        .iter()
                        .filter_map(|k| self.get(&k.namespace, &k.name)),
                );
                objects
            }
        }
    }

    /// [`Self::apply`], returning the keys whose objects may have changed as the cache shows
    /// them now: the object of a change or deletion at once; none while a (re-)list is in
    /// progress, and when it completes every key it listed and every key it dropped. Whoever
    /// reconciles these keys from the cache reads what caused them. kube's `touched_objects`
    /// hands out a re-list's objects as they arrive, while the cache still shows the previous
    /// list: a reconcile then decides on the old state, and when the list completes nothing
    /// comes back for the objects that changed while the watch was down (after an API server
    /// restart, a lower pod that became Running meanwhile stayed Pending upstairs for good).
    pub fn apply_keys(&self, event: &watcher::Event<K>) -> Vec<Key> {
        match event {
            watcher::Event::Init => {
                if let Ok(mut r) = self.inner.relist.lock() {
                    *r = Some(HashMap::new());
                }
                Vec::new()
            }
            watcher::Event::InitApply(o) => {
                if let (Some(k), Some(v), Ok(mut r)) =
                    (key_of(o), self.inner.encode(o), self.inner.relist.lock())
                    && let Some(r) = r.as_mut()
                {
                    r.insert(k, v);
                }
                Vec::new()
            }
            watcher::Event::InitDone => {
                let listed = self.inner.relist.lock().ok().and_then(|mut r| r.take());
                let mut touched = Vec::new();
                if let (Some(listed), Ok(mut objects)) = (listed, self.inner.objects.write()) {
                    touched.extend(objects.keys().filter(|k| !listed.contains_key(*k)).cloned());
                    touched.extend(listed.keys().cloned());
                    *objects = listed;
                }
                self.inner.ready.send_replace(true);
                touched
            }
            watcher::Event::Apply(o) => {
                let Some(k) = key_of(o) else {
                    return Vec::new();
                };
                if let (Some(v), Ok(mut objects)) =
                    (self.inner.encode(o), self.inner.objects.write())
                {
                    objects.insert(k.clone(), v);
                }
                vec![k]
            }
            watcher::Event::Delete(o) => {
                let Some(k) = key_of(o) else {
                    return Vec::new();
                };
                if let Ok(mut objects) = self.inner.objects.write() {
                    objects.remove(&k);
                }
                vec![k]
            }
        }
    }

    /// Forgets `namespace/name` (a cache filled per object, not from one list).
    pub fn remove(&self, namespace: &str, name: &str) {
        if let Ok(mut objects) = self.inner.objects.write() {
            objects.remove(&Key::new(namespace, name));
        }
    }

    /// The object `namespace/name`, decoded.
    pub fn get(&self, namespace: &str, name: &str) -> Option<K> {
        self.get_as(namespace, name)
    }

    /// The part of the object `namespace/name` that `T` names (serde skips the rest), for a
    /// reader that needs a few fields of many objects.
    pub fn get_as<T: DeserializeOwned>(&self, namespace: &str, name: &str) -> Option<T> {
        let objects = self.inner.objects.read().ok()?;
        objects
            .get(&Key::new(namespace, name))
            .and_then(|v| self.inner.decode(v))
    }

    /// The object `namespace/name` from the cache, or, when the cache does not have it (not yet
    /// seen, or absent), from the API server: a miss is rare and must not be taken for absence.
    pub async fn get_or_fetch(
        &self,
        api: &kube::Api<K>,
        namespace: &str,
        name: &str,
    ) -> Result<Option<K>, kube::Error>
    where
        K: Clone + std::fmt::Debug,
    {
        match self.get(namespace, name) {
            Some(o) => Ok(Some(o)),
            None => api.get_opt(name).await,
        }
    }

    /// Whether `namespace/name` is cached (nothing decoded).
    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        self.inner
            .objects
            .read()
            .is_ok_and(|o| o.contains_key(&Key::new(namespace, name)))
    }

    /// The keys of every cached object.
    pub fn keys(&self) -> Vec<Key> {
        self.inner
            .objects
            .read()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Every cached object, decoded.
    pub fn state(&self) -> Vec<K> {
        let Ok(objects) = self.inner.objects.read() else {
            return Vec::new();
        };
        objects
            .values()
            .filter_map(|v| self.inner.decode(v))
            .collect()
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        self.inner.objects.read().map_or(0, |o| o.len())
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the first list is complete.
    pub fn is_ready(&self) -> bool {
        *self.inner.ready.borrow()
    }

    /// Waits until the first list is complete.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.inner.ready.subscribe();
        // The sender lives in `self`: the wait cannot fail while we hold it.
        let _ = ready.wait_for(|r| *r).await;
    }
}

/// LZ4 refers back at most 64 KiB: a longer dictionary would be dead weight.
const MAX_DICT: usize = 64 * 1024;

/// A watch's events, or its error.
type Events<K> = Result<watcher::Event<K>, watcher::Error>;

impl<K> CompactCache<K>
where
    K: kube::Resource + Serialize + DeserializeOwned + Clone + Send + 'static,
{
    /// `events` applied to this cache, as the keys to reconcile once it shows them
    /// ([`Self::apply_keys`]); `observe` sees each event first.
    pub fn keys_shown(
        &self,
        events: impl futures::Stream<Item = Events<K>> + Send + 'static,
        mut observe: impl FnMut(&watcher::Event<K>) + Send + 'static,
    ) -> futures::stream::BoxStream<'static, Result<Key, watcher::Error>> {
        use futures::{StreamExt as _, TryStreamExt as _};
        let cache = self.clone();
        events
            .map_ok(move |e| {
                observe(&e);
                futures::stream::iter(cache.apply_keys(&e).into_iter().map(Ok))
            })
            .try_flatten()
            .boxed()
    }

    /// [`Self::keys_shown`], the objects ([`Self::apply_objects`]).
    pub fn objects_shown(
        &self,
        events: impl futures::Stream<Item = Events<K>> + Send + 'static,
        mut observe: impl FnMut(&watcher::Event<K>) + Send + 'static,
    ) -> futures::stream::BoxStream<'static, Result<K, watcher::Error>> {
        use futures::{StreamExt as _, TryStreamExt as _};
        let cache = self.clone();
        events
            .map_ok(move |e| {
                observe(&e);
                futures::stream::iter(cache.apply_objects(&e).into_iter().map(Ok))
            })
            .try_flatten()
            .boxed()
    }
}

impl Inner {
    fn encode<K: Serialize>(&self, o: &K) -> Option<Box<[u8]>> {
        let json = match serde_json::to_vec(o) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode an object for the cache");
                return None;
            }
        };
        let dict = self.dict.get_or_init(|| {
            json[json.len().saturating_sub(MAX_DICT)..]
                .to_vec()
                .into_boxed_slice()
        });
        Some(lz4_flex::block::compress_prepend_size_with_dict(&json, dict).into_boxed_slice())
    }

    fn decode<K: DeserializeOwned>(&self, v: &[u8]) -> Option<K> {
        let dict = self.dict.get().map_or(&[][..], |d| &d[..]);
        let json = match lz4_flex::block::decompress_size_prepended_with_dict(v, dict) {
            Ok(json) => json,
            Err(e) => {
                tracing::error!(error = %e, "cannot decompress a cached object");
                return None;
            }
        };
        match serde_json::from_slice(&json) {
            Ok(o) => Some(o),
            Err(e) => {
                tracing::error!(error = %e, "cannot decode a cached object");
                None
            }
        }
    }
}

/// The keys a watch has delivered, for a consumer that keeps its own state (a capacity model)
/// rather than a [`CompactCache`]: a re-list applies its objects as they arrive, and when it is
/// complete [`ListedKeys::record`] returns the keys it no longer listed, which the consumer
/// must drop (they were deleted while the watch was down).
#[derive(Debug, Default)]
pub struct ListedKeys {
    known: std::collections::HashSet<Key>,
    relist: Option<std::collections::HashSet<Key>>,
    synced: bool,
}

impl ListedKeys {
    /// Records an event; returns the keys a completed re-list dropped.
    pub fn record<K: kube::Resource>(&mut self, event: &watcher::Event<K>) -> Vec<Key> {
        match event {
            watcher::Event::Init => self.relist = Some(std::collections::HashSet::new()),
            watcher::Event::InitApply(o) => {
                if let Some(k) = key_of(o) {
                    if let Some(r) = self.relist.as_mut() {
                        r.insert(k.clone());
                    }
                    self.known.insert(k);
                }
            }
            watcher::Event::InitDone => {
                self.synced = true;
                if let Some(listed) = self.relist.take() {
                    let gone: Vec<Key> = self.known.difference(&listed).cloned().collect();
                    self.known = listed;
                    return gone;
                }
            }
            watcher::Event::Apply(o) => {
                if let Some(k) = key_of(o) {
                    self.known.insert(k);
                }
            }
            watcher::Event::Delete(o) => {
                if let Some(k) = key_of(o) {
                    self.known.remove(&k);
                }
            }
        }
        Vec::new()
    }

    /// Whether a first list has completed.
    pub fn synced(&self) -> bool {
        self.synced
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn pod(name: &str, image: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "c", "image": image}], "nodeName": "vk"},
            "status": {"phase": "Running", "podIP": "10.0.0.1"}
        }))
        .unwrap()
    }

    /// A consumer reconciles each key it is handed from the cache: the cache must then show
    /// the object that caused it. A re-list (a watch expired while its API server restarted)
    /// hands out its keys only once it is complete, with the keys it dropped.
    #[test]
    fn keys_come_when_the_cache_shows_their_objects_and_a_relist_when_complete() {
        let cache = CompactCache::<Pod>::new();
        let image = |name: &str| {
            let p = cache.get("default", name)?;
            p.spec?.containers.first()?.image.clone()
        };
        let mut handed = Vec::new();
        let events = [
            watcher::Event::Init,
            watcher::Event::InitApply(pod("a", "v1")),
            watcher::Event::InitApply(pod("b", "v1")),
            watcher::Event::InitDone,
            watcher::Event::Apply(pod("c", "v1")),
            watcher::Event::Apply(pod("a", "v2")),
            // The watch expired: a re-list where a changed, b is gone and d is new.
            watcher::Event::Init,
            watcher::Event::InitApply(pod("a", "v3")),
            watcher::Event::InitApply(pod("c", "v1")),
            watcher::Event::InitApply(pod("d", "v1")),
            watcher::Event::InitDone,
            watcher::Event::Delete(pod("d", "v1")),
        ];
        for event in &events {
            let mut keys = cache.apply_keys(event);
            keys.sort();
            for Key { name, .. } in &keys {
                handed.push((name.clone(), image(name)));
            }
        }
        let at = |name: &str, image: Option<&str>| (name.to_owned(), image.map(str::to_owned));
        assert_eq!(
            handed,
            vec![
                at("a", Some("v1")),
                at("b", Some("v1")),
                at("c", Some("v1")),
                at("a", Some("v2")),
                // Only when the re-list is complete, each as it listed it (b: gone).
                at("a", Some("v3")),
                at("b", None),
                at("c", Some("v1")),
                at("d", Some("v1")),
                at("d", None),
            ]
        );
    }

    #[test]
    fn a_relist_hands_out_its_objects_when_complete_and_the_dropped_ones_as_last_seen() {
        let cache = CompactCache::<Pod>::new();
        let images = |objects: Vec<Pod>| {
            let mut v: Vec<(String, String)> = objects
                .into_iter()
                .map(|p| {
                    let image = p.spec.unwrap().containers[0].image.clone().unwrap();
                    (p.metadata.name.unwrap(), image)
                })
                .collect();
            v.sort();
            v
        };
        let pair = |n: &str, i: &str| (n.to_owned(), i.to_owned());
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(pod("a", "v1")),
            watcher::Event::InitApply(pod("b", "v1")),
        ] {
            assert!(cache.apply_objects(&e).is_empty());
        }
        assert_eq!(
            images(cache.apply_objects(&watcher::Event::InitDone)),
            vec![pair("a", "v1"), pair("b", "v1")]
        );
        assert_eq!(
            images(cache.apply_objects(&watcher::Event::Apply(pod("a", "v2")))),
            vec![pair("a", "v2")]
        );
        cache.apply_objects(&watcher::Event::Init);
        cache.apply_objects(&watcher::Event::InitApply(pod("a", "v3")));
        assert_eq!(
            images(cache.apply_objects(&watcher::Event::InitDone)),
            vec![pair("a", "v3"), pair("b", "v1")],
            "b was dropped: as last seen"
        );
        assert!(cache.get("default", "b").is_none());
    }

    #[tokio::test]
    async fn a_list_fills_it_then_changes_apply_and_objects_read_back_equal() {
        let cache = CompactCache::<Pod>::new();
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitApply(pod("a", "v1")));
        assert!(cache.is_empty(), "a list shows only when complete");
        assert!(
            tokio::time::timeout(
                std::time::Duration::from_millis(10),
                cache.wait_until_ready()
            )
            .await
            .is_err()
        );
        cache.apply(&watcher::Event::InitDone);
        cache.wait_until_ready().await;
        assert_eq!(cache.get("default", "a"), Some(pod("a", "v1")));

        cache.apply(&watcher::Event::Apply(pod("a", "v2")));
        cache.apply(&watcher::Event::Apply(pod("b", "v1")));
        assert_eq!(cache.get("default", "a"), Some(pod("a", "v2")));
        assert!(cache.contains("default", "b") && !cache.contains("other", "b"));
        let mut keys = cache.keys();
        keys.sort();
        assert_eq!(keys, [Key::new("default", "a"), Key::new("default", "b")]);
        cache.apply(&watcher::Event::Delete(pod("a", "v2")));
        assert_eq!(cache.get("default", "a"), None);
        assert_eq!(cache.state(), [pod("b", "v1")]);
    }

    #[test]
    fn a_relist_replaces_everything_when_complete() {
        let cache = CompactCache::<Pod>::new();
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(pod("gone", "v1")),
            watcher::Event::InitApply(pod("kept", "v1")),
            watcher::Event::InitDone,
            watcher::Event::Init,
            watcher::Event::InitApply(pod("kept", "v2")),
        ] {
            cache.apply(&e);
        }
        assert_eq!(
            cache.len(),
            2,
            "the old content stays until the relist is done"
        );
        cache.apply(&watcher::Event::InitDone);
        assert_eq!(cache.state(), [pod("kept", "v2")]);
    }

    #[test]
    fn a_pod_takes_a_fraction_of_its_typed_size() {
        // The sim's pods: one container and the service-account token volume.
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": "web-1", "uid": "u",
                "labels": {"app": "web"}},
            "spec": {
                "containers": [{"name": "c", "image": "nginx",
                    "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets"}]}],
                "volumes": [{"name": "kube-api-access", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
                ]}}],
                "tolerations": [
                    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
                ],
                "nodeName": "vk"
            }
        }))
        .unwrap();
        let typed = std::mem::size_of::<Pod>()
            + std::mem::size_of::<k8s_openapi::api::core::v1::Container>()
            + std::mem::size_of::<k8s_openapi::api::core::v1::Volume>()
            + 3 * std::mem::size_of::<k8s_openapi::api::core::v1::VolumeProjection>();
        let cache = CompactCache::<Pod>::new();
        let json = serde_json::to_vec(&p).unwrap().len();
        let compact = cache.inner.encode(&p).unwrap().len();
        assert!(
            compact * 3 < typed,
            "{compact} bytes compressed vs {typed} typed"
        );
        // Another pod of the same kind, against the first one as the dictionary.
        let mut other = p.clone();
        other.metadata.name = Some("web-2".into());
        other.metadata.uid = Some("a8d3c2e4-5b9f-4d21-9a6e-0c7f3b1d2e45".into());
        let encoded = cache.inner.encode(&other).unwrap();
        assert!(
            encoded.len() * 4 < json,
            "{} bytes compressed vs {json} of JSON",
            encoded.len()
        );
        assert_eq!(cache.inner.decode::<Pod>(&encoded), Some(other));
    }

    #[test]
    fn a_relist_drops_what_it_no_longer_lists() {
        let node = |name: &str| -> k8s_openapi::api::core::v1::Node {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
        };
        let mut l = ListedKeys::default();
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(node("a")),
            watcher::Event::InitApply(node("b")),
        ] {
            assert!(l.record(&e).is_empty());
        }
        assert!(!l.synced());
        assert!(
            l.record(&watcher::Event::<k8s_openapi::api::core::v1::Node>::InitDone)
                .is_empty()
        );
        assert!(l.synced());
        l.record(&watcher::Event::<k8s_openapi::api::core::v1::Node>::Init);
        l.record(&watcher::Event::InitApply(node("b")));
        assert_eq!(
            l.record(&watcher::Event::<k8s_openapi::api::core::v1::Node>::InitDone),
            vec![Key::new("", "a")]
        );
    }
}
