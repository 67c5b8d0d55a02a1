//! The copy controller's decisions, without I/O: an index that applies the watch events of the
//! upper originals and of our lower copies (and reads which copies our pods need,
//! `crate::needs`), and answers, for a key, the effect that brings the lower copy where it
//! should be ([`CopyEffect`]). The writer (`crate::copies`) carries effects out and tells the
//! index what it learned that no watch of ours shows ([`CopyMarks`]): a create that succeeded
//! before the watch shows it, a name held by a lower object that is not ours, a create that
//! failed. The pod controller reads the same marks ([`CopyState`]): it never writes a copy, it
//! only checks that what a pod needs is there, and is woken when that changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::watcher;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tensile_core::deps::{CopyAction, CopyKind, is_owned_by};
use tensile_core::keys::ANNOTATION_UPPER_UID;
use tensile_core::plan::{Existing, LowerKind, on_existing};

use crate::needs::Needs;
use tensile_runtime::cache::{CompactCache, Key};
use tensile_runtime::lock::lock;

/// What the writer does for a key.
#[derive(Clone, Debug, PartialEq)]
pub enum CopyEffect<K> {
    /// Nothing: in step, not needed and absent, or our create awaits its watch event.
    Nothing,
    /// Needed, but the original's watch has not listed it yet: that watch brings the key back
    /// (absent must mean absent before a copy is created or deleted).
    WaitForOriginal,
    /// Create this copy (needed, missing, its original there).
    CreateCopy(K),
    /// Write this (with the copy's `resourceVersion`: a concurrent change conflicts).
    UpdateCopy(K),
    /// Delete the copy of this UID, then create this one (immutable, or a Secret's type).
    ReplaceCopy {
        /// The UID precondition of the delete.
        uid: Option<String>,
        /// The new copy.
        copy: K,
    },
    /// Delete the copy of this UID (its original is gone, or no pod needs it any more).
    DeleteCopy {
        /// The UID precondition of the delete.
        uid: Option<String>,
    },
    /// The lower object under this name is not ours: never touched; reported.
    NotOurs,
}

/// What the writer learned of a lower name of a pod dependency that our lower watch (ours
/// only, by label) cannot show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Our create succeeded for the upper object of this UID; the watch has not shown it yet.
    Created(String),
    /// Another virtual node's copy of the upper object of this UID: used as it is.
    Sibling(String),
    /// An object that is not ours holds the name: never used nor touched.
    NotOurs,
    /// The last create failed, for this reason.
    Failed(String),
}

/// Whether the copy a pod needs is there, as the pod controller asks before creating the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyState {
    /// Ours (or a sibling's of the very upper object), of the upper object the pod reads.
    Ready,
    /// Not there (yet), or of an earlier upper object of the name; the last create's failure,
    /// if it failed. The copy controller wakes the pod when this changes.
    Pending(Option<String>),
    /// A lower object that is not ours holds the name.
    NotOurs,
}

/// The marks of the copies of pod dependencies, shared by the copy writers and the pod
/// controller.
#[derive(Debug, Default)]
pub struct CopyMarks(Mutex<HashMap<(CopyKind, Key), Mark>>);

impl CopyMarks {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(CopyKind, Key), Mark>> {
        lock(&self.0, "the copy marks")
    }

    /// The mark of `kind` `key`, if any.
    pub fn get(&self, kind: CopyKind, key: &Key) -> Option<Mark> {
        self.lock().get(&(kind, key.clone())).cloned()
    }

    fn set(&self, kind: CopyKind, key: &Key, mark: Mark) {
        self.lock().insert((kind, key.clone()), mark);
    }

    fn forget(&self, kind: CopyKind, key: &Key) {
        self.lock().remove(&(kind, key.clone()));
    }
}

/// The upper UID a copy records (`ANNOTATION_UPPER_UID`).
pub fn recorded_uid(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(ANNOTATION_UPPER_UID)
        .map(String::as_str)
}

/// Just the metadata of a cached object (the rest is not decoded).
#[derive(serde::Deserialize)]
struct MetaOnly {
    #[serde(default)]
    metadata: ObjectMeta,
}

