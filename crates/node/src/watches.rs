//! Upper ConfigMaps and Secrets read one object at a time, as the kubelet's watch-based
//! manager reads them: a watch of one namespace with the field selector `metadata.name=<name>`
//! per object a pod bound to the node references, started when the first such pod appears and
//! stopped when the last one goes (`crate::needs` counts them). Never a list or watch of the
//! whole cluster: the Node authorizer lets a node read exactly the objects its pods reference,
//! and a stolen node credential then reads no other Secret.
//!
//! Each watch fills the shared [`CompactCache`] with its one object (or removes it), and marks
//! the object known once its first list is complete: before that, its absence from the cache
//! means nothing. Every change (appearance, update, deletion, first list) is told to the
//! observers: the copy controller, and the pod controller, which tries again at once the pods
//! that wait for the object.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt as _;
use k8s_openapi::NamespaceResourceScope;
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use tensile_core::deps::object_watch_timeout;
use tensile_runtime::cache::{CompactCache, Key};

/// Told the key of an object whose state changed.
pub type Observer = Arc<dyn Fn(&Key) + Send + Sync>;

#[derive(Default)]
struct Inner {
    /// The objects watched.
    watched: HashMap<Key, Watched>,
    observers: Vec<Observer>,
    /// The id of the next watch started.
    next: u64,
}

struct Watched {
    /// Whether the first list is complete.
    synced: bool,
    stop: CancellationToken,
    /// Which watch this is (a key stopped and started again has a new one).
    id: u64,
}

/// The per-object watches of one kind; share it in an `Arc`.
pub struct ObjectWatches<K> {
    client: kube::Client,
    /// Every watch stops with it.
    parent: CancellationToken,
    what: &'static str,
    cache: CompactCache<K>,
    inner: Arc<Mutex<Inner>>,
}

impl<K> Debug for ObjectWatches<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectWatches")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl<K> ObjectWatches<K> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The objects being watched, as their watches last saw them.
    pub fn cache(&self) -> CompactCache<K> {
        self.cache.clone()
    }

    /// Whether `namespace/name` is watched and its first list is complete: its absence from
    /// the cache then means it does not exist.
    pub fn known(&self, namespace: &str, name: &str) -> bool {
        self.lock()
            .watched
            .get(&Key::new(namespace.to_owned(), name.to_owned()))
            .is_some_and(|w| w.synced)
    }

    /// How many objects are watched.
    pub fn len(&self) -> usize {
        self.lock().watched.len()
    }

    /// Whether no object is watched.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `observer` is told of every change of a watched object from now on.
    pub fn observe(&self, observer: Observer) {
        self.lock().observers.push(observer);
    }
}

impl<K> ObjectWatches<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    /// Watches of `what` (a kind, in logs) in the cluster of `client`, none yet; all of them
    /// stop with `stop`.
    pub fn new(client: kube::Client, what: &'static str, stop: &CancellationToken) -> Self {
        let cache = CompactCache::new();
        // Complete from the start: what is not watched is not asked about.
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitDone);
        ObjectWatches {
            client,
            parent: stop.clone(),
            what,
            cache,
            inner: Arc::default(),
        }
    }

    /// Starts watching `key` (nothing if it is watched already).
    pub fn start(&self, key: Key) {
        let stop = self.parent.child_token();
        let id = {
            let mut inner = self.lock();
            if inner.watched.contains_key(&key) {
                return;
            }
            let id = inner.next;
            inner.next += 1;
            let watched = Watched {
                synced: false,
                stop: stop.clone(),
                id,
            };
            inner.watched.insert(key.clone(), watched);
            id
        };
        tokio::spawn(follow(
            Api::namespaced(self.client.clone(), &key.namespace),
            key,
            self.cache.clone(),
            self.inner.clone(),
            self.what,
            (id, stop),
        ));
    }

    /// Stops watching `key` and forgets the object.
    pub fn stop(&self, key: &Key) {
        if let Some(w) = self.lock().watched.remove(key) {
            w.stop.cancel();
        }
        self.cache.remove(&key.namespace, &key.name);
    }
}

/// The watch of one object, until `stop`.
async fn follow<K>(
    api: Api<K>,
    key: Key,
    cache: CompactCache<K>,
    inner: Arc<Mutex<Inner>>,
    what: &'static str,
    (id, stop): (u64, CancellationToken),
) where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let Key {
        namespace: ns,
        name,
    } = key.clone();
    let config = watcher::Config::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(object_watch_timeout(what, &ns, &name));
    let stream = tensile_runtime::backoff::watch(api, config).boxed();
    // What the list in progress found (at most the one object).
    let mut listing: Option<Option<K>> = None;
    let notify = |synced: bool| {
        let observers = {
            let mut inner = inner.lock().unwrap_or_else(PoisonError::into_inner);
            match inner.watched.get_mut(&key) {
                // Stopped meanwhile (and maybe started again, by a watch of its own).
                Some(w) if w.id == id => w.synced |= synced,
                _ => return,
            }
            inner.observers.clone()
        };
        for observe in observers {
            observe(&key);
        }
    };
    tensile_runtime::backoff::drain(stream, &stop, what, |event| {
        if stop.is_cancelled() {
            return;
        }
        match event {
            watcher::Event::Init => listing = Some(None),
            watcher::Event::InitApply(o) => {
                if let Some(l) = listing.as_mut() {
                    *l = Some(o);
                }
            }
            watcher::Event::InitDone => {
                match listing.take().flatten() {
                    Some(o) => cache.apply(&watcher::Event::Apply(o)),
                    None => cache.remove(&ns, &name),
                }
                notify(true);
            }
            watcher::Event::Apply(o) => {
                cache.apply(&watcher::Event::Apply(o));
                notify(false);
            }
            watcher::Event::Delete(_) => {
                cache.remove(&ns, &name);
                notify(false);
            }
        }
    })
    .await;
}