/// [`CopyState`] of the copy `key` of `kind`, for a pod reading the upper object of
/// `upper_uid`, from our lower copies (`lower`, ours only) and the writers' `marks`.
pub fn copy_state<K>(
    lower: &CompactCache<K>,
    marks: &CopyMarks,
    kind: CopyKind,
    key: &Key,
    upper_uid: Option<&str>,
) -> CopyState
where
    K: Resource + Serialize + DeserializeOwned,
{
    let current = |uid: Option<&str>| upper_uid.is_none() || uid == upper_uid;
    if let Some(copy) = lower.get_as::<MetaOnly>(&key.namespace, &key.name)
        && current(recorded_uid(&copy.metadata))
    {
        return CopyState::Ready;
    }
    match marks.get(kind, key) {
        Some(Mark::Created(uid) | Mark::Sibling(uid)) if current(Some(&uid)) => CopyState::Ready,
        Some(Mark::NotOurs) => CopyState::NotOurs,
        Some(Mark::Failed(why)) => CopyState::Pending(Some(why)),
        _ => CopyState::Pending(None),
    }
}

/// What to do given the upper object and our lower copy (either possibly absent) and whether a
/// pod needs the copy.
pub type CopyRule<K> = Arc<dyn Fn(Option<&K>, Option<&K>, bool) -> CopyAction<K> + Send + Sync>;

/// Whether the original of a key is known (its watch has listed it): absent then means absent.
pub type OriginalListed = Arc<dyn Fn(&Key) -> bool + Send + Sync>;

/// The state of one kind of copy. Clones share it.
#[derive(Clone)]
pub struct CopyIndex<K> {
    owner: String,
    upper: CompactCache<K>,
    lower: CompactCache<K>,
    decide: CopyRule<K>,
    /// Copies of pod dependencies: their kind, which pods need them, the writers' marks.
    pods: Option<(CopyKind, Arc<Needs>, Arc<CopyMarks>)>,
    /// Per-object upper watches; `None`: one watch of all, complete once its cache is ready.
    known: Option<OriginalListed>,
}

impl<K> std::fmt::Debug for CopyIndex<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyIndex")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

fn lower_kind(kind: CopyKind) -> LowerKind {
    match kind {
        CopyKind::ConfigMap => LowerKind::ConfigMap,
        CopyKind::Secret => LowerKind::Secret,
        CopyKind::PersistentVolumeClaim => LowerKind::PersistentVolumeClaim,
    }
}

impl<K> CopyIndex<K>
where
    K: Resource + Serialize + DeserializeOwned + Clone,
{
    /// An index of our copies (marked `owner`) over the caches `upper` and `lower` (which others
    /// may read), deciding by `decide`.
    pub fn new(
        owner: String,
        (upper, lower): (CompactCache<K>, CompactCache<K>),
        decide: CopyRule<K>,
    ) -> Self {
        CopyIndex {
            owner,
            upper,
            lower,
            decide,
            pods: None,
            known: None,
        }
    }

    /// Copies of `kind` exist while a pod needs them (`needs`); the writer's marks go to
    /// `marks`, which the pod controller reads.
    pub fn needed_by_pods(self, kind: CopyKind, needs: Arc<Needs>, marks: Arc<CopyMarks>) -> Self {
        CopyIndex {
            pods: Some((kind, needs, marks)),
            ..self
        }
    }

    /// The upper objects are watched one by one; `known` says which have been listed.
    pub fn per_object(self, known: OriginalListed) -> Self {
        CopyIndex {
            known: Some(known),
            ..self
        }
    }

    /// The upper objects.
    pub fn upper(&self) -> &CompactCache<K> {
        &self.upper
    }

    /// Our lower copies.
    pub fn lower(&self) -> &CompactCache<K> {
        &self.lower
    }

    /// The kind of pod dependency and its needs, if it is one.
    pub fn pod_dependency(&self) -> Option<(CopyKind, &Arc<Needs>)> {
        self.pods.as_ref().map(|(kind, needs, _)| (*kind, needs))
    }

    /// Applies a watch event of the upper objects; the keys it touched.
    pub fn apply_upper(&self, event: &watcher::Event<K>) -> Vec<Key> {
        self.upper.apply_keys(event)
    }

    /// Applies a watch event of our lower copies; the keys it touched.
    pub fn apply_lower(&self, event: &watcher::Event<K>) -> Vec<Key> {
        let keys = self.lower.apply_keys(event);
        for key in &keys {
            let _ = self.lower_shown(key);
        }
        keys
    }

    /// The lower watch showed `key` (its cache is to be believed again); whether it is news to
    /// the pods waiting for it (false: our create's answer told them already).
    pub fn lower_shown(&self, key: &Key) -> bool {
        if let Some((kind, _, marks)) = &self.pods
            && matches!(marks.get(*kind, key), Some(Mark::Created(_)))
        {
            marks.forget(*kind, key);
            return false;
        }
        true
    }

    /// Whether a pod needs the copy `key` (false for kinds that are not pod dependencies).
    pub fn needed(&self, key: &Key) -> bool {
        self.pods
            .as_ref()
            .is_some_and(|(kind, needs, _)| needs.needed(*kind, &key.namespace, &key.name))
    }

    /// What to do for `key` now.
    pub fn effect(&self, key: &Key) -> CopyEffect<K> {
        let Key {
            namespace: ns,
            name,
        } = key;
        let needed = self.needed(key);
        if needed && self.known.as_ref().is_some_and(|known| !known(key)) {
            return CopyEffect::WaitForOriginal;
        }
        let lower = self.lower.get(ns, name);
        if let Some(l) = &lower
            && !is_owned_by(l.meta(), &self.owner)
        {
            return CopyEffect::NotOurs;
        }
        let uid = || lower.as_ref().and_then(|l| l.meta().uid.clone());
        match (self.decide)(self.upper.get(ns, name).as_ref(), lower.as_ref(), needed) {
            CopyAction::Nothing => CopyEffect::Nothing,
            CopyAction::Create(copy) => match &self.pods {
                // Made already: the watch has not shown it yet. (A sibling's copy is not ours to
                // keep: should its owner delete it, the next look makes ours.)
                Some((kind, _, marks))
                    if marks.get(*kind, key).is_some_and(|m| {
                        matches!(m, Mark::Created(uid) if Some(uid.as_str()) == recorded_uid(copy.meta()))
                    }) =>
                {
                    CopyEffect::Nothing
                }
                _ => CopyEffect::CreateCopy(copy),
            },
            CopyAction::Update(copy) => CopyEffect::UpdateCopy(copy),
            CopyAction::Replace(copy) => CopyEffect::ReplaceCopy { uid: uid(), copy },
            CopyAction::Delete => CopyEffect::DeleteCopy { uid: uid() },
        }
    }

    /// The create of `copy` under `key` succeeded.
    pub fn created(&self, key: &Key, copy: &K) {
        if let Some((kind, _, marks)) = &self.pods {
            let uid = recorded_uid(copy.meta()).unwrap_or_default().to_owned();
            marks.set(*kind, key, Mark::Created(uid));
        }
    }

    /// The create of `copy` under `key` found `existing` there: what it is.
    pub fn found(&self, key: &Key, copy: &K, existing: &ObjectMeta) -> Existing {
        let upper_uid = recorded_uid(copy.meta()).unwrap_or_default().to_owned();
        let Some((kind, _, marks)) = &self.pods else {
            return if is_owned_by(existing, &self.owner) {
                Existing::Ours
            } else {
                Existing::Conflict
            };
        };
        let found = on_existing(lower_kind(*kind), existing, &self.owner, &upper_uid);
        match found {
            // Ours: the watch shows it (the cache was behind).
            Existing::Ours => marks.forget(*kind, key),
            Existing::Sibling => marks.set(*kind, key, Mark::Sibling(upper_uid)),
            Existing::UseAsIs | Existing::Stale | Existing::Conflict => {
                marks.set(*kind, key, Mark::NotOurs)
            }
        }
        found
    }

    /// The create under `key` failed for `why`.
    pub fn failed(&self, key: &Key, why: String) {
        if let Some((kind, _, marks)) = &self.pods {
            marks.set(*kind, key, Mark::Failed(why));
        }
    }

    /// Forgets what the writer learned of `key` (no pod needs it any more, or it was deleted).
    pub fn forget(&self, key: &Key) {
        if let Some((kind, _, marks)) = &self.pods {
            marks.forget(*kind, key);
        }
    }

    /// [`copy_state`] of `key` for a pod reading the upper object of `upper_uid`.
    pub fn state(&self, key: &Key, upper_uid: Option<&str>) -> CopyState {
        match &self.pods {
            Some((kind, _, marks)) => copy_state(&self.lower, marks, *kind, key, upper_uid),
            None => CopyState::Pending(None),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)] // test code
mod tests {
    use super::*;
    use crate::needs::Side;
    use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret};
    use serde_json::json;
    use tensile_core::deps::{dependency_action, lower_config_map};
    use tensile_core::keys::{LABEL_OWNER, owner_label_value};
    use tensile_core::volumes::claim_action;
    use watcher::Event::{Apply, Delete};

    const OWNER: &str = "vk-a";

    fn key(name: &str) -> Key {
        Key::new("shop".to_owned(), name.to_owned())
    }

    fn upper_cm(name: &str, uid: &str, value: &str) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "uid": uid},
            "data": {"k": value},
        }))
        .unwrap()
    }

    /// Our copy of `upper_cm(name, uid, value)` as the lower API server shows it.
    fn our_copy(name: &str, uid: &str, value: &str) -> ConfigMap {
        let mut copy = lower_config_map(&upper_cm(name, uid, value), OWNER);
        copy.metadata.uid = Some(format!("lower-{name}"));
        copy.metadata.resource_version = Some("7".into());
        copy
    }

    fn pod(name: &str, volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "uid": format!("pod-{name}")},
            "spec": {"nodeName": "vk", "volumes": volumes,
                "containers": [{"name": "c", "image": "i"}]},
        }))
        .unwrap()
    }

    fn mounting(name: &str, config_map: &str) -> Pod {
        pod(
            name,
            json!([{"name": "v", "configMap": {"name": config_map}}]),
        )
    }

    fn ready<K: Resource + Serialize + DeserializeOwned>() -> CompactCache<K> {
        let cache = CompactCache::new();
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitDone);
        cache
    }

    /// A ConfigMap index whose needs are `needs`, with both caches listed (empty).
    fn config_maps(needs: &Arc<Needs>) -> CopyIndex<ConfigMap> {
        let decide: CopyRule<ConfigMap> =
            Arc::new(|u, l, needed| dependency_action(u, l, OWNER, needed));
        CopyIndex::new(OWNER.to_owned(), (ready(), ready()), decide).needed_by_pods(
            CopyKind::ConfigMap,
            needs.clone(),
            Arc::default(),
        )
    }

    /// A pod bound to the node that mounts `cfg`: the copy is needed.
    fn needed_cfg() -> (Arc<Needs>, CopyIndex<ConfigMap>) {
        let needs: Arc<Needs> = Arc::default();
        needs.observe(Side::Upper, &Apply(mounting("web", "cfg")));
        let index = config_maps(&needs);
        (needs, index)
    }

    #[test]
    fn a_needed_missing_copy_is_created_from_its_original_and_not_before_the_original_is_there() {
        let (_, index) = needed_cfg();
        assert_eq!(
            index.effect(&key("cfg")),
            CopyEffect::Nothing,
            "no original"
        );
        index.apply_upper(&Apply(upper_cm("cfg", "u1", "v1")));
        assert_eq!(
            index.effect(&key("cfg")),
            CopyEffect::CreateCopy(lower_config_map(&upper_cm("cfg", "u1", "v1"), OWNER))
        );
    }

    #[test]
    fn a_copy_no_pod_needs_is_not_created() {
        let needs: Arc<Needs> = Arc::default();
        needs.observe(Side::Upper, &Apply(mounting("web", "other")));
        let index = config_maps(&needs);
        index.apply_upper(&Apply(upper_cm("cfg", "u1", "v1")));
        assert_eq!(index.effect(&key("cfg")), CopyEffect::Nothing);
    }

    #[test]
    fn a_change_upstairs_updates_our_copy_with_its_resource_version() {
        let (_, index) = needed_cfg();
        index.apply_upper(&Apply(upper_cm("cfg", "u1", "v2")));
        index.apply_lower(&Apply(our_copy("cfg", "u1", "v1")));
        let CopyEffect::UpdateCopy(copy) = index.effect(&key("cfg")) else {
            panic!("expected an update");
        };
        assert_eq!(copy.data.unwrap()["k"], "v2");
        assert_eq!(copy.metadata.resource_version.as_deref(), Some("7"));
        // In step: nothing.
        index.apply_lower(&Apply(our_copy("cfg", "u1", "v2")));
        assert_eq!(index.effect(&key("cfg")), CopyEffect::Nothing);
    }

    #[test]
    fn a_copy_is_deleted_by_uid_once_no_pod_needs_it_or_its_original_is_gone() {
        let (needs, index) = needed_cfg();
        index.apply_upper(&Apply(upper_cm("cfg", "u1", "v1")));
        index.apply_lower(&Apply(our_copy("cfg", "u1", "v1")));
        assert_eq!(index.effect(&key("cfg")), CopyEffect::Nothing);
        needs.observe(Side::Upper, &Delete(mounting("web", "cfg")));
        let delete = CopyEffect::DeleteCopy {
            uid: Some("lower-cfg".into()),
        };
        assert_eq!(index.effect(&key("cfg")), delete);
        // Needed again, but the original goes: deleted too.
        needs.observe(Side::Lower, &Apply(mounting("web", "cfg")));
        assert_eq!(index.effect(&key("cfg")), CopyEffect::Nothing);
        index.apply_upper(&Delete(upper_cm("cfg", "u1", "v1")));
        assert_eq!(index.effect(&key("cfg")), delete);
    }

    #[test]
    fn a_lower_object_that_is_not_ours_is_never_touched_and_is_reported() {
        let (needs, index) = needed_cfg();
        let mut theirs = our_copy("cfg", "u1", "old");
        theirs.metadata.labels = None;
        index.apply_upper(&Apply(upper_cm("cfg", "u1", "v1")));
        index.apply_lower(&Apply(theirs.clone()));
        assert_eq!(index.effect(&key("cfg")), CopyEffect::NotOurs);
        // Neither when no pod needs it nor when its upper namesake goes.
        needs.observe(Side::Upper, &Delete(mounting("web", "cfg")));
        assert_eq!(index.effect(&key("cfg")), CopyEffect::NotOurs);
        index.apply_upper(&Delete(upper_cm("cfg", "u1", "v1")));
        assert_eq!(index.effect(&key("cfg")), CopyEffect::NotOurs);
    }

    #[test]
    fn a_name_held_downstairs_by_someone_else_keeps_the_pod_waiting_and_is_created_once_free() {
        let (_, index) = needed_cfg();
        let (k, upper) = (key("cfg"), upper_cm("cfg", "u1", "v1"));
        index.apply_upper(&Apply(upper.clone()));
        let CopyEffect::CreateCopy(copy) = index.effect(&k) else {
            panic!("expected a create");
        };
        let theirs = ObjectMeta {
            name: Some("cfg".into()),
            ..ObjectMeta::default()
        };
        assert_eq!(index.found(&k, &copy, &theirs), Existing::Conflict);
        assert_eq!(index.state(&k, Some("u1")), CopyState::NotOurs);
        // Tried again (with back-off): a create never overwrites.
        assert_eq!(index.effect(&k), CopyEffect::CreateCopy(copy.clone()));
        index.created(&k, &copy);
        assert_eq!(index.state(&k, Some("u1")), CopyState::Ready);
    }

    #[test]
    fn another_nodes_copy_of_the_same_upper_object_is_used_as_it_is() {
        let (_, index) = needed_cfg();
        let k = key("cfg");
        index.apply_upper(&Apply(upper_cm("cfg", "u1", "v1")));
        let CopyEffect::CreateCopy(copy) = index.effect(&k) else {
            panic!("expected a create");
        };
        let mut sibling = copy.metadata.clone();
        sibling
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_OWNER.into(), owner_label_value("vk-b"));
        assert_eq!(index.found(&k, &copy, &sibling), Existing::Sibling);
        assert_eq!(index.state(&k, Some("u1")), CopyState::Ready);
        // Looked at again (its original changed), a create is tried again: it never
        // overwrites, and makes ours should the sibling's owner have deleted its copy.
        assert_eq!(index.effect(&k), CopyEffect::CreateCopy(copy));
        // Not for a pod reading a newer upper object of the name.
        assert_eq!(index.state(&k, Some("u2")), CopyState::Pending(None));
    }

    #[test]
    fn a_create_is_not_repeated_while_the_lower_watch_has_not_shown_it() {
        let (_, index) = needed_cfg();
        let k = key("cfg");
        index.apply_upper(&Apply(upper_cm("cfg", "u1", "v1")));
        let CopyEffect::CreateCopy(copy) = index.effect(&k) else {
            panic!("expected a create");
        };
        assert_eq!(index.state(&k, Some("u1")), CopyState::Pending(None));
        index.created(&k, &copy);
        assert_eq!(index.effect(&k), CopyEffect::Nothing);
        assert_eq!(
            index.state(&k, Some("u1")),
            CopyState::Ready,
            "no watch round trip"
        );
        // The watch shows it; later someone deletes it: made again.
        index.apply_lower(&Apply(our_copy("cfg", "u1", "v1")));
        index.apply_lower(&Delete(our_copy("cfg", "u1", "v1")));
        assert_eq!(index.effect(&k), CopyEffect::CreateCopy(copy));
    }

    #[test]
    fn a_pod_waits_for_a_copy_of_the_upper_object_it_reads_and_hears_why_a_create_failed() {
        let (_, index) = needed_cfg();
        let k = key("cfg");
        index.apply_lower(&Apply(our_copy("cfg", "u1", "v1")));
        assert_eq!(index.state(&k, Some("u1")), CopyState::Ready);
        // The upper ConfigMap was deleted and made again: the copy is of the old one.
        assert_eq!(index.state(&k, Some("u2")), CopyState::Pending(None));
        index.failed(&k, "quota exceeded".into());
        assert_eq!(
            index.state(&k, Some("u2")),
            CopyState::Pending(Some("quota exceeded".into()))
        );
    }

    #[test]
    fn a_needed_copy_waits_until_the_per_object_watch_of_its_original_has_listed() {
        let (_, index) = needed_cfg();
        let listed = Arc::new(Mutex::new(false));
        let known = listed.clone();
        let index = index.per_object(Arc::new(move |_: &Key| *known.lock().unwrap()));
        index.apply_lower(&Apply(our_copy("cfg", "u1", "v1")));
        // Absent from a cache that has not listed it is not absent: the copy stays.
        assert_eq!(index.effect(&key("cfg")), CopyEffect::WaitForOriginal);
        *listed.lock().unwrap() = true;
        assert_eq!(
            index.effect(&key("cfg")),
            CopyEffect::DeleteCopy {
                uid: Some("lower-cfg".into())
            }
        );
    }

    #[test]
    fn an_immutable_copy_is_replaced_by_uid() {
        let (_, index) = needed_cfg();
        let mut copy = our_copy("cfg", "u1", "v1");
        copy.immutable = Some(true);
        index.apply_lower(&Apply(copy));
        index.apply_upper(&Apply(upper_cm("cfg", "u1", "v2")));
        let CopyEffect::ReplaceCopy { uid, copy } = index.effect(&key("cfg")) else {
            panic!("expected a replace");
        };
        assert_eq!(uid.as_deref(), Some("lower-cfg"));
        assert_eq!(copy.data.unwrap()["k"], "v2");
    }

    #[test]
    fn a_service_account_token_secret_is_never_copied() {
        let needs: Arc<Needs> = Arc::default();
        needs.observe(
            Side::Upper,
            &Apply(pod(
                "web",
                json!([{"name": "t", "secret": {"secretName": "tok"}}]),
            )),
        );
        let decide: CopyRule<Secret> =
            Arc::new(|u, l, needed| dependency_action(u, l, OWNER, needed));
        let index = CopyIndex::new(OWNER.to_owned(), (ready(), ready()), decide).needed_by_pods(
            CopyKind::Secret,
            needs,
            Arc::default(),
        );
        let token: Secret = serde_json::from_value(json!({
            "metadata": {"name": "tok", "namespace": "shop", "uid": "u1"},
            "type": "kubernetes.io/service-account-token",
            "data": {"token": "c2VjcmV0"},
        }))
        .unwrap();
        index.apply_upper(&Apply(token));
        assert_eq!(index.effect(&key("tok")), CopyEffect::Nothing);
    }

    #[test]
    fn a_needed_claim_is_created_and_one_of_a_replaced_upper_claim_deleted() {
        let needs: Arc<Needs> = Arc::default();
        needs.observe(
            Side::Upper,
            &Apply(pod(
                "db",
                json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]),
            )),
        );
        let decide: CopyRule<PersistentVolumeClaim> =
            Arc::new(|u, l, needed| claim_action(u, l, OWNER, needed));
        let index = CopyIndex::new(OWNER.to_owned(), (ready(), ready()), decide).needed_by_pods(
            CopyKind::PersistentVolumeClaim,
            needs,
            Arc::default(),
        );
        let claim = |uid: &str| -> PersistentVolumeClaim {
            serde_json::from_value(json!({
                "metadata": {"name": "data", "namespace": "shop", "uid": uid},
                "spec": {"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}},
            }))
            .unwrap()
        };
        index.apply_upper(&Apply(claim("u1")));
        let CopyEffect::CreateCopy(mut copy) = index.effect(&key("data")) else {
            panic!("expected a create");
        };
        copy.metadata.uid = Some("lower-data".into());
        index.apply_lower(&Apply(copy));
        assert_eq!(index.state(&key("data"), Some("u1")), CopyState::Ready);
        index.apply_upper(&Apply(claim("u2")));
        assert_eq!(
            index.effect(&key("data")),
            CopyEffect::DeleteCopy {
                uid: Some("lower-data".into())
            }
        );
        assert_eq!(
            index.state(&key("data"), Some("u2")),
            CopyState::Pending(None)
        );
    }
}
